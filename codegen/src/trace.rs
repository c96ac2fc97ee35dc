//! Call traces: entry and exit events in per-thread rings.
//!
//! A traced function is hooked like a timed one (its activation is pushed
//! on the thread's activation stack, see the `exit` module); its entry
//! snippet also writes an *entry event* into the thread's trace ring, and
//! whoever closes the activation — the exit handler (a return), the
//! stale-activation closer (a frame discarded by `longjmp`), the runtime
//! (an exception passing through, thread exit) — writes the matching
//! *exit event*. The cell flag [`CELL_TRACE`](crate::CELL_TRACE) says the
//! activation is traced. The ring layout is `weft_abi::layout::trace`.
//!
//! # The write
//!
//! ```text
//!     <raw wall reading>            ; rax (rdtsc, or the runtime's routine),
//!     mov t, rax                    ; unless the timer took one: then that
//!     inc qword [row + ring + BUSY] ; cmp qword [row + ring + BUSY], 1 ; jne .drop
//!     mov rax, [row + ring + HEAD] ; mov rdx, rax ; sub rdx, [row + ring + TAIL]
//!     cmp rdx, capacity ; jae .drop ; full: never wait for the reader
//!     mov edx, eax ; and edx, capacity - 1 ; shl edx, 4 ; add rdx, row
//!     mov [rdx + ring + EVENTS], t                     ; the time
//!     mov dword [rdx + ring + EVENTS + 8], metric | kind
//!     mov [rdx + ring + EVENTS + 12], edi              ; the cell (its depth)
//!     inc rax ; mov [row + ring + HEAD], rax ; jmp .done ; published last
//! .drop: inc qword [row + ring + DROPPED]
//! .done: dec qword [row + ring + BUSY]
//! ```
//!
//! No lock, no system call, no allocation; a full ring costs one compare
//! and a counter. x86-64 keeps stores in program order, so a reader that
//! loads `head` sees every event below it complete.
//!
//! `BUSY` keeps a signal handler from writing into the slot an interrupted
//! write has reserved but not published: the handler, finding it raised by
//! the interrupted write, counts its own event as dropped. (A handler that
//! leaves by `longjmp` from inside those instructions would leave `BUSY`
//! raised: the thread's later events are then all counted as dropped, never
//! written out of order.)

use iced_x86::code_asm::*;

use crate::cells::CELL_METRIC;
use crate::disp;
use crate::slow_paths::SlowPaths;
use crate::timer::WallRead;
use weft_abi::layout::trace as ring;

/// Where the thread's trace ring is and how generated code reads the clock
/// for its events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRing {
    /// Row byte offset of the ring (64-byte aligned, non-negative).
    pub offset: i32,
    /// Events per ring: a power of two in
    /// `MIN_CAPACITY..=MAX_CAPACITY` of `weft_abi::layout::trace`.
    pub capacity: u32,
    /// How to read the raw wall clock (the timers' ticks).
    pub wall: WallRead,
}

impl TraceRing {
    /// Whether the ring's parameters are ones generated code can use.
    pub fn is_valid(&self) -> bool {
        self.offset >= 0
            && self.offset % 64 == 0
            && self.capacity.is_power_of_two()
            && (ring::MIN_CAPACITY..=ring::MAX_CAPACITY).contains(&self.capacity)
            && i64::from(self.offset) + ring::ring_bytes(self.capacity) as i64
                <= i64::from(i32::MAX)
            && match self.wall {
                WallRead::Tsc => true,
                WallRead::Call { routine, state } => routine != 0 && state != 0,
            }
    }
}

/// Where an event's time comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Time {
    /// Read the clock.
    Read,
    /// Already in `t` (the timer's reading).
    InT,
    /// In `t` unless `t` is 0: then read the clock.
    InTOrRead,
}

/// What an event names.
#[derive(Debug, Clone, Copy)]
pub(crate) enum EventOf {
    /// An entry of the function whose metric base is this constant.
    Entry(i32),
    /// A close of the activation in `rdi`'s cell, of this kind.
    Cell(u32),
}

/// Emits one event write (see the module docs). In: `rcx` = row, `rdi` =
/// the activation's cell. Clobbers `rax`, `rdx`, `t` and the flags.
pub(crate) fn emit_event(
    a: &mut CodeAssembler,
    r: &TraceRing,
    of: EventOf,
    (t, t32): (AsmRegister64, AsmRegister32),
    time: Time,
    lits: &mut SlowPaths,
) -> Result<(), IcedError> {
    let at = |off: usize| qword_ptr(rcx + (i64::from(r.offset) + i64::from(disp(off))));
    let ev = |off: usize| i64::from(r.offset) + i64::from(disp(ring::EVENTS + off));
    let mut drop = a.create_label();
    let mut done = a.create_label();
    let mut have = a.create_label();
    if time == Time::InTOrRead {
        a.test(t, t)?;
        a.jnz(have)?;
    }
    if time != Time::InT {
        crate::timer::read_wall(a, r.wall, lits)?;
        a.mov(t, rax)?;
    }
    a.set_label(&mut have)?;
    a.inc(at(ring::BUSY))?;
    a.cmp(at(ring::BUSY), 1)?;
    a.jne(drop)?;
    a.mov(rax, at(ring::HEAD))?;
    a.mov(rdx, rax)?;
    a.sub(rdx, at(ring::TAIL))?;
    a.cmp(rdx, r.capacity as i32)?;
    a.jae(drop)?;
    a.mov(edx, eax)?;
    a.and(edx, (r.capacity - 1) as i32)?;
    a.shl(edx, 4)?;
    const _: () = assert!(ring::EVENT_SIZE == 16);
    a.add(rdx, rcx)?;
    a.mov(qword_ptr(rdx + ev(ring::EV_TIME)), t)?;
    match of {
        EventOf::Entry(metric) => {
            a.mov(
                dword_ptr(rdx + ev(ring::EV_FUNCTION)),
                metric | ring::KIND_ENTRY as i32,
            )?;
        }
        EventOf::Cell(kind) => {
            a.mov(t32, dword_ptr(rdi + i64::from(CELL_METRIC)))?;
            a.or(t32, kind as i32)?;
            a.mov(dword_ptr(rdx + ev(ring::EV_FUNCTION)), t32)?;
        }
    }
    a.mov(dword_ptr(rdx + ev(ring::EV_CELL)), edi)?;
    a.inc(rax)?;
    a.mov(at(ring::HEAD), rax)?;
    a.jmp(done)?;
    a.set_label(&mut drop)?;
    a.inc(at(ring::DROPPED))?;
    a.set_label(&mut done)?;
    a.dec(at(ring::BUSY))
}

/// Emits a subroutine of the exit code that writes the close of `rdi`'s
/// activation (`kind`: exit or unwound); `rcx` = row, `r9` = the raw wall
/// reading the timer's stop took, or 0 to read the clock. Clobbers `rax`,
/// `rdx`, `r9` and the flags.
pub(crate) fn emit_close_routine(
    a: &mut CodeAssembler,
    r: &TraceRing,
    kind: u32,
) -> Result<(), IcedError> {
    let mut lits = SlowPaths::new();
    emit_event(
        a,
        r,
        EventOf::Cell(kind),
        (r9, r9d),
        Time::InTOrRead,
        &mut lits,
    )?;
    a.ret()?;
    lits.emit(a)
}
