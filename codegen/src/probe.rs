//! User probes: a call to a function in a library loaded into the target,
//! at a function's entry ([`Snippet::CallProbe`](crate::Snippet)) or exit
//! (an exit-hooked probe with [`ExitProbes`] in its layout), with what the
//! function was called with or returned.
//!
//! The probe function is ordinary C (or `extern "C"` Rust) code:
//!
//! ```c
//! #include "weft_probe.h"
//! void on_call(const struct weft_probe *p) { ... p->args[0] ... p->fargs[0] ... }
//! ```
//!
//! It gets a pointer to a [`ProbeContext`]-shaped struct (offsets
//! `CTX_*`) built on the thread's stack, and may use any register and the
//! vector state: everything the instrumented function can see is saved
//! around the call (the general registers, the flags, and the XSAVE state
//! the [`VectorSave`] names) and restored after it. It runs on the target's
//! thread and stack, with the thread's signals as they are; it must not
//! unwind (no C++ exception or Rust panic may leave it) and must be quick:
//! it runs at every call.
//!
//! A *predicate* ([`Predicate`]) is tested before anything is saved: a
//! probe whose predicate is false costs a compare and a branch.

use iced_x86::code_asm::*;

use crate::error::BuildError;
use crate::vector::{area_len, restore_vector, save_vector, VectorSave};

/// What a probe function receives (documentation of the layout written by
/// the generated code; `include/weft_probe.h` is the C declaration).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProbeContext {
    /// The integer and pointer arguments, System V order: `rdi`, `rsi`,
    /// `rdx`, `rcx`, `r8`, `r9` at the entry (0 at an exit).
    pub args: [u64; 6],
    /// The floating-point arguments: the low 64 bits of `xmm0`..`xmm7` at
    /// the entry (0 at an exit).
    pub fargs: [f64; 8],
    /// At an exit: `rax` (the integer or pointer return value).
    pub ret: u64,
    /// At an exit: `rdx` (the second half of a 128-bit return).
    pub ret2: u64,
    /// At an exit: the low 64 bits of `xmm0` (a `double` return value).
    pub fret: f64,
    /// The function's entry `rsp`: the return address is at `rsp`, the
    /// stack arguments from `rsp + 8` on.
    pub rsp: u64,
    /// The instrumented function's address.
    pub function: u64,
    /// The constant given when the probe was inserted.
    pub user: u64,
    /// weft's index of the calling thread (its row).
    pub thread: u32,
    /// [`POINT_ENTRY`], [`POINT_EXIT`] or [`POINT_INSTRUCTION`].
    pub point: u32,
}

/// `ProbeContext::point` at a function's entry.
pub const POINT_ENTRY: u32 = 0;
/// `ProbeContext::point` at a function's exit.
pub const POINT_EXIT: u32 = 1;
/// `ProbeContext::point` at an instruction point (before the instruction
/// runs): `args` are `rdi`..`r9` there, `ret`/`ret2`/`fret` are `rax`,
/// `rdx` and `xmm0` there (right after a call: its results), `rsp` is
/// `rsp` there and `function` the instruction's address.
pub const POINT_INSTRUCTION: u32 = 2;

