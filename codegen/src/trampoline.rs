//! Trampolines, snippets and the thread-registration stub.

use iced_x86::{Code, IcedError, Instruction, MemoryOperand, Register};

use crate::encode::Emitter;
use crate::error::BuildError;
use crate::relocate::{max_relocated_len, relocate};
use crate::vector::{area_len, VectorSave};
use crate::{rel32, OutOfRange, PatchSite};

/// How generated code finds the current thread's row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadRow {
    /// Offset from the thread pointer (`%fs` base) of the runtime's static-TLS
    /// variable holding the row's address (null before the thread's first
    /// hit), as reported by the runtime. Read with `mov rcx, fs:[tls_offset]`;
    /// on x86-64 static TLS lies below the thread pointer, so it is negative.
    pub tls_offset: i32,
    /// Absolute address of the registration stub built by [`register_stub`];
    /// it must be within `call rel32` reach of every trampoline using it.
    pub register_stub: u64,
    /// Row byte offset of the row's *activity* word, bumped (`inc qword`)
    /// after the snippets have updated the row, so that a sampler can tell
    /// an unchanged row with one load; `None`: no such word.
    pub activity: Option<i32>,
}

/// Instrumentation code run at a patched entry, with `rcx` holding the
/// thread's row address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Snippet {
    /// `inc qword [row + offset]`. A single read-modify-write instruction on
    /// the thread's own row, so a signal handler re-entering the function
    /// between our instructions cannot lose an increment, and readers never
    /// see a torn value (offsets are 8-byte aligned by the runtime).
    CountCall {
        /// Byte offset of the counter word inside the row.
        offset: i32,
    },
    /// Counts the call and hooks the function's exit by calling through the
    /// runtime's call record `record` (see [`ExitHooks`](crate::ExitHooks)
    /// and `exit.rs`): `inc qword [row + metric + METRIC_ENTRIES]`, closes
    /// activations whose frames are gone, pushes an activation and calls
    /// the function's body (the trampoline's displaced instructions, whose
    /// address the injector writes into the record's target) through the
    /// record, or counts `METRIC_UNHOOKED` and runs the function plainly
    /// when the thread has no cells or they are all in use. The exit is
    /// counted by the exit handler ([`exit_code`](crate::exit_code)) in
    /// `METRIC_EXITS`. Must be the trampoline's only snippet (the hooked
    /// path leaves the trampoline from inside it).
    ///
    /// When `hooks` carries timers
    /// ([`ExitHooks::with_timers`](crate::ExitHooks::with_timers)), a hooked
    /// entry also starts the function's inclusive wall/CPU timer (outermost
    /// activation only) and every close of an activation stops it; the
    /// exit code must be built from the same `hooks`.
    CountCallHookExit {
        /// Row byte offset of the function's
        /// [`hooks.metric_len()`](crate::ExitHooks::metric_len) bytes of
        /// counters and timer words (32, or 80 with timers), non-negative
        /// and 8-byte aligned.
        metric: i32,
        /// The call record the function is called through (one per hooked
        /// function; see [`CallRecords`](crate::CallRecords)).
        record: u32,
        /// The exit-hook layout (and timers).
        hooks: crate::ExitHooks,
        /// Count (and hook, and time) only calls made while the thread is
        /// inside these functions ([`Inside`](crate::Inside)); other calls
        /// run the function plainly.
        inside: crate::Inside,
    },
    /// Calls a user probe function with the function's arguments (see the
    /// `probe` module and [`ProbeCall`](crate::ProbeCall)); skipped when
    /// its predicate is false.
    CallProbe(crate::ProbeCall),
    /// At an instruction point on an indirect call (`call reg`, `call
    /// [mem]`) or jump of the same form (a PLT stub's `jmp [rip + slot]`):
    /// records in the thread's table which function it is about to reach
    /// (see [`CallTargets`](crate::CallTargets)). Only in
    /// [`build_instruction_trampoline`].
    RecordCallTarget(crate::CallTargets),
}

