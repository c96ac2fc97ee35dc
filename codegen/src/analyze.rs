//! Deciding whether, and where, a function entry can be overwritten with a
//! `jmp rel32`.

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind, Register,
};

use crate::JMP_REL32_LEN;

/// `endbr64`: the CET indirect-branch landing pad.
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// The code of one function as read from the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FunctionCode<'a> {
    /// Runtime address of `bytes[0]`, the function's entry point.
    pub address: u64,
    /// The function's bytes: its symbol size, or fewer when the size is
    /// unknown. Only these bytes are searched for branches into the patch.
    pub bytes: &'a [u8],
    /// The bytes right after `bytes` that belong to no symbol (alignment
    /// padding), possibly empty. They are only used when the function itself
    /// is shorter than the patch.
    pub padding: &'a [u8],
}

/// Where and how a function entry can be patched; produced by
/// [`analyze_entry`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatchSite {
    /// Address the `jmp rel32` is written at: the entry, or the entry + 4 when
    /// the function starts with `endbr64` (the landing pad must stay, since
    /// indirect calls land on it).
    pub patch_address: u64,
    /// The bytes at `patch_address` that the patch overwrites, at least
    /// [`JMP_REL32_LEN`] long: whole displaced instructions followed by
    /// `borrowed_padding` bytes of padding. Restoring the function means
    /// writing these bytes back.
    pub original: Vec<u8>,
    /// The displaced instructions, decoded at their original addresses. They
    /// cover `original` except its last `borrowed_padding` bytes.
    pub instructions: Vec<Instruction>,
    /// Whether a leading `endbr64` was skipped.
    pub skipped_endbr64: bool,
    /// Number of padding bytes after the function that the patch overwrites
    /// (0 unless the function is shorter than the patch). Padding is never
    /// executed, so it is overwritten but not relocated.
    pub borrowed_padding: usize,
    /// For an instruction point patched from an earlier instruction of its
    /// basic block ([`analyze_at`]): how many displaced instructions run
    /// before the point's own, which is `instructions[lead]`. 0 at an entry
    /// and when the point is where the patch starts.
    pub lead: usize,
}

impl PatchSite {
    /// Address of the first byte after the overwritten bytes: where relocated
    /// code continues, and the return address of a displaced `call`.
    pub fn end(&self) -> u64 {
        self.patch_address.wrapping_add(self.original.len() as u64)
    }

    /// Number of bytes covered by the displaced instructions.
    pub fn instructions_len(&self) -> usize {
        self.original.len() - self.borrowed_padding
    }

    /// Address of the instruction the snippets run before: the patch
    /// address, or for a site with a [`lead`](PatchSite::lead), the
    /// instruction point's.
    pub fn point(&self) -> u64 {
        self.instructions
            .get(self.lead)
            .map_or(self.patch_address, |i| i.ip())
    }

    /// The same site with its displaced direct jump (`jmp` or `jcc`) at
    /// `from` going to `to` instead, or `None` when no displaced instruction
    /// at `from` is one. A sibling entry point that jumps into the bytes
    /// another function's patch overwrites is relocated this way into a
    /// *companion* that jumps to the relocated copy of its target
    /// ([`Trampoline::instruction_offsets`](crate::Trampoline)) instead of
    /// into the middle of the patch; [`relocate`](crate::relocate) then
    /// widens a short jump as far as it needs.
    pub fn with_jump_to(&self, from: u64, to: u64) -> Option<PatchSite> {
        let k = self.instructions.iter().position(|i| i.ip() == from)?;
        let jump = &self.instructions[k];
        let direct = matches!(
            jump.flow_control(),
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch
        ) && jump.op0_kind() == OpKind::NearBranch64;
        if !direct {
            return None;
        }
        let mut site = self.clone();
        site.instructions[k].set_near_branch64(to);
        Some(site)
    }

    /// The site of a patch over another probe's patch: `jump`, the `jmp
    /// rel32` in place at `patch_address`, is the one displaced
    /// instruction, so the new trampoline ends by going where it went (the
    /// other probe's trampoline). This is how several tools measure one
    /// function, each with its own probe (see `weft_abi::layout::ProbeEntry`).
    /// `None` when `jump` is not a `jmp rel32`.
    pub fn over_jump(
        patch_address: u64,
        jump: [u8; JMP_REL32_LEN],
        skipped_endbr64: bool,
    ) -> Option<PatchSite> {
        let all = decode_all(patch_address, &jump);
        let [instruction] = all.as_slice() else {
            return None;
        };
        (instruction.code() == iced_x86::Code::Jmp_rel32_64).then(|| PatchSite {
            patch_address,
            original: jump.to_vec(),
            instructions: all,
            skipped_endbr64,
            borrowed_padding: 0,
            lead: 0,
        })
    }

