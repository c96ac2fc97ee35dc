/* points: indirect calls (a function pointer and a virtual call through a
 * vtable), call sites and a loop in worker threads, for instruction points
 * and dynamic call graphs.
 *
 * Usage: points [T]   (T worker threads, default 3)
 * Each worker K (0..T) prints "worker K tid=TID" when it starts; then the
 * program prints "ready pid=P threads=T+1". For each "run N" line on
 * stdin, every worker K does, for i = 0..N-1:
 *     r += dispatch(ops[(i + K) % 3], i)        ops: twice, square, negate
 *     r += area(shapes[(i * (K + 1)) % 4])      a "virtual" call: s->vt->area(s)
 * then prints its cumulative ground truth
 *     "worker K tid=TID calls=C op0=a op1=b op2=c sq=S ci=Q r=R"
 * (C: dispatch calls; op0..2: calls to twice, square, negate; sq/ci: area
 * calls on squares / circles), and the main thread prints "round N done"
 * once every worker has. "quit" exits 0.
 */
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef long (*op_fn)(long);

__attribute__((noinline)) long twice(long x) { return 2 * x; }
__attribute__((noinline)) long square(long x) { return x * x; }
__attribute__((noinline)) long negate(long x) { return -x; }

static op_fn ops[3] = {twice, square, negate};

/* The indirect call: `call *%rax` or the like (2-3 bytes), the result used
 * after it (so it is not a tail call). */
__attribute__((noinline)) long dispatch(op_fn op, long x) { return op(x) * 3 + 1; }

struct shape;
struct shape_vt {
    const char *name;
    long (*area)(const struct shape *);
};
struct shape {
    const struct shape_vt *vt;
    long size;
};

__attribute__((noinline)) long square_area(const struct shape *s) { return s->size * s->size; }
__attribute__((noinline)) long circle_area(const struct shape *s) { return 3 * s->size * s->size; }

static const struct shape_vt square_vt = {"square", square_area};
static const struct shape_vt circle_vt = {"circle", circle_area};
static const struct shape shapes[4] = {
    {&square_vt, 1}, {&circle_vt, 2}, {&square_vt, 3}, {&circle_vt, 4}};

/* A virtual call: load the vtable, `call *8(%rax)`, use the result. */
__attribute__((noinline)) long area(const struct shape *s) { return s->vt->area(s) + 1; }

static int threads = 3;
static sem_t done;
static volatile int rounds_n;

struct worker {
    sem_t go; /* one each: a quick worker must not take another's round */
    int k;
    long calls, op[3], sq, ci, r;
};

static void *worker(void *arg)
{
    struct worker *w = arg;
    int tid = (int)syscall(SYS_gettid);
    printf("worker %d tid=%d\n", w->k, tid);
    sem_post(&done);
    for (;;) {
        sem_wait(&w->go);
        int n = rounds_n;
        for (int i = 0; i < n; i++) {
            int j = (i + w->k) % 3;
            w->r += dispatch(ops[j], i);
            w->calls++;
            w->op[j]++;
            const struct shape *s = &shapes[(i * (w->k + 1)) % 4];
            w->r += area(s);
            if (s->vt == &square_vt)
                w->sq++;
            else
                w->ci++;
        }
        printf("worker %d tid=%d calls=%ld op0=%ld op1=%ld op2=%ld sq=%ld ci=%ld r=%ld\n", w->k,
               tid, w->calls, w->op[0], w->op[1], w->op[2], w->sq, w->ci, w->r);
        sem_post(&done);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    char line[64];
    if (argc > 1)
        threads = atoi(argv[1]);
    setvbuf(stdout, NULL, _IOLBF, 0);
    sem_init(&done, 0, 0);
    struct worker *ws = calloc(threads, sizeof *ws);
    for (int k = 0; k < threads; k++) {
        pthread_t t;
        ws[k].k = k;
        sem_init(&ws[k].go, 0, 0);
        pthread_create(&t, NULL, worker, &ws[k]);
        sem_wait(&done);
    }
    printf("ready pid=%d threads=%d\n", (int)getpid(), threads + 1);
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "run ", 4) == 0) {
            rounds_n = atoi(line + 4);
            for (int k = 0; k < threads; k++)
                sem_post(&ws[k].go);
            for (int k = 0; k < threads; k++)
                sem_wait(&done);
            printf("round %d done\n", rounds_n);
        } else if (strncmp(line, "quit", 4) == 0) {
            return 0;
        }
    }
    return 2;
}