impl Snippet {
    /// Upper bound of the snippet's code length.
    fn max_len(&self) -> usize {
        match self {
            Snippet::CountCall { .. } => SNIPPET_MAX_LEN,
            Snippet::CountCallHookExit {
                metric,
                record,
                hooks,
                inside,
            } => crate::exit::enter_snippet_len(hooks, *metric, *record, inside, Some(0)),
            Snippet::CallProbe(call) => crate::probe::entry_snippet_len(call),
            // Per slot: two compares, branches, an inc and a store; then the
            // operand's evaluation.
            Snippet::RecordCallTarget(t) => 64 + 48 * t.slots as usize,
        }
    }
}

/// Everything needed to build one function's trampoline.
#[derive(Debug, Clone, Copy)]
pub struct TrampolineSpec<'a> {
    /// Address the trampoline will be written at. It must be within ±2 GiB of
    /// the patch site, of every RIP-relative target of the displaced
    /// instructions, and of the registration stub.
    pub address: u64,
    /// The entry being patched.
    pub site: &'a PatchSite,
    /// How to find the thread's row.
    pub row: ThreadRow,
    /// Instrumentation to run, in order, before the displaced instructions.
    pub snippets: &'a [Snippet],
}

/// A built trampoline, to be written at [`Trampoline::address`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trampoline {
    /// Address the code was built for; the patch jumps here.
    pub address: u64,
    /// The code.
    pub bytes: Vec<u8>,
    /// Offset in `bytes` of the relocated displaced instructions. A thread
    /// stopped at or after this offset (and before `slow_path_offset`) has
    /// left the instrumentation and is running the function's own code (so
    /// has one before the head, in the lead of an instruction point patched
    /// from an earlier instruction: see [`PatchSite::lead`]).
    pub relocated_offset: usize,
    /// Length of the relocated displaced instructions (with their jump back).
    pub relocated_len: usize,
    /// Offset in `bytes` of the slow path (first hit of a thread).
    pub slow_path_offset: usize,
    /// For each displaced instruction (`PatchSite::instructions`), where a
    /// thread stopped at it, not yet run, goes on in the trampoline to do
    /// exactly what it would have done: (offset to resume at, offset of the
    /// instruction's own relocated copy). They differ only for an
    /// instruction point's own instruction after a lead: a thread there
    /// resumes at the snippets, which run before it. This is how weft moves
    /// a thread stopped inside the bytes a patch overwrites, instead of
    /// waiting for it to leave.
    pub instruction_offsets: Vec<(u32, u32)>,
}

/// Length of the fixed head: `push rax` (1), `push rcx` (1), `seto al` (3),
/// `lahf` (1), `mov rcx, fs:[disp32]` (9), `test rcx, rcx` (3), `jz rel32` (6).
const HEAD_LEN: usize = 24;
/// Length of `add al, 0x7f; sahf; pop rcx; pop rax`.
const EPILOGUE_LEN: usize = 5;
/// Length of `call rel32; test rcx, rcx; jz rel32; jmp rel32`.
const SLOW_LEN: usize = 5 + 3 + 6 + 5;
/// Upper bound of one snippet's length (`inc qword [rcx+disp32]` is 7).
const SNIPPET_MAX_LEN: usize = 8;
/// Length of the activity bump (`inc qword [rcx+disp32]`).
const ACTIVITY_LEN: usize = 7;
/// Length of `lea rsp, [rsp - 128]` (disp8).
const RED_ZONE_LEN: usize = 5;
/// Length of `lea rsp, [rsp + 128]` (disp32).
const RED_ZONE_BACK_LEN: usize = 8;

/// An upper bound on `build_trampoline(spec).bytes.len()` for any address, so
/// the injector can reserve room before choosing addresses.
pub fn max_trampoline_len(site: &PatchSite, snippets: &[Snippet]) -> usize {
    HEAD_LEN
        + snippets.iter().map(Snippet::max_len).sum::<usize>()
        + ACTIVITY_LEN
        // Instruction points step over the red zone and back.
        + RED_ZONE_LEN
        + RED_ZONE_BACK_LEN
        + EPILOGUE_LEN
        + max_relocated_len(site)
        // A lead is relocated on its own (see `build`).
        + if site.lead > 0 { 64 } else { 0 }
        + SLOW_LEN
}

