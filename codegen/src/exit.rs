//! Exit hooks by *calling through*: the trampoline of a timed function calls
//! the function's body, so the exit runs when the body returns.
//!
//! # Mechanism
//!
//! At an instrumented entry ([`Snippet::CountCallHookExit`](crate::Snippet))
//! the trampoline pushes an *activation* on the thread's activation stack:
//! the next free *cell* gets the original return address (RA), the entry
//! `rsp` (the RA's address, `E`), the function's metric base and flags.
//! Then it restores every register and the flags, drops the RA from the
//! stack and jumps to the function's *call record* in the runtime:
//!
//! ```text
//! record:  call qword [rip + target]    ; target = the trampoline's copy of the
//!                                       ; displaced instructions, then the body
//!          jmp  qword [rip + handler]   ; the exit handler (exit_code)
//! ```
//!
//! The record's `call` puts its return point where the RA was, so the body
//! finds its stack arguments exactly where the caller put them. Both returns
//! are predicted: the body's `ret` goes back to the record that called it,
//! and the exit handler's final `ret` to the original caller, whose
//! return-stack entry nothing consumed. (Return-address redirection, the
//! alternative, costs two mispredictions per call.)
//!
//! The body sees every register, the flags and the stack (but the RA) as
//! its caller left them: nothing is passed to it, whatever its ABI (Go's
//! register ABI passes arguments in `rbx`, for one). The exit handler
//! ([`exit_code`]) finds the activation by the thread's row and `E` (the
//! top cell, whose entry `rsp` is `E`, on the fast path), closes it —
//! counts the exit, stops the timer — and returns to the RA with every
//! register, the flags and `rsp` exactly as the body's `ret` left them. It uses no vector or x87 instruction: return values in
//! `xmm0`/`xmm1`/`st0` survive.
//!
//! Unwinders (gdb, C++ exceptions, `backtrace()`) walk through the record
//! with the unwind information the runtime ships for it: a DWARF expression
//! finds the caller's RA in the oldest open cell whose entry `rsp` is the
//! record frame's CFA − 16 (see `weft_rt::exits`).
//!
//! # Thread row fields (offsets chosen by the runtime, [`ActivationRow`])
//!
//! * `cells`: address of the thread's first cell (0: exits not hooked);
//! * `top`: address of the first free cell (open activations: `[cells,
//!   top)`);
//! * `end`: one past the last cell (0: no cells); a thread with `top ==
//!   end` cannot push: its entries are counted as unhooked;
//! * optional `stack_bounds`: two words `[lo, hi)`, the thread's own stack.
//!   Activations are closed by `rsp` comparison only when the current `rsp`
//!   lies in it (a signal handler on a `sigaltstack` above the thread stack
//!   must not close live activations).
//!
//! Per instrumented function, at its metric base `m` (a row byte offset):
//! entries `m +` [`METRIC_ENTRIES`], exits `m +` [`METRIC_EXITS`],
//! activations closed without a normal exit (longjmp, exceptions) `m +`
//! [`METRIC_UNWOUND`], entries whose exit could not be hooked (no cells, or
//! the stack is full) `m +` [`METRIC_UNHOOKED`]; with timers, the timer
//! words of the `timer` module. For a quiescent thread, `entries = exits +
//! unwound + unhooked + open`.
//!
//! # Closing activations whose frames are gone
//!
//! * At entry (`E` = `rsp` at the function's entry), the top activation `j`
//!   is stale when `E_j < E`, or when `E_j == E` and the RA at `E` is not a
//!   record's return point (`E_j == E` with a record's return point there is
//!   a tail call from activation `j`, which is still open: the new
//!   activation nests inside it). Stale activations are closed one by one
//!   (counted in their `METRIC_UNWOUND`, timers stopped) before pushing.
//! * At exit, the activation is the topmost open one whose entry `rsp` is
//!   `E`: every activation above it is stale (entered after it, and it is
//!   leaving), so they are closed as unwound first. If none is open any
//!   more, nothing is counted and the return still goes to the RA in the
//!   most recent closed cell with that entry `rsp`.
//!
//! # Signal safety
//!
//! A signal handler running instrumented code can interrupt any
//! instruction. The entry stores the cell's entry `rsp`, publishes the new
//! `top`, stores the entry `rsp` again and only then the rest; the exit
//! reads the RA from the cell before publishing the
//! smaller `top`. A handler that interrupts either sequence never sees, or
//! reuses, a half-written open cell.
//!
//! # Functions whose exit must not be hooked
//!
//! The body runs with its return address pointing at a record. The injector must not use
//! [`Snippet::CountCallHookExit`](crate::Snippet) for: functions that
//! return twice or save their RA for later (`setjmp`, `sigsetjmp`,
//! `getcontext`, `vfork`): a second return would find its cell reused;
//! functions that inspect their caller's address (`dlopen`, `dlsym` with
//! `RTLD_NEXT`, `__builtin_return_address(0)` users); code whose runtime
//! walks its own stacks with its own tables (Go: its tracebacks stop at a
//! return address outside Go code, and goroutines move between threads and
//! stacks); and any process
//! running with a CET shadow stack (the exit handler's `ret` would not
//! match it).

use iced_x86::code_asm::*;
use iced_x86::{BlockEncoderOptions, Code, Instruction, MemoryOperand, Register};

use crate::cells::{
    CELL_CHAIN, CELL_ENTRY_RSP, CELL_FLAGS, CELL_HISTOGRAM, CELL_METRIC, CELL_PROBE,
    CELL_RECORD_SHIFT, CELL_RETURN_ADDRESS, CELL_SELF_BASE, CELL_SIZE, CELL_TIMED, CELL_TRACE,
};
use crate::inside::Inside;
use crate::slow_paths::SlowPaths;
use crate::timer::TimerSpec;
use crate::{disp, BuildError};
use weft_abi::layout::{self as abi, metric};

/// Where the exit code finds the user probes of exits: a table with one
/// [`EXIT_PROBE_SIZE`]-byte entry per call record (the probe function at
/// +0, its constant at +8, the instrumented function at +16, and at +24 a
/// u32 thread predicate: 0 to call the probe in every thread, else 1 + the
/// only thread's index), written by the injector before it patches the
/// function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitProbes {
    /// Address of entry 0.
    pub table: u64,
    /// The vector state saved around a probe.
    pub save: crate::VectorSave,
    /// Row byte offset of the thread's index (u32).
    pub row_index: i32,
}

