/*
 * Bottlenecks behind shared code, for `weft diagnose` (issue #31, §1):
 *
 * - thread "compute": compute_main > serve_batch > dispatch, whose
 *   function-pointer table reaches h_transform > kernel_mix (~45 % of the
 *   thread's CPU) and the decoy h_checksum (~12 %); serve_batch also calls
 *   the decoy decode (~6 %). All three spin through one helper,
 *   spin_us > spin_n, so spin_us's time under any caller is ~63 %.
 * - threads "locker" (two): update_shared takes a mutex both contend
 *   through lock_wrapper (and holds it sleeping), update_local a mutex of
 *   its own through the same wrapper (never contended).
 * - thread "reader": read_record blocks in small reads of a pipe a
 *   "feeder" thread writes slowly, through read_small; fast_path reads
 *   /dev/zero through the same helper and never blocks.
 *
 * The work is counted in iterations (calibrated at start), the sleeps are
 * proportional to the work done, so the shares hold on a loaded machine.
 * Every 0.5 s prints the target's own account since the start:
 *   "share kernel_mix=F h_checksum=F decode=F"   (of the compute thread's
 *       CPU-available time: wall less its run delay)
 *   "wait lock=F read=F now=S lock_t=S read_t=S"   (the lockers' mean
 *       share of wall time waiting for the shared mutex; the reader's share
 *       blocked reading the pipe; CLOCK_MONOTONIC, and the seconds each
 *       share is over, so that a reader can take the share over a window)
 * Prints "objects mutex=0x... pipe=FD" (the contended mutex's address,
 * the pipe's read end), then "ready"; exits when stdin closes.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))

static volatile unsigned long sink;
static long iters_per_us = 100;

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double run_delay_s(void) {
    char buf[128];
    int fd = open("/proc/thread-self/schedstat", O_RDONLY);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    unsigned long long run, delay;
    if (sscanf(buf, "%llu %llu", &run, &delay) != 2)
        return 0;
    return delay / 1e9;
}

NOINLINE void spin_n(long n) {
    for (long i = 0; i < n; i++)
        sink += i ^ (sink >> 3);
}

NOINLINE void spin_us(long us) { spin_n(us * iters_per_us); }

/* --- compute --- */
static double cpu_kernel, cpu_checksum, cpu_decode;

NOINLINE void kernel_mix(void) {
    double t0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    spin_us(450);
    cpu_kernel += clock_s(CLOCK_THREAD_CPUTIME_ID) - t0;
}

NOINLINE void h_transform(void) { kernel_mix(); }

NOINLINE void h_checksum(void) {
    double t0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    spin_us(120);
    cpu_checksum += clock_s(CLOCK_THREAD_CPUTIME_ID) - t0;
}

NOINLINE void decode(void) {
    double t0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    spin_us(30);
    cpu_decode += clock_s(CLOCK_THREAD_CPUTIME_ID) - t0;
}

void (*volatile handlers[])(void) = {h_transform, h_checksum};

NOINLINE void dispatch(int i) { handlers[i & 1](); }

NOINLINE void serve_batch(void) {
    /* Two requests of each kind: decode before each dispatch. */
    for (int i = 0; i < 2; i++) {
        decode();
        dispatch(i);
    }
}

static pthread_mutex_t report_lock = PTHREAD_MUTEX_INITIALIZER;
static double compute_start, compute_delay0;
static double shares[3];

static void *compute_main(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "compute");
    compute_start = clock_s(CLOCK_MONOTONIC);
    compute_delay0 = run_delay_s();
    for (;;) {
        double c0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
        serve_batch();
        double worked = clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
        /* Sleep ~37 % of the thread's time: 0.58 x the work. */
        struct timespec ts = {0, (long)(worked * 0.58e9)};
        nanosleep(&ts, NULL);
        double avail = clock_s(CLOCK_MONOTONIC) - compute_start - (run_delay_s() - compute_delay0);
        pthread_mutex_lock(&report_lock);
        if (avail > 0) {
            shares[0] = cpu_kernel / avail;
            shares[1] = cpu_checksum / avail;
            shares[2] = cpu_decode / avail;
        }
        pthread_mutex_unlock(&report_lock);
    }
    return NULL;
}

/* --- lockers --- */
static pthread_mutex_t shared_mutex = PTHREAD_MUTEX_INITIALIZER;
static double lock_wait[2], locker_start;