    /// The site split at its point: the lead instructions (run before the
    /// snippets, continuing into them) and the rest, each as a site of its
    /// own; `None` for the first when there is no lead.
    pub(crate) fn split_at_point(&self) -> (Option<PatchSite>, PatchSite) {
        if self.lead == 0 {
            return (None, self.clone());
        }
        let cut = (self.point() - self.patch_address) as usize;
        let lead = PatchSite {
            patch_address: self.patch_address,
            original: self.original[..cut].to_vec(),
            instructions: self.instructions[..self.lead].to_vec(),
            skipped_endbr64: self.skipped_endbr64,
            borrowed_padding: 0,
            lead: 0,
        };
        let rest = PatchSite {
            patch_address: self.point(),
            original: self.original[cut..].to_vec(),
            instructions: self.instructions[self.lead..].to_vec(),
            skipped_endbr64: false,
            borrowed_padding: self.borrowed_padding,
            lead: 0,
        };
        (Some(lead), rest)
    }
}

/// Why a function body is too short to be patched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShortReason {
    /// The function has no instruction at the patch address at all.
    #[error("there is no instruction there")]
    Empty,
    /// The last instruction can continue into whatever follows the function,
    /// so the bytes after it may be executed and cannot be overwritten.
    #[error(
        "its last instruction, at {last:#x}, can continue past the end of the function, so the \
         bytes after it cannot be borrowed"
    )]
    FallsThrough {
        /// Address of the function's last instruction.
        last: u64,
    },
    /// Fewer padding bytes follow the function than the patch needs.
    #[error("only {available} padding bytes follow the function, and {needed} are needed")]
    NotEnoughPadding {
        /// Padding bytes known after the function.
        available: usize,
        /// Padding bytes the patch would overwrite.
        needed: usize,
    },
    /// The bytes after the function are not alignment padding (`int3` or
    /// `nop`), so they may be code or data that something uses.
    #[error("the byte at {address:#x} after the function is not int3/nop alignment padding")]
    NotPadding {
        /// Address of the first offending byte.
        address: u64,
    },
}

