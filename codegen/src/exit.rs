//! Exit instrumentation by return-address redirection into per-thread return
//! slots.
//!
//! # Mechanism
//!
//! At an instrumented entry ([`Snippet::CountCallHookExit`](crate::Snippet)),
//! the trampoline pushes an *activation* on the thread's **return-slot
//! block**: it saves the original return address (RA) in data cell `d`
//! (`d` = the thread's depth) and overwrites the RA on the stack with the
//! address of code slot `d`. When the function returns (any `ret`, or the
//! `ret` of a function it tail-called), control lands in code slot `d`,
//! which calls the shared **exit handler** ([`exit_handler`]); the handler
//! pops the activation, counts the exit, and returns to the original RA with
//! every register, flag and `rsp` exactly as the plain `ret` would have left
//! them.
//!
//! # Block layout ([`ReturnSlots`])
//!
//! ```text
//! block + 0                 code slot 0      } code part, `delta()` bytes,
//! block + 32*i              code slot i      } identical for every block of a
//! block + 32*capacity       exit handler ptr } layout: build it with
//! ...   int3 padding up to `delta()` (4 KiB multiple)  [`return_block_code`]
//! block + delta()           data cell 0      } data part, 32*capacity bytes,
//! block + delta() + 32*i    data cell i      } zero-initialized, thread-private
//! ```
//!
//! Slot and cell strides are both [`SLOT_SIZE`] = [`CELL_SIZE`] = 32, so the
//! cell of the slot at address `s` is at `s + delta()`. The code part only
//! needs to be readable and executable and the data part only readable and
//! writable: they are on different pages.
//!
//! A code slot is `int3 ; call qword [rip + X] ; int3 padding`, with `X`
//! reaching the exit-handler pointer after the slots (the displacement
//! differs per slot; the code part does not depend on the block's address).
//! Redirected return addresses point at slot + [`SLOT_ENTRY`] (the `call`),
//! never at the slot's first byte: unwinders look up the FDE of `RA - 1`,
//! which must fall inside the slot (see [`block_eh_frame`](crate::block_eh_frame)).
//!
//! A data cell ([`CELL_SIZE`] bytes): original RA at [`CELL_RETURN_ADDRESS`],
//! entry `rsp` (the address of the RA slot on the stack) at
//! [`CELL_ENTRY_RSP`], the metric base (i32 byte offset into the row) at
//! [`CELL_METRIC`], and 8 bytes at [`CELL_SCRATCH`] reserved (unused: the
//! timers keep their start times in the row, where readers can see them).
//!
//! # Thread row fields (offsets chosen by the runtime)
//!
//! * `block_offset`: address of the thread's block (0: none, exits are not
//!   hooked);
//! * `depth_offset`: number of open activations (0 ≤ depth ≤ capacity);
//! * optional `stack_bounds_offset`: two words `[lo, hi)`, the thread's own
//!   stack. Closing activations by `rsp` comparison at entry is done only when
//!   the current `rsp` lies in it (so a signal handler on a `sigaltstack`
//!   placed above the thread stack never closes live activations).
//!
//! Per instrumented function, at its metric base `m` (a row byte offset),
//! four words: entries `m +` [`METRIC_ENTRIES`], exits `m +`
//! [`METRIC_EXITS`], activations closed without a normal exit (longjmp,
//! exceptions) `m +` [`METRIC_UNWOUND`], entries whose exit could not be
//! hooked (no block, or depth = capacity) `m +` [`METRIC_UNHOOKED`]. For a
//! quiescent thread, `entries = exits + unwound + unhooked + open`.
//!
//! # Timers
//!
//! A layout built with [`ReturnSlots::with_timers`] adds per-function
//! inclusive wall/CPU timers (words `m + 32 .. m + 80`, see the `timer`
//! module and [`TIMER_METRIC_LEN`](crate::TIMER_METRIC_LEN)): the entry
//! starts the function's timer once its return is redirected, and every
//! close of an activation (hooked exit, or closed as unwound at an entry or
//! exit) stops it, at that moment. Only the outermost activation of a
//! function on a thread is timed. Without timers the generated code is
//! byte-for-byte what it was.
//!
//! # Closing activations whose frames are gone
//!
//! * At entry (`E` = `rsp` at the function entry = the RA's address), the top
//!   activation `j` is stale when `E_j < E`, or `E_j == E` and the RA at `E`
//!   is not slot `j`'s return address (`E_j == E` with the RA being slot
//!   `j`'s is a tail call from activation `j`, which is still open: the new
//!   activation nests inside it). Stale activations are popped one by one
//!   (counted in their `METRIC_UNWOUND`) before pushing.
//! * At exit, the activation is identified exactly by the slot returned
//!   through (index `k`): every activation above `k` is stale (it was entered
//!   after `k` and `k` is leaving), so they are closed as unwound, then `k`
//!   is exited. This uses no `rsp` comparison. If `k ≥ depth` (already
//!   closed), nothing is counted, but the return still goes to the RA in the
//!   cell: the RA is found from the slot's address alone, never from the row.
//!
//! # Signal safety
//!
//! A signal handler running instrumented code can interrupt any instruction.
//! The entry stores the cell's entry `rsp`, publishes `depth + 1`, stores the
//! cell again fully, and only then redirects the RA; the exit reads the
//! cell before publishing the smaller depth. A handler that interrupts either
//! sequence therefore never sees (or reuses) a half-written open cell.
//!
//! # Functions whose exit must not be hooked
//!
//! Redirection changes the return address the function sees on its stack.
//! The injector must not use [`Snippet::CountCallHookExit`](crate::Snippet)
//! for: functions that return twice or save their RA for later (`setjmp`,
//! `sigsetjmp`, `_setjmp`, `getcontext`, `vfork`, `__sigsetjmp`): the saved
//! RA is a slot whose cell is reused; functions that inspect their caller's
//! address (`dlopen`, `dlsym`/`RTLD_NEXT`, `dlvsym`, `__libc_dlopen_mode`, any
//! `__builtin_return_address(0)` user); and any process running with a CET
//! shadow stack (`ret` to a redirected address faults). Coroutine switches
//! (`swapcontext`, fibers) break the one-stack-per-thread assumption: exits
//! are still correct (the RA comes from the slot's own cell) but counts may be
//! closed early or late.

