/* sessions: a thread left blocked inside a function across weft sessions.
 *
 * Prints "ready pid=P threads=2" (main and the blocker thread), then reads
 * commands from stdin, one per line, answering each:
 *   block      the blocker thread calls blocked(), which prints "in blocked"
 *              and waits until "release"
 *   release    blocked() returns, then that thread calls g() 3 times;
 *              prints "released R"
 *   g N        main calls g() N times; prints "g N"
 *   quit       joins the blocker, prints "done", exits 0
 * blocked and g are noinline/noipa.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int state; /* 0 idle, 1 block requested, 2 released */

__attribute__((noinline, noipa)) long blocked(long x)
{
    printf("in blocked\n");
    fflush(stdout);
    pthread_mutex_lock(&mu);
    while (state != 2)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    return x + 1;
}

__attribute__((noinline, noipa)) long g(long x)
{
    return x * 3 + 1;
}

static void *blocker(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    while (state == 0)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    long r = blocked(41);
    for (int i = 0; i < 3; i++)
        r = g(r);
    printf("released %ld\n", r);
    fflush(stdout);
    return NULL;
}

int main(void)
{
    pthread_t t;
    if (pthread_create(&t, NULL, blocker, NULL) != 0)
        return 65;
    printf("ready pid=%d threads=2\n", (int)getpid());
    fflush(stdout);
    char line[64];
    long acc = 0;
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        if (strcmp(line, "block") == 0 || strcmp(line, "release") == 0) {
            pthread_mutex_lock(&mu);
            state = line[0] == 'b' ? 1 : 2;
            pthread_cond_broadcast(&cv);
            pthread_mutex_unlock(&mu);
        } else if (strncmp(line, "g ", 2) == 0) {
            long n = atol(line + 2);
            for (long i = 0; i < n; i++)
                acc = g(acc);
            printf("g %ld\n", n);
            fflush(stdout);
        } else if (strcmp(line, "quit") == 0) {
            break;
        }
    }
    pthread_join(t, NULL);
    printf("done %ld\n", acc);
    return 0;
}