/// Bytes per entry of the exit-probe table.
pub const EXIT_PROBE_SIZE: u64 = abi::EXIT_PROBE_SIZE as u64;

/// Offset from a metric base of the entries counter (u64).
pub const METRIC_ENTRIES: i32 = disp(metric::ENTRIES);
/// Offset from a metric base of the hooked-exits counter (u64).
pub const METRIC_EXITS: i32 = disp(metric::EXITS);
/// Offset from a metric base of the counter of activations closed because
/// their frame was discarded (longjmp, exceptions) (u64).
pub const METRIC_UNWOUND: i32 = disp(metric::UNWOUND);
/// Offset from a metric base of the counter of entries whose exit could not
/// be hooked (no cells, or all in use) (u64).
pub const METRIC_UNHOOKED: i32 = disp(metric::UNHOOKED);
/// Bytes of row used per metric base without timers.
pub const METRIC_LEN: i32 = disp(metric::UNTIMED_LEN);

/// Bytes per call record (the runtime's records, `weft_abi::layout`).
pub const RECORD_SIZE: u64 = abi::RECORD_SIZE as u64;
/// Offset inside a record of its return point (the end of its `call`).
pub const RECORD_RETURN: u64 = abi::RECORD_RETURN as u64;

/// Offset in the exit code ([`exit_code`]) of the stale-activation closer
/// the entry snippets call (the exit handler's address is in [`ExitCode`]).
pub const EXIT_CODE_STALE_ENTRY: u64 = 0;

/// Where a thread's row keeps its activation stack (row byte offsets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActivationRow {
    /// The first cell's address (u64; 0: exits not hooked).
    pub cells: i32,
    /// The first free cell's address (u64).
    pub top: i32,
    /// One past the last cell (u64; 0: no cells).
    pub end: i32,
    /// The `[lo, hi)` pair of the thread's stack, if used (`None`: every
    /// `rsp` counts as on the thread's stack).
    pub stack_bounds: Option<i32>,
    /// The row's activity word (see [`ThreadRow::activity`](crate::ThreadRow)),
    /// bumped by the exit handler once a timed exit has updated the row.
    pub activity: Option<i32>,
}

/// The runtime's call records (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallRecords {
    /// Address of record 0; records are [`RECORD_SIZE`] bytes apart.
    pub first: u64,
    /// Number of records.
    pub count: u32,
}

impl CallRecords {
    /// Address of record `index` (where a trampoline jumps).
    pub fn address(&self, index: u32) -> u64 {
        self.first + u64::from(index) * RECORD_SIZE
    }

    /// Return point of record `index` (the return address its callee sees).
    pub fn return_point(&self, index: u32) -> u64 {
        self.address(index) + RECORD_RETURN
    }
}

/// The process's exit-hook layout: row fields, call records, where the exit
/// code is, and the timers. Shared by the entry snippets and the exit code;
/// all of a session's must be built from one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitHooks {
    row: ActivationRow,
    records: CallRecords,
    exit_code: u64,
    timers: Option<TimerSpec>,
    probes: Option<ExitProbes>,
    /// Entry snippets built from this layout mark their activations for
    /// the exit probe.
    probe_exit: bool,
    /// Entry snippets built from this layout mark their (timed)
    /// activations for the latency histogram.
    histogram: bool,
    /// The threads' trace rings: the exit code writes the close of every
    /// activation marked [`CELL_TRACE`] there.
    trace: Option<crate::TraceRing>,
    /// Entry snippets built from this layout trace their activations.
    trace_calls: bool,
    /// Entry snippets built from this layout are chained over another
    /// probe of the function ([`CELL_CHAIN`]).
    chained: bool,
}

/// An invalid [`ExitHooks`] layout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// A row offset is negative or not 8-byte aligned.
    #[error("row field offset {0} must be non-negative and 8-byte aligned")]
    RowOffset(i32),
    /// The call records are missing or misaligned.
    #[error("call records at {0:#x} must be non-null and 16-byte aligned, and there must be some")]
    Records(u64),
    /// A selected clock's function or state address is 0.
    #[error("the timer's {0} address is 0")]
    NullTimerAddress(&'static str),
    /// The tick-to-nanosecond factor is 0.
    #[error("the timer's ns-per-tick factor is 0")]
    NullUnits,
    /// The trace ring is misplaced or its capacity is not a power of two in
    /// range.
    #[error("the trace ring must be 64-byte aligned, hold a power-of-two number of events (16 to 262,144) and have a wall clock to read")]
    Trace,
}

fn check_offset(off: i32) -> Result<(), LayoutError> {
    if off < 0 || off % 8 != 0 || off > i32::MAX - 16 {
        return Err(LayoutError::RowOffset(off));
    }
    Ok(())
}

impl ExitHooks {
    /// A layout without timers: exits are counted, not timed. `exit_code`
    /// is the address the exit code ([`exit_code`]) is (or will be)
    /// written at.
    ///
    /// # Errors
    ///
    /// [`LayoutError`] for a negative or misaligned row offset, or bad
    /// records.
    pub fn new(
        row: ActivationRow,
        records: CallRecords,
        exit_code: u64,
    ) -> Result<Self, LayoutError> {
        for off in [
            Some(row.cells),
            Some(row.top),
            Some(row.end),
            row.stack_bounds,
            row.activity,
        ]
        .into_iter()
        .flatten()
        {
            check_offset(off)?;
        }
        if records.first == 0 || records.first % 16 != 0 || records.count == 0 {
            return Err(LayoutError::Records(records.first));
        }
        Ok(Self {
            row,
            records,
            exit_code,
            timers: None,
            probes: None,
            probe_exit: false,
            histogram: false,
            trace: None,
            trace_calls: false,
            chained: false,
        })
    }

    /// The same layout with call traces (see the `trace` module): the exit
    /// code writes the close of every traced activation into the thread's
    /// ring; entry snippets trace only when built from
    /// [`ExitHooks::tracing`]`(true)`.
    ///
    /// # Errors
    ///
    /// [`LayoutError::Trace`] for a ring generated code cannot use.
    pub fn with_trace(self, ring: crate::TraceRing) -> Result<Self, LayoutError> {
        if !ring.is_valid() {
            return Err(LayoutError::Trace);
        }
        Ok(Self {
            trace: Some(ring),
            ..self
        })
    }

