//! Per-thread, per-function inclusive timers on top of exit hooks.
//!
//! When a [`ReturnSlots`](crate::ReturnSlots) layout carries a [`TimerSpec`]
//! ([`ReturnSlots::with_timers`](crate::ReturnSlots::with_timers)), the
//! entry snippet of [`Snippet::CountCallHookExit`](crate::Snippet) starts
//! the function's timer after redirecting its return, and the exit handler
//! (and the closing of activations whose frames vanished) stops it. The
//! clocks are the runtime's GPR-only assembly readers, *called* at absolute
//! addresses: `weft_rt_wall_now(rdi = *const WallClock)` and
//! `weft_rt_cpu_now(rdi = this thread's *mut ThreadCpuClock)`.
//!
//! # Words per function (at its metric base `m`, a row byte offset)
//!
//! | offset from `m` | word | written by |
//! |---|---|---|
//! | [`METRIC_ENTRIES`](crate::METRIC_ENTRIES) = 0 | entries | entry |
//! | [`METRIC_EXITS`](crate::METRIC_EXITS) = 8 | hooked exits | exit handler |
//! | [`METRIC_UNWOUND`](crate::METRIC_UNWOUND) = 16 | activations closed as unwound | entry, exit handler |
//! | [`METRIC_UNHOOKED`](crate::METRIC_UNHOOKED) = 24 | entries not hooked | entry |
//! | [`METRIC_NESTING`] = 32 | open hooked activations of this function on this thread | entry, exit |
//! | [`METRIC_SEQ`] = 40 | seqlock: odd while a start or stop is being written | start, stop |
//! | [`METRIC_WALL_TOTAL`] = 48 | closed wall time, ns | stop |
//! | [`METRIC_WALL_START`] = 56 | wall clock at the start, ns; 0 = not running | start, stop |
//! | [`METRIC_CPU_TOTAL`] = 64 | closed thread CPU time, ns | stop |
//! | [`METRIC_CPU_START`] = 72 | thread CPU clock at the start, ns; 0 = not running | start, stop |
//!
//! [`TIMER_METRIC_LEN`] = 80 bytes per function (the plain exit-hook layout
//! uses the first [`METRIC_LEN`](crate::METRIC_LEN) = 32). Only the owning
//! thread writes them.
//!
//! # Start and stop
//!
//! ```text
//! open (entry, once the return is redirected):
//!     nesting += 1
//!     if nesting == 1: seq += 1 ; wall_start = wall_now() ; cpu_start = cpu_now() ; seq += 1
//! close (hooked exit, or an activation closed as unwound, at that moment):
//!     if nesting == 1: seq += 1
//!                      cpu_total += cpu_now() - cpu_start ; cpu_start = 0
//!                      wall_total += wall_now() - wall_start ; wall_start = 0
//!                      seq += 1
//!     if nesting > 0: nesting -= 1
//! ```
//!
//! Recursion and re-entry time the outermost activation only (inclusive
//! time). The CPU interval lies inside the wall interval (wall read first at
//! the start, last at the stop). A difference that would be negative (it
//! cannot be with these clocks) counts 0. `nesting` is raised *before* the
//! start and lowered *after* the stop, each with one read-modify-write
//! instruction: a signal handler that runs the same function in between sees
//! `nesting > 1` and leaves the timer alone, so the seqlock never has two
//! writers. A start with no CPU clock for the thread (the row's CPU state
//! pointer is 0) leaves `cpu_start` at 0 and that activation has no CPU
//! time; likewise a clock reading of exactly 0 means "not started".
//!
//! # Memory ordering
//!
//! x86-64 (TSO) makes stores visible in program order and does not reorder
//! loads with loads, so the writer's plain stores `seq` (odd), fields, `seq`
//! (even) and a reader's plain loads `seq`, fields, `seq` form a correct
//! seqlock with compiler barriers only; the generated code is straight-line
//! stores. Readers use [`read_timer_words`] (which retries on an odd or
//! changed `seq`) and [`timer_value`].
//!
//! # Clock timelines
//!
//! Wall: the runtime's `WallClock`, CLOCK_MONOTONIC nanoseconds (calibrated
//! TSC or CLOCK_MONOTONIC itself): a reader in another process uses the same
//! `WallClock` parameters (from the shared region) or `CLOCK_MONOTONIC`.
//! CPU: `ThreadCpuClock` values are on the `CLOCK_THREAD_CPUTIME_ID` timeline
//! in all three modes (anchor mode adds TSC deltas to a
//! CLOCK_THREAD_CPUTIME_ID anchor; perf-time mode adds the offset between the
//! two measured at creation; syscall mode reads it). That timeline is the
//! kernel's `sum_exec_runtime`, which is also the first field of
//! `/proc/PID/task/TID/schedstat`, so the injector's outside reading of a
//! running thread (which lags by the not-yet-accounted part of its current
//! run) can be subtracted from `cpu_start`.
//!
//! # Generated code and register contracts
//!
//! The start and stop are two local subroutines emitted into each entry
//! snippet (which needs both: it closes stale activations) and into the exit
//! handler (stop only), called with `call rel32`:
//!
//! * input: `rcx` = the thread's row, `rdi` = the metric base (sign-extended);
//! * preserved: `rax`, `rcx`, `rdx`, `rsi`, `r8`, `rbx` and every other
//!   register not listed next;
//! * clobbered: `rdi`, `r9`, `r10`, `r11`, flags (their callers, the entry
//!   snippet and the exit handler, save `r9`-`r11` once when timers are on,
//!   and restore the flags as they always do).
//!
//! Stack: 48 bytes of saves, the clock call's return address and up to 16
//! bytes inside the wall clock's CLOCK_MONOTONIC fallback. The clock readers
//! need no stack alignment and use no vector or x87 register, so `xmm0`,
//! `xmm1` and `st0` return values survive untouched.

