//! Per-thread, per-function inclusive timers on top of exit hooks.
//!
//! When an [`ExitHooks`](crate::ExitHooks) layout carries a [`TimerSpec`]
//! ([`ExitHooks::with_timers`](crate::ExitHooks::with_timers)), the entry
//! snippet of [`Snippet::CountCallHookExit`](crate::Snippet) starts the
//! function's timer once the activation is pushed, and the exit code stops
//! it when the activation closes (a hooked exit, or an activation closed as
//! unwound, at that moment).
//!
//! # Raw readings, converted once
//!
//! A start stores the *raw* clock reading: the TSC when it is the wall
//! clock ([`WallRead::Tsc`], read inline with `rdtsc`), else whatever the
//! runtime's wall routine returns (CLOCK_MONOTONIC ns). The thread's CPU
//! clock is read in the same ticks: while the thread's anchor holds (no
//! context switch since, see the runtime's `ThreadCpuClock`) it is `tsc +
//! ticks_offset`, computed inline from the same `rdtsc`; otherwise the
//! runtime's slow path returns it. A stop converts the *difference* to
//! nanoseconds with one `mul` by the 32.32 fixed-point factor
//! [`TimerSpec::ns_per_tick_q32`] and adds it to the total. One `rdtsc`
//! serves both clocks at each end.
//!
//! # Words per function (at its metric base `m`, a row byte offset)
//!
//! | offset from `m` | word | written by |
//! |---|---|---|
//! | [`METRIC_ENTRIES`](crate::METRIC_ENTRIES) = 0 | entries | entry |
//! | [`METRIC_EXITS`](crate::METRIC_EXITS) = 8 | hooked exits | exit handler |
//! | [`METRIC_UNWOUND`](crate::METRIC_UNWOUND) = 16 | activations closed as unwound | exit code |
//! | [`METRIC_UNHOOKED`](crate::METRIC_UNHOOKED) = 24 | entries not hooked | entry |
//! | [`METRIC_NESTING`] = 32 | open hooked activations of this function on this thread | entry, exit |
//! | [`METRIC_SEQ`] = 40 | seqlock: odd while a start or stop is being written | start, stop |
//! | [`METRIC_WALL_TOTAL`] = 48 | closed wall time, ns | stop |
//! | [`METRIC_WALL_START`] = 56 | raw wall clock at the start; 0 = not running | start, stop |
//! | [`METRIC_CPU_TOTAL`] = 64 | closed thread CPU time, ns | stop |
//! | [`METRIC_CPU_START`] = 72 | raw CPU clock (ticks) at the start; 0 = not running (or no CPU clock) | start, stop |
//! | [`METRIC_SELF_TOTAL`] = 80 | closed self (exclusive) wall time, ns, every activation | stop |
//! | [`METRIC_HIST`] = 88 … 407 | with a histogram only: [`HIST_BUCKETS`] counts of outermost activations per `floor(log2(wall ns))` | stop |
//!
//! [`TIMER_METRIC_LEN`] = 88 bytes per function, [`TIMER_HIST_METRIC_LEN`]
//! = 408 with a histogram (the plain exit-hook layout uses the first
//! [`METRIC_LEN`](crate::METRIC_LEN) = 32). Only the owning thread writes
//! them.
//!
//! # Self time
//!
//! The thread's row has one more word, `N` ([`TimerSpec::self_ticks_row`]):
//! the self ticks of every timed activation of the thread closed so far.
//! Each activation's cell keeps `t0 - N` ([`CELL_SELF_BASE`](crate::CELL_SELF_BASE));
//! its stop takes `self = (t - N) - (t0 - N0)` — its time less the self
//! times of the activations closed inside it, which add up to their
//! inclusive times — adds it to `N` and to the function's total. Every
//! activation does, recursive ones too, so a nested entry or exit of the
//! same function now reads the clock (it did not before).
//!
//! # Start and stop
//!
//! ```text
//! start (entry, once the activation is pushed):
//!     nesting += 1
//!     if nesting == 1: seq += 1 ; raw = clock ; cpu_start = cpu(raw)
//!                      if cpu(raw) took the slow path: raw = clock (again)
//!                      wall_start = raw ; cell.self_base = raw - N ; seq += 1
//!     else:            raw = clock ; cell.self_base = raw - N
//! stop (an activation closes, at that moment):
//!     if nesting == 0: return
//!     seq += 1 ; raw = clock
//!     self = (raw - N) - cell.self_base ; N += self ; self_total += ns(max(self, 0))
//!     if nesting == 1: cpu_total += ns(cpu(raw) - cpu_start) ; cpu_start = 0
//!                      wall_total += ns(raw - wall_start) ; wall_start = 0
//!                      if cell has CELL_HISTOGRAM: hist[min(bsr(wall ns), 39)] += 1
//!     seq += 1 ; nesting -= 1
//! ```
//!
//! Recursion and re-entry time the outermost activation only (inclusive
//! time). A difference that would be negative counts 0. `nesting` is raised
//! *before* the start and lowered *after* the stop, each with one
//! read-modify-write instruction: a signal handler that runs the same
//! function in between sees `nesting > 1` and leaves the timer alone, so
//! the seqlock never has two writers. A start with no CPU clock for the
//! thread (the row's CPU state pointer is 0) leaves `cpu_start` at 0 and
//! that activation has no CPU time.
//!
//! # Memory ordering
//!
//! x86-64 (TSO) makes stores visible in program order and does not reorder
//! loads with loads, so the writer's plain stores `seq` (odd), fields, `seq`
//! (even) and a reader's plain loads `seq`, fields, `seq` form a correct
//! seqlock with compiler barriers only. Readers use
//! [`read_timer_words`](crate::read_timer_words)
//! (which retries on an odd or changed `seq`) and
//! [`timer_value`](crate::timer_value), defined with the layout in `weft-abi`.
//!
//! # Registers
//!
//! The start is inline in the entry snippet (it uses `rax`, `rdx`, `r8`,
//! which the snippet saved, and `rdi` = the cell). The stop is a subroutine
//! of the exit code, called with `r8` = the function's words, `rcx` = the
//! row and `rdi` = the cell; it clobbers `rax`, `rdx`, `rdi`, `r9` and the
//! flags. The runtime's clock routines
//! preserve every register but `rax`; no vector or x87 register is touched,
//! so `xmm0`, `xmm1` and `st0` return values survive.

