//! Walking a stopped thread's stack: the functions it is inside of now,
//! innermost first, from its registers and the call frame information of
//! `.eh_frame` (DynInst's stack walker, for the frames compilers describe).
//!
//! The walk needs no frame pointers: each frame's CFI row says where its
//! caller's frame (the CFA), return address and `rbp` are. It stops at the
//! outermost frame (a return address the CFI calls undefined: `_start`,
//! `clone`), at code no module's `.eh_frame` describes (a JIT's code, the
//! vDSO, a weft trampoline — an instrumented function's caller is then
//! not seen), at a rule it cannot follow (a DWARF expression, as in a
//! signal frame or a PLT stub), or when the stack stops growing upward.
//!
//! A return address an exit hook replaced (a timed function's open
//! activation) is read back from the thread's activation cells
//! (`Held::copy_stack` takes them), so the walk goes on to the real caller.
//!
//! While the thread is stopped only its registers and the top of its
//! stack are copied (a [`StackCopy`], microseconds); the walk runs on
//! the copy after the thread runs again, so a walk adds next to nothing
//! to a stop of the world.

use crate::inspect::{ProcessImage, SavedAt};
use crate::memory::ProcessMemory;
use crate::ptrace::Registers;

/// One frame of a walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Where the frame's function is: the thread's `rip` for the innermost
    /// frame, the return address into it for the others.
    pub pc: u64,
    /// Its canonical frame address (the caller's `rsp` before its `call`):
    /// one activation keeps it for its whole life, so two walks that see
    /// the same function at the same CFA may be seeing the same call.
    pub cfa: u64,
}

impl Frame {
    /// An address inside the frame's function: for a caller, the call
    /// instruction's last byte (a call that never returns may be the last
    /// instruction of its function, leaving the return address outside).
    pub fn lookup_address(&self, innermost: bool) -> u64 {
        if innermost {
            self.pc
        } else {
            self.pc.wrapping_sub(1)
        }
    }
}

/// DWARF register numbers of x86-64 the CFA can be based on.
const RBP: u16 = 6;
const RSP: u16 = 7;

/// How much of a stack is copied: frames deeper than this from the top
/// are not walked.
const COPY_LIMIT: usize = 128 * 1024;

/// A stopped thread's registers and the top of its stack, copied.
#[derive(Clone, Debug)]
pub struct StackCopy {
    regs: Registers,
    bytes: Vec<u8>,
    /// The thread's open hooked activations: (the stack slot whose return
    /// address an exit hook replaced, the original return address).
    hooked: Vec<(u64, u64)>,
}

impl StackCopy {
    /// Copies thread `regs`'s stack from its `rsp` up, to the end of the
    /// mapping or [`COPY_LIMIT`].
    pub(crate) fn take(memory: &ProcessMemory, regs: Registers) -> StackCopy {
        const PAGE: usize = 4096;
        const CHUNK: usize = 16 * PAGE;
        let mut bytes = Vec::new();
        // Whole chunks while they read; the last, partial one (a mapping
        // ends on any page) page by page.
        let mut at = regs.rsp;
        let mut step = CHUNK;
        while bytes.len() < COPY_LIMIT {
            let len = step - (at as usize % step);
            let mut buf = vec![0; len];
            if memory.read(at, &mut buf).is_err() {
                if step == PAGE {
                    break; // the end of the stack's mapping
                }
                step = PAGE;
                continue;
            }
            bytes.extend_from_slice(&buf);
            at += len as u64;
        }
        StackCopy {
            regs,
            bytes,
            hooked: Vec::new(),
        }
    }

    fn read_u64(&self, address: u64) -> Option<u64> {
        let off = usize::try_from(address.checked_sub(self.regs.rsp)?).ok()?;
        let word = self.bytes.get(off..off.checked_add(8)?)?;
        Some(u64::from_le_bytes(word.try_into().ok()?))
    }

    /// The same copy, knowing which return addresses exit hooks replaced
    /// (slot, original): the walk reads through them to the caller
    /// instead of into weft's exit code.
    pub(crate) fn with_hooked(mut self, hooked: Vec<(u64, u64)>) -> StackCopy {
        self.hooked = hooked;
        self
    }

    /// The return address at stack slot `slot` as the program put it
    /// there: the original where an exit hook replaced it.
    fn return_address_at(&self, slot: u64) -> Option<u64> {
        let found = self.hooked.iter().find(|&&(at, _)| at == slot);
        found
            .map(|&(_, original)| original)
            .or_else(|| self.read_u64(slot))
    }

    /// Walks at most `max` frames, innermost first.
    pub fn walk(&self, image: &mut ProcessImage, max: usize) -> Vec<Frame> {
        walk(image, self, max)
    }
}

/// Walks at most `max` frames of a thread from its copied stack.
fn walk(image: &mut ProcessImage, stack: &StackCopy, max: usize) -> Vec<Frame> {
    let regs = &stack.regs;
    let (mut pc, mut rsp, mut rbp) = (regs.rip, regs.rsp, regs.rbp);
    let mut frames: Vec<Frame> = Vec::new();
    while frames.len() < max {
        let innermost = frames.is_empty();
        let at = if innermost { pc } else { pc.wrapping_sub(1) };
        let rule = image.module_of(at).and_then(|m| {
            let vaddr = at.wrapping_sub(m.bias());
            m.image().ok()?.frame_rule(vaddr).ok().flatten()
        });
        let Some(rule) = rule else {
            frames.push(Frame { pc, cfa: 0 });
            break;
        };
        let base = match rule.cfa.register {
            RSP => rsp,
            RBP => rbp,
            _ => {
                frames.push(Frame { pc, cfa: 0 });
                break;
            }
        };
        let cfa = base.wrapping_add_signed(rule.cfa.offset);
        if frames.last().is_some_and(|f| f.cfa != 0 && cfa <= f.cfa) {
            // A caller's frame is above its callee's: anything else is a
            // stack the rules do not describe (or a corrupt one).
            break;
        }
        frames.push(Frame { pc, cfa });
        let read = |offset: i64| stack.read_u64(cfa.wrapping_add_signed(offset));
        let return_address = match rule.return_address {
            SavedAt::Cfa(offset) => stack.return_address_at(cfa.wrapping_add_signed(offset)),
            SavedAt::Undefined | SavedAt::Unchanged => None,
        };
        let Some(return_address) = return_address.filter(|&a| a != 0) else {
            break;
        };
        rbp = match rule.rbp {
            SavedAt::Cfa(offset) => match read(offset) {
                Some(v) => v,
                None => break,
            },
            SavedAt::Unchanged | SavedAt::Undefined => rbp,
        };
        rsp = cfa;
        pc = return_address;
    }
    frames
}
