/* wakeup: a pure-CPU function called right after its thread returns from
 * a blocking read(), as a request/response server calls its handler.
 *
 * Usage: wakeup ROUNDS ITERATIONS
 *
 * One worker thread ("waker", default attributes) blocks in read() on a
 * pipe; the main thread sleeps 200 µs (so that the worker is blocked,
 * switched out, for sure), writes one byte, and waits for the worker's
 * answer on a second pipe. The byte says what the woken worker calls:
 *   'w'  work(ITERATIONS)         the function to instrument
 *   'p'  plain(ITERATIONS)        the same code, never instrumented
 *   'e'  nothing                  (the cost of the brackets alone)
 * ROUNDS times each, interleaved (w, p, e, w, p, e, …), so the two
 * functions run under the same conditions. Around each call the worker
 * reads CLOCK_THREAD_CPUTIME_ID, then CLOCK_MONOTONIC, and after it the
 * same two in reverse order: the wall bracket holds no CPU clock read.
 *
 * Output (stdout): "ready", then after the rounds one line
 *   {"rounds":R,"work_calls":N,"work_wall_ns":W,"work_cpu_ns":C,
 *    "plain_calls":N,"plain_wall_ns":W,"plain_cpu_ns":C,
 *    "empty_calls":N,"empty_wall_ns":W,"empty_cpu_ns":C,"disturbed":D,
 *    "ok":true}
 * (work_calls and plain_calls counted by the functions themselves; "ok":
 * both returned the reference value; "disturbed": rounds whose thread was
 * switched out involuntarily (getrusage around the brackets) or whose call
 * of work or plain, but the first, took over 3 times its kind's median +
 * 1 µs), then "done". Exit
 * 0; bad arguments: 64.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static long iterations;
static long work_calls, plain_calls;
static int to_worker[2], from_worker[2];

static long now_ns(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* A dependent chain of multiply-adds the compiler cannot shorten. */
#define BODY(counter)                                                          \
    (counter) += 1;                                                            \
    unsigned long x = (unsigned long)seed;                                     \
    for (long i = 0; i < n; i++) {                                             \
        x = x * 6364136223846793005UL + 1442695040888963407UL;                 \
        __asm__ volatile("" : "+r"(x));                                        \
    }                                                                          \
    return (long)(x >> 1);

__attribute__((noinline, noipa)) long work(long seed, long n) { BODY(work_calls) }
__attribute__((noinline, noipa)) long plain(long seed, long n) { BODY(plain_calls) }

static long reference(long seed, long n)
{
    unsigned long x = (unsigned long)seed;
    for (long i = 0; i < n; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    return (long)(x >> 1);
}

struct sums {
    long calls, wall, cpu;
};
static struct sums sums[3]; /* w, p, e */
static int bad;
static long *walls[3]; /* each round's wall bracket, per kind */
static long disturbed;

static long involuntary_switches(void)
{
    struct rusage u;
    getrusage(RUSAGE_THREAD, &u);
    return u.ru_nivcsw;
}

static int by_value(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? -1 : x > y;
}

static void *worker(void *arg)
{
    (void)arg;
    for (long seed = 1;; seed++) {
        char c;
        if (read(to_worker[0], &c, 1) != 1 || c == 'q')
            break;
        int k = c == 'w' ? 0 : c == 'p' ? 1 : 2;
        long switches = involuntary_switches();
        long c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
        long w0 = now_ns(CLOCK_MONOTONIC);
        long r = 0;
        if (k == 0)
            r = work(seed, iterations);
        else if (k == 1)
            r = plain(seed, iterations);
        long w1 = now_ns(CLOCK_MONOTONIC);
        long c1 = now_ns(CLOCK_THREAD_CPUTIME_ID);
        if (k < 2 && r != reference(seed, iterations))
            bad = 1;
        if (involuntary_switches() != switches)
            disturbed++;
        walls[k][sums[k].calls] = w1 - w0;
        sums[k].calls += 1;
        sums[k].wall += w1 - w0;
        sums[k].cpu += c1 - c0;
        if (write(from_worker[1], &c, 1) != 1)
            break;
    }
    return NULL;
}

static void send(char c)
{
    struct timespec pause = {0, 200000};
    nanosleep(&pause, NULL);
    char answer;
    if (write(to_worker[1], &c, 1) != 1 || read(from_worker[0], &answer, 1) != 1) {
        printf("FAIL pipe\n");
        exit(1);
    }
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 64;
    long rounds = atol(argv[1]);
    iterations = atol(argv[2]);
    if (rounds <= 0 || iterations <= 0)
        return 64;
    if (pipe(to_worker) || pipe(from_worker))
        return 1;
    for (int k = 0; k < 3; k++)
        if (!(walls[k] = calloc(rounds, sizeof(long))))
            return 1;
    pthread_t th;
    if (pthread_create(&th, NULL, worker, NULL))
        return 1;
    pthread_setname_np(th, "waker");
    printf("ready\n");
    fflush(stdout);
    for (long r = 0; r < rounds; r++) {
        send('w');
        send('p');
        send('e');
    }
    char q = 'q';
    if (write(to_worker[1], &q, 1) != 1)
        return 1;
    pthread_join(th, NULL);
    /* A call taking over 3 times its kind's median wall time was disturbed
     * too (the hypervisor took the vCPU away: no switch shows). Not the
     * first: a thread's first call of an instrumented function is where the
     * tool sets the thread up, inside the bracket but outside the call. */
    for (int k = 0; k < 2; k++) {
        long *sorted = calloc(rounds, sizeof(long));
        if (!sorted)
            return 1;
        for (long r = 0; r < rounds; r++)
            sorted[r] = walls[k][r];
        qsort(sorted, rounds, sizeof(long), by_value);
        long limit = 3 * sorted[rounds / 2] + 1000;
        for (long r = 1; r < rounds; r++)
            disturbed += walls[k][r] > limit;
        free(sorted);
    }
    printf("{\"rounds\":%ld,\"work_calls\":%ld,\"work_wall_ns\":%ld,\"work_cpu_ns\":%ld,"
           "\"plain_calls\":%ld,\"plain_wall_ns\":%ld,\"plain_cpu_ns\":%ld,"
           "\"empty_calls\":%ld,\"empty_wall_ns\":%ld,\"empty_cpu_ns\":%ld,\"disturbed\":%ld,"
           "\"ok\":%s}\n",
           rounds, work_calls, sums[0].wall, sums[0].cpu, plain_calls, sums[1].wall, sums[1].cpu,
           sums[2].calls, sums[2].wall, sums[2].cpu, disturbed,
           !bad && work_calls == rounds && plain_calls == rounds ? "true" : "false");
    printf("done\n");
    return 0;
}