    /// The layout for the entry snippet of a function whose calls are
    /// traced when `on` (and the layout has a ring,
    /// [`ExitHooks::with_trace`]).
    pub fn tracing(self, on: bool) -> Self {
        Self {
            trace_calls: on && self.trace.is_some(),
            ..self
        }
    }

    /// The layout for the entry snippet of a probe chained over another
    /// session's probe of the same function (its displaced instruction is
    /// that probe's `jmp`) when `on`: its activations are marked
    /// [`CELL_CHAIN`], so that the other probe's timed activation of the
    /// same call, pushed right after on the same frame, does not count as a
    /// callee in this one's self time.
    pub fn chained(self, on: bool) -> Self {
        Self {
            chained: on,
            ..self
        }
    }

    /// The trace ring, if the exit code writes traces.
    pub fn trace(&self) -> Option<&crate::TraceRing> {
        self.trace.as_ref()
    }

    /// Whether entry snippets built from this layout trace their calls.
    pub fn traces_calls(&self) -> bool {
        self.trace_calls
    }

    /// The same layout with user probes at exits: the exit code calls the
    /// probe of a function whose activation an entry built with
    /// [`ExitHooks::probing_exits`] marked.
    ///
    /// # Errors
    ///
    /// [`LayoutError::Records`] for a null or misaligned table,
    /// [`LayoutError::RowOffset`] for a bad thread-index offset.
    pub fn with_exit_probes(self, probes: ExitProbes) -> Result<Self, LayoutError> {
        if probes.table == 0 || probes.table % 8 != 0 {
            return Err(LayoutError::Records(probes.table));
        }
        if probes.row_index < 0 || probes.row_index % 4 != 0 {
            return Err(LayoutError::RowOffset(probes.row_index));
        }
        Ok(Self {
            probes: Some(probes),
            ..self
        })
    }

    /// The layout for the entry snippet of a function whose exits call its
    /// user probe (the session's exit code must have been built
    /// [`ExitHooks::with_exit_probes`]); without timers when
    /// `timed` is false (the function's words are then
    /// [`METRIC_LEN`] bytes).
    pub fn probing_exits(self, timed: bool) -> Self {
        Self {
            probe_exit: true,
            timers: if timed { self.timers } else { None },
            histogram: self.histogram && timed,
            ..self
        }
    }

    /// The layout for the entry snippet of a timed function that keeps a
    /// latency histogram of its outermost activations' wall time (its
    /// words are then [`TIMER_HIST_METRIC_LEN`](crate::TIMER_HIST_METRIC_LEN)
    /// bytes). Without a wall timer there is nothing to bucket: the
    /// layout is unchanged.
    pub fn with_histogram(self, on: bool) -> Self {
        Self {
            histogram: on && self.timers.is_some_and(|t| t.timers.wall),
            ..self
        }
    }

    /// Whether entry snippets built from this layout keep a histogram.
    pub fn histogram(&self) -> bool {
        self.histogram
    }

    /// The exit probes, if configured.
    pub fn exit_probes(&self) -> Option<&ExitProbes> {
        self.probes.as_ref()
    }

    /// The same layout with inclusive timers (see the `timer` module): the
    /// entry snippets start the function's timer, the exit code stops it.
    /// With [`Timers::NONE`](crate::Timers::NONE) the layout stays
    /// timer-less.
    ///
    /// # Errors
    ///
    /// [`LayoutError::RowOffset`] for a misaligned `cpu_state_row_offset`
    /// (when the CPU clock is selected), [`LayoutError::NullTimerAddress`]
    /// for a selected clock whose routine is 0, [`LayoutError::NullUnits`]
    /// for a zero conversion factor.
    pub fn with_timers(self, spec: TimerSpec) -> Result<Self, LayoutError> {
        if !spec.timers.any() {
            return Ok(Self {
                timers: None,
                histogram: false,
                ..self
            });
        }
        if let crate::WallRead::Call { routine, state } = spec.wall {
            if routine == 0 {
                return Err(LayoutError::NullTimerAddress("wall clock routine"));
            }
            if state == 0 {
                return Err(LayoutError::NullTimerAddress("wall clock state"));
            }
        }
        if spec.timers.cpu {
            if spec.cpu.slow_path == 0 {
                return Err(LayoutError::NullTimerAddress("cpu clock routine"));
            }
            check_offset(spec.cpu.row_offset)?;
        }
        check_offset(spec.self_ticks_row)?;
        if spec.ns_per_tick_q32 == 0 {
            return Err(LayoutError::NullUnits);
        }
        Ok(Self {
            timers: Some(spec),
            ..self
        })
    }

    /// The timer parameters, if timers are on.
    pub fn timers(&self) -> Option<&TimerSpec> {
        self.timers.as_ref()
    }

    /// The row fields.
    pub fn row(&self) -> ActivationRow {
        self.row
    }

    /// The call records.
    pub fn records(&self) -> CallRecords {
        self.records
    }

    /// Where the exit code is.
    pub fn exit_code_address(&self) -> u64 {
        self.exit_code
    }

    /// Bytes of row used per hooked function at its metric base:
    /// [`METRIC_LEN`], or [`TIMER_METRIC_LEN`](crate::TIMER_METRIC_LEN) with
    /// timers.
    pub fn metric_len(&self) -> i32 {
        if self.histogram {
            crate::timer::TIMER_HIST_METRIC_LEN
        } else if self.timers.is_some() {
            crate::timer::TIMER_METRIC_LEN
        } else {
            METRIC_LEN
        }
    }

    /// The flags an entry stores in its cell for the function of call
    /// record `record`.
    fn flags(&self, record: u32) -> u32 {
        let mut flags = 0;
        if self.timers.is_some() {
            flags |= CELL_TIMED;
        }
        if self.histogram {
            flags |= CELL_HISTOGRAM;
        }
        if self.probe_exit {
            flags |= CELL_PROBE | (record << CELL_RECORD_SHIFT);
        }
        if self.trace_calls {
            flags |= CELL_TRACE;
        }
        if self.chained {
            flags |= CELL_CHAIN;
        }
        flags
    }
}

fn asm_err(e: IcedError) -> BuildError {
    BuildError::Encode(e.to_string())
}

