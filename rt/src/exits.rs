//! The runtime's side of exit hooks and timers: each thread's return-slot
//! block, its unwind information, its CPU clock and stack bounds, the exit
//! trampoline every slot calls, and the closing of activations that the
//! thread can no longer close itself (it is exiting).
//!
//! The generated code (`weft_codegen::exit`, `weft_codegen::timer`) does all
//! per-call work; this module only runs once per thread (set-up at its first
//! hit, clean-up at its exit) and once per session
//! ([`weft_rt_enable_exits`]).
//!
//! # Block layout
//!
//! Exactly `weft_codegen::ReturnSlots`' for a given capacity: a code part of
//! `delta` bytes (slots of `int3 ; call [rip + X] ; int3...`, then the
//! address the slots call), then the data cells. The runtime builds the code
//! part itself; the injector reads the template back
//! ([`weft_rt_enable_exits`] returns its address) and refuses to hook exits
//! if it differs from what its code generator would build. After the data
//! cells, one more page holds the block's `.eh_frame`, registered with
//! libgcc's `__register_frame` so that C++ exceptions, `backtrace()` and
//! Rust panics unwind through the slots.
//!
//! Blocks are never freed: a block stays with its row when the row is handed
//! to a new thread, so their number is bounded by the rows in use.

use crate::clock::{CpuPreference, ThreadCpuClock, WallClock};
use crate::layout::{metric, RegionHeader, RowHeader, ROW_HEADER_SIZE};
use core::arch::global_asm;
use core::ptr;
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

// Every return slot calls `weft_rt_exit_trampoline` (its address is in the
// block's code part), which jumps to the exit handler installed last. The
// indirection lets each session install a handler built for its own timer
// layout while blocks, and activations still open in them, stay valid.
global_asm!(
    ".pushsection .data.weft_rt_exit_handler_slot,\"aw\",@progbits",
    ".balign 8",
    ".globl weft_rt_exit_handler_slot",
    ".hidden weft_rt_exit_handler_slot",
    "weft_rt_exit_handler_slot:",
    ".quad 0",
    ".popsection",
    ".pushsection .text.weft_rt_exit_trampoline,\"ax\",@progbits",
    ".globl weft_rt_exit_trampoline",
    ".type weft_rt_exit_trampoline,@function",
    "weft_rt_exit_trampoline:",
    "endbr64",
    "jmp qword ptr [rip + weft_rt_exit_handler_slot]",
    ".size weft_rt_exit_trampoline, . - weft_rt_exit_trampoline",
    ".popsection",
);

extern "C" {
    /// The exit handler the trampoline jumps to (written by
    /// [`weft_rt_enable_exits`] only).
    static weft_rt_exit_handler_slot: AtomicU64;
    /// See the `global_asm!` above; called, never from Rust.
    pub fn weft_rt_exit_trampoline();
}

/// Page size of the block layout.
const PAGE: usize = 4096;
/// Largest capacity accepted (the code generator's limit).
const MAX_CAPACITY: u32 = 1 << 20;
/// Largest `.eh_frame` template accepted.
const MAX_EH_FRAME: usize = 512;
const _: () = assert!(MAX_EH_FRAME + crate::gdb_jit::space_needed(MAX_EH_FRAME) <= PAGE);

/// Activations per block; 0 while exits are not enabled.
static CAPACITY: AtomicU32 = AtomicU32::new(0);
/// The code part every block starts with (never freed).
static CODE_TEMPLATE: AtomicPtr<u8> = AtomicPtr::new(ptr::null_mut());
/// The `.eh_frame` template (never freed) and where its FDE's initial
/// location is, which each block patches with its own address.
static EH_TEMPLATE: AtomicPtr<u8> = AtomicPtr::new(ptr::null_mut());
static EH_LEN: AtomicUsize = AtomicUsize::new(0);
static EH_PC_OFFSET: AtomicUsize = AtomicUsize::new(0);
/// Whether the installed handler's layout has timers (80-byte metric
/// blocks with nesting and timer words); without, only the first 32 bytes
/// of a metric base belong to its function.
static TIMED: AtomicU32 = AtomicU32::new(0);
/// libgcc's `__register_frame`, if the process has it.
static REGISTER_FRAME: AtomicUsize = AtomicUsize::new(0);