use iced_x86::code_asm::*;

use crate::cells::CELL_HISTOGRAM;
use crate::disp;
use crate::slow_paths::SlowPaths;
use weft_abi::clock as abi_clock;
use weft_abi::layout::metric;

/// Offset from a metric base of the number of open hooked activations of
/// the function on the thread (u64).
pub const METRIC_NESTING: i32 = disp(metric::NESTING);
/// Offset from a metric base of the timer seqlock (u64): odd while a start
/// or stop is being written.
pub const METRIC_SEQ: i32 = disp(metric::SEQ);
/// Offset from a metric base of the closed wall time, ns (u64).
pub const METRIC_WALL_TOTAL: i32 = disp(metric::WALL_TOTAL);
/// Offset from a metric base of the raw wall clock at the outermost
/// activation's start (u64); 0 while not running.
pub const METRIC_WALL_START: i32 = disp(metric::WALL_START);
/// Offset from a metric base of the closed thread CPU time, ns (u64).
pub const METRIC_CPU_TOTAL: i32 = disp(metric::CPU_TOTAL);
/// Offset from a metric base of the raw thread CPU clock (ticks) at the
/// outermost activation's start (u64); 0 while not running (or no CPU
/// clock).
pub const METRIC_CPU_START: i32 = disp(metric::CPU_START);
/// Offset from a metric base of the closed self (exclusive) wall time, ns
/// (u64): every closed activation's time less that of the timed
/// activations closed inside it.
pub const METRIC_SELF_TOTAL: i32 = disp(metric::SELF_TOTAL);
/// Bytes of row used per metric base when timers are on.
pub const TIMER_METRIC_LEN: i32 = disp(metric::TIMED_LEN);
/// Latency histogram buckets of a function with one (see
/// [`ExitHooks::with_histogram`](crate::ExitHooks::with_histogram)).
pub const HIST_BUCKETS: usize = metric::HIST_BUCKETS;
/// Offset from a metric base of histogram bucket 0 (u64 words).
pub const METRIC_HIST: i32 = disp(metric::HIST);
/// Bytes of row used per metric base with timers and a histogram.
pub const TIMER_HIST_METRIC_LEN: i32 = disp(metric::TIMED_HIST_LEN);

/// Which clocks the timers read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timers {
    /// Wall time.
    pub wall: bool,
    /// Thread CPU time.
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

