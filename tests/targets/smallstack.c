/* smallstack: threads with the smallest stack the system allows call an
 * instrumented function; weft's first-hit registration runs on that stack.
 *
 *   smallstack [THREADS] [CALLS]      (default 8 threads, 1000 calls each)
 *
 * The threads run one after the other; each calls work() CALLS times.
 * Prints {"stack":S,"threads":T,"calls":N} (N = every call made), exit 0.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static long calls_each = 1000;

__attribute__((noinline, noipa)) long work(long x) { return x * 3 + 1; }

static void *run(void *arg)
{
    long x = (long)arg;
    for (long i = 0; i < calls_each; i++)
        x = work(x);
    return (void *)x;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 8;
    calls_each = argc > 2 ? atol(argv[2]) : 1000;
    long min = sysconf(_SC_THREAD_STACK_MIN);
    size_t stack = min > PTHREAD_STACK_MIN ? (size_t)min : PTHREAD_STACK_MIN;
    for (int i = 0; i < threads; i++) {
        pthread_attr_t attr;
        pthread_t t;
        pthread_attr_init(&attr);
        if (pthread_attr_setstacksize(&attr, stack) != 0)
            return 2;
        if (pthread_create(&t, &attr, run, (void *)(long)i) != 0)
            return 3;
        pthread_join(t, NULL);
        pthread_attr_destroy(&attr);
    }
    printf("{\"stack\":%zu,\"threads\":%d,\"calls\":%ld}\n", stack, threads,
           threads * calls_each);
    return 0;
}
