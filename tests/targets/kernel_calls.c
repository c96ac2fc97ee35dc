/* Threads that enter the kernel from two user functions, timing every
 * system call themselves: the ground truth for weft's kernel probes.
 *
 * usage: kernel_calls THREADS ITERATIONS FILE [GO_FILE]
 *
 * Each worker thread, ITERATIONS times: open_config() opens FILE, reads
 * it whole in one read and closes it; read_cache() opens it, reads it in
 * 64 KiB chunks to the end and closes it; rewrite_file() opens the
 * thread's own scratch file FILE.out.TID truncating it (freeing the pages
 * the last round wrote: a long openat), writes KERNEL_CALLS_WRITE bytes
 * (default 2 MiB, at most 8) and closes it. Then, once every worker is done
 * with that, ITERATIONS times: wait_pipe() blocks in a read of a pipe a
 * writer thread fills 2 ms later (time asleep in the kernel). The phases
 * are apart because a wakeup that preempts a thread inside a long system
 * call makes the kernel charge the rest of that call's CPU time to the
 * thread switched in (the run-queue clock is not updated again before the
 * switch, see wakeup_preempt()): CLOCK_THREAD_CPUTIME_ID, the truth here,
 * would be short by it. So each thread also reports how many times it was
 * preempted (involuntary switches) during the first phase:
 *   P <tid> <involuntary switches>
 * and a test trusts its CPU clock only when that is 0. With the
 * environment variable KERNEL_CALLS_FIFO=1 (root) the workers run the
 * first phase as SCHED_FIFO threads, which other programs' threads do not
 * preempt.
 * With GO_FILE the workers start once that file exists (so that weft can
 * attach first). At the end, one line per (thread, function, call):
 *   T <tid> <function> <syscall> <calls> <wall_ns> <cpu_ns>
 * with the calls made, and the CLOCK_MONOTONIC and CLOCK_THREAD_CPUTIME_ID
 * time spent inside the libc call.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { F_OPEN_CONFIG, F_READ_CACHE, F_REWRITE_FILE, F_WAIT_PIPE, NF };
enum { S_OPENAT, S_READ, S_CLOSE, S_WRITE, NS };
static const char *fnames[NF] = {"open_config", "read_cache", "rewrite_file", "wait_pipe"};
static const char *snames[NS] = {"openat", "read", "close", "write"};
static long write_size = 2 << 20;

struct acc {
    long calls;
    long long wall, cpu;
};

struct worker {
    pthread_t thread;
    pid_t tid;
    int pipe[2];
    char out[4096];
    struct acc a[NF][NS];
    long preempted;
};

static const char *file;
static long iterations;
static pthread_barrier_t phase;

static long long now(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* The CPU clock is a system call of its own: read outside the wall
 * window, which then holds the libc call alone (and two vDSO reads). */
#define TIMED(w, f, s, call)                                                   \
    ({                                                                         \
        long long c0 = now(CLOCK_THREAD_CPUTIME_ID), w0 = now(CLOCK_MONOTONIC); \
        long r_ = (call);                                                      \
        long long w1 = now(CLOCK_MONOTONIC), c1 = now(CLOCK_THREAD_CPUTIME_ID); \
        (w)->a[f][s].calls++;                                                  \
        (w)->a[f][s].wall += w1 - w0;                                          \
        (w)->a[f][s].cpu += c1 - c0;                                           \
        r_;                                                                    \
    })

static char big[1 << 23];

__attribute__((noinline)) void open_config(struct worker *w)
{
    int fd = TIMED(w, F_OPEN_CONFIG, S_OPENAT, openat(AT_FDCWD, file, O_RDONLY));
    if (fd < 0) {
        perror(file);
        exit(2);
    }
    TIMED(w, F_OPEN_CONFIG, S_READ, read(fd, big, sizeof big));
    TIMED(w, F_OPEN_CONFIG, S_CLOSE, close(fd));
}