/// How generated code reads the raw wall clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WallRead {
    /// `rdtsc`, inline (the TSC is invariant and is the wall clock).
    Tsc,
    /// A call to a routine at `routine` with `rax` = `state`, returning the
    /// raw reading in `rax` and preserving every other register (the
    /// runtime's `weft_rt_wall_raw`).
    Call {
        /// Address of the routine.
        routine: u64,
        /// Address of its clock state.
        state: u64,
    },
}

/// Where the thread's CPU clock state is and how it is laid out: the
/// runtime's `ThreadCpuClock`, read inline in anchor mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuClockLayout {
    /// Row byte offset of the word holding this thread's `*mut
    /// ThreadCpuClock` (0 in the row: no CPU clock, CPU time is skipped).
    pub row_offset: i32,
    /// The slow-path routine (`weft_rt_cpu_ticks`): `rdx` = clock, `rax` =
    /// raw wall reading → `rax` = CPU ticks; preserves every other register.
    pub slow_path: u64,
    /// Offset in the clock of the perf page pointer.
    pub page: i32,
    /// Offset in the clock of the page `lock` the anchor was taken at (u32).
    pub anchor_lock: i32,
    /// Offset in the clock of the TSC at the anchor.
    pub anchor_tsc: i32,
    /// Offset in the clock of the anchor's maximum age in ticks (0: never
    /// take the fast path).
    pub max_age: i32,
    /// Offset in the clock of `ticks_offset` (CPU ticks = `tsc +
    /// ticks_offset` while the anchor holds).
    pub ticks_offset: i32,
    /// Offset in the perf page of its `lock` (u32).
    pub page_lock: i32,
}

impl CpuClockLayout {
    /// The offsets of `weft-rt`'s `ThreadCpuClock` (`weft_abi::clock`,
    /// which the runtime checks against its type); `row_offset` and
    /// `slow_path` must be filled in.
    pub const WEFT_RT: CpuClockLayout = CpuClockLayout {
        row_offset: 0,
        slow_path: 0,
        page: disp(abi_clock::CPU_OFF_PAGE),
        anchor_lock: disp(abi_clock::CPU_OFF_ANCHOR_LOCK),
        anchor_tsc: disp(abi_clock::CPU_OFF_ANCHOR_TSC),
        max_age: disp(abi_clock::CPU_OFF_MAX_AGE),
        ticks_offset: disp(abi_clock::CPU_OFF_TICKS_OFFSET),
        page_lock: disp(abi_clock::PAGE_OFF_LOCK),
    };
}

/// What the generated timer code reads and how it converts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerSpec {
    /// Which clocks to read.
    pub timers: Timers,
    /// How to read the raw wall clock (also needed for the CPU clock).
    pub wall: WallRead,
    /// The CPU clock (used when `timers.cpu`).
    pub cpu: CpuClockLayout,
    /// Nanoseconds per raw tick, 32.32 fixed point: `ns = (ticks * q32) >>
    /// 32`.
    pub ns_per_tick_q32: u64,
    /// Row byte offset of the thread's self-ticks word (u64, see the
    /// module docs).
    pub self_ticks_row: i32,
}

fn m(base: AsmRegister64, off: i32) -> AsmMemoryOperand {
    qword_ptr(base + i64::from(off))
}

/// The raw wall reading into `rax` (clobbers `rdx` with `rdtsc`).
fn read_raw(
    a: &mut CodeAssembler,
    spec: &TimerSpec,
    lits: &mut SlowPaths,
) -> Result<(), IcedError> {
    read_wall(a, spec.wall, lits)
}

/// The raw wall reading `wall` into `rax` (clobbers `rdx` with `rdtsc`;
/// the runtime's routine preserves every register but `rax`).
pub(crate) fn read_wall(
    a: &mut CodeAssembler,
    wall: WallRead,
    lits: &mut SlowPaths,
) -> Result<(), IcedError> {
    match wall {
        WallRead::Tsc => {
            a.rdtsc()?;
            a.shl(rdx, 32)?;
            a.or(rax, rdx)
        }
        WallRead::Call { routine, state } => {
            a.mov(rax, state)?;
            let lit = lits.literal(a, routine);
            a.call(qword_ptr(lit))
        }
    }
}

