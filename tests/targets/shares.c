/* shares: threads that spend a known share of their time in work(),
 * measured by the threads themselves.
 *
 * Usage: shares THREADS WORK_US IDLE_US SECONDS
 *
 * Each of THREADS threads (default attributes, named "share-i") loops:
 * work(WORK_US) spins until CLOCK_MONOTONIC advanced WORK_US µs, then the
 * thread sleeps IDLE_US µs. Around every call of work it reads
 * CLOCK_THREAD_CPUTIME_ID and CLOCK_MONOTONIC, and adds the differences to
 * its own totals. The main thread never calls work.
 *
 * Output (stdout): "ready" once every thread runs, then every 100 ms one
 * line, sums over the threads:
 *   {"t_ns":T,"elapsed_ns":E,"wall_ns":W,"cpu_ns":C}
 * T: CLOCK_MONOTONIC now; E: the threads' time since each started; W and C:
 * the wall and CPU time of their work() calls so far (W/E is their share
 * of time in work). After SECONDS: "done", exit 0. Bad arguments: 64.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define MAXT 64

struct tstate {
    pthread_t th;
    int index;
    long started, wall, cpu; /* written by the thread, read by main */
};

static struct tstate ts[MAXT];
static long work_us, idle_us;

static long now_ns(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

__attribute__((noinline, noipa)) long work(long us)
{
    long end = now_ns(CLOCK_MONOTONIC) + us * 1000;
    long spins = 0;
    while (now_ns(CLOCK_MONOTONIC) < end)
        spins++;
    return spins;
}

static void *worker(void *arg)
{
    struct tstate *t = arg;
    char name[16];
    snprintf(name, sizeof name, "share-%d", t->index);
    pthread_setname_np(pthread_self(), name);
    __atomic_store_n(&t->started, now_ns(CLOCK_MONOTONIC), __ATOMIC_RELEASE);
    struct timespec idle = {idle_us / 1000000, (idle_us % 1000000) * 1000};
    for (;;) {
        long c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
        long w0 = now_ns(CLOCK_MONOTONIC);
        work(work_us);
        long w1 = now_ns(CLOCK_MONOTONIC);
        long c1 = now_ns(CLOCK_THREAD_CPUTIME_ID);
        __atomic_store_n(&t->wall, t->wall + (w1 - w0), __ATOMIC_RELAXED);
        __atomic_store_n(&t->cpu, t->cpu + (c1 - c0), __ATOMIC_RELAXED);
        nanosleep(&idle, NULL);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 5)
        return 64;
    int n = atoi(argv[1]);
    work_us = atol(argv[2]);
    idle_us = atol(argv[3]);
    long seconds = atol(argv[4]);
    if (n <= 0 || n > MAXT || work_us <= 0 || idle_us <= 0 || seconds <= 0)
        return 64;
    for (int i = 0; i < n; i++) {
        ts[i].index = i;
        if (pthread_create(&ts[i].th, NULL, worker, &ts[i]))
            return 1;
    }
    for (int i = 0; i < n; i++)
        while (!__atomic_load_n(&ts[i].started, __ATOMIC_ACQUIRE)) {
            struct timespec pause = {0, 1000000};
            nanosleep(&pause, NULL);
        }
    printf("ready\n");
    fflush(stdout);
    long end = now_ns(CLOCK_MONOTONIC) + seconds * 1000000000L;
    for (;;) {
        struct timespec pause = {0, 100000000};
        nanosleep(&pause, NULL);
        long now = now_ns(CLOCK_MONOTONIC), elapsed = 0, wall = 0, cpu = 0;
        for (int i = 0; i < n; i++) {
            elapsed += now - ts[i].started;
            wall += __atomic_load_n(&ts[i].wall, __ATOMIC_RELAXED);
            cpu += __atomic_load_n(&ts[i].cpu, __ATOMIC_RELAXED);
        }
        printf("{\"t_ns\":%ld,\"elapsed_ns\":%ld,\"wall_ns\":%ld,\"cpu_ns\":%ld}\n", now, elapsed,
               wall, cpu);
        fflush(stdout);
        if (now >= end)
            break;
    }
    printf("done\n");
    fflush(stdout);
    return 0;
}
