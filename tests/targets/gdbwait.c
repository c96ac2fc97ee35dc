/* gdbwait: a thread blocked inside two instrumented frames, for a debugger.
 *
 *   prints "ready pid=P threads=1", waits for a line "go" on stdin, then
 *   main -> outer() -> inner(), which prints "inside" and blocks reading
 *   stdin until the line "end"; then prints "done" and exits 0.
 * outer and inner are noinline/noipa and not tail calls, so a debugger's
 * backtrace from the read shows inner, outer, main.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int wait_for(const char *word)
{
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        if (strcmp(line, word) == 0)
            return 1;
    }
    return 0;
}

__attribute__((noinline, noipa)) int inner(int x)
{
    printf("inside\n");
    fflush(stdout);
    int ok = wait_for("end");
    return x + ok;
}

__attribute__((noinline, noipa)) int outer(int x)
{
    int r = inner(x + 1);
    return r * 2;
}

int main(void)
{
    printf("ready pid=%d threads=1\n", (int)getpid());
    fflush(stdout);
    if (!wait_for("go"))
        return 2;
    int r = outer(20);
    printf("done %d\n", r);
    return r == 44 ? 0 : 1;
}
