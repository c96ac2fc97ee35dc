/*
 * A master that forks workers running the same program, as servers do
 * (nginx, Apache, PostgreSQL): the workers call `handle`, the master
 * never does.
 *
 * Usage: forker [WORKERS]   (default 2)
 * Prints "ready pid=P workers=W1,W2,..." once the workers wait, then reads
 * stdin: "spawn" forks one more worker (prints "spawned PID"); "spawn N"
 * one that calls handle() N times at once, before it waits; "go" makes
 * each worker call handle() 2,000 times, print "worker PID calls=C" (C:
 * 2,000 and what it called at once) and exit; the master prints "done"
 * when all have exited, and exits at "quit" or end of input.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile unsigned long sink;

__attribute__((noinline)) void handle(int i) { sink += (unsigned long)i * 7; }

static int go[2];
static pid_t workers[64];

/* Forks worker `w`, which calls handle() `early` times, then waits for its
 * byte on the pipe. */
static pid_t spawn(int w, int early) {
    pid_t pid = fork();
    if (pid == 0) {
        char c;
        close(go[1]);
        for (int i = 0; i < early; i++)
            handle(i);
        if (read(go[0], &c, 1) != 1)
            _exit(2);
        for (int i = 0; i < 2000; i++)
            handle(i);
        printf("worker %d calls=%d\n", getpid(), 2000 + early);
        _exit(0);
    }
    workers[w] = pid;
    return pid;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 2;
    if (n < 1 || n > 32 || pipe(go) != 0)
        return 1;
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int w = 0; w < n; w++)
        if (spawn(w, 0) < 0)
            return 1;
    printf("ready pid=%d workers=", getpid());
    for (int w = 0; w < n; w++)
        printf(w ? ",%d" : "%d", workers[w]);
    printf("\n");
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (!strncmp(line, "spawn", 5) && n < 64) {
            pid_t pid = spawn(n, atoi(line + 5));
            if (pid < 0)
                return 1;
            n++;
            printf("spawned %d\n", pid);
        } else if (!strncmp(line, "go", 2)) {
            for (int w = 0; w < n; w++)
                if (write(go[1], "g", 1) != 1)
                    return 1;
            for (int w = 0; w < n; w++)
                waitpid(workers[w], NULL, 0);
            printf("done\n");
        } else if (!strncmp(line, "quit", 4)) {
            break;
        }
    }
    return 0;
}
