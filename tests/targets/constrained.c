/*
 * Shared code under several callers, for constrained metrics: a helper
 * (`spin_for`) called from a hot caller (`parse_request`) and a cold one
 * (`log_line`); a qsort comparator (`cmp_keys`) under `rebuild_index` and
 * `sort_small`; recursion through a shared helper (`recurse` -> `step` ->
 * `recurse`, `step` also called by `tidy`); and a longjmp out of the hot
 * caller (`guarded_parse`), after which the helper is called outside it.
 *
 * Built as users build (gcc and clang, -O2 -g), threads with default
 * attributes. Keeps its own truth per thread, from the program's own
 * knowledge of where each call was made, and prints it after each run.
 *
 * Prints "ready pid=P threads=T", then reads commands from stdin:
 *   go N   each worker runs N rounds; prints one line per worker
 *          "truth tid=T spins=C spin_in_parse=C spin_in_parse_cpu=NS
 *           cmp_in_rebuild=C step_in_recurse=C parse=C"
 *          then "done"
 *   quit   exits
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))

static __thread int in_parse, in_rebuild, in_recurse;
static __thread long spins, spin_in_parse, cmp_in_rebuild, step_in_recurse, parses;
static __thread long long spin_in_parse_cpu;
static __thread jmp_buf parse_escape;
static volatile unsigned long sink;

static long long thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

NOINLINE void spin_for(long ns) {
    long long t0 = thread_cpu_ns(), t;
    do {
        for (int i = 0; i < 200; i++)
            sink += i;
        t = thread_cpu_ns();
    } while (t - t0 < ns);
    spins++;
    if (in_parse) {
        spin_in_parse++;
        spin_in_parse_cpu += t - t0;
    }
}

NOINLINE void fail_deep(int round) {
    spin_for(20000);
    if (round % 7 == 3)
        longjmp(parse_escape, 1);
}

NOINLINE void parse_request(int round) {
    in_parse++;
    parses++;
    spin_for(150000);
    fail_deep(round);
    spin_for(50000);
    in_parse--;
}

NOINLINE void guarded_parse(int round) {
    if (setjmp(parse_escape)) {
        /* Out of parse_request by longjmp: no longer inside it. */
        in_parse = 0;
        spin_for(30000);
        return;
    }
    parse_request(round);
}

NOINLINE void log_line(void) { spin_for(60000); }

NOINLINE int cmp_keys(const void *a, const void *b) {
    if (in_rebuild)
        cmp_in_rebuild++;
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? -1 : x > y;
}

static NOINLINE void fill(long *keys, int n, unsigned seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        keys[i] = seed >> 8;
    }
}

NOINLINE void rebuild_index(int round) {
    long keys[2000];
    fill(keys, 2000, round);
    in_rebuild = 1;
    qsort(keys, 2000, sizeof keys[0], cmp_keys);
    in_rebuild = 0;
}

NOINLINE void sort_small(int round) {
    long keys[8];
    fill(keys, 8, round + 7);
    qsort(keys, 8, sizeof keys[0], cmp_keys);
}

NOINLINE void recurse(int depth);

NOINLINE void step(int depth) {
    if (in_recurse)
        step_in_recurse++;
    spin_for(5000);
    if (depth > 0)
        recurse(depth - 1);
}

NOINLINE void recurse(int depth) {
    in_recurse++;
    step(depth);
    in_recurse--;
}

NOINLINE void tidy(void) { step(0); }

static int rounds_asked;
static pthread_barrier_t start_line, finish_line;

static void *worker(void *arg) {
    (void)arg;
    for (;;) {
        pthread_barrier_wait(&start_line);
        spins = spin_in_parse = cmp_in_rebuild = step_in_recurse = parses = 0;
        spin_in_parse_cpu = 0;
        for (int r = 0; r < rounds_asked; r++) {
            guarded_parse(r);
            log_line();
            log_line();
            sort_small(r);
            if (r % 4 == 0)
                rebuild_index(r);
            recurse(3);
            tidy();
        }
        flockfile(stdout);
        printf("truth tid=%d spins=%ld spin_in_parse=%ld spin_in_parse_cpu=%lld "
               "cmp_in_rebuild=%ld step_in_recurse=%ld parse=%ld\n",
               gettid(), spins, spin_in_parse, spin_in_parse_cpu, cmp_in_rebuild,
               step_in_recurse, parses);
        funlockfile(stdout);
        pthread_barrier_wait(&finish_line);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 3;
    setvbuf(stdout, NULL, _IOLBF, 0);
    pthread_barrier_init(&start_line, NULL, n + 1);
    pthread_barrier_init(&finish_line, NULL, n + 1);
    for (int i = 0; i < n; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, worker, NULL) != 0)
            return 1;
    }
    printf("ready pid=%d threads=%d\n", getpid(), n + 1);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (!strncmp(line, "go ", 3)) {
            rounds_asked = atoi(line + 3);
            pthread_barrier_wait(&start_line);
            pthread_barrier_wait(&finish_line);
            printf("done\n");
        } else if (!strncmp(line, "quit", 4)) {
            return 0;
        }
    }
    return 0;
}
