//! The return stub of remote calls: where a function weft calls inside the
//! target returns to, and what puts the interrupted thread back if weft is
//! no longer there to do it.
//!
//! weft calls `dlopen`, `mmap` and the runtime's functions on one of the
//! target's threads. If weft is killed while such a call runs, nobody would
//! restore the thread's registers: returning to a faulting address (the
//! classic trick) would then crash the target. With this stub the call
//! returns into code that
//!
//! 1. makes one harmless system call (`getpid`, with the call's result in
//!    `rdi`). weft follows the calling thread with `PTRACE_SYSCALL`, sees the
//!    system-call entry at [`RemoteStub::after_syscall`], takes the result and
//!    restores the thread itself — the rest of the stub never runs;
//! 2. otherwise (weft is gone) restores, from the stub's data area, the
//!    thread's signal mask (weft blocks asynchronous signals during a call
//!    made with the world stopped), the
//!    extended state (XSAVE), the flags and every general register, switches
//!    back to the thread's own stack pointer and jumps to where the thread was
//!    interrupted. weft fills the data area before each call, with a system
//!    call that was interrupted already turned into its restart (instruction
//!    pointer back over `syscall`, `rax` = its number or `restart_syscall`),
//!    exactly as the kernel would have done.
//!
//! Nothing is written below the thread's own stack pointer: its red zone
//! survives.

use crate::encode::Emitter;
use crate::error::BuildError;
use crate::vector::VectorSave;
use iced_x86::{Code, Instruction, MemoryOperand, Register};

/// `b"WEFTSTB1"`: marks a stub page so a later attach can find and reuse it.
pub const STUB_MAGIC: u64 = u64::from_le_bytes(*b"WEFTSTB1");
/// Size of the smallest stub: code and registers in the first page, an
/// XSAVE area of up to one page after it. A CPU whose XSAVE image is larger
/// (AVX-512 with AMX tiles: 11,008 bytes) gets a larger stub: see
/// [`stub_size`].
pub const STUB_SIZE: u64 = 8192;
/// Offset of the code.
pub const STUB_CODE: u64 = 64;
/// Offset of the saved registers, in [`SAVED_REGISTERS`] order, then `rsp`,
/// `rip`, `rflags`.
pub const STUB_REGS: u64 = 1024;
/// Offset of the 64-byte-aligned XSAVE (or FXSAVE) image.
pub const STUB_XSAVE: u64 = 4096;
/// Offset of the stub's size (u64, the length of its mapping), after the
/// magic: a later attach reuses a stub only if it is large enough for its
/// own XSAVE image.
pub const STUB_SIZE_FIELD: u64 = 8;
/// x86-64 Linux system call numbers and flags the generated code uses. The
/// code runs in the target, whose kernel ABI is fixed whatever machine
/// builds weft, so they are spelled out here (`libc` is not a dependency
/// of this crate); a test checks them against `libc::SYS_*`.
pub mod sys {
    /// `getpid`.
    pub const SYS_GETPID: u32 = 39;
    /// `rt_sigprocmask`.
    pub const SYS_RT_SIGPROCMASK: u32 = 14;
    /// `rt_sigprocmask`'s `how` that replaces the mask.
    pub const SIG_SETMASK: u32 = 2;
    /// The kernel's `sigset_t` size, `rt_sigprocmask`'s last argument.
    pub const KERNEL_SIGSET_SIZE: u32 = 8;
}

/// The `getpid` system call number weft watches for.
pub const STUB_SYSCALL: u64 = sys::SYS_GETPID as u64;

/// The general registers restored by the stub, in data-area order (each a
/// `u64` at `STUB_REGS + 8 * index`); `rsp`, `rip` and `rflags` follow.
pub const SAVED_REGISTERS: [Register; 15] = [
    Register::RAX,
    Register::RBX,
    Register::RCX,
    Register::RDX,
    Register::RSI,
    Register::RDI,
    Register::RBP,
    Register::R8,
    Register::R9,
    Register::R10,
    Register::R11,
    Register::R12,
    Register::R13,
    Register::R14,
    Register::R15,
];
/// Data-area index of the saved `rsp`.
pub const SAVED_RSP: u64 = 15;
/// Data-area index of the saved `rip`.
pub const SAVED_RIP: u64 = 16;
/// Data-area index of the saved `rflags`.
pub const SAVED_RFLAGS: u64 = 17;
/// Data-area index of the thread's saved signal mask (restored with
/// `rt_sigprocmask(SIG_SETMASK, ..)`).
pub const SAVED_SIGMASK: u64 = 18;

