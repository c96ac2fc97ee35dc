//! gdb's JIT interface, so that gdb can unwind through return slots.
//!
//! libgcc finds a slot's unwind information through `__register_frame`, but
//! gdb has its own unwinder and never sees those registrations: without
//! help it prints `?? ()` frames and loses the callers of an instrumented
//! function. gdb does read code that a program registers through the JIT
//! interface ("JIT Compilation Interface" in gdb's manual): a linked list
//! of in-memory ELF objects rooted at `__jit_debug_descriptor`, and a call
//! to `__jit_debug_register_code` (where gdb keeps a breakpoint) after each
//! change. For each block the runtime builds a small relocatable ELF object
//! holding a `.text` section (no bytes) at the slots' addresses, a symbol
//! `weft_return_slots` over them, and the block's `.eh_frame`, and adds it
//! to the list. Registration happens once per block (blocks are never
//! freed), under a spin lock that only registering threads take.

use core::ptr;
use core::sync::atomic::{AtomicBool, Ordering};

/// gdb's `jit_code_entry`.
#[repr(C)]
struct JitCodeEntry {
    next_entry: *mut JitCodeEntry,
    prev_entry: *mut JitCodeEntry,
    symfile_addr: *const u8,
    symfile_size: u64,
}

/// gdb's `jit_descriptor`.
#[repr(C)]
pub struct JitDescriptor {
    version: u32,
    action_flag: u32,
    relevant_entry: *mut JitCodeEntry,
    first_entry: *mut JitCodeEntry,
}

const JIT_NOACTION: u32 = 0;
const JIT_REGISTER_FN: u32 = 1;

/// The list gdb reads. Mutated only under [`LOCK`].
#[no_mangle]
#[used]
pub static mut __jit_debug_descriptor: JitDescriptor = JitDescriptor {
    version: 1,
    action_flag: JIT_NOACTION,
    relevant_entry: ptr::null_mut(),
    first_entry: ptr::null_mut(),
};

/// gdb sets a breakpoint here and reads the descriptor when it is hit.
#[no_mangle]
#[inline(never)]
pub extern "C" fn __jit_debug_register_code() {
    // Keep the call and the stores before it from being optimised away.
    core::sync::atomic::compiler_fence(Ordering::SeqCst);
    // SAFETY: an empty asm statement with no operands.
    unsafe { core::arch::asm!("", options(nostack, preserves_flags)) };
}

static LOCK: AtomicBool = AtomicBool::new(false);

const EHDR: usize = 64;
const SHDR: usize = 64;
const SYM: usize = 24;
const SECTIONS: usize = 6;
const SYMBOL: &[u8] = b"weft_return_slots\0";
const SHSTRTAB: &[u8] = b"\0.text\0.eh_frame\0.symtab\0.strtab\0.shstrtab\0";
// Offsets of the names in SHSTRTAB.
const NAME_TEXT: u32 = 1;
const NAME_EH_FRAME: u32 = 7;
const NAME_SYMTAB: u32 = 17;
const NAME_STRTAB: u32 = 25;
const NAME_SHSTRTAB: u32 = 33;

/// Bytes [`register`] needs for a block whose `.eh_frame` is `eh_len` bytes.
pub const fn space_needed(eh_len: usize) -> usize {
    let data = EHDR + eh_len.next_multiple_of(8) + 2 * SYM + 24 + 48;
    data.next_multiple_of(8) + SECTIONS * SHDR + core::mem::size_of::<JitCodeEntry>() + 8
}

struct Writer {
    base: *mut u8,
    len: usize,
    at: usize,
}

impl Writer {
    fn put(&mut self, bytes: &[u8]) -> Option<usize> {
        let start = self.at;
        if start + bytes.len() > self.len {
            return None;
        }
        // SAFETY: in bounds (checked above) of the caller's buffer.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(start), bytes.len()) };
        self.at += bytes.len();
        Some(start)
    }

    fn align(&mut self, to: usize) -> Option<()> {
        while self.at % to != 0 {
            self.put(&[0])?;
        }
        Some(())
    }
}

#[allow(clippy::too_many_arguments)]
fn shdr(
    name: u32,
    kind: u32,
    flags: u64,
    addr: u64,
    offset: u64,
    size: u64,
    link: u32,
    info: u32,
    align: u64,
    entsize: u64,
) -> [u8; SHDR] {
    let mut h = [0u8; SHDR];
    h[0..4].copy_from_slice(&name.to_le_bytes());
    h[4..8].copy_from_slice(&kind.to_le_bytes());
    h[8..16].copy_from_slice(&flags.to_le_bytes());
    h[16..24].copy_from_slice(&addr.to_le_bytes());
    h[24..32].copy_from_slice(&offset.to_le_bytes());
    h[32..40].copy_from_slice(&size.to_le_bytes());
    h[40..44].copy_from_slice(&link.to_le_bytes());
    h[44..48].copy_from_slice(&info.to_le_bytes());
    h[48..56].copy_from_slice(&align.to_le_bytes());
    h[56..64].copy_from_slice(&entsize.to_le_bytes());
    h
}