use iced_x86::code_asm::*;

/// Offset from a metric base of the number of open hooked activations of
/// the function on the thread (u64).
pub const METRIC_NESTING: i32 = 32;
/// Offset from a metric base of the timer seqlock (u64): odd while a start
/// or stop is being written.
pub const METRIC_SEQ: i32 = 40;
/// Offset from a metric base of the closed wall time, ns (u64).
pub const METRIC_WALL_TOTAL: i32 = 48;
/// Offset from a metric base of the wall clock at the outermost activation's
/// start, ns (u64); 0 while not running.
pub const METRIC_WALL_START: i32 = 56;
/// Offset from a metric base of the closed thread CPU time, ns (u64).
pub const METRIC_CPU_TOTAL: i32 = 64;
/// Offset from a metric base of the thread CPU clock at the outermost
/// activation's start, ns (u64); 0 while not running (or no CPU clock).
pub const METRIC_CPU_START: i32 = 72;
/// Bytes of row used per metric base when timers are on.
pub const TIMER_METRIC_LEN: i32 = 80;

/// Which clocks the timers read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timers {
    /// Wall time (`weft_rt_wall_now`).
    pub wall: bool,
    /// Thread CPU time (`weft_rt_cpu_now`).
    pub cpu: bool,
}

impl Timers {
    /// Neither clock: exit hooks behave exactly as without timers.
    pub const NONE: Timers = Timers {
        wall: false,
        cpu: false,
    };

    /// Whether any clock is selected.
    pub fn any(&self) -> bool {
        self.wall || self.cpu
    }
}

