//! The fields of the runtime's per-thread CPU clock state
//! (`weft_rt::clock::ThreadCpuClock`) and of the kernel's perf mmap page
//! that generated timer code reads inline on its fast path (everything
//! else in them only the runtime's own readers touch, and stays there).
//! The runtime checks each offset against its types with `offset_of!`.

/// Byte offset in the CPU clock state of the perf page pointer
/// (`*const perf_event_mmap_page`, null in syscall mode).
pub const CPU_OFF_PAGE: usize = 0;
/// Byte offset in the CPU clock state of the page `lock` the anchor was
/// taken at (u32). A re-anchor stores 1 here first: a settled page lock is
/// even, so no reader takes the fast path on a half-written anchor.
pub const CPU_OFF_ANCHOR_LOCK: usize = 12;
/// Byte offset in the CPU clock state of the TSC at the anchor (u64).
pub const CPU_OFF_ANCHOR_TSC: usize = 24;
/// Byte offset in the CPU clock state of the anchor's maximum age in TSC
/// ticks (u64; 0: never take the fast path).
pub const CPU_OFF_MAX_AGE: usize = 96;
/// Byte offset in the CPU clock state of `ticks_offset` (u64): while the
/// anchor holds, the thread's CPU time in ticks is `tsc + ticks_offset`.
pub const CPU_OFF_TICKS_OFFSET: usize = 112;
/// Byte offset in the kernel's `perf_event_mmap_page` of its `lock` (u32),
/// which changes whenever the thread is scheduled in or out.
pub const PAGE_OFF_LOCK: usize = 8;
