/* A CPU-bound program whose loops call a tiny function ten million times a
 * second: weft diagnose finds `crunch` and must not keep `tick`'s probe
 * (its calls would cost far more than --max-overhead). `tick` is reached
 * from two workers and by two paths (crunch > tick, polish > tick), so its
 * tests come up again after its probe was taken out: each must be skipped,
 * not probed again. Prints "ready". */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

volatile unsigned long sink;

__attribute__((noinline)) void tick(void) { sink++; }
__attribute__((noinline)) void crunch(void) {
    for (int i = 0; i < 100000; i++) tick();
}
__attribute__((noinline)) void polish(void) {
    for (int i = 0; i < 20000; i++) tick();
}
__attribute__((noinline)) void *worker(void *arg) {
    for (;;) {
        crunch();
        polish();
    }
    return arg;
}

int main(void) {
    pthread_t t;
    pthread_create(&t, 0, worker, 0);
    pthread_create(&t, 0, worker, 0);
    printf("ready\n");
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {}
    return 0;
}
