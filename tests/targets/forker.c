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
 * "exec" forks a worker that runs this program anew (execve of
 * /proc/self/exe: a new image, nothing of the master's), which waits for
 * its byte as the others do, calls handle() 2,000 times and prints
 * "worker PID calls=2000"; "execsleep" forks a child that runs
 * `sleep 1` (no handle() there), and "go" then also waits for it and
 * prints "sleeper PID code=C".
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
static pid_t sleepers[8];
static int nsleepers;

/* The program a worker runs after "exec": waits for its byte on `fd`. */
static int exec_child(int fd) {
    char c;
    if (read(fd, &c, 1) != 1)
        return 2;
    for (int i = 0; i < 2000; i++)
        handle(i);
    printf("worker %d calls=2000\n", getpid());
    return 0;
}

/* Forks a child that runs `argv` (execv), keeping the pipe's read end. */
static pid_t spawn_exec(char *const argv[]) {
    pid_t pid = fork();
    if (pid == 0) {
        close(go[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

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
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 2 && !strcmp(argv[1], "--exec-child"))
        return exec_child(atoi(argv[2]));
    int n = argc > 1 ? atoi(argv[1]) : 2;
    if (n < 1 || n > 32 || pipe(go) != 0)
        return 1;
    for (int w = 0; w < n; w++)
        if (spawn(w, 0) < 0)
            return 1;
    printf("ready pid=%d workers=", getpid());
    for (int w = 0; w < n; w++)
        printf(w ? ",%d" : "%d", workers[w]);
    printf("\n");
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (!strncmp(line, "execsleep", 9) && nsleepers < 8) {
            char *args[] = {"/bin/sleep", "1", NULL};
            pid_t pid = spawn_exec(args);
            if (pid < 0)
                return 1;
            sleepers[nsleepers++] = pid;
            printf("spawned %d\n", pid);
        } else if (!strncmp(line, "exec", 4) && n < 64) {
            char fd[16];
            snprintf(fd, sizeof fd, "%d", go[0]);
            char *args[] = {"/proc/self/exe", "--exec-child", fd, NULL};
            pid_t pid = spawn_exec(args);
            if (pid < 0)
                return 1;
            workers[n++] = pid;
            printf("spawned %d\n", pid);
        } else if (!strncmp(line, "spawn", 5) && n < 64) {
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
            for (int i = 0; i < nsleepers; i++) {
                int status = 0;
                waitpid(sleepers[i], &status, 0);
                printf("sleeper %d code=%d\n", sleepers[i],
                       WIFEXITED(status) ? WEXITSTATUS(status) : -1);
            }
            nsleepers = 0;
            printf("done\n");
        } else if (!strncmp(line, "quit", 4)) {
            break;
        }
    }
    return 0;
}