/// Builds the trampoline for `spec`:
///
/// ```text
///         push rax ; push rcx
///         seto al ; lahf              ; flags into ax, without pushf/popf
///         mov rcx, fs:[tls_offset]    ; this thread's row, or 0
///         test rcx, rcx ; jz .slow
/// .have:  <snippets, with rcx = row>
/// .done:  add al, 0x7f ; sahf         ; OF from al, the others from ah
///         pop rcx ; pop rax
///         <relocated displaced instructions>
///         jmp site.end()              ; only if they can continue there
/// .slow:  call register_stub          ; rcx = row, all else preserved
///         test rcx, rcx ; jz .done    ; registration failed: skip counting
///         jmp .have
/// ```
///
/// `seto`/`lahf`/`sahf` rather than `pushf`/`popf` because `popf` is slow
/// and its result depends on privileged flags. Every register and flag is
/// unchanged, and `rsp` is back at its entry value, when the displaced
/// instructions run. The pushes go below the entry `rsp`; that is safe at a
/// function entry, where the red zone holds nothing yet.
///
/// # Errors
///
/// [`BuildError::Relocate`] when the displaced instructions cannot run at
/// this address, [`BuildError::StubOutOfReach`] when the registration stub
/// is more than ±2 GiB away.
pub fn build_trampoline(spec: &TrampolineSpec<'_>) -> Result<Trampoline, BuildError> {
    build(spec, false)
}

/// [`build_trampoline`] for an *instruction point* (a site from
/// [`analyze_at`](crate::analyze_at), inside a function): the trampoline
/// first steps over the red zone (`lea rsp, [rsp - 128]`: a leaf function
/// may keep data in the 128 bytes below `rsp`) and steps back before the
/// displaced instructions. [`Snippet::CallProbe`]'s context then holds the
/// registers and `rsp` at that instruction. [`Snippet::CountCallHookExit`]
/// is refused: an exit hook belongs to a function's entry.
///
/// # Errors
///
/// As [`build_trampoline`], and [`BuildError::Encode`] for an exit hook.
pub fn build_instruction_trampoline(spec: &TrampolineSpec<'_>) -> Result<Trampoline, BuildError> {
    if spec
        .snippets
        .iter()
        .any(|s| matches!(s, Snippet::CountCallHookExit { .. }))
    {
        return Err(BuildError::Encode(
            "an exit hook belongs to a function's entry, not to an instruction point".into(),
        ));
    }
    build(spec, true)
}

/// Bytes below `rsp` an instruction-point trampoline leaves alone.
const RED_ZONE: i64 = 128;