/// The CPU clock in ticks into `rax`, from the raw reading in `rax`; `rdx`
/// = the clock (non-null), `tmp` a scratch register. Falls back to the
/// runtime's slow path when the anchor does not hold.
fn read_cpu(
    a: &mut CodeAssembler,
    spec: &TimerSpec,
    tmp: AsmRegister64,
    tmp32: AsmRegister32,
    lits: &mut SlowPaths,
) -> Result<(), IcedError> {
    let c = spec.cpu;
    let mut have = a.create_label();
    let slow = lits.call_then_back(a, c.slow_path, have);
    a.mov(tmp, rax)?;
    a.sub(tmp, m(rdx, c.anchor_tsc))?;
    a.cmp(tmp, m(rdx, c.max_age))?;
    a.jae(slow)?;
    a.mov(tmp, m(rdx, c.page))?;
    a.mov(tmp32, dword_ptr(tmp + i64::from(c.page_lock)))?;
    a.cmp(tmp32, dword_ptr(rdx + i64::from(c.anchor_lock)))?;
    a.jne(slow)?;
    a.add(rax, m(rdx, c.ticks_offset))?;
    a.set_label(&mut have)
}

/// Emits the timer start inline (entry snippet: `rcx` = row, `rdi` = the
/// activation's cell; `rax`, `rdx`, `r8` free; the function's words at
/// `rcx + metric`).
///
/// The outermost start reads the CPU clock *before* it fixes the wall
/// start: when the thread's anchor does not hold (the first timed call
/// after a context switch, e.g. a handler called right after a blocking
/// `read`), the runtime's slow path re-anchors with a CPU clock system
/// call (~1 µs on a KVM guest), and the wall clock is read again after it
/// so that this cost is not charged to the call. A stop reads the wall
/// clock first: its slow path falls after the wall stop too.
pub(crate) fn emit_start(
    a: &mut CodeAssembler,
    spec: &TimerSpec,
    metric: i32,
    lits: &mut SlowPaths,
) -> Result<(), IcedError> {
    let w = |off: i32| qword_ptr(rcx + (i64::from(metric) + i64::from(off)));
    let mut nested = a.create_label();
    let mut started = a.create_label();
    let mut have_raw = a.create_label();
    let self_base = |a: &mut CodeAssembler| -> Result<(), IcedError> {
        a.sub(rax, m(rcx, spec.self_ticks_row))?;
        a.mov(m(rdi, crate::cells::CELL_SELF_BASE), rax)
    };
    a.inc(w(METRIC_NESTING))?;
    a.cmp(w(METRIC_NESTING), 1)?;
    a.jne(nested)?;
    a.inc(w(METRIC_SEQ))?;
    read_raw(a, spec, lits)?;
    if spec.timers.cpu {
        let c = spec.cpu;
        let mut have_cpu = a.create_label();
        let slow = start_slow_path(a, spec, have_cpu, lits);
        a.mov(rdx, m(rcx, c.row_offset))?;
        a.test(rdx, rdx)?;
        a.jz(have_raw)?;
        a.mov(r8, rax)?;
        a.sub(r8, m(rdx, c.anchor_tsc))?;
        a.cmp(r8, m(rdx, c.max_age))?;
        a.jae(slow)?;
        a.mov(r8, m(rdx, c.page))?;
        a.mov(r8d, dword_ptr(r8 + i64::from(c.page_lock)))?;
        a.cmp(r8d, dword_ptr(rdx + i64::from(c.anchor_lock)))?;
        a.jne(slow)?;
        a.mov(r8, rax)?;
        a.add(rax, m(rdx, c.ticks_offset))?;
        // rax = CPU ticks, r8 = the raw wall reading (from the slow path
        // too, read after it).
        a.set_label(&mut have_cpu)?;
        a.mov(w(METRIC_CPU_START), rax)?;
        a.mov(rax, r8)?;
    }
    a.set_label(&mut have_raw)?;
    if spec.timers.wall {
        a.mov(w(METRIC_WALL_START), rax)?;
    }
    // The self base is the wall start's reading: a call's self time never
    // starts before its wall time.
    self_base(a)?;
    a.inc(w(METRIC_SEQ))?;
    a.jmp(started)?;
    // Every activation, recursive ones too, has its own self time: its
    // base is taken at each entry (the only clock read a nested entry
    // makes).
    a.set_label(&mut nested)?;
    read_raw(a, spec, lits)?;
    self_base(a)?;
    a.set_label(&mut started)
}

