//! Moving displaced instructions to a trampoline without changing what they
//! do.

use std::collections::BTreeMap;
use std::collections::BTreeSet;

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, Instruction, InstructionBlock, MemoryOperand,
    Mnemonic, OpKind, Register,
};

use crate::analyze::{direct_branch_target, is_terminator};
use crate::PatchSite;

/// The displaced instructions of a [`PatchSite`], re-encoded to run at a new
/// address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relocated {
    /// Address the code was encoded for; it must be written exactly there.
    pub address: u64,
    /// The code. It never falls off its end: it ends with a jump back to
    /// [`PatchSite::end`] when the displaced code can continue there, and may
    /// be followed by 8-byte branch-target slots the encoder needed for
    /// targets beyond ±2 GiB.
    pub bytes: Vec<u8>,
    /// Whether the displaced code can continue at [`PatchSite::end`], in which
    /// case a `jmp` back to it was appended. False when the last displaced
    /// instruction is a `ret`, `jmp`, `ud2`..., or a `call` (which is relocated
    /// as "push the original return address, jump to the callee").
    pub jumps_back: bool,
    /// For each of [`PatchSite::instructions`], the offset in `bytes` of its
    /// relocated form (for a final `call`, of the return-address push).
    pub instruction_offsets: Vec<u32>,
}

/// Why displaced instructions could not be relocated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelocError {
    /// A RIP-relative memory operand cannot reach its target from the new
    /// address (RIP-relative displacements are signed 32-bit).
    #[error(
        "the instruction at {instruction:#x} addresses memory at {target:#x} relative to rip, \
         which cannot be reached from {new_ip:#x} (more than ±2 GiB away); the trampoline must be \
         placed within ±2 GiB of the module"
    )]
    RipRelativeOutOfRange {
        /// Original address of the instruction.
        instruction: u64,
        /// The absolute address its memory operand refers to.
        target: u64,
        /// Where relocation was attempted.
        new_ip: u64,
    },
    /// A branch that has no far form (`xbegin`) cannot reach its target from
    /// the new address.
    #[error(
        "the instruction at {instruction:#x} branches to {target:#x}, which cannot be reached \
         from {new_ip:#x} (more than ±2 GiB away, and xbegin has no longer form); the trampoline \
         must be placed within ±2 GiB of the module"
    )]
    BranchOutOfRange {
        /// Original address of the instruction.
        instruction: u64,
        /// Its branch target.
        target: u64,
        /// Where relocation was attempted.
        new_ip: u64,
    },
    /// The encoder rejected the relocated block for another reason.
    #[error("cannot re-encode the displaced instructions at {new_ip:#x}: {message}")]
    Encode {
        /// Where relocation was attempted.
        new_ip: u64,
        /// The encoder's explanation.
        message: String,
    },
}

/// An upper bound on `relocate(site, _).bytes.len()`, whatever the address.
///
/// The worst case per instruction is a `loop`/`jrcxz` whose target is out of
/// `rel32` reach (18 bytes: two short branches, `jmp [rip+slot]` and the
/// 8-byte slot) or a 15-byte instruction; a final `call` adds a 13-byte
/// return-address push; the jump back is at most 14 bytes.
pub fn max_relocated_len(site: &PatchSite) -> usize {
    site.instructions.len() * 32 + 64
}

/// Allocates instruction IPs for the block encoder that no branch or
/// RIP-relative operand targets.
///
/// The block encoder identifies branch targets (and RIP-relative operand
/// targets!) with instructions by their IP and re-points them at the moved
/// copy. We want exactly the links we ask for, so every instruction gets a
/// unique IP that is not any target (non-canonical addresses, which no real
/// target can be), and internal branches are re-pointed at those IPs
/// explicitly.
struct FreshIps {
    taken: BTreeSet<u64>,
    next: u64,
}

impl FreshIps {
    fn new(taken: BTreeSet<u64>) -> Self {
        Self {
            taken,
            next: 0x8000_0000_0000_0000,
        }
    }

