// A process that has mapped all the memory within 2 GiB of one of its
// libraries (libcrowded.so), as a program with a large arena or many
// mappings around a library can: no trampoline for that library's
// functions can be placed where a `jmp rel32` from them reaches.
//
// crowded: fills the neighbourhood, prints `ready pid=PID filled=BYTES`;
// then on each `go` line on stdin calls main_work() and lib_work() 1,000
// times each, printing `calls main_work=N lib_work=N sum=S`; exits at EOF.
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

long lib_work(long x);

__attribute__((noinline)) long main_work(long x) { return x * 5 + 1; }

// The address range of the mapping of libcrowded.so.
static int library_range(uint64_t *lo, uint64_t *hi) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    *lo = UINT64_MAX;
    *hi = 0;
    while (f && fgets(line, sizeof line, f)) {
        unsigned long a, b;
        if (strstr(line, "libcrowded.so") && sscanf(line, "%lx-%lx", &a, &b) == 2) {
            if (a < *lo) *lo = a;
            if (b > *hi) *hi = b;
        }
    }
    if (f) fclose(f);
    return *hi != 0;
}

// Maps PROT_NONE pages over every free page in [lo, hi), in pieces that
// halve where something is already mapped.
static uint64_t fill(uint64_t lo, uint64_t hi) {
    uint64_t filled = 0;
    for (uint64_t at = lo; at < hi;) {
        uint64_t len = hi - at;
        if (len > (64ull << 20)) len = 64ull << 20;
        for (;;) {
            void *p = mmap((void *)at, len, PROT_NONE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
            if (p == (void *)at) {
                filled += len;
                break;
            }
            if (p != MAP_FAILED) munmap(p, len);
            if (len == 4096) break; // this page is taken: step over it
            len /= 2;
            len &= ~4095ull;
        }
        at += len;
    }
    return filled;
}

int main(void) {
    uint64_t lo, hi;
    if (!library_range(&lo, &hi)) {
        fprintf(stderr, "libcrowded.so is not mapped\n");
        return 1;
    }
    const uint64_t reach = 2ull << 30;
    uint64_t filled = fill(lo > reach ? lo - reach : 4096, hi + reach);
    printf("ready pid=%d filled=%llu\n", getpid(), (unsigned long long)filled);
    fflush(stdout);
    char line[64];
    long calls = 0, sum = 0;
    while (fgets(line, sizeof line, stdin)) {
        for (int i = 0; i < 1000; i++) sum += main_work(i) + lib_work(i);
        calls += 1000;
        printf("calls main_work=%ld lib_work=%ld sum=%ld\n", calls, calls, sum);
        fflush(stdout);
    }
    return 0;
}
