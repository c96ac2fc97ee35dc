/* A small call tree for the diagnose call graph test: main → serve →
 * {handle (through a table), wait_lock, read_input}; handle_* → leaf. */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
volatile long sink;

__attribute__((noinline)) long leaf(long x) { return x * 3 + 1; }
__attribute__((noinline)) long handle_get(long x) { return leaf(x) + 1; }
__attribute__((noinline)) long handle_put(long x) { return leaf(x) + 2; }
long (*const handlers[])(long) = {handle_get, handle_put};

__attribute__((noinline)) void wait_lock(void) {
    pthread_mutex_lock(&lock);
    sink++;
    pthread_mutex_unlock(&lock);
}

__attribute__((noinline)) long read_input(int fd) {
    char c;
    return read(fd, &c, 1);
}

__attribute__((noinline)) long serve(int i) {
    wait_lock();
    return handlers[i & 1](i) + read_input(-1);
}

int main(void) {
    printf("ready\n");
    fflush(stdout);
    char buf[16];
    for (int i = 0; read(0, buf, sizeof buf) > 0; i++) sink += serve(i);
    return 0;
}