/// Byte offsets in [`ProbeContext`].
pub const CTX_ARGS: i32 = 0;
/// See [`CTX_ARGS`].
pub const CTX_FARGS: i32 = 48;
/// See [`CTX_ARGS`].
pub const CTX_RET: i32 = 112;
/// See [`CTX_ARGS`].
pub const CTX_RET2: i32 = 120;
/// See [`CTX_ARGS`].
pub const CTX_FRET: i32 = 128;
/// See [`CTX_ARGS`].
pub const CTX_RSP: i32 = 136;
/// See [`CTX_ARGS`].
pub const CTX_FUNCTION: i32 = 144;
/// See [`CTX_ARGS`]. The runtime reads `user` too
/// (`weft_abi::layout::PROBE_CTX_USER`, whose value this is).
pub const CTX_USER: i32 = crate::disp(weft_abi::layout::PROBE_CTX_USER);
/// See [`CTX_ARGS`].
pub const CTX_THREAD: i32 = 160;
/// See [`CTX_ARGS`].
pub const CTX_POINT: i32 = 164;
/// Size of the context as the generated code reserves it (a multiple of
/// 16, so the call is aligned).
pub const CTX_SIZE: i32 = 176;

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(offset_of!(ProbeContext, args) == CTX_ARGS as usize);
    assert!(offset_of!(ProbeContext, fargs) == CTX_FARGS as usize);
    assert!(offset_of!(ProbeContext, ret) == CTX_RET as usize);
    assert!(offset_of!(ProbeContext, ret2) == CTX_RET2 as usize);
    assert!(offset_of!(ProbeContext, fret) == CTX_FRET as usize);
    assert!(offset_of!(ProbeContext, rsp) == CTX_RSP as usize);
    assert!(offset_of!(ProbeContext, function) == CTX_FUNCTION as usize);
    assert!(offset_of!(ProbeContext, user) == CTX_USER as usize);
    assert!(offset_of!(ProbeContext, thread) == CTX_THREAD as usize);
    assert!(offset_of!(ProbeContext, point) == CTX_POINT as usize);
    assert!(size_of::<ProbeContext>() <= CTX_SIZE as usize);
};

/// When a probe runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Predicate {
    /// Only when integer argument `arg` (0..6, System V order) equals
    /// `value`.
    ArgEquals {
        /// The argument's index.
        arg: u8,
        /// The value.
        value: u64,
    },
    /// Only in the thread of weft's index `thread`.
    Thread(u32),
}

/// A call to a user probe at a function's entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeCall {
    /// Absolute address of the probe function (`void f(const ctx *)`).
    pub function: u64,
    /// The constant the probe receives.
    pub user: u64,
    /// When it runs (None: always).
    pub predicate: Option<Predicate>,
    /// The vector state saved around the call.
    pub save: VectorSave,
    /// Row byte offset of the thread's index (u32).
    pub row_index: i32,
    /// The instrumented function's address (for the context).
    pub instrumented: u64,
}

/// The argument registers, System V order.
const ARGS: [AsmRegister64; 6] = [rdi, rsi, rdx, rcx, r8, r9];

fn asm_err(e: IcedError) -> BuildError {
    BuildError::Encode(e.to_string())
}

/// Checks a probe's fields.
pub(crate) fn validate(call: &ProbeCall) -> Result<(), BuildError> {
    if call.function == 0 {
        return Err(BuildError::Encode("a probe's function address is 0".into()));
    }
    if let Some(Predicate::ArgEquals { arg, .. }) = call.predicate {
        if arg >= 6 {
            return Err(BuildError::Encode(format!(
                "a probe's predicate names argument {arg}: only the six register arguments (0..6) can be tested"
            )));
        }
    }
    area_len(call.save)?;
    Ok(())
}

/// The entry snippet of [`Snippet::CallProbe`](crate::Snippet), built for
/// code at `ip`.
///
/// Contract (the trampoline's snippet contract): `rcx` = row, `ax` = the
/// saved flags, `[rsp]`/`[rsp+8]` = the trampoline's saved `rcx`/`rax`,
/// `[rsp+16]` = the return address; falls through with all of that
/// unchanged. Stack below the entry `rsp`: the saves, up to 63 bytes of
/// alignment, the XSAVE area, the context and whatever the probe uses.
///
/// ```text
///     <predicate: cmp, jne .skip>
///     push rcx ; push rax ; pushfq ; cld
///     push rdx ; push rsi ; push rdi ; push r8 ; push r9 ; push r10 ; push r11 ; push rbp
///     mov rbp, rsp ; and rsp, -64 ; sub rsp, AREA ; <zero the XSAVE header> ; xsave [rsp]
///     sub rsp, CTX_SIZE ; <fill the context> ; mov rdi, rsp
///     mov rax, function ; call rax
///     add rsp, CTX_SIZE ; xrstor [rsp] ; mov rsp, rbp
///     pop rbp ; ... ; pop rdx ; popfq ; pop rax ; pop rcx
/// .skip:
/// ```
///
/// `above` is how far the point's `rsp` is above the trampoline's (128 for
/// an instruction point, which steps over the red zone; 0 at an entry).
pub(crate) fn entry_snippet(call: &ProbeCall, above: i32, ip: u64) -> Result<Vec<u8>, BuildError> {
    validate(call)?;
    let mut a = CodeAssembler::new(64).map_err(asm_err)?;
    entry_asm(&mut a, call, above).map_err(asm_err)?;
    a.assemble(ip).map_err(asm_err)
}

