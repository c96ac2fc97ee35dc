/* exits: functions left in every way a C function can be left.
 *
 * Build: gcc -O2 -pthread -rdynamic (names for dladdr) exits.c -ldl
 * Usage: exits            (no arguments)
 *
 * Instrumented-by-the-tests functions (all noinline, noipa, global):
 *   multi_ret(x)      several `ret` sites, chosen by x
 *   tail_caller(x)    ends with `return tail_callee(x + 1);`: a `jmp`
 *   tail_callee(x)
 *   deep(n)           non-tail recursion, n activations (DEEP = 1000)
 *   deeper(n)         the same shape, n activations (DEEPER = 1100): more
 *                     than weft's 1024 hooked activations per thread
 *   jump_host(v)      calls setjmp, then jumper (v even) or jump_mid (v odd)
 *   jump_mid(env, v)  calls jumper
 *   jumper(env, v)    longjmps back into jump_host: never returns
 *   exit_via(v)       calls exiter
 *   exiter(v)         calls pthread_exit: never returns
 *   bt_outer, bt_inner  bt_inner collects a backtrace() through bt_outer
 *
 * WORKERS threads each run ROUNDS rounds of multi_ret (12 calls), tail_caller,
 * deep(DEEP), deeper(DEEPER) and jump_host; EXITERS threads each call
 * exit_via once; the main thread calls bt_outer BT_ROUNDS times. Every
 * function counts its own calls, per thread.
 *
 * Output on stdout is deterministic (no addresses, no thread ids):
 *   {"worker":i,"multi_ret":N,...,"checksum":C,"ok":true}     per worker
 *   {"exiter":i,"retval":R,"exit_via":1,"exiter_calls":1,"ok":true}  per exiter
 *   {"bt":["bt_inner","bt_outer","main",...],"bt_outer":N,"bt_inner":N,"ok":true}
 *   done
 * "bt" lists, innermost first, the names dladdr() gives to the backtrace's
 * addresses that lie in this executable (consecutive repeats merged).
 * Threads are named "worker-i" and "exiter-i". Thread ids go to stderr: "tid role=worker index=i tid=T",
 * "tid role=exiter index=i tid=T", "tid role=main index=0 tid=T".
 * Exit 0, or 1 if any self-check failed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define WORKERS 2
#define ROUNDS 5
#define DEEP 1000
#define DEEPER 1100
#define EXITERS 3
#define BT_ROUNDS 3

struct counts {
    long multi_ret, tail_caller, tail_callee, deep, deeper, jump_host, jump_mid, jumper;
    long exit_via, exiter, bt_outer, bt_inner;
};

static __thread struct counts cnt;

static int gettid_(void) { return (int)syscall(SYS_gettid); }

/* ---- several ret sites ---- */

__attribute__((noinline, noipa)) long multi_ret(long x)
{
    cnt.multi_ret++;
    if (x < 0)
        return -x * 5;
    if (x % 3 == 0)
        return x / 3 + 100;
    if (x % 3 == 1) {
        long s = 0;
        for (long i = 0; i < x; i++)
            s += i * i;
        return s;
    }
    return x * 7;
}

static long ref_multi_ret(long x)
{
    if (x < 0)
        return -x * 5;
    if (x % 3 == 0)
        return x / 3 + 100;
    if (x % 3 == 1) {
        long s = 0;
        for (long i = 0; i < x; i++)
            s += i * i;
        return s;
    }
    return x * 7;
}

/* ---- tail call ---- */

__attribute__((noinline, noipa)) long tail_callee(long x)
{
    cnt.tail_callee++;
    return x * x - 3;
}

__attribute__((noinline, noipa)) long tail_caller(long x)
{
    cnt.tail_caller++;
    return tail_callee(x + 1);
}

/* ---- recursion (not tail: the xor and shift after the call) ---- */

__attribute__((noinline, noipa)) long deep(long n)
{
    cnt.deep++;
    if (n <= 1)
        return 1;
    long r = deep(n - 1);
    return (r ^ (r << 5) ^ n) & 0xffffffL;
}

