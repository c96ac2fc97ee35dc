/* zombie: forks a child that exits at once and is never reaped.
 *
 * Protocol: prints "zombie pid=<child pid>" (once the child has exited, still
 * unreaped), then "ready pid=<own pid>"; each "go" line on stdin prints "ok";
 * "quit" or EOF prints "done" and exits 0 (the zombie is then reaped by init).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

__attribute__((noinline, noipa)) long work_a(long *counter, long x)
{
    *counter += 1;
    return x * 3 + 1;
}

int main(void)
{
    pid_t c = fork();
    if (c < 0) {
        perror("fork");
        return 1;
    }
    if (c == 0)
        _exit(0);
    siginfo_t info;
    memset(&info, 0, sizeof info);
    if (waitid(P_PID, c, &info, WEXITED | WNOWAIT) != 0) {
        perror("waitid");
        return 1;
    }
    printf("zombie pid=%d\n", (int)c);
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    char line[256];
    long count = 0;
    while (fgets(line, sizeof line, stdin)) {
        if (!strncmp(line, "quit", 4))
            break;
        if (!strncmp(line, "go", 2)) {
            work_a(&count, 1);
            printf("ok\n");
            fflush(stdout);
        }
    }
    printf("done\n");
    fflush(stdout);
    return 0;
}
