/* A known call tree for self-time and histogram checks (tests/outputs/reports.rs).
 * Each of THREADS threads (argv[1], default 2) runs outer() and rec(6)
 * ROUNDS times, then naps: nap_ms() 5 times (1 ms), nap_us() 20 times
 * (10 µs). Every instrumented function has exactly one caller function:
 * outer -> mid (twice), leaf_o; mid -> leaf_m; rec -> rleaf, rec. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define ROUNDS 50
#define NOINLINE __attribute__((noinline, noipa))

static volatile unsigned long sink;

NOINLINE static void busy(long n)
{
    for (long i = 0; i < n; i++)
        sink += i;
}

NOINLINE void leaf_m(void) { busy(20000); }
NOINLINE void leaf_o(void) { busy(10000); }

NOINLINE void mid(void)
{
    leaf_m();
    busy(30000);
}

NOINLINE void outer(void)
{
    mid();
    mid();
    leaf_o();
    busy(10000);
}

NOINLINE void rleaf(void) { busy(5000); }

NOINLINE void rec(int n)
{
    rleaf();
    busy(3000);
    if (n > 0)
        rec(n - 1);
    busy(1); /* no tail call */
}

NOINLINE void nap_ms(void)
{
    struct timespec t = {0, 1000000};
    nanosleep(&t, 0);
}

NOINLINE void nap_us(void)
{
    struct timespec t = {0, 10000};
    nanosleep(&t, 0);
}

static void *run(void *arg)
{
    (void)arg;
    for (int i = 0; i < ROUNDS; i++) {
        outer();
        rec(6);
    }
    for (int i = 0; i < 5; i++)
        nap_ms();
    for (int i = 0; i < 20; i++)
        nap_us();
    return 0;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 2;
    pthread_t t[64];
    if (n < 1 || n > 64)
        return 2;
    for (int i = 0; i < n; i++)
        if (pthread_create(&t[i], 0, run, 0))
            return 1;
    for (int i = 0; i < n; i++)
        pthread_join(t[i], 0);
    printf("done threads=%d\n", n);
    return 0;
}