    fn next(&mut self) -> u64 {
        loop {
            let ip = self.next;
            self.next = self.next.wrapping_add(1);
            if self.taken.insert(ip) {
                return ip;
            }
        }
    }
}

/// Relocates `site.instructions` to run at `new_ip`, preserving what they do.
///
/// Branch targets and RIP-relative memory operands keep their absolute
/// targets; short branches grow as needed (a branch out of `rel32` reach goes
/// through an 8-byte slot after the code). A branch to another displaced
/// instruction goes to its relocated copy. A final `call` becomes "push the
/// original return address ([`PatchSite::end`]) without touching flags, then
/// jump to the callee", so the callee returns straight to the original code:
/// backtraces and unwinders never see trampoline addresses, and a thread
/// inside the callee never needs the trampoline to stay in place.
///
/// # Errors
///
/// [`RelocError::RipRelativeOutOfRange`] when a RIP-relative operand cannot
/// reach its target from `new_ip`, [`RelocError::BranchOutOfRange`] likewise
/// for an `xbegin`; [`RelocError::Encode`] if the encoder rejects an
/// instruction.
pub fn relocate(site: &PatchSite, new_ip: u64) -> Result<Relocated, RelocError> {
    relocate_continuing(site, new_ip, true)
}

/// [`relocate`], but with `jump_back` false the moved instructions fall
/// through at their end instead of jumping to `site.end()` (the lead of an
/// instruction point, followed by its snippets). `site` must then not end
/// with a call.
pub(crate) fn relocate_continuing(
    site: &PatchSite,
    new_ip: u64,
    jump_back: bool,
) -> Result<Relocated, RelocError> {
    let displaced = &site.instructions;
    let encode_error = |message: String| RelocError::Encode { new_ip, message };

    let mut taken = BTreeSet::from([0, site.end()]);
    for instr in displaced {
        taken.extend(direct_branch_target(instr));
        if instr.is_ip_rel_memory_operand() {
            taken.insert(instr.ip_rel_memory_address());
        }
    }
    let mut fresh = FreshIps::new(taken);
    // New IPs of the displaced instructions' markers (see below).
    let new_ips: BTreeMap<u64, u64> = displaced.iter().map(|i| (i.ip(), fresh.next())).collect();

    let tail_call = displaced
        .last()
        .filter(|i| i.code() == Code::Call_rel32_64 || i.code() == Code::Call_rm64);
    let body = &displaced[..displaced.len() - usize::from(tail_call.is_some())];

    // `origin[i]` is the original address of block instruction i, if any.
    let mut block = Vec::with_capacity(displaced.len() + 4);
    let mut origin = Vec::with_capacity(displaced.len() + 4);
    // Each displaced instruction is preceded by a zero-length marker carrying
    // its new IP: the block encoder reports no offset for an instruction it
    // rewrites (a far jcc becomes `jncc; jmp [rip+slot]`), but it does for
    // the marker, and internal branches to the marker reach the whole
    // rewritten form.
    let mut markers = Vec::with_capacity(displaced.len());
    let mut mark =
        |block: &mut Vec<Instruction>, origin: &mut Vec<Option<u64>>, instr: &Instruction| {
            let mut marker = Instruction::with(Code::Zero_bytes);
            marker.set_ip(new_ips[&instr.ip()]);
            markers.push(block.len());
            block.push(marker);
            origin.push(Some(instr.ip()));
        };
    for instr in body {
        mark(&mut block, &mut origin, instr);
        let mut moved = *instr;
        moved.set_ip(fresh.next());
        if let Some(target) = direct_branch_target(instr) {
            if let (Some(&internal), OpKind::NearBranch64) =
                (new_ips.get(&target), instr.op0_kind())
            {
                moved.set_near_branch64(internal);
            }
        }
        block.push(moved);
        origin.push(Some(instr.ip()));
    }

    let jumps_back = match (tail_call, displaced.last()) {
        (Some(call), _) => {
            mark(&mut block, &mut origin, call);
            push_return_address(&mut block, &mut origin, call, &mut fresh)
                .map_err(|e| encode_error(e.to_string()))?;
            false
        }
        (None, Some(last)) => jump_back && !is_terminator(last),
        (None, None) => jump_back,
    };
    if jumps_back {
        let mut back = Instruction::with_branch(Code::Jmp_rel32_64, site.end())
            .map_err(|e| encode_error(e.to_string()))?;
        back.set_ip(fresh.next());
        block.push(back);
        origin.push(None);
    }

    let result = BlockEncoder::encode(
        64,
        InstructionBlock::new(&block, new_ip),
        BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS,
    )
    .map_err(|e| {
        // The block encoder's message does not say which instruction failed;
        // find the RIP-relative operand that is out of reach, if any.
        block
            .iter()
            .zip(&origin)
            .find_map(|(instr, orig)| {
                let instruction = orig.unwrap_or(new_ip);
                if instr.is_ip_rel_memory_operand() {
                    let target = instr.ip_rel_memory_address();
                    let reachable = target <= u64::from(u32::MAX) || near(new_ip, target);
                    (!reachable).then_some(RelocError::RipRelativeOutOfRange {
                        instruction,
                        target,
                        new_ip,
                    })
                } else if instr.mnemonic() == Mnemonic::Xbegin {
                    let target = instr.near_branch_target();
                    (!near(new_ip, target)).then_some(RelocError::BranchOutOfRange {
                        instruction,
                        target,
                        new_ip,
                    })
                } else {
                    None
                }
            })
            .unwrap_or_else(|| encode_error(e.to_string()))
    })?;

    Ok(Relocated {
        address: new_ip,
        bytes: result.code_buffer,
        jumps_back,
        instruction_offsets: markers
            .iter()
            .map(|&m| result.new_instruction_offsets[m])
            .collect(),
    })
}

