/* server: the target the examples instrument. Worker threads serve
 * "requests" after a "go" line on stdin:
 *
 *   server WORKERS REQUESTS
 *
 * Each request: handle(id) (a little work, more for some ids), a buffer
 * from malloc (checked: a NULL is reported, not fatal), and checksum() of a
 * message, whose result is printed at the end per worker. checksum() has a
 * bug: it skips the message's last byte (the hot-patch example fixes it).
 * Output (write(2), no stdio in the workers, so no hidden malloc):
 *   "ready pid=P threads=T"        at start (T = WORKERS + 1)
 *   "worker W: malloc #K failed"   for a NULL from malloc (K counts from go)
 *   "worker W: sum S"              the sum of checksum() over its requests
 *   "done"                         once every worker has finished
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long requests;

__attribute__((noinline, noipa)) long handle(long id)
{
    long x = id, spins = (id % 8 == 0) ? 4000 : 200;
    for (long i = 0; i < spins; i++)
        x = x * 6364136223846793005L + 1442695040888963407L;
    return x;
}

/* Buggy on purpose: the loop stops one byte early. */
__attribute__((noinline, noipa)) unsigned checksum(const char *s, unsigned len)
{
    unsigned sum = 0;
    for (unsigned i = 0; i + 1 < len; i++)
        sum = sum * 31 + (unsigned char)s[i];
    return sum;
}

static void say(const char *text)
{
    ssize_t n = write(1, text, strlen(text));
    (void)n;
}

static void *worker(void *arg)
{
    long w = (long)arg;
    unsigned long sum = 0;
    char line[96];
    for (long r = 0; r < requests; r++) {
        handle(w * 100000 + r);
        char *buf = malloc(64);
        if (!buf) {
            snprintf(line, sizeof line, "worker %ld: malloc #%ld failed\n", w, r + 1);
            say(line);
            continue;
        }
        int len = snprintf(buf, 64, "request %ld of worker %ld", r, w);
        sum += checksum(buf, (unsigned)len);
        free(buf);
    }
    snprintf(line, sizeof line, "worker %ld: sum %lu\n", w, sum);
    say(line);
    return NULL;
}

int main(int argc, char **argv)
{
    int workers = argc > 1 ? atoi(argv[1]) : 4;
    requests = argc > 2 ? atol(argv[2]) : 10000;
    char line[64];
    printf("ready pid=%d threads=%d\n", (int)getpid(), workers + 1);
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 2;
    pthread_t t[64];
    for (long i = 0; i < workers && i < 64; i++)
        pthread_create(&t[i], NULL, worker, (void *)i);
    for (long i = 0; i < workers && i < 64; i++)
        pthread_join(t[i], NULL);
    say("done\n");
    /* Wait for the tool to detach before exiting. */
    while (fgets(line, sizeof line, stdin))
        ;
    return 0;
}
