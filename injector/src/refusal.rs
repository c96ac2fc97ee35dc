//! Why a function cannot be instrumented as asked, as a type: what a
//! dry run (`Process::check`) answers, and what an insertion's
//! [`Refused`](crate::error::Refused) carries beside its words.

/// Why a function cannot be instrumented (as asked). Every message says
/// what was found and what to do; [`Refusal::kind`] groups them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The code at its entry cannot be patched (see
    /// [`weft_codegen::Refusal`]).
    #[error(transparent)]
    Code(#[from] weft_codegen::Refusal),
    /// Code elsewhere in the module jumps into the bytes the patch would
    /// overwrite, and weft cannot send that jump around the patch (see
    /// [`SharedCode`]).
    #[error(
        "code at {from:#x} elsewhere in {module} jumps to {target:#x}, inside the {len} bytes the \
         patch at {patch_address:#x} would overwrite, and {why}"
    )]
    SharedCode {
        /// The jump.
        from: u64,
        /// Where it lands.
        target: u64,
        /// The module.
        module: String,
        /// Bytes the patch would overwrite.
        len: usize,
        /// Where the patch would go.
        patch_address: u64,
        /// Why no companion can carry the jump.
        why: SharedCode,
    },
    /// Code elsewhere in the module jumps into the bytes the patch would
    /// overwrite (where no companion is tried: replacements, instruction
    /// points).
    #[error(
        "code at {from:#x} elsewhere in {module} jumps to {target:#x}, inside the {len} bytes the \
         patch at {patch_address:#x} would overwrite"
    )]
    JumpedInto {
        /// The jump.
        from: u64,
        /// Where it lands.
        target: u64,
        /// The module.
        module: String,
        /// Bytes the patch would overwrite.
        len: usize,
        /// Where the patch would go.
        patch_address: u64,
    },
    /// Timers were asked, and its exit must not be hooked.
    #[error("cannot time it: {0}")]
    NotTimeable(String),
    /// Its patch would overlap a probe already in place.
    #[error("{0}")]
    Overlaps(String),
    /// Another weft has a probe there that this one cannot share.
    #[error("{0}")]
    OtherWeft(String),
    /// It already has a probe this change cannot go beside.
    #[error("it is already instrumented: remove its probe first")]
    AlreadyInstrumented,
    /// It was asked to count only inside other probes' functions, and
    /// that cannot be done (see [`ProbeSpec::inside`](crate::ProbeSpec::inside)).
    #[error("cannot constrain it: {0}")]
    Constraint(String),
    /// Its bytes changed between planning and patching.
    #[error(
        "its code changed while weft prepared the patch (another tool, or a library loaded \
         again?): nothing was changed; try again"
    )]
    CodeChanged,
    /// An exit probe's predicate tests an argument.
    #[error(
        "an exit probe's predicate can only name a thread: the arguments are gone at an exit \
         (test them in an entry probe, or the return value in the exit probe itself)"
    )]
    ArgumentsAtExit,
    /// Its trampoline could not be built.
    #[error(transparent)]
    Build(#[from] weft_codegen::BuildError),
    /// The instructions its patch displaces cannot be moved to where its
    /// trampoline is.
    #[error(transparent)]
    Relocate(#[from] weft_codegen::RelocError),
    /// A call site to redirect or remove is not a direct call.
    #[error(
        "{site:#x} is not a direct call (`call rel32`, e8): only those can be redirected or removed"
    )]
    NotADirectCall {
        /// The address asked for.
        site: u64,
    },
    /// An instruction point that cannot be probed as asked (outside the
    /// function, not an indirect call, a bad table size, ...).
    #[error("{0}")]
    Point(String),
    /// An IFUNC whose implementation the process has not chosen yet: a dry
    /// run cannot know which code would be patched (an insertion calls the
    /// resolver and plans the implementation it returns).
    #[error(
        "it is an IFUNC whose implementation the process has not chosen yet (it is chosen at \
         the first call): an insertion resolves it first"
    )]
    UnresolvedIfunc,
    /// Its code or module could not be read.
    #[error("{0}")]
    Unreadable(String),
    /// Every address within reach of its entry is mapped, so no
    /// trampoline can be placed where its `jmp` reaches.
    #[error(
        "no free address range within 1 GiB of {patch_address:#x} for its trampoline (the \
         process has mapped all the memory around it): unmap or move what surrounds its module"
    )]
    NoRoomNearby {
        /// Where the patch would go.
        patch_address: u64,
    },
}