/// Where generated timer code finds the clocks (addresses in the target).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerSpec {
    /// Which clocks to read.
    pub timers: Timers,
    /// Absolute address of `weft_rt_wall_now` (used when `timers.wall`).
    pub wall_fn: u64,
    /// Absolute address of the process's `WallClock` state, passed in `rdi`.
    pub wall_state: u64,
    /// Absolute address of `weft_rt_cpu_now` (used when `timers.cpu`).
    pub cpu_fn: u64,
    /// Row byte offset of the word holding this thread's `*mut
    /// ThreadCpuClock` (0 in the row: no CPU clock for this thread, CPU time
    /// is skipped).
    pub cpu_state_row_offset: i32,
}

fn m(base: AsmRegister64, off: i32) -> AsmMemoryOperand {
    qword_ptr(base + i64::from(off))
}

/// `sub rax, [rbx + start]`, clamped at 0, then `add [rbx + total], rax`.
fn accumulate(a: &mut CodeAssembler, start: i32, total: i32) -> Result<(), IcedError> {
    let mut ok = a.create_label();
    a.sub(rax, m(rbx, start))?;
    a.jae(ok)?;
    a.xor(eax, eax)?;
    a.set_label(&mut ok)?;
    a.add(m(rbx, total), rax)?;
    Ok(())
}

/// Saved by the subroutines around the clock calls (`rcx` must stay at
/// [`SAVED_RCX`] from the top).
const SAVED: [AsmRegister64; 6] = [rax, rcx, rdx, rsi, r8, rbx];
/// `[rsp + SAVED_RCX]` = the caller's `rcx` (the row) once `SAVED` is pushed.
const SAVED_RCX: i32 = 32;

fn save(a: &mut CodeAssembler) -> Result<(), IcedError> {
    for r in SAVED {
        a.push(r)?;
    }
    Ok(())
}

fn restore(a: &mut CodeAssembler) -> Result<(), IcedError> {
    for r in SAVED.iter().rev() {
        a.pop(*r)?;
    }
    Ok(())
}

/// `rdi` = this thread's CPU state from the row saved at `[rsp + SAVED_RCX]`;
/// jumps to `skip` when it is null.
fn load_cpu_state(
    a: &mut CodeAssembler,
    spec: &TimerSpec,
    skip: CodeLabel,
) -> Result<(), IcedError> {
    a.mov(rdi, qword_ptr(rsp + SAVED_RCX))?;
    a.mov(rdi, m(rdi, spec.cpu_state_row_offset))?;
    a.test(rdi, rdi)?;
    a.jz(skip)
}

fn call_abs(a: &mut CodeAssembler, target: u64) -> Result<(), IcedError> {
    a.mov(rax, target)?;
    a.call(rax)
}

/// Emits the start subroutine at `label` (see the module docs for the
/// contract).
pub(crate) fn emit_open(
    a: &mut CodeAssembler,
    spec: &TimerSpec,
    label: &mut CodeLabel,
) -> Result<(), IcedError> {
    let mut ret = a.create_label();
    let mut no_cpu = a.create_label();
    a.set_label(label)?;
    a.inc(qword_ptr(rcx + rdi + i64::from(METRIC_NESTING)))?;
    a.cmp(qword_ptr(rcx + rdi + i64::from(METRIC_NESTING)), 1)?;
    a.jne(ret)?;
    save(a)?;
    a.lea(rbx, qword_ptr(rcx + rdi))?;
    a.inc(m(rbx, METRIC_SEQ))?;
    if spec.timers.wall {
        a.mov(rdi, spec.wall_state)?;
        call_abs(a, spec.wall_fn)?;
        a.mov(m(rbx, METRIC_WALL_START), rax)?;
    }
    if spec.timers.cpu {
        load_cpu_state(a, spec, no_cpu)?;
        call_abs(a, spec.cpu_fn)?;
        a.mov(m(rbx, METRIC_CPU_START), rax)?;
    }
    a.set_label(&mut no_cpu)?;
    a.inc(m(rbx, METRIC_SEQ))?;
    restore(a)?;
    a.set_label(&mut ret)?;
    a.ret()
}