/// `fs:[disp32]` with no base register (see `trampoline::fs_absolute`).
fn fs_absolute(offset: i32) -> MemoryOperand {
    MemoryOperand::new(
        Register::None,
        Register::None,
        1,
        i64::from(offset),
        8,
        false,
        Register::FS,
    )
}

fn q(base: AsmRegister64, off: i32) -> AsmMemoryOperand {
    qword_ptr(base + i64::from(off))
}

fn d(base: AsmRegister64, off: i32) -> AsmMemoryOperand {
    dword_ptr(base + i64::from(off))
}

/// The entry snippet of [`Snippet::CountCallHookExit`](crate::Snippet) for
/// the function whose metric base is `metric` and whose call record is
/// `record`, built for code at `ip`.
///
/// Contract (the trampoline's snippet contract): `rcx` = row (non-null),
/// `ax` = the saved flags, `[rsp]` and `[rsp+8]` = the trampoline's saved
/// `rcx` and `rax`, `[rsp+16]` = the return address. When the exit can be
/// hooked, the snippet never falls through: it restores every register and
/// the flags itself (the body gets them all as its caller left them),
/// drops the return address and jumps to the record. Otherwise (no cells, stack full) it counts
/// `METRIC_UNHOOKED`, restores what it saved and falls through with `rcx`
/// and `ax` as on entry, to the trampoline's epilogue and the displaced
/// instructions. Stack below the entry `rsp`: 16 bytes (trampoline), 32
/// (saves), 8 (a call's return address) and the stale closer's or a clock
/// routine's own use (72 bytes at most, see [`exit_code`] and the
/// runtime's clock routines).
///
/// ```text
///     inc qword [rcx + m + ENTRIES]
///     push rdx ; push rsi ; push rdi ; push r8
///     mov esi, eax                              ; flags, while rax is busy
///     mov rdi, [rcx + top] ; cmp rdi, [rcx + end] ; jae .unhooked
///     lea rax, [rsp + 48]                       ; E
///     cmp rdi, [rcx + cells] ; je .push ; jb .unhooked
///     cmp [rdi - 32 + ENTRY_RSP], rax ; ja .push ; its frame is live
///     call [.stale]                             ; closes stale ones, rdi = top
/// .push: mov [rdi + ENTRY_RSP], rax
///     lea rdx, [rdi + 32] ; mov [rcx + top], rdx   ; publish
///     mov [rdi + ENTRY_RSP], rax
///     mov rdx, [rax] ; mov [rdi + RA], rdx
///     mov dword [rdi + METRIC], m ; mov dword [rdi + FLAGS], flags
///     <timer start, see the timer module>
///     mov eax, esi
///     pop r8 ; pop rdi ; pop rsi ; pop rdx
///     add al, 0x7f ; sahf ; pop rcx ; pop rax
///     lea rsp, [rsp + 8]                        ; the record's call puts its own RA there
///     jmp [.record]
/// .unhooked: inc qword [rcx + m + UNHOOKED] ; mov eax, esi
///     pop r8 ; pop rdi ; pop rsi ; pop rdx
/// ```
pub(crate) fn enter_snippet(
    hooks: &ExitHooks,
    metric: i32,
    record: u32,
    inside: &Inside,
    activity: Option<i32>,
    ip: u64,
) -> Result<Vec<u8>, BuildError> {
    let mut a = CodeAssembler::new(64).map_err(asm_err)?;
    enter_asm(&mut a, hooks, metric, record, inside, activity).map_err(asm_err)?;
    a.assemble(ip).map_err(asm_err)
}

/// Upper bound of [`enter_snippet`]'s length (it does not depend on `ip`;
/// any `Some` activity offset gives at most this length).
pub(crate) fn enter_snippet_len(
    hooks: &ExitHooks,
    metric: i32,
    record: u32,
    inside: &Inside,
    activity: Option<i32>,
) -> usize {
    enter_snippet(hooks, metric, record, inside, activity.map(|_| 1 << 20), 0)
        .map_or(0, |b| b.len())
}

fn enter_asm(
    a: &mut CodeAssembler,
    h: &ExitHooks,
    metric: i32,
    record: u32,
    inside: &Inside,
    activity: Option<i32>,
) -> Result<(), IcedError> {
    let m = i64::from(metric);
    let row = h.row;
    let mut push = a.create_label();
    let mut unhooked = a.create_label();
    // Constrained: the entry counts only once the stale activations are
    // closed and the constraint holds (see the `inside` module).
    let guarded = !inside.is_always();
    let mut test = if guarded { a.create_label() } else { push };
    let mut outside = a.create_label();
    let mut slow = SlowPaths::new();
    let record_lit = slow.literal(a, h.records.address(record));
    let stale_lit = slow.literal(a, h.exit_code + EXIT_CODE_STALE_ENTRY);

    if !guarded {
        a.inc(qword_ptr(rcx + (m + i64::from(METRIC_ENTRIES))))?;
    }
    for r in [rdx, rsi, rdi, r8] {
        a.push(r)?;
    }
    a.mov(esi, eax)?;
    a.mov(rdi, q(rcx, row.top))?;
    a.cmp(rdi, q(rcx, row.end))?;
    a.jae(unhooked)?;
    a.lea(rax, qword_ptr(rsp + 48))?;
    a.cmp(rdi, q(rcx, row.cells))?;
    a.je(test)?;
    a.jb(unhooked)?; // a corrupt top: never write outside the cells
    a.cmp(q(rdi, CELL_ENTRY_RSP - CELL_SIZE as i32), rax)?;
    a.ja(test)?;
    a.call(qword_ptr(stale_lit))?;
    if guarded {
        a.set_label(&mut test)?;
        crate::inside::emit_test(a, inside, outside)?;
        a.inc(qword_ptr(rcx + (m + i64::from(METRIC_ENTRIES))))?;
    }

    a.set_label(&mut push)?;
    a.mov(q(rdi, CELL_ENTRY_RSP), rax)?;
    a.lea(rdx, qword_ptr(rdi + i64::from(CELL_SIZE)))?;
    a.mov(q(rcx, row.top), rdx)?;
    a.mov(q(rdi, CELL_ENTRY_RSP), rax)?;
    a.mov(rdx, qword_ptr(rax))?;
    a.mov(q(rdi, CELL_RETURN_ADDRESS), rdx)?;
    a.mov(d(rdi, CELL_METRIC), metric)?;
    a.mov(d(rdi, CELL_FLAGS), h.flags(record) as i32)?;
    if let Some(spec) = &h.timers {
        crate::timer::emit_start(a, spec, metric, &mut slow)?;
    }
    if let (Some(ring), true) = (&h.trace, h.trace_calls) {
        use crate::trace::{emit_event, EventOf, Time};
        let time = match &h.timers {
            // The timer's start reading, from the self-time base it just
            // stored (`t0 - N`) and `N`: one clock read serves both.
            Some(spec) => {
                a.mov(r8, q(rdi, CELL_SELF_BASE))?;
                a.add(r8, q(rcx, spec.self_ticks_row))?;
                Time::InT
            }
            None => Time::Read,
        };
        emit_event(a, ring, EventOf::Entry(metric), (r8, r8d), time, &mut slow)?;
    }
    if let Some(activity) = activity {
        a.inc(q(rcx, activity))?; // after every word of this entry
    }
    a.mov(eax, esi)?;
    for r in [r8, rdi, rsi, rdx] {
        a.pop(r)?;
    }
    a.add(al, 0x7f)?;
    a.sahf()?;
    a.pop(rcx)?;
    a.pop(rax)?;
    a.lea(rsp, qword_ptr(rsp + 8))?;
    a.jmp(qword_ptr(record_lit))?;
    slow.emit(a)?;

    a.set_label(&mut unhooked)?;
    if guarded {
        // No cell to close stale activations with: the constraint as the
        // last hooked entry left it.
        crate::inside::emit_test(a, inside, outside)?;
        a.inc(qword_ptr(rcx + (m + i64::from(METRIC_ENTRIES))))?;
    }
    a.inc(qword_ptr(rcx + (m + i64::from(METRIC_UNHOOKED))))?;
    a.set_label(&mut outside)?;
    a.mov(eax, esi)?;
    for r in [r8, rdi, rsi, rdx] {
        a.pop(r)?;
    }
    Ok(())
}

