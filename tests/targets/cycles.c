/* cycles: threads call hot() in a tight loop until told to stop.
 *
 *   cycles [WORKERS]     (default 2, at most 256)
 *
 * Prints "ready pid=P threads=T", then runs until a line "stop" on stdin;
 * then prints one line per worker:
 *   {"worker":i,"calls":N,"acc":A,"ok":true}
 * where N is how many times the worker called hot(), A its running value,
 * and ok says A equals the value the same N steps give without calling
 * hot() (the function's results were never changed); then "done", exit 0.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static atomic_int stop;

__attribute__((noinline, noipa)) unsigned long hot(unsigned long x)
{
    return x * 6364136223846793005UL + 1442695040888963407UL;
}

static unsigned long step(unsigned long x)
{
    return x * 6364136223846793005UL + 1442695040888963407UL;
}

struct worker {
    pthread_t th;
    int index;
    unsigned long calls, acc;
};

static void *run(void *arg)
{
    struct worker *w = arg;
    unsigned long acc = (unsigned long)w->index + 1, calls = 0;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        for (int i = 0; i < 256; i++)
            acc = hot(acc);
        calls += 256;
    }
    w->calls = calls;
    w->acc = acc;
    return NULL;
}

int main(int argc, char **argv)
{
    static struct worker w[256];
    int n = argc > 1 ? atoi(argv[1]) : 2;
    if (n < 1 || n > 256)
        return 64;
    for (int i = 0; i < n; i++) {
        w[i].index = i;
        if (pthread_create(&w[i].th, NULL, run, &w[i]) != 0)
            return 65;
    }
    printf("ready pid=%d threads=%d\n", (int)getpid(), n + 1);
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin))
        if (strncmp(line, "stop", 4) == 0)
            break;
    atomic_store(&stop, 1);
    for (int i = 0; i < n; i++) {
        pthread_join(w[i].th, NULL);
        unsigned long ref = (unsigned long)i + 1;
        for (unsigned long k = 0; k < w[i].calls; k++)
            ref = step(ref);
        printf("{\"worker\":%d,\"calls\":%lu,\"acc\":%lu,\"ok\":%s}\n", i, w[i].calls, w[i].acc,
               ref == w[i].acc ? "true" : "false");
    }
    printf("done\n");
    return 0;
}
