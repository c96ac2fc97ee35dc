//! Pure x86-64 code generation for weft.
//!
//! This crate decides where a function entry can be patched
//! ([`analyze_entry`]), moves the instructions the patch displaces to a new
//! address without changing what they do ([`relocate`]), and emits the
//! trampoline that counts a call and then runs them ([`build_trampoline`]),
//! plus the once-per-thread registration stub ([`register_stub`]).
//!
//! Everything here is a function from bytes and addresses to bytes: no system
//! calls, no global state. The injector owns memory, processes and timing; see
//! `docs/design.md` for the whole picture.
//!
//! All addresses are runtime addresses in the target process. All generated
//! code is 64-bit and position dependent: it must be written exactly at the
//! address it was built for.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod analyze;
pub mod bpf;
mod cells;
pub mod cfg;
mod encode;
mod error;
mod exit;
mod inside;
mod probe;
mod relocate;
mod remote_stub;
mod scan;
mod slow_paths;
mod timer;
mod trace;
mod trampoline;
mod vector;

pub use analyze::{analyze_at, analyze_entry, FunctionCode, PatchSite, Refusal, ShortReason};
pub use cells::{
    CELL_ENTRY_RSP, CELL_FLAGS, CELL_HISTOGRAM, CELL_METRIC, CELL_PROBE, CELL_RECORD_SHIFT,
    CELL_RETURN_ADDRESS, CELL_SELF_BASE, CELL_SIZE, CELL_TIMED, CELL_TRACE,
};
pub use cfg::{analyze_function, Disassembly};
pub use error::BuildError;
pub use exit::{
    exit_code, exit_code_len, ActivationRow, CallRecords, ExitCode, ExitHooks, ExitProbes,
    LayoutError, EXIT_CODE_STALE_ENTRY, EXIT_PROBE_SIZE, METRIC_ENTRIES, METRIC_EXITS, METRIC_LEN,
    METRIC_UNHOOKED, METRIC_UNWOUND, RECORD_RETURN, RECORD_SIZE,
};
pub use inside::{Inside, MAX_INSIDE};
pub use probe::{
    CallTargets, Predicate, ProbeCall, ProbeContext, CTX_ARGS, CTX_FARGS, CTX_FRET, CTX_FUNCTION,
    CTX_POINT, CTX_RET, CTX_RET2, CTX_RSP, CTX_SIZE, CTX_THREAD, CTX_USER, POINT_ENTRY, POINT_EXIT,
    POINT_INSTRUCTION,
};
pub use relocate::{max_relocated_len, relocate, RelocError, Relocated};
pub use remote_stub::{
    bootstrap_stub, remote_stub, stub_size, RemoteStub, BOOTSTRAP_LEN, BOOTSTRAP_REGS,
    SAVED_REGISTERS, SAVED_RFLAGS, SAVED_RIP, SAVED_RSP, SAVED_SIGMASK, STUB_CODE, STUB_MAGIC,
    STUB_REGS, STUB_SIZE, STUB_SIZE_FIELD, STUB_SYSCALL, STUB_XSAVE,
};
pub use scan::{direct_branches, Branch, BranchKind};
pub use timer::{
    CpuClockLayout, TimerSpec, Timers, WallRead, HIST_BUCKETS, METRIC_CPU_START, METRIC_CPU_TOTAL,
    METRIC_HIST, METRIC_NESTING, METRIC_SELF_TOTAL, METRIC_SEQ, METRIC_WALL_START,
    METRIC_WALL_TOTAL, TIMER_HIST_METRIC_LEN, TIMER_METRIC_LEN,
};
pub use trace::TraceRing;
pub use trampoline::{
    build_instruction_trampoline, build_redirect, build_trampoline, max_redirect_len,
    max_trampoline_len, register_stub, register_stub_len, Redirect, Snippet, ThreadRow, Trampoline,
    TrampolineSpec,
};
pub use vector::{VectorSave, XSAVE_UNUSED_BY_WEFT};
/// Readers of the timer words generated code writes (defined with the
/// layout in `weft-abi`; here for the injector and the tests).
pub use weft_abi::timer::{
    histogram_bucket, histogram_floor, q32_mul, read_timer_words, timer_value, TimerValue,
    TimerWords, READ_ATTEMPTS as TIMER_READ_ATTEMPTS,
};

