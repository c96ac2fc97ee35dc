/* Target of tests/code/debug_files.rs: a program that is stripped and given its
 * symbols back through a separate debug file.
 *
 *   debugfiles run N   two threads each call dbg_work_a N times,
 *                      dbg_work_b 2N times and (through libdbgwork.so)
 *                      dbg_lib_hidden N times; then it exits.
 *   debugfiles wait    prints "ready pid=PID" and waits for stdin to close.
 *
 * Each function under test is defined on one line, so that the line of its
 * first instruction is the line of its name. The fillers only make the
 * debug sections large enough for objcopy to compress them. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int dbg_lib_entry(int x);

static volatile int sink;
static long calls_each;

__attribute__((noinline, noclone)) int dbg_work_a(int x) { sink += x; return x + 1; }
__attribute__((noinline, noclone)) static int dbg_work_b(int x) { sink ^= x; return x * 2; }
/* libdbgwork.so has a private function of the same name. */
__attribute__((noinline, noclone)) int dbg_twin(int x) { sink -= x; return x; }

#define FILL(n) __attribute__((noinline)) int dbg_filler_##n(int x) { sink += x * n; return sink % (n + 3); }
FILL(1) FILL(2) FILL(3) FILL(4) FILL(5) FILL(6) FILL(7) FILL(8) FILL(9) FILL(10)
FILL(11) FILL(12) FILL(13) FILL(14) FILL(15) FILL(16) FILL(17) FILL(18) FILL(19) FILL(20)
FILL(21) FILL(22) FILL(23) FILL(24) FILL(25) FILL(26) FILL(27) FILL(28) FILL(29) FILL(30)

static void *worker(void *arg) {
    (void)arg;
    for (long i = 0; i < calls_each; i++) {
        dbg_work_a((int)i);
        dbg_work_b((int)i);
        dbg_work_b((int)i + 1);
        dbg_lib_entry((int)i);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "run") == 0) {
        calls_each = atol(argv[2]);
        pthread_t t[2];
        for (int i = 0; i < 2; i++)
            pthread_create(&t[i], NULL, worker, NULL);
        for (int i = 0; i < 2; i++)
            pthread_join(t[i], NULL);
        printf("done\n");
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "wait") == 0) {
        printf("ready pid=%d\n", (int)getpid());
        fflush(stdout);
        char buf[64];
        while (read(0, buf, sizeof buf) > 0) {
        }
        return 0;
    }
    fprintf(stderr, "usage: debugfiles run N | wait\n");
    return 2;
}
