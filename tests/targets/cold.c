/* cold: work() calls a cold helper on a rare path, so gcc -O2 splits that
 * path off into a `work.cold` fragment that work jumps to (and that jumps
 * back): code entered by a jump, not a call.
 *
 * Build: gcc -O2 -pthread cold.c   (check: nm shows `work.cold`)
 * Usage: cold CALLS [now]
 *   prints "ready", waits for a line on stdin (not with `now`), then
 *   THREADS threads each call work(i * SPAN, SPAN) for i in [0, CALLS);
 *   work loops over k in [i * SPAN, (i + 1) * SPAN) and takes its cold
 *   path when k % RARE == 0. Prints "thread T work=N rare=M sum=S" per
 *   thread (in the order they finish), then "done". Exit 0.
 *
 * A hook that treats work.cold as called clobbers the callee-saved
 * registers work and its caller keep their loop state in: the threads
 * then loop (nearly) forever.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 2
#define RARE 1000
#define SPAN 4

static __thread long rare_calls;
volatile long sink;

__attribute__((cold, noinline)) void rare_path(long i)
{
    rare_calls++;
    sink += i;
    if (i < 0) {
        fprintf(stderr, "negative %ld\n", i);
        abort();
    }
}

/* A loop whose counter and bound live in callee-saved registers across
 * the cold call: the state a `.cold` fragment shares with its function. */
__attribute__((noinline)) long work(long first, long n)
{
    long s = 0;
    for (long k = first; k != first + n; k++) {
        s += (k * 3 + 1) ^ (k >> 2);
        if (__builtin_expect(k % RARE == 0, 0))
            rare_path(k);
    }
    return s;
}

static long calls;

static void *worker(void *arg)
{
    long t = (long)arg, sum = 0, n = 0;
    /* `!=`, as compilers like it: a counter the callee-saved registers
     * lose is never equal to the bound again. */
    for (long i = 0; i != calls; i++) {
        sum += work(i * SPAN, SPAN);
        n++;
    }
    printf("thread %ld work=%ld rare=%ld sum=%ld\n", t, n, rare_calls, sum);
    return NULL;
}

int main(int argc, char **argv)
{
    calls = argc > 1 ? atol(argv[1]) : 100000;
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready\n");
    char line[64];
    if (!(argc > 2 && strcmp(argv[2], "now") == 0) && !fgets(line, sizeof line, stdin))
        return 1;
    pthread_t th[THREADS];
    for (long t = 0; t < THREADS; t++)
        pthread_create(&th[t], NULL, worker, (void *)t);
    for (long t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    printf("done\n");
    return 0;
}
