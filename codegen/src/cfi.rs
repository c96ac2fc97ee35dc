//! DWARF call-frame information (`.eh_frame` format) for return-slot blocks,
//! so that unwinders (libgcc's `_Unwind_*`, hence C++ exceptions, Rust
//! panics and glibc's `backtrace()`) walk through instrumented frames.
//!
//! # Why the rule works
//!
//! When an unwinder steps out of an instrumented function `f` whose RA was
//! redirected, it reads `f`'s return address from `[CFA_f - 8]` and finds
//! slot `k`'s return address `R = slot + SLOT_ENTRY`; the caller context has
//! `rsp = CFA_f` and `pc = R`. It looks up the FDE of `R - 1` (= the slot's
//! first byte, an `int3`: that is why `R` is not the slot's first byte) and
//! finds the block's FDE, which describes an 8-byte pseudo-frame:
//!
//! * `CFA = rsp + 8`, and `rsp` of the caller = `val_offset(CFA - 8)` =
//!   `CFA_f`, as after a real `ret`. The CFA must not be `rsp + 0`: libgcc
//!   identifies a frame by the CFA of the frame below it (`context->cfa`),
//!   so a zero-size pseudo-frame would share its identity with the real
//!   caller's, and phase 2 of exception propagation would stop at the
//!   pseudo-frame believing it is the handler frame (`abort()`). With 8,
//!   identities stay distinct for any caller that keeps the ABI's call
//!   alignment (its frame is at least 16 bytes);
//! * `RA = val_expression(breg7(rsp) -8; deref; plus_uconst delta - 1;
//!   deref)`, with `rsp` = this context's `rsp` = `CFA_f`: `[rsp - 8]` is
//!   still `R` (the stack slot `f` returns through), `R - 1 + delta` is cell
//!   `k`, whose first word is the original RA;
//! * every other register: same value.
//!
//! The same holds when a signal interrupts a thread at `pc = R` itself (the
//! slot's `call` not yet executed; signal frames look up `pc`, not `pc - 1`,
//! which is inside the slot too): `rsp = CFA_f` and `[rsp - 8] = R` (the
//! kernel leaves the 128-byte red zone alone). Once the slot's `call` has
//! run, the pc is in the exit handler, which has no CFI (see the report:
//! a backtrace sampled inside the exit handler stops there).
//!
//! The unwinder then reports one extra frame at `R` between `f` and its real
//! caller, then the real caller. Exceptions propagate through it (no
//! personality, nothing to clean up); the activation stays open in the block
//! and is closed as unwound by the next entry or exit on that thread.
//!
//! # Closing activations during propagation (not implemented)
//!
//! To stop a timer when an exception passes (rather than at the next entry
//! or exit), the CIE could name a personality routine (augmentation `"zPR"`,
//! an absolute pointer to a runtime function). libgcc calls it for the
//! pseudo-frame in both phases with the frame's context: in the search phase
//! it returns `_URC_CONTINUE_UNWIND`; in the cleanup phase it reads `[rsp -
//! 8]` from the context (`_Unwind_GetGR(ctx, 7)`, or `_Unwind_GetCFA - 8`)
//! to find slot `k`, closes activations `k..depth` of the thread's block
//! (depth = k, stopping their timers) and returns `_URC_CONTINUE_UNWIND`
//! (never installing a context, so no landing pad is needed). It must
//! tolerate foreign exceptions and forced unwinds (`pthread_cancel`,
//! `_Unwind_ForcedUnwind`: `_UA_FORCE_UNWIND`), must not allocate, and must
//! not close anything in phase 1 (the search can end in `terminate` with the
//! frames intact). longjmp never runs personalities, so the entry/exit
//! closing stays necessary.

use crate::exit::{ReturnSlots, SLOT_ENTRY};

const DW_CFA_NOP: u8 = 0x00;
const DW_CFA_DEF_CFA: u8 = 0x0c;
const DW_CFA_VAL_OFFSET: u8 = 0x14;
const DW_CFA_VAL_EXPRESSION: u8 = 0x16;
const DW_OP_DEREF: u8 = 0x06;
const DW_OP_PLUS_UCONST: u8 = 0x23;
const DW_OP_BREG7: u8 = 0x77;
const DW_EH_PE_ABSPTR: u8 = 0x00;
/// x86-64 DWARF register numbers.
const RSP: u8 = 7;
const RA: u8 = 16;

