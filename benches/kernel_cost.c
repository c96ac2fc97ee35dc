/* The cost of one system call, for the kernel-probe benchmark
 * (benches/kernel.rs): CALLS reads of one byte from /dev/zero (a read(2)
 * that does almost nothing, so what a probe adds shows), timed with
 * CLOCK_MONOTONIC; prints "ns_per_call N.NN". The best of 5 rounds: a
 * round preempted by something else is not the probe's cost.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv)
{
    long calls = argc > 1 ? atol(argv[1]) : 200000;
    int fd = open("/dev/zero", O_RDONLY);
    char c;
    double best = 1e18;
    for (int round = 0; round < 5; round++) {
        double t0 = now();
        for (long i = 0; i < calls; i++)
            if (read(fd, &c, 1) != 1)
                return 1;
        double per = (now() - t0) / calls;
        if (per < best)
            best = per;
    }
    printf("ns_per_call %.2f\n", best);
    return 0;
}