/// Sizes of a block of `capacity` activations: (`delta` = code part and
/// distance from a slot to its cell, block length without the unwind page).
pub const fn block_sizes(capacity: u32) -> (usize, usize) {
    let slots = capacity as usize * metric::SLOT_SIZE;
    let delta = (slots + 8).div_ceil(PAGE) * PAGE;
    let len = (delta + slots).div_ceil(PAGE) * PAGE;
    (delta, len)
}

fn errno() -> i64 {
    // SAFETY: `__errno_location` always returns this thread's errno.
    i64::from(unsafe { *libc::__errno_location() })
}

/// Enables exit hooks for the process (first call) and installs `handler`
/// as the exit handler every return slot reaches (every call).
///
/// `capacity` is the activations per block (fixed by the first call: a
/// later call with another capacity fails with `-EEXIST`); `eh_frame` /
/// `eh_len` an `.eh_frame` template for a block (CIE, one FDE, terminator)
/// whose FDE initial location, 8 bytes at `eh_pc_offset`, each block
/// replaces with its own address.
///
/// `timed` is 1 when `handler` (and the entry snippets of this session)
/// use the timer layout, 0 when they only count.
///
/// Returns the address of the code-part template (`delta` bytes, for the
/// injector to check) or a negated errno. Called by the injector with the
/// world stopped: it takes no lock (`__register_frame` was looked up when
/// the library was loaded, see [`find_register_frame`]).
///
/// # Safety
///
/// `eh_frame` must point at `eh_len` readable bytes, and `handler` at an
/// exit handler built for this process's layout.
#[no_mangle]
pub unsafe extern "C" fn weft_rt_enable_exits(
    capacity: u32,
    handler: u64,
    eh_frame: *const u8,
    eh_len: u32,
    eh_pc_offset: u32,
    timed: u32,
) -> i64 {
    let (eh_len, eh_pc_offset) = (eh_len as usize, eh_pc_offset as usize);
    if capacity == 0
        || capacity > MAX_CAPACITY
        || handler == 0
        || eh_frame.is_null()
        || eh_len > MAX_EH_FRAME
        || eh_pc_offset + 8 > eh_len
    {
        return -i64::from(libc::EINVAL);
    }
    let existing = CAPACITY.load(Ordering::Acquire);
    if existing != 0 {
        if existing != capacity {
            return -i64::from(libc::EEXIST);
        }
        TIMED.store(timed, Ordering::Release);
        // SAFETY: a static the trampoline reads; one aligned store.
        unsafe { weft_rt_exit_handler_slot.store(handler, Ordering::Release) };
        return CODE_TEMPLATE.load(Ordering::Acquire) as i64;
    }
    let (delta, _) = block_sizes(capacity);
    // SAFETY: fresh anonymous mappings, filled before being published.
    unsafe {
        let code = libc::mmap(
            ptr::null_mut(),
            delta + PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if code == libc::MAP_FAILED {
            return -errno();
        }
        let code = code as *mut u8;
        ptr::write_bytes(code, 0xcc, delta);
        let pointer_at = capacity as usize * metric::SLOT_SIZE;
        for i in 0..capacity as usize {
            let slot = i * metric::SLOT_SIZE;
            // call qword [rip + disp32], rip = the end of the 6-byte call.
            let disp = (pointer_at as i64 - (slot + metric::SLOT_ENTRY + 6) as i64) as i32;
            let at = code.add(slot + metric::SLOT_ENTRY);
            at.write(0xff);
            at.add(1).write(0x15);
            ptr::copy_nonoverlapping(disp.to_le_bytes().as_ptr(), at.add(2), 4);
        }
        let target = (weft_rt_exit_trampoline as *const () as u64).to_le_bytes();
        ptr::copy_nonoverlapping(target.as_ptr(), code.add(pointer_at), 8);
        // The unwind template lives on the page after the code template.
        let eh = code.add(delta);
        ptr::copy_nonoverlapping(eh_frame, eh, eh_len);
        EH_TEMPLATE.store(eh, Ordering::Release);
        EH_LEN.store(eh_len, Ordering::Release);
        EH_PC_OFFSET.store(eh_pc_offset, Ordering::Release);
        CODE_TEMPLATE.store(code, Ordering::Release);
        TIMED.store(timed, Ordering::Release);
        weft_rt_exit_handler_slot.store(handler, Ordering::Release);
    }
    CAPACITY.store(capacity, Ordering::Release);
    if let Some(header) = crate::runtime::region_header() {
        header.exit_capacity.store(capacity, Ordering::Release);
    }
    CODE_TEMPLATE.load(Ordering::Acquire) as i64
}

/// Looks up libgcc's `__register_frame`. Called from the library's
/// constructor, inside the `dlopen` that loads it: the loader lock `dlsym`
/// takes is then ours already, while later (with the world stopped) another
/// thread could hold it.
pub(crate) fn find_register_frame() {
    // SAFETY: dlsym with a NUL-terminated name; a null result is handled.
    let register = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"__register_frame".as_ptr()) };
    REGISTER_FRAME.store(register as usize, Ordering::Release);
}