/// Upper bound of [`entry_snippet`]'s length (it does not depend on `ip`).
pub(crate) fn entry_snippet_len(call: &ProbeCall) -> usize {
    entry_snippet(call, 1 << 20, 0).map_or(0, |b| b.len())
}

/// Saved by the call sequence, after `rcx`, `rax` and the flags.
const SAVED: [AsmRegister64; 8] = [rdx, rsi, rdi, r8, r9, r10, r11, rbp];

fn entry_asm(a: &mut CodeAssembler, call: &ProbeCall, above: i32) -> Result<(), IcedError> {
    let mut skip = a.create_label();
    emit_predicate(a, call, skip)?;
    a.push(rcx)?;
    a.push(rax)?;
    a.pushfq()?;
    a.cld()?; // the C ABI wants DF clear; popfq restores the caller's
    for r in SAVED {
        a.push(r)?;
    }
    // Now, from rsp: rbp, r11, r10, r9, r8, rdi, rsi, rdx at 0..56, the
    // flags at 64, rax (ax: the trampoline's flags) at 72, the row at 80,
    // the original rcx at 88 and rax at 96 (the trampoline's pushes), the
    // return address at 104.
    let entry_rsp = 104 + i64::from(above);
    a.mov(rbp, rsp)?;
    save_vector(a, call.save)?;
    a.sub(rsp, CTX_SIZE)?;
    // The arguments from their saved slots (the vector save used rax, rdx).
    for (i, slot) in [40, 48, 56, 88, 32, 24].into_iter().enumerate() {
        a.mov(rax, qword_ptr(rbp + slot))?;
        a.mov(qword_ptr(rsp + i64::from(CTX_ARGS + 8 * i as i32)), rax)?;
    }
    for (i, x) in [xmm0, xmm1, xmm2, xmm3, xmm4, xmm5, xmm6, xmm7]
        .iter()
        .enumerate()
    {
        a.movq(qword_ptr(rsp + i64::from(CTX_FARGS + 8 * i as i32)), *x)?;
    }
    // Only an instruction point (which steps over the red zone) is past
    // the function's entry: there `rax`, `rdx` and `xmm0` hold whatever
    // they hold (right after a call: what it returned); at an entry they
    // mean nothing yet.
    let point = if above == 0 {
        for off in [CTX_RET, CTX_RET2, CTX_FRET] {
            a.mov(qword_ptr(rsp + i64::from(off)), 0)?;
        }
        POINT_ENTRY
    } else {
        a.mov(rax, qword_ptr(rbp + 96))?; // the trampoline's saved rax
        a.mov(qword_ptr(rsp + i64::from(CTX_RET)), rax)?;
        a.mov(rax, qword_ptr(rbp + 56))?; // rdx
        a.mov(qword_ptr(rsp + i64::from(CTX_RET2)), rax)?;
        a.movq(qword_ptr(rsp + i64::from(CTX_FRET)), xmm0)?;
        POINT_INSTRUCTION
    };
    a.lea(rax, qword_ptr(rbp + entry_rsp))?;
    a.mov(qword_ptr(rsp + i64::from(CTX_RSP)), rax)?;
    a.mov(rax, call.instrumented)?;
    a.mov(qword_ptr(rsp + i64::from(CTX_FUNCTION)), rax)?;
    a.mov(rax, call.user)?;
    a.mov(qword_ptr(rsp + i64::from(CTX_USER)), rax)?;
    a.mov(rax, qword_ptr(rbp + 80))?; // the row
    a.mov(eax, dword_ptr(rax + i64::from(call.row_index)))?;
    a.mov(dword_ptr(rsp + i64::from(CTX_THREAD)), eax)?;
    a.mov(dword_ptr(rsp + i64::from(CTX_POINT)), point as i32)?;
    a.mov(rdi, rsp)?;
    a.mov(rax, call.function)?;
    a.call(rax)?;
    a.add(rsp, CTX_SIZE)?;
    restore_vector(a, call.save)?;
    a.mov(rsp, rbp)?;
    for r in SAVED.iter().rev() {
        a.pop(*r)?;
    }
    a.popfq()?;
    a.pop(rax)?;
    a.pop(rcx)?;
    a.set_label(&mut skip)?;
    // An instruction to carry the label (the trampoline's epilogue follows).
    a.nop()
}