/// Why a function entry cannot be patched. Each message says what was found
/// and why it prevents patching; callers prefix the function's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// An instruction point's address is not the first byte of one of the
    /// function's instructions.
    #[error(
        "{address:#x} is not the start of an instruction of the function at {function:#x} \
         (decoded from its entry): a point must be an instruction boundary"
    )]
    NotAnInstruction {
        /// The address asked for.
        address: u64,
        /// The function's entry.
        function: u64,
    },
    /// The instructions from the patch address to the end of the function
    /// cover fewer than [`JMP_REL32_LEN`] bytes and padding cannot be borrowed.
    #[error(
        "the function is too short: its instructions from {patch_address:#x} cover {available} \
         bytes but the patch needs {JMP_REL32_LEN}, and {reason}"
    )]
    TooShort {
        /// Where the patch would go.
        patch_address: u64,
        /// Bytes of instructions available from `patch_address`.
        available: usize,
        /// Why padding could not make up the difference.
        reason: ShortReason,
    },
    /// An instruction the patch would displace cannot be decoded, so it cannot
    /// be moved.
    #[error(
        "the bytes at {address:#x}, which the patch would overwrite, do not decode as an x86-64 \
         instruction (data, or code that is not meant to be read from here), so they cannot be \
         relocated"
    )]
    Undecodable {
        /// Address of the undecodable instruction.
        address: u64,
    },
    /// A direct branch targets the middle of the overwritten bytes; after
    /// patching it would land inside the `jmp rel32`.
    #[error(
        "a branch at {from:#x} jumps into the bytes the patch would overwrite ({target:#x}, \
         inside {patch_address:#x}..{end:#x}), so it would land in the middle of the patch"
    )]
    BranchIntoPatch {
        /// Address of the branch instruction.
        from: u64,
        /// Its target.
        target: u64,
        /// First overwritten byte.
        patch_address: u64,
        /// One past the last overwritten byte.
        end: u64,
    },
    /// A RIP-relative memory operand addresses the overwritten bytes (reading
    /// the function's own code, or a pointer into it); after patching it
    /// would see the patch instead.
    #[error(
        "the instruction at {from:#x} addresses memory at {target:#x}, inside the bytes the patch \
         would overwrite ({patch_address:#x}..{end:#x}), so it would read the patch instead of \
         the original code"
    )]
    OperandIntoPatch {
        /// Address of the instruction.
        from: u64,
        /// The RIP-relative address it computes.
        target: u64,
        /// First overwritten byte.
        patch_address: u64,
        /// One past the last overwritten byte.
        end: u64,
    },
    /// A `call` would be displaced but is followed by more displaced
    /// instructions: the callee would return into the middle of the patch.
    #[error(
        "the call at {address:#x} is followed by other instructions the patch would overwrite, \
         so a thread inside the callee would return into the middle of the patch"
    )]
    CallNotLast {
        /// Address of the `call`.
        address: u64,
    },
    /// An instruction point would displace more than one instruction, and
    /// the function has an indirect jump whose targets are not known
    /// statically (a jump table, most likely): one of them could be a
    /// displaced instruction after the first, which would then land in the
    /// middle of the patch.
    #[error(
        "the patch at {patch_address:#x} would overwrite {displaced} instructions, and the \
         indirect jump at {from:#x} (a jump table?) may go to any of them but the first; an \
         instruction of 5 bytes or more can be patched alone"
    )]
    IndirectJumpMayEnter {
        /// Where the patch would go.
        patch_address: u64,
        /// Instructions it would displace.
        displaced: usize,
        /// The indirect jump.
        from: u64,
    },
    /// An `int3` is already in the overwritten bytes: a debugger or another
    /// tool owns this site, and the original instruction is unknown.
    #[error(
        "there is an int3 breakpoint at {address:#x}, in the bytes the patch would overwrite; a \
         debugger or another instrumentation tool is probably using this function"
    )]
    Breakpoint {
        /// Address of the `int3`.
        address: u64,
    },
    /// A displaced instruction has a form that cannot be moved without
    /// changing what it does.
    #[error("the instruction at {address:#x} (iced code `{code}`) cannot be relocated: {why}")]
    Unsupported {
        /// Address of the instruction.
        address: u64,
        /// The instruction's form, as iced's `Code` name (e.g. `Call_m1664`).
        code: String,
        /// Why it cannot be moved.
        why: &'static str,
    },
}

/// Finds where and how the entry of `code` can be patched with a
/// [`JMP_REL32_LEN`]-byte `jmp rel32`.
///
/// The patch goes at the entry, or right after a leading `endbr64`. It
/// displaces the whole instructions that cover at least [`JMP_REL32_LEN`]
/// bytes. The whole function is decoded (linear sweep) to make sure no direct
/// branch and no RIP-relative operand points strictly inside the overwritten
/// bytes; a target exactly at the patch address is fine, since the patch
/// starts there. Undecodable bytes after the displaced instructions are
/// tolerated, as functions may embed data such as jump tables.
///
/// A function shorter than the patch may borrow the padding after it, but
/// only when its last instruction never continues past it (`ret`, `jmp`,
/// `ud2`, `hlt`) and the borrowed bytes are `int3`/`nop` padding.
///
/// # Errors
///
/// A [`Refusal`] explaining what makes the site unsafe to patch.
pub fn analyze_entry(code: &FunctionCode<'_>) -> Result<PatchSite, Refusal> {
    let skipped_endbr64 = code.bytes.starts_with(&ENDBR64);
    let patch_offset = if skipped_endbr64 { ENDBR64.len() } else { 0 };
    let patch_address = code.address.wrapping_add(patch_offset as u64);
    analyze_site(code, patch_address, skipped_endbr64, patch_address)
}

