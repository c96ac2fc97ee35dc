/* events: process events while weft is attached.
 *
 *   events       prints "ready pid=P threads=1", then reads lines:
 *     fork       calls work() 100 times, forks; the child calls work() 100
 *                times, prints "child R", exits 0; the parent waits for it,
 *                calls work() 100 more times, prints "parent R status S"
 *     exec       calls work() 100 times, then execs itself as
 *                "events after-exec R", which prints "after exec R" and
 *                exits 0
 *     calls N    calls work() N times, prints "calls R"
 *     quit       prints "done", exits 0
 * R is a checksum that depends only on how many times work() ran.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

__attribute__((noinline, noipa)) unsigned long work(unsigned long x)
{
    return x * 1103515245UL + 12345UL;
}

static unsigned long run(unsigned long acc, int n)
{
    for (int i = 0; i < n; i++)
        acc = work(acc);
    return acc;
}

int main(int argc, char **argv)
{
    if (argc > 2 && strcmp(argv[1], "after-exec") == 0) {
        printf("after exec %lu\n", strtoul(argv[2], NULL, 10));
        return 0;
    }
    printf("ready pid=%d threads=1\n", (int)getpid());
    fflush(stdout);
    char line[64];
    unsigned long acc = 1;
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        if (strcmp(line, "fork") == 0) {
            acc = run(acc, 100);
            fflush(stdout);
            pid_t child = fork();
            if (child < 0)
                return 70;
            if (child == 0) {
                printf("child %lu\n", run(acc, 100));
                fflush(stdout);
                _exit(0);
            }
            int status = 0;
            waitpid(child, &status, 0);
            acc = run(acc, 100);
            printf("parent %lu status %d\n", acc, status);
        } else if (strcmp(line, "exec") == 0) {
            acc = run(acc, 100);
            char r[32];
            snprintf(r, sizeof r, "%lu", acc);
            fflush(stdout);
            execl("/proc/self/exe", "events", "after-exec", r, (char *)NULL);
            return 71;
        } else if (strncmp(line, "calls ", 6) == 0) {
            acc = run(acc, atoi(line + 6));
            printf("calls %lu\n", acc);
        } else if (strcmp(line, "quit") == 0) {
            break;
        }
        fflush(stdout);
    }
    printf("done\n");
    return 0;
}