__attribute__((noinline)) void read_cache(struct worker *w)
{
    char chunk[65536];
    int fd = TIMED(w, F_READ_CACHE, S_OPENAT, openat(AT_FDCWD, file, O_RDONLY));
    if (fd < 0) {
        perror(file);
        exit(2);
    }
    while (TIMED(w, F_READ_CACHE, S_READ, read(fd, chunk, sizeof chunk)) > 0)
        ;
    TIMED(w, F_READ_CACHE, S_CLOSE, close(fd));
}

__attribute__((noinline)) void rewrite_file(struct worker *w)
{
    int fd = TIMED(w, F_REWRITE_FILE, S_OPENAT,
                   openat(AT_FDCWD, w->out, O_WRONLY | O_CREAT | O_TRUNC, 0600));
    if (fd < 0) {
        perror(w->out);
        exit(2);
    }
    TIMED(w, F_REWRITE_FILE, S_WRITE, write(fd, big, write_size));
    TIMED(w, F_REWRITE_FILE, S_CLOSE, close(fd));
}

__attribute__((noinline)) void wait_pipe(struct worker *w)
{
    char c;
    TIMED(w, F_WAIT_PIPE, S_READ, read(w->pipe[0], &c, 1));
}

static void *writer(void *arg)
{
    struct worker *w = arg;
    /* Each wait_pipe gets its byte 2 ms after the worker is ready. */
    for (long i = 0; i < iterations; i++) {
        struct timespec d = {0, 2000000};
        nanosleep(&d, NULL);
        if (write(w->pipe[1], "x", 1) != 1)
            exit(3);
    }
    return NULL;
}

static void *work(void *arg)
{
    struct worker *w = arg;
    w->tid = syscall(SYS_gettid);
    snprintf(w->out, sizeof w->out, "%s.out.%d", file, w->tid);
    struct rusage r0, r1;
    const char *fifo = getenv("KERNEL_CALLS_FIFO");
    if (fifo && *fifo == '1') {
        struct sched_param p = {.sched_priority = 1};
        if (pthread_setschedparam(pthread_self(), SCHED_FIFO, &p))
            fprintf(stderr, "SCHED_FIFO refused\n");
    }
    getrusage(RUSAGE_THREAD, &r0);
    for (long i = 0; i < iterations; i++) {
        open_config(w);
        read_cache(w);
        rewrite_file(w);
    }
    unlink(w->out);
    getrusage(RUSAGE_THREAD, &r1);
    w->preempted = r1.ru_nivcsw - r0.ru_nivcsw;
    struct sched_param other = {.sched_priority = 0};
    pthread_setschedparam(pthread_self(), SCHED_OTHER, &other);
    pthread_barrier_wait(&phase);
    pthread_t wr;
    pthread_create(&wr, NULL, writer, w);
    for (long i = 0; i < iterations; i++)
        wait_pipe(w);
    pthread_join(wr, NULL);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s THREADS ITERATIONS FILE [GO_FILE]\n", argv[0]);
        return 1;
    }
    int n = atoi(argv[1]);
    iterations = atol(argv[2]);
    file = argv[3];
    const char *size = getenv("KERNEL_CALLS_WRITE");
    if (size && atol(size) > 0 && atol(size) <= (long)sizeof big)
        write_size = atol(size);
    if (argc > 4) {
        printf("ready %d\n", getpid());
        fflush(stdout);
        while (access(argv[4], F_OK) != 0)
            usleep(2000);
    }
    struct worker *ws = calloc(n, sizeof *ws);
    pthread_barrier_init(&phase, NULL, n);
    for (int i = 0; i < n; i++) {
        if (pipe(ws[i].pipe))
            return 4;
        pthread_create(&ws[i].thread, NULL, work, &ws[i]);
    }
    for (int i = 0; i < n; i++)
        pthread_join(ws[i].thread, NULL);
    for (int i = 0; i < n; i++)
        printf("P %d %ld\n", ws[i].tid, ws[i].preempted);
    for (int i = 0; i < n; i++)
        for (int f = 0; f < NF; f++)
            for (int s = 0; s < NS; s++)
                if (ws[i].a[f][s].calls)
                    printf("T %d %s %s %ld %lld %lld\n", ws[i].tid, fnames[f], snames[s],
                           ws[i].a[f][s].calls, ws[i].a[f][s].wall, ws[i].a[f][s].cpu);
    return 0;
}
