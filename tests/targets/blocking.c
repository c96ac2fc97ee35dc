/* blocking: threads that sit in blocking system calls while weft attaches
 * and detaches.
 *
 * Usage: blocking [--rounds R] [--sleep-ms MS] [--epoll-eintr-ok]
 *
 * Five threads, index i = 0..4, kinds "read" (read() on a pipe), "nanosleep"
 * (back-to-back nanosleep(MS) calls until released), "condvar"
 * (pthread_cond_wait), "futex" (raw FUTEX_WAIT_PRIVATE) and "epoll"
 * (epoll_wait with no timeout on a second pipe: the kernel never restarts
 * it, so every stop of the world used to end it with EINTR). Each thread runs,
 * for r = 1..R:   block(r) ; call tick() 1000*(i+1)+7*r times.
 *
 * Protocol (stdout, flushed):
 *   ready pid=<pid> threads=6     all five threads announced block 1
 *   main reads stdin lines; each "release" ends block r (main writes one byte
 *   to the pipe, broadcasts the condvar, bumps and wakes the futex word);
 *   after release r < R, once every thread has ticked and announced block r+1:
 *   blocked <r+1>
 *   after the last release and join:
 *     {"index":i,"tid":T,"kind":"read","name":"blk-read","ticks":[n1,...,nR],"ok":true}
 *     ok <kind>        (one per thread without failure)
 *     done             exit 0, or exit 1 if anything failed
 * Failures (EINTR, short sleep, wrong byte, bad return) print "FAIL ...".
 * With --epoll-eintr-ok an EINTR from epoll_wait prints "note epoll EINTR"
 * instead: a tracer killed between interrupting a thread in epoll_wait and
 * taking its stop cannot make the call again (the kernel never restarts
 * it), so tests that kill weft allow one per kill.
 * "quit" or EOF on stdin: exit 2.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline, noipa)) long tick(long *counter, long x)
{
    *counter += 1;
    return x * 5 + 3;
}

#define NT 5
#define MAXR 16
static const char *kinds[NT] = {"read", "nanosleep", "condvar", "futex", "epoll"};
static const char *names[NT] = {"blk-read", "blk-sleep", "blk-cond", "blk-futex", "blk-epoll"};

struct tstate {
    pthread_t th;
    int index;
    int tid;
    long ticks[MAXR + 1];
    int failed;
};

static struct tstate ts[NT];
static int rounds = 2;
static long sleep_ms = 2000;
static int pipefd[2];
static int epoll_pipe[2];
static int epfd;
static int epoll_eintr_ok;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv_release = PTHREAD_COND_INITIALIZER;
static pthread_cond_t cv_blocked = PTHREAD_COND_INITIALIZER;
static int released;        /* under mu */
static int blocked_count;   /* under mu */
static atomic_int released_atomic;
static atomic_int futex_word;
static atomic_int any_fail;

static void fail(struct tstate *s, const char *fmt, long a, long b)
{
    pthread_mutex_lock(&mu);
    printf("FAIL %s: ", s ? kinds[s->index] : "main");
    printf(fmt, a, b);
    printf("\n");
    fflush(stdout);
    pthread_mutex_unlock(&mu);
    if (s)
        s->failed = 1;
    atomic_store(&any_fail, 1);
}