fn uleb(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn sleb(out: &mut Vec<u8>, mut v: i64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        let done = (v == 0 && byte & 0x40 == 0) || (v == -1 && byte & 0x40 != 0);
        if done {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// Appends one length-prefixed entry (CIE or FDE) whose contents after the
/// length field are `body`, padded with `DW_CFA_nop` so the entry is a
/// multiple of 8 bytes.
fn entry(out: &mut Vec<u8>, mut body: Vec<u8>) {
    while (4 + body.len()) % 8 != 0 {
        body.push(DW_CFA_NOP);
    }
    let len = u32::try_from(body.len()).expect("small CFI entry");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&body);
}

/// The return-address rule's DWARF expression:
/// `DW_OP_breg7 -8; DW_OP_deref; DW_OP_plus_uconst (delta - SLOT_ENTRY);
/// DW_OP_deref`.
pub fn return_address_expression(slots: &ReturnSlots) -> Vec<u8> {
    let mut e = vec![DW_OP_BREG7];
    sleb(&mut e, -8);
    e.push(DW_OP_DEREF);
    e.push(DW_OP_PLUS_UCONST);
    uleb(&mut e, u64::from(slots.delta() - SLOT_ENTRY));
    e.push(DW_OP_DEREF);
    e
}

/// `.eh_frame` bytes describing the code slots of the block at
/// `block_address`: one CIE (version 1, augmentation `"zR"`, code alignment
/// 1, data alignment -8, RA column 16, FDE pointer encoding
/// `DW_EH_PE_absptr`: 8-byte absolute addresses, so the bytes may be stored
/// anywhere), whose initial instructions are `DW_CFA_def_cfa rsp, 8`,
/// `DW_CFA_val_offset rsp, 1` (caller `rsp` = CFA - 8) and
/// `DW_CFA_val_expression r16, `[`return_address_expression`]; one FDE
/// covering `[block, block + 32 * capacity)` with no instructions; and the
/// zero-length terminator. Every entry is padded to 8 bytes.
///
/// The runtime hands the buffer to libgcc's `__register_frame` (which keeps
/// a pointer to it: the buffer must live until `__deregister_frame`).
pub fn block_eh_frame(block_address: u64, slots: &ReturnSlots) -> Vec<u8> {
    block_eh_frame_with_personality(block_address, slots, None)
}

/// [`block_eh_frame`] with a personality routine: the CIE's augmentation
/// is then `"zPR"`, the routine's absolute address (`DW_EH_PE_absptr`)
/// before the FDE pointer encoding. libgcc calls it for every slot an
/// exception or forced unwind (`pthread_exit`, cancellation) passes
/// through, in both phases; weft's runtime uses the cleanup phase to close
/// the activations whose frames the unwind just discarded.
pub fn block_eh_frame_with_personality(
    block_address: u64,
    slots: &ReturnSlots,
    personality: Option<u64>,
) -> Vec<u8> {
    let mut out = Vec::new();

    let mut cie = Vec::new();
    cie.extend_from_slice(&0u32.to_le_bytes()); // CIE id
    cie.push(1); // version
    match personality {
        Some(_) => cie.extend_from_slice(b"zPR\0"),
        None => cie.extend_from_slice(b"zR\0"),
    }
    uleb(&mut cie, 1); // code alignment factor
    sleb(&mut cie, -8); // data alignment factor
    cie.push(RA); // return address register (u8 in version 1)
    match personality {
        Some(routine) => {
            uleb(&mut cie, 1 + 8 + 1); // augmentation data length
            cie.push(DW_EH_PE_ABSPTR);
            cie.extend_from_slice(&routine.to_le_bytes());
        }
        None => uleb(&mut cie, 1),
    }
    cie.push(DW_EH_PE_ABSPTR);
    cie.push(DW_CFA_DEF_CFA);
    uleb(&mut cie, u64::from(RSP));
    uleb(&mut cie, 8);
    // rsp = CFA + 1 * data_align = CFA - 8.
    cie.push(DW_CFA_VAL_OFFSET);
    uleb(&mut cie, u64::from(RSP));
    uleb(&mut cie, 1);
    let expr = return_address_expression(slots);
    cie.push(DW_CFA_VAL_EXPRESSION);
    uleb(&mut cie, u64::from(RA));
    uleb(&mut cie, expr.len() as u64);
    cie.extend_from_slice(&expr);
    entry(&mut out, cie);

    let mut fde = Vec::new();
    // CIE pointer: distance from this field back to the CIE's start (0).
    let cie_pointer = u32::try_from(out.len() + 4).expect("small CFI");
    fde.extend_from_slice(&cie_pointer.to_le_bytes());
    fde.extend_from_slice(&block_address.to_le_bytes());
    let range = u64::from(slots.capacity() * crate::exit::SLOT_SIZE);
    fde.extend_from_slice(&range.to_le_bytes());
    uleb(&mut fde, 0); // augmentation data length
    entry(&mut out, fde);

    out.extend_from_slice(&0u32.to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leb128() {
        let mut v = Vec::new();
        uleb(&mut v, 624_485);
        assert_eq!(v, [0xe5, 0x8e, 0x26]);
        v.clear();
        sleb(&mut v, -8);
        assert_eq!(v, [0x78]);
        v.clear();
        sleb(&mut v, -123_456);
        assert_eq!(v, [0xc0, 0xbb, 0x78]);
        v.clear();
        sleb(&mut v, 64);
        assert_eq!(v, [0xc0, 0x00]);
    }

    #[test]
    fn entries_are_aligned_and_terminated() {
        let s = ReturnSlots::new(16, 0, 8, None).unwrap();
        let f = block_eh_frame(0x7000_0000, &s);
        assert_eq!(f.len() % 8, 4); // entries are 8-byte multiples, + terminator
        assert_eq!(&f[f.len() - 4..], &[0, 0, 0, 0]);
        let cie_len = u32::from_le_bytes(f[..4].try_into().unwrap()) as usize;
        assert_eq!((cie_len + 4) % 8, 0);
        let fde = &f[cie_len + 4..];
        let fde_len = u32::from_le_bytes(fde[..4].try_into().unwrap()) as usize;
        assert_eq!((fde_len + 4) % 8, 0);
        assert_eq!(
            u32::from_le_bytes(fde[4..8].try_into().unwrap()) as usize,
            cie_len + 8
        );
        assert_eq!(
            u64::from_le_bytes(fde[8..16].try_into().unwrap()),
            0x7000_0000
        );
        assert_eq!(u64::from_le_bytes(fde[16..24].try_into().unwrap()), 16 * 32);
    }

    #[test]
    fn personality_goes_in_the_cie_augmentation() {
        let s = ReturnSlots::new(16, 0, 8, None).unwrap();
        let plain = block_eh_frame(0x7000_0000, &s);
        assert_eq!(
            plain,
            block_eh_frame_with_personality(0x7000_0000, &s, None)
        );
        let f = block_eh_frame_with_personality(0x7000_0000, &s, Some(0x1122_3344_5566_7788));
        assert_eq!(&f[9..13], b"zPR\0");
        let at = f
            .windows(8)
            .position(|w| w == 0x1122_3344_5566_7788u64.to_le_bytes())
            .expect("the routine's address is in the CIE");
        // Augmentation data: length 10, P encoding, the pointer, R encoding.
        assert_eq!(f[at - 2], 10);
        assert_eq!(f[at - 1], DW_EH_PE_ABSPTR);
        assert_eq!(f[at + 8], DW_EH_PE_ABSPTR);
        let cie_len = u32::from_le_bytes(f[..4].try_into().unwrap()) as usize;
        assert_eq!((cie_len + 4) % 8, 0);
        assert!(at < cie_len + 4, "in the CIE, not the FDE");
        assert_eq!(&f[f.len() - 4..], &[0, 0, 0, 0]);
    }
}
