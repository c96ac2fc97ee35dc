/* loaderlock: threads that hold glibc's loader lock most of the time, so
 * that weft's remote dlopen (run with the other threads stopped) finds it
 * taken by a stopped thread.
 *
 *   loaderlock THREADS   each thread loops: dl_iterate_phdr with a callback
 *                        that spins 2 ms (the loader's write lock held
 *                        meanwhile), then `tick`, then sleeps 1 ms. The main
 *                        thread reads commands from stdin:
 *                          count   prints "ticks N" (all threads so far)
 *                          quit    stops the threads, prints "done N", exits 0
 * Prints "ready pid=P threads=T" first (T = THREADS + 1).
 */
#define _GNU_SOURCE
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int stop;
static atomic_long ticks;

__attribute__((noinline)) void tick(void)
{
    atomic_fetch_add(&ticks, 1);
}

static long now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000L + ts.tv_nsec / 1000L;
}

static int hold(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)info;
    (void)size;
    (void)arg;
    long until = now_us() + 2000;
    while (now_us() < until)
        ;
    return 1; /* one object is enough: the lock is held throughout */
}

static void *worker(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) {
        dl_iterate_phdr(hold, NULL);
        tick();
        usleep(1000);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 2;
    pthread_t t[64];
    if (n < 1 || n > 64)
        return 64;
    for (int i = 0; i < n; i++)
        if (pthread_create(&t[i], NULL, worker, NULL) != 0)
            return 65;
    printf("ready pid=%d threads=%d\n", (int)getpid(), n + 1);
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "count", 5) == 0) {
            printf("ticks %ld\n", atomic_load(&ticks));
            fflush(stdout);
        } else if (strncmp(line, "quit", 4) == 0) {
            break;
        }
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    printf("done %ld\n", atomic_load(&ticks));
    fflush(stdout);
    return 0;
}