/// A new return-slot block: code part copied from the template and made
/// read+execute, data cells zeroed, `.eh_frame` registered. None when exits
/// are not enabled or a system call failed.
fn new_block(capacity: u32) -> Option<u64> {
    let template = CODE_TEMPLATE.load(Ordering::Acquire);
    if capacity == 0 || template.is_null() {
        return None;
    }
    let (delta, len) = block_sizes(capacity);
    // SAFETY: a fresh anonymous mapping of len + one page, written before it
    // is published in the row; the template holds `delta` bytes.
    unsafe {
        let block = libc::mmap(
            ptr::null_mut(),
            len + PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if block == libc::MAP_FAILED {
            return None;
        }
        let block = block as *mut u8;
        ptr::copy_nonoverlapping(template, block, delta);
        if libc::mprotect(
            block as *mut libc::c_void,
            delta,
            libc::PROT_READ | libc::PROT_EXEC,
        ) != 0
        {
            libc::munmap(block as *mut libc::c_void, len + PAGE);
            return None;
        }
        let eh = block.add(len);
        let eh_template = EH_TEMPLATE.load(Ordering::Acquire);
        let register = REGISTER_FRAME.load(Ordering::Acquire);
        let eh_len = EH_LEN.load(Ordering::Acquire);
        if !eh_template.is_null() {
            ptr::copy_nonoverlapping(eh_template, eh, eh_len);
            let pc = (block as u64).to_le_bytes();
            ptr::copy_nonoverlapping(pc.as_ptr(), eh.add(EH_PC_OFFSET.load(Ordering::Acquire)), 8);
            if register != 0 {
                let register: extern "C" fn(*const u8) = core::mem::transmute(register);
                register(eh);
            }
            // The same unwind information for gdb, in the rest of the page.
            let gdb_at = eh_len.next_multiple_of(8);
            crate::gdb_jit::register(
                block as u64,
                (capacity as usize * metric::SLOT_SIZE) as u64,
                core::slice::from_raw_parts(eh, eh_len),
                eh.add(gdb_at),
                PAGE - gdb_at,
            );
        }
        Some(block as u64)
    }
}

/// The calling thread's stack `[lo, hi)`, or everything when unknown (the
/// generated code then treats every `rsp` as on the thread's stack).
fn stack_bounds() -> (u64, u64) {
    // SAFETY: pthread_getattr_np fills `attr`, which is destroyed after use;
    // pthread_attr_getstack writes two out-parameters.
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return (0, u64::MAX);
        }
        let mut addr: *mut libc::c_void = ptr::null_mut();
        let mut size: libc::size_t = 0;
        let ok = libc::pthread_attr_getstack(&attr, &mut addr, &mut size) == 0;
        libc::pthread_attr_destroy(&mut attr);
        if !ok || addr.is_null() || size == 0 {
            return (0, u64::MAX);
        }
        (addr as u64, addr as u64 + size as u64)
    }
}