/// Why a jump from other code into a patch cannot be sent around it by a
/// companion (docs/design.md, "Code shared between entry points").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SharedCode {
    /// A `call` (or `xbegin`) lands there, not a jump.
    #[error("it is not a jmp or jcc (only those can be sent to the trampoline's copy instead)")]
    NotAJump,
    /// It lands inside an instruction, or in borrowed padding.
    #[error("it lands inside an instruction the patch displaces, not at its start")]
    InsideInstruction,
    /// The jump belongs to no function weft knows (no symbol, no FDE).
    #[error("the jump belongs to no function weft knows, so its code cannot be moved")]
    NoFunction,
    /// The jump's own code cannot be patched.
    #[error("the jump's own code cannot be patched to go around it: {0}")]
    Unpatchable(weft_codegen::Refusal),
    /// Other code jumps into the bytes the companion's patch would take.
    #[error("code at {from:#x} jumps into the bytes at {patch_address:#x} a patch there would overwrite")]
    Entered {
        /// The other jump.
        from: u64,
        /// Where the companion's patch would go.
        patch_address: u64,
    },
    /// The jump is inside another probe's patch or displaced bytes.
    #[error("the jump is inside the probe at {at:#x} ({name}): remove that first")]
    InsideProbe {
        /// That probe's patch address.
        at: u64,
        /// Its name.
        name: String,
    },
    /// The companion's patch would overlap another patch asked for in the
    /// same insertion.
    #[error(
        "the patch that would send it around overlaps the patch of `{other}`, also asked for: \
         instrument them one at a time"
    )]
    OverlapsRequest {
        /// The other function.
        other: String,
    },
}

impl Refusal {
    /// A short name of the kind of reason, for grouping (a coverage
    /// summary, `weft --explain`).
    pub fn kind(&self) -> &'static str {
        use weft_codegen::Refusal as C;
        match self {
            Refusal::Code(c) => match c {
                C::TooShort { .. } => "too short for the patch",
                C::Undecodable { .. } => "undecodable bytes at the entry",
                C::BranchIntoPatch { .. } => "its own code jumps into the patch",
                C::OperandIntoPatch { .. } => "an operand addresses the patch",
                C::CallNotLast { .. } => "a call in the patch is not last",
                C::Breakpoint { .. } => "an int3 is there",
                C::Unsupported { .. } => "an instruction cannot be relocated",
                C::IndirectJumpMayEnter { .. } => "a jump table may enter the patch",
                C::NotAnInstruction { .. } => "not an instruction boundary",
            },
            Refusal::SharedCode { why, .. } => match why {
                SharedCode::NotAJump => "shared code: a call into the patch",
                SharedCode::InsideInstruction => "shared code: a jump inside an instruction",
                SharedCode::NoFunction => "shared code: the jump is in no known function",
                SharedCode::Unpatchable(_) => "shared code: the jump's code cannot be patched",
                SharedCode::Entered { .. } => "shared code: the jump's code is entered too",
                SharedCode::InsideProbe { .. } => "shared code: the jump is in another probe",
                SharedCode::OverlapsRequest { .. } => "shared code: overlaps another request",
            },
            Refusal::JumpedInto { .. } => "shared code: other code jumps into the patch",
            Refusal::NotTimeable(_) => "its exit cannot be hooked",
            Refusal::AlreadyInstrumented => "already instrumented",
            Refusal::Constraint(_) => "its constraint cannot be tested",
            Refusal::CodeChanged => "its code changed meanwhile",
            Refusal::ArgumentsAtExit => "an argument tested at an exit",
            Refusal::Build(_) => "its trampoline cannot be built",
            Refusal::Relocate(_) => "displaced code cannot be moved",
            Refusal::NotADirectCall { .. } => "not a direct call",
            Refusal::Point(_) => "not a usable instruction point",
            Refusal::Overlaps(_) => "overlaps another probe",
            Refusal::OtherWeft(_) => "another weft's probe",
            Refusal::UnresolvedIfunc => "unresolved IFUNC",
            Refusal::Unreadable(_) => "unreadable",
            Refusal::NoRoomNearby { .. } => "no room for a trampoline nearby",
        }
    }
}

/// A function that could not be instrumented, and why.
#[derive(Debug, Clone)]
pub struct Refused {
    /// The function.
    pub function: crate::inspect::FoundFunction,
    /// Why, as a type (its [`Refusal::kind`] groups refusals).
    pub why: Refusal,
    /// Why, in words for the user: `why`'s message, after the instruction
    /// point's name for a point.
    pub reason: String,
}

impl Refused {
    /// `function` refused because of `why`.
    pub fn new(function: crate::inspect::FoundFunction, why: Refusal) -> Refused {
        let reason = why.to_string();
        Refused {
            function,
            why,
            reason,
        }
    }

    /// The point `point` (its name, `function+offset`) in `function`
    /// refused because of `why`.
    pub(crate) fn at_point(
        function: crate::inspect::FoundFunction,
        point: &str,
        why: Refusal,
    ) -> Refused {
        let reason = format!("{point}: {why}");
        Refused {
            function,
            why,
            reason,
        }
    }
}
