//! The runtime's process-wide state that both the thread registration
//! (`runtime`) and the closing of activations (`exits`) read: the shared
//! region, and each thread's row pointer in static TLS.

use crate::layout::RegionHeader;
use core::arch::{asm, global_asm};
use core::ptr;
use core::sync::atomic::{AtomicPtr, Ordering};

// The thread's row pointer, in the static TLS block (initial-exec model), so
// that generated code can read it with one `mov rcx, fs:[offset]`. Declared
// in assembly because stable Rust has no way to ask for the initial-exec TLS
// model; `.tbss` makes every thread's copy start at zero, including threads
// whose stack and TCB glibc recycles from an exited thread.
global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".balign 8",
    ".type weft_rt_tls_row,@object",
    ".size weft_rt_tls_row,8",
    "weft_rt_tls_row:",
    ".zero 8",
    ".popsection",
    options(att_syntax)
);

/// The region, once created. Never unmapped: trampolines may reach it forever.
pub(crate) static REGION: AtomicPtr<u8> = AtomicPtr::new(ptr::null_mut());

/// The region's header, once the region exists.
pub(crate) fn region_header() -> Option<&'static RegionHeader> {
    let base = REGION.load(Ordering::Acquire);
    // SAFETY: REGION, once set, points at a live mapping (never unmapped)
    // starting with an initialised header.
    (!base.is_null()).then(|| unsafe { &*(base as *const RegionHeader) })
}

/// Offset of the thread-local row pointer from the thread pointer.
///
/// Constant for the life of the process; negative (static TLS lies below
/// the thread pointer on x86-64).
#[no_mangle]
pub extern "C" fn weft_rt_tls_offset() -> i64 {
    let offset: i64;
    // SAFETY: loads the GOT entry the linker created for the initial-exec
    // TLS symbol; touches no other memory and no flags.
    unsafe {
        asm!(
            "mov {}, qword ptr [rip + weft_rt_tls_row@GOTTPOFF]",
            out(reg) offset,
            options(nostack, preserves_flags, readonly, pure)
        );
    }
    offset
}

/// This thread's row (null before it registers).
pub(crate) fn tls_row_get() -> *mut u8 {
    let value: *mut u8;
    // SAFETY: reads this thread's own copy of `weft_rt_tls_row`, which the
    // dynamic loader allocated in static TLS when it loaded this library.
    unsafe {
        asm!(
            "mov {v}, qword ptr fs:[{off}]",
            v = out(reg) value,
            off = in(reg) weft_rt_tls_offset(),
            options(nostack, preserves_flags, readonly)
        );
    }
    value
}

/// Sets this thread's row.
pub(crate) fn tls_row_set(row: *mut u8) {
    // SAFETY: writes this thread's own copy of `weft_rt_tls_row`.
    unsafe {
        asm!(
            "mov qword ptr fs:[{off}], {v}",
            v = in(reg) row,
            off = in(reg) weft_rt_tls_offset(),
            options(nostack, preserves_flags)
        );
    }
}
