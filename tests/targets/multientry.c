/* multientry: threads copying memory through glibc's memcpy and mempcpy,
 * whose implementations share code (mempcpy jumps three bytes into
 * memcpy's), plus other libc work (strlen, snprintf, qsort, malloc).
 *
 * Usage: multientry [--pure] THREADS MEMCPYS MEMPCPYS [ROUNDS]
 * Prints "ready pid=P threads=T", then for each line "go" on stdin runs one
 * round: every worker makes exactly MEMCPYS memcpy and MEMPCPYS mempcpy
 * calls (and the other work), checks every result, and prints
 * "thread TID memcpy MEMCPYS mempcpy MEMPCPYS sum S bad B" (S depends only
 * on the arguments and the worker's index, B counts wrong results); then
 * "round R done". "quit" (or end of input) exits 0. With ROUNDS given, it
 * runs that many rounds at once without reading stdin and exits. Each
 * worker also calls short_shared MEMCPYS times and short_sibling MEMPCPYS
 * times: a pair in the same shape whose sibling is only 5 bytes long, so
 * that its own entry patch displaces its jump into short_shared. With
 * --pure the workers make no other libc call than their copies (glibc's
 * own functions call memcpy too), so that a count can be exact.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* short_sibling(x) = short_shared(x) = x + 7; the sibling jumps 3 bytes
 * into short_shared, inside the bytes short_shared's patch displaces. */
asm(".text\n"
    ".p2align 4\n"
    ".globl short_sibling\n"
    ".type short_sibling, @function\n"
    "short_sibling:\n"
    "  movq %rdi, %rax\n"
    "  jmp 1f\n"
    ".size short_sibling, .-short_sibling\n"
    ".p2align 4\n"
    ".globl short_shared\n"
    ".type short_shared, @function\n"
    "short_shared:\n"
    "  movq %rdi, %rax\n"
    "1:\n"
    "  addq $7, %rax\n"
    "  ret\n"
    ".size short_shared, .-short_shared\n");
long short_sibling(long x);
long short_shared(long x);

/* Through volatile pointers: the compiler can neither inline the copies
 * nor turn one function into the other. */
static void *(*volatile copy)(void *, const void *, size_t) = memcpy;
static void *(*volatile pcopy)(void *, const void *, size_t) = mempcpy;
static size_t (*volatile length)(const char *) = strlen;

static long memcpys, mempcpys;
static int pure;

struct worker {
    pthread_t thread;
    int index;
    long tid;
    unsigned long sum;
    long bad;
};

static int compare(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static void *work(void *arg)
{
    struct worker *w = arg;
    w->tid = syscall(SYS_gettid);
    w->sum = 0;
    w->bad = 0;
    char src[256], dst[256];
    for (int i = 0; i < 256; i++)
        src[i] = (char)(i * 7 + w->index);
    for (long i = 0; i < memcpys; i++) {
        size_t n = 1 + (size_t)(i % 200);
        void *r = copy(dst, src + (i % 50), n);
        if (r != dst || memcmp(dst, src + (i % 50), n) != 0)
            w->bad++;
        w->sum += (unsigned char)dst[n - 1];
    }
    for (long i = 0; i < mempcpys; i++) {
        size_t n = 1 + (size_t)(i % 150);
        void *r = pcopy(dst, src + (i % 60), n);
        if (r != dst + n || memcmp(dst, src + (i % 60), n) != 0)
            w->bad++;
        w->sum += 3 * (unsigned char)dst[n - 1];
    }
    for (long i = 0; i < memcpys; i++)
        if (short_shared(i) != i + 7)
            w->bad++;
    for (long i = 0; i < mempcpys; i++)
        if (short_sibling(i) != i + 7)
            w->bad++;
    if (pure)
        return NULL;
    /* Other work through libc, checked by its sum. */
    char text[64];
    int *numbers = malloc(64 * sizeof(int));
    for (int i = 0; i < 64; i++)
        numbers[i] = (i * 37 + w->index) % 101;
    qsort(numbers, 64, sizeof(int), compare);
    for (int i = 1; i < 64; i++)
        if (numbers[i - 1] > numbers[i])
            w->bad++;
    int written = snprintf(text, sizeof text, "worker %d sum %lu", w->index, w->sum);
    if ((size_t)written != length(text))
        w->bad++;
    w->sum += (unsigned long)numbers[63] + length(text);
    free(numbers);
    return NULL;
}

static void round_of(struct worker *workers, int n, int round)
{
    for (int i = 0; i < n; i++) {
        workers[i].index = i;
        if (pthread_create(&workers[i].thread, NULL, work, &workers[i]) != 0) {
            perror("pthread_create");
            exit(2);
        }
    }
    for (int i = 0; i < n; i++)
        pthread_join(workers[i].thread, NULL);
    for (int i = 0; i < n; i++)
        printf("thread %ld memcpy %ld mempcpy %ld sum %lu bad %ld\n", workers[i].tid, memcpys,
               mempcpys, workers[i].sum, workers[i].bad);
    printf("round %d done\n", round);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--pure") == 0) {
        pure = 1;
        argv++;
        argc--;
    }
    if (argc < 4) {
        fprintf(stderr, "usage: multientry [--pure] THREADS MEMCPYS MEMPCPYS [ROUNDS]\n");
        return 2;
    }
    int n = atoi(argv[1]);
    memcpys = atol(argv[2]);
    mempcpys = atol(argv[3]);
    struct worker *workers = calloc((size_t)n, sizeof *workers);
    if (argc > 4) {
        int rounds = atoi(argv[4]);
        for (int r = 1; r <= rounds; r++)
            round_of(workers, n, r);
        return 0;
    }
    printf("ready pid=%d threads=%d\n", (int)getpid(), n);
    fflush(stdout);
    char line[64];
    int round = 0;
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "go", 2) == 0)
            round_of(workers, n, ++round);
        else if (strncmp(line, "quit", 4) == 0)
            break;
    }
    return 0;
}
