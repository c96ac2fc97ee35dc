// Threads as programs make them: `pthread_create(&t, NULL, ...)`, default
// attributes (8 MiB stacks each), as many as asked for.
//
// many_threads N CALLS: starts N threads, which block until told to go;
// prints `ready N`. Then each line on stdin is a command:
//   go    every thread calls leaf() (t % 5 + 1) * CALLS times, folding the
//         results into its checksum; then the main thread prints
//         `thread T tid=TID calls=C` for each and `round done`
//   check prints `code intact` if leaf's first 16 bytes are what they were
//         at start, else `code changed`
//   exit  prints `sum=S` (the threads' checksums xor-ed) and exits 0
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

__attribute__((noinline)) uint64_t leaf(uint64_t x) {
    return x * 6364136223846793005ull + 1442695040888963407ull;
}

struct worker {
    pthread_t thread;
    long index;
    long tid;
    long calls;
    uint64_t sum;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static pthread_cond_t done = PTHREAD_COND_INITIALIZER;
static long round_no, finished, calls_per_unit;
static int quitting;

static void *run(void *arg) {
    struct worker *w = arg;
    w->tid = syscall(SYS_gettid);
    w->sum = (uint64_t)w->index;
    long seen = 0;
    for (;;) {
        pthread_mutex_lock(&lock);
        while (round_no == seen && !quitting)
            pthread_cond_wait(&wake, &lock);
        if (quitting) {
            pthread_mutex_unlock(&lock);
            return NULL;
        }
        seen = round_no;
        pthread_mutex_unlock(&lock);
        long n = (w->index % 5 + 1) * calls_per_unit;
        for (long i = 0; i < n; i++)
            w->sum = leaf(w->sum);
        w->calls += n;
        pthread_mutex_lock(&lock);
        finished++;
        pthread_cond_signal(&done);
        pthread_mutex_unlock(&lock);
    }
}

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    long n = atol(argv[1]);
    calls_per_unit = atol(argv[2]);
    unsigned char code[16];
    memcpy(code, (const void *)leaf, sizeof code);
    struct worker *ws = calloc(n, sizeof *ws);
    for (long t = 0; t < n; t++) {
        ws[t].index = t;
        if (pthread_create(&ws[t].thread, NULL, run, &ws[t])) {
            perror("pthread_create");
            return 1;
        }
    }
    printf("ready %ld\n", n);
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (!strncmp(line, "go", 2)) {
            pthread_mutex_lock(&lock);
            finished = 0;
            round_no++;
            pthread_cond_broadcast(&wake);
            while (finished < n)
                pthread_cond_wait(&done, &lock);
            pthread_mutex_unlock(&lock);
            for (long t = 0; t < n; t++)
                printf("thread %ld tid=%ld calls=%ld\n", t, ws[t].tid, ws[t].calls);
            printf("round done\n");
        } else if (!strncmp(line, "check", 5)) {
            int same = !memcmp(code, (const void *)leaf, sizeof code);
            printf("code %s\n", same ? "intact" : "changed");
        } else if (!strncmp(line, "exit", 4)) {
            pthread_mutex_lock(&lock);
            quitting = 1;
            pthread_cond_broadcast(&wake);
            pthread_mutex_unlock(&lock);
            uint64_t sum = 0;
            for (long t = 0; t < n; t++) {
                pthread_join(ws[t].thread, NULL);
                sum ^= ws[t].sum;
            }
            printf("sum=%llu\n", (unsigned long long)sum);
            return 0;
        }
        fflush(stdout);
    }
    return 3;
}