fn build(spec: &TrampolineSpec<'_>, red_zone: bool) -> Result<Trampoline, BuildError> {
    let row = spec.row;
    // An instruction point patched from an earlier instruction of its
    // block: that instruction and the others before the point run first,
    // as they would have, and fall into the snippets.
    let (lead, site) = spec.site.split_at_point();
    let mut instruction_offsets = Vec::with_capacity(spec.site.instructions.len());
    let lead = match &lead {
        Some(lead) if red_zone => {
            let moved = crate::relocate::relocate_continuing(lead, spec.address, false)?;
            instruction_offsets.extend(moved.instruction_offsets.iter().map(|&o| (o, o)));
            moved.bytes
        }
        Some(_) => {
            return Err(BuildError::Encode(
                "a site with a lead is an instruction point's".into(),
            ))
        }
        None => Vec::new(),
    };
    let head_at = spec.address + lead.len() as u64;
    // Layout is decided front to back; only the `jz .slow` in the head needs
    // an address known later, and it is always the 6-byte rel32 form, so the
    // head is emitted twice: once to measure, once with the real target.
    let emit_head = |slow: u64| head(head_at, row.tls_offset, red_zone, slow);
    let mut e = emit_head(head_at)?;
    let head_len = e.len();
    debug_assert_eq!(head_len, HEAD_LEN + if red_zone { RED_ZONE_LEN } else { 0 });
    let have = e.ip();
    for snippet in spec.snippets {
        emit_snippet(&mut e, snippet, &site, &row, red_zone)?;
    }
    if let Some(activity) = row.activity {
        e.emit(Instruction::with1(
            Code::Inc_rm64,
            MemoryOperand::with_base_displ(Register::RCX, i64::from(activity)),
        ))?;
    }
    let done = e.ip();
    e.emit(Instruction::with2(Code::Add_AL_imm8, Register::AL, 0x7f))?;
    e.emit(Ok(Instruction::with(Code::Sahf)))?;
    e.emit(Instruction::with1(Code::Pop_r64, Register::RCX))?;
    e.emit(Instruction::with1(Code::Pop_r64, Register::RAX))?;
    if red_zone {
        e.emit(Instruction::with2(
            Code::Lea_r64_m,
            Register::RSP,
            MemoryOperand::with_base_displ(Register::RSP, RED_ZONE),
        ))?;
    }

    let relocated_offset = lead.len() + e.len();
    let relocated = relocate(&site, e.ip())?;
    e.raw(&relocated.bytes);
    for (k, &o) in relocated.instruction_offsets.iter().enumerate() {
        let copy = (relocated_offset as u32) + o;
        // After a lead, a thread at the point itself has not run the
        // snippets yet: it resumes at the head.
        let resume = if k == 0 && !instruction_offsets.is_empty() {
            lead.len() as u32
        } else {
            copy
        };
        instruction_offsets.push((resume, copy));
    }

    let slow_path_offset = lead.len() + e.len();
    let slow = e.ip();
    let stub = row.register_stub;
    rel32(slow, 5, stub).ok_or(BuildError::StubOutOfReach {
        trampoline: spec.address,
        stub,
        source: OutOfRange {
            from: slow,
            to: stub,
        },
    })?;
    e.emit(Instruction::with_branch(Code::Call_rel32_64, stub))?;
    e.emit(Instruction::with2(
        Code::Test_rm64_r64,
        Register::RCX,
        Register::RCX,
    ))?;
    e.emit(Instruction::with_branch(Code::Je_rel32_64, done))?;
    e.emit(Instruction::with_branch(Code::Jmp_rel32_64, have))?;

    // Re-emit the head now that `.slow` is known, and splice it in.
    let _ = head_len;
    let head = emit_head(slow)?.finish();
    let head_offset = lead.len();
    let mut bytes = lead;
    bytes.extend_from_slice(&e.finish());
    bytes[head_offset..head_offset + head.len()].copy_from_slice(&head);
    Ok(Trampoline {
        address: spec.address,
        bytes,
        relocated_offset,
        relocated_len: relocated.bytes.len(),
        slow_path_offset,
        instruction_offsets,
    })
}

/// The head of a trampoline at `at`: the red-zone step if `red_zone`, the
/// saves of `rax`, `rcx` and the flags, the row load from `fs:[tls_offset]`
/// and the `jz` to `slow` (see [`build_trampoline`]).
fn head(at: u64, tls_offset: i32, red_zone: bool, slow: u64) -> Result<Emitter, BuildError> {
    let mut e = Emitter::new(at);
    if red_zone {
        e.emit(Instruction::with2(
            Code::Lea_r64_m,
            Register::RSP,
            MemoryOperand::with_base_displ(Register::RSP, -RED_ZONE),
        ))?;
    }
    e.emit(Instruction::with1(Code::Push_r64, Register::RAX))?;
    e.emit(Instruction::with1(Code::Push_r64, Register::RCX))?;
    e.emit(Instruction::with1(Code::Seto_rm8, Register::AL))?;
    e.emit(Ok(Instruction::with(Code::Lahf)))?;
    e.emit(Instruction::with2(
        Code::Mov_r64_rm64,
        Register::RCX,
        fs_absolute(tls_offset),
    ))?;
    e.emit(Instruction::with2(
        Code::Test_rm64_r64,
        Register::RCX,
        Register::RCX,
    ))?;
    e.emit(Instruction::with_branch(Code::Je_rel32_64, slow))?;
    Ok(e)
}

/// One snippet of a trampoline (with `rcx` = row), at `e`'s end; `site` is
/// the (instruction point's) site whose instructions the trampoline moves.
fn emit_snippet(
    e: &mut Emitter,
    snippet: &Snippet,
    site: &PatchSite,
    row: &ThreadRow,
    red_zone: bool,
) -> Result<(), BuildError> {
    match *snippet {
        Snippet::CountCall { offset } => e.emit(Instruction::with1(
            Code::Inc_rm64,
            MemoryOperand::with_base_displ(Register::RCX, i64::from(offset)),
        ))?,
        Snippet::CountCallHookExit {
            metric,
            record,
            ref hooks,
            ref inside,
        } => {
            let code =
                crate::exit::enter_snippet(hooks, metric, record, inside, row.activity, e.ip())?;
            e.raw(&code);
        }
        Snippet::CallProbe(ref call) => {
            let above = if red_zone { RED_ZONE as i32 } else { 0 };
            let code = crate::probe::entry_snippet(call, above, e.ip())?;
            e.raw(&code);
        }
        Snippet::RecordCallTarget(ref targets) => {
            let call = site.instructions.first().ok_or_else(|| {
                BuildError::Encode("an instruction point with no instruction".into())
            })?;
            if !red_zone {
                return Err(BuildError::Encode(
                    "call targets are recorded at an instruction point".into(),
                ));
            }
            let code = crate::probe::record_target_snippet(call, targets, RED_ZONE as i32, e.ip())?;
            e.raw(&code);
        }
    }
    Ok(())
}

