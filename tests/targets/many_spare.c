/* many_spare: 200 small functions f0..f199 that THREADS threads call in turn,
 * and `spare`, which nothing calls.
 *
 *   many_spare THREADS   each thread runs rounds: x = f_i(x) for every i,
 *                        each result checked against the same arithmetic
 *                        done inline (a wrong result from an instrumented
 *                        function counts as a failure), then sleeps 1 ms.
 *                        The main thread reads commands:
 *                          quit   stops the threads, prints "thread I
 *                                 rounds R failures F" for each, then
 *                                 "done", exits 0
 * Prints "ready pid=P threads=T" first, once every thread made a round.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define F(n) \
    __attribute__((noinline, noipa)) long f##n(long x) { return x * (2 * n + 3) + n; }
#define F10(a) F(a##0) F(a##1) F(a##2) F(a##3) F(a##4) F(a##5) F(a##6) F(a##7) F(a##8) F(a##9)
#define F100(a) F10(a##0) F10(a##1) F10(a##2) F10(a##3) F10(a##4) \
    F10(a##5) F10(a##6) F10(a##7) F10(a##8) F10(a##9)
F10() F10(1) F10(2) F10(3) F10(4) F10(5) F10(6) F10(7) F10(8) F10(9) F100(1)

#define T(n) f##n,
#define T10(a) T(a##0) T(a##1) T(a##2) T(a##3) T(a##4) T(a##5) T(a##6) T(a##7) T(a##8) T(a##9)
#define T100(a) T10(a##0) T10(a##1) T10(a##2) T10(a##3) T10(a##4) \
    T10(a##5) T10(a##6) T10(a##7) T10(a##8) T10(a##9)
static long (*const table[])(long) = {
    T10() T10(1) T10(2) T10(3) T10(4) T10(5) T10(6) T10(7) T10(8) T10(9) T100(1)
};
#define N (sizeof table / sizeof *table)

__attribute__((noinline, noipa, used)) long spare(long x)
{
    return x * 7 + 1;
}

struct worker {
    pthread_t thread;
    long seed;
    long rounds;
    long failures;
};

static atomic_int stop;
static atomic_int started;

static void *run(void *arg)
{
    struct worker *w = arg;
    long x = w->seed;
    while (!atomic_load(&stop)) {
        for (unsigned i = 0; i < N; i++) {
            long want = x * (2 * (long)i + 3) + (long)i;
            x = table[i](x);
            if (x != want)
                w->failures++;
        }
        if (w->rounds++ == 0)
            atomic_fetch_add(&started, 1);
        usleep(1000);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 2;
    struct worker w[16];
    if (n < 1 || n > 16)
        return 64;
    memset(w, 0, sizeof w);
    for (int i = 0; i < n; i++) {
        w[i].seed = i + 1;
        if (pthread_create(&w[i].thread, NULL, run, &w[i]) != 0)
            return 65;
    }
    while (atomic_load(&started) < n)
        usleep(1000);
    printf("ready pid=%d threads=%d\n", (int)getpid(), n + 1);
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin))
        if (strncmp(line, "quit", 4) == 0)
            break;
    atomic_store(&stop, 1);
    for (int i = 0; i < n; i++) {
        pthread_join(w[i].thread, NULL);
        printf("thread %d rounds %ld failures %ld\n", i, w[i].rounds, w[i].failures);
    }
    printf("done\n");
    fflush(stdout);
    return 0;
}