/// The outermost start's slow path (`rdx` = the clock): the runtime's
/// routine (re-anchoring after a context switch), then the raw wall clock
/// again, into `r8`; `rax` = the CPU ticks at that fresh reading when the
/// new anchor holds (the routine's value is from before its own return
/// and the re-read, which the CPU time would count and the wall time
/// not), else the routine's. Jumps back to `back`; clobbers `rdx`.
fn start_slow_path(
    a: &mut CodeAssembler,
    spec: &TimerSpec,
    back: CodeLabel,
    lits: &mut SlowPaths,
) -> CodeLabel {
    let c = spec.cpu;
    let wall = spec.wall;
    let routine = lits.literal(a, c.slow_path);
    let wall_routine = match wall {
        WallRead::Tsc => None,
        WallRead::Call { routine, .. } => Some(lits.literal(a, routine)),
    };
    lits.block(
        a,
        Box::new(move |a: &mut CodeAssembler| {
            a.call(qword_ptr(routine))?;
            a.mov(r8, rax)?;
            match (wall, wall_routine) {
                (WallRead::Call { state, .. }, Some(wall_routine)) => {
                    a.mov(rax, state)?;
                    a.call(qword_ptr(wall_routine))?;
                }
                _ => {
                    a.rdtsc()?;
                    a.shl(rdx, 32)?;
                    a.or(rax, rdx)?;
                }
            }
            a.xchg(rax, r8)?;
            let mut keep = a.create_label();
            a.push(rax)?;
            // The pointer again (the call clobbered `rdx`): 0 now if weft
            // paused the clock meanwhile (`WHY_CPU_PAUSED`), and then the
            // routine's value stands.
            a.mov(rdx, m(rcx, c.row_offset))?;
            a.test(rdx, rdx)?;
            a.jz(keep)?;
            a.mov(rax, r8)?;
            a.sub(rax, m(rdx, c.anchor_tsc))?;
            a.cmp(rax, m(rdx, c.max_age))?;
            a.jae(keep)?;
            a.mov(rax, m(rdx, c.page))?;
            a.mov(eax, dword_ptr(rax + i64::from(c.page_lock)))?;
            a.cmp(eax, dword_ptr(rdx + i64::from(c.anchor_lock)))?;
            a.jne(keep)?;
            a.mov(rax, r8)?;
            a.add(rax, m(rdx, c.ticks_offset))?;
            a.mov(qword_ptr(rsp), rax)?;
            a.set_label(&mut keep)?;
            a.pop(rax)?;
            a.jmp(back)
        }),
    )
}

/// `rax` = `rax - [r8 + start]` clamped at 0, in ns, added to `[r8 +
/// total]` (clobbers `rdx`).
fn accumulate(
    a: &mut CodeAssembler,
    start: i32,
    total: i32,
    q32: CodeLabel,
) -> Result<(), IcedError> {
    let mut ok = a.create_label();
    a.sub(rax, m(r8, start))?;
    a.jae(ok)?;
    a.xor(eax, eax)?;
    a.set_label(&mut ok)?;
    a.mul(qword_ptr(q32))?;
    a.shrd(rax, rdx, 32)?;
    a.add(m(r8, total), rax)
}

