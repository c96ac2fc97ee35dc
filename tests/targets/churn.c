/* churn: many short-lived threads, few alive at once.
 *
 *   churn TOTAL ALIVE   creates TOTAL threads in batches of ALIVE (each
 *                       batch joined before the next starts); each thread
 *                       calls work() 10 times.
 * Prints {"threads":TOTAL,"calls":N,"fds":[B,A],"maps":[B,A]} where N is the
 * calls work() counted itself, and B/A the open file descriptors and memory
 * mappings before the first and after the last thread, then exits 0.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <dirent.h>
#include <stdlib.h>

static atomic_long calls;

__attribute__((noinline, noipa)) long work(long x)
{
    atomic_fetch_add(&calls, 1);
    return x * 7 + 1;
}

static long count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    long n = 0;
    if (!d)
        return -1;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

static long count_maps(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    long n = 0;
    int c;
    if (!f)
        return -1;
    while ((c = fgetc(f)) != EOF)
        n += c == '\n';
    fclose(f);
    return n;
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
    long fds0 = count_fds(), maps0 = count_maps();
    for (long done = 0; done < total; done += alive) {
        long n = total - done < alive ? total - done : alive;
        for (long i = 0; i < n; i++)
            if (pthread_create(&threads[i], NULL, thread_main, (void *)(done + i)) != 0)
                return 65;
        for (long i = 0; i < n; i++)
            pthread_join(threads[i], NULL);
    }
    long fds1 = count_fds(), maps1 = count_maps();
    printf("{\"threads\":%ld,\"calls\":%ld,\"fds\":[%ld,%ld],\"maps\":[%ld,%ld]}\n", total,
           atomic_load(&calls), fds0, fds1, maps0, maps1);
    return 0;
}
