/* workers: multi-threaded target for weft's integration tests.
 *
 * Usage: workers [--threads N] [--late-threads K] [--phases P] [--no-wait]
 *                [--exit-code C] [--raise SIG]
 *
 * Protocol (stdout, one line each, flushed):
 *   ready pid=<pid> threads=<N+1>        all N workers exist and wait
 *   then for each phase p = 1..P:
 *     (unless --no-wait) read one line "go" from stdin ("quit" or EOF: exit 2)
 *     (phase 1 only) create the K late threads
 *     every thread i (0..N+K-1) calls
 *        work_a  1000*(i+1)+37*p times   (this executable)
 *        work_b   500*(i+1)+11*p times   (this executable)
 *        lib_work 250*(i+1)+3*p  times   (libwork.so, or local with -DNO_LIBWORK)
 *     one JSON line per thread, counted by the functions themselves:
 *       {"phase":p,"index":i,"tid":T,"name":"worker-i","work_a":A,"work_b":B,"lib_work":L,"ok":true}
 *     (late threads are named "late-j"; "ok" checks results against a reference)
 *     phase <p> done
 *   done                                  then exit(C) (default 0), or raise(SIG)
 * Any anomaly (e.g. EINTR on stdin) prints a line starting with "FAIL".
 * The main thread never calls an instrumented function.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifdef NO_LIBWORK
__attribute__((noinline, noipa)) long lib_work(long *counter, long x)
{
    *counter += 1;
    long r = x ^ (x >> 3);
    if (r & 1)
        r += 0x1234;
    return r;
}
#else
long lib_work(long *counter, long x);
#endif

__attribute__((noinline, noipa)) long work_a(long *counter, long x)
{
    *counter += 1;
    long r = x * 3 + 1;
    if (r & 4)
        r ^= 0x55;
    return r;
}

__attribute__((noinline, noipa)) long work_b(long *counter, long x)
{
    *counter += 1;
    return (x << 1) - (x >> 2) + 7;
}

static long ref_a(long x) { long r = x * 3 + 1; if (r & 4) r ^= 0x55; return r; }
static long ref_b(long x) { return (x << 1) - (x >> 2) + 7; }
static long ref_l(long x) { long r = x ^ (x >> 3); if (r & 1) r += 0x1234; return r; }

#define MAXT 256

struct tstate {
    pthread_t th;
    int index;
    int late;
    volatile int tid;
    char name[16];
    long a, b, l;
    int ok;
};

static struct tstate ts[MAXT];
static int nthreads; /* total, including late ones once created */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv_start = PTHREAD_COND_INITIALIZER;
static pthread_cond_t cv_done = PTHREAD_COND_INITIALIZER;
static int cur_phase, done_count, started_count, quit;

static void do_phase(struct tstate *s, int p)
{
    long na = 1000L * (s->index + 1) + 37L * p;
    long nb = 500L * (s->index + 1) + 11L * p;
    long nl = 250L * (s->index + 1) + 3L * p;
    long n = na;
    if (nb > n) n = nb;
    if (nl > n) n = nl;
    s->a = s->b = s->l = 0;
    long acc = p, ref = p;
    for (long k = 0; k < n; k++) {
        if (k < na) acc = acc * 31 + work_a(&s->a, acc + k);
        if (k < nb) acc = acc * 17 + work_b(&s->b, acc ^ k);
        if (k < nl) acc = acc * 13 + lib_work(&s->l, acc - k);
    }
    for (long k = 0; k < n; k++) {
        if (k < na) ref = ref * 31 + ref_a(ref + k);
        if (k < nb) ref = ref * 17 + ref_b(ref ^ k);
        if (k < nl) ref = ref * 13 + ref_l(ref - k);
    }
    s->ok = (acc == ref) && s->a == na && s->b == nb && s->l == nl;
}