/// The exit code's entry points (see [`exit_code`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitCode {
    /// The code, to be written at the address it was built for.
    pub bytes: Vec<u8>,
    /// The exit handler every call record jumps to (install it in the
    /// runtime's handler slot).
    pub handler: u64,
    /// The stale-activation closer the entry snippets call.
    pub stale_closer: u64,
}

/// Builds the exit code for `hooks`, at `hooks.exit_code_address()`: the
/// exit handler the call records jump to and the routines it and the entry
/// snippets share. One per process and session (the layout's timers are
/// baked in); it serves every thread. `tls_offset` is where the thread's
/// row pointer is (`fs:[tls_offset]`).
///
/// **Stale closer** (at [`EXIT_CODE_STALE_ENTRY`]). Contract: called with
/// `rcx` = row, `rax` = `E`; closes the stale activations at the top (see
/// the module docs) and returns the new `top` in `rdi`; preserves every
/// other register; clobbers the flags.
///
/// **Exit handler** ([`ExitCode::handler`]). Contract: entered by the
/// record's `jmp` with `rsp` = the function's entry `rsp` + 8 (the body
/// returned); returns to the cell's RA with `rsp` as on entry and every
/// register, all arithmetic flags and DF as the body left them (no
/// register is trusted to carry the cell: the body owes its caller's
/// convention nothing weft could rely on). It writes 64 bytes below its
/// entry `rsp` (dead stack once a function returned), plus a call into its
/// stop routine and from there a clock routine. The returning activation
/// is the top cell when its entry `rsp` is `E` (the fast path); otherwise
/// the topmost open cell whose entry `rsp` is `E` (those above it are
/// closed as unwound).
///
/// ```text
///     lea rsp, [rsp - 8]                       ; room for the RA
///     push rax ; push rdx ; push rcx ; push rsi ; push rdi ; push r8 ; push r9
///     seto al ; lahf ; mov esi, eax
///     mov rcx, fs:[tls_offset] ; test rcx, rcx ; jz .lost
///     lea rdx, [rsp + 56]                      ; E
///     mov rdi, [rcx + top] ; cmp rdi, [rcx + cells] ; jbe .search
///     sub rdi, 32 ; cmp [rdi + ENTRY_RSP], rdx ; jne .search
/// .ours: movsxd r8, dword [rdi + METRIC] ; add r8, rcx
///     inc qword [r8 + EXITS]
///     test byte [rdi + FLAGS], TIMED ; jz .popped ; push rdi ; call .stop ; pop rdi
/// .popped: mov rdx, [rdi + RA] ; mov [rsp + 56], rdx
///     mov [rcx + top], rdi
/// .restore: mov eax, esi ; add al, 0x7f ; sahf
///     pop r9 ; pop r8 ; pop rdi ; pop rsi ; pop rcx ; pop rdx ; pop rax
///     ret
/// ```
///
/// # Errors
///
/// [`BuildError::Encode`] only on an internal encoding failure.
pub fn exit_code(tls_offset: i32, hooks: &ExitHooks) -> Result<ExitCode, BuildError> {
    let mut a = CodeAssembler::new(64).map_err(asm_err)?;
    let handler = exit_asm(&mut a, tls_offset, hooks).map_err(asm_err)?;
    let at = hooks.exit_code;
    let result = a
        .assemble_options(at, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)
        .map_err(asm_err)?;
    let handler = result.label_ip(&handler).map_err(asm_err)?;
    Ok(ExitCode {
        bytes: result.inner.code_buffer,
        handler,
        stale_closer: at + EXIT_CODE_STALE_ENTRY,
    })
}

/// Exact length of [`exit_code`] for this layout.
pub fn exit_code_len(tls_offset: i32, hooks: &ExitHooks) -> usize {
    exit_code(tls_offset, hooks).map_or(0, |c| c.bytes.len())
}

