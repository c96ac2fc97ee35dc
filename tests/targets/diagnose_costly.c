/* A CPU-bound worker whose loop calls a tiny function ten million times a
 * second: weft diagnose finds `crunch` and must not keep `tick`'s probe
 * (its calls would cost far more than --max-overhead). Prints "ready". */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

volatile unsigned long sink;

__attribute__((noinline)) void tick(void) { sink++; }
__attribute__((noinline)) void crunch(void) {
    for (int i = 0; i < 100000; i++) tick();
}
__attribute__((noinline)) void *worker(void *arg) {
    for (;;) crunch();
    return arg;
}

int main(void) {
    pthread_t t;
    pthread_create(&t, 0, worker, 0);
    printf("ready\n");
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {}
    return 0;
}