/// Length in bytes of the `jmp rel32` written over a function entry.
pub const JMP_REL32_LEN: usize = 5;

/// A `weft-abi` byte offset as an instruction displacement. The layout's
/// offsets are far below 2 GiB; one that outgrew that fails to compile
/// where the constant is defined instead of wrapping.
pub(crate) const fn disp(offset: usize) -> i32 {
    assert!(offset <= i32::MAX as usize);
    offset as i32
}

/// A `rel32` branch could not reach its target.
///
/// `rel32` is measured from the end of the branch instruction and is a signed
/// 32-bit value, so the target must lie within about ±2 GiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "a rel32 branch at {from:#x} cannot reach {to:#x}: the target is {} bytes away and a rel32 \
     displacement reaches only ±2 GiB; the code must be placed closer to its target",
    distance(*from, *to)
)]
pub struct OutOfRange {
    /// Address of the first byte of the branch instruction.
    pub from: u64,
    /// Address the branch was meant to reach.
    pub to: u64,
}

/// Signed distance `to - from`, for messages (saturates instead of wrapping).
fn distance(from: u64, to: u64) -> i128 {
    i128::from(to) - i128::from(from)
}

/// Computes the `rel32` displacement of a `len`-byte instruction at `from`
/// whose displacement field is relative to its end, or `None` when `to` is out
/// of reach.
pub(crate) fn rel32(from: u64, len: u64, to: u64) -> Option<i32> {
    let next = i128::from(from) + i128::from(len);
    i32::try_from(i128::from(to) - next).ok()
}

/// Encodes `jmp rel32` (`e9 xx xx xx xx`) placed at `from` that jumps to `to`.
///
/// This is the patch written over a function entry; it is exactly
/// [`JMP_REL32_LEN`] bytes so that it replaces whole instructions and can be
/// written with a single store.
///
/// # Errors
///
/// [`OutOfRange`] when `to` is farther than a signed 32-bit displacement can
/// reach from the end of the jump.
pub fn jmp_rel32(from: u64, to: u64) -> Result<[u8; JMP_REL32_LEN], OutOfRange> {
    let disp = rel32(from, JMP_REL32_LEN as u64, to).ok_or(OutOfRange { from, to })?;
    let d = disp.to_le_bytes();
    Ok([0xe9, d[0], d[1], d[2], d[3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jmp_rel32_forward_backward_and_limits() {
        assert_eq!(jmp_rel32(0x1000, 0x1005).unwrap(), [0xe9, 0, 0, 0, 0]);
        assert_eq!(
            jmp_rel32(0x1000, 0x1000).unwrap(),
            [0xe9, 0xfb, 0xff, 0xff, 0xff]
        );
        let max = 0x1000 + 5 + i32::MAX as u64;
        assert!(jmp_rel32(0x1000, max).is_ok());
        assert_eq!(
            jmp_rel32(0x1000, max + 1),
            Err(OutOfRange {
                from: 0x1000,
                to: max + 1
            })
        );
        let min = 0x8000_0000u64 + 5 - 0x8000_0000;
        assert!(jmp_rel32(0x8000_0000, min).is_ok());
        assert!(jmp_rel32(0x8000_0000, min - 1).is_err());
        // Wrapping around the address space must not be mistaken for "near".
        assert!(jmp_rel32(0, u64::MAX - 10).is_err());
        let msg = OutOfRange {
            from: 0x1000,
            to: 0x1_0000_1000,
        }
        .to_string();
        assert!(
            msg.contains("0x1000") && msg.contains("0x100001000") && msg.contains("2 GiB"),
            "{msg}"
        );
    }
}
