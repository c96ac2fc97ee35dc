//! Helpers shared by the integration tests: checking that relocated code does
//! what the original did.

#![allow(dead_code)] // each test binary uses a different subset

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind, Register,
};
use weft_codegen::{PatchSite, Relocated};

/// Decodes the instruction at `offset` of `bytes`, which live at `base`.
pub fn decode_at(bytes: &[u8], base: u64, offset: usize) -> Instruction {
    let mut d = Decoder::with_ip(
        64,
        &bytes[offset..],
        base + offset as u64,
        DecoderOptions::NONE,
    );
    let i = d.decode();
    assert_ne!(
        i.code(),
        Code::INVALID,
        "relocated code does not decode at +{offset:#x}: {bytes:02x?}"
    );
    i
}

/// Decodes all of `bytes` at `base` (linear sweep).
pub fn decode_all(bytes: &[u8], base: u64) -> Vec<Instruction> {
    let mut d = Decoder::with_ip(64, bytes, base, DecoderOptions::NONE);
    let mut out = Vec::new();
    while d.can_decode() {
        out.push(d.decode());
    }
    out
}

/// The direct branch target of `i`, if it has one.
pub fn branch_target(i: &Instruction) -> Option<u64> {
    (0..i.op_count())
        .any(|n| {
            matches!(
                i.op_kind(n),
                OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
            )
        })
        .then(|| i.near_branch_target())
}

/// If the instruction at `ip` (inside `r`) is `jmp qword [rip+slot]` with
/// the slot inside `r` (the block encoder's far-branch form), the slot's value.
fn slot_jump(r: &Relocated, ip: u64, depth: u32) -> Option<u64> {
    let end = r.address + r.bytes.len() as u64;
    if ip < r.address || ip >= end {
        return None;
    }
    let mut d = Decoder::with_ip(
        64,
        &r.bytes[(ip - r.address) as usize..],
        ip,
        DecoderOptions::NONE,
    );
    let i = d.decode();
    if i.code() == Code::Jmp_rm64 && i.is_ip_rel_memory_operand() {
        let slot = i.ip_rel_memory_address();
        if slot >= r.address && slot + 8 <= end {
            let o = (slot - r.address) as usize;
            return Some(u64::from_le_bytes(r.bytes[o..o + 8].try_into().unwrap()));
        }
    }
    if matches!(i.code(), Code::Jmp_rel8_64 | Code::Jmp_rel32_64) {
        return Some(resolve(r, i.near_branch_target(), depth + 1));
    }
    None
}

/// Where control ends up when a branch in relocated code goes to `target`:
/// follows the block encoder's far forms and plain `jmp`s it inserted, but
/// stops at relocated copies of displaced instructions (real targets).
fn resolve(r: &Relocated, target: u64, depth: u32) -> u64 {
    if depth > 4
        || r.instruction_offsets
            .iter()
            .any(|&o| r.address + u64::from(o) == target)
    {
        return target;
    }
    slot_jump(r, target, depth).unwrap_or(target)
}

/// Checks semantic equality of a non-branch instruction and its relocated
/// copy: same code, operands, prefixes and absolute memory addresses
/// (iced stores a RIP-relative operand's absolute target as its
/// displacement, so `==` compares targets).
fn assert_same(o: &Instruction, r: &Instruction) {
    let mut r2 = *r;
    r2.set_memory_displ_size(o.memory_displ_size());
    assert!(
        o == &r2,
        "relocated {:?} at {:#x} differs from original at {:#x}",
        r.code(),
        r.ip(),
        o.ip()
    );
    if o.is_ip_rel_memory_operand() {
        assert!(r.is_ip_rel_memory_operand());
        assert_eq!(o.ip_rel_memory_address(), r.ip_rel_memory_address());
    }
}