use iced_x86::code_asm::*;
use iced_x86::{Code, Instruction, MemoryOperand, Register};

use crate::timer::{emit_close, emit_open, TimerSpec};
use crate::BuildError;

/// Bytes per code slot.
pub const SLOT_SIZE: u32 = 32;
/// Bytes per data cell (equal to [`SLOT_SIZE`], so `cell = slot + delta`).
pub const CELL_SIZE: u32 = 32;
/// Offset inside a code slot of its `call`: redirected return addresses are
/// `slot + SLOT_ENTRY`. The byte before it is an `int3`.
pub const SLOT_ENTRY: u32 = 1;
/// Offset inside a code slot of the end of its `call` (the return address
/// the exit handler finds on its stack).
pub const SLOT_CALL_END: u32 = 7;
/// Offset inside a data cell of the original return address (u64).
pub const CELL_RETURN_ADDRESS: i32 = 0;
/// Offset inside a data cell of the entry `rsp` (u64): the address of the
/// return address on the stack when the function was entered.
pub const CELL_ENTRY_RSP: i32 = 8;
/// Offset inside a data cell of the metric base (i32 row byte offset).
pub const CELL_METRIC: i32 = 16;
/// Offset inside a data cell of 8 bytes reserved for the exit snippet work
/// (the timer's start time).
pub const CELL_SCRATCH: i32 = 24;

/// Offset from a metric base of the entries counter (u64).
pub const METRIC_ENTRIES: i32 = 0;
/// Offset from a metric base of the hooked-exits counter (u64).
pub const METRIC_EXITS: i32 = 8;
/// Offset from a metric base of the counter of activations closed because
/// their frame was discarded (longjmp, exceptions) (u64).
pub const METRIC_UNWOUND: i32 = 16;
/// Offset from a metric base of the counter of entries whose exit could not
/// be hooked (no block, or the block was full) (u64).
pub const METRIC_UNHOOKED: i32 = 24;
/// Bytes of row used per metric base.
pub const METRIC_LEN: i32 = 32;

/// Page size the block's code/data split is aligned to.
const PAGE: u32 = 4096;

/// Largest supported capacity (keeps every block offset a small disp32).
pub const MAX_CAPACITY: u32 = 1 << 20;

/// The return-slot block layout and where a thread's row keeps its state.
/// Shared by the entry snippets, the exit handler, the block code and its
/// CFI; all blocks of a process use one layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReturnSlots {
    capacity: u32,
    block_offset: i32,
    depth_offset: i32,
    stack_bounds_offset: Option<i32>,
    timers: Option<TimerSpec>,
}

