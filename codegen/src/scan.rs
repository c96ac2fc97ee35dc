//! Finding direct branches in a stretch of code, so that the injector can
//! refuse a patch that another function jumps into. Hand-written assembly
//! does this: glibc's `__mempcpy_*` variants jump to a label three bytes
//! into the matching `__memmove_*`, right inside the bytes an entry patch
//! overwrites.

use crate::analyze::direct_branch_target;
use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction};

/// How a direct branch transfers control. A function is timed by replacing
/// the return address a `call` leaves on the stack, so the injector needs
/// to know whether code reaches a function by a call or by a jump.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BranchKind {
    /// `call rel32`: pushes a return address.
    Call,
    /// `jmp rel8/rel32`.
    Jump,
    /// `jcc`, `loop`, `jrcxz` and relatives.
    Conditional,
    /// `xbegin` (its target is the abort handler).
    Other,
}

impl BranchKind {
    /// Whether the branch reaches its target without pushing a return
    /// address.
    pub fn is_jump(self) -> bool {
        matches!(self, BranchKind::Jump | BranchKind::Conditional)
    }
}

/// A direct branch: the address of the instruction and where it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Branch {
    /// Where the branch instruction starts.
    pub source: u64,
    /// Where it goes.
    pub target: u64,
    /// What kind of instruction it is.
    pub kind: BranchKind,
}

fn kind_of(instr: &Instruction) -> BranchKind {
    match instr.flow_control() {
        FlowControl::Call => BranchKind::Call,
        FlowControl::UnconditionalBranch => BranchKind::Jump,
        FlowControl::ConditionalBranch => BranchKind::Conditional,
        _ => BranchKind::Other,
    }
}

/// Appends every direct branch, call, `loop`, `jrcxz` and `xbegin` found by
/// a linear sweep of `bytes` (which start at `address`) to `out`.
///
/// A linear sweep can fall out of step on data embedded in code; callers
/// sweep each function separately, from its start, to fall back in step.
/// Undecodable bytes are skipped one at a time.
pub fn direct_branches(address: u64, bytes: &[u8], out: &mut Vec<Branch>) {
    let mut decoder = Decoder::with_ip(64, bytes, address, DecoderOptions::NONE);
    let mut instr = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut instr);
        if instr.is_invalid() {
            continue;
        }
        if let Some(target) = direct_branch_target(&instr) {
            out.push(Branch {
                source: instr.ip(),
                target,
                kind: kind_of(&instr),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_jumps_calls_and_short_branches() {
        // 0x1000: jmp +3 (eb 01 -> 0x1003) ; nop ; call 0x1010 (e8 ..) ; jne 0x1000 (75 ..)
        let code = [0xeb, 0x01, 0x90, 0xe8, 0x08, 0x00, 0x00, 0x00, 0x75, 0xf6];
        let mut out = Vec::new();
        direct_branches(0x1000, &code, &mut out);
        assert_eq!(
            out,
            vec![
                Branch {
                    source: 0x1000,
                    target: 0x1003,
                    kind: BranchKind::Jump
                },
                Branch {
                    source: 0x1003,
                    target: 0x1010,
                    kind: BranchKind::Call
                },
                Branch {
                    source: 0x1008,
                    target: 0x1000,
                    kind: BranchKind::Conditional
                },
            ]
        );
    }

    #[test]
    fn garbage_never_panics() {
        let mut out = Vec::new();
        let mut x = 0x1234_5678_u32;
        let bytes: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        direct_branches(0x7fff_ffff_f000, &bytes, &mut out);
        assert!(out.iter().all(|b| b.source >= 0x7fff_ffff_f000));
    }
}
