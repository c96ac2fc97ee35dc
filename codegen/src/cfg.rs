//! A function's code as a tool sees it: its instructions, basic blocks,
//! call sites (direct targets resolved statically) and exit points.
//!
//! [`analyze_function`] decodes a function's bytes (its symbol's extent) by
//! linear sweep — compilers for x86-64 keep jump tables and constants out
//! of `.text` — and splits them into basic blocks at every branch target
//! inside the function and after every instruction that ends a block.
//!
//! A branch that leaves the function (a `jmp` to another function, the
//! compiler's tail call) is an *exit point*, as are `ret`s and indirect
//! jumps whose targets cannot be known statically (a tail call through a
//! pointer, the PLT's `jmp [rip + GOT]`, or a jump table: the latter stays
//! inside the function, which a static view cannot tell; see
//! [`ExitKind::IndirectJump`]).

use iced_x86::{Decoder, DecoderOptions, FlowControl, Mnemonic, OpKind};

/// One decoded instruction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instruction {
    /// Runtime address.
    pub address: u64,
    /// Length in bytes.
    pub len: usize,
    /// Its mnemonic (`iced_x86::Mnemonic`), e.g. `Mnemonic::Call`.
    pub mnemonic: Mnemonic,
    /// How it changes control flow.
    pub flow: Flow,
}

/// How an instruction changes control flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Falls through to the next instruction.
    Next,
    /// Unconditional direct jump.
    Jump {
        /// Target address.
        target: u64,
    },
    /// Conditional direct jump (falls through otherwise).
    ConditionalJump {
        /// Target address when taken.
        target: u64,
    },
    /// Jump through a register or memory.
    IndirectJump {
        /// For `jmp [rip + disp]`, the address of the pointer it jumps
        /// through (a GOT slot, for instance).
        slot: Option<u64>,
    },
    /// Direct call.
    Call {
        /// Target address.
        target: u64,
    },
    /// Call through a register or memory.
    IndirectCall {
        /// For `call [rip + disp]`, the address of the pointer it calls
        /// through.
        slot: Option<u64>,
    },
    /// Return.
    Return,
    /// Ends execution of this path: `ud2`, `hlt`, `int3` and the like.
    Trap,
    /// Bytes that do not decode as an instruction.
    Invalid,
}

/// A straight-line run of instructions with one entry and one exit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BasicBlock {
    /// Address of its first instruction.
    pub start: u64,
    /// One past its last byte.
    pub end: u64,
    /// Indices (into [`Disassembly::instructions`]) of its instructions.
    pub instructions: std::ops::Range<usize>,
    /// Start addresses of the blocks control can go to next, inside the
    /// function (not calls, not exits).
    pub successors: Vec<u64>,
}

/// A call instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallSite {
    /// Address of the call instruction.
    pub address: u64,
    /// Its length (the return address is `address + len`).
    pub len: usize,
    /// Where it goes.
    pub target: CallTarget,
}

/// Where a call goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallTarget {
    /// A direct call to this address.
    Direct(u64),
    /// Through a register or memory: known only at run time (a virtual
    /// call, a function pointer; `slot` for `call [rip + disp]`, e.g. a GOT
    /// entry of `-fno-plt` code).
    Indirect {
        /// The pointer's address, for `call [rip + disp]`.
        slot: Option<u64>,
    },
}

/// A place where control leaves the function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitPoint {
    /// Address of the instruction.
    pub address: u64,
    /// How it leaves.
    pub kind: ExitKind,
}

/// How control leaves a function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitKind {
    /// `ret`.
    Return,
    /// A direct jump out of the function: a tail call.
    TailCall {
        /// The function jumped to.
        target: u64,
    },
    /// An indirect jump: a tail call through a pointer, or a jump table
    /// whose targets lie inside the function (not known statically).
    IndirectJump {
        /// For `jmp [rip + disp]`, the pointer's address.
        slot: Option<u64>,
    },
}

/// A function's decoded code ([`analyze_function`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disassembly {
    /// Address of the first byte.
    pub address: u64,
    /// Every instruction, in address order.
    pub instructions: Vec<Instruction>,
    /// Basic blocks, in address order; the first starts at `address`.
    pub blocks: Vec<BasicBlock>,
    /// Call sites, in address order.
    pub calls: Vec<CallSite>,
    /// Exit points, in address order.
    pub exits: Vec<ExitPoint>,
}

impl Disassembly {
    /// Whether `address` is the first byte of one of the function's
    /// instructions (a valid place for an instruction-level point).
    pub fn is_instruction_boundary(&self, address: u64) -> bool {
        self.instructions
            .binary_search_by_key(&address, |i| i.address)
            .is_ok()
    }

    /// The instruction starting at `address`.
    pub fn instruction_at(&self, address: u64) -> Option<&Instruction> {
        self.instructions
            .binary_search_by_key(&address, |i| i.address)
            .ok()
            .map(|i| &self.instructions[i])
    }

    /// The block containing `address`.
    pub fn block_of(&self, address: u64) -> Option<&BasicBlock> {
        let i = self.blocks.partition_point(|b| b.start <= address);
        self.blocks
            .get(i.checked_sub(1)?)
            .filter(|b| address < b.end)
    }
}

fn rip_slot(ins: &iced_x86::Instruction) -> Option<u64> {
    (ins.op_count() == 1 && ins.op0_kind() == OpKind::Memory && ins.is_ip_rel_memory_operand())
        .then(|| ins.ip_rel_memory_address())
}

