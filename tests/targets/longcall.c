/* longcall: one thread in one long call, for live sampling of a running timer.
 *
 * Usage: longcall [SPIN_MS]            (default 3000)
 *
 * Protocol (stdout, flushed):
 *   ready pid=<pid> threads=2    the worker thread ("longcall") exists and
 *                                waits (blocked in read() on a pipe)
 *   main reads one line "go" from stdin ("quit" or EOF: exit 2); the worker
 *   then calls long_call(SPIN_MS ms), which spins until its thread's
 *   CLOCK_THREAD_CPUTIME_ID advanced that much, and measures it itself:
 *   {"tid":T,"long_call":1,"wall_ns":W,"cpu_ns":C,"ok":true}
 *   done                          exit 0
 * The main thread never calls an instrumented function.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static long now_ns(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static long calls;
static volatile unsigned long sink;

__attribute__((noinline, noipa)) long long_call(long spin_ns)
{
    calls++;
    long start = now_ns(CLOCK_THREAD_CPUTIME_ID);
    unsigned long x = (unsigned long)spin_ns;
    while (now_ns(CLOCK_THREAD_CPUTIME_ID) - start < spin_ns)
        for (int i = 0; i < 2000; i++)
            x = x * 6364136223846793005UL + 1442695040888963407UL;
    sink = x;
    return spin_ns / 1000000 + 1;
}

static int go_pipe[2];
static long spin_ms = 3000;

static void *worker(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "longcall");
    int tid = (int)syscall(SYS_gettid);
    char c;
    ssize_t r;
    while ((r = read(go_pipe[0], &c, 1)) < 0 && errno == EINTR)
        ;
    if (r != 1 || c != 'g')
        return NULL;
    long w0 = now_ns(CLOCK_MONOTONIC);
    long c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    long v = long_call(spin_ms * 1000000L);
    long c1 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    long w1 = now_ns(CLOCK_MONOTONIC);
    printf("{\"tid\":%d,\"long_call\":%ld,\"wall_ns\":%ld,\"cpu_ns\":%ld,\"ok\":%s}\n", tid,
           calls, w1 - w0, c1 - c0, v == spin_ms + 1 ? "true" : "false");
    fflush(stdout);
    return NULL;
}

/* Reads one line from fd 0 (retrying on EINTR), without the newline. */
static int read_line(char *buf, size_t cap)
{
    size_t n = 0;
    for (;;) {
        char c;
        ssize_t r = read(0, &c, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
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

int main(int argc, char **argv)
{
    if (argc > 2 || (argc == 2 && (spin_ms = atol(argv[1])) < 0)) {
        fprintf(stderr, "usage: longcall [SPIN_MS]\n");
        return 64;
    }
    pthread_t th;
    if (pipe(go_pipe) != 0 || pthread_create(&th, NULL, worker, NULL) != 0) {
        fprintf(stderr, "longcall: setup failed\n");
        return 1;
    }
    printf("ready pid=%d threads=2\n", (int)getpid());
    fflush(stdout);
    char line[64];
    if (read_line(line, sizeof line) < 0 || strcmp(line, "go") != 0) {
        close(go_pipe[1]);
        pthread_join(th, NULL);
        return 2;
    }
    if (write(go_pipe[1], "g", 1) != 1)
        return 1;
    pthread_join(th, NULL);
    printf("done\n");
    fflush(stdout);
    return 0;
}
