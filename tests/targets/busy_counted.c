/* busy_counted: N threads spinning on `leaf`, and one more thread, the
 * counter, that calls `leaf` too and publishes how many calls it has made
 * after each one, in the first 8 bytes of the file COUNT_FILE (mapped
 * shared): a reader sees, at any moment, a count the thread had reached.
 *
 * Usage: busy_counted N COUNT_FILE
 * Prints "ready counter=<tid>" once every thread runs; runs until killed.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

__attribute__((noinline, noipa)) long leaf(long x) { return x * 3 + 1; }

static volatile uint64_t *published;
static volatile int started;

static void *spin(void *a)
{
    long x = (long)a;
    __atomic_add_fetch(&started, 1, __ATOMIC_RELAXED);
    for (;;)
        x = leaf(x);
    return 0;
}

static pid_t counter_tid;

static void *count(void *a)
{
    long x = (long)a;
    uint64_t n = 0;
    __atomic_store_n(&counter_tid, (pid_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
    for (;;) {
        x = leaf(x);
        n++;
        __atomic_store_n(published, n, __ATOMIC_RELEASE);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    int n = atoi(argv[1]);
    int fd = open(argv[2], O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ftruncate(fd, 4096))
        return 3;
    published = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (published == MAP_FAILED)
        return 4;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 64 * 1024);
    for (int i = 0; i < n; i++) {
        pthread_t t;
        if (pthread_create(&t, &at, spin, (void *)(long)i))
            return 5;
    }
    pthread_t c;
    if (pthread_create(&c, &at, count, (void *)7L))
        return 5;
    while (__atomic_load_n(&started, __ATOMIC_RELAXED) < n || !__atomic_load_n(&counter_tid, __ATOMIC_ACQUIRE))
        usleep(1000);
    printf("ready counter=%d\n", (int)counter_tid);
    fflush(stdout);
    for (;;)
        pause();
}