/// Sets up the calling thread's exit and timer state in its (new or reused)
/// row: block (kept from the row's previous thread, else allocated), depth
/// 0, stack bounds, CPU clock. Runs at the thread's first hit, with the
/// scratch row installed.
pub(crate) fn setup_thread(header: &RegionHeader, row: &RowHeader) {
    let state = &row.thread;
    state.depth.store(0, Ordering::Relaxed);
    // No stale clock may be used while it is rebuilt.
    state.cpu_clock.store(0, Ordering::Relaxed);
    let (lo, hi) = stack_bounds();
    state.stack_lo.store(lo, Ordering::Relaxed);
    state.stack_hi.store(hi, Ordering::Relaxed);
    if state.block.load(Ordering::Relaxed) == 0 {
        match new_block(CAPACITY.load(Ordering::Acquire)) {
            Some(block) => state.block.store(block, Ordering::Release),
            None => {
                if CAPACITY.load(Ordering::Acquire) != 0 {
                    header.blocks_failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    let clock_at = ptr::addr_of!(row.clock) as *mut ThreadCpuClock;
    let mut clock = ThreadCpuClock::new(&header.wall, CpuPreference::Auto);
    clock.close_fd();
    let (mode, why) = (clock.mode(), clock.why());
    // SAFETY: the storage is this row's, sized and aligned for the clock
    // (checked in layout), and holds no live clock (cleared at thread exit;
    // at worst a leaked page of a thread that never ran its destructors).
    unsafe { clock_at.write(clock) };
    state.cpu_why.store(why, Ordering::Relaxed);
    state.cpu_source.store(1 + mode, Ordering::Relaxed);
    state.cpu_clock.store(clock_at as u64, Ordering::Release);
}

fn word(row: *mut u8, offset: usize) -> &'static AtomicU64 {
    // SAFETY: callers pass offsets inside the row (metric bases the
    // injector handed out, plus a field offset), 8-byte aligned.
    unsafe { &*(row.add(offset) as *const AtomicU64) }
}

/// Stops one activation's timer exactly as the generated close subroutine
/// does (see `weft_codegen::timer`): only the outermost activation of the
/// function stops it.
fn close_timer(row: *mut u8, base: usize, wall: &WallClock, cpu: Option<&mut ThreadCpuClock>) {
    let nesting = word(row, base + metric::NESTING);
    match nesting.load(Ordering::Relaxed) {
        0 => return,
        1 => {}
        _ => {
            nesting.fetch_sub(1, Ordering::Relaxed);
            return;
        }
    }
    let seq = word(row, base + metric::SEQ);
    seq.fetch_add(1, Ordering::Release);
    let cpu_start = word(row, base + metric::CPU_START);
    if let (start @ 1.., Some(clock)) = (cpu_start.load(Ordering::Relaxed), cpu) {
        let spent = clock.now().saturating_sub(start);
        word(row, base + metric::CPU_TOTAL).fetch_add(spent, Ordering::Relaxed);
    }
    cpu_start.store(0, Ordering::Relaxed);
    let wall_start = word(row, base + metric::WALL_START);
    if let start @ 1.. = wall_start.load(Ordering::Relaxed) {
        let spent = wall.now().saturating_sub(start);
        word(row, base + metric::WALL_TOTAL).fetch_add(spent, Ordering::Relaxed);
    }
    wall_start.store(0, Ordering::Relaxed);
    seq.fetch_add(1, Ordering::Release);
    nesting.fetch_sub(1, Ordering::Relaxed);
}

/// Closes every activation at index `from` or above, innermost first, as
/// unwound (their frames are gone), stopping their timers. The caller is
/// the row's own thread.
pub(crate) fn close_from(header: &RegionHeader, row_ptr: *mut u8, from: u64) {
    // SAFETY: row_ptr is this thread's row.
    let row = unsafe { &*(row_ptr as *const RowHeader) };
    let state = &row.thread;
    let block = state.block.load(Ordering::Relaxed);
    let capacity = u64::from(CAPACITY.load(Ordering::Acquire));
    if block == 0 || capacity == 0 {
        return;
    }
    let (delta, _) = block_sizes(capacity as u32);
    let clock = state.cpu_clock.load(Ordering::Relaxed) as *mut ThreadCpuClock;
    let words = u64::from(header.metric_words);
    loop {
        let depth = state.depth.load(Ordering::Relaxed);
        if depth <= from || depth > capacity {
            return;
        }
        let top = depth - 1;
        let cell = block + delta as u64 + top * metric::SLOT_SIZE as u64;
        // SAFETY: the cell lies in the block's data part (top < capacity).
        let base = unsafe { ((cell + metric::CELL_METRIC as u64) as *const i32).read() };
        state.depth.store(top, Ordering::Relaxed);
        let base = base as i64;
        let limit = (ROW_HEADER_SIZE as u64 + 8 * words) as i64 - metric::TIMED_LEN as i64;
        if base < ROW_HEADER_SIZE as i64 || base > limit || base % 8 != 0 {
            continue; // not a metric base of this row: never write there
        }
        let base = base as usize;
        word(row_ptr, base + metric::UNWOUND).fetch_add(1, Ordering::Relaxed);
        if TIMED.load(Ordering::Acquire) != 0 {
            // SAFETY: the clock pointer, when set, is this thread's own clock.
            let cpu = unsafe { clock.as_mut() };
            close_timer(row_ptr, base, &header.wall, cpu);
        }
    }
}

extern "C" {
    /// libgcc's accessor for the instruction pointer of an unwind frame
    /// (the runtime links libgcc_s, whose unwinder is the one that finds
    /// the slots' registered unwind information and calls the routine
    /// below).
    fn _Unwind_GetIP(context: *mut core::ffi::c_void) -> usize;
}

const UA_CLEANUP_PHASE: i32 = 2;
const URC_CONTINUE_UNWIND: i32 = 8;

/// The personality routine of the return slots (see
/// `weft_codegen::block_eh_frame_with_personality`). An exception, Rust
/// panic or forced unwind (`pthread_exit`, cancellation) that reaches a
/// slot has just discarded the frame of that slot's activation and of any
/// nested in it: in the cleanup phase they are closed (counted as unwound,
/// timers stopped) now rather than at the thread's next instrumented call.
/// Never stops the unwind, never catches.
///
/// # Safety
///
/// Called by libgcc's unwinder with its own context.
#[no_mangle]
pub unsafe extern "C" fn weft_rt_personality(
    _version: i32,
    actions: i32,
    _class: u64,
    _exception: *mut core::ffi::c_void,
    context: *mut core::ffi::c_void,
) -> i32 {
    if actions & UA_CLEANUP_PHASE == 0 || context.is_null() {
        return URC_CONTINUE_UNWIND;
    }
    let (Some(header), row_ptr) = (
        crate::runtime::region_header(),
        crate::runtime::tls_row_get(),
    ) else {
        return URC_CONTINUE_UNWIND;
    };
    if row_ptr.is_null() {
        return URC_CONTINUE_UNWIND;
    }
    // SAFETY: the unwinder passes its live context.
    let ip = unsafe { _Unwind_GetIP(context) } as u64;
    // SAFETY: row_ptr is this thread's row.
    let row = unsafe { &*(row_ptr as *const RowHeader) };
    let block = row.thread.block.load(Ordering::Relaxed);
    let capacity = u64::from(CAPACITY.load(Ordering::Acquire));
    let offset = ip
        .wrapping_sub(metric::SLOT_ENTRY as u64)
        .wrapping_sub(block);
    if block != 0 && offset < capacity * metric::SLOT_SIZE as u64 {
        close_from(header, row_ptr, offset / metric::SLOT_SIZE as u64);
    }
    URC_CONTINUE_UNWIND
}

/// At thread exit: closes the activations still open (the thread left them
/// by `pthread_exit`, cancellation or an exception that ended it) and
/// releases the CPU clock. Later destructors may still run instrumented
/// code: they find no CPU clock and count no CPU time.
pub(crate) fn finish_thread(header: &RegionHeader, row_ptr: *mut u8) {
    close_from(header, row_ptr, 0);
    // SAFETY: row_ptr is this thread's row.
    let row = unsafe { &*(row_ptr as *const RowHeader) };
    let clock = row.thread.cpu_clock.swap(0, Ordering::AcqRel) as *mut ThreadCpuClock;
    if !clock.is_null() {
        // SAFETY: the clock was written by setup_thread and is dropped once
        // (the pointer was swapped out above).
        unsafe { ptr::drop_in_place(clock) };
    }
}

/// In a forked child: the forking thread's CPU clock reads a perf page the
/// child does not have (perf mappings are not inherited). Forget it.
pub(crate) fn forget_clock_after_fork(row_ptr: *mut u8) {
    // SAFETY: row_ptr is this thread's row (in the child's private copy).
    let row = unsafe { &*(row_ptr as *const RowHeader) };
    row.thread.cpu_clock.store(0, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_match_the_code_generator_layout() {
        // delta = slots + pointer rounded to pages; data follows.
        assert_eq!(block_sizes(1024), (32 * 1024 + 4096, 32 * 1024 * 2 + 4096));
        assert_eq!(block_sizes(4), (4096, 8192));
    }
}
