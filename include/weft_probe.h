/* weft_probe.h: what a weft user probe receives.
 *
 * Build probes into a shared library (cc -shared -fPIC -o libmine.so mine.c),
 * load it into the target with weft::Process::load_library, look the
 * functions up with Library::symbol, and insert them with a ProbeSpec's
 * on_entry / on_exit, or at an instruction with a PointSpec. A probe runs on
 * the target's thread at every call (entry) or return (exit) of the
 * instrumented function, or before the instruction, with every register
 * and the vector state saved around it: it may be ordinary C, but must be
 * quick, must not unwind (no C++ exception, no longjmp out of it) and must
 * not call the function it instruments.
 *
 * The layout is weft_codegen::ProbeContext's (checked by weft's tests).
 */
#ifndef WEFT_PROBE_H
#define WEFT_PROBE_H

#include <stdint.h>

#define WEFT_POINT_ENTRY 0u
#define WEFT_POINT_EXIT 1u
/* At an instruction point (weft::Process::insert_points), before the
 * instruction runs: args are rdi..r9 there, ret/ret2/fret are rax, rdx and
 * xmm0 there (right after a call: its results), rsp is rsp there and
 * function the instruction's address. */
#define WEFT_POINT_INSTRUCTION 2u

struct weft_probe {
    /* Integer and pointer arguments at the entry, System V order
     * (rdi, rsi, rdx, rcx, r8, r9); 0 at an exit. */
    uint64_t args[6];
    /* Floating-point arguments at the entry (xmm0..xmm7, low 64 bits). */
    double fargs[8];
    /* At an exit: rax, rdx (a 128-bit result's high half), xmm0. */
    uint64_t ret;
    uint64_t ret2;
    double fret;
    /* The function's entry stack pointer: its return address is at rsp,
     * stack arguments from rsp + 8 on. */
    uint64_t rsp;
    /* The instrumented function's address. */
    uint64_t function;
    /* The constant given when the probe was inserted. */
    uint64_t user;
    /* weft's index of the calling thread. */
    uint32_t thread;
    /* WEFT_POINT_ENTRY, WEFT_POINT_EXIT or WEFT_POINT_INSTRUCTION. */
    uint32_t point;
};

_Static_assert(sizeof(struct weft_probe) == 168, "weft_probe layout");

#endif