/// Emits the exit code (stale closer first, at offset 0); returns the
/// handler's label.
fn exit_asm(a: &mut CodeAssembler, tls_offset: i32, h: &ExitHooks) -> Result<CodeLabel, IcedError> {
    let mut close_from = a.create_label();
    let mut stop = a.create_label();
    let mut exit_probe = a.create_label();
    let mut trace_exit = a.create_label();
    let mut trace_unwound = a.create_label();
    let traces = h.trace.map(|_| (trace_exit, trace_unwound));
    emit_stale_closer(a, h, close_from)?;
    let handler = emit_handler(
        a,
        tls_offset,
        h,
        close_from,
        stop,
        h.probes.is_some().then_some(exit_probe),
        traces.map(|t| t.0),
    )?;
    a.set_label(&mut close_from)?;
    emit_close_from(a, h, stop, traces.map(|t| t.1))?;
    if let Some(ring) = &h.trace {
        use weft_abi::layout::trace::{KIND_EXIT, KIND_UNWOUND};
        a.set_label(&mut trace_exit)?;
        crate::trace::emit_close_routine(a, ring, KIND_EXIT)?;
        a.set_label(&mut trace_unwound)?;
        crate::trace::emit_close_routine(a, ring, KIND_UNWOUND)?;
    }
    if let Some(probes) = &h.probes {
        a.set_label(&mut exit_probe)?;
        emit_exit_probe(a, probes)?;
    }
    a.set_label(&mut stop)?;
    match &h.timers {
        Some(spec) => crate::timer::emit_stop(a, spec, h.row.cells)?,
        None => a.ret()?,
    }
    Ok(handler)
}

/// The stale closer: rcx = row, rax = E; out: rdi = top.
fn emit_stale_closer(
    a: &mut CodeAssembler,
    h: &ExitHooks,
    close_from: CodeLabel,
) -> Result<(), IcedError> {
    let row = h.row;
    let size = CELL_SIZE as i32;
    let mut top = a.create_label();
    let mut done = a.create_label();
    let mut is_stale = a.create_label();
    a.push(rdx)?;
    a.set_label(&mut top)?;
    a.mov(rdi, q(rcx, row.top))?;
    a.cmp(rdi, q(rcx, row.cells))?;
    a.jbe(done)?;
    a.mov(rdx, q(rdi, CELL_ENTRY_RSP - size))?;
    a.cmp(rdx, rax)?;
    a.ja(done)?; // its frame is live
    a.jb(is_stale)?;
    // E_top == E: a tail call from it when the RA is a record's return
    // point (RA - first < count * 16, and ≡ RECORD_RETURN mod 16).
    a.mov(rdx, qword_ptr(rax))?;
    a.push(rsi)?;
    a.mov(rsi, h.records.first)?;
    a.sub(rdx, rsi)?;
    a.pop(rsi)?;
    a.cmp(rdx, (u64::from(h.records.count) * RECORD_SIZE) as i32)?;
    a.jae(is_stale)?;
    a.and(edx, (RECORD_SIZE - 1) as i32)?;
    a.cmp(edx, RECORD_RETURN as i32)?;
    a.je(done)?;
    a.set_label(&mut is_stale)?;
    if let Some(b) = row.stack_bounds {
        a.cmp(rax, q(rcx, b))?;
        a.jb(done)?;
        a.cmp(rax, q(rcx, b + 8))?;
        a.jae(done)?;
    }
    a.sub(rdi, size)?;
    a.call(close_from)?;
    a.jmp(top)?;
    a.set_label(&mut done)?;
    a.pop(rdx)?;
    a.ret()
}

/// The exit handler (see [`exit_code`]); returns its label.
fn emit_handler(
    a: &mut CodeAssembler,
    tls_offset: i32,
    h: &ExitHooks,
    close_from: CodeLabel,
    stop: CodeLabel,
    exit_probe: Option<CodeLabel>,
    trace_exit: Option<CodeLabel>,
) -> Result<CodeLabel, IcedError> {
    let row = h.row;
    let size = CELL_SIZE as i32;
    // Frame: [rsp + 56] = E (the RA goes there), then the seven saves.
    const RA_SLOT: i32 = 56;
    let mut handler = a.create_label();
    let mut search = a.create_label();
    let mut search_next = a.create_label();
    let mut ours = a.create_label();
    let mut popped = a.create_label();
    let mut restore = a.create_label();
    let mut orphan = a.create_label();
    let mut orphan_next = a.create_label();
    let mut lost = a.create_label();
    a.set_label(&mut handler)?;
    a.lea(rsp, qword_ptr(rsp - 8))?;
    for r in [rax, rdx, rcx, rsi, rdi, r8, r9] {
        a.push(r)?;
    }
    a.seto(al)?;
    a.lahf()?;
    a.mov(esi, eax)?;
    a.add_instruction(Instruction::with2(
        Code::Mov_r64_rm64,
        Register::RCX,
        fs_absolute(tls_offset),
    )?)?;
    a.test(rcx, rcx)?;
    a.jz(lost)?;
    a.lea(rdx, qword_ptr(rsp + RA_SLOT))?; // E
    a.mov(rdi, q(rcx, row.top))?;
    a.cmp(rdi, q(rcx, row.cells))?;
    a.jbe(search)?; // nothing open: search finds that out
    a.sub(rdi, size)?;
    a.cmp(q(rdi, CELL_ENTRY_RSP), rdx)?;
    a.jne(search)?;

    // rdi = the returning activation's cell, the top one.
    a.set_label(&mut ours)?;
    a.movsxd(r8, d(rdi, CELL_METRIC))?;
    // A retired cell (the runtime closed it already: at thread exit, the
    // functions still running then return through theirs) counts nothing.
    a.test(r8, r8)?;
    a.js(popped)?;
    a.add(r8, rcx)?;
    a.inc(q(r8, METRIC_EXITS))?;
    if trace_exit.is_some() {
        // The trace's time: the stop's reading when it takes one (r9).
        a.xor(r9d, r9d)?;
    }
    if h.timers.is_some() {
        let mut untimed = a.create_label();
        a.test(byte_ptr(rdi + i64::from(CELL_FLAGS)), CELL_TIMED as i32)?;
        a.jz(untimed)?;
        a.push(rdi)?;
        a.call(stop)?;
        a.pop(rdi)?;
        a.set_label(&mut untimed)?;
        a.nop()?; // the label needs an instruction
    }
    if let Some(trace) = trace_exit {
        let mut untraced = a.create_label();
        a.test(byte_ptr(rdi + i64::from(CELL_FLAGS)), CELL_TRACE as i32)?;
        a.jz(untraced)?;
        a.call(trace)?; // clobbers rax, rdx, r9: rdi and rcx stay
        a.set_label(&mut untraced)?;
        a.nop()?;
    }
    if let Some(probe) = exit_probe {
        a.test(byte_ptr(rdi + i64::from(CELL_FLAGS)), CELL_PROBE as i32)?;
        a.jz(popped)?;
        a.push(rdi)?;
        a.call(probe)?;
        a.pop(rdi)?;
    }
    a.set_label(&mut popped)?;
    // Read the cell before publishing the pop (a signal handler may reuse
    // it right after).
    a.mov(rdx, q(rdi, CELL_RETURN_ADDRESS))?;
    a.mov(qword_ptr(rsp + RA_SLOT), rdx)?;
    a.mov(q(rcx, row.top), rdi)?;
    if let Some(activity) = row.activity {
        a.inc(q(rcx, activity))?; // after every word of this exit
    }
    a.set_label(&mut restore)?;
    a.mov(eax, esi)?;
    a.add(al, 0x7f)?;
    a.sahf()?;
    for r in [r9, r8, rdi, rsi, rcx, rdx, rax] {
        a.pop(r)?;
    }
    a.ret()?;

    // Not the top cell: the returning activation is the topmost open one
    // whose entry rsp is E; those above it are stale.
    a.set_label(&mut search)?;
    a.mov(rdi, q(rcx, row.top))?;
    a.set_label(&mut search_next)?;
    a.cmp(rdi, q(rcx, row.cells))?;
    a.jbe(orphan)?;
    a.sub(rdi, size)?;
    a.cmp(q(rdi, CELL_ENTRY_RSP), rdx)?;
    a.jne(search_next)?;
    a.push(rdi)?;
    a.add(rdi, size)?;
    a.call(close_from)?;
    a.pop(rdi)?;
    a.jmp(ours)?;

    // No open activation is the returning one (it was closed already):
    // nothing is counted, but the return must still go to its RA, in the
    // most recent closed cell whose entry rsp is E.
    a.set_label(&mut orphan)?;
    a.mov(rdi, q(rcx, row.end))?;
    a.set_label(&mut orphan_next)?;
    a.cmp(rdi, q(rcx, row.cells))?;
    a.jbe(lost)?;
    a.sub(rdi, size)?;
    a.cmp(q(rdi, CELL_ENTRY_RSP), rdx)?;
    a.jne(orphan_next)?;
    a.mov(rdx, q(rdi, CELL_RETURN_ADDRESS))?;
    a.mov(qword_ptr(rsp + RA_SLOT), rdx)?;
    a.jmp(restore)?;
    // No row, or no cell ever had this entry rsp: the return address is
    // nowhere (the row pointer is never cleared and cells are kept, so
    // only corrupted memory gets here). A deterministic SIGILL here beats
    // a jump to an arbitrary address.
    a.set_label(&mut lost)?;
    a.ud2()?;
    Ok(handler)
}

