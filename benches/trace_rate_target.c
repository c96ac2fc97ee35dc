/* trace_rate_target THREADS CALLS_PER_SEC SECONDS: each thread calls the
 * nested pair outer() -> inner() (two calls, four trace events) at
 * CALLS_PER_SEC calls a second (0: as fast as it can) for SECONDS, paced
 * in 100 us slots (the calls of a slot in a burst, then a wait for the
 * next slot, spinning on the clock: a sleep that short oversleeps), and
 * prints, per thread,
 *   thread tid=T calls=N wall_ns=W
 * counted by the functions themselves and timed by the thread's own
 * CLOCK_MONOTONIC around its loop. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static __thread long counted;

__attribute__((noinline, noipa)) long inner(long x)
{
    counted++;
    return x * 3 + 1;
}

__attribute__((noinline, noipa)) long outer(long x)
{
    counted++;
    return inner(x) ^ 5;
}

static double rate, seconds;

struct result {
    long calls, tid;
    double wall;
};

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static void *run(void *out)
{
    struct result *r = out;
    const double slot = 100e3;
    double t0 = now_ns(), end = t0 + seconds * 1e9, next = t0;
    /* Pairs of calls per slot. */
    long pairs = rate > 0 ? (long)(rate * slot / 1e9 / 2) : 1000;
    if (pairs < 1)
        pairs = 1;
    long acc = 0;
    for (;;) {
        for (long i = 0; i < pairs; i++)
            acc = outer(acc);
        double now = now_ns();
        if (now >= end)
            break;
        if (rate > 0) {
            next += slot;
            while (now < next && now < end)
                now = now_ns();
        }
    }
    r->wall = now_ns() - t0;
    r->calls = counted + (acc == 42);
    r->tid = gettid();
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    rate = argc > 2 ? atof(argv[2]) : 0;
    seconds = argc > 3 ? atof(argv[3]) : 1;
    if (threads < 1 || threads > 64)
        return 2;
    pthread_t t[64];
    struct result r[64];
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, run, &r[i]);
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < threads; i++)
        printf("thread tid=%ld calls=%ld wall_ns=%.0f\n", r[i].tid, r[i].calls, r[i].wall);
    return 0;
}
