/* opencalls: threads inside calls that stay open while a report is read.
 *
 * Usage: opencalls SPIN_MS
 *
 * Protocol (stdout, flushed): "ready" once both threads wait; after "go"
 * on stdin:
 *   thread "lone" calls lone(), which blocks in read() on a pipe (it calls
 *     nothing instrumented);
 *   thread "nest" calls outer(), which spins SPIN_MS of CLOCK_MONOTONIC and
 *     then calls inner(), which blocks in read() on another pipe;
 *   once both are blocked (as far as a thread can say: right before its
 *   read()), one line {"outer_spin_ns":S} (outer's own time before it
 *   called inner, by CLOCK_MONOTONIC).
 * "quit" (or EOF) on stdin: a byte on each pipe ends the calls, the threads
 * are joined, "done", exit 0.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int lone_pipe[2], inner_pipe[2];
static long spin_ms, outer_spin_ns;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int go, blocked;

static long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void wait_for_go(void)
{
    pthread_mutex_lock(&mu);
    while (!go)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

static void about_to_block(void)
{
    pthread_mutex_lock(&mu);
    blocked++;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

__attribute__((noinline, noipa)) long lone(void)
{
    char c;
    about_to_block();
    return read(lone_pipe[0], &c, 1);
}

__attribute__((noinline, noipa)) long inner(void)
{
    char c;
    about_to_block();
    return read(inner_pipe[0], &c, 1);
}

__attribute__((noinline, noipa)) long outer(void)
{
    long start = now_ns(), spins = 0;
    while (now_ns() - start < spin_ms * 1000000L)
        spins++;
    outer_spin_ns = now_ns() - start;
    return inner() + (spins & 1);
}

static void *run_lone(void *arg)
{
    (void)arg;
    wait_for_go();
    lone();
    return NULL;
}

static void *run_nest(void *arg)
{
    (void)arg;
    wait_for_go();
    outer();
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2 || (spin_ms = atol(argv[1])) <= 0)
        return 64;
    if (pipe(lone_pipe) || pipe(inner_pipe))
        return 1;
    pthread_t a, b;
    if (pthread_create(&a, NULL, run_lone, NULL) || pthread_create(&b, NULL, run_nest, NULL))
        return 1;
    pthread_setname_np(a, "lone");
    pthread_setname_np(b, "nest");
    printf("ready\n");
    fflush(stdout);
    char line[64];
    int quit = 0;
    while (fgets(line, sizeof line, stdin)) {
        if (strcmp(line, "go\n") == 0) {
            pthread_mutex_lock(&mu);
            go = 1;
            pthread_cond_broadcast(&cv);
            while (blocked < 2)
                pthread_cond_wait(&cv, &mu);
            pthread_mutex_unlock(&mu);
            printf("{\"outer_spin_ns\":%ld}\n", outer_spin_ns);
            fflush(stdout);
        } else if (strcmp(line, "quit\n") == 0) {
            quit = 1;
            break;
        }
    }
    (void)quit;
    if (!go) {
        pthread_mutex_lock(&mu);
        go = 1;
        pthread_cond_broadcast(&cv);
        pthread_mutex_unlock(&mu);
    }
    if (write(lone_pipe[1], "x", 1) != 1 || write(inner_pipe[1], "x", 1) != 1)
        return 1;
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    printf("done\n");
    fflush(stdout);
    return 0;
}