/// The exit-probe routine: called by the handler with `rdi` = the cell,
/// `rcx` = the row, the handler's frame above its return address (saved
/// `rax` at +56, `rdx` at +48, the function's entry `rsp` = +64, see
/// `emit_handler`); calls the probe of the cell's record with a context of
/// the return values. May clobber `rax`, `rdx`, `rdi`, `r8`, `r9` (the
/// handler's scratch registers); preserves every other register, the
/// flags and the vector state.
fn emit_exit_probe(a: &mut CodeAssembler, p: &ExitProbes) -> Result<(), IcedError> {
    use crate::probe::*;
    for r in [rbp, r10, r11, rsi, rcx, rbx] {
        a.push(r)?;
    }
    a.pushfq()?;
    a.cld()?;
    a.mov(rbp, rsp)?;
    // The handler's rsp before its `push rdi; call`: our 7 pushes, the
    // return address and its push up.
    let frame = 8 * 7 + 8 + 8;
    a.mov(r8, rdi)?;
    // The record's entry: flags >> 8 = record; entry = table + 32 * record.
    a.mov(r9d, d(r8, CELL_FLAGS))?;
    a.shr(r9d, CELL_RECORD_SHIFT)?;
    const _: () = assert!(EXIT_PROBE_SIZE == 1 << 5);
    a.shl(r9, 5)?;
    a.mov(rax, p.table)?;
    a.add(r9, rax)?;
    // Its thread predicate: 0 for any thread, else 1 + the thread's index.
    let mut run = a.create_label();
    let mut skip = a.create_label();
    a.mov(eax, dword_ptr(r9 + 24))?;
    a.test(eax, eax)?;
    a.jz(run)?;
    a.dec(eax)?;
    a.cmp(eax, dword_ptr(rcx + i64::from(p.row_index)))?;
    a.jne(skip)?;
    a.set_label(&mut run)?;
    crate::vector::save_vector(a, p.save)?;
    a.sub(rsp, CTX_SIZE)?;
    a.xor(eax, eax)?;
    for i in 0..6 {
        a.mov(qword_ptr(rsp + i64::from(CTX_ARGS + 8 * i)), rax)?;
    }
    for i in 0..8 {
        a.mov(qword_ptr(rsp + i64::from(CTX_FARGS + 8 * i)), rax)?;
    }
    a.mov(rax, qword_ptr(rbp + (frame + 48)))?;
    a.mov(qword_ptr(rsp + i64::from(CTX_RET)), rax)?;
    a.mov(rax, qword_ptr(rbp + (frame + 40)))?;
    a.mov(qword_ptr(rsp + i64::from(CTX_RET2)), rax)?;
    a.movq(qword_ptr(rsp + i64::from(CTX_FRET)), xmm0)?;
    a.lea(rax, qword_ptr(rbp + (frame + 56)))?;
    a.mov(qword_ptr(rsp + i64::from(CTX_RSP)), rax)?;
    a.mov(rax, qword_ptr(r9 + 16))?;
    a.mov(qword_ptr(rsp + i64::from(CTX_FUNCTION)), rax)?;
    a.mov(rax, qword_ptr(r9 + 8))?;
    a.mov(qword_ptr(rsp + i64::from(CTX_USER)), rax)?;
    a.mov(eax, dword_ptr(rcx + i64::from(p.row_index)))?;
    a.mov(dword_ptr(rsp + i64::from(CTX_THREAD)), eax)?;
    a.mov(dword_ptr(rsp + i64::from(CTX_POINT)), POINT_EXIT as i32)?;
    a.mov(rdi, rsp)?;
    a.call(qword_ptr(r9))?;
    a.add(rsp, CTX_SIZE)?;
    crate::vector::restore_vector(a, p.save)?;
    a.set_label(&mut skip)?;
    a.mov(rsp, rbp)?;
    a.popfq()?;
    for r in [rbx, rcx, rsi, r11, r10, rbp] {
        a.pop(r)?;
    }
    a.ret()
}

