/* signals: a storm target. Counts every SIGRTMIN+1 it receives in a handler
 * that also calls an instrumented function.
 *
 * Prints "ready pid=P threads=3" (main and two workers calling work() in a
 * loop), then waits for lines on stdin:
 *   count      prints "count N" (signals handled so far)
 *   stop       stops the workers, prints "handled N in_handler M work_ok B",
 *              then "done", exits 0
 * in_handler() and work() are noinline/noipa; work's results are checked
 * against a reference (work_ok).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static atomic_long handled;
static atomic_long in_handler_calls;
static atomic_int stop;

__attribute__((noinline, noipa)) long in_handler(long x)
{
    atomic_fetch_add(&in_handler_calls, 1);
    return x + 1;
}

__attribute__((noinline, noipa)) unsigned long work(unsigned long x)
{
    return x * 2862933555777941757UL + 3037000493UL;
}

static void on_signal(int sig, siginfo_t *info, void *ctx)
{
    (void)sig;
    (void)info;
    (void)ctx;
    in_handler(1);
    atomic_fetch_add(&handled, 1);
}

struct worker {
    pthread_t th;
    unsigned long calls, acc, seed;
};

static void *run(void *arg)
{
    struct worker *w = arg;
    unsigned long acc = w->seed, calls = 0;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        acc = work(acc);
        calls++;
    }
    w->calls = calls;
    w->acc = acc;
    return NULL;
}

int main(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGRTMIN + 1, &sa, NULL) != 0)
        return 66;
    struct worker w[2];
    for (int i = 0; i < 2; i++) {
        w[i].seed = (unsigned long)i + 7;
        if (pthread_create(&w[i].th, NULL, run, &w[i]) != 0)
            return 65;
    }
    printf("ready pid=%d threads=3\n", (int)getpid());
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "count", 5) == 0) {
            printf("count %ld\n", atomic_load(&handled));
            fflush(stdout);
        } else if (strncmp(line, "stop", 4) == 0) {
            break;
        }
    }
    atomic_store(&stop, 1);
    int ok = 1;
    for (int i = 0; i < 2; i++) {
        pthread_join(w[i].th, NULL);
        unsigned long ref = w[i].seed;
        for (unsigned long k = 0; k < w[i].calls; k++)
            ref = ref * 2862933555777941757UL + 3037000493UL;
        ok &= ref == w[i].acc;
    }
    printf("handled %ld in_handler %ld work_ok %d\n", atomic_load(&handled),
           atomic_load(&in_handler_calls), ok);
    printf("done\n");
    return 0;
}
