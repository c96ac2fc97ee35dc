/* latestop: one thread that cannot stop for a while, two that stop at once.
 *
 * Build: gcc -O1 -pthread latestop.c
 * Usage: latestop VFORK_MS
 *   The `vforker` thread loops on vfork(): the child sleeps VFORK_MS and
 *   exits, the parent waits for it. While its child lives, a vfork parent
 *   sleeps uninterruptibly (killable only): a ptrace interrupt stops it
 *   only once the child is gone. Two `ticker` threads count and sleep
 *   100 us at a time. Prints "ready pid=P threads=4", then on the line
 *   "quit" on stdin prints "vforks=N ticks=M failures=F" and exits 0 (1 if
 *   any vfork or wait failed).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long vfork_ms;
static volatile long vforks, ticks, failures;

static void *vforker(void *arg)
{
    (void)arg;
    for (;;) {
        pid_t child = vfork();
        if (child == 0) {
            /* Only raw system calls here: the parent's stack is shared. */
            struct timespec ts = {vfork_ms / 1000, (vfork_ms % 1000) * 1000000L};
            syscall(SYS_nanosleep, &ts, NULL);
            syscall(SYS_exit, 0);
        }
        int status = 0;
        if (child < 0 || waitpid(child, &status, 0) != child || status != 0)
            failures++;
        else
            vforks++;
    }
    return NULL;
}

static void *ticker(void *arg)
{
    (void)arg;
    struct timespec ts = {0, 100000};
    for (;;) {
        __atomic_add_fetch(&ticks, 1, __ATOMIC_RELAXED);
        nanosleep(&ts, NULL);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    vfork_ms = argc > 1 ? atol(argv[1]) : 30;
    pthread_t t;
    pthread_create(&t, NULL, vforker, NULL);
    pthread_setname_np(t, "vforker");
    for (int i = 0; i < 2; i++) {
        pthread_create(&t, NULL, ticker, NULL);
        pthread_setname_np(t, "ticker");
    }
    printf("ready pid=%d threads=4\n", getpid());
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "quit", 4) == 0) {
            printf("vforks=%ld ticks=%ld failures=%ld\n", vforks, ticks, failures);
            fflush(stdout);
            return failures != 0;
        }
    }
    return 1;
}
