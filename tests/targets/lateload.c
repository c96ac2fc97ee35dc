/* lateload: loads a library after start, and starts threads, on command.
 *
 * Prints "ready pid=P threads=1"; then per stdin line:
 *   "load PATH"   dlopen(PATH), dlsym "lib_work"; prints "loaded"
 *   "call N"      calls lib_work N times; prints "called N"
 *   "loadcall N PATH"  dlopen(PATH) and at once N calls of lib_work (no
 *                 line in between for a tool to act on); prints "called N"
 *   "thread"      starts a thread that waits for the next "join"; prints
 *                 "started TID"
 *   "join"        ends and joins it; prints "joined"
 *   "quit"        exit 0
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long (*lib_work)(long *, long);
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int stop, tid_ready;
static int thread_tid;

static void *waiter(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    thread_tid = gettid();
    tid_ready = 1;
    pthread_cond_broadcast(&cv);
    while (!stop)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    return NULL;
}

int main(void)
{
    char line[512];
    pthread_t t;
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready pid=%d threads=1\n", (int)getpid());
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        if (strncmp(line, "load ", 5) == 0) {
            void *h = dlopen(line + 5, RTLD_NOW);
            lib_work = h ? (long (*)(long *, long))dlsym(h, "lib_work") : NULL;
            printf(lib_work ? "loaded\n" : "FAIL %s\n", dlerror());
        } else if (strncmp(line, "loadcall ", 9) == 0) {
            char *path = strchr(line + 9, ' ');
            long n = atol(line + 9), counter = 0, x = 1;
            void *h = path ? dlopen(path + 1, RTLD_NOW) : NULL;
            lib_work = h ? (long (*)(long *, long))dlsym(h, "lib_work") : NULL;
            if (!lib_work) {
                printf("FAIL %s\n", dlerror());
                continue;
            }
            for (long i = 0; i < n; i++)
                x = lib_work(&counter, x);
            printf("called %ld\n", counter);
        } else if (strncmp(line, "call ", 5) == 0) {
            long n = atol(line + 5), counter = 0, x = 1;
            for (long i = 0; i < n; i++)
                x = lib_work(&counter, x);
            printf("called %ld\n", counter);
        } else if (strcmp(line, "thread") == 0) {
            stop = tid_ready = 0;
            pthread_create(&t, NULL, waiter, NULL);
            pthread_mutex_lock(&mu);
            while (!tid_ready)
                pthread_cond_wait(&cv, &mu);
            pthread_mutex_unlock(&mu);
            printf("started %d\n", thread_tid);
        } else if (strcmp(line, "join") == 0) {
            pthread_mutex_lock(&mu);
            stop = 1;
            pthread_cond_broadcast(&cv);
            pthread_mutex_unlock(&mu);
            pthread_join(t, NULL);
            printf("joined\n");
        } else if (strcmp(line, "quit") == 0) {
            return 0;
        }
    }
    return 2;
}
