/* churn: many short-lived threads, few alive at once.
 *
 *   churn TOTAL ALIVE   creates TOTAL threads in batches of ALIVE (each
 *                       batch joined before the next starts); each thread
 *                       calls work() 10 times.
 * Prints {"threads":TOTAL,"calls":N} where N is the calls work() counted
 * itself, then exits 0.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

static atomic_long calls;

__attribute__((noinline, noipa)) long work(long x)
{
    atomic_fetch_add(&calls, 1);
    return x * 7 + 1;
}

static void *thread_main(void *arg)
{
    long acc = (long)arg;
    for (int i = 0; i < 10; i++)
        acc = work(acc);
    return (void *)acc;
}

int main(int argc, char **argv)
{
    long total = argc > 1 ? atol(argv[1]) : 10000;
    long alive = argc > 2 ? atol(argv[2]) : 8;
    pthread_t threads[64];
    if (alive < 1 || alive > 64)
        return 64;
    for (long done = 0; done < total; done += alive) {
        long n = total - done < alive ? total - done : alive;
        for (long i = 0; i < n; i++)
            if (pthread_create(&threads[i], NULL, thread_main, (void *)(done + i)) != 0)
                return 65;
        for (long i = 0; i < n; i++)
            pthread_join(threads[i], NULL);
    }
    printf("{\"threads\":%ld,\"calls\":%ld}\n", total, atomic_load(&calls));
    return 0;
}