/// Checks that `r` (relocated from `site`) preserves each displaced
/// instruction's branch targets and RIP-relative addresses, that a final
/// call pushes the original return address, and that the code jumps back to
/// `site.end()` when it can fall through.
pub fn check_relocation(site: &PatchSite, r: &Relocated) {
    assert_eq!(r.instruction_offsets.len(), site.instructions.len());
    assert!(r.instruction_offsets.windows(2).all(|w| w[0] < w[1]));
    let n = site.instructions.len();
    let internal = |t: u64| {
        site.instructions
            .iter()
            .position(|i| i.ip() == t)
            .map(|j| r.address + u64::from(r.instruction_offsets[j]))
    };
    for (k, o) in site.instructions.iter().enumerate() {
        let off = r.instruction_offsets[k] as usize;
        let ri = decode_at(&r.bytes, r.address, off);
        let is_tail_call = k == n - 1 && matches!(o.code(), Code::Call_rel32_64 | Code::Call_rm64);
        if is_tail_call {
            check_tail_call(site, r, o, off);
            continue;
        }
        match branch_target(o) {
            Some(t) => {
                let want = internal(t).unwrap_or(t);
                let got = if ri.mnemonic() == o.mnemonic() && branch_target(&ri).is_some() {
                    resolve(r, branch_target(&ri).expect("branch lost its target"), 0)
                } else if o.flow_control() == FlowControl::ConditionalBranch
                    && ri.flow_control() == FlowControl::ConditionalBranch
                {
                    // Far jcc: `jncc over ; jmp [rip+slot]`.
                    let mut neg = *o;
                    neg.negate_condition_code();
                    assert_eq!(
                        neg.condition_code(),
                        ri.condition_code(),
                        "{:?} became {:?}",
                        o.code(),
                        ri.code()
                    );
                    assert_eq!(branch_target(&ri), Some(ri.next_ip() + 6));
                    slot_jump(r, ri.next_ip(), 0).expect("far jcc without its jmp")
                } else if o.mnemonic() == Mnemonic::Jmp {
                    slot_jump(r, ri.ip(), 0).expect("far jmp without slot")
                } else {
                    panic!("{:?} relocated as {:?}", o.code(), ri.code())
                };
                assert_eq!(
                    got,
                    want,
                    "branch at {:#x} ({:?}) now goes to {got:#x}",
                    o.ip(),
                    o.code()
                );
            }
            None => assert_same(o, &ri),
        }
    }
    if r.jumps_back {
        let back = decode_all(&r.bytes, r.address).iter().any(|i| {
            (i.code() == Code::Jmp_rel32_64 || i.code() == Code::Jmp_rel8_64)
                && resolve(r, i.near_branch_target(), 0) == site.end()
                || i.code() == Code::Jmp_rm64 && slot_jump(r, i.ip(), 0) == Some(site.end())
        });
        assert!(
            back,
            "no jump back to {:#x} in {:02x?}",
            site.end(),
            r.bytes
        );
    } else {
        let last = site.instructions.last().unwrap();
        assert!(
            matches!(
                last.flow_control(),
                FlowControl::Return
                    | FlowControl::UnconditionalBranch
                    | FlowControl::IndirectBranch
                    | FlowControl::Call
                    | FlowControl::IndirectCall
            ) || matches!(
                last.mnemonic(),
                Mnemonic::Ud0 | Mnemonic::Ud1 | Mnemonic::Ud2 | Mnemonic::Hlt
            ),
            "no jump back after {:?}",
            last.code()
        );
    }
}

fn check_tail_call(site: &PatchSite, r: &Relocated, o: &Instruction, off: usize) {
    let ret = o.next_ip();
    assert_eq!(ret, site.end());
    let seq = decode_all(&r.bytes[off..], r.address + off as u64);
    assert_eq!(seq[0].code(), Code::Lea_r64_m);
    assert_eq!(
        (
            seq[0].op0_register(),
            seq[0].memory_base(),
            seq[0].memory_displacement64() as i64
        ),
        (Register::RSP, Register::RSP, -8)
    );
    assert_eq!(seq[1].code(), Code::Mov_rm32_imm32);
    assert_eq!(
        (
            seq[1].memory_base(),
            seq[1].memory_displacement64(),
            seq[1].immediate32()
        ),
        (Register::RSP, 0, ret as u32)
    );
    assert_eq!(seq[2].code(), Code::Mov_rm32_imm32);
    assert_eq!(
        (
            seq[2].memory_base(),
            seq[2].memory_displacement64(),
            seq[2].immediate32()
        ),
        (Register::RSP, 4, (ret >> 32) as u32)
    );
    let j = &seq[3];
    match o.code() {
        Code::Call_rel32_64 => {
            let t = if matches!(j.code(), Code::Jmp_rel32_64 | Code::Jmp_rel8_64) {
                j.near_branch_target()
            } else {
                slot_jump(r, j.ip(), 0).unwrap()
            };
            assert_eq!(t, o.near_branch_target());
        }
        _ => {
            assert_eq!(j.code(), Code::Jmp_rm64);
            if o.op0_kind() == OpKind::Register {
                assert_eq!(j.op0_register(), o.op0_register());
            } else if o.is_ip_rel_memory_operand() {
                assert_eq!(j.ip_rel_memory_address(), o.ip_rel_memory_address());
            } else {
                assert_eq!(
                    (j.memory_base(), j.memory_index(), j.memory_index_scale()),
                    (o.memory_base(), o.memory_index(), o.memory_index_scale())
                );
                let adjust = if o.memory_base() == Register::RSP {
                    8
                } else {
                    0
                };
                assert_eq!(
                    j.memory_displacement64(),
                    o.memory_displacement64().wrapping_add(adjust)
                );
            }
        }
    }
}
