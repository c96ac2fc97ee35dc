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

/// The CPU-time table: a `BPF_F_MMAPABLE` array the injector's
/// `sched_switch` program writes and the target's threads read, mapped in
/// both. It replaces the per-thread perf event as the way a thread learns
/// that it was switched, and what its CPU time was when it came back on:
/// a perf event costs its thread about a microsecond at every context
/// switch on a KVM guest (the PMU's disable and enable), the program
/// a few dozen nanoseconds for the target's switches only.
///
/// One slot per thread, found by open addressing on the thread id: slot
/// `(tid + i) % SLOTS` for `i < PROBES`. A thread claims its slot (a
/// compare-and-swap of [`table::TID`] from [`table::FREE`] or
/// [`table::GONE`]); the program only looks slots up, and stops at a free
/// one. A thread's clock state points at its slot as it would at a perf
/// page: [`table::SEQ`] is at [`PAGE_OFF_LOCK`], so the inline fast path
/// (`lock` unchanged, anchor young) is the same code.
pub mod table {
    /// Bytes per slot: a cache line, so that one CPU's write for a thread
    /// coming on does not evict another thread's slot from its reader.
    pub const SLOT_SIZE: usize = 64;
    /// Slots in the table (a power of two): 1 MiB.
    pub const SLOTS: u32 = 16_384;
    /// How many slots from its home a thread's may be.
    pub const PROBES: u32 = 16;
    /// Bytes of the table.
    pub const TABLE_BYTES: usize = SLOT_SIZE * SLOTS as usize;
    /// Offset of the owning thread id (u32).
    pub const TID: usize = 0;
    /// [`TID`] of a slot never claimed: a lookup stops here.
    pub const FREE: u32 = 0;
    /// [`TID`] of a slot whose thread let it go: a lookup goes on past it,
    /// a claim may take it.
    pub const GONE: u32 = u32::MAX;
    /// Offset of the switch count (u32): the program adds 2 whenever it
    /// writes the slot, so it stays even like a settled perf page lock.
    pub const SEQ: usize = 8;
    /// Offset of the thread's `sum_exec_runtime` (ns on a CPU, u64) when
    /// it last came on a CPU.
    pub const SUM: usize = 16;
    /// Offset of `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) when it last came
    /// on a CPU (u64); 0 before the program has written the slot.
    pub const SWITCHED_IN: usize = 24;

    const _: () = assert!(SEQ == super::PAGE_OFF_LOCK);
    const _: () = assert!(SLOTS.is_power_of_two() && PROBES <= SLOTS);
}
