//! The clocks' hand-written readers for generated code: general-purpose
//! registers only, no vector state, their own small contracts (below), in
//! assembly. The state layouts they read are the parent module's
//! (`WALL_OFF_*`, `CPU_OFF_*`, `PAGE_OFF_*`).

use core::arch::global_asm;

use super::*;

extern "C" {
    /// Wall clock reader for generated code.
    ///
    /// Contract: `rdi` = `*const WallClock`; result (ns, CLOCK_MONOTONIC
    /// timeline) in `rax`; clobbers `rax, rcx, rdx, rsi, r8, r9, r10, r11`
    /// and flags; preserves `rdi` and every other register; no vector or
    /// x87 instruction; needs no stack alignment. TSC mode touches no stack
    /// beyond the return address; the CLOCK_MONOTONIC fallback uses 16
    /// bytes of stack and a raw `syscall`.
    pub fn weft_rt_wall_now(clock: *const WallClock) -> u64;

    /// CPU clock reader for generated code.
    ///
    /// Contract: `rdi` = `*mut ThreadCpuClock` of the calling thread; result
    /// (ns, CLOCK_THREAD_CPUTIME_ID timeline) in `rax`; clobbers `rax, rcx,
    /// rdx, rsi, r8, r9, r10, r11` and flags; preserves `rdi` and every
    /// other register; no vector or x87 instruction; no stack use beyond the
    /// return address (8 bytes more at the one read that makes a perf
    /// event the injector asked for; 32 bytes and the vDSO's frame at a
    /// re-anchor on the CPU-time table, which calls the vDSO's
    /// `clock_gettime`), no stack alignment needed. Writes
    /// `reads`, `last_ns`
    /// and, on the slow path (a context switch since the anchor, or syscall
    /// mode), `syscalls`, the anchor fields and `scratch` through a raw
    /// `syscall` of clock_gettime(CLOCK_THREAD_CPUTIME_ID).
    pub fn weft_rt_cpu_now(clock: *mut ThreadCpuClock) -> u64;

    /// Slow path of the inline CPU clock of generated code (not a C
    /// function: call it from assembly only).
    ///
    /// Contract: `rdx` = `*mut ThreadCpuClock` of the calling thread, `rax`
    /// = the caller's raw wall reading (ignored); result: the thread's CPU
    /// time in raw ticks ([`TimerUnits`]) in `rax`, re-anchoring in anchor
    /// mode. Preserves every other general register (`rdx` included);
    /// clobbers the flags; no vector or x87 instruction; 72 bytes of stack
    /// plus `weft_rt_cpu_now`'s.
    pub fn weft_rt_cpu_ticks();

    /// Raw wall reading for generated code when the TSC is not the wall
    /// clock (not a C function: call it from assembly only).
    ///
    /// Contract: `rax` = `*const WallClock`; result in `rax`: the TSC for a
    /// TSC wall clock, else CLOCK_MONOTONIC ns (a raw `syscall`).
    /// Preserves every other general register; clobbers the flags; no
    /// vector or x87 instruction; 56 bytes of stack.
    pub fn weft_rt_wall_raw();
}

// The mul/shift sequence used by both readers, on rax (value), with the
// multiplier in r9 (zero-extended u32) and the shift in cl; clobbers r10,
// r11. Exactly `mul_u64_u32_shr`.
macro_rules! mul_shift_rax {
    () => {
        concat!(
            "mov r10, rax\n",
            "shr r10, cl\n", // quot = a >> shift
            "mov r11, r10\n",
            "shl r11, cl\n",
            "sub rax, r11\n", // rem = a - (quot << shift)
            "imul r10, r9\n", // quot * mult
            "imul rax, r9\n", // rem * mult < 2^64 since shift <= 32
            "shr rax, cl\n",
            "add rax, r10\n",
        )
    };
}