/// Emits the stop subroutine at `label` (see the module docs for the
/// contract).
pub(crate) fn emit_close(
    a: &mut CodeAssembler,
    spec: &TimerSpec,
    label: &mut CodeLabel,
) -> Result<(), IcedError> {
    let mut ret = a.create_label();
    let mut dec = a.create_label();
    let mut no_cpu = a.create_label();
    let mut no_wall = a.create_label();
    a.set_label(label)?;
    a.cmp(qword_ptr(rcx + rdi + i64::from(METRIC_NESTING)), 1)?;
    a.jb(ret)?; // nothing open: never underflow
    a.ja(dec)?; // an outer activation of the same function is still open
    save(a)?;
    a.lea(rbx, qword_ptr(rcx + rdi))?;
    a.inc(m(rbx, METRIC_SEQ))?;
    if spec.timers.cpu {
        a.cmp(m(rbx, METRIC_CPU_START), 0)?;
        a.je(no_cpu)?;
        load_cpu_state(a, spec, no_cpu)?;
        call_abs(a, spec.cpu_fn)?;
        accumulate(a, METRIC_CPU_START, METRIC_CPU_TOTAL)?;
        a.set_label(&mut no_cpu)?;
        a.mov(m(rbx, METRIC_CPU_START), 0)?;
    }
    if spec.timers.wall {
        a.cmp(m(rbx, METRIC_WALL_START), 0)?;
        a.je(no_wall)?;
        a.mov(rdi, spec.wall_state)?;
        call_abs(a, spec.wall_fn)?;
        accumulate(a, METRIC_WALL_START, METRIC_WALL_TOTAL)?;
        a.set_label(&mut no_wall)?;
        a.mov(m(rbx, METRIC_WALL_START), 0)?;
    }
    a.inc(m(rbx, METRIC_SEQ))?;
    a.dec(m(rbx, METRIC_NESTING))?;
    restore(a)?;
    a.ret()?;
    a.set_label(&mut dec)?;
    a.dec(qword_ptr(rcx + rdi + i64::from(METRIC_NESTING)))?;
    a.set_label(&mut ret)?;
    a.ret()
}

/// A consistent copy of one function's timer words (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TimerWords {
    /// Open hooked activations (informational: not covered by the seqlock).
    pub nesting: u64,
    /// The (even) seqlock value the copy was taken at.
    pub seq: u64,
    /// Closed wall time, ns.
    pub wall_total: u64,
    /// Wall clock at the running activation's start, or 0.
    pub wall_start: u64,
    /// Closed CPU time, ns.
    pub cpu_total: u64,
    /// CPU clock at the running activation's start, or 0.
    pub cpu_start: u64,
}

/// Takes a consistent copy of a function's timer words, seqlock-style:
/// `seq`, the fields, `seq` again, retrying while `seq` is odd (a start or
/// stop is being written) or changed. `load(offset)` must return the live
/// word at `metric base + offset` with one aligned 8-byte load that the
/// compiler neither elides nor reorders with the others (`read_volatile`,
/// or an atomic load). Gives up with `None` after `max_attempts` tries (a
/// writer can be descheduled, or killed, between its two `seq` stores).
///
/// Correct as is on x86-64, where loads are not reordered with loads.
pub fn read_timer_words(mut load: impl FnMut(i32) -> u64, max_attempts: u32) -> Option<TimerWords> {
    use core::sync::atomic::{compiler_fence, Ordering};
    for _ in 0..max_attempts {
        let seq = load(METRIC_SEQ);
        if seq & 1 != 0 {
            core::hint::spin_loop();
            continue;
        }
        compiler_fence(Ordering::SeqCst);
        let words = TimerWords {
            nesting: load(METRIC_NESTING),
            seq,
            wall_total: load(METRIC_WALL_TOTAL),
            wall_start: load(METRIC_WALL_START),
            cpu_total: load(METRIC_CPU_TOTAL),
            cpu_start: load(METRIC_CPU_START),
        };
        compiler_fence(Ordering::SeqCst);
        if load(METRIC_SEQ) == seq {
            return Some(words);
        }
        core::hint::spin_loop();
    }
    None
}