NOINLINE void lock_wrapper(pthread_mutex_t *m) { pthread_mutex_lock(m); }

NOINLINE void unlock_wrapper(pthread_mutex_t *m) { pthread_mutex_unlock(m); }

NOINLINE void update_shared(int me) {
    double t0 = clock_s(CLOCK_MONOTONIC);
    lock_wrapper(&shared_mutex);
    lock_wait[me] += clock_s(CLOCK_MONOTONIC) - t0;
    /* Held while sleeping: the other locker waits, no CPU is burnt. */
    struct timespec ts = {0, 800000};
    nanosleep(&ts, NULL);
    unlock_wrapper(&shared_mutex);
}

NOINLINE void update_local(pthread_mutex_t *mine) {
    lock_wrapper(mine);
    spin_us(50);
    unlock_wrapper(mine);
}

static void *locker_main(void *arg) {
    int me = (int)(long)arg;
    pthread_mutex_t mine = PTHREAD_MUTEX_INITIALIZER;
    pthread_setname_np(pthread_self(), "locker");
    for (;;) {
        update_shared(me);
        update_local(&mine);
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* --- reader --- */
static int pipe_fds[2], zero_fd;
static double read_wait, reader_start;

NOINLINE ssize_t read_small(int fd, char *buf) { return read(fd, buf, 1); }

NOINLINE void read_record(void) {
    char c;
    double t0 = clock_s(CLOCK_MONOTONIC);
    read_small(pipe_fds[0], &c);
    read_wait += clock_s(CLOCK_MONOTONIC) - t0;
}

NOINLINE void fast_path(void) {
    char c;
    for (int i = 0; i < 20; i++)
        read_small(zero_fd, &c);
}

static void *reader_main(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "reader");
    reader_start = clock_s(CLOCK_MONOTONIC);
    for (;;) {
        read_record();
        fast_path();
    }
    return NULL;
}

static void *feeder_main(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "feeder");
    for (;;) {
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
        if (write(pipe_fds[1], "x", 1) != 1)
            return NULL;
    }
    return NULL;
}

static void *reporter(void *arg) {
    (void)arg;
    for (;;) {
        usleep(500000);
        double now = clock_s(CLOCK_MONOTONIC);
        pthread_mutex_lock(&report_lock);
        printf("share kernel_mix=%.4f h_checksum=%.4f decode=%.4f\n", shares[0], shares[1],
               shares[2]);
        pthread_mutex_unlock(&report_lock);
        printf("wait lock=%.4f read=%.4f now=%.6f lock_t=%.6f read_t=%.6f\n",
               (lock_wait[0] + lock_wait[1]) / 2 / (now - locker_start),
               read_wait / (now - reader_start), now, now - locker_start, now - reader_start);
    }
    return NULL;
}

static void calibrate(void) {
    /* Iterations per microsecond of this thread's CPU, the best of five. */
    long n = 2000000;
    double best = 1e9;
    for (int k = 0; k < 5; k++) {
        double t0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
        spin_n(n);
        double t = clock_s(CLOCK_THREAD_CPUTIME_ID) - t0;
        if (t < best)
            best = t;
    }
    iters_per_us = (long)(n / (best * 1e6));
    if (iters_per_us < 1)
        iters_per_us = 1;
}

static void start(const char *name, void *(*fn)(void *), void *arg)
{
    pthread_t t;
    if (pthread_create(&t, NULL, fn, arg) != 0)
        exit(1);
    pthread_setname_np(t, name);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    calibrate();
    if (pipe(pipe_fds) != 0)
        return 1;
    zero_fd = open("/dev/zero", O_RDONLY);
    if (zero_fd < 0)
        return 1;
    locker_start = clock_s(CLOCK_MONOTONIC);
    /* Named here, not only by themselves: "ready" promises the names are
       in /proc however late a new thread first runs. */
    start("compute", compute_main, NULL);
    start("locker", locker_main, (void *)0L);
    start("locker", locker_main, (void *)1L);
    start("reader", reader_main, NULL);
    start("feeder", feeder_main, NULL);
    start("reporter", reporter, NULL);
    printf("objects mutex=%p pipe=%d\n", (void *)&shared_mutex, pipe_fds[0]);
    printf("ready\n");
    char buf[64];
    while (fgets(buf, sizeof buf, stdin))
        ;
    return 0;
}
