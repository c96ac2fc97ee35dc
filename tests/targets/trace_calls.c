/* A known call sequence per thread, for call traces (tests/outputs/trace.rs).
 *
 * trace_calls THREADS ROUNDS [wait]
 *
 * Each thread t runs ROUNDS rounds of
 *
 *     outer { leaf x (t % 3 + 1); recurse(1 + (t + r) % 4) { ... leaf }; middle { leaf } }
 *
 * and logs, itself, each call of the four functions as it happens: its
 * first letter and "(" at entry, ")" at return. Once every thread is done
 * it prints one line per thread, "T <tid> <log>", then "done". With
 * `wait`, it prints "ready" and waits for a line on standard input before
 * starting the threads, and for another (or end of input) before exiting.
 * With `wait`, each thread also sleeps 1 ms every 5 rounds: more events
 * in all than a thread's trace ring holds, produced slowly enough for weft
 * to drain them while they come (at most about 1,100 per 10 ms).
 * With ROUNDS negative, each thread calls leaf() -ROUNDS times in a tight
 * loop instead and logs nothing ("flood": more events than a small trace
 * ring holds between two reads).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int paced;
static __thread char *log_buf;
static __thread size_t log_len;

#define LOG(c) do { if (log_buf) log_buf[log_len++] = (c); } while (0)

__attribute__((noinline, noclone)) void leaf(void) {
    LOG('l');
    LOG('(');
    __asm__ volatile("" ::: "memory");
    LOG(')');
}

__attribute__((noinline, noclone)) void recurse(int n) {
    LOG('r');
    LOG('(');
    if (n > 1)
        recurse(n - 1);
    else
        leaf();
    LOG(')');
}

__attribute__((noinline, noclone)) void middle(void) {
    LOG('m');
    LOG('(');
    leaf();
    LOG(')');
}

__attribute__((noinline, noclone)) void outer(int t, int r) {
    LOG('o');
    LOG('(');
    for (int i = 0; i < t % 3 + 1; i++)
        leaf();
    recurse(1 + (t + r) % 4);
    middle();
    LOG(')');
}

struct worker {
    pthread_t thread;
    int index;
    long rounds;
    pid_t tid;
    char *log;
    size_t len;
    double seconds;
};

static void *work(void *arg) {
    struct worker *w = arg;
    char name[16];
    snprintf(name, sizeof name, "tracer-%d", w->index);
    pthread_setname_np(pthread_self(), name);
    w->tid = (pid_t)syscall(SYS_gettid);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    if (w->rounds >= 0) {
        /* At most 40 letters a round. */
        log_buf = malloc(40 * (size_t)w->rounds + 1);
        if (!log_buf)
            abort();
        for (long r = 0; r < w->rounds; r++) {
            outer(w->index, (int)r);
            if (paced && r % 5 == 4)
                usleep(1000);
        }
        w->log = log_buf;
        w->len = log_len;
        log_buf = NULL;
    } else {
        for (long i = 0; i < -w->rounds; i++)
            leaf();
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    w->seconds = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9;
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    long rounds = argc > 2 ? atol(argv[2]) : 100;
    int wait = argc > 3 && strcmp(argv[3], "wait") == 0;
    paced = wait;
    char line[64];
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (wait) {
        printf("ready\n");
        if (!fgets(line, sizeof line, stdin))
            return 1;
    }
    struct worker *w = calloc((size_t)threads, sizeof *w);
    for (int i = 0; i < threads; i++) {
        w[i].index = i;
        w[i].rounds = rounds;
        if (pthread_create(&w[i].thread, NULL, work, &w[i]) != 0)
            abort();
    }
    for (int i = 0; i < threads; i++)
        pthread_join(w[i].thread, NULL);
    for (int i = 0; i < threads; i++) {
        if (w[i].log) {
            printf("T %d ", (int)w[i].tid);
            fwrite(w[i].log, 1, w[i].len, stdout);
            printf("\n");
        } else {
            printf("F %d %.6f\n", (int)w[i].tid, w[i].seconds);
        }
    }
    printf("done\n");
    if (wait)
        (void)fgets(line, sizeof line, stdin);
    return 0;
}
