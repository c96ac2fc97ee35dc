/* probe_lib: user probes for tests/targets/probed.c, loaded with
 * Process::load_library. Each writes one line to the target's stdout
 * (fd 1, unbuffered) with what it saw. */
#include "weft_probe.h"

#include <stdio.h>

void on_add3(const struct weft_probe *p)
{
    dprintf(1, "probe entry add3 %ld %ld %ld user=%lu thread=%u point=%u\n", (long)p->args[0],
            (long)p->args[1], (long)p->args[2], (unsigned long)p->user, p->thread, p->point);
}

void on_add3_exit(const struct weft_probe *p)
{
    dprintf(1, "probe exit add3 ret=%ld point=%u\n", (long)p->ret, p->point);
}

void on_scale(const struct weft_probe *p)
{
    dprintf(1, "probe entry scale %.2f k=%.2f\n", p->fargs[0], *(const double *)p->args[0]);
}

void on_scale_exit(const struct weft_probe *p) { dprintf(1, "probe exit scale %.2f\n", p->fret); }

void on_pick_exit(const struct weft_probe *p)
{
    dprintf(1, "probe exit pick %s\n", (const char *)p->ret);
}

/* A replacement for probed's add3, calling the original through the
 * pointer the tool writes (Process::replace_function's `original`). */
long (*add3_original)(long, long, long);

long add3_times10(long a, long b, long c) { return 10 * add3_original(a, b, c); }

/* Where a redirected call site of probed's scale lands instead. */
double scale_negated(double x, const double *k) { return -(x * *k); }

/* An instruction point's probe (tests/code/points.rs): the registers there. */
void on_point(const struct weft_probe *p)
{
    dprintf(1, "probe point user=%lu arg0=%ld arg1=%ld ret=%ld point=%u at=%#lx\n",
            (unsigned long)p->user, (long)p->args[0], (long)p->args[1], (long)p->ret, p->point,
            (unsigned long)p->function);
}

/* A probe that leaves every caller-saved register changed (tests/code/registers.rs):
 * the instrumented function's caller must not see any of it. */
void on_clobber(const struct weft_probe *p)
{
    __asm__ volatile("mov $-1, %%rax\n\tmov $-1, %%rcx\n\tmov $-1, %%rdx\n\tmov $-1, %%rsi\n\t"
                     "mov $-1, %%rdi\n\tmov $-1, %%r8\n\tmov $-1, %%r9\n\tmov $-1, %%r10\n\t"
                     "mov $-1, %%r11\n\tstd\n\tcld\n\tcmp %%rax, %%rcx"
                     :
                     :
                     : "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11", "cc");
    (void)p;
}