/// `fs:[disp32]` with no base register: an absolute offset from the thread
/// pointer (encoded with a SIB byte, since plain `[disp32]` means
/// RIP-relative in 64-bit mode).
fn fs_absolute(offset: i32) -> MemoryOperand {
    // displ_size 8 selects 64-bit addressing (4 would add an addr32 prefix
    // and truncate the address); the encoded field is still a sign-extended
    // disp32.
    MemoryOperand::new(
        Register::None,
        Register::None,
        1,
        i64::from(offset),
        8,
        false,
        Register::FS,
    )
}

/// Builds the once-per-thread registration stub, to be placed at `address`
/// (in each trampoline region, within `call rel32` reach of its trampolines).
///
/// Contract: entered by `call`, with any stack alignment. It saves flags,
/// `rax`, `rdx`, `rsi`, `rdi`, `r8`-`r11` (the caller-saved registers other
/// than `rcx`), clears DF, aligns `rsp` down to 64, saves the vector state
/// `save` names (on the thread's stack: keep it small, threads may have
/// 16 KiB stacks), and calls the `extern "C" fn() -> *mut u8` at the
/// absolute address `register_fn` (`movabs rax, imm64; call rax`, so the
/// runtime may be anywhere), which must not touch the components `save`
/// leaves out. It returns with that function's result in `rcx` and every
/// other register, all flags and the vector state exactly as on entry.
///
/// For [`VectorSave::Xsave`], the XSAVE header (bytes 512..576 of the area)
/// is zeroed first: XSAVE writes only its first 8 bytes (`XSTATE_BV`), and
/// XRSTOR faults on non-zero reserved header bytes.
///
/// The result is [`register_stub_len`]`(save)` bytes and does not depend on
/// `address` (it has no relative operand); `address` is kept so the contract
/// stays "built for where it runs".
///
/// # Errors
///
/// [`BuildError::XsaveAreaTooSmall`] for an XSAVE area under 576 bytes.
pub fn register_stub(
    address: u64,
    register_fn: u64,
    save: VectorSave,
) -> Result<Vec<u8>, BuildError> {
    let area = area_len(save)?;
    let mut e = Emitter::new(address);
    let saved = [
        Register::RAX,
        Register::RDX,
        Register::RSI,
        Register::RDI,
        Register::R8,
        Register::R9,
        Register::R10,
        Register::R11,
        // rbp is callee-saved by the C function, but we use it ourselves to
        // remember the unaligned rsp.
        Register::RBP,
    ];
    e.emit(Ok(Instruction::with(Code::Pushfq)))?;
    // The C ABI requires DF clear on calls; popfq restores the caller's.
    e.emit(Ok(Instruction::with(Code::Cld)))?;
    for reg in saved {
        e.emit(Instruction::with1(Code::Push_r64, reg))?;
    }
    e.emit(Instruction::with2(
        Code::Mov_r64_rm64,
        Register::RBP,
        Register::RSP,
    ))?;
    e.emit(Instruction::with2(
        Code::And_rm64_imm8,
        Register::RSP,
        -64i32,
    ))?;
    e.emit(Instruction::with2(
        Code::Sub_rm64_imm32,
        Register::RSP,
        area as i32,
    ))?;
    let rsp = MemoryOperand::with_base(Register::RSP);
    match save {
        VectorSave::Fxsave64 => e.emit(Instruction::with1(Code::Fxsave64_m512byte, rsp))?,
        VectorSave::Xsave { mask, .. } => {
            e.emit(Instruction::with2(
                Code::Xor_r32_rm32,
                Register::EAX,
                Register::EAX,
            ))?;
            for i in 0..8 {
                let header = MemoryOperand::with_base_displ(Register::RSP, 512 + 8 * i);
                e.emit(Instruction::with2(
                    Code::Mov_rm64_r64,
                    header,
                    Register::RAX,
                ))?;
            }
            emit_mask(&mut e, mask)?;
            e.emit(Instruction::with1(Code::Xsave64_mem, rsp))?;
        }
    }
    e.emit(Instruction::with2(
        Code::Mov_r64_imm64,
        Register::RAX,
        register_fn,
    ))?;
    e.emit(Instruction::with1(Code::Call_rm64, Register::RAX))?;
    e.emit(Instruction::with2(
        Code::Mov_r64_rm64,
        Register::RCX,
        Register::RAX,
    ))?;
    match save {
        VectorSave::Fxsave64 => e.emit(Instruction::with1(Code::Fxrstor64_m512byte, rsp))?,
        VectorSave::Xsave { mask, .. } => {
            emit_mask(&mut e, mask)?;
            e.emit(Instruction::with1(Code::Xrstor64_mem, rsp))?;
        }
    }
    e.emit(Instruction::with2(
        Code::Mov_r64_rm64,
        Register::RSP,
        Register::RBP,
    ))?;
    for reg in saved.iter().rev() {
        e.emit(Instruction::with1(Code::Pop_r64, *reg))?;
    }
    e.emit(Ok(Instruction::with(Code::Popfq)))?;
    e.emit(Ok(Instruction::with(Code::Retnq)))?;
    Ok(e.finish())
}