global_asm!(
    ".pushsection .text.weft_rt_clock,\"ax\",@progbits",
    // ---- weft_rt_wall_now -------------------------------------------------
    ".globl weft_rt_wall_now",
    ".type weft_rt_wall_now,@function",
    ".p2align 4",
    "weft_rt_wall_now:",
    "mov r8, rdi",
    "cmp dword ptr [r8 + {W_KIND}], 0",
    "jne 3f",
    "rdtsc",
    "shl rdx, 32",
    "or rax, rdx",
    "sub rax, qword ptr [r8 + {W_TSC_BASE}]",
    "jae 2f",
    "xor eax, eax", // TSC before the base: clamp, as wall_ns does
    "2:",
    "mov r9d, dword ptr [r8 + {W_MULT}]",
    "mov ecx, dword ptr [r8 + {W_SHIFT}]",
    mul_shift_rax!(),
    "add rax, qword ptr [r8 + {W_NS_BASE}]",
    "ret",
    // Fallback: clock_gettime(CLOCK_MONOTONIC) by raw syscall (no libc, no
    // vDSO call: both would need the C ABI's clobbers and alignment).
    "3:",
    "sub rsp, 16",
    "mov rsi, rsp",
    "mov eax, {SYS_CLOCK_GETTIME}",
    "mov edi, {CLOCK_MONOTONIC}",
    "syscall",
    "mov rdi, r8",
    "mov rax, qword ptr [rsp]",
    "imul rax, rax, 1000000000",
    "add rax, qword ptr [rsp + 8]",
    "add rsp, 16",
    "ret",
    ".size weft_rt_wall_now, . - weft_rt_wall_now",
    // ---- weft_rt_cpu_now --------------------------------------------------
    ".globl weft_rt_cpu_now",
    ".type weft_rt_cpu_now,@function",
    ".p2align 4",
    "weft_rt_cpu_now:",
    "mov r8, rdi",
    "inc qword ptr [r8 + {C_READS}]",
    "mov eax, dword ptr [r8 + {C_MODE}]",
    "cmp eax, {CPU_PERF_TIME}",
    "je 20f",
    "ja 30f",
    // Anchor mode: rdtsc first, then the lock (see ThreadCpuClock::now).
    "rdtsc",
    "shl rdx, 32",
    "or rax, rdx",
    "mov r9, qword ptr [r8 + {C_PAGE}]",
    "mov ecx, dword ptr [r9 + {P_LOCK}]",
    "cmp ecx, dword ptr [r8 + {C_ANCHOR_LOCK}]",
    "jne 40f",
    "sub rax, qword ptr [r8 + {C_ANCHOR_TSC}]",
    "jae 12f",
    "xor eax, eax",
    "12:",
    "cmp rax, qword ptr [r8 + {C_MAX_AGE}]",
    "jae 40f", // the anchor aged out: re-anchor (see MAX_ANCHOR_AGE_NS)
    "mov r9d, dword ptr [r8 + {C_MULT}]",
    "mov ecx, dword ptr [r8 + {C_SHIFT}]",
    mul_shift_rax!(),
    "add rax, qword ptr [r8 + {C_ANCHOR_CPU}]",
    // Common exit: never return less than last time.
    "50:",
    "cmp rax, qword ptr [r8 + {C_LAST}]",
    "jae 51f",
    "mov rax, qword ptr [r8 + {C_LAST}]",
    "51:",
    "mov qword ptr [r8 + {C_LAST}], rax",
    "ret",
    // Perf-time mode: the seqlock loop of linux/perf_event.h. x86 does not
    // reorder loads with loads, so program order is enough between the
    // two reads of `lock`.
    "20:",
    "cmp dword ptr [r8 + {C_WHY}], {WHY_DROP_ASKED}",
    "je 90f",
    "mov r9, qword ptr [r8 + {C_PAGE}]",
    "21:",
    "mov esi, dword ptr [r9 + {P_LOCK}]",
    "mov rax, qword ptr [r9 + {P_CAPS}]",
    "and eax, {CAPS_MASK}",
    "cmp eax, {CAP_USER_TIME}",
    "jne 30f", // no cap_user_time (or the short variant): syscall
    "mov r10, qword ptr [r9 + {P_RUNNING}]",
    "add r10, qword ptr [r9 + {P_OFFSET}]", // r10 = running + time_offset
    "movzx ecx, word ptr [r9 + {P_SHIFT}]",
    "mov r11d, dword ptr [r9 + {P_MULT}]",
    "rdtsc",
    "shl rdx, 32",
    "or rax, rdx",
    "cmp esi, dword ptr [r9 + {P_LOCK}]",
    "jne 21b",
    "cmp ecx, 32",
    "ja 30f", // a shift the split cannot do exactly: syscall
    "mov rsi, r10", // mul_shift clobbers r10/r11
    "mov r9, r11",
    mul_shift_rax!(),
    "add rax, rsi",
    "add rax, qword ptr [r8 + {C_BASE}]",
    "jmp 50b",
    // Syscall mode: clock_gettime(CLOCK_THREAD_CPUTIME_ID) every read,
    // unless the injector asked for an event (see arm_self).
    "30:",
    "cmp dword ptr [r8 + {C_WHY}], {WHY_ARM_ASKED}",
    "je 60f",
    "32:",
    "inc qword ptr [r8 + {C_SYSCALLS}]",
    "mov eax, {SYS_CLOCK_GETTIME}",
    "mov edi, {CLOCK_THREAD_CPUTIME_ID}",
    "lea rsi, [r8 + {C_SCRATCH}]",
    "syscall",
    "mov rdi, r8",
    "test rax, rax",
    "jnz 31f",
    "mov rax, qword ptr [r8 + {C_SCRATCH}]",
    "imul rax, rax, 1000000000",
    "add rax, qword ptr [r8 + {C_SCRATCH} + 8]",
    "jmp 50b",
    "31:",
    "xor eax, eax", // cannot happen; the clamp returns the last value
    "jmp 50b",
    // Re-anchor (anchor mode, lock changed or anchor aged): from the
    // CPU-time table when the clock is on it, else lock, syscall, rdtsc,
    // lock.
    "40:",
    "cmp dword ptr [r8 + {C_WHY}], {WHY_DROP_ASKED}",
    "je 90f",
    "cmp dword ptr [r8 + {C_WHY}], {WHY_ON_TABLE}",
    "je 80f",
    "47:",
    "inc qword ptr [r8 + {C_SYSCALLS}]",
    "mov r9, qword ptr [r8 + {C_PAGE}]",
    "mov r10d, dword ptr [r9 + {P_LOCK}]", // syscall preserves r9, r10
    "rdtsc",
    "shl rdx, 32",
    "or rdx, rax", // the TSC before the syscall (which preserves rdx)
    "mov eax, {SYS_CLOCK_GETTIME}",
    "mov edi, {CLOCK_THREAD_CPUTIME_ID}",
    "lea rsi, [r8 + {C_SCRATCH}]",
    "syscall",
    "mov rdi, r8",
    "test rax, rax",
    "jnz 31b",
    "mov rsi, rdx",
    "rdtsc",
    "shl rdx, 32",
    "or rax, rdx",
    // A long window (see max_anchor_window): no anchor, as if switched.
    "mov rcx, rax",
    "sub rcx, rsi",
    "mov rsi, qword ptr [r8 + {C_MAX_AGE}]",
    "shr rsi, {ANCHOR_WINDOW_SHIFT}",
    "cmp rcx, rsi",
    "jb 42f",
    "mov r10d, {LOCK_INVALID}", // a settled page lock is even: no match
    "42:",
    "mov ecx, dword ptr [r9 + {P_LOCK}]",
    "mov rdx, qword ptr [r8 + {C_SCRATCH}]",
    "imul rdx, rdx, 1000000000",
    "add rdx, qword ptr [r8 + {C_SCRATCH} + 8]",
    "cmp ecx, r10d",
    "jne 41f", // switched around the syscall: value good, anchor not
    // Invalidate, write the anchor and its tick offset, then publish the
    // lock (see ThreadCpuClock): no fast path sees a half-written anchor.
    // In: rax = the TSC, rdx = the CPU ns, ecx = the lock.
    "43:",
    "mov dword ptr [r8 + {C_ANCHOR_LOCK}], {LOCK_INVALID}",
    "mov qword ptr [r8 + {C_ANCHOR_TSC}], rax",
    "mov qword ptr [r8 + {C_ANCHOR_CPU}], rdx",
    "mov r11, rax", // tsc
    "mov r10, rdx", // cpu ns
    "mov rax, rdx",
    "mul qword ptr [r8 + {C_TO_TICKS}]",
    "shrd rax, rdx, 32", // cpu in ticks
    "sub rax, r11",
    "mov qword ptr [r8 + {C_TICKS_OFFSET}], rax",
    "mov dword ptr [r8 + {C_ANCHOR_LOCK}], ecx",
    "mov rdx, r10",
    "41:",
    "mov rax, rdx",
    "jmp 50b",
    // Make a perf event for this thread, as ThreadCpuClock::arm_self
    // does: one try (`why` is no longer the request whatever happens),
    // the clock on the stack across the system calls (8 bytes).
    "60:",
    "mov dword ptr [r8 + {C_WHY}], {WHY_UNASKED}",
    "cmp dword ptr [r8 + {C_MULT}], 0",
    "je 32b", // no TSC calibration: no anchor mode
    // A slot of the CPU-time table rather than an event, where there is
    // one (as ThreadCpuClock::take_table_slot): first this thread's own
    // slot (a lookup stops at a free one), then a free or given-back one.
    "mov r9, qword ptr [rip + {TABLE}]",
    "test r9, r9",
    "jz 65f",
    "mov eax, {SYS_GETTID}",
    "syscall",
    "mov esi, eax", // the thread id
    "xor ecx, ecx",
    "66:",
    "lea eax, [rsi + rcx]",
    "and eax, {T_MASK}",
    "shl rax, {T_SLOT_SHIFT}",
    "lea r10, [r9 + rax]",
    "mov eax, dword ptr [r10 + {T_TID}]",
    "cmp eax, esi",
    "je 68f",
    "test eax, eax",
    "jz 67f",
    "inc ecx",
    "cmp ecx, {T_PROBES}",
    "jb 66b",
    "67:",
    "xor ecx, ecx",
    "71:",
    "lea eax, [rsi + rcx]",
    "and eax, {T_MASK}",
    "shl rax, {T_SLOT_SHIFT}",
    "lea r10, [r9 + rax]",
    "mov eax, dword ptr [r10 + {T_TID}]",
    "test eax, eax",
    "jz 72f",
    "cmp eax, {T_GONE}",
    "jne 73f",
    "72:",
    "lock cmpxchg dword ptr [r10 + {T_TID}], esi", // from eax (free or gone)
    "je 68f",
    "73:",
    "inc ecx",
    "cmp ecx, {T_PROBES}",
    "jb 71b",
    "jmp 65f", // every slot taken: an event
    "68:", // r10 = the slot, esi = the thread id
    "mov qword ptr [r10 + {T_SWITCHED_IN}], 0", // no dead thread's numbers
    "cmp dword ptr [r8 + {C_OWNS}], 0",
    "je 74f",
    "mov rdi, qword ptr [r8 + {C_PAGE}]", // a released event's zero page
    "test rdi, rdi",
    "jz 74f",
    "mov r9d, esi",
    "mov esi, {PAGE_SIZE}",
    "mov eax, {SYS_MUNMAP}",
    "syscall",
    "mov esi, r9d",
    "74:",
    "mov dword ptr [r8 + {C_OWNS}], 0",
    "mov dword ptr [r8 + {C_TABLE_TID}], esi",
    "mov qword ptr [r8 + {C_PAGE}], r10",
    "mov dword ptr [r8 + {C_ANCHOR_LOCK}], {LOCK_INVALID}",
    "mov eax, {MAX_AGE_NS}",
    "mul qword ptr [r8 + {C_TO_TICKS}]",
    "shrd rax, rdx, 32",
    "mov qword ptr [r8 + {C_MAX_AGE}], rax",
    "mov dword ptr [r8 + {C_WHY}], {WHY_ON_TABLE}",
    "mov dword ptr [r8 + {C_MODE}], {CPU_ANCHOR}",
    "mov rdi, r8",
    "jmp 40b",
    "65:",
    "push r8",
    "lea rdi, [rip + {ATTR}]",
    "xor esi, esi", // pid 0: this thread
    "mov rdx, -1", // any CPU
    "mov r10, -1", // no group
    "mov r8d, {FD_CLOEXEC}",
    "mov eax, {SYS_PERF_EVENT_OPEN}",
    "syscall",
    "test rax, rax",
    "js 69f",
    "mov r8, rax", // the fd, mmap's fifth argument (syscall keeps r8)
    "mov rcx, qword ptr [rsp]",
    "xor edi, edi",
    "mov r10d, {MAP_SHARED}",
    "cmp dword ptr [rcx + {C_OWNS}], 0",
    "je 61f",
    "mov rdi, qword ptr [rcx + {C_PAGE}]", // a released clock's zero page
    "test rdi, rdi",
    "jz 61f",
    "mov r10d, {MAP_SHARED_FIXED}", // replaced in place
    "61:",
    "mov esi, {PAGE_SIZE}",
    "mov edx, {PROT_READ}",
    "xor r9d, r9d",
    "mov eax, {SYS_MMAP}",
    "syscall",
    "mov r9, rax", // the page, or -errno
    "mov rdi, r8",
    "mov eax, {SYS_CLOSE}",
    "syscall", // the mapping keeps the event
    "pop r8",
    "cmp r9, -4096",
    "jbe 62f",
    // No page: a fixed mapping that failed may have taken the old one.
    "xor eax, eax",
    "mov qword ptr [r8 + {C_PAGE}], rax",
    "mov dword ptr [r8 + {C_OWNS}], eax",
    "jmp 32b",
    "62:",
    "mov qword ptr [r8 + {C_PAGE}], r9",
    "mov dword ptr [r8 + {C_OWNS}], 1",
    "mov dword ptr [r8 + {C_ANCHOR_LOCK}], {LOCK_INVALID}",
    "mov eax, {MAX_AGE_NS}", // the anchor's age limit in ticks
    "mul qword ptr [r8 + {C_TO_TICKS}]",
    "shrd rax, rdx, 32",
    "mov qword ptr [r8 + {C_MAX_AGE}], rax",
    "mov dword ptr [r8 + {C_WHY}], 0",
    "mov dword ptr [r8 + {C_MODE}], {CPU_ANCHOR}",
    "jmp 40b", // re-anchor on the new event
    "69:",
    "pop r8",
    "jmp 32b",
    // Re-anchor on the CPU-time table (as reanchor_from_table): when the
    // program wrote the slot since the anchor, the CPU time then plus
    // CLOCK_MONOTONIC since (the vDSO's, or the system call's without
    // one); else the system call. r9 = the slot, r10d = its count.
    "80:",
    "mov r9, qword ptr [r8 + {C_PAGE}]",
    "mov r10d, dword ptr [r9 + {T_SEQ}]",
    "cmp r10d, dword ptr [r8 + {C_ANCHOR_LOCK}]",
    "je 47b", // only aged
    "cmp qword ptr [r9 + {T_SWITCHED_IN}], 0",
    "je 47b", // not written yet
    "rdtsc",
    "shl rdx, 32",
    "or rax, rdx",
    "mov rsi, rax", // the TSC before
    "mov rax, qword ptr [rip + {VDSO}]",
    "test rax, rax",
    "jz 85f",
    // The vDSO is built without vector or x87 code (the kernel's flags)
    // and follows the C ABI: save what it may clobber that we keep.
    "push r8",
    "push r9",
    "push r10",
    "push rsi",
    "mov edi, {CLOCK_MONOTONIC}",
    "lea rsi, [r8 + {C_SCRATCH}]",
    "call rax",
    "mov r11d, eax",
    "pop rsi",
    "pop r10",
    "pop r9",
    "pop r8",
    "jmp 86f",
    "85:",
    "inc qword ptr [r8 + {C_SYSCALLS}]",
    "mov rdx, rsi", // the syscall keeps rdx
    "mov eax, {SYS_CLOCK_GETTIME}",
    "mov edi, {CLOCK_MONOTONIC}",
    "lea rsi, [r8 + {C_SCRATCH}]",
    "syscall",
    "mov r11, rax",
    "mov rsi, rdx",
    "86:",
    "mov rdi, r8",
    "test r11d, r11d",
    "jnz 47b",
    "rdtsc",
    "shl rdx, 32",
    "or rax, rdx", // the TSC after
    "mov rcx, rax",
    "sub rcx, rsi",
    "mov rsi, qword ptr [r8 + {C_MAX_AGE}]",
    "shr rsi, {ANCHOR_WINDOW_SHIFT}",
    "cmp rcx, rsi",
    "jae 47b", // a long window: the system call
    "cmp r10d, dword ptr [r9 + {T_SEQ}]",
    "jne 47b", // switched meanwhile
    "mov rdx, qword ptr [r8 + {C_SCRATCH}]",
    "imul rdx, rdx, 1000000000",
    "add rdx, qword ptr [r8 + {C_SCRATCH} + 8]",
    "sub rdx, qword ptr [r9 + {T_SWITCHED_IN}]",
    "jae 87f",
    "xor edx, edx",
    "87:",
    "add rdx, qword ptr [r9 + {T_SUM}]",
    "mov ecx, r10d",
    "jmp 43b",
    // Let the perf event go, as ThreadCpuClock::release_event does on the
    // owner (the injector asked, `max_age` is 0): system-call mode first,
    // so that no reader uses the page again, then a private zero page laid
    // over the event's, which frees the event (its fd is closed). On a
    // failed mapping the event stays and the clock still reads the system
    // call.
    "90:",
    "mov dword ptr [r8 + {C_MODE}], {CPU_SYSCALL}",
    "mov dword ptr [r8 + {C_ANCHOR_LOCK}], {LOCK_INVALID}",
    "mov qword ptr [r8 + {C_MAX_AGE}], 0",
    "mov dword ptr [r8 + {C_WHY}], {WHY_RELEASED}",
    "cmp dword ptr [r8 + {C_OWNS}], 0",
    "je 32b",
    "mov rdi, qword ptr [r8 + {C_PAGE}]",
    "test rdi, rdi",
    "jz 32b",
    "push r8",
    "mov esi, {PAGE_SIZE}",
    "mov edx, {PROT_READ}",
    "mov r10d, {MAP_PRIVATE_ANON_FIXED}",
    "mov r8, -1",
    "xor r9d, r9d",
    "mov eax, {SYS_MMAP}",
    "syscall",
    "pop r8",
    "mov rdi, r8",
    "jmp 32b",
    ".size weft_rt_cpu_now, . - weft_rt_cpu_now",
    // ---- weft_rt_cpu_ticks ------------------------------------------------
    ".globl weft_rt_cpu_ticks",
    ".type weft_rt_cpu_ticks,@function",
    ".p2align 4",
    "weft_rt_cpu_ticks:",
    "push rcx",
    "push rdx",
    "push rsi",
    "push rdi",
    "push r8",
    "push r9",
    "push r10",
    "push r11",
    "mov rdi, rdx",
    "call weft_rt_cpu_now", // rax = ns; rdi preserved
    "mul qword ptr [rdi + {C_TO_TICKS}]",
    "shrd rax, rdx, 32",
    "pop r11",
    "pop r10",
    "pop r9",
    "pop r8",
    "pop rdi",
    "pop rsi",
    "pop rdx",
    "pop rcx",
    "ret",
    ".size weft_rt_cpu_ticks, . - weft_rt_cpu_ticks",
    // ---- weft_rt_wall_raw -------------------------------------------------
    ".globl weft_rt_wall_raw",
    ".type weft_rt_wall_raw,@function",
    ".p2align 4",
    "weft_rt_wall_raw:",
    "cmp dword ptr [rax + {W_KIND}], 0",
    "jne 2f",
    "push rdx",
    "rdtsc",
    "shl rdx, 32",
    "or rax, rdx",
    "pop rdx",
    "ret",
    "2:",
    "push rcx",
    "push rdx",
    "push rsi",
    "push rdi",
    "push r11",
    "sub rsp, 16",
    "mov rsi, rsp",
    "mov eax, {SYS_CLOCK_GETTIME}",
    "mov edi, {CLOCK_MONOTONIC}",
    "syscall",
    "mov rax, qword ptr [rsp]",
    "imul rax, rax, 1000000000",
    "add rax, qword ptr [rsp + 8]",
    "add rsp, 16",
    "pop r11",
    "pop rdi",
    "pop rsi",
    "pop rdx",
    "pop rcx",
    "ret",
    ".size weft_rt_wall_raw, . - weft_rt_wall_raw",
    ".popsection",
    W_KIND = const WALL_OFF_KIND,
    W_MULT = const WALL_OFF_MULT,
    W_SHIFT = const WALL_OFF_SHIFT,
    W_TSC_BASE = const WALL_OFF_TSC_BASE,
    W_NS_BASE = const WALL_OFF_NS_BASE,
    C_PAGE = const CPU_OFF_PAGE,
    C_MODE = const CPU_OFF_MODE,
    C_ANCHOR_LOCK = const CPU_OFF_ANCHOR_LOCK,
    C_ANCHOR_CPU = const CPU_OFF_ANCHOR_CPU,
    C_ANCHOR_TSC = const CPU_OFF_ANCHOR_TSC,
    C_MAX_AGE = const CPU_OFF_MAX_AGE,
    C_MULT = const CPU_OFF_MULT,
    C_SHIFT = const CPU_OFF_SHIFT,
    C_BASE = const CPU_OFF_BASE,
    C_LAST = const CPU_OFF_LAST,
    C_READS = const CPU_OFF_READS,
    C_SYSCALLS = const CPU_OFF_SYSCALLS,
    C_SCRATCH = const CPU_OFF_SCRATCH,
    C_TICKS_OFFSET = const CPU_OFF_TICKS_OFFSET,
    C_TO_TICKS = const CPU_OFF_TO_TICKS,
    LOCK_INVALID = const LOCK_INVALID,
    ANCHOR_WINDOW_SHIFT = const ANCHOR_WINDOW_SHIFT,
    P_LOCK = const PAGE_OFF_LOCK,
    P_CAPS = const PAGE_OFF_CAPABILITIES,
    P_RUNNING = const PAGE_OFF_TIME_RUNNING,
    P_OFFSET = const PAGE_OFF_TIME_OFFSET,
    P_SHIFT = const PAGE_OFF_TIME_SHIFT,
    P_MULT = const PAGE_OFF_TIME_MULT,
    CAPS_MASK = const (CAP_USER_TIME | CAP_USER_TIME_SHORT),
    CAP_USER_TIME = const CAP_USER_TIME,
    CPU_PERF_TIME = const CPU_PERF_TIME,
    SYS_CLOCK_GETTIME = const libc::SYS_clock_gettime,
    CLOCK_MONOTONIC = const libc::CLOCK_MONOTONIC,
    CLOCK_THREAD_CPUTIME_ID = const libc::CLOCK_THREAD_CPUTIME_ID,
    C_WHY = const CPU_OFF_WHY,
    C_OWNS = const CPU_OFF_OWNS_PAGE,
    WHY_ARM_ASKED = const WHY_CPU_ARM_ASKED,
    WHY_UNASKED = const WHY_CPU_UNASKED,
    WHY_DROP_ASKED = const WHY_CPU_DROP_ASKED,
    WHY_RELEASED = const WHY_CPU_RELEASED,
    CPU_SYSCALL = const CPU_SYSCALL,
    MAP_PRIVATE_ANON_FIXED = const (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED),
    ATTR = sym TASK_CLOCK_ATTR,
    FD_CLOEXEC = const PERF_FLAG_FD_CLOEXEC,
    SYS_PERF_EVENT_OPEN = const libc::SYS_perf_event_open,
    SYS_MMAP = const libc::SYS_mmap,
    SYS_CLOSE = const libc::SYS_close,
    MAP_SHARED = const libc::MAP_SHARED,
    MAP_SHARED_FIXED = const (libc::MAP_SHARED | libc::MAP_FIXED),
    PROT_READ = const libc::PROT_READ,
    PAGE_SIZE = const 4096,
    MAX_AGE_NS = const MAX_ANCHOR_AGE_NS,
    CPU_ANCHOR = const CPU_ANCHOR,
    WHY_ON_TABLE = const WHY_CPU_ON_TABLE,
    C_TABLE_TID = const CPU_OFF_TABLE_TID,
    TABLE = sym table::TABLE,
    VDSO = sym table::VDSO_CLOCK_GETTIME,
    SYS_GETTID = const libc::SYS_gettid,
    SYS_MUNMAP = const libc::SYS_munmap,
    T_MASK = const (weft_abi::clock::table::SLOTS - 1),
    T_SLOT_SHIFT = const weft_abi::clock::table::SLOT_SIZE.trailing_zeros(),
    T_PROBES = const weft_abi::clock::table::PROBES,
    T_GONE = const weft_abi::clock::table::GONE,
    T_TID = const weft_abi::clock::table::TID,
    T_SEQ = const weft_abi::clock::table::SEQ,
    T_SUM = const weft_abi::clock::table::SUM,
    T_SWITCHED_IN = const weft_abi::clock::table::SWITCHED_IN,
);
