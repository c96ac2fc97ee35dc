/* timers: threads that spend known wall and CPU time in instrumented
 * functions, measured by the threads themselves.
 *
 * Usage: timers THREADS CALLS SPIN_MS SLEEP_MS
 *
 * Each of THREADS threads (named "timer-i"), CALLS times:
 *   spin_then_sleep(SPIN, SLEEP)      spins until its own thread CPU clock
 *                                     advanced SPIN ns, then nanosleeps SLEEP
 *   recurse(0, SPIN, SLEEP, ...)      recurses (not a tail call) to depth 5
 *                                     (6 activations) and calls
 *                                     spin_then_sleep at the bottom
 * Around every call of spin_then_sleep (direct, and at the bottom of the
 * recursion) and around every outermost call of recurse the thread reads
 * CLOCK_MONOTONIC and CLOCK_THREAD_CPUTIME_ID.
 *
 * Output (stdout), after all threads are joined, one line per thread in
 * index order, then "done":
 *   {"index":i,"tid":T,"name":"timer-i","spin_calls":N,"spin_wall_ns":W,
 *    "spin_cpu_ns":C,"recurse_calls":M,"recurse_wall_ns":W2,
 *    "recurse_cpu_ns":C2,"ok":true}
 * spin_calls and recurse_calls are counted by the functions themselves (every
 * activation: recurse_calls = 6*CALLS, spin_calls = 2*CALLS); the *_ns sums
 * are over spin_then_sleep's calls and over recurse's outermost calls.
 * "ok" checks the results against a reference. Exit 0; bad arguments: 64.
 * The main thread never calls an instrumented function.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAXT 64
#define DEPTH 5

struct tstate {
    pthread_t th;
    int index;
    int tid;
    char name[16];
    long calls, spin_ns, sleep_ns;
    long spin_calls, spin_wall, spin_cpu;
    long recurse_calls, recurse_wall, recurse_cpu;
    long result;
    int ok;
};

static long now_ns(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* What spin_then_sleep returns (the reference). */
static long spin_value(long spin_ns, long sleep_ns)
{
    return ((spin_ns / 1000) * 3 + sleep_ns / 1000) | 1;
}

static volatile unsigned long sink;

/* Per-thread counter of spin_then_sleep's own activations. */
static __thread long spin_count;

__attribute__((noinline, noipa)) long spin_then_sleep(long spin_ns, long sleep_ns)
{
    spin_count++;
    long start = now_ns(CLOCK_THREAD_CPUTIME_ID);
    unsigned long x = (unsigned long)spin_ns;
    while (now_ns(CLOCK_THREAD_CPUTIME_ID) - start < spin_ns)
        for (int i = 0; i < 2000; i++)
            x = x * 6364136223846793005UL + 1442695040888963407UL;
    struct timespec req = {sleep_ns / 1000000000L, sleep_ns % 1000000000L};
    while (nanosleep(&req, &req) != 0 && errno == EINTR)
        ;
    sink = x;
    return spin_value(spin_ns, sleep_ns);
}

/* Times one call of spin_then_sleep into s. */
static long timed_spin(struct tstate *s)
{
    long w0 = now_ns(CLOCK_MONOTONIC);
    long c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    long r = spin_then_sleep(s->spin_ns, s->sleep_ns);
    long c1 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    long w1 = now_ns(CLOCK_MONOTONIC);
    s->spin_wall += w1 - w0;
    s->spin_cpu += c1 - c0;
    return r;
}

/* Non-tail recursion: the work after the recursive call (xor and a store
 * through s) keeps gcc from turning it into a loop. */
__attribute__((noinline, noipa)) long recurse(int depth, struct tstate *s)
{
    s->recurse_calls++;
    if (depth == DEPTH)
        return timed_spin(s);
    long r = recurse(depth + 1, s);
    s->result ^= r << depth;
    return r ^ (r >> 3) ^ depth;
}

static long ref_recurse(int depth, long bottom, long *result)
{
    if (depth == DEPTH)
        return bottom;
    long r = ref_recurse(depth + 1, bottom, result);
    *result ^= r << depth;
    return r ^ (r >> 3) ^ depth;
}

static void *thread_main(void *arg)
{
    struct tstate *s = arg;
    pthread_setname_np(pthread_self(), s->name);
    s->tid = (int)syscall(SYS_gettid);
    unsigned long acc = 0, ref_acc = 0;
    long ref_result = 0;
    long bottom = spin_value(s->spin_ns, s->sleep_ns);
    for (long i = 0; i < s->calls; i++) {
        acc = acc * 31 + (unsigned long)timed_spin(s);
        ref_acc = ref_acc * 31 + (unsigned long)bottom;
        long w0 = now_ns(CLOCK_MONOTONIC);
        long c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
        long r = recurse(0, s);
        long c1 = now_ns(CLOCK_THREAD_CPUTIME_ID);
        long w1 = now_ns(CLOCK_MONOTONIC);
        s->recurse_wall += w1 - w0;
        s->recurse_cpu += c1 - c0;
        acc = acc * 31 + (unsigned long)r;
        ref_acc = ref_acc * 31 + (unsigned long)ref_recurse(0, bottom, &ref_result);
    }
    s->spin_calls = spin_count;
    s->ok = acc == ref_acc && s->result == ref_result;
    if (s->spin_calls != 2 * s->calls ||
        s->recurse_calls != (DEPTH + 1) * s->calls)
        s->ok = 0;
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: timers THREADS CALLS SPIN_MS SLEEP_MS\n");
        return 64;
    }
    int n = atoi(argv[1]);
    long calls = atol(argv[2]);
    long spin_ms = atol(argv[3]), sleep_ms = atol(argv[4]);
    if (n < 1 || n > MAXT || calls < 0 || spin_ms < 0 || sleep_ms < 0) {
        fprintf(stderr, "timers: bad arguments\n");
        return 64;
    }
    static struct tstate ts[MAXT];
    for (int i = 0; i < n; i++) {
        struct tstate *s = &ts[i];
        s->index = i;
        s->calls = calls;
        s->spin_ns = spin_ms * 1000000L;
        s->sleep_ns = sleep_ms * 1000000L;
        snprintf(s->name, sizeof s->name, "timer-%d", i);
        if (pthread_create(&s->th, NULL, thread_main, s) != 0) {
            fprintf(stderr, "timers: pthread_create failed\n");
            return 1;
        }
    }
    for (int i = 0; i < n; i++)
        pthread_join(ts[i].th, NULL);
    for (int i = 0; i < n; i++) {
        struct tstate *s = &ts[i];
        printf("{\"index\":%d,\"tid\":%d,\"name\":\"%s\",\"spin_calls\":%ld,"
               "\"spin_wall_ns\":%ld,\"spin_cpu_ns\":%ld,\"recurse_calls\":%ld,"
               "\"recurse_wall_ns\":%ld,\"recurse_cpu_ns\":%ld,\"ok\":%s}\n",
               s->index, s->tid, s->name, s->spin_calls, s->spin_wall, s->spin_cpu,
               s->recurse_calls, s->recurse_wall, s->recurse_cpu, s->ok ? "true" : "false");
    }
    printf("done\n");
    fflush(stdout);
    return 0;
}