static void *worker(void *arg)
{
    struct tstate *s = arg;
    pthread_setname_np(pthread_self(), s->name);
    s->tid = (int)syscall(SYS_gettid);
    int last = 0;
    pthread_mutex_lock(&mu);
    started_count++;
    pthread_cond_broadcast(&cv_done);
    for (;;) {
        while (cur_phase == last && !quit)
            pthread_cond_wait(&cv_start, &mu);
        if (cur_phase == last && quit)
            break;
        last = cur_phase;
        pthread_mutex_unlock(&mu);
        do_phase(s, last);
        pthread_mutex_lock(&mu);
        done_count++;
        pthread_cond_broadcast(&cv_done);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

/* Reads one line from fd 0 without stdio (no allocation after "ready"). */
static int read_line(char *buf, size_t cap)
{
    size_t n = 0;
    for (;;) {
        char c;
        ssize_t r = read(0, &c, 1);
        if (r < 0) {
            if (errno == EINTR) {
                printf("FAIL stdin read: EINTR\n");
                fflush(stdout);
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

static void start_thread(int i, int late, int late_index)
{
    struct tstate *s = &ts[i];
    s->index = i;
    s->late = late;
    if (late)
        snprintf(s->name, sizeof s->name, "late-%d", late_index);
    else
        snprintf(s->name, sizeof s->name, "worker-%d", i);
    if (pthread_create(&s->th, NULL, worker, s) != 0) {
        printf("FAIL pthread_create\n");
        exit(1);
    }
}

int main(int argc, char **argv)
{
    int n = 4, late = 0, phases = 1, no_wait = 0, exit_code = 0, raise_sig = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : "0";
        if (!strcmp(a, "--threads")) n = atoi(v), i++;
        else if (!strcmp(a, "--late-threads")) late = atoi(v), i++;
        else if (!strcmp(a, "--phases")) phases = atoi(v), i++;
        else if (!strcmp(a, "--exit-code")) exit_code = atoi(v), i++;
        else if (!strcmp(a, "--raise")) raise_sig = atoi(v), i++;
        else if (!strcmp(a, "--no-wait")) no_wait = 1;
        else { fprintf(stderr, "workers: bad argument %s\n", a); return 64; }
    }
    if (n < 0 || late < 0 || n + late > MAXT || phases < 1) {
        fprintf(stderr, "workers: bad counts\n");
        return 64;
    }
    pthread_mutex_lock(&mu);
    for (int i = 0; i < n; i++)
        start_thread(i, 0, 0);
    nthreads = n;
    while (started_count < n)
        pthread_cond_wait(&cv_done, &mu);
    pthread_mutex_unlock(&mu);

    printf("ready pid=%d threads=%d\n", (int)getpid(), n + 1);
    fflush(stdout);

    char line[256];
    for (int p = 1; p <= phases; p++) {
        if (!no_wait) {
            for (;;) {
                if (read_line(line, sizeof line) < 0 || !strcmp(line, "quit"))
                    _exit(2);
                if (!strcmp(line, "go"))
                    break;
            }
        }
        pthread_mutex_lock(&mu);
        if (p == 1 && late > 0) {
            for (int j = 0; j < late; j++)
                start_thread(n + j, 1, j);
            nthreads = n + late;
            while (started_count < nthreads)
                pthread_cond_wait(&cv_done, &mu);
        }
        done_count = 0;
        cur_phase = p;
        pthread_cond_broadcast(&cv_start);
        while (done_count < nthreads)
            pthread_cond_wait(&cv_done, &mu);
        pthread_mutex_unlock(&mu);
        for (int i = 0; i < nthreads; i++) {
            struct tstate *s = &ts[i];
            printf("{\"phase\":%d,\"index\":%d,\"tid\":%d,\"name\":\"%s\",\"work_a\":%ld,"
                   "\"work_b\":%ld,\"lib_work\":%ld,\"ok\":%s}\n",
                   p, i, s->tid, s->name, s->a, s->b, s->l, s->ok ? "true" : "false");
        }
        printf("phase %d done\n", p);
        fflush(stdout);
    }

    pthread_mutex_lock(&mu);
    quit = 1;
    pthread_cond_broadcast(&cv_start);
    pthread_mutex_unlock(&mu);
    for (int i = 0; i < nthreads; i++)
        pthread_join(ts[i].th, NULL);
    printf("done\n");
    fflush(stdout);
    if (raise_sig) {
        signal(raise_sig, SIG_DFL);
        raise(raise_sig);
    }
    return exit_code;
}