/// Finds how the instruction at `address` inside the function `code` can be
/// patched (an *instruction point*): as [`analyze_entry`] for an entry,
/// with `address` checked to be the first byte of an instruction of the
/// function's linear sweep. The trampoline of an instruction point must
/// step over the red zone
/// ([`build_instruction_trampoline`](crate::build_instruction_trampoline)):
/// inside a function, the 128 bytes below `rsp` may be in use.
///
/// The patch starts at `address` when it can. When it cannot — the
/// instruction is short and followed by a call (a thread in the callee
/// would return into the patch) or by the start of another basic block —
/// it starts at an earlier instruction of the same block, up to 5 bytes
/// back, so that the displaced instructions end with the point's own: the
/// site then has a [`lead`](PatchSite::lead), the instructions the
/// trampoline runs before the snippets. That is how a 2-byte `call rax`
/// (a virtual call, a function pointer) gets a point of its own.
///
/// # Errors
///
/// [`Refusal::NotAnInstruction`] when `address` is not an instruction
/// boundary of the function; [`Refusal::IndirectJumpMayEnter`] when the
/// patch displaces several instructions and the function has a jump whose
/// targets are unknown (a jump table); else as [`analyze_entry`].
pub fn analyze_at(code: &FunctionCode<'_>, address: u64) -> Result<PatchSite, Refusal> {
    let all = decode_all(code.address, code.bytes);
    let Some(k) = all
        .iter()
        .position(|i| i.ip() == address && i.code() != Code::INVALID)
    else {
        return Err(Refusal::NotAnInstruction {
            address,
            function: code.address,
        });
    };
    let first = match analyze_point(code, &all, address, address, address) {
        Ok(site) => return Ok(site),
        Err(e) => e,
    };
    // A short instruction followed by a call or the start of another block
    // cannot start a patch; an earlier instruction of its block may, with
    // the displaced instructions ending at the point's (so a call there is
    // the last one moved). The patch is at most 5 bytes before the point,
    // plus one instruction.
    let point_end = all[k].next_ip();
    for start in all[..k].iter().rev() {
        if start.code() == Code::INVALID || is_terminator(start) {
            break;
        }
        if let Ok(site) = analyze_point(code, &all, start.ip(), address, point_end) {
            return Ok(site);
        }
        if address - start.ip() >= JMP_REL32_LEN as u64 {
            break;
        }
    }
    Err(first)
}

/// [`analyze_site`] from `start` for the instruction point `point`,
/// displacing at least up to `until`, with the jump-table check.
fn analyze_point(
    code: &FunctionCode<'_>,
    all: &[Instruction],
    start: u64,
    point: u64,
    until: u64,
) -> Result<PatchSite, Refusal> {
    let mut site = analyze_site(code, start, false, until)?;
    // `until` is the point's end: the point is displaced.
    site.lead = site
        .instructions
        .iter()
        .position(|i| i.ip() == point)
        .unwrap_or(0);
    // An entry is only jumped to at its first byte; an instruction inside
    // a function may be a jump table's target, and so may the instructions
    // after it. `jmp [rip + disp]` is a tail call through a GOT slot, not a
    // table.
    if site.instructions.len() > 1 {
        let table = all.iter().find(|i| {
            i.flow_control() == FlowControl::IndirectBranch && !i.is_ip_rel_memory_operand()
        });
        if let Some(jump) = table {
            return Err(Refusal::IndirectJumpMayEnter {
                patch_address: start,
                displaced: site.instructions.len(),
                from: jump.ip(),
            });
        }
    }
    Ok(site)
}

/// The site of a patch at `patch_address`, displacing whole instructions
/// until they cover the patch and reach `until` (the end of an instruction
/// point's own instruction, or `patch_address`).
fn analyze_site(
    code: &FunctionCode<'_>,
    patch_address: u64,
    skipped_endbr64: bool,
    until: u64,
) -> Result<PatchSite, Refusal> {
    let patch_offset = patch_address.wrapping_sub(code.address) as usize;
    let all = decode_all(code.address, code.bytes);

    // The sweep starts at the entry, and an endbr64 is one 4-byte
    // instruction, so the sweep is in step with the patch address.
    let mut instructions = Vec::new();
    let mut covered = 0usize;
    for instr in all.iter().filter(|i| i.ip() >= patch_address) {
        if covered >= JMP_REL32_LEN && instr.ip() >= until {
            break;
        }
        check_displaceable(instr)?;
        covered += instr.len();
        instructions.push(*instr);
    }

    let mut borrowed_padding = 0;
    if covered < JMP_REL32_LEN {
        let reason = match instructions.last() {
            None => Some(ShortReason::Empty),
            Some(last) if !is_terminator(last) => {
                Some(ShortReason::FallsThrough { last: last.ip() })
            }
            Some(_) => check_padding(code, JMP_REL32_LEN - covered).err(),
        };
        if let Some(reason) = reason {
            return Err(Refusal::TooShort {
                patch_address,
                available: covered,
                reason,
            });
        }
        borrowed_padding = JMP_REL32_LEN - covered;
    }

    for instr in &instructions[..instructions.len() - 1] {
        if is_call(instr) {
            return Err(Refusal::CallNotLast {
                address: instr.ip(),
            });
        }
    }

    let mut original = code.bytes[patch_offset..patch_offset + covered].to_vec();
    original.extend_from_slice(&code.padding[..borrowed_padding]);
    let site = PatchSite {
        patch_address,
        original,
        instructions,
        skipped_endbr64,
        borrowed_padding,
        lead: 0,
    };

    // Nothing in the function may point strictly inside the overwritten
    // bytes. The displaced instructions are included: relocation keeps
    // absolute targets, so their targets would then be inside the patch too.
    let end = site.end();
    let inside = |target: u64| target > patch_address && target < end;
    for instr in all.iter().filter(|i| i.code() != Code::INVALID) {
        if let Some(target) = direct_branch_target(instr) {
            if inside(target) {
                return Err(Refusal::BranchIntoPatch {
                    from: instr.ip(),
                    target,
                    patch_address,
                    end,
                });
            }
        }
        if instr.is_ip_rel_memory_operand() {
            let target = instr.ip_rel_memory_address();
            if inside(target) {
                return Err(Refusal::OperandIntoPatch {
                    from: instr.ip(),
                    target,
                    patch_address,
                    end,
                });
            }
        }
    }
    Ok(site)
}