/// An invalid [`ReturnSlots`] layout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// The capacity is 0 or above [`MAX_CAPACITY`].
    #[error("a return-slot block holds 1 to {MAX_CAPACITY} activations, not {0}")]
    Capacity(u32),
    /// A row offset is negative or not 8-byte aligned.
    #[error("row field offset {0} must be non-negative and 8-byte aligned")]
    RowOffset(i32),
    /// A selected clock's function or state address is 0.
    #[error("the timer's {0} address is 0")]
    NullTimerAddress(&'static str),
}

impl ReturnSlots {
    /// A layout for blocks of `capacity` activations; `block_offset` and
    /// `depth_offset` are the row byte offsets of the block address and the
    /// depth words, `stack_bounds_offset` that of the `[lo, hi)` pair (see the
    /// module docs; `None` disables the check: every `rsp` counts as on the
    /// thread stack).
    ///
    /// # Errors
    ///
    /// [`LayoutError`] for a capacity of 0 or above [`MAX_CAPACITY`], or a
    /// negative or misaligned offset.
    pub fn new(
        capacity: u32,
        block_offset: i32,
        depth_offset: i32,
        stack_bounds_offset: Option<i32>,
    ) -> Result<Self, LayoutError> {
        if capacity == 0 || capacity > MAX_CAPACITY {
            return Err(LayoutError::Capacity(capacity));
        }
        for off in [Some(block_offset), Some(depth_offset), stack_bounds_offset]
            .into_iter()
            .flatten()
        {
            if off < 0 || off % 8 != 0 || off > i32::MAX - 16 {
                return Err(LayoutError::RowOffset(off));
            }
        }
        Ok(Self {
            capacity,
            block_offset,
            depth_offset,
            stack_bounds_offset,
            timers: None,
        })
    }

