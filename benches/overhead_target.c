/* overhead_target THREADS CALLS: each thread calls work() CALLS times in a
 * tight loop and the program prints the best-of-3 nanoseconds per call
 * (CLOCK_MONOTONIC around each thread's loop; the threads run at once). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noinline, noipa)) long work(long x) { return x * 3 + 1; }

static long calls;

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static void *run(void *out)
{
    double best = 1e30;
    long acc = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_ns();
        for (long i = 0; i < calls; i++)
            acc = work(acc);
        double per = (now_ns() - t0) / calls;
        if (per < best)
            best = per;
    }
    *(double *)out = best + (acc == 42 ? 1e-9 : 0);
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    calls = argc > 2 ? atol(argv[2]) : 10000000;
    pthread_t t[64];
    double per[64];
    if (threads < 1 || threads > 64)
        return 64;
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, run, &per[i]);
    double sum = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        sum += per[i];
    }
    printf("%.3f\n", sum / threads);
    return 0;
}