fn flow_of(ins: &iced_x86::Instruction) -> Flow {
    if ins.is_invalid() {
        return Flow::Invalid;
    }
    match ins.flow_control() {
        FlowControl::Next | FlowControl::XbeginXabortXend => Flow::Next,
        FlowControl::UnconditionalBranch => match ins.op0_kind() {
            OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64 => Flow::Jump {
                target: ins.near_branch_target(),
            },
            _ => Flow::IndirectJump { slot: None },
        },
        FlowControl::ConditionalBranch => Flow::ConditionalJump {
            target: ins.near_branch_target(),
        },
        FlowControl::IndirectBranch => Flow::IndirectJump {
            slot: rip_slot(ins),
        },
        FlowControl::Call => Flow::Call {
            target: ins.near_branch_target(),
        },
        FlowControl::IndirectCall => Flow::IndirectCall {
            slot: rip_slot(ins),
        },
        FlowControl::Return => Flow::Return,
        // `syscall` returns to the next instruction; interrupts other than
        // int3 (which a debugger may own) are rare and do too.
        FlowControl::Interrupt => {
            if ins.mnemonic() == Mnemonic::Int3 {
                Flow::Trap
            } else {
                Flow::Next
            }
        }
        FlowControl::Exception => Flow::Trap,
    }
}

/// Whether an instruction ends its basic block.
fn ends_block(flow: Flow, mnemonic: Mnemonic) -> bool {
    !matches!(
        flow,
        Flow::Next | Flow::Call { .. } | Flow::IndirectCall { .. }
    ) || mnemonic == Mnemonic::Hlt
}

/// Decodes the function whose code is `bytes` at runtime address `address`
/// (its symbol's extent; without one, the bytes up to the first `ret` or
/// trap that nothing branches past is a fair guess) and splits it into
/// blocks, call sites and exits. Never fails: undecodable bytes become
/// [`Flow::Invalid`] instructions of one byte, which end their block.
pub fn analyze_function(address: u64, bytes: &[u8]) -> Disassembly {
    let end = address + bytes.len() as u64;
    let inside = |a: u64| a >= address && a < end;
    let mut instructions = Vec::new();
    let mut decoder = Decoder::with_ip(64, bytes, address, DecoderOptions::NONE);
    let mut ins = iced_x86::Instruction::default();
    while decoder.can_decode() {
        let at = decoder.ip();
        decoder.decode_out(&mut ins);
        let (len, flow) = if ins.is_invalid() {
            // Resynchronise on the next byte.
            decoder
                .set_position((at - address + 1) as usize)
                .expect("inside the buffer");
            decoder.set_ip(at + 1);
            (1, Flow::Invalid)
        } else {
            (ins.len(), flow_of(&ins))
        };
        instructions.push(Instruction {
            address: at,
            len,
            mnemonic: if ins.is_invalid() {
                Mnemonic::INVALID
            } else {
                ins.mnemonic()
            },
            flow,
        });
    }
    // Leaders: the entry, every in-function branch target, and every
    // instruction after one that ends a block.
    let mut leaders = std::collections::BTreeSet::new();
    leaders.insert(address);
    let mut calls = Vec::new();
    let mut exits = Vec::new();
    for (i, ins) in instructions.iter().enumerate() {
        let next = ins.address + ins.len as u64;
        match ins.flow {
            Flow::Jump { target } | Flow::ConditionalJump { target } if inside(target) => {
                leaders.insert(target);
            }
            Flow::Jump { target } => exits.push(ExitPoint {
                address: ins.address,
                kind: ExitKind::TailCall { target },
            }),
            Flow::ConditionalJump { target } => exits.push(ExitPoint {
                // A conditional tail call (`jcc other_function`).
                address: ins.address,
                kind: ExitKind::TailCall { target },
            }),
            Flow::IndirectJump { slot } => exits.push(ExitPoint {
                address: ins.address,
                kind: ExitKind::IndirectJump { slot },
            }),
            Flow::Return => exits.push(ExitPoint {
                address: ins.address,
                kind: ExitKind::Return,
            }),
            Flow::Call { target } => calls.push(CallSite {
                address: ins.address,
                len: ins.len,
                target: CallTarget::Direct(target),
            }),
            Flow::IndirectCall { slot } => calls.push(CallSite {
                address: ins.address,
                len: ins.len,
                target: CallTarget::Indirect { slot },
            }),
            _ => {}
        }
        if ends_block(ins.flow, ins.mnemonic) && i + 1 < instructions.len() {
            leaders.insert(next);
        }
    }
    // A branch target inside the function but not on an instruction
    // boundary (overlapping code) starts no block of the sweep: drop it.
    let starts: Vec<u64> = leaders
        .into_iter()
        .filter(|&a| instructions.binary_search_by_key(&a, |i| i.address).is_ok())
        .collect();
    let mut blocks = Vec::with_capacity(starts.len());
    for (b, &start) in starts.iter().enumerate() {
        let first = instructions
            .binary_search_by_key(&start, |i| i.address)
            .expect("filtered above");
        let last = match starts.get(b + 1) {
            Some(&next) => instructions
                .binary_search_by_key(&next, |i| i.address)
                .expect("filtered above"),
            None => instructions.len(),
        };
        let tail = &instructions[last - 1];
        let fall = tail.address + tail.len as u64;
        let mut successors = Vec::new();
        match tail.flow {
            Flow::Jump { target } if inside(target) => successors.push(target),
            Flow::ConditionalJump { target } => {
                if inside(target) {
                    successors.push(target);
                }
                if inside(fall) {
                    successors.push(fall);
                }
            }
            Flow::Next | Flow::Call { .. } | Flow::IndirectCall { .. }
                if inside(fall) && tail.mnemonic != Mnemonic::Hlt =>
            {
                successors.push(fall);
            }
            _ => {}
        }
        successors.dedup();
        blocks.push(BasicBlock {
            start,
            end: fall,
            instructions: first..last,
            successors,
        });
    }
    Disassembly {
        address,
        instructions,
        blocks,
        calls,
        exits,
    }
}
