/* A worker thread that keeps entering `nap` (under `tick`), which sleeps
 * 20 ms: once `nap` is timed, each new activation's return address is
 * replaced by weft's exit hook while the thread sleeps inside it. A stack
 * walk must read through the hook to `tick` and the thread's start, not
 * into weft's exit code. Prints "ready", then "done N" when stdin closes. */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

static volatile int stop;
static volatile unsigned long naps;

__attribute__((noinline)) void nap(void) {
    usleep(20000);
    naps++;
}

__attribute__((noinline)) void tick(void) {
    nap();
    naps++;
}

__attribute__((noinline)) void *worker_main(void *arg) {
    while (!stop) tick();
    return arg;
}

int main(void) {
    pthread_t t;
    pthread_create(&t, NULL, worker_main, NULL);
    printf("ready\n");
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {}
    stop = 1;
    pthread_join(t, NULL);
    printf("done %lu\n", naps);
    return 0;
}
