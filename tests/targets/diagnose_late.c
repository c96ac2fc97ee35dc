/* Threads that start after `weft diagnose` has begun, each spending its
 * life in a function it never leaves: `late_main` calls `serve`, whose
 * loop calls `batch`, which calls `crunch` (~50% of the thread's time on
 * the CPU) and then sleeps. A late thread's stack is walked once, after
 * it entered `serve`: the probe that then goes on `serve` never sees that
 * activation begin, so only a look at the thread's stack when the probe
 * goes in tells that the thread is inside it.
 *
 * Prints "ready"; the threads start at the line "go" on stdin (each named
 * "late"); every second each prints the share of its elapsed time (less
 * the time it waited for a CPU) `crunch` took on the CPU, by its own
 * clocks: `share tid=N crunch=0.48`. Exits when stdin closes. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

volatile unsigned long sink;
static unsigned long per_ms;

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Seconds this thread has waited runnable for a CPU. */
static double run_delay(void) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%ld/schedstat", (long)syscall(SYS_gettid));
    FILE *f = fopen(path, "r");
    unsigned long long on_cpu = 0, waited = 0;
    if (f) {
        if (fscanf(f, "%llu %llu", &on_cpu, &waited) != 2) waited = 0;
        fclose(f);
    }
    return waited / 1e9;
}

__attribute__((noinline)) void crunch(void) {
    for (unsigned long i = 0; i < per_ms * 4; i++) sink++;
}

/* One round: crunch, then asleep as long as it computed (the share stays
 * ~0.5 however fast the iterations run on a loaded machine). */
__attribute__((noinline)) double batch(void) {
    double t0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    crunch();
    double spent = clock_s(CLOCK_THREAD_CPUTIME_ID) - t0;
    usleep((useconds_t)(spent * 1e6));
    return spent;
}

__attribute__((noinline)) void serve(void) {
    double start = clock_s(CLOCK_MONOTONIC), last = start, delay0 = run_delay();
    double in_crunch = 0;
    long tid = (long)syscall(SYS_gettid);
    for (;;) {
        in_crunch += batch();
        double now = clock_s(CLOCK_MONOTONIC);
        if (now - last >= 1.0) {
            double own = now - start - (run_delay() - delay0);
            printf("share tid=%ld crunch=%.3f\n", tid, in_crunch / own);
            fflush(stdout);
            last = now;
        }
    }
}

__attribute__((noinline)) void *late_main(void *arg) {
    serve();
    return arg;
}

int main(void) {
    double t0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    for (unsigned long i = 0; i < 10000000; i++) sink++;
    per_ms = (unsigned long)(10000000 / ((clock_s(CLOCK_THREAD_CPUTIME_ID) - t0) * 1000));
    printf("ready\n");
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (strcmp(line, "go\n") != 0)
            continue;
        for (int i = 0; i < 2; i++) {
            pthread_t t;
            if (pthread_create(&t, NULL, late_main, NULL) != 0)
                return 1;
            pthread_setname_np(t, "late");
        }
        printf("started\n");
        fflush(stdout);
    }
    return 0;
}
