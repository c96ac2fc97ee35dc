/* hotleaf: many threads spin calling leaf(), a 4-instruction function,
 * so that at any stop of the world some are inside its first bytes.
 * leaf fills the caller's buffer with `rep stosb`, its second
 * instruction, inside the 5 bytes a jump patch covers (3 + 2): a string
 * instruction is interrupted between iterations with the thread still at
 * it, so most preemptions and stops of a worker leave it there. (With a
 * plain `mov; add; ret` one CI run's 1,000 stops found no thread between
 * `mov` and `add`, where earlier runs found ~100; 4,000 stops with a
 * `pause` there found none either, likely because the hypervisor's
 * pause-loop exits resume after it.)
 *
 * Usage: hotleaf THREADS
 * Prints "ready pid=P threads=T", then reads commands from stdin:
 *   pause   every worker parks between two calls; prints one line per
 *           worker "thread TID calls C failures F" (C: calls since start),
 *           then "paused"
 *   go      the workers spin again; prints "going"
 *   quit    joins the workers, prints "done", exits 0
 * Every call's result is checked (leaf(buf, n, x) == x + 1): F counts mismatches.
 * The main thread never calls leaf.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* leaf(buf, n, x): fills n bytes at buf (with whatever al holds),
 * returns x + 1. */
__attribute__((naked, noinline)) long leaf(char *buf, long n, long x)
{
    __asm__("mov %rsi, %rcx\n\trep stosb\n\tlea 1(%rdx), %rax\n\tret\n");
}

struct worker {
    pthread_t thread;
    long tid;
    volatile long calls;
    volatile long failures;
    char pad[64];
    char buf[2048];
};

static struct worker *workers;
static int nworkers;
static volatile int pause_requested, quit_requested;
static int parked;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

static void *work(void *arg)
{
    struct worker *w = arg;
    w->tid = syscall(SYS_gettid);
    long x = w->tid;
    for (;;) {
        if (__atomic_load_n(&pause_requested, __ATOMIC_ACQUIRE)) {
            pthread_mutex_lock(&mu);
            parked++;
            pthread_cond_broadcast(&cv);
            while (pause_requested)
                pthread_cond_wait(&cv, &mu);
            parked--;
            int quit = quit_requested;
            pthread_mutex_unlock(&mu);
            if (quit)
                return NULL;
            continue;
        }
        long r = leaf(w->buf, sizeof w->buf, x);
        if (r != x + 1)
            w->failures++;
        w->calls++;
        x = r;
    }
}

int main(int argc, char **argv)
{
    nworkers = argc > 1 ? atoi(argv[1]) : 8;
    workers = calloc(nworkers, sizeof *workers);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    for (int i = 0; i < nworkers; i++)
        pthread_create(&workers[i].thread, &attr, work, &workers[i]);
    /* Until every worker has its tid. */
    for (int i = 0; i < nworkers; i++)
        while (!__atomic_load_n(&workers[i].tid, __ATOMIC_ACQUIRE))
            usleep(100);
    printf("ready pid=%d threads=%d\n", getpid(), nworkers + 1);
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (!strncmp(line, "pause", 5) || !strncmp(line, "quit", 4)) {
            int quit = line[0] == 'q';
            pthread_mutex_lock(&mu);
            pause_requested = 1;
            while (parked < nworkers)
                pthread_cond_wait(&cv, &mu);
            if (quit) {
                quit_requested = 1;
                pause_requested = 0;
                pthread_cond_broadcast(&cv);
                pthread_mutex_unlock(&mu);
                for (int i = 0; i < nworkers; i++)
                    pthread_join(workers[i].thread, NULL);
                printf("done\n");
                fflush(stdout);
                return 0;
            }
            pthread_mutex_unlock(&mu);
            for (int i = 0; i < nworkers; i++)
                printf("thread %ld calls %ld failures %ld\n", workers[i].tid, workers[i].calls,
                       workers[i].failures);
            printf("paused\n");
            fflush(stdout);
        } else if (!strncmp(line, "go", 2)) {
            pthread_mutex_lock(&mu);
            pause_requested = 0;
            pthread_cond_broadcast(&cv);
            pthread_mutex_unlock(&mu);
            printf("going\n");
            fflush(stdout);
        }
    }
    return 1;
}
