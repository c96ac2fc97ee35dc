/* A pooled resource: `handle_big` spends about a third of the worker's
 * time in `pool_get` (asleep, as if waiting for a pooled connection);
 * `handle_small` sleeps as long in `cache_get`, which is not the pool.
 * Neither is where the CPU goes (`work`). A tool's own hypothesis naming
 * `pool_get` finds worker > serve > handle_big > pool_get, and nothing
 * under handle_small. Prints "threads W", "ready"; then every half second
 * the share of that half second the worker spent in pool_get by its own
 * clock, `share pool=0.351` (a loaded machine oversleeps every usleep, so
 * the share is measured, not assumed); ends when stdin closes. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;
static volatile int tid;

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

__attribute__((noinline)) void pool_get(int us) { usleep(us); }
__attribute__((noinline)) void cache_get(int us) { usleep(us); }

__attribute__((noinline)) void work(int us) {
    double end = now_us() + us;
    while (now_us() < end) sink++;
}

static double in_pool;

__attribute__((noinline)) void handle_big(void) {
    double t0 = now_us();
    pool_get(700);
    in_pool += now_us() - t0;
    work(300);
}

__attribute__((noinline)) void handle_small(void) {
    cache_get(700);
    work(300);
}

__attribute__((noinline)) void serve(void) {
    handle_big();
    handle_small();
}

__attribute__((noinline)) void *worker(void *arg) {
    tid = gettid();
    double window = now_us();
    for (;;) {
        serve();
        double now = now_us();
        if (now - window >= 500000) {
            printf("share pool=%.3f\n", in_pool / (now - window));
            fflush(stdout);
            in_pool = 0;
            window = now;
        }
    }
    return arg;
}

int main(void) {
    pthread_t t;
    pthread_create(&t, 0, worker, 0);
    while (!tid) usleep(1000);
    printf("threads %d\nready\n", tid);
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {}
    return 0;
}
