/* probed: functions with integer, pointer and floating-point arguments and
 * results, called in rounds on command, for user probes.
 *
 * Prints "ready pid=P threads=1"; then for each line on stdin:
 *   "run N"  for i = 1..N:
 *              a = add3(i, 2i, 3i)          (= 6i)
 *              s = scale(i + 0.5, &factor)  (= 2i + 1; factor is 2.0)
 *              p = pick(i, "odd", "even")
 *              note(i)                      (prints "note i")
 *            prints "call i add3=a scale=s pick=p", then "round N done"
 *   "quit"   exit 0
 * stdout is line-buffered: a probe writing to fd 1 during a call shows
 * before that call's line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((noinline, noipa)) long add3(long a, long b, long c) { return a + b + c; }

__attribute__((noinline, noipa)) double scale(double x, const double *k) { return x * *k; }

__attribute__((noinline, noipa)) const char *pick(int i, const char *odd, const char *even)
{
    return i & 1 ? odd : even;
}

__attribute__((noinline, noipa)) void note(int i) { printf("note %d\n", i); }

/* Global, so that a tool can find and change it. */
const double factor = 2.0;

int main(void)
{
    char line[64];
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready pid=%d threads=1\n", (int)getpid());
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "run ", 4) == 0) {
            int n = atoi(line + 4);
            for (int i = 1; i <= n; i++) {
                long a = add3(i, 2L * i, 3L * i);
                double s = scale(i + 0.5, &factor);
                const char *p = pick(i, "odd", "even");
                note(i);
                printf("call %d add3=%ld scale=%.2f pick=%s\n", i, a, s, p);
            }
            printf("round %d done\n", n);
        } else if (strncmp(line, "quit", 4) == 0) {
            return 0;
        }
    }
    return 2;
}
