/* The probes of examples/latency.rs: at handle()'s entry and exit, per
 * weft thread index, a log2 histogram of each call's latency in ns
 * (CLOCK_MONOTONIC through the vDSO: no system call, no allocation). The
 * tool reads `hist` out of the process. */
#include "weft_probe.h"

#include <time.h>

#define THREADS 256
#define BUCKETS 32

uint64_t hist[THREADS][BUCKETS];
static uint64_t started[THREADS];

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

void on_entry(const struct weft_probe *p)
{
    if (p->thread < THREADS)
        started[p->thread] = now_ns();
}

void on_exit(const struct weft_probe *p)
{
    if (p->thread >= THREADS)
        return;
    uint64_t ns = now_ns() - started[p->thread];
    int bucket = 63 - __builtin_clzll(ns | 1);
    hist[p->thread][bucket < BUCKETS ? bucket : BUCKETS - 1]++;
}