/// Whether `target` is within `rel32` reach of a short block at `ip`, with a
/// margin for the block's own length.
fn near(ip: u64, target: u64) -> bool {
    let d = i128::from(target) - i128::from(ip);
    d.abs() < i128::from(i32::MAX) - 4096
}

/// Appends the relocated form of a final `call`: push `call.next_ip()` with
/// `lea`/`mov` (no flags touched, unlike `sub`), then jump where the call
/// would have gone.
fn push_return_address(
    block: &mut Vec<Instruction>,
    origin: &mut Vec<Option<u64>>,
    call: &Instruction,
    fresh: &mut FreshIps,
) -> Result<(), iced_x86::IcedError> {
    let ret = call.next_ip();
    let mut push = |mut instr: Instruction, ip: u64| {
        instr.set_ip(ip);
        block.push(instr);
        origin.push(Some(call.ip()));
    };
    push(
        Instruction::with2(
            Code::Lea_r64_m,
            Register::RSP,
            MemoryOperand::with_base_displ(Register::RSP, -8),
        )?,
        fresh.next(),
    );
    push(
        Instruction::with2(
            Code::Mov_rm32_imm32,
            MemoryOperand::with_base(Register::RSP),
            ret as u32,
        )?,
        fresh.next(),
    );
    push(
        Instruction::with2(
            Code::Mov_rm32_imm32,
            MemoryOperand::with_base_displ(Register::RSP, 4),
            (ret >> 32) as u32,
        )?,
        fresh.next(),
    );
    let mut jump = *call;
    if call.code() == Code::Call_rel32_64 {
        jump = Instruction::with_branch(Code::Jmp_rel32_64, call.near_branch_target())?;
    } else {
        // `call r/m64` and `jmp r/m64` take the same operand.
        jump.set_code(Code::Jmp_rm64);
        if call.op0_kind() == OpKind::Memory && call.memory_base() == Register::RSP {
            // The operand was computed before the call's push; we already
            // moved rsp down by 8.
            jump.set_memory_displacement64(call.memory_displacement64().wrapping_add(8));
            if jump.memory_displ_size() == 0 {
                jump.set_memory_displ_size(1);
            }
        }
    }
    push(jump, fresh.next());
    Ok(())
}
