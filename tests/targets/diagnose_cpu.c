/* A CPU bottleneck for weft diagnose. The worker thread's loop: `step`
 * calls `handle` twice, which reaches `hot` (~50% of the thread's time)
 * or `cool` only through a function-pointer table, then `decoy` (~15%),
 * then sleeps. Each function does its own work (no shared helper, so a
 * function's inclusive time is its own path's). Every second the worker
 * prints the share of its elapsed time that `hot` and `decoy` took on the
 * CPU, by its own clocks, not counting the time it waited for a CPU (its
 * schedstat run delay: the machine's other load), as weft counts it:
 * `share hot=0.44 decoy=0.15`. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <stdio.h>
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

__attribute__((noinline)) void hot(void) {
    for (unsigned long i = 0; i < per_ms * 6; i++) sink++;
}
__attribute__((noinline)) void cool(void) {
    for (unsigned long i = 0; i < per_ms / 10; i++) sink++;
}
__attribute__((noinline)) void decoy(void) {
    for (unsigned long i = 0; i < per_ms * 3 / 2; i++) sink++;
}
void (*const handlers[])(void) = {hot, cool};

static double in_hot, in_decoy;

__attribute__((noinline)) void handle(int which) {
    double t0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    handlers[which]();
    if (which == 0) in_hot += clock_s(CLOCK_THREAD_CPUTIME_ID) - t0;
}
__attribute__((noinline)) void step(void) {
    double c0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    handle(0);
    handle(1);
    double t0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    decoy();
    in_decoy += clock_s(CLOCK_THREAD_CPUTIME_ID) - t0;
    /* Asleep half as long as this step computed, not a fixed time: the
     * iterations' speed now need not be that of the calibration (another
     * program's load beside it on the machine slowed or sped them by half,
     * and with a fixed sleep hot's share went from 0.53 to 0.27, under the
     * 0.30 threshold), and the shares stay ~0.52 and ~0.13 whatever it is. */
    double computed = clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
    usleep((useconds_t)(computed * 0.5e6));
}
__attribute__((noinline)) void *worker(void *arg) {
    double start = clock_s(CLOCK_MONOTONIC), last = start, delay0 = run_delay();
    for (;;) {
        step();
        double now = clock_s(CLOCK_MONOTONIC);
        if (now - last >= 1.0) {
            double own = now - start - (run_delay() - delay0);
            printf("share hot=%.3f decoy=%.3f\n", in_hot / own, in_decoy / own);
            fflush(stdout);
            last = now;
        }
    }
    return arg;
}

int main(int argc, char **argv) {
    /* Iterations per millisecond of this machine. */
    double t0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    for (unsigned long i = 0; i < 10000000; i++) sink++;
    per_ms = (unsigned long)(10000000 / ((clock_s(CLOCK_THREAD_CPUTIME_ID) - t0) * 1000));
    pthread_t t;
    pthread_create(&t, 0, worker, 0);
    printf("ready\n");
    fflush(stdout);
    if (argc > 1) { /* run for that many seconds */
        sleep(atoi(argv[1]));
        return 0;
    }
    char c;
    while (read(0, &c, 1) > 0) {}
    return 0;
}
