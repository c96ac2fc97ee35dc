/* Waits for weft diagnose: two `worker` threads contend one mutex inside
 * `update_shared` (each holds it ~2 ms of its ~4.1 ms loop, mostly asleep, so each
 * waits ~45% of its time whatever the machine's load); a `reader` thread reads small records from a pipe
 * that a `writer` thread fills slowly (the reader blocks ~90% of its time
 * in read). A `pool_worker` waits for work at the top of its loop (a
 * condition variable the writer signals now and then): idle, not a
 * bottleneck. So is a `manager` thread whose `handle_manager` loops
 * forever around a condition variable the writer signals rarely (as
 * MariaDB's manager thread does): its wait is one level deeper, in a loop
 * the thread never leaves. Prints "ready". */
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

volatile unsigned long sink;
static pthread_mutex_t shared = PTHREAD_MUTEX_INITIALIZER;
static int pipe_fd[2];

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void busy(double secs) {
    double end = now() + secs;
    while (now() < end) sink++;
}
__attribute__((noinline)) void update_shared(void) {
    pthread_mutex_lock(&shared);
    busy(0.0005);
    usleep(1500); /* holding the lock: the other worker waits, busy or not */
    pthread_mutex_unlock(&shared);
}
__attribute__((noinline)) void step(void) {
    update_shared();
    usleep(100);
}
__attribute__((noinline)) void *worker(void *arg) {
    for (;;) step();
    return arg;
}
__attribute__((noinline)) long read_records(void) {
    char rec[16];
    return read(pipe_fd[0], rec, sizeof rec);
}
__attribute__((noinline)) void *reader(void *arg) {
    for (;;) sink += read_records();
    return arg;
}
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_work = PTHREAD_COND_INITIALIZER;
static int pool_jobs;

__attribute__((noinline)) void *pool_worker(void *arg) {
    for (;;) {
        pthread_mutex_lock(&pool_lock);
        while (pool_jobs == 0) pthread_cond_wait(&pool_work, &pool_lock);
        pool_jobs--;
        pthread_mutex_unlock(&pool_lock);
        sink++;
    }
    return arg;
}

static pthread_mutex_t manager_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t manager_work = PTHREAD_COND_INITIALIZER;
static int manager_jobs;

__attribute__((noinline)) void handle_manager(void) {
    for (;;) {
        pthread_mutex_lock(&manager_lock);
        while (manager_jobs == 0) pthread_cond_wait(&manager_work, &manager_lock);
        manager_jobs--;
        pthread_mutex_unlock(&manager_lock);
        sink++;
    }
}
__attribute__((noinline)) void *manager(void *arg) {
    handle_manager();
    return arg;
}

__attribute__((noinline)) void *writer(void *arg) {
    char rec[16] = "record";
    for (int i = 0;; i++) {
        if (write(pipe_fd[1], rec, sizeof rec) < 0) break;
        if (i % 25 == 0) {
            pthread_mutex_lock(&pool_lock);
            pool_jobs++;
            pthread_cond_signal(&pool_work);
            pthread_mutex_unlock(&pool_lock);
        }
        if (i % 200 == 0) {
            pthread_mutex_lock(&manager_lock);
            manager_jobs++;
            pthread_cond_signal(&manager_work);
            pthread_mutex_unlock(&manager_lock);
        }
        usleep(2000);
    }
    return arg;
}

int main(void) {
    if (pipe(pipe_fd)) return 1;
    pthread_t t;
    pthread_create(&t, 0, worker, 0);
    pthread_create(&t, 0, worker, 0);
    pthread_create(&t, 0, reader, 0);
    pthread_create(&t, 0, writer, 0);
    pthread_create(&t, 0, pool_worker, 0);
    pthread_create(&t, 0, manager, 0);
    printf("ready\n");
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {}
    return 0;
}
