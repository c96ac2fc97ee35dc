//! Constraints: a probe that counts and times only while the thread is
//! inside other functions (Paradyn's constrained metrics).
//!
//! A constraint is a word of the thread's row that is non-zero while the
//! thread is inside the constraining function: the [`METRIC_NESTING`]
//! word of that function's exit-hooked probe, raised by every hooked entry
//! and lowered by every close of an activation (a return, a tail call, an
//! activation closed as unwound). The entry of a constrained
//! [`Snippet::CountCallHookExit`](crate::Snippet) tests each word after it
//! has closed the thread's stale activations (so an exception or a
//! `longjmp` out of a constraining function is seen at once) and, when one
//! is zero, runs the function plainly: nothing counted, nothing pushed. A
//! compare and a branch per word, no lock, no call.
//!
//! The constraining probe may be constrained itself: its nesting then
//! counts only the activations it counted, so a chain of constraints, each
//! on the probe above, says "inside A, and in there inside B, ..." — a
//! call path, in order. A probe cannot constrain itself (its nesting is
//! raised only by the activations the constraint lets in).
//!
//! [`METRIC_NESTING`]: crate::METRIC_NESTING

use iced_x86::code_asm::*;

use crate::error::BuildError;

/// The most constraint words one probe tests.
pub const MAX_INSIDE: usize = 8;

/// The row words (byte offsets in the thread's row, 8-byte aligned) that
/// must all be non-zero for a probe to count a call; none: always.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Inside {
    words: [i32; MAX_INSIDE],
    len: u8,
}

impl Inside {
    /// No constraint: every call counts.
    pub const ALWAYS: Inside = Inside {
        words: [0; MAX_INSIDE],
        len: 0,
    };

    /// A constraint on `words` (each a row byte offset of a nesting word;
    /// duplicates are tested once).
    ///
    /// # Errors
    ///
    /// [`BuildError::Constraint`] for more than [`MAX_INSIDE`] distinct
    /// words, or a negative or unaligned offset.
    pub fn new(words: &[i32]) -> Result<Inside, BuildError> {
        let mut inside = Inside::ALWAYS;
        for &w in words {
            if w < 0 || w % 8 != 0 {
                return Err(BuildError::Constraint(format!(
                    "row offset {w} is not a non-negative multiple of 8"
                )));
            }
            if inside.words().contains(&w) {
                continue;
            }
            if usize::from(inside.len) == MAX_INSIDE {
                return Err(BuildError::Constraint(format!(
                    "more than {MAX_INSIDE} constraining functions"
                )));
            }
            inside.words[usize::from(inside.len)] = w;
            inside.len += 1;
        }
        Ok(inside)
    }

    /// The words tested.
    pub fn words(&self) -> &[i32] {
        &self.words[..usize::from(self.len)]
    }

    /// Whether nothing is tested.
    pub fn is_always(&self) -> bool {
        self.len == 0
    }
}

/// Emits the test: jumps to `outside` when a constraint word is zero
/// (`rcx` = the row; clobbers the flags only).
pub(crate) fn emit_test(
    a: &mut CodeAssembler,
    inside: &Inside,
    outside: CodeLabel,
) -> Result<(), IcedError> {
    for &w in inside.words() {
        a.cmp(qword_ptr(rcx + i64::from(w)), 0)?;
        a.je(outside)?;
    }
    Ok(())
}
