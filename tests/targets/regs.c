/* regs: does an instrumented function see its caller's registers, flags
 * and stack exactly as the caller left them (issue #12)?
 *
 * Build: gcc -O2 -pthread regs.c regs_asm.S
 * Usage: regs THREADS CALLS [now]
 *   Without "now": prints "ready pid=P threads=T" and waits for the line
 *   "go" on stdin before the threads start.
 * Each of THREADS threads calls call_checked() CALLS times with fresh
 * values (see regs_asm.S); checked() is the function the tests instrument.
 * Output: per thread
 *   {"thread":i,"calls":N,"inside":M,"after":K,"mask":"0x..."}
 * then "verdict ok" (every count exact, no mismatch) or "verdict BAD";
 * exit 0 or 1.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void call_checked(uint64_t *block);

enum { B_RSP = 15, B_FLAGS, B_RET, B_CALLS, B_MIS, B_POST, B_FRAME, B_MASK = 30, B_WORDS };

/* The flags a caller may leave for its callee: any arithmetic flag, DF
 * clear. */
#define FLAGS_MASK 0xcd5ULL
#define ARITH 0x8d5ULL

struct worker {
    int index;
    long calls;
    uint64_t block[B_WORDS];
};

static uint64_t mix(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x9e3779b97f4a7c15ULL;
    x ^= x >> 29;
    return x;
}

static void *run(void *arg)
{
    struct worker *w = arg;
    uint64_t *b = w->block;
    for (long n = 0; n < w->calls; n++) {
        uint64_t seed = ((uint64_t)w->index << 40) ^ (uint64_t)n;
        for (int i = 0; i < 15; i++)
            b[i] = mix(seed * 16 + (uint64_t)i + 1);
        b[B_FLAGS] = mix(seed) & ARITH;
        b[B_RET] = mix(~seed);
        b[B_FRAME] = (uint64_t)(uintptr_t)b;
        for (int j = 1; j < 8; j++)
            b[B_FRAME + j] = mix(seed * 8 + (uint64_t)j) | 1;
        b[B_FRAME + 8] = (uint64_t)(uintptr_t)b;
        call_checked(b);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: regs THREADS CALLS [now]\n");
        return 2;
    }
    int threads = atoi(argv[1]);
    long calls = atol(argv[2]);
    if (threads < 1 || threads > 64 || calls < 1)
        return 2;
    if (argc < 4 || strcmp(argv[3], "now") != 0) {
        printf("ready pid=%d threads=1\n", (int)getpid());
        fflush(stdout);
        char line[64];
        while (fgets(line, sizeof line, stdin) && strcmp(line, "go\n") != 0)
            ;
    }
    static struct worker w[64];
    pthread_t t[64];
    for (int i = 0; i < threads; i++) {
        w[i].index = i;
        w[i].calls = calls;
        pthread_create(&t[i], NULL, run, &w[i]);
    }
    int ok = 1;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        uint64_t *b = w[i].block;
        printf("{\"thread\":%d,\"calls\":%llu,\"inside\":%llu,\"after\":%llu,\"mask\":\"%#llx\"}\n", i,
               (unsigned long long)b[B_CALLS], (unsigned long long)b[B_MIS],
               (unsigned long long)b[B_POST], (unsigned long long)b[B_MASK]);
        ok &= b[B_CALLS] == (uint64_t)calls && b[B_MIS] == 0 && b[B_POST] == 0;
    }
    printf("verdict %s\n", ok ? "ok" : "BAD");
    return ok ? 0 : 1;
}