/// Builds the ELF object for the slots `[code, code + code_len)` with unwind
/// information `eh_frame` in `space` (`space_len` bytes, 8-aligned, never
/// freed) and registers it with gdb. Returns false when it does not fit.
///
/// # Safety
///
/// `space` must be valid for writes of `space_len` bytes for the life of the
/// process, and 8-byte aligned.
pub unsafe fn register(
    code: u64,
    code_len: u64,
    eh_frame: &[u8],
    space: *mut u8,
    space_len: usize,
) -> bool {
    let Some(entry) = build(code, code_len, eh_frame, space, space_len) else {
        return false;
    };
    while LOCK
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        core::hint::spin_loop();
    }
    // SAFETY: the descriptor is only touched under LOCK; `entry` lives
    // forever in `space`.
    unsafe {
        let d = ptr::addr_of_mut!(__jit_debug_descriptor);
        (*entry).next_entry = (*d).first_entry;
        if !(*d).first_entry.is_null() {
            (*(*d).first_entry).prev_entry = entry;
        }
        (*d).first_entry = entry;
        (*d).relevant_entry = entry;
        (*d).action_flag = JIT_REGISTER_FN;
        __jit_debug_register_code();
        (*d).action_flag = JIT_NOACTION;
    }
    LOCK.store(false, Ordering::Release);
    true
}

fn build(
    code: u64,
    code_len: u64,
    eh_frame: &[u8],
    space: *mut u8,
    space_len: usize,
) -> Option<*mut JitCodeEntry> {
    if space_len < space_needed(eh_frame.len()) || space as usize % 8 != 0 {
        return None;
    }
    let mut w = Writer {
        base: space,
        len: space_len,
        at: EHDR,
    };
    let base = space as u64;
    let eh_at = w.put(eh_frame)?;
    w.align(8)?;
    let mut syms = [0u8; 2 * SYM];
    // Symbol 1: weft_return_slots, global function over the slots in .text.
    syms[SYM..SYM + 4].copy_from_slice(&1u32.to_le_bytes());
    syms[SYM + 4] = 0x12; // STB_GLOBAL << 4 | STT_FUNC
    syms[SYM + 6..SYM + 8].copy_from_slice(&1u16.to_le_bytes());
    // In a relocatable object a symbol's value is its offset in its section.
    syms[SYM + 8..SYM + 16].copy_from_slice(&0u64.to_le_bytes());
    syms[SYM + 16..SYM + 24].copy_from_slice(&code_len.to_le_bytes());
    let sym_at = w.put(&syms)?;
    let mut strtab = [0u8; 1 + SYMBOL.len()];
    strtab[1..].copy_from_slice(SYMBOL);
    let str_at = w.put(&strtab)?;
    let shstr_at = w.put(SHSTRTAB)?;
    w.align(8)?;
    let sh_at = w.at;
    let headers = [
        [0u8; SHDR],
        shdr(NAME_TEXT, 8, 0x6, code, EHDR as u64, code_len, 0, 0, 16, 0),
        shdr(
            NAME_EH_FRAME,
            1,
            0x2,
            base + eh_at as u64,
            eh_at as u64,
            eh_frame.len() as u64,
            0,
            0,
            8,
            0,
        ),
        shdr(
            NAME_SYMTAB,
            2,
            0,
            0,
            sym_at as u64,
            2 * SYM as u64,
            4,
            1,
            8,
            SYM as u64,
        ),
        shdr(
            NAME_STRTAB,
            3,
            0,
            0,
            str_at as u64,
            strtab.len() as u64,
            0,
            0,
            1,
            0,
        ),
        shdr(
            NAME_SHSTRTAB,
            3,
            0,
            0,
            shstr_at as u64,
            SHSTRTAB.len() as u64,
            0,
            0,
            1,
            0,
        ),
    ];
    for h in &headers {
        w.put(h)?;
    }
    let size = w.at;
    let mut ehdr = [0u8; EHDR];
    ehdr[0..4].copy_from_slice(b"\x7fELF");
    ehdr[4] = 2; // ELFCLASS64
    ehdr[5] = 1; // little-endian
    ehdr[6] = 1; // EV_CURRENT
    ehdr[16..18].copy_from_slice(&1u16.to_le_bytes()); // ET_REL
    ehdr[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    ehdr[20..24].copy_from_slice(&1u32.to_le_bytes());
    ehdr[40..48].copy_from_slice(&(sh_at as u64).to_le_bytes());
    ehdr[52..54].copy_from_slice(&(EHDR as u16).to_le_bytes());
    ehdr[58..60].copy_from_slice(&(SHDR as u16).to_le_bytes());
    ehdr[60..62].copy_from_slice(&(SECTIONS as u16).to_le_bytes());
    ehdr[62..64].copy_from_slice(&((SECTIONS - 1) as u16).to_le_bytes());
    // SAFETY: EHDR bytes at the start of the buffer (space_len checked).
    unsafe { ptr::copy_nonoverlapping(ehdr.as_ptr(), space, EHDR) };
    w.align(8)?;
    let entry_at = w.put(&[0u8; core::mem::size_of::<JitCodeEntry>()])?;
    // SAFETY: 8-aligned, in bounds, sized for the entry.
    let entry = unsafe { space.add(entry_at) } as *mut JitCodeEntry;
    // SAFETY: as above.
    unsafe {
        entry.write(JitCodeEntry {
            next_entry: ptr::null_mut(),
            prev_entry: ptr::null_mut(),
            symfile_addr: space,
            symfile_size: size as u64,
        })
    };
    Some(entry)
}
