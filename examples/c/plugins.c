/* plugins: the target of the call-graph example. Worker threads serve
 * requests through code reached by pointers, as plugin-based servers do:
 *
 *   plugins WORKERS REQUESTS
 *
 * Each worker w serves REQUESTS requests r: serve() validates r (a direct
 * call), then calls handlers[kind] (an indirect call; kind = (r * (w + 1))
 * % 3: on_get, on_put, on_del), and each handler encodes through the
 * worker's codec object, a virtual call (codec->vt->encode: plain_encode
 * for even workers, zip_encode for odd ones).
 * Output (write(2) only in the workers):
 *   "ready pid=P threads=T"   at start (T = WORKERS + 1)
 *   "worker W tid=TID: validate=V get=G put=P del=D encode=E codec=NAME"
 *                              the worker's own counts, at its end
 *   "done"                     once every worker has finished
 * then it waits for stdin to close before exiting.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static long requests;

struct codec;
struct codec_vt {
    const char *name;
    unsigned long (*encode)(const struct codec *, long);
};
struct codec {
    const struct codec_vt *vt;
    unsigned long key;
};

__attribute__((noinline)) unsigned long plain_encode(const struct codec *c, long v)
{
    return (unsigned long)v ^ c->key;
}

__attribute__((noinline)) unsigned long zip_encode(const struct codec *c, long v)
{
    unsigned long x = (unsigned long)v;
    for (int i = 0; i < 8; i++)
        x = (x << 7 | x >> 57) ^ c->key;
    return x;
}

static const struct codec_vt plain_vt = {"plain", plain_encode};
static const struct codec_vt zip_vt = {"zip", zip_encode};

struct counts {
    long validate, get, put, del, encode;
};

__attribute__((noinline)) int validate(long r, struct counts *n)
{
    n->validate++;
    return r >= 0;
}

/* The handlers: each encodes through the codec, a virtual call whose
 * result is used. */
__attribute__((noinline)) unsigned long on_get(const struct codec *c, long r, struct counts *n)
{
    n->get++;
    n->encode++;
    return c->vt->encode(c, r) + 1;
}

__attribute__((noinline)) unsigned long on_put(const struct codec *c, long r, struct counts *n)
{
    n->put++;
    n->encode++;
    return c->vt->encode(c, 2 * r) + 2;
}

__attribute__((noinline)) unsigned long on_del(const struct codec *c, long r, struct counts *n)
{
    n->del++;
    n->encode++;
    return c->vt->encode(c, -r) + 3;
}

typedef unsigned long (*handler)(const struct codec *, long, struct counts *);
static handler handlers[3] = {on_get, on_put, on_del};

__attribute__((noinline)) unsigned long serve(const struct codec *c, long w, long r,
                                              struct counts *n)
{
    if (!validate(r, n))
        return 0;
    return handlers[(r * (w + 1)) % 3](c, r, n) * 3;
}

static void say(const char *text)
{
    ssize_t n = write(1, text, strlen(text));
    (void)n;
}

static void *worker(void *arg)
{
    long w = (long)arg;
    struct codec codec = {w % 2 ? &zip_vt : &plain_vt, 0x5bd1e995u + (unsigned long)w};
    struct counts n = {0};
    unsigned long sum = 0;
    for (long r = 0; r < requests; r++)
        sum += serve(&codec, w, r, &n);
    char line[160];
    snprintf(line, sizeof line,
             "worker %ld tid=%ld: validate=%ld get=%ld put=%ld del=%ld encode=%ld codec=%s "
             "sum=%lu\n",
             w, (long)syscall(SYS_gettid), n.validate, n.get, n.put, n.del, n.encode,
             codec.vt->name, sum);
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
    while (fgets(line, sizeof line, stdin))
        ;
    return 0;
}