/// The size of a stub whose XSAVE area holds `save`'s image (and, for the
/// XSAVE case, an image of `image_len` bytes, the length the kernel's
/// `NT_X86_XSTATE` regset reports, if larger): a multiple of 4 KiB, at
/// least [`STUB_SIZE`].
pub fn stub_size(save: VectorSave, image_len: u64) -> u64 {
    let area = match save {
        VectorSave::Fxsave64 => 512,
        VectorSave::Xsave { area_size, .. } => u64::from(area_size).max(image_len),
    };
    (STUB_XSAVE + area).next_multiple_of(4096).max(STUB_SIZE)
}

/// A built stub page.
#[derive(Clone, Debug)]
pub struct RemoteStub {
    /// The stub's bytes ([`stub_size`] of them), magic, size and code
    /// included.
    pub bytes: Vec<u8>,
    /// Where remote calls return to.
    pub entry: u64,
    /// The instruction pointer at the `getpid` system-call entry stop.
    pub after_syscall: u64,
}

fn rip_rel(target: u64) -> MemoryOperand {
    MemoryOperand::with_base_displ(Register::RIP, target as i64)
}

/// Builds the stub for `address` (page aligned), `size` bytes long (at
/// least [`stub_size`] for `save`: its XSAVE area is `size -`
/// [`STUB_XSAVE`] bytes).
pub fn remote_stub(address: u64, save: VectorSave, size: u64) -> Result<RemoteStub, BuildError> {
    if size < stub_size(save, 0) || size % 4096 != 0 {
        return Err(BuildError::Encode(format!(
            "a remote stub for this vector state needs {} bytes, not {size}",
            stub_size(save, 0)
        )));
    }
    let (code, after_syscall) = stub_code(
        address + STUB_CODE,
        address + STUB_REGS,
        Some((save, address + STUB_XSAVE)),
    )?;
    let mut bytes = vec![0u8; size as usize];
    bytes[..8].copy_from_slice(&STUB_MAGIC.to_le_bytes());
    bytes[STUB_SIZE_FIELD as usize..STUB_SIZE_FIELD as usize + 8]
        .copy_from_slice(&size.to_le_bytes());
    let end = STUB_CODE as usize + code.len();
    if end > STUB_REGS as usize {
        return Err(BuildError::Encode("remote stub code too long".into()));
    }
    bytes[STUB_CODE as usize..end].copy_from_slice(&code);
    Ok(RemoteStub {
        bytes,
        entry: address + STUB_CODE,
        after_syscall,
    })
}

/// Offset in a bootstrap stub of its saved registers (after the code).
pub const BOOTSTRAP_REGS: u64 = 256;
/// Bytes of a bootstrap stub: code, then the registers and signal mask.
pub const BOOTSTRAP_LEN: u64 = BOOTSTRAP_REGS + 8 * (SAVED_SIGMASK + 1);

/// Builds a *bootstrap* stub for `address` (16-aligned): the same contract
/// as [`remote_stub`] without the extended-state restore, its registers at
/// `address +` [`BOOTSTRAP_REGS`], [`BOOTSTRAP_LEN`] bytes in all. weft
/// writes it into unused bytes of an existing executable mapping (the
/// padding after a module's last code) to protect the one remote call that
/// maps the real stub page, then puts those bytes back. That call (`mmap`)
/// uses no vector register.
pub fn bootstrap_stub(address: u64) -> Result<RemoteStub, BuildError> {
    let (code, after_syscall) = stub_code(address, address + BOOTSTRAP_REGS, None)?;
    if code.len() as u64 > BOOTSTRAP_REGS {
        return Err(BuildError::Encode("bootstrap stub code too long".into()));
    }
    let mut bytes = vec![0xcc_u8; BOOTSTRAP_LEN as usize];
    bytes[..code.len()].copy_from_slice(&code);
    Ok(RemoteStub {
        bytes,
        entry: address,
        after_syscall,
    })
}