/// Linear sweep over `bytes`, invalid instructions included (the decoder
/// skips at least one byte past each).
fn decode_all(address: u64, bytes: &[u8]) -> Vec<Instruction> {
    let mut decoder = Decoder::with_ip(64, bytes, address, DecoderOptions::NONE);
    let mut out = Vec::new();
    let mut instr = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut instr);
        out.push(instr);
    }
    out
}

/// Refuses instructions that must not be displaced on their own merits.
fn check_displaceable(instr: &Instruction) -> Result<(), Refusal> {
    let address = instr.ip();
    let unsupported = |why| Refusal::Unsupported {
        address,
        code: format!("{:?}", instr.code()),
        why,
    };
    match instr.code() {
        Code::INVALID => return Err(Refusal::Undecodable { address }),
        Code::Int3 => return Err(Refusal::Breakpoint { address }),
        _ => {}
    }
    if is_call(instr) {
        match instr.code() {
            Code::Call_rel32_64 => {}
            Code::Call_rm64 => {
                // The relocated call pushes the return address itself before
                // jumping, so `call rsp` would jump to the moved stack
                // pointer. (`call [rsp+d]` is fine: relocation adjusts d.)
                if instr.op0_kind() == OpKind::Register && instr.op0_register() == Register::RSP {
                    return Err(unsupported("it calls the stack pointer"));
                }
            }
            // `syscall`, `sysenter` and `int n` are calls to iced.
            _ if instr.flow_control() == FlowControl::Call
                && matches!(
                    instr.mnemonic(),
                    Mnemonic::Syscall | Mnemonic::Sysenter | Mnemonic::Int | Mnemonic::Int1
                ) =>
            {
                return Err(unsupported(
                    "it is a system call: a thread blocked in it, or in a signal handler that \
                     interrupted it, would return into the middle of the patch",
                ))
            }
            _ => return Err(unsupported("only near calls can be relocated")),
        }
    }
    Ok(())
}

/// Whether `instr` is a call (direct or indirect, near or far).
fn is_call(instr: &Instruction) -> bool {
    matches!(
        instr.flow_control(),
        FlowControl::Call | FlowControl::IndirectCall
    )
}

/// Whether execution never continues after `instr` (so the bytes after it are
/// only reachable by a branch).
pub(crate) fn is_terminator(instr: &Instruction) -> bool {
    matches!(
        instr.flow_control(),
        FlowControl::Return | FlowControl::UnconditionalBranch | FlowControl::IndirectBranch
    ) || matches!(
        instr.mnemonic(),
        Mnemonic::Ud2 | Mnemonic::Ud0 | Mnemonic::Ud1 | Mnemonic::Hlt | Mnemonic::Int3
    )
}

/// The target of a direct (immediate) branch, call, `loop`, `jrcxz` or
/// `xbegin`.
pub(crate) fn direct_branch_target(instr: &Instruction) -> Option<u64> {
    (0..instr.op_count()).find_map(|i| match instr.op_kind(i) {
        OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64 => {
            Some(instr.near_branch_target())
        }
        _ => None,
    })
}