/// close_from: rcx = row, rdi = lowest cell to close; closes every open
/// activation from the top down to it as unwound. Preserves every register
/// but the flags.
fn emit_close_from(
    a: &mut CodeAssembler,
    h: &ExitHooks,
    stop: CodeLabel,
    trace_unwound: Option<CodeLabel>,
) -> Result<(), IcedError> {
    let row = h.row;
    let size = CELL_SIZE as i32;
    let mut top = a.create_label();
    let mut done = a.create_label();
    for r in [rax, rdx, rsi, rdi, r8, r9] {
        a.push(r)?;
    }
    a.mov(rsi, rdi)?;
    a.set_label(&mut top)?;
    a.mov(rdi, q(rcx, row.top))?;
    a.cmp(rdi, rsi)?;
    a.jbe(done)?;
    a.sub(rdi, size)?;
    a.mov(q(rcx, row.top), rdi)?; // popped: its frame is gone
    a.movsxd(r8, d(rdi, CELL_METRIC))?;
    a.test(r8, r8)?;
    a.js(top)?; // not a metric base: never write there
    a.test(r8d, 7)?;
    a.jnz(top)?;
    a.mov(edx, d(rdi, CELL_FLAGS))?;
    a.lea(r8, qword_ptr(rcx + r8))?;
    a.inc(q(r8, METRIC_UNWOUND))?;
    if let Some(trace) = trace_unwound {
        let mut untraced = a.create_label();
        a.test(edx, CELL_TRACE as i32)?;
        a.jz(untraced)?;
        a.push(rdx)?;
        a.xor(r9d, r9d)?; // no reading yet: the routine takes one
        a.call(trace)?; // clobbers rax, rdx, r9
        a.pop(rdx)?;
        a.set_label(&mut untraced)?;
        a.nop()?;
    }
    if h.timers.is_some() {
        a.test(edx, CELL_TIMED as i32)?;
        a.jz(top)?;
        a.call(stop)?; // clobbers rax, rdx, rdi, r9: top reloads rdi
    }
    a.jmp(top)?;
    a.set_label(&mut done)?;
    for r in [r9, r8, rdi, rsi, rdx, rax] {
        a.pop(r)?;
    }
    a.ret()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CpuClockLayout, TimerSpec, Timers, WallRead, TIMER_METRIC_LEN};

    const ROW: ActivationRow = ActivationRow {
        cells: 0,
        top: 8,
        end: 16,
        stack_bounds: Some(24),
        activity: Some(48),
    };
    const RECORDS: CallRecords = CallRecords {
        first: 0x7000_0000,
        count: 64,
    };

    fn spec(timers: Timers) -> TimerSpec {
        TimerSpec {
            timers,
            wall: WallRead::Tsc,
            cpu: CpuClockLayout {
                row_offset: 40,
                slow_path: 0x3333,
                ..CpuClockLayout::WEFT_RT
            },
            ns_per_tick_q32: 1 << 32,
            self_ticks_row: 56,
        }
    }

    #[test]
    fn layout_validation() {
        let h = ExitHooks::new(ROW, RECORDS, 0x9000).unwrap();
        assert_eq!(h.metric_len(), METRIC_LEN);
        assert!(ExitHooks::new(ActivationRow { top: 4, ..ROW }, RECORDS, 0).is_err());
        assert!(ExitHooks::new(ROW, CallRecords { first: 8, count: 1 }, 0).is_err());
        assert!(ExitHooks::new(
            ROW,
            CallRecords {
                first: 0x1000,
                count: 0
            },
            0
        )
        .is_err());
        let both = Timers {
            wall: true,
            cpu: true,
        };
        let timed = h.with_timers(spec(both)).unwrap();
        assert_eq!(timed.metric_len(), TIMER_METRIC_LEN);
        assert_eq!(h.with_timers(spec(Timers::NONE)).unwrap(), h);
        let mut bad = spec(both);
        bad.cpu.slow_path = 0;
        assert_eq!(
            h.with_timers(bad),
            Err(LayoutError::NullTimerAddress("cpu clock routine"))
        );
        let mut bad = spec(both);
        bad.wall = WallRead::Call {
            routine: 0,
            state: 1,
        };
        assert!(h.with_timers(bad).is_err());
        let mut bad = spec(both);
        bad.ns_per_tick_q32 = 0;
        assert_eq!(h.with_timers(bad), Err(LayoutError::NullUnits));
        assert_eq!(RECORDS.return_point(2), 0x7000_0000 + 32 + 6);
    }

    #[test]
    fn exit_code_entry_points_and_lengths() {
        let both = Timers {
            wall: true,
            cpu: true,
        };
        for hooks in [
            ExitHooks::new(ROW, RECORDS, 0x9000).unwrap(),
            ExitHooks::new(ROW, RECORDS, 0x9000)
                .unwrap()
                .with_timers(spec(both))
                .unwrap(),
        ] {
            let code = exit_code(-8, &hooks).unwrap();
            assert_eq!(code.bytes.len(), exit_code_len(-8, &hooks));
            assert_eq!(code.stale_closer, 0x9000);
            // The handler starts with `lea rsp, [rsp - 8]`.
            let at = (code.handler - 0x9000) as usize;
            let mut dec = iced_x86::Decoder::with_ip(
                64,
                &code.bytes[at..],
                code.handler,
                iced_x86::DecoderOptions::NONE,
            );
            assert_eq!(dec.decode().code(), Code::Lea_r64_m);
            for inside in [Inside::ALWAYS, Inside::new(&[512, 1024]).unwrap()] {
                let len = enter_snippet_len(&hooks, 256, 3, &inside, Some(48));
                let built = enter_snippet(&hooks, 256, 3, &inside, Some(48), 0x5000).unwrap();
                assert!(built.len() <= len, "{} > {len}", built.len());
            }
        }
    }
}
