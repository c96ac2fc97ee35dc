/* A known call chain in each of two threads, both blocked: the stack
 * walk must name every function from the blocking call out to the
 * thread's start. Built without frame pointers: only CFI describes the
 * frames. */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

static int never[2];

__attribute__((noinline)) int wait_here(int depth) {
    char c;
    /* Nobody writes the pipe: the thread waits here for good. */
    int r = (int)read(never[0], &c, 1);
    return r + depth;
}

__attribute__((noinline)) int worker_loop(int n) {
    int s = 0;
    for (int i = 0; i < n; i++) s += wait_here(i);
    return s;
}

__attribute__((noinline)) void *worker_main(void *arg) {
    (void)arg;
    volatile int s = worker_loop(1000);
    (void)s;
    return NULL;
}

__attribute__((noinline)) int inner(void) {
    char buf[64];
    /* Waits for stdin to close. */
    return (int)read(0, buf, sizeof buf);
}

__attribute__((noinline)) int middle(void) { return inner() + 1; }

__attribute__((noinline)) int outer(void) { return middle() + 1; }

int main(void) {
    pthread_t t;
    if (pipe(never) != 0) return 1;
    pthread_create(&t, NULL, worker_main, NULL);
    printf("ready\n");
    fflush(stdout);
    volatile int r = outer();
    printf("done %d\n", r);
    return 0;
}