__attribute__((noinline, noipa)) long deeper(long n)
{
    cnt.deeper++;
    if (n <= 1)
        return 3;
    long r = deeper(n - 1);
    return (r ^ (r << 3) ^ n) & 0xffffffL;
}

static long ref_rec(long n, long bottom, int shift)
{
    long r = bottom;
    for (long i = 2; i <= n; i++)
        r = (r ^ (r << shift) ^ i) & 0xffffffL;
    return r;
}

/* ---- longjmp out of instrumented frames ---- */

__attribute__((noinline, noipa)) void jumper(jmp_buf *env, long v)
{
    cnt.jumper++;
    longjmp(*env, (int)v + 1);
}

__attribute__((noinline, noipa)) long jump_mid(jmp_buf *env, long v)
{
    cnt.jump_mid++;
    jumper(env, v);
    return -1; /* not reached */
}

__attribute__((noinline, noipa)) long jump_host(long v)
{
    cnt.jump_host++;
    jmp_buf env;
    volatile long got = 0;
    int r = setjmp(env);
    if (r == 0) {
        if (v % 2 == 0)
            jumper(&env, v);
        else
            jump_mid(&env, v);
        return -1; /* not reached */
    }
    got = r;
    return got * 10 + v;
}

/* ---- pthread_exit inside instrumented frames ---- */

struct xstate {
    pthread_t th;
    int index;
    struct counts counts;
};

static __thread struct xstate *xself;

__attribute__((noinline, noipa)) void exiter(long v)
{
    cnt.exiter++;
    xself->counts = cnt;
    pthread_exit((void *)(v * 3));
}

__attribute__((noinline, noipa)) long exit_via(long v)
{
    cnt.exit_via++;
    exiter(v + 1);
    return -1; /* not reached */
}

static void *exit_thread(void *arg)
{
    xself = arg;
    char name[16];
    snprintf(name, sizeof name, "exiter-%d", xself->index);
    pthread_setname_np(pthread_self(), name);
    fprintf(stderr, "tid role=exiter index=%d tid=%d\n", xself->index, gettid_());
    exit_via(xself->index);
    return (void *)-1L;
}

/* ---- workers ---- */

struct wstate {
    pthread_t th;
    int index;
    struct counts counts;
    unsigned long checksum;
    int ok;
};

static void *worker(void *arg)
{
    struct wstate *w = arg;
    char name[16];
    snprintf(name, sizeof name, "worker-%d", w->index);
    pthread_setname_np(pthread_self(), name);
    fprintf(stderr, "tid role=worker index=%d tid=%d\n", w->index, gettid_());
    unsigned long sum = 0, ref = 0;
    for (long r = 0; r < ROUNDS; r++) {
        for (long x = -2; x < 10; x++) {
            sum = sum * 31 + (unsigned long)multi_ret(x + r);
            ref = ref * 31 + (unsigned long)ref_multi_ret(x + r);
        }
        long t = r * 7 + w->index;
        sum = sum * 31 + (unsigned long)tail_caller(t);
        ref = ref * 31 + (unsigned long)((t + 1) * (t + 1) - 3);
        sum = sum * 31 + (unsigned long)deep(DEEP);
        ref = ref * 31 + (unsigned long)ref_rec(DEEP, 1, 5);
        sum = sum * 31 + (unsigned long)deeper(DEEPER);
        ref = ref * 31 + (unsigned long)ref_rec(DEEPER, 3, 3);
        sum = sum * 31 + (unsigned long)jump_host(r);
        ref = ref * 31 + (unsigned long)((r + 1) * 10 + r);
    }
    w->counts = cnt;
    w->checksum = sum;
    w->ok = sum == ref && cnt.multi_ret == 12 * ROUNDS && cnt.tail_caller == ROUNDS &&
            cnt.tail_callee == ROUNDS && cnt.deep == DEEP * ROUNDS &&
            cnt.deeper == DEEPER * ROUNDS && cnt.jump_host == ROUNDS &&
            cnt.jumper == ROUNDS && cnt.jump_mid == ROUNDS / 2;
    return NULL;
}