/// The predicate test: falls through when the probe runs, jumps to `skip`
/// otherwise. Flags may change (the trampoline restores them).
fn emit_predicate(
    a: &mut CodeAssembler,
    call: &ProbeCall,
    skip: CodeLabel,
) -> Result<(), IcedError> {
    match call.predicate {
        None => Ok(()),
        Some(Predicate::Thread(t)) => {
            a.cmp(dword_ptr(rcx + i64::from(call.row_index)), t as i32)?;
            a.jne(skip)
        }
        Some(Predicate::ArgEquals { arg, value }) => {
            let reg = ARGS[arg as usize];
            let scratch = if reg == rdx { rsi } else { rdx };
            a.push(scratch)?;
            a.mov(scratch, value)?;
            if reg == rcx {
                // The original rcx, below the push: [rsp + 8].
                a.cmp(qword_ptr(rsp + 8), scratch)?;
            } else {
                a.cmp(reg, scratch)?;
            }
            a.pop(scratch)?;
            a.jne(skip)
        }
    }
}

/// Recording where an indirect call goes
/// ([`Snippet::RecordCallTarget`](crate::Snippet::RecordCallTarget)): the call's target, computed from its operand as the
/// call will, goes into the thread's table for the site: `slots` pairs of
/// (target, count) at row byte offset `table`, then one overflow counter
/// (calls to targets beyond the slots). Only the thread itself writes its
/// table; a reader sees, per thread, which functions the site reached and
/// how often.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallTargets {
    /// Row byte offset of the table (8-byte aligned).
    pub table: i32,
    /// (target, count) pairs in it.
    pub slots: u32,
}

impl CallTargets {
    /// Bytes of row the table takes.
    pub fn len(&self) -> i32 {
        16 * self.slots as i32 + 8
    }

    /// Whether the table has no slot (only the overflow counter).
    pub fn is_empty(&self) -> bool {
        self.slots == 0
    }
}

/// The snippet recording the target of the indirect call `call` (decoded
/// at its address, the instruction point's first displaced instruction),
/// for an instruction-point trampoline (`above` = 128: the red zone).
///
/// Contract: the trampoline's snippet contract (`rcx` = row, `ax` = flags,
/// the original `rcx` at `[rsp]`, `rax` at `[rsp+8]`); clobbers the flags
/// only.
pub(crate) fn record_target_snippet(
    call: &iced_x86::Instruction,
    targets: &CallTargets,
    above: i32,
    ip: u64,
) -> Result<Vec<u8>, BuildError> {
    let mut a = CodeAssembler::new(64).map_err(asm_err)?;
    record_target_asm(&mut a, call, targets, above).map_err(|e| match e {
        RecordError::Iced(e) => asm_err(e),
        RecordError::Unsupported(why) => BuildError::Encode(why),
    })?;
    a.assemble(ip).map_err(asm_err)
}

enum RecordError {
    Iced(IcedError),
    Unsupported(String),
}

impl From<IcedError> for RecordError {
    fn from(e: IcedError) -> Self {
        RecordError::Iced(e)
    }
}

fn reg64(r: iced_x86::Register) -> Option<AsmRegister64> {
    use iced_x86::Register as R;
    Some(match r {
        R::RAX => rax,
        R::RBX => rbx,
        R::RCX => rcx,
        R::RDX => rdx,
        R::RSI => rsi,
        R::RDI => rdi,
        R::RBP => rbp,
        R::RSP => rsp,
        R::R8 => r8,
        R::R9 => r9,
        R::R10 => r10,
        R::R11 => r11,
        R::R12 => r12,
        R::R13 => r13,
        R::R14 => r14,
        R::R15 => r15,
        _ => return None,
    })
}