    /// The same layout with inclusive timers (see the `timer` module): the
    /// entry snippets start the function's timer, the exit handler and the
    /// closing of unwound activations stop it, and every function hooked
    /// with this layout uses [`TIMER_METRIC_LEN`](crate::TIMER_METRIC_LEN)
    /// bytes at its metric base. With [`Timers::NONE`](crate::Timers::NONE)
    /// the layout stays timer-less and the code is exactly that of
    /// [`ReturnSlots::new`]. The entry snippets and the exit handler of one
    /// process must all be built from the same layout.
    ///
    /// # Errors
    ///
    /// [`LayoutError::RowOffset`] for a misaligned or negative
    /// `cpu_state_row_offset` (when the CPU clock is selected),
    /// [`LayoutError::NullTimerAddress`] for a selected clock whose function
    /// or (wall) state address is 0.
    pub fn with_timers(self, spec: TimerSpec) -> Result<Self, LayoutError> {
        let t = spec.timers;
        if !t.any() {
            return Ok(Self {
                timers: None,
                ..self
            });
        }
        if t.wall && spec.wall_fn == 0 {
            return Err(LayoutError::NullTimerAddress("wall clock function"));
        }
        if t.wall && spec.wall_state == 0 {
            return Err(LayoutError::NullTimerAddress("wall clock state"));
        }
        if t.cpu && spec.cpu_fn == 0 {
            return Err(LayoutError::NullTimerAddress("cpu clock function"));
        }
        let off = spec.cpu_state_row_offset;
        if t.cpu && (off < 0 || off % 8 != 0) {
            return Err(LayoutError::RowOffset(off));
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

    /// Bytes of row used per hooked function at its metric base:
    /// [`METRIC_LEN`], or [`TIMER_METRIC_LEN`](crate::TIMER_METRIC_LEN) with
    /// timers.
    pub fn metric_len(&self) -> i32 {
        if self.timers.is_some() {
            crate::timer::TIMER_METRIC_LEN
        } else {
            METRIC_LEN
        }
    }

    /// Activations per block.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Row offset of the block-address word.
    pub fn block_offset(&self) -> i32 {
        self.block_offset
    }

    /// Row offset of the depth word.
    pub fn depth_offset(&self) -> i32 {
        self.depth_offset
    }

    /// Row offset of the `[lo, hi)` stack-bounds pair, if used.
    pub fn stack_bounds_offset(&self) -> Option<i32> {
        self.stack_bounds_offset
    }

    /// Distance from a code slot to its data cell, and size of the code part:
    /// the slots plus the exit-handler pointer, rounded up to 4 KiB.
    pub fn delta(&self) -> u32 {
        (self.capacity * SLOT_SIZE + 8).next_multiple_of(PAGE)
    }

    /// Offset in the block of the exit-handler pointer.
    pub fn handler_pointer_offset(&self) -> u32 {
        self.capacity * SLOT_SIZE
    }

    /// Size of the data part (cells), at `block + delta()`.
    pub fn data_len(&self) -> u32 {
        self.capacity * CELL_SIZE
    }

    /// Total block size, a multiple of 4 KiB.
    pub fn block_len(&self) -> u32 {
        (self.delta() + self.data_len()).next_multiple_of(PAGE)
    }

    /// The redirected return address of slot `index` in the block at `block`.
    pub fn slot_return_address(&self, block: u64, index: u32) -> u64 {
        block + u64::from(index * SLOT_SIZE + SLOT_ENTRY)
    }

    /// Address of data cell `index` in the block at `block`.
    pub fn cell_address(&self, block: u64, index: u32) -> u64 {
        block + u64::from(self.delta() + index * CELL_SIZE)
    }
}

/// The code part of a block (`slots.delta()` bytes, to be written at the
/// block's address): every code slot, then the address of the exit handler
/// built by [`exit_handler`]. It does not depend on the block's address, so
/// one copy can be written into every block. The data part after it must be
/// zero-filled (any content works, but zeros keep the dumps readable).
pub fn return_block_code(slots: &ReturnSlots, exit_handler: u64) -> Vec<u8> {
    let mut code = vec![0xcc_u8; slots.delta() as usize];
    let ptr = slots.handler_pointer_offset();
    for i in 0..slots.capacity {
        let at = (i * SLOT_SIZE) as usize;
        // call qword [rip + disp32]: ff 15 disp32, rip = slot + SLOT_CALL_END.
        let disp = ptr as i64 - i64::from(i * SLOT_SIZE + SLOT_CALL_END);
        let disp = i32::try_from(disp).expect("MAX_CAPACITY keeps slots within disp32");
        let entry = at + SLOT_ENTRY as usize;
        code[entry] = 0xff;
        code[entry + 1] = 0x15;
        code[entry + 2..entry + 6].copy_from_slice(&disp.to_le_bytes());
    }
    let p = ptr as usize;
    code[p..p + 8].copy_from_slice(&exit_handler.to_le_bytes());
    code
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

/// The entry snippet of [`Snippet::CountCallHookExit`](crate::Snippet), for
/// code at `ip` (its length does not depend on `ip`).
///
/// Contract (the trampoline's snippet contract): `rcx` = row (non-null),
/// `rax` = the saved flags (untouched), `[rsp]` and `[rsp+8]` = the
/// trampoline's saved `rcx` and `rax`, `[rsp+16]` = the return address.
/// Clobbers flags only (the trampoline restores them); saves and restores
/// `rdx`, `rsi`, `rdi`, `r8` on the stack (below the entry `rsp`, where
/// nothing lives at a function entry).
///
/// With timers, it also saves `r9`-`r11` (so every argument register, `r10`
/// and `r11` reach the function intact), calls the timer-stop subroutine
/// after each stale activation it closes and the timer-start subroutine
/// after redirecting the RA (both emitted inside the snippet, after its
/// `jmp .out`; contracts in the `timer` module). Stack below the entry
/// `rsp`: 16 (trampoline) + 56 (saves) + 8 + 48 (subroutine) + 8 + 16
/// (clock reader) = 152 bytes at most.
///
/// ```text
///     inc qword [rcx + metric + ENTRIES]
///     push rdx ; push rsi ; push rdi ; push r8
///     mov rsi, [rcx + block] ; test rsi, rsi ; jz .unhooked
///     lea r8, [rsp + 48]                       ; E: address of the RA
///     mov rdx, [rcx + depth] ; cmp rdx, cap ; ja .unhooked   ; corrupt
/// .top: test rdx, rdx ; jz .push
///     lea rdi, [rdx - 1] ; shl rdi, 5 ; add rdi, rsi   ; slot of the top
///     cmp [rdi + delta + ENTRY_RSP], r8 ; ja .push     ; its frame is live
///     jb .stale
///     inc rdi ; cmp [r8], rdi ; je .push ; dec rdi     ; tail call from it
/// .stale:                                              ; (bounds, optional)
///     cmp r8, [rcx + lo] ; jb .push ; cmp r8, [rcx + hi] ; jae .push
///     movsxd rdi, dword [rdi + delta + METRIC]
///     dec rdx ; mov [rcx + depth], rdx
///     inc qword [rcx + rdi + UNWOUND] ; jmp .top
/// .push: cmp rdx, cap ; jae .unhooked
///     mov rdi, rdx ; shl rdi, 5 ; add rdi, rsi         ; slot d
///     mov [rdi + delta + ENTRY_RSP], r8
///     lea rsi, [rdx + 1] ; mov [rcx + depth], rsi      ; publish
///     mov [rdi + delta + ENTRY_RSP], r8
///     mov rsi, [r8] ; mov [rdi + delta + RA], rsi
///     mov dword [rdi + delta + METRIC], metric
///     inc rdi ; mov [r8], rdi                          ; redirect the RA
///     jmp .out
/// .unhooked: inc qword [rcx + metric + UNHOOKED]
/// .out: pop r8 ; pop rdi ; pop rsi ; pop rdx
/// ```
pub(crate) fn enter_snippet(
    slots: &ReturnSlots,
    metric: i32,
    ip: u64,
) -> Result<Vec<u8>, BuildError> {
    let mut a = CodeAssembler::new(64).map_err(asm_err)?;
    enter_asm(&mut a, slots, metric).map_err(asm_err)?;
    let bytes = a.assemble(ip).map_err(asm_err)?;
    Ok(bytes)
}

/// Upper bound (in fact the exact length) of [`enter_snippet`].
pub(crate) fn enter_snippet_len(slots: &ReturnSlots, metric: i32) -> usize {
    enter_snippet(slots, metric, 0).map_or(0, |b| b.len())
}

fn enter_asm(a: &mut CodeAssembler, s: &ReturnSlots, metric: i32) -> Result<(), IcedError> {
    let m = i64::from(metric);
    let delta = i64::from(s.delta());
    let cap = s.capacity as i32;
    let block = i64::from(s.block_offset);
    let depth = i64::from(s.depth_offset);
    let mut top = a.create_label();
    let mut stale = a.create_label();
    let mut push = a.create_label();
    let mut unhooked = a.create_label();
    let mut out = a.create_label();
    let mut open = a.create_label();
    let mut close = a.create_label();
    let saved = saved_regs(s, &[rdx, rsi, rdi, r8]);

    a.inc(qword_ptr(rcx + (m + i64::from(METRIC_ENTRIES))))?;
    for r in &saved {
        a.push(*r)?;
    }
    a.mov(rsi, qword_ptr(rcx + block))?;
    a.test(rsi, rsi)?;
    a.jz(unhooked)?;
    // E: above the saves and the trampoline's rax, rcx.
    a.lea(r8, qword_ptr(rsp + (8 * saved.len() as i64 + 16)))?;
    a.mov(rdx, qword_ptr(rcx + depth))?;
    a.cmp(rdx, cap)?;
    a.ja(unhooked)?;

    a.set_label(&mut top)?;
    a.test(rdx, rdx)?;
    a.jz(push)?;
    a.lea(rdi, qword_ptr(rdx - 1))?;
    a.shl(rdi, 5)?;
    a.add(rdi, rsi)?;
    a.cmp(qword_ptr(rdi + (delta + i64::from(CELL_ENTRY_RSP))), r8)?;
    a.ja(push)?;
    a.jb(stale)?;
    a.inc(rdi)?;
    a.cmp(qword_ptr(r8), rdi)?;
    a.je(push)?;
    a.dec(rdi)?;

    a.set_label(&mut stale)?;
    if let Some(b) = s.stack_bounds_offset {
        let b = i64::from(b);
        a.cmp(r8, qword_ptr(rcx + b))?;
        a.jb(push)?;
        a.cmp(r8, qword_ptr(rcx + (b + 8)))?;
        a.jae(push)?;
    }
    a.movsxd(rdi, dword_ptr(rdi + (delta + i64::from(CELL_METRIC))))?;
    a.dec(rdx)?;
    a.mov(qword_ptr(rcx + depth), rdx)?;
    a.inc(qword_ptr(rcx + rdi + i64::from(METRIC_UNWOUND)))?;
    if s.timers.is_some() {
        a.call(close)?; // rdi = its metric; keeps rax, rcx, rdx, rsi, r8
    }
    a.jmp(top)?;

    a.set_label(&mut push)?;
    a.cmp(rdx, cap)?;
    a.jae(unhooked)?;
    a.mov(rdi, rdx)?;
    a.shl(rdi, 5)?;
    a.add(rdi, rsi)?;
    a.mov(qword_ptr(rdi + (delta + i64::from(CELL_ENTRY_RSP))), r8)?;
    a.lea(rsi, qword_ptr(rdx + 1))?;
    a.mov(qword_ptr(rcx + depth), rsi)?;
    a.mov(qword_ptr(rdi + (delta + i64::from(CELL_ENTRY_RSP))), r8)?;
    a.mov(rsi, qword_ptr(r8))?;
    a.mov(
        qword_ptr(rdi + (delta + i64::from(CELL_RETURN_ADDRESS))),
        rsi,
    )?;
    a.mov(dword_ptr(rdi + (delta + i64::from(CELL_METRIC))), metric)?;
    a.inc(rdi)?;
    a.mov(qword_ptr(r8), rdi)?;
    if let Some(spec) = &s.timers {
        // mov rdi, imm32 (sign-extended, like the cells' movsxd)
        a.add_instruction(Instruction::with2(
            Code::Mov_rm64_imm32,
            Register::RDI,
            metric,
        )?)?;
        a.call(open)?;
        a.jmp(out)?;
        emit_open(a, spec, &mut open)?;
        emit_close(a, spec, &mut close)?;
    } else {
        a.jmp(out)?;
    }

    a.set_label(&mut unhooked)?;
    a.inc(qword_ptr(rcx + (m + i64::from(METRIC_UNHOOKED))))?;
    a.set_label(&mut out)?;
    for r in saved.iter().rev() {
        a.pop(*r)?;
    }
    Ok(())
}

/// `base`, plus `r9`-`r11` when timers are on (the clock readers clobber
/// them).
fn saved_regs(s: &ReturnSlots, base: &[AsmRegister64]) -> Vec<AsmRegister64> {
    let mut regs = base.to_vec();
    if s.timers.is_some() {
        regs.extend([r9, r10, r11]);
    }
    regs
}

/// Builds the exit handler, to be written at `address` (anywhere: slots
/// reach it through the absolute pointer in their block). One handler
/// serves every block of `slots`'s layout and every thread; build one per
/// process (or per trampoline region).
///
/// Contract: entered by the `call` of code slot `k`, so `[rsp]` = slot +
/// [`SLOT_CALL_END`] and `rsp` = the instrumented function's entry `rsp` (its
/// `ret` popped the redirected RA, the `call` pushed over it). It returns to
/// the original RA from cell `k` with `rsp` = entry `rsp` + 8, exactly as the
/// function's own `ret` would have, and with every register (GPRs; it uses
/// no x87/SSE/AVX instruction, so `xmm0`/`xmm1`/`st0` return values are
/// untouched), all arithmetic flags and DF unchanged. It uses 48 bytes of
/// stack below the caller's `rsp`, where nothing lives once a call returned.
///
/// With timers (see [`ReturnSlots::with_timers`]) it also saves `r9`-`r11`
/// (72 bytes of saves) and calls its timer-stop subroutine (emitted after
/// its `ret`) for the exiting activation and for every stale activation it
/// closes; those calls reach the runtime's clock readers, which touch no
/// vector register. Stack: at most 72 + 8 + 48 + 8 + 16 = 152 bytes below
/// the caller's `rsp`.
///
/// ```text
///     endbr64
///     push rax ; push rcx ; push rdx ; push rsi ; push rdi ; push r8
///     seto al ; lahf
///     mov rsi, [rsp + 48]                           ; slot + 7
///     mov rdx, [rsi + delta - 7 + RA] ; mov [rsp + 48], rdx   ; ret target
///     sub rsi, 7                                    ; slot k
///     mov rcx, fs:[tls_offset] ; test rcx, rcx ; jz .done
///     mov rdx, rsi ; sub rdx, [rcx + block]
///     cmp rdx, 32*cap ; jae .done                   ; not this thread's block
///     shr rdx, 5                                    ; k
/// .top: mov rdi, [rcx + depth] ; cmp rdi, cap ; ja .done
///     lea r8, [rdx + 1] ; cmp rdi, r8 ; jbe .last
///     dec rdi ; mov r8, rdi ; sub r8, rdx ; shl r8, 5    ; cell j - cell k
///     movsxd r8, dword [rsi + r8 + delta + METRIC]
///     mov [rcx + depth], rdi ; inc qword [rcx + r8 + UNWOUND] ; jmp .top
/// .last: jne .done                                  ; k already closed
///     movsxd r8, dword [rsi + delta + METRIC]
///     mov [rcx + depth], rdx
///     inc qword [rcx + r8 + EXITS]                  ; exit snippet work
/// .done: add al, 0x7f ; sahf
///     pop r8 ; pop rdi ; pop rsi ; pop rdx ; pop rcx ; pop rax
///     ret
/// ```
///
/// (with timers: `push r9 ; push r10 ; push r11` after the pushes, so the
/// slot's return address is at `[rsp + 72]`; `mov rdi, r8 ; call .close`
/// after each `inc` of UNWOUND or EXITS; the matching pops.)
///
/// # Errors
///
/// [`BuildError::Encode`] only on an internal encoding failure.
pub fn exit_handler(
    address: u64,
    tls_offset: i32,
    slots: &ReturnSlots,
) -> Result<Vec<u8>, BuildError> {
    let mut a = CodeAssembler::new(64).map_err(asm_err)?;
    exit_asm(&mut a, tls_offset, slots).map_err(asm_err)?;
    a.assemble(address).map_err(asm_err)
}

/// Exact length of [`exit_handler`] for this layout.
pub fn exit_handler_len(tls_offset: i32, slots: &ReturnSlots) -> usize {
    exit_handler(0, tls_offset, slots).map_or(0, |b| b.len())
}

fn exit_asm(a: &mut CodeAssembler, tls_offset: i32, s: &ReturnSlots) -> Result<(), IcedError> {
    let delta = i64::from(s.delta());
    let cap = s.capacity as i32;
    let block = i64::from(s.block_offset);
    let depth = i64::from(s.depth_offset);
    let call_end = i64::from(SLOT_CALL_END);
    let mut top = a.create_label();
    let mut last = a.create_label();
    let mut done = a.create_label();
    let mut close = a.create_label();
    let saved = saved_regs(s, &[rax, rcx, rdx, rsi, rdi, r8]);
    let ret_slot = 8 * saved.len() as i64;

    a.endbr64()?;
    for r in &saved {
        a.push(*r)?;
    }
    a.seto(al)?;
    a.lahf()?;
    a.mov(rsi, qword_ptr(rsp + ret_slot))?;
    a.mov(
        rdx,
        qword_ptr(rsi + (delta - call_end + i64::from(CELL_RETURN_ADDRESS))),
    )?;
    a.mov(qword_ptr(rsp + ret_slot), rdx)?;
    a.sub(rsi, call_end as i32)?;
    a.add_instruction(Instruction::with2(
        Code::Mov_r64_rm64,
        Register::RCX,
        fs_absolute(tls_offset),
    )?)?;
    a.test(rcx, rcx)?;
    a.jz(done)?;
    a.mov(rdx, rsi)?;
    a.sub(rdx, qword_ptr(rcx + block))?;
    a.cmp(rdx, cap * SLOT_SIZE as i32)?;
    a.jae(done)?;
    a.shr(rdx, 5)?;

    a.set_label(&mut top)?;
    a.mov(rdi, qword_ptr(rcx + depth))?;
    a.cmp(rdi, cap)?;
    a.ja(done)?;
    a.lea(r8, qword_ptr(rdx + 1))?;
    a.cmp(rdi, r8)?;
    a.jbe(last)?;
    a.dec(rdi)?;
    a.mov(r8, rdi)?;
    a.sub(r8, rdx)?;
    a.shl(r8, 5)?;
    a.movsxd(r8, dword_ptr(rsi + r8 + (delta + i64::from(CELL_METRIC))))?;
    a.mov(qword_ptr(rcx + depth), rdi)?;
    a.inc(qword_ptr(rcx + r8 + i64::from(METRIC_UNWOUND)))?;
    if s.timers.is_some() {
        a.mov(rdi, r8)?;
        a.call(close)?; // keeps rax, rcx, rdx, rsi
    }
    a.jmp(top)?;

    a.set_label(&mut last)?;
    a.jne(done)?;
    a.movsxd(r8, dword_ptr(rsi + (delta + i64::from(CELL_METRIC))))?;
    a.mov(qword_ptr(rcx + depth), rdx)?;
    a.inc(qword_ptr(rcx + r8 + i64::from(METRIC_EXITS)))?;
    if s.timers.is_some() {
        a.mov(rdi, r8)?;
        a.call(close)?;
    }

    a.set_label(&mut done)?;
    a.add(al, 0x7f)?;
    a.sahf()?;
    for r in saved.iter().rev() {
        a.pop(*r)?;
    }
    a.ret()?;
    if let Some(spec) = &s.timers {
        emit_close(a, spec, &mut close)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_arithmetic() {
        let s = ReturnSlots::new(1024, 0, 8, Some(16)).unwrap();
        assert_eq!(s.delta(), 32 * 1024 + 4096);
        assert_eq!(s.block_len(), 32 * 1024 * 2 + 4096);
        assert_eq!(s.slot_return_address(0x10000, 3), 0x10000 + 97);
        assert_eq!(
            s.cell_address(0x10000, 3),
            0x10000 + u64::from(s.delta()) + 96
        );
        assert!(ReturnSlots::new(0, 0, 8, None).is_err());
        assert!(ReturnSlots::new(MAX_CAPACITY + 1, 0, 8, None).is_err());
        assert!(ReturnSlots::new(8, 4, 8, None).is_err());
        assert!(ReturnSlots::new(8, 0, -8, None).is_err());
    }

    #[test]
    fn slots_call_the_handler_pointer() {
        use iced_x86::{Decoder, DecoderOptions};
        let s = ReturnSlots::new(4, 0, 8, None).unwrap();
        let code = return_block_code(&s, 0x1122_3344_5566_7788);
        assert_eq!(code.len(), s.delta() as usize);
        let p = s.handler_pointer_offset() as usize;
        assert_eq!(
            u64::from_le_bytes(code[p..p + 8].try_into().unwrap()),
            0x1122_3344_5566_7788
        );
        for i in 0..4u64 {
            let at = (i * 32) as usize;
            assert_eq!(code[at], 0xcc);
            let mut d = Decoder::with_ip(64, &code[at + 1..], 0x1000 + i * 32 + 1, 0);
            let ins = d.decode();
            let _ = DecoderOptions::NONE;
            assert_eq!(ins.code(), Code::Call_rm64);
            assert_eq!(ins.len(), 6);
            assert_eq!(ins.ip_rel_memory_address(), 0x1000 + p as u64);
        }
    }

    #[test]
    fn timers_none_is_the_plain_layout_and_timers_change_the_code() {
        use crate::{TimerSpec, Timers, TIMER_METRIC_LEN};
        let plain = ReturnSlots::new(8, 0, 8, Some(16)).unwrap();
        let spec = |timers| TimerSpec {
            timers,
            wall_fn: 0x1111,
            wall_state: 0x2222,
            cpu_fn: 0x3333,
            cpu_state_row_offset: 40,
        };
        let none = plain.with_timers(spec(Timers::NONE)).unwrap();
        assert_eq!(none, plain);
        assert_eq!(none.metric_len(), METRIC_LEN);
        assert_eq!(
            exit_handler(0x1000, -8, &none).unwrap(),
            exit_handler(0x1000, -8, &plain).unwrap()
        );
        let both = Timers {
            wall: true,
            cpu: true,
        };
        let timed = plain.with_timers(spec(both)).unwrap();
        assert_eq!(timed.metric_len(), TIMER_METRIC_LEN);
        assert_eq!(timed.timers().unwrap().timers, both);
        assert_ne!(
            exit_handler(0x1000, -8, &timed).unwrap(),
            exit_handler(0x1000, -8, &plain).unwrap()
        );
        assert_eq!(
            enter_snippet(&timed, 64, 0x5000).unwrap().len(),
            enter_snippet_len(&timed, 64)
        );
        // Validation.
        let bad = |f: fn(&mut TimerSpec)| {
            let mut s = spec(both);
            f(&mut s);
            plain.with_timers(s)
        };
        assert!(matches!(
            bad(|s| s.wall_fn = 0),
            Err(LayoutError::NullTimerAddress(_))
        ));
        assert!(matches!(
            bad(|s| s.wall_state = 0),
            Err(LayoutError::NullTimerAddress(_))
        ));
        assert!(matches!(
            bad(|s| s.cpu_fn = 0),
            Err(LayoutError::NullTimerAddress(_))
        ));
        assert_eq!(
            bad(|s| s.cpu_state_row_offset = 12),
            Err(LayoutError::RowOffset(12))
        );
        // Wall only: the CPU parameters are not used.
        let wall_only = TimerSpec {
            timers: Timers {
                wall: true,
                cpu: false,
            },
            cpu_fn: 0,
            cpu_state_row_offset: -1,
            ..spec(both)
        };
        assert!(plain.with_timers(wall_only).is_ok());
    }
}
