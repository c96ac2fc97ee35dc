/* A small threaded file server in front of a disk cache: the subject of
 * the kernel case study (examples/kernel_cache.rs, docs/kernel.md), after
 * KernInst's web proxy that spent 40% of its time opening cache files.
 *
 * usage: cache_server ROOT WORKERS [--keep-open]
 *
 * Listens on 127.0.0.1 (an ephemeral port, printed as "port N"); WORKERS
 * threads accept connections and serve lines "GET KEY" with the bytes of
 * the cached object KEY (a number): "SIZE\n" then SIZE bytes. An object
 * lives at ROOT/d0/d1/.../d7/KEY (eight directory levels, from the key's
 * hash, as caches fan out). cache_lookup() opens it, reads it whole and
 * closes it for every request; with --keep-open the server keeps the
 * descriptor of each object opened once (shared by the workers) and
 * reads again with pread(), and grows its descriptor table before the
 * workers start (growing it while threads share it can wait for an RCU
 * grace period inside openat: a version where every worker kept its own
 * descriptors showed openat at ~100 µs a call in weft's figures).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_KEYS 65536
#define MAX_OBJECT 65536

static const char *root;
static int keep_open;
static int listener;

struct worker {
    char buf[MAX_OBJECT];
};

/* --keep-open: KEY's descriptor + 1, 0 while not open. */
static int open_fds[MAX_KEYS];

/* ROOT/d0/.../d7/KEY, each level two hex digits of a hash of the key. */
__attribute__((noinline)) void cache_path(unsigned key, char *out, size_t n)
{
    unsigned h = key * 2654435761u;
    int len = snprintf(out, n, "%s", root);
    for (int level = 0; level < 8; level++) {
        len += snprintf(out + len, n - len, "/%02x", (h >> (level * 4)) & 0xff);
    }
    snprintf(out + len, n - len, "/%u", key);
}

/* The object's bytes into w->buf; its size, or -1. */
__attribute__((noinline)) long cache_lookup(struct worker *w, unsigned key)
{
    if (key >= MAX_KEYS)
        return -1;
    int kept = keep_open ? __atomic_load_n(&open_fds[key], __ATOMIC_ACQUIRE) : 0;
    if (kept)
        return pread(kept - 1, w->buf, sizeof w->buf, 0);
    char path[512];
    cache_path(key, path, sizeof path);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    long size = read(fd, w->buf, sizeof w->buf);
    int none = 0;
    /* Another worker may have opened it meanwhile: keep one. */
    if (!keep_open ||
        !__atomic_compare_exchange_n(&open_fds[key], &none, fd + 1, 0, __ATOMIC_RELEASE,
                                     __ATOMIC_RELAXED))
        close(fd);
    return size;
}

__attribute__((noinline)) int send_reply(int sock, const char *data, long size)
{
    char head[32];
    int n = snprintf(head, sizeof head, "%ld\n", size);
    if (send(sock, head, n, MSG_NOSIGNAL) != n)
        return -1;
    for (long off = 0; off < size;) {
        long m = send(sock, data + off, size - off, MSG_NOSIGNAL);
        if (m <= 0)
            return -1;
        off += m;
    }
    return 0;
}

__attribute__((noinline)) int handle_request(struct worker *w, int sock, const char *line)
{
    unsigned key;
    if (sscanf(line, "GET %u", &key) != 1)
        return -1;
    long size = cache_lookup(w, key);
    if (size < 0)
        size = 0;
    return send_reply(sock, w->buf, size);
}

static void serve(struct worker *w, int sock)
{
    char line[128];
    size_t have = 0;
    for (;;) {
        char *nl = memchr(line, '\n', have);
        if (!nl) {
            if (have == sizeof line)
                return;
            ssize_t m = recv(sock, line + have, sizeof line - have, 0);
            if (m <= 0)
                return;
            have += m;
            continue;
        }
        *nl = 0;
        if (handle_request(w, sock, line))
            return;
        size_t used = nl + 1 - line;
        memmove(line, nl + 1, have - used);
        have -= used;
    }
}

static void *work(void *arg)
{
    struct worker *w = calloc(1, sizeof *w);
    (void)arg;
    for (;;) {
        int sock = accept(listener, NULL, NULL);
        if (sock < 0)
            continue;
        /* A reply is two sends: without this, Nagle holds the second
         * until the client's delayed ACK, 40 ms a request. */
        int one = 1;
        setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        serve(w, sock);
        close(sock);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s ROOT WORKERS [--keep-open]\n", argv[0]);
        return 1;
    }
    root = argv[1];
    int workers = atoi(argv[2]);
    keep_open = argc > 3 && strcmp(argv[3], "--keep-open") == 0;
    listener = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (bind(listener, (struct sockaddr *)&a, sizeof a) || listen(listener, 64) ||
        getsockname(listener, (struct sockaddr *)&a, &len)) {
        perror("listen");
        return 1;
    }
    if (keep_open) {
        /* Room for every object's descriptor now, while single-threaded. */
        if (dup2(0, MAX_KEYS / 16) >= 0)
            close(MAX_KEYS / 16);
    }
    printf("port %d\n", ntohs(a.sin_port));
    fflush(stdout);
    pthread_t t;
    for (int i = 0; i < workers; i++) {
        char name[16];
        pthread_create(&t, NULL, work, NULL);
        snprintf(name, sizeof name, "worker-%d", i);
        pthread_setname_np(t, name);
    }
    pause();
    return 0;
}
