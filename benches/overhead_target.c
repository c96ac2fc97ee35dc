/* overhead_target THREADS CALLS: each thread calls work() CALLS times in a
 * tight loop, three times, and the program prints, per thread,
 *   thread tid=T wall_ns=W cpu_ns=C
 * (CLOCK_MONOTONIC and CLOCK_THREAD_CPUTIME_ID summed over its three
 * loops), then the average over threads of each thread's best loop in
 * thread CPU nanoseconds per call (the threads run at once; CPU time, so
 * that more threads than CPUs do not count each other's time slices). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline, noipa)) long work(long x) { return x * 3 + 1; }

static long calls;

struct result {
    double best;
    double wall, cpu;
    long tid;
};

static double now_ns(clockid_t clock)
{
    struct timespec t;
    clock_gettime(clock, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static void *run(void *out)
{
    struct result *r = out;
    double best = 1e30, wall = 0, cpu = 0;
    long acc = 0;
    for (int rep = 0; rep < 3; rep++) {
        double w0 = now_ns(CLOCK_MONOTONIC), c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
        for (long i = 0; i < calls; i++)
            acc = work(acc);
        double c1 = now_ns(CLOCK_THREAD_CPUTIME_ID), w1 = now_ns(CLOCK_MONOTONIC);
        double per = (c1 - c0) / calls;
        if (per < best)
            best = per;
        wall += w1 - w0;
        cpu += c1 - c0;
    }
    r->best = best + (acc == 42 ? 1e-9 : 0);
    r->wall = wall;
    r->cpu = cpu;
    r->tid = gettid();
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    calls = argc > 2 ? atol(argv[2]) : 10000000;
    pthread_t t[64];
    struct result r[64];
    if (threads < 1 || threads > 64)
        return 64;
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, run, &r[i]);
    double sum = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        sum += r[i].best;
        printf("thread tid=%ld wall_ns=%.0f cpu_ns=%.0f\n", r[i].tid, r[i].wall, r[i].cpu);
    }
    printf("%.3f\n", sum / threads);
    return 0;
}