/// `mov eax, mask_lo; mov edx, mask_hi`: the XSAVE/XRSTOR
/// requested-feature mask (intersected with XCR0 by the CPU).
fn emit_mask(e: &mut Emitter, mask: u64) -> Result<(), IcedError> {
    e.emit(Instruction::with2(
        Code::Mov_r32_imm32,
        Register::EAX,
        mask as u32,
    ))?;
    e.emit(Instruction::with2(
        Code::Mov_r32_imm32,
        Register::EDX,
        (mask >> 32) as u32,
    ))
}

/// Exact length of [`register_stub`]`(_, _, save)`, or 0 if `save` is
/// invalid (see [`BuildError::XsaveAreaTooSmall`]).
pub fn register_stub_len(save: VectorSave) -> usize {
    register_stub(0, 0, save).map_or(0, |stub| stub.len())
}

/// A redirect: what a function's patch jumps to when the function is
/// replaced by another ([`build_redirect`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    /// Address the code was built for; the patch jumps here.
    pub address: u64,
    /// The code.
    pub bytes: Vec<u8>,
    /// The original function, still callable: the displaced instructions,
    /// relocated, then a jump back into the function's body. A replacement
    /// that wants the original behaviour calls this address.
    pub original: u64,
}

/// Builds, for code at `address` (within ±2 GiB of the patch site and of
/// the displaced instructions' RIP-relative targets):
///
/// ```text
///     jmp qword [rip + 0]      ; to the replacement, anywhere
///     dq replacement
/// original:
///     <the displaced instructions, relocated>
///     jmp site.end()           ; into the rest of the original function
/// ```
///
/// Every register, the flags and the stack reach the replacement exactly
/// as the caller left them: it is entered as the original would have been.
///
/// # Errors
///
/// [`BuildError::Relocate`] when the displaced instructions cannot run at
/// this address.
pub fn build_redirect(
    address: u64,
    site: &PatchSite,
    replacement: u64,
) -> Result<Redirect, BuildError> {
    let mut e = Emitter::new(address);
    e.emit(Instruction::with1(
        Code::Jmp_rm64,
        MemoryOperand::with_base_displ(Register::RIP, (address + 6) as i64),
    ))?;
    e.raw(&replacement.to_le_bytes());
    let original = e.ip();
    let relocated = relocate(site, original)?;
    e.raw(&relocated.bytes);
    Ok(Redirect {
        address,
        bytes: e.finish(),
        original,
    })
}

/// An upper bound of [`build_redirect`]'s length.
pub fn max_redirect_len(site: &PatchSite) -> usize {
    6 + 8 + max_relocated_len(site)
}
