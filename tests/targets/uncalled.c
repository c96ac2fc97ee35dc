/* Code that nothing calls, for tests/code/uncalled_code.rs, which times every
 * function here: the program's entry point (`_start`, where the kernel
 * leaves argc on top of the stack, not a return address), a signal
 * restorer of the program's own (entered by each handler's return, on the
 * signal frame) and a function whose unwind information calls it the
 * outermost frame (`.cfi_undefined rip`, as `_start`'s and a new
 * thread's first code). Prints its arguments, how many signals its two
 * threads handled, and what the outermost-marked function returned. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

void weft_test_restorer(void);
long outermost_marker(long);
__asm__(".text\n"
        ".globl weft_test_restorer\n"
        ".type weft_test_restorer,@function\n"
        "weft_test_restorer:\n"
        ".cfi_startproc\n"
        ".cfi_signal_frame\n"
        "  mov $15, %eax\n" /* rt_sigreturn */
        "  syscall\n"
        "  hlt\n"
        ".cfi_endproc\n"
        ".size weft_test_restorer, .-weft_test_restorer\n"
        ".globl outermost_marker\n"
        ".type outermost_marker,@function\n"
        "outermost_marker:\n"
        ".cfi_startproc\n"
        ".cfi_undefined rip\n"
        "  lea 42(%rdi), %rax\n"
        "  nop\n"
        "  nop\n"
        "  nop\n"
        "  ret\n"
        ".cfi_endproc\n"
        ".size outermost_marker, .-outermost_marker\n");

/* The kernel's struct sigaction: glibc's sigaction() always installs its
 * own restorer, so the program asks the kernel directly. */
struct kernel_sigaction {
  void (*handler)(int);
  unsigned long flags;
  void (*restorer)(void);
  unsigned long mask;
};
#define KERNEL_SA_RESTORER 0x04000000UL

#define SIGNALS 1000
static atomic_long handled;

static void on_usr1(int sig) {
  (void)sig;
  atomic_fetch_add(&handled, 1);
}

static void *raiser(void *arg) {
  for (int i = 0; i < SIGNALS; i++)
    pthread_kill(pthread_self(), SIGUSR1);
  return arg;
}

int main(int argc, char **argv) {
  printf("argc=%d\n", argc);
  for (int i = 1; i < argc; i++)
    printf("argv[%d]=%s\n", i, argv[i]);
  struct kernel_sigaction ka = {on_usr1, KERNEL_SA_RESTORER | SA_RESTART,
                                weft_test_restorer, 0};
  if (syscall(SYS_rt_sigaction, SIGUSR1, &ka, NULL, 8) != 0) {
    perror("rt_sigaction");
    return 1;
  }
  pthread_t t[2];
  for (int i = 0; i < 2; i++)
    if (pthread_create(&t[i], NULL, raiser, NULL) != 0)
      return 1;
  for (int i = 0; i < 2; i++)
    pthread_join(t[i], NULL);
  printf("signals=%ld\n", atomic_load(&handled));
  printf("outermost=%ld\n", outermost_marker(argc));
  return 0;
}