static void checked_sleep(struct tstate *s)
{
    struct timespec req = {sleep_ms / 1000, (sleep_ms % 1000) * 1000000L}, rem = {0, 0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int r = nanosleep(&req, &rem);
    int e = errno;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long elapsed_ns = (t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec);
    if (r != 0)
        fail(s, "nanosleep returned -1, errno %ld (EINTR=4), elapsed %ld ns", e, elapsed_ns);
    else if (elapsed_ns < sleep_ms * 1000000L)
        fail(s, "short sleep: requested %ld ms, elapsed %ld ns", sleep_ms, elapsed_ns);
}

static void block(struct tstate *s, int r)
{
    switch (s->index) {
    case 0: { /* read */
        char c = 0;
        for (;;) {
            ssize_t n = read(pipefd[0], &c, 1);
            if (n == 1)
                break;
            if (n < 0 && errno == EINTR) {
                fail(s, "read returned EINTR (round %ld)%ld", r, 0);
                continue;
            }
            fail(s, "read returned %ld errno %ld", n, errno);
            return;
        }
        if (c != 'A' + r)
            fail(s, "read wrong byte %ld, expected %ld", c, 'A' + r);
        break;
    }
    case 1: /* nanosleep */
        while (atomic_load(&released_atomic) < r)
            checked_sleep(s);
        break;
    case 2: { /* condvar */
        pthread_mutex_lock(&mu);
        while (released < r) {
            int rc = pthread_cond_wait(&cv_release, &mu);
            if (rc != 0) {
                pthread_mutex_unlock(&mu);
                fail(s, "pthread_cond_wait returned %ld%ld", rc, 0);
                pthread_mutex_lock(&mu);
            }
        }
        pthread_mutex_unlock(&mu);
        break;
    }
    case 3: /* futex */
        for (;;) {
            int v = atomic_load(&futex_word);
            if (v >= r)
                break;
            long rc = syscall(SYS_futex, &futex_word, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
            if (rc == -1 && errno == EINTR)
                fail(s, "futex wait returned EINTR (round %ld)%ld", r, 0);
            else if (rc == -1 && errno != EAGAIN)
                fail(s, "futex wait errno %ld%ld", errno, 0);
        }
        break;
    case 4: { /* epoll */
        struct epoll_event ev;
        for (;;) {
            int n = epoll_wait(epfd, &ev, 1, -1);
            if (n == 1)
                break;
            if (n < 0 && errno == EINTR && epoll_eintr_ok) {
                pthread_mutex_lock(&mu);
                printf("note epoll EINTR\n");
                fflush(stdout);
                pthread_mutex_unlock(&mu);
                continue;
            }
            if (n < 0 && errno == EINTR) {
                fail(s, "epoll_wait returned EINTR (round %ld)%ld", r, 0);
                continue;
            }
            fail(s, "epoll_wait returned %ld errno %ld", n, errno);
            return;
        }
        char c = 0;
        if (read(epoll_pipe[0], &c, 1) != 1 || c != 'A' + r)
            fail(s, "epoll pipe: wrong byte %ld, expected %ld", c, 'A' + r);
        break;
    }
    }
}

static void *thread_main(void *arg)
{
    struct tstate *s = arg;
    pthread_setname_np(pthread_self(), names[s->index]);
    s->tid = (int)syscall(SYS_gettid);
    for (int r = 1; r <= rounds; r++) {
        pthread_mutex_lock(&mu);
        blocked_count++;
        pthread_cond_broadcast(&cv_blocked);
        pthread_mutex_unlock(&mu);
        block(s, r);
        long n = 1000L * (s->index + 1) + 7L * r, c = 0, acc = r, ref = r;
        for (long k = 0; k < n; k++)
            acc = acc * 7 + tick(&c, acc + k);
        for (long k = 0; k < n; k++)
            ref = ref * 7 + (ref + k) * 5 + 3;
        if (acc != ref || c != n)
            fail(s, "tick results wrong (count %ld of %ld)", c, n);
        s->ticks[r] = c;
    }
    return NULL;
}

static int read_line(char *buf, size_t cap)
{
    size_t n = 0;
    for (;;) {
        char c;
        ssize_t r = read(0, &c, 1);
        if (r < 0) {
            if (errno == EINTR) {
                fail(NULL, "stdin read returned EINTR%ld%ld", 0, 0);
                continue;
            }
            return -1;
        }
        if (r == 0)
            return n ? (int)n : -1;
        if (c == '\n')
            break;
        if (n + 1 < cap)
            buf[n++] = c;
    }
    buf[n] = 0;
    return (int)n;
}

static void wait_blocked(int r)
{
    pthread_mutex_lock(&mu);
    while (blocked_count < NT * r)
        pthread_cond_wait(&cv_blocked, &mu);
    pthread_mutex_unlock(&mu);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "0";
        if (!strcmp(argv[i], "--rounds")) rounds = atoi(v), i++;
        else if (!strcmp(argv[i], "--sleep-ms")) sleep_ms = atol(v), i++;
        else if (!strcmp(argv[i], "--epoll-eintr-ok")) epoll_eintr_ok = 1;
        else { fprintf(stderr, "blocking: bad argument %s\n", argv[i]); return 64; }
    }
    if (rounds < 1 || rounds > MAXR || sleep_ms < 1) {
        fprintf(stderr, "blocking: bad values\n");
        return 64;
    }
    if (pipe(pipefd) != 0 || pipe(epoll_pipe) != 0) {
        perror("pipe");
        return 1;
    }
    epfd = epoll_create1(0);
    struct epoll_event want = {.events = EPOLLIN};
    if (epfd < 0 || epoll_ctl(epfd, EPOLL_CTL_ADD, epoll_pipe[0], &want) != 0) {
        perror("epoll");
        return 1;
    }
    for (int i = 0; i < NT; i++) {
        ts[i].index = i;
        if (pthread_create(&ts[i].th, NULL, thread_main, &ts[i]) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            return 1;
        }
    }
    wait_blocked(1);
    printf("ready pid=%d threads=%d\n", (int)getpid(), NT + 1);
    fflush(stdout);

    char line[256];
    for (int r = 1; r <= rounds; r++) {
        for (;;) {
            if (read_line(line, sizeof line) < 0 || !strcmp(line, "quit"))
                _exit(2);
            if (!strcmp(line, "release"))
                break;
        }
        pthread_mutex_lock(&mu);
        released = r;
        atomic_store(&released_atomic, r);
        pthread_cond_broadcast(&cv_release);
        pthread_mutex_unlock(&mu);
        char c = 'A' + r;
        if (write(pipefd[1], &c, 1) != 1 || write(epoll_pipe[1], &c, 1) != 1)
            fail(NULL, "pipe write failed%ld%ld", 0, 0);
        atomic_store(&futex_word, r);
        syscall(SYS_futex, &futex_word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
        if (r < rounds) {
            wait_blocked(r + 1);
            printf("blocked %d\n", r + 1);
            fflush(stdout);
        }
    }
    for (int i = 0; i < NT; i++)
        pthread_join(ts[i].th, NULL);
    for (int i = 0; i < NT; i++) {
        printf("{\"index\":%d,\"tid\":%d,\"kind\":\"%s\",\"name\":\"%s\",\"ticks\":[", i, ts[i].tid,
               kinds[i], names[i]);
        for (int r = 1; r <= rounds; r++)
            printf("%s%ld", r > 1 ? "," : "", ts[i].ticks[r]);
        printf("],\"ok\":%s}\n", ts[i].failed ? "false" : "true");
    }
    for (int i = 0; i < NT; i++)
        if (!ts[i].failed)
            printf("ok %s\n", kinds[i]);
    printf("done\n");
    fflush(stdout);
    return atomic_load(&any_fail) ? 1 : 0;
}