/// A function's timer values on one thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TimerValue {
    /// Wall time, ns: closed total plus, while running, `wall_now - start`.
    pub wall_ns: u64,
    /// CPU time, ns: closed total plus, while running and when the thread's
    /// CPU time was given, `cpu_now - start`.
    pub cpu_ns: u64,
    /// An outermost activation is open and started.
    pub running: bool,
}

/// Computes the timer values from a consistent copy ([`read_timer_words`]).
///
/// `wall_now` is the reader's own wall clock (the same `WallClock`, or
/// CLOCK_MONOTONIC); `cpu_now` the thread's current CPU time on the
/// CLOCK_THREAD_CPUTIME_ID timeline (`/proc/PID/task/TID/schedstat`'s first
/// field, or `clock_gettime` on `pthread_getcpuclockid`), `None` to count
/// closed CPU time only. Read both *before* the words: a running timer's
/// value then never exceeds what its stop will record, except by the few
/// nanoseconds a clock read can be reordered with the seqlock stores, or the
/// small disagreement between the thread's own CPU clock and the kernel's
/// accounting; a reader that needs a non-decreasing series keeps the maximum
/// of its readings.
pub fn timer_value(words: &TimerWords, wall_now: u64, cpu_now: Option<u64>) -> TimerValue {
    let mut v = TimerValue {
        wall_ns: words.wall_total,
        cpu_ns: words.cpu_total,
        running: words.wall_start != 0 || words.cpu_start != 0,
    };
    if words.wall_start != 0 {
        v.wall_ns = v
            .wall_ns
            .wrapping_add(wall_now.saturating_sub(words.wall_start));
    }
    if let (true, Some(now)) = (words.cpu_start != 0, cpu_now) {
        v.cpu_ns = v.cpu_ns.wrapping_add(now.saturating_sub(words.cpu_start));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seqlock_reader_retries_and_values() {
        // Words at metric base 0 in a little row; seq goes odd then even
        // across loads, as a writer racing the reader would make it.
        let mut row = [0u64; 10];
        row[(METRIC_NESTING / 8) as usize] = 1;
        row[(METRIC_WALL_TOTAL / 8) as usize] = 1000;
        row[(METRIC_WALL_START / 8) as usize] = 5000;
        row[(METRIC_CPU_TOTAL / 8) as usize] = 300;
        row[(METRIC_CPU_START / 8) as usize] = 7000;
        let mut seqs = [1u64, 2, 4, 4, 4].into_iter();
        let mut last_seq = 0;
        let w = read_timer_words(
            |off| {
                if off == METRIC_SEQ {
                    last_seq = seqs.next().unwrap_or(last_seq);
                    last_seq
                } else {
                    row[(off / 8) as usize]
                }
            },
            10,
        )
        .unwrap();
        assert_eq!(w.seq, 4);
        let v = timer_value(&w, 5600, Some(7050));
        assert_eq!(
            v,
            TimerValue {
                wall_ns: 1600,
                cpu_ns: 350,
                running: true
            }
        );
        assert_eq!(timer_value(&w, 5600, None).cpu_ns, 300);
        // A clock behind the start counts nothing.
        assert_eq!(timer_value(&w, 10, Some(10)).wall_ns, 1000);
        // Not running: totals only.
        let idle = TimerWords {
            wall_start: 0,
            cpu_start: 0,
            ..w
        };
        let v = timer_value(&idle, u64::MAX, Some(u64::MAX));
        assert_eq!((v.wall_ns, v.cpu_ns, v.running), (1000, 300, false));
        // A writer stuck in the middle: give up.
        assert_eq!(read_timer_words(|_| 3, 5), None);
    }
}