/// Checks that the first `needed` bytes of `code.padding` are whole `int3`
/// or `nop` instructions (a multi-byte nop may extend past `needed`).
fn check_padding(code: &FunctionCode<'_>, needed: usize) -> Result<(), ShortReason> {
    if code.padding.len() < needed {
        return Err(ShortReason::NotEnoughPadding {
            available: code.padding.len(),
            needed,
        });
    }
    let start = code.address.wrapping_add(code.bytes.len() as u64);
    let mut decoder = Decoder::with_ip(64, code.padding, start, DecoderOptions::NONE);
    let mut instr = Instruction::default();
    while (decoder.position()) < needed {
        decoder.decode_out(&mut instr);
        let filler = matches!(instr.mnemonic(), Mnemonic::Nop | Mnemonic::Int3)
            && instr.code() != Code::INVALID;
        if !filler {
            return Err(ShortReason::NotPadding {
                address: instr.ip(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// glibc's `__mempcpy_*_erms` shape: `mov rax, rdi; add rax, rdx; jmp
    /// rel8` into its sibling, then `nopl` padding.
    const MEMPCPY: [u8; 16] = [
        0x48, 0x89, 0xf8, // mov rax, rdi
        0x48, 0x01, 0xd0, // add rax, rdx
        0xeb, 0x3b, // jmp +0x3b
        0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00, // nopl (padding)
    ];

    #[test]
    fn a_patch_over_another_probes_jump_goes_where_it_went() {
        // jmp from 0x40_1004 to 0x40_0000 (another probe's trampoline).
        let from = 0x40_1004u64;
        let to = 0x40_0000u64;
        let rel = (to as i64 - (from as i64 + 5)) as i32;
        let mut jump = [0xe9, 0, 0, 0, 0];
        jump[1..].copy_from_slice(&rel.to_le_bytes());
        let site = PatchSite::over_jump(from, jump, true).expect("a jmp rel32");
        assert_eq!(site.original, jump);
        assert_eq!(site.end(), from + 5);
        assert!(site.skipped_endbr64);
        // Relocated far away, it still reaches the same target, and does not
        // fall through to the site's end.
        let moved = crate::relocate(&site, 0x50_0000).expect("relocated");
        let decoded = decode_all(0x50_0000, &moved.bytes);
        assert_eq!(decoded[0].near_branch_target(), to, "{decoded:?}");
        assert!(decoded
            .iter()
            .all(|i| i.code() == iced_x86::Code::INVALID || i.near_branch_target() != site.end()));
        // Anything but a jmp rel32 is not another probe's patch.
        assert!(PatchSite::over_jump(from, [0x48, 0x89, 0xf8, 0x90, 0x90], false).is_none());
        assert!(PatchSite::over_jump(from, [0xeb, 0x10, 0x90, 0x90, 0x90], false).is_none());
    }

    #[test]
    fn a_system_call_is_refused_with_its_own_reason() {
        // glibc's __read_nocancel: xor eax, eax ; syscall ; cmp rax, -4096
        let bytes = [
            0x31, 0xc0, 0x0f, 0x05, 0x48, 0x3d, 0x00, 0xf0, 0xff, 0xff, 0x77, 0x01, 0xc3,
        ];
        let code = FunctionCode {
            address: 0x1000,
            bytes: &bytes,
            padding: &[],
        };
        let why = analyze_entry(&code).unwrap_err().to_string();
        assert!(why.contains("system call"), "{why}");
    }

    #[test]
    fn a_sibling_jump_is_retargeted_and_relocated() {
        let code = FunctionCode {
            address: 0x1000,
            bytes: &MEMPCPY[..8],
            padding: &MEMPCPY[8..],
        };
        // The jump alone, borrowing padding: the companion's site.
        let site = analyze_at(&code, 0x1006).unwrap();
        assert_eq!(site.patch_address, 0x1006);
        assert_eq!(site.instructions.len(), 1);
        assert_eq!(site.borrowed_padding, 3);
        assert_eq!(site.instructions[0].near_branch_target(), 0x1043);
        // Only a displaced direct jump can be retargeted.
        assert!(site.with_jump_to(0x1000, 0x5000).is_none());
        let far = 0x7000_0000;
        let moved = site.with_jump_to(0x1006, far).unwrap();
        assert_eq!(moved.original, site.original, "the original bytes stay");
        let relocated = crate::relocate(&moved, 0x2000).unwrap();
        // A rel8 jump grows to rel32 to reach its new target.
        let disp = (far as i64 - (0x2000 + 5)) as i32;
        let mut expected = vec![0xe9];
        expected.extend_from_slice(&disp.to_le_bytes());
        assert_eq!(&relocated.bytes[..5], &expected[..]);
        assert_eq!(relocated.instruction_offsets, vec![0]);
        assert!(!relocated.jumps_back, "a jmp never continues");
    }
}
