/* brkloop: a program that is almost always inside malloc/free, most of the
 * time in the brk system call with the arena lock held.
 *
 *   brkloop MS [idle]   allocates and frees 64-316 KiB blocks from the top
 *                       of the heap for MS milliseconds (with an idle extra
 *                       thread when "idle" is given), then prints
 *                       "done N" (N = blocks allocated) and exits 0.
 * Prints "ready pid=P threads=T" first.
 */
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

char *volatile keep;

static void *idle(void *arg)
{
    (void)arg;
    for (;;)
        pause();
    return NULL;
}

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

int main(int argc, char **argv)
{
    long ms = argc > 1 ? atol(argv[1]) : 1000;
    int threads = 1;
    if (argc > 2 && strcmp(argv[2], "idle") == 0) {
        pthread_t t;
        if (pthread_create(&t, NULL, idle, NULL) != 0)
            return 65;
        threads = 2;
    }
    /* Every block from the top of the heap, trimmed at once: brk on every
     * malloc and free. */
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 0);
    mallopt(M_TOP_PAD, 0);
    printf("ready pid=%d threads=%d\n", (int)getpid(), threads);
    fflush(stdout);
    long end = now_ms() + ms, n = 0;
    while (now_ms() < end) {
        for (int i = 0; i < 64; i++, n++) {
            char *volatile p = malloc(64 * 1024 + (n % 64) * 4096);
            p[0] = (char)n;
            keep = p;
            free(keep);
        }
    }
    printf("done %ld\n", n);
    return 0;
}
