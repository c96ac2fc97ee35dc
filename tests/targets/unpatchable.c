/* unpatchable: functions that a 5-byte `jmp rel32` entry patch cannot
 * replace safely, written in top-level asm so the compiler cannot change them.
 *
 *   tiny        1 byte (`ret`), immediately followed by after_tiny: no padding,
 *               so there is no room for a 5-byte patch.
 *   loopy       a loop whose head (offset 2) lies inside the first 5 bytes, so
 *               a jump lands in the middle of any entry patch.
 *   shared_body another function (sibling_entry) jumps to offset 3 of it, as
 *               glibc's __mempcpy_* variants jump into __memmove_*: a jump
 *               from *elsewhere in the module* into the patch window.
 *   work_a      an ordinary C function (control: patchable).
 *
 * Protocol: prints "ready pid=<pid>"; for every "go" line on stdin prints
 *   result tiny=<r> loopy=<r> after_tiny=<r> shared=<r> sibling=<r> work_a=<count>
 * with expected values tiny=0 loopy=5050 after_tiny=42 shared=42 sibling=42
 * work_a=<1000 per go, cumulative>; "quit" or EOF: prints "done" and exits 0.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

asm(".text\n"
    ".p2align 4\n"
    ".globl tiny\n"
    ".type tiny, @function\n"
    "tiny:\n"
    "  ret\n"
    ".size tiny, .-tiny\n"
    ".globl after_tiny\n"
    ".type after_tiny, @function\n"
    "after_tiny:\n"
    "  leal 1(%rdi), %eax\n"
    "  ret\n"
    ".size after_tiny, .-after_tiny\n"
    ".p2align 4\n"
    ".globl loopy\n"
    ".type loopy, @function\n"
    "loopy:\n"                 /* long loopy(long n), n >= 1: returns n+(n-1)+...+1 */
    "  xorl %eax, %eax\n"      /* 2 bytes, offset 0 */
    "1:\n"
    "  addq %rdi, %rax\n"      /* 3 bytes, offset 2: loop head inside the patch window */
    "  decq %rdi\n"
    "  jnz 1b\n"
    "  ret\n"
    ".size loopy, .-loopy\n"
    ".p2align 4\n"
    ".globl sibling_entry\n"
    ".type sibling_entry, @function\n"
    "sibling_entry:\n"         /* long sibling_entry(long a, long b): a+b+7 */
    "  movq %rdi, %rax\n"
    "  addq %rsi, %rax\n"
    "  jmp 2f\n"
    ".size sibling_entry, .-sibling_entry\n"
    ".p2align 4\n"
    ".globl shared_body\n"
    ".type shared_body, @function\n"
    "shared_body:\n"           /* long shared_body(long a): a+7 */
    "  movq %rdi, %rax\n"      /* 3 bytes */
    "2:\n"
    "  addq $7, %rax\n"        /* 4 bytes, offset 3: sibling_entry lands here */
    "  ret\n"
    ".size shared_body, .-shared_body\n");

void tiny(void);
int after_tiny(int x);
long loopy(long n);
long sibling_entry(long a, long b);
long shared_body(long a);

__attribute__((noinline, noipa)) long work_a(long *counter, long x)
{
    *counter += 1;
    return x * 3 + 1;
}

static int read_line(char *buf, size_t cap)
{
    size_t n = 0;
    for (;;) {
        char c;
        ssize_t r = read(0, &c, 1);
        if (r < 0) {
            if (errno == EINTR) {
                printf("FAIL stdin read: EINTR\n");
                fflush(stdout);
                continue;
            }
            return -1;
        }
        if (r == 0)
            return n ? (int)n : -1;
        if (c == '\n')
            break;
        if (n + 1 < cap)
            buf[n++] = c;
    }
    buf[n] = 0;
    return (int)n;
}

int main(void)
{
    long count = 0, acc = 0;
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    char line[256];
    while (read_line(line, sizeof line) >= 0 && strcmp(line, "quit")) {
        if (strcmp(line, "go"))
            continue;
        tiny();
        long l = loopy(100);
        int a = after_tiny(41);
        long sh = shared_body(35), si = sibling_entry(30, 5);
        for (int i = 0; i < 1000; i++)
            acc += work_a(&count, acc);
        printf("result tiny=0 loopy=%ld after_tiny=%d shared=%ld sibling=%ld work_a=%ld\n", l, a, sh,
               si, count);
        fflush(stdout);
    }
    printf("done\n");
    fflush(stdout);
    return 0;
}