/// Emits the stop subroutine (see the module docs: `r8` = words, `rcx` =
/// row, `rdi` = the activation's cell; clobbers `rax`, `rdx`, `rdi`, `r9`,
/// flags), its slow paths and its literals. `cells` is the row offset of
/// the address of the thread's first cell.
pub(crate) fn emit_stop(
    a: &mut CodeAssembler,
    spec: &TimerSpec,
    cells: i32,
) -> Result<(), IcedError> {
    use crate::cells::{CELL_CHAIN, CELL_ENTRY_RSP, CELL_FLAGS, CELL_SIZE, CELL_TIMED};
    let mut lits = SlowPaths::new();
    let mut ret = a.create_label();
    let mut inner = a.create_label();
    let mut counted = a.create_label();
    let mut publish = a.create_label();
    let mut published = a.create_label();
    let q32 = lits.literal(a, spec.ns_per_tick_q32);
    let n = m(rcx, spec.self_ticks_row);
    // r9 = the raw reading on return, or 0 when none was taken (a trace
    // event then reads the clock itself).
    a.xor(r9d, r9d)?;
    a.cmp(m(r8, METRIC_NESTING), 1)?;
    a.jb(ret)?; // nothing open: never underflow
    a.inc(m(r8, METRIC_SEQ))?;
    read_raw(a, spec, &mut lits)?;
    // self = (t - N) - (t0 - N0): the activation's time less the self
    // times of the timed activations closed since its start (which are
    // the ones nested in it); one read-modify-write publishes it in N.
    a.mov(r9, rax)?;
    a.sub(rax, n)?;
    a.sub(rax, m(rdi, crate::cells::CELL_SELF_BASE))?;
    // Another tool's timed activation of this same call right below (its
    // probe is chained over this one's: same entry rsp, CELL_CHAIN): this
    // one is not a callee of it, so N is left alone and the time stays
    // that one's self time too.
    // The outermost cell exits at the first branch, any other activation
    // not over a chained one at the second: both flags are in the flags'
    // low byte.
    let below = |off: i32| i64::from(off) - i64::from(CELL_SIZE);
    a.cmp(rdi, m(rcx, cells))?;
    a.jbe(publish)?;
    a.test(byte_ptr(rdi + below(CELL_FLAGS)), CELL_CHAIN as i32)?;
    a.jz(publish)?;
    a.test(byte_ptr(rdi + below(CELL_FLAGS)), CELL_TIMED as i32)?;
    a.jz(publish)?;
    a.mov(rdx, qword_ptr(rdi + below(CELL_ENTRY_RSP)))?;
    a.cmp(rdx, m(rdi, CELL_ENTRY_RSP))?;
    a.je(published)?;
    a.set_label(&mut publish)?;
    a.add(n, rax)?;
    a.set_label(&mut published)?;
    // Negative only when a signal handler's timed calls closed inside the
    // three instructions above: count nothing rather than 2^64 - x.
    a.test(rax, rax)?;
    a.jns(counted)?;
    a.xor(eax, eax)?;
    a.set_label(&mut counted)?;
    a.mul(qword_ptr(q32))?;
    a.shrd(rax, rdx, 32)?;
    a.add(m(r8, METRIC_SELF_TOTAL), rax)?;
    a.cmp(m(r8, METRIC_NESTING), 1)?;
    a.ja(inner)?; // an outer activation of the same function is still open
    if spec.timers.wall {
        let mut no_wall = a.create_label();
        a.cmp(m(r8, METRIC_WALL_START), 0)?;
        a.je(no_wall)?;
        a.mov(rax, r9)?;
        accumulate(a, METRIC_WALL_START, METRIC_WALL_TOTAL, q32)?;
        // rax = this outermost activation's wall ns.
        let mut bucket = a.create_label();
        let mut clamped = a.create_label();
        a.test(
            byte_ptr(rdi + i64::from(crate::cells::CELL_FLAGS)),
            CELL_HISTOGRAM as i32,
        )?;
        a.jz(no_wall)?;
        a.bsr(rdx, rax)?;
        a.jnz(bucket)?;
        a.xor(edx, edx)?; // 0 ns: bucket 0 (bsr leaves rdx undefined)
        a.set_label(&mut bucket)?;
        a.cmp(edx, (HIST_BUCKETS - 1) as i32)?;
        a.jbe(clamped)?;
        a.mov(edx, (HIST_BUCKETS - 1) as u32)?;
        a.set_label(&mut clamped)?;
        a.inc(qword_ptr(r8 + rdx * 8 + i64::from(METRIC_HIST)))?;
        a.set_label(&mut no_wall)?;
        a.mov(m(r8, METRIC_WALL_START), 0)?;
    }
    if spec.timers.cpu {
        let mut no_cpu = a.create_label();
        a.cmp(m(r8, METRIC_CPU_START), 0)?;
        a.je(no_cpu)?;
        a.mov(rdx, m(rcx, spec.cpu.row_offset))?;
        a.test(rdx, rdx)?;
        a.jz(no_cpu)?;
        a.mov(rax, r9)?;
        read_cpu(a, spec, rdi, edi, &mut lits)?;
        accumulate(a, METRIC_CPU_START, METRIC_CPU_TOTAL, q32)?;
        a.set_label(&mut no_cpu)?;
        a.mov(m(r8, METRIC_CPU_START), 0)?;
    }
    a.set_label(&mut inner)?;
    a.inc(m(r8, METRIC_SEQ))?;
    a.dec(m(r8, METRIC_NESTING))?;
    a.set_label(&mut ret)?;
    a.ret()?;
    lits.emit(a)
}