/* ---- backtrace through instrumented frames ---- */

__attribute__((noinline, noipa)) int bt_inner(char *out, size_t cap)
{
    cnt.bt_inner++;
    void *frames[64];
    int n = backtrace(frames, 64);
    Dl_info self, di;
    if (!dladdr((void *)&bt_inner, &self))
        return -1;
    size_t len = 0;
    const char *last = "";
    int names = 0;
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        if (!dladdr(frames[i], &di) || di.dli_fbase != self.dli_fbase || !di.dli_sname)
            continue;
        if (!strcmp(di.dli_sname, last))
            continue;
        last = di.dli_sname;
        int w = snprintf(out + len, cap - len, "%s\"%s\"", names ? "," : "", di.dli_sname);
        if (w < 0 || (size_t)w >= cap - len)
            return -1;
        len += (size_t)w;
        names++;
    }
    return names;
}

__attribute__((noinline, noipa)) int bt_outer(char *out, size_t cap)
{
    cnt.bt_outer++;
    int n = bt_inner(out, cap);
    return n < 0 ? n : n + 1000;
}

int main(void)
{
    int ok = 1;
    fprintf(stderr, "tid role=main index=0 tid=%d\n", gettid_());

    static struct wstate ws[WORKERS];
    for (int i = 0; i < WORKERS; i++) {
        ws[i].index = i;
        if (pthread_create(&ws[i].th, NULL, worker, &ws[i]) != 0)
            return 1;
    }
    for (int i = 0; i < WORKERS; i++)
        pthread_join(ws[i].th, NULL);
    for (int i = 0; i < WORKERS; i++) {
        struct wstate *w = &ws[i];
        struct counts *c = &w->counts;
        printf("{\"worker\":%d,\"multi_ret\":%ld,\"tail_caller\":%ld,\"tail_callee\":%ld,"
               "\"deep\":%ld,\"deeper\":%ld,\"jump_host\":%ld,\"jump_mid\":%ld,\"jumper\":%ld,"
               "\"checksum\":%lu,\"ok\":%s}\n",
               i, c->multi_ret, c->tail_caller, c->tail_callee, c->deep, c->deeper,
               c->jump_host, c->jump_mid, c->jumper, w->checksum, w->ok ? "true" : "false");
        ok &= w->ok;
    }

    static struct xstate xs[EXITERS];
    for (int i = 0; i < EXITERS; i++) {
        xs[i].index = i;
        if (pthread_create(&xs[i].th, NULL, exit_thread, &xs[i]) != 0)
            return 1;
    }
    for (int i = 0; i < EXITERS; i++) {
        void *ret = NULL;
        pthread_join(xs[i].th, &ret);
        long rv = (long)ret;
        int xok = rv == (i + 1) * 3 && xs[i].counts.exit_via == 1 && xs[i].counts.exiter == 1;
        printf("{\"exiter\":%d,\"retval\":%ld,\"exit_via\":%ld,\"exiter_calls\":%ld,\"ok\":%s}\n",
               i, rv, xs[i].counts.exit_via, xs[i].counts.exiter, xok ? "true" : "false");
        ok &= xok;
    }

    char names[4096], first[4096] = "";
    int bt_ok = 1;
    for (int k = 0; k < BT_ROUNDS; k++) {
        int n = bt_outer(names, sizeof names);
        if (n < 1000 + 3)
            bt_ok = 0;
        if (k == 0)
            strcpy(first, names);
        else if (strcmp(first, names) != 0)
            bt_ok = 0;
    }
    bt_ok &= strstr(first, "\"bt_inner\",\"bt_outer\",\"main\"") != NULL;
    printf("{\"bt\":[%s],\"bt_outer\":%ld,\"bt_inner\":%ld,\"ok\":%s}\n", first, cnt.bt_outer,
           cnt.bt_inner, bt_ok ? "true" : "false");
    ok &= bt_ok;
    printf("done\n");
    fflush(stdout);
    return ok ? 0 : 1;
}
