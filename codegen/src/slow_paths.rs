//! Out-of-line code of generated routines: slow paths that call a clock
//! routine and come back, blocks that leave the straight line, and 8-byte
//! literals, all emitted after a routine's last unconditional jump or
//! return. Used by the exit code, the timers and the call traces.

use iced_x86::code_asm::*;

/// Out-of-line slow paths (calls to clock routines) and 8-byte literals of
/// generated code, emitted after the code's last unconditional jump or
/// return.
pub(crate) struct SlowPaths {
    paths: Vec<(CodeLabel, CodeLabel, CodeLabel)>,
    blocks: Vec<(CodeLabel, OutOfLine)>,
    literals: Vec<(CodeLabel, u64)>,
}

/// Emits an out-of-line block (its own label is set already).
pub(crate) type OutOfLine = Box<dyn FnOnce(&mut CodeAssembler) -> Result<(), IcedError>>;

impl SlowPaths {
    pub(crate) fn new() -> Self {
        Self {
            paths: Vec::new(),
            blocks: Vec::new(),
            literals: Vec::new(),
        }
    }

    /// The label of an 8-byte literal holding `value`.
    pub(crate) fn literal(&mut self, a: &mut CodeAssembler, value: u64) -> CodeLabel {
        let label = a.create_label();
        self.literals.push((label, value));
        label
    }

    /// A slow path that calls the routine at `target` and jumps back to
    /// `back`; returns the label to jump to.
    pub(crate) fn call_then_back(
        &mut self,
        a: &mut CodeAssembler,
        target: u64,
        back: CodeLabel,
    ) -> CodeLabel {
        let entry = a.create_label();
        let lit = self.literal(a, target);
        self.paths.push((entry, back, lit));
        entry
    }

    /// An out-of-line block emitted by `block` (which must end in a jump);
    /// returns the label to jump to.
    pub(crate) fn block(&mut self, a: &mut CodeAssembler, block: OutOfLine) -> CodeLabel {
        let entry = a.create_label();
        self.blocks.push((entry, block));
        entry
    }

    pub(crate) fn emit(self, a: &mut CodeAssembler) -> Result<(), IcedError> {
        for (mut entry, back, lit) in self.paths {
            a.set_label(&mut entry)?;
            a.call(qword_ptr(lit))?;
            a.jmp(back)?;
        }
        for (mut entry, block) in self.blocks {
            a.set_label(&mut entry)?;
            block(a)?;
        }
        for (mut label, value) in self.literals {
            a.set_label(&mut label)?;
            a.dq(&[value])?;
        }
        Ok(())
    }
}