/// `dst` = the value register `r` had at the instruction point. Our saves
/// are, from `rsp`: rsi (0), rdx (8), the trampoline's rcx (16) and rax
/// (24); the point's `rsp` is `rsp + 32 + above`.
fn load_original(
    a: &mut CodeAssembler,
    dst: AsmRegister64,
    r: iced_x86::Register,
    above: i32,
) -> Result<(), RecordError> {
    use iced_x86::Register as R;
    match r {
        R::RAX => a.mov(dst, qword_ptr(rsp + 24))?,
        R::RCX => a.mov(dst, qword_ptr(rsp + 16))?,
        R::RDX => a.mov(dst, qword_ptr(rsp + 8))?,
        R::RSI => a.mov(dst, qword_ptr(rsp))?,
        R::RSP => a.lea(dst, qword_ptr(rsp + (32 + above)))?,
        other => {
            let src = reg64(other).ok_or_else(|| {
                RecordError::Unsupported(format!("a call through {other:?} cannot be followed"))
            })?;
            if src != dst {
                a.mov(dst, src)?;
            }
        }
    }
    Ok(())
}

fn record_target_asm(
    a: &mut CodeAssembler,
    call: &iced_x86::Instruction,
    t: &CallTargets,
    above: i32,
) -> Result<(), RecordError> {
    use iced_x86::{OpKind, Register as R};
    // A call, or a jump of the same form (a PLT stub's `jmp [rip + slot]`:
    // where the stub really goes).
    if !matches!(
        call.code(),
        iced_x86::Code::Call_rm64 | iced_x86::Code::Jmp_rm64
    ) {
        return Err(RecordError::Unsupported(format!(
            "{:?} is not an indirect near call or jump (call/jmp r/m64)",
            call.code()
        )));
    }
    a.push(rdx)?;
    a.push(rsi)?;
    // rdx = the target.
    match call.op0_kind() {
        OpKind::Register => load_original(a, rdx, call.op0_register(), above)?,
        OpKind::Memory => {
            if call.segment_prefix() != R::None {
                return Err(RecordError::Unsupported(
                    "a call through a segment-relative pointer cannot be followed".into(),
                ));
            }
            if call.is_ip_rel_memory_operand() {
                a.mov(rdx, call.ip_rel_memory_address())?;
            } else {
                let disp = call.memory_displacement64() as i64;
                match call.memory_base() {
                    R::None => a.mov(rdx, disp as u64)?,
                    base => {
                        load_original(a, rdx, base, above)?;
                        if disp != 0 {
                            a.mov(rsi, disp as u64)?;
                            a.add(rdx, rsi)?;
                        }
                    }
                }
                if call.memory_index() != R::None {
                    load_original(a, rsi, call.memory_index(), above)?;
                    match call.memory_index_scale() {
                        1 => {}
                        2 => a.shl(rsi, 1)?,
                        4 => a.shl(rsi, 2)?,
                        _ => a.shl(rsi, 3)?,
                    }
                    a.add(rdx, rsi)?;
                }
            }
            a.mov(rdx, qword_ptr(rdx))?;
        }
        other => {
            return Err(RecordError::Unsupported(format!(
                "a call operand of kind {other:?} cannot be followed"
            )))
        }
    }
    // Find or claim the target's slot; count it.
    let mut done = a.create_label();
    for i in 0..t.slots as i32 {
        let target = qword_ptr(rcx + i64::from(t.table + 16 * i));
        let count = qword_ptr(rcx + i64::from(t.table + 16 * i + 8));
        let mut next = a.create_label();
        let mut claim = a.create_label();
        a.cmp(target, rdx)?;
        a.jne(claim)?;
        a.inc(count)?;
        a.jmp(done)?;
        a.set_label(&mut claim)?;
        a.cmp(target, 0)?;
        a.jne(next)?;
        // The count first: a reader that sees the target sees its count.
        a.inc(count)?;
        a.mov(target, rdx)?;
        a.jmp(done)?;
        a.set_label(&mut next)?;
        a.nop()?;
    }
    a.inc(qword_ptr(rcx + i64::from(t.table + 16 * t.slots as i32)))?;
    a.set_label(&mut done)?;
    a.pop(rsi)?;
    a.pop(rdx)?;
    Ok(())
}