/// The stub's code at `code_at`, reading registers at `regs_at` and, when
/// given, the vector state saved the given way at the given address.
fn stub_code(
    code_at: u64,
    regs_at: u64,
    vector: Option<(VectorSave, u64)>,
) -> Result<(Vec<u8>, u64), BuildError> {
    let enc = |e: iced_x86::IcedError| BuildError::Encode(e.to_string());
    let reg = |i: u64| regs_at + 8 * i;
    let mut e = Emitter::new(code_at);
    e.emit(Instruction::with2(
        Code::Mov_r64_rm64,
        Register::RDI,
        Register::RAX,
    ))
    .map_err(enc)?;
    e.emit(Instruction::with2(
        Code::Mov_r32_imm32,
        Register::EAX,
        STUB_SYSCALL as u32,
    ))
    .map_err(enc)?;
    e.emit(Ok(Instruction::with(Code::Syscall))).map_err(enc)?;
    let after_syscall = e.ip();
    // rt_sigprocmask(SIG_SETMASK, &saved_mask, NULL, 8); every register it
    // touches is restored below.
    for (r, v) in [
        (Register::EAX, sys::SYS_RT_SIGPROCMASK),
        (Register::EDI, sys::SIG_SETMASK),
        (Register::R10D, sys::KERNEL_SIGSET_SIZE),
    ] {
        e.emit(Instruction::with2(Code::Mov_r32_imm32, r, v))
            .map_err(enc)?;
    }
    e.emit(Instruction::with2(
        Code::Lea_r64_m,
        Register::RSI,
        rip_rel(reg(SAVED_SIGMASK)),
    ))
    .map_err(enc)?;
    e.emit(Instruction::with2(
        Code::Xor_r32_rm32,
        Register::EDX,
        Register::EDX,
    ))
    .map_err(enc)?;
    e.emit(Ok(Instruction::with(Code::Syscall))).map_err(enc)?;
    match vector {
        Some((VectorSave::Xsave { .. }, area)) => {
            e.emit(Instruction::with2(
                Code::Mov_r32_imm32,
                Register::EAX,
                u32::MAX,
            ))
            .map_err(enc)?;
            e.emit(Instruction::with2(
                Code::Mov_r32_imm32,
                Register::EDX,
                u32::MAX,
            ))
            .map_err(enc)?;
            e.emit(Instruction::with1(Code::Xrstor64_mem, rip_rel(area)))
                .map_err(enc)?;
        }
        Some((VectorSave::Fxsave64, area)) => {
            e.emit(Instruction::with1(Code::Fxrstor64_m512byte, rip_rel(area)))
                .map_err(enc)?;
        }
        None => {}
    }
    // Flags first, while the stack is still the call's own frame.
    e.emit(Instruction::with1(
        Code::Push_rm64,
        rip_rel(reg(SAVED_RFLAGS)),
    ))
    .map_err(enc)?;
    e.emit(Ok(Instruction::with(Code::Popfq))).map_err(enc)?;
    for (i, r) in SAVED_REGISTERS.iter().enumerate() {
        e.emit(Instruction::with2(
            Code::Mov_r64_rm64,
            *r,
            rip_rel(reg(i as u64)),
        ))
        .map_err(enc)?;
    }
    e.emit(Instruction::with2(
        Code::Mov_r64_rm64,
        Register::RSP,
        rip_rel(reg(SAVED_RSP)),
    ))
    .map_err(enc)?;
    e.emit(Instruction::with1(Code::Jmp_rm64, rip_rel(reg(SAVED_RIP))))
        .map_err(enc)?;
    Ok((e.finish(), after_syscall))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn system_call_numbers_are_the_kernels() {
        assert_eq!(i64::from(sys::SYS_GETPID), libc::SYS_getpid);
        assert_eq!(i64::from(sys::SYS_RT_SIGPROCMASK), libc::SYS_rt_sigprocmask);
        assert_eq!(sys::SIG_SETMASK as i32, libc::SIG_SETMASK);
    }
    use iced_x86::{Decoder, DecoderOptions, Mnemonic};

    #[test]
    fn stub_decodes_to_the_documented_sequence() {
        let at = 0x7f00_0000_0000;
        let save = VectorSave::Xsave {
            area_size: 832,
            mask: u64::MAX,
        };
        let stub = remote_stub(at, save, stub_size(save, 0)).unwrap();
        assert_eq!(&stub.bytes[..8], b"WEFTSTB1");
        assert_eq!(stub.bytes.len() as u64, STUB_SIZE);
        assert_eq!(
            u64::from_le_bytes(stub.bytes[8..16].try_into().unwrap()),
            STUB_SIZE
        );
        let code = &stub.bytes[STUB_CODE as usize..STUB_REGS as usize];
        let mut decoder = Decoder::with_ip(64, code, stub.entry, DecoderOptions::NONE);
        let mnemonics: Vec<Mnemonic> = decoder.iter().take(31).map(|i| i.mnemonic()).collect();
        assert_eq!(
            &mnemonics[..3],
            &[Mnemonic::Mov, Mnemonic::Mov, Mnemonic::Syscall]
        );
        assert!(mnemonics.contains(&Mnemonic::Xrstor64));
        // The signal mask is restored by a second system call.
        assert_eq!(
            mnemonics
                .iter()
                .filter(|&&m| m == Mnemonic::Syscall)
                .count(),
            2
        );
        assert_eq!(mnemonics[30], Mnemonic::Jmp);
        assert_eq!(stub.after_syscall, stub.entry + 3 + 5 + 2);
        let fx = remote_stub(at, VectorSave::Fxsave64, STUB_SIZE).unwrap();
        let mut decoder = Decoder::with_ip(
            64,
            &fx.bytes[STUB_CODE as usize..],
            fx.entry,
            DecoderOptions::NONE,
        );
        assert!(decoder
            .iter()
            .take(14)
            .any(|i| i.mnemonic() == Mnemonic::Fxrstor64));
    }

    #[test]
    fn stub_grows_with_the_vector_state() {
        // AVX-512 with AMX tiles: 11,008 bytes of XSAVE image.
        let amx = VectorSave::Xsave {
            area_size: 11_008,
            mask: u64::MAX,
        };
        assert_eq!(stub_size(amx, 0), 16_384);
        assert_eq!(stub_size(amx, 0) - STUB_XSAVE, 12_288);
        // The kernel's regset image counts too, when larger than CPUID's.
        let small = VectorSave::Xsave {
            area_size: 2_696,
            mask: u64::MAX,
        };
        assert_eq!(stub_size(small, 0), STUB_SIZE);
        assert_eq!(stub_size(small, 4_097), 12_288);
        assert_eq!(stub_size(VectorSave::Fxsave64, 0), STUB_SIZE);
        let stub = remote_stub(0x7f00_0000_0000, amx, 16_384).unwrap();
        assert_eq!(stub.bytes.len(), 16_384);
        assert!(remote_stub(0x7f00_0000_0000, amx, STUB_SIZE).is_err());
    }

    #[test]
    fn bootstrap_stub_has_no_vector_restore_and_fits() {
        let at = 0x7f00_0000_1230;
        let stub = bootstrap_stub(at).unwrap();
        assert_eq!(stub.bytes.len() as u64, BOOTSTRAP_LEN);
        assert_eq!(stub.entry, at);
        let mut decoder = Decoder::with_ip(64, &stub.bytes, at, DecoderOptions::NONE);
        let ins: Vec<_> = decoder.iter().take(29).collect();
        let mnemonics: Vec<Mnemonic> = ins.iter().map(|i| i.mnemonic()).collect();
        assert!(!mnemonics.contains(&Mnemonic::Xrstor64));
        assert!(!mnemonics.contains(&Mnemonic::Fxrstor64));
        assert_eq!(mnemonics[27], Mnemonic::Jmp);
        // It reads the saved rip from its own data area.
        assert_eq!(
            ins[27].ip_rel_memory_address(),
            at + BOOTSTRAP_REGS + 8 * SAVED_RIP
        );
    }
}
