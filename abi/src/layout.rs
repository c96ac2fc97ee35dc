//! The layout of the shared-memory region, shared by the runtime (which
//! creates it inside the target), the code generated for probes (which
//! writes rows and cells at the offsets below) and the injector (which maps
//! it read-only). The runtime re-exports this module as `weft_rt::layout`.
//!
//! ```text
//! +--------------------+ 0
//! | RegionHeader       |
//! +--------------------+ ACKS_OFFSET (4096)
//! | acks[SESSIONS]     |  per session slot, u32 per row, written by that
//! | [max_rows]         |  session's injector: "I have the figures of
//! |                    |  generation g of this row" (g + 1)
//! +--------------------+ Geometry::directory_offset() (page aligned)
//! | probes[DIRECTORY]  |  ProbeEntry per probe any weft put in: the list of
//! |                    |  live probes and the sessions that own them
//! +--------------------+ Geometry::rows_offset() (page aligned)
//! | row 0              |  RowHeader (64 bytes) + metric words
//! | row 1              |  every row is `row_stride` bytes, a multiple of 64,
//! | ...                |  so no two threads ever write the same cache line
//! | row max_rows       |  the overflow row, shared by threads past capacity
//! | row max_rows + 1   |  the scratch row: calls made by the runtime itself
//! +--------------------+
//! ```
//!
//! Only the thread that owns a row writes its metric words, each with a
//! single instruction, so the injector's aligned 8-byte reads are never torn.
//! The injector maps the region read-only, except the header page, the ack
//! pages and the probe directory.
//!
//! ## Who owns the instrumentation
//!
//! The target does. Metric words, call records, the installed exit code and
//! the list of live probes are handed out from here (the header's cursors,
//! [`RegionHeader::sessions`], the probe directory), not from one weft's
//! memory: a later weft, or one attached at the same time, sees exactly what
//! is in place and never hands out a word or a record that is still in use.
//! Only a weft that holds the process with ptrace changes these (the kernel
//! lets one tracer at a time attach), so they need no lock.
//!
//! ## Row life cycle
//!
//! `FREE` → `LIVE` (a thread's first hit) → `EXITED` (its TLS destructors
//! ran; it may still run a little) → the injector sees the thread gone from
//! `/proc`, copies the row's figures and acks the row's generation (every
//! session slot in use must have acked it) → a new thread may claim it (`CLAIMED`, words zeroed, generation + 1, `LIVE`).
//! Rows are therefore bounded by the threads alive at once plus those the
//! injector has not harvested yet, never by the threads ever created.

use core::sync::atomic::{AtomicI32, AtomicI64, AtomicU32, AtomicU64};

/// `b"WEFTRT01"` as a little-endian `u64`: identifies a weft region.
pub const MAGIC: u64 = u64::from_le_bytes(*b"WEFTRT01");
/// Bumped whenever the layout below changes incompatibly.
pub const VERSION: u32 = 9;
/// Byte offset of `user` in a user probe's context: the code generator lays
/// its `ProbeContext` out around it (`weft_codegen::CTX_USER`, checked with
/// `offset_of!` there) and `weft_rt_library_event` reads its constant here.
pub const PROBE_CTX_USER: usize = 152;
/// The cache-line size every row is aligned and padded to.
pub const CACHE_LINE: usize = 64;
/// Byte offset of the ack array from the start of the region.
pub const ACKS_OFFSET: usize = 4096;
/// Page size the layout is aligned to.
pub const PAGE: u64 = 4096;
/// Bytes of [`RowHeader`] before a row's first metric word.
pub const ROW_HEADER_SIZE: usize = 256;
/// Length of a thread name as the kernel keeps it (`comm`), NUL included.
pub const NAME_LEN: usize = 16;

/// A row nobody owns yet.
pub const ROW_FREE: u32 = 0;
/// A row owned by a live thread.
pub const ROW_LIVE: u32 = 1;
/// A row whose thread has exited; its figures stay for the report.
pub const ROW_EXITED: u32 = 2;
/// The shared overflow row of threads that found the table full.
pub const ROW_OVERFLOW: u32 = 3;
/// A harvested row being taken over by a new thread.
pub const ROW_CLAIMED: u32 = 4;

/// The first bytes of the region.
#[repr(C)]
pub struct RegionHeader {
    /// [`MAGIC`].
    pub magic: u64,
    /// [`VERSION`].
    pub version: u32,
    /// `size_of::<RegionHeader>()` when created.
    pub header_size: u32,
    /// Rows available to threads (the overflow row comes after them).
    pub max_rows: u32,
    /// Metric words per row.
    pub metric_words: u32,
    /// Bytes from one row to the next: a multiple of [`CACHE_LINE`].
    pub row_stride: u64,
    /// Total size of the region in bytes.
    pub region_size: u64,
    /// Offset of the runtime's thread-local row pointer from the thread
    /// pointer (`%fs` base): generated code reads `fs:[tls_offset]`.
    pub tls_offset: i64,
    /// Address (in the target) of `weft_rt_register_thread`.
    pub register_fn: u64,
    /// Rows handed out so far (may exceed `max_rows`: the excess went to
    /// the overflow row).
    pub rows_used: AtomicU32,
    /// Process that created the region (to notice a forked child's copy).
    pub pid: AtomicU32,
    /// Incremented by every `weft_rt_init` that starts a new session.
    pub session: AtomicU64,
    /// Threads that registered after the table was full.
    pub overflow_threads: AtomicU64,
    /// Threads that took over a harvested row instead of a new one.
    pub rows_reused: AtomicU64,
    /// Non-zero when the runtime disabled itself (e.g. in a forked child).
    pub disabled: AtomicI64,
    /// Address (in the target) of `weft_rt_wall_raw`: generated timer code
    /// calls it for the raw wall clock when the TSC is not the wall clock
    /// (with a TSC wall clock it reads `rdtsc` itself).
    pub wall_raw_fn: u64,
    /// Address (in the target) of `weft_rt_cpu_ticks`, the slow path of
    /// the thread CPU clock generated timer code reads inline.
    pub cpu_ticks_fn: u64,
    /// Address (in the target) of [`RegionHeader::wall`] itself.
    pub wall_address: u64,
    /// Address (in the target) of call record 0 (`weft_rt_call_records`):
    /// [`CALL_RECORDS`] records of [`RECORD_SIZE`] bytes, through which timed
    /// functions are called (see [`metric`] and `weft_codegen::exit`).
    pub call_records: u64,
    /// Address (in the target) of the call records' targets
    /// (`weft_rt_call_targets`, one `u64` per record, written by the
    /// injector).
    pub call_targets: u64,
    /// Address (in the target) of the word every call record jumps through
    /// to reach the exit handler the injector installed last.
    pub exit_handler_slot: u64,
    /// Address (in the target) of the exit-probe table: one 32-byte entry
    /// per call record (probe function, its constant, the instrumented
    /// function), written by the injector.
    pub exit_probes: u64,
    /// Activations per thread; 0 while exits are not enabled.
    pub exit_capacity: AtomicU32,
    /// Threads whose activation stack could not be allocated (their exits
    /// are not hooked: counted as `unhooked`).
    pub blocks_failed: AtomicU32,
    /// Nanoseconds per raw timer tick, as a 32.32 fixed-point number: raw
    /// timer readings (the TSC, or CLOCK_MONOTONIC nanoseconds when the
    /// TSC is not the wall clock) convert to ns as `(ticks * q32) >> 32`.
    /// See `weft_rt::clock::TimerUnits`.
    pub timer_ns_per_tick_q32: u64,
    /// The process's wall clock, calibrated when the runtime was loaded. A
    /// reader in another process on the same machine computes the same
    /// clock with `weft_rt::clock::WallClock::now` (the TSC is shared);
    /// `weft_rt::clock::WallClock::in_region` gives it its type.
    pub wall: WallClockStorage,
    /// Address (in the target) of `weft_rt_library_event`, the user probe
    /// an injector puts on the dynamic loader's `_dl_debug_state` to
    /// instrument a library as soon as it is mapped, before its code runs.
    pub library_event_fn: u64,
    /// Libraries the loader finished mapping while
    /// [`RegionHeader::library_wait_ms`] was set: bumped by the loading
    /// thread (a futex word the injector waits on).
    pub library_loads: AtomicU32,
    /// The last of those the injector has dealt with: set by the injector
    /// (a futex word the loading thread waits on).
    pub library_loads_done: AtomicU32,
    /// How long a loading thread waits for the injector, in milliseconds;
    /// 0: it does not wait (nothing asked).
    pub library_wait_ms: AtomicU32,
    /// Events per thread of the call-trace rings (`-m trace`, see
    /// [`trace`]); 0 while no weft traced calls. Set with
    /// [`RegionHeader::trace_ring`] by the first session that traces, and
    /// kept: the installed exit code writes there.
    pub trace_capacity: AtomicU32,
    /// `CLOCK_MONOTONIC` milliseconds of the injector's last look at the
    /// process: a load waits only for an injector seen within the last
    /// second plus the wait (one that died or stopped watching costs
    /// nothing after that).
    pub library_watcher_ms: AtomicU64,
    /// First metric word never handed out (every session allocates from
    /// here: words below it may be in use by any session, alive or dead).
    pub words_next: AtomicU32,
    /// First call record never handed out.
    pub records_next: AtomicU32,
    /// 1 + the first of the words open activations of removed probes are
    /// pointed at ([`metric::TIMED_LEN`] bytes); 0 until one is needed.
    pub sink_word: AtomicU32,
    /// What the installed exit code serves: [`EXITS_INSTALLED`] and the
    /// timers ([`EXITS_WALL`], [`EXITS_CPU`]); 0 before any.
    pub exit_flags: AtomicU32,
    /// Address (in the target) of the installed exit code.
    pub exit_code: AtomicU64,
    /// One past the highest probe-directory entry ever used (bounds scans).
    pub directory_used: AtomicU32,
    /// 1 + the first metric word of every row's call-trace ring (see
    /// [`trace`]); 0: no ring.
    pub trace_ring: AtomicU32,
    /// The weft sessions that have probes here, alive or not: a probe's
    /// [`ProbeEntry::owners`] bit `i` names `sessions[i]`.
    pub sessions: [SessionSlot; SESSIONS],
}

/// Room for the runtime's `weft_rt::clock::WallClock` (32 bytes) in the
/// header. Opaque here: only the runtime's own code reads its fields (no
/// generated code does; timers call `weft_rt_wall_raw` with its address,
/// [`RegionHeader::wall_address`]), and the runtime asserts at compile time
/// that the clock fits.
#[repr(C, align(8))]
pub struct WallClockStorage(pub [u64; 4]);

/// Session slots in the header: wefts that may own probes at once.
pub const SESSIONS: usize = 16;

/// [`RegionHeader::exit_flags`]: exit code is installed.
pub const EXITS_INSTALLED: u32 = 1;
/// [`RegionHeader::exit_flags`]: the installed exit code times wall time.
pub const EXITS_WALL: u32 = 2;
/// [`RegionHeader::exit_flags`]: the installed exit code times CPU time.
pub const EXITS_CPU: u32 = 4;
/// [`RegionHeader::exit_flags`]: the installed exit code writes exit events
/// of traced activations into the thread's trace ring
/// ([`RegionHeader::trace_ring`]).
pub const EXITS_TRACE: u32 = 8;

/// One weft session that owns (or owned) probes in the process.
#[repr(C)]
pub struct SessionSlot {
    /// The weft process's PID (as weft sees it); 0 = a free slot.
    pub pid: AtomicU32,
    /// Which session of that weft process (a tool may hold several).
    pub instance: AtomicU32,
    /// The weft process's start time (`/proc/PID/stat` field 22, clock
    /// ticks since boot): a PID reused by another process is not the
    /// session.
    pub start_time: AtomicU64,
}

/// [`SessionSlot::start_time`] in a forked child's region of a session of
/// its parent's: no process started then, so the session is not alive
/// here; a weft following the child may adopt its probes (their words were
/// zeroed in the child at the fork, so they count the child's calls since).
pub const SESSION_FORKED_AWAY: u64 = u64::MAX;

/// The name of the memfd the runtime keeps its region in, as
/// `/proc/PID/maps` shows it (`/memfd:weft-shm (deleted)`).
pub const REGION_MEMFD_NAME: &core::ffi::CStr = c"weft-shm";

/// Entries in the probe directory.
pub const DIRECTORY: usize = 131_072;
/// [`ProbeEntry::state`]: a free entry.
pub const PROBE_FREE: u32 = 0;
/// [`ProbeEntry::state`]: a probe whose patch is (or is about to be) in
/// place. Written before the patch, so a weft killed in between leaves an
/// entry whose patch is not there, which the next weft simply frees.
pub const PROBE_LIVE: u32 = 1;
/// [`ProbeEntry::state`]: a probe whose session let go of it while another
/// probe was chained over it (that one's trampoline jumps into this one's):
/// its trampoline now starts with a jump to its copy of the displaced
/// instructions (it measures nothing) and stays, with this entry, until
/// the probes over it have gone and the weft that takes the last of them
/// out frees it. Never shared, never an orphan.
pub const PROBE_BYPASSED: u32 = 2;
/// [`ProbeEntry::kind`]: a probe at a function's entry measuring calls (and
/// timers per [`ProbeEntry::metrics`]), which another session may share.
pub const KIND_MEASURE: u32 = 1;
/// [`ProbeEntry::kind`]: anything else (user probes, instruction points,
/// replacements, redirected calls): owned by one session, never shared.
pub const KIND_PRIVATE: u32 = 2;
/// [`ProbeEntry::metrics`]: wall time.
pub const METRIC_WALL: u32 = 1;
/// [`ProbeEntry::metrics`]: CPU time.
pub const METRIC_CPU: u32 = 2;
/// [`ProbeEntry::metrics`]: a latency histogram (with wall time; its words
/// are [`metric::TIMED_HIST_LEN`] bytes).
pub const METRIC_HISTOGRAM: u32 = 4;
/// [`ProbeEntry::metrics`]: call traces (entry and exit events in the
/// thread's trace ring).
pub const METRIC_TRACE: u32 = 8;
/// [`ProbeEntry::metrics`]: counts only inside other probes' functions (a
/// constrained probe): its words are not the function's, so it is never
/// shared (a probe can still be chained over it).
pub const METRIC_INSIDE: u32 = 16;
/// [`ProbeEntry::record`] of a probe without a call record.
pub const NO_RECORD: u32 = u32::MAX;

/// One probe as the directory keeps it (written by injectors only, while
/// they hold the process).
///
/// Several sessions measuring one function differently *chain* their
/// probes: the newest patch jumps to its trampoline, whose displaced
/// instruction is the previous patch's `jmp` (its [`ProbeEntry::original`]),
/// and so on down to the first probe, whose `original` is the function's
/// own bytes. Every link's [`ProbeEntry::compiled`] holds those.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeEntry {
    /// [`PROBE_FREE`], [`PROBE_LIVE`] or [`PROBE_BYPASSED`].
    pub state: u32,
    /// Bit `i`: session slot `i` uses the probe. The last owner to let go
    /// takes the patch out.
    pub owners: u32,
    /// [`KIND_MEASURE`] or [`KIND_PRIVATE`].
    pub kind: u32,
    /// [`METRIC_WALL`] | [`METRIC_CPU`].
    pub metrics: u32,
    /// First metric word.
    pub first_word: u32,
    /// Metric words from `first_word` on.
    pub words: u32,
    /// Call record, or [`NO_RECORD`].
    pub record: u32,
    /// Bytes from `patch_address` whose instructions the trampoline runs
    /// instead (5 or more).
    pub displaced: u16,
    /// Offset in the trampoline of its copy of those instructions (where a
    /// pass-through jumps: [`PROBE_BYPASSED`]); 0 for none.
    pub relocated: u16,
    /// The instrumented function (or instruction).
    pub function: u64,
    /// Where the patch is written.
    pub patch_address: u64,
    /// The trampoline (its first byte; 0 for none).
    pub trampoline: u64,
    /// The trampoline's length.
    pub trampoline_len: u64,
    /// The bytes the patch replaced (5 used): written back when this
    /// probe goes while its patch is the one in place. The previous link's
    /// `jmp` for a probe chained over another.
    pub original: [u8; 8],
    /// The patch (5 used): restored only while it is still there.
    pub patch: [u8; 8],
    /// The function's own bytes at `patch_address` (5 used), as compiled:
    /// `original` unless the probe is chained over another.
    pub compiled: [u8; 8],
}

/// Bytes per [`ProbeEntry`].
pub const PROBE_ENTRY_SIZE: usize = 88;
const _: () = assert!(core::mem::size_of::<ProbeEntry>() == PROBE_ENTRY_SIZE);

/// The first [`ROW_HEADER_SIZE`] bytes of a row.
#[repr(C, align(64))]
pub struct RowHeader {
    /// One of [`ROW_FREE`], [`ROW_LIVE`], [`ROW_EXITED`], [`ROW_OVERFLOW`].
    pub state: AtomicU32,
    /// The owning thread's kernel thread id.
    pub tid: AtomicU32,
    /// Seqlock-style counter: odd while `name` is being written.
    pub name_seq: AtomicU32,
    /// Times the row was handed to a new thread (0 for its first thread).
    pub generation: AtomicU32,
    /// Thread name (`comm`) when registered and again when it exits.
    pub name: [AtomicU8x4; NAME_LEN / 4],
    /// Bumped by the thread's instrumented code after every entry and
    /// every timed exit has updated the row's words: a sampler that finds
    /// it (and `state`, `generation`) unchanged since its last read knows
    /// the words are unchanged, except for timers that were running.
    pub activity: AtomicU64,
    /// The row's index (weft's index of its thread, what user probes get
    /// as `thread`); written when a thread takes the row.
    pub index: AtomicU32,
    /// Unused.
    pub reserved0: u32,
    /// Unused (keeps [`RowHeader::thread`] at [`ROW_CELLS`]).
    pub reserved: [u64; 2],
    /// Per-thread state of the exit hooks and timers, read by generated
    /// code at fixed row offsets ([`ROW_CELLS`] and the rest).
    pub thread: ThreadState,
    /// Storage for the thread's `weft_rt::clock::ThreadCpuClock`
    /// ([`ThreadState::cpu_clock`] points here when it is set up).
    pub clock: ClockStorage,
}

/// The exit-hook and timer state of a row's thread (64 bytes). Written only
/// by the owning thread (and by the runtime when it hands the row over).
#[repr(C)]
pub struct ThreadState {
    /// Address of the thread's first activation cell; 0 = exits not
    /// hooked. The cells stay with the row when the row is handed to a new
    /// thread.
    pub cells: AtomicU64,
    /// Address of the first free cell: the thread's open activations are
    /// the cells in `[cells, top)`.
    pub top: AtomicU64,
    /// Lowest address of the thread's stack.
    pub stack_lo: AtomicU64,
    /// One past the highest address of the thread's stack.
    pub stack_hi: AtomicU64,
    /// Address of the thread's CPU clock state, 0 = no CPU time.
    pub cpu_clock: AtomicU64,
    /// The CPU clock's source: [`CPU_SOURCE_NONE`] or `1 +` the clock's
    /// mode (`weft_rt::clock::CPU_ANCHOR`, `CPU_PERF_TIME`, `CPU_SYSCALL`).
    pub cpu_source: AtomicU32,
    /// The `why` behind a syscall-mode CPU clock (errno of
    /// `perf_event_open`, or a negative reason), for reports.
    pub cpu_why: AtomicI32,
    /// One past the thread's last cell (0 = no cells): a thread with
    /// `top == cells_end` has no room for another activation.
    pub cells_end: AtomicU64,
    /// The self (exclusive) raw wall ticks of every timed activation of
    /// the thread closed so far, wrapping: an activation stores `t0 - N`
    /// in its cell ([`metric::CELL_SELF_BASE`]) and its close takes
    /// `self = (t - N) - (t0 - N0)` and adds it here, so an activation's
    /// self time excludes every timed activation closed inside it, at any
    /// depth, with no per-activation child sum. Only its absolute value is
    /// meaningless.
    pub self_ticks: AtomicU64,
}

/// No CPU clock for the thread.
pub const CPU_SOURCE_NONE: u32 = 0;

/// Room for one `weft_rt::clock::ThreadCpuClock` inside a row (the
/// runtime asserts at compile time that it fits; generated code reads the
/// fields at the [`crate::clock`] offsets).
#[repr(C, align(64))]
pub struct ClockStorage(pub [u64; 16]);

const _: () = assert!(core::mem::size_of::<ThreadState>() == 64);

/// Row byte offset of [`RowHeader::activity`].
pub const ROW_ACTIVITY: usize = 32;
/// Row byte offset of [`RowHeader::index`].
pub const ROW_INDEX: usize = 40;
/// Row byte offset of [`ThreadState::cells`] (what generated code reads).
pub const ROW_CELLS: usize = 64;
/// Row byte offset of [`ThreadState::top`].
pub const ROW_TOP: usize = 72;
/// Row byte offset of [`ThreadState::stack_lo`] (`stack_hi` follows).
pub const ROW_STACK_BOUNDS: usize = 80;
/// Row byte offset of [`ThreadState::cpu_clock`].
pub const ROW_CPU_CLOCK: usize = 96;
/// Row byte offset of [`ThreadState::cells_end`].
pub const ROW_CELLS_END: usize = 112;
/// Row byte offset of [`ThreadState::self_ticks`].
pub const ROW_SELF_TICKS: usize = 120;
/// Row byte offset of [`RowHeader::clock`].
pub const ROW_CLOCK_STORAGE: usize = 128;
const _: () = {
    use core::mem::offset_of;
    assert!(offset_of!(RowHeader, thread) + offset_of!(ThreadState, cells) == ROW_CELLS);
    assert!(offset_of!(RowHeader, thread) + offset_of!(ThreadState, top) == ROW_TOP);
    assert!(offset_of!(RowHeader, thread) + offset_of!(ThreadState, stack_lo) == ROW_STACK_BOUNDS);
    assert!(
        offset_of!(RowHeader, thread) + offset_of!(ThreadState, stack_hi) == ROW_STACK_BOUNDS + 8
    );
    assert!(offset_of!(RowHeader, thread) + offset_of!(ThreadState, cpu_clock) == ROW_CPU_CLOCK);
    assert!(offset_of!(RowHeader, thread) + offset_of!(ThreadState, cells_end) == ROW_CELLS_END);
    assert!(offset_of!(RowHeader, thread) + offset_of!(ThreadState, self_ticks) == ROW_SELF_TICKS);
    assert!(offset_of!(RowHeader, clock) == ROW_CLOCK_STORAGE);
    assert!(offset_of!(RowHeader, activity) == ROW_ACTIVITY);
    assert!(offset_of!(RowHeader, index) == ROW_INDEX);
};

/// Call records in the runtime (each timed function uses one while it is
/// instrumented).
pub const CALL_RECORDS: usize = 16_384;
/// Bytes per call record: `call qword [rip + target]` (6 bytes), `jmp
/// qword [rip + handler]` (6 bytes), `int3` padding.
pub const RECORD_SIZE: usize = 16;
/// Offset in a record of its return point (the end of its `call`): the
/// return address a timed function sees.
pub const RECORD_RETURN: usize = 6;
/// Bytes per entry of the exit-probe table ([`RegionHeader::exit_probes`]),
/// one per call record: the probe function at +0, its constant at +8, the
/// instrumented function at +16, a u32 thread predicate at +24.
pub const EXIT_PROBE_SIZE: usize = 32;

/// Offsets from a function's metric base of the exit-hook and timer words,
/// and the layout of an activation cell: what generated code
/// (`weft_codegen::exit`, `weft_codegen::timer`, whose `METRIC_*` and
/// `CELL_*` are these values) writes, the runtime reads to close
/// activations itself (thread exit, exceptions) and the injector reads for
/// its reports.
pub mod metric {
    /// Entries (calls).
    pub const ENTRIES: usize = 0;
    /// Hooked exits.
    pub const EXITS: usize = 8;
    /// Activations closed without a normal exit.
    pub const UNWOUND: usize = 16;
    /// Entries whose exit could not be hooked.
    pub const UNHOOKED: usize = 24;
    /// Bytes per function whose exits are hooked without timers (the four
    /// counters above).
    pub const UNTIMED_LEN: usize = 32;
    /// Open activations of the function on the thread.
    pub const NESTING: usize = 32;
    /// Timer seqlock.
    pub const SEQ: usize = 40;
    /// Closed wall time, ns.
    pub const WALL_TOTAL: usize = 48;
    /// Raw wall clock at the start (timer ticks); 0 = not running.
    pub const WALL_START: usize = 56;
    /// Closed CPU time, ns.
    pub const CPU_TOTAL: usize = 64;
    /// Raw thread CPU clock at the start (timer ticks); 0 = not running.
    pub const CPU_START: usize = 72;
    /// Closed self (exclusive) wall time, ns: every closed activation's
    /// time less that of the timed activations closed inside it
    /// (`ThreadState::self_ticks`). Recursive activations count too.
    pub const SELF_TOTAL: usize = 80;
    /// Bytes per timed function.
    pub const TIMED_LEN: usize = 88;
    /// Latency histogram buckets kept after the timed words of a function
    /// whose cells carry [`CELL_HISTOGRAM`]: bucket `b` counts the
    /// outermost activations whose inclusive wall time was `ns` with
    /// `floor(log2(ns)) == b` (0 and 1 ns in bucket 0), the last bucket
    /// everything from `2^(HIST_BUCKETS - 1)` ns up.
    pub const HIST_BUCKETS: usize = 40;
    /// Offset of histogram bucket 0 (u64 words) from the metric base.
    pub const HIST: usize = TIMED_LEN;
    /// Bytes per timed function with a histogram.
    pub const TIMED_HIST_LEN: usize = TIMED_LEN + 8 * HIST_BUCKETS;

    /// Byte offsets, from a measuring probe's first word, of its words that
    /// add up (calls, exits, closed times, histogram buckets) for a probe of
    /// `words` words: what a reader subtracts a baseline from, or a forked
    /// child zeroes. Not a running timer's start, its seqlock or a nesting
    /// depth.
    pub fn additive(words: u32) -> impl Iterator<Item = usize> {
        const TIMED: [usize; 7] = [
            ENTRIES, EXITS, UNWOUND, UNHOOKED, WALL_TOTAL, CPU_TOTAL, SELF_TOTAL,
        ];
        let more = words > 1;
        let fixed: &'static [usize] = if more { &TIMED } else { &[ENTRIES] };
        let len = words as usize * 8;
        fixed
            .iter()
            .copied()
            .chain(
                (0..HIST_BUCKETS)
                    .map(|b| HIST + 8 * b)
                    .filter(move |_| more),
            )
            .filter(move |&o| o + 8 <= len)
    }
    /// Bytes per activation cell.
    pub const CELL_SIZE: usize = 32;
    /// Offset in a cell of the original return address.
    pub const CELL_RETURN_ADDRESS: usize = 0;
    /// Offset in a cell of the entry `rsp` (the address the return address
    /// was at).
    pub const CELL_ENTRY_RSP: usize = 8;
    /// Offset in a cell of a timed activation's self-time base: the raw
    /// wall reading at its start less the thread's
    /// `ThreadState::self_ticks` then (wrapping). Until issue #12 it held
    /// the caller's `rbx`.
    pub const CELL_SELF_BASE: usize = 16;
    /// Offset in a cell of the metric base (i32).
    pub const CELL_METRIC: usize = 24;
    /// Offset in a cell of its flags (u32).
    pub const CELL_FLAGS: usize = 28;
    /// Cell flag: the metric base has the timer words.
    pub const CELL_TIMED: u32 = 1;
    /// Cell flag: the exit calls the user probe of the function's call
    /// record (its index is in the flags from [`CELL_RECORD_SHIFT`] up).
    pub const CELL_PROBE: u32 = 2;
    /// Cell flag: the metric base has the latency histogram after the
    /// timer words ([`HIST`], [`TIMED_HIST_LEN`] bytes in all).
    pub const CELL_HISTOGRAM: u32 = 4;
    /// Cell flag: the activation is traced: its entry wrote an event in
    /// the thread's trace ring and whoever closes it writes the exit (see
    /// [`crate::layout::trace`]).
    pub const CELL_TRACE: u32 = 8;
    /// Cell flag: the activation is of a probe chained over another
    /// session's probe of the same function (see [`super::ProbeEntry`]):
    /// the activation that link pushes next, on the same frame, is the same
    /// call, so when timed it leaves the thread's self-time word alone and
    /// its time stays this one's self time.
    pub const CELL_CHAIN: u32 = 16;
    /// Where a cell's flags keep the function's call record index.
    pub const CELL_RECORD_SHIFT: u32 = 8;
}

/// Per-thread call-trace rings (`-m trace`).
///
/// Every row has one ring at the same row byte offset, a block of metric
/// words handed out once per process ([`RegionHeader::trace_ring`],
/// [`RegionHeader::trace_capacity`]), so it needs no layout of its own and
/// costs memory only in the rows of threads that write it. Single producer
/// (the row's thread: generated entry and exit code, and the runtime when
/// it closes activations itself), single consumer (the injector):
///
/// ```text
/// +0    head     events written so far (producer; published after the event)
/// +8    dropped  events not written because the ring was full (producer)
/// +16   busy     1 while the thread is writing an event (a signal handler
///                that finds it 1 drops its own event instead)
/// +64   tail     events read so far (consumer, its own cache line)
/// +128  events[capacity], EVENT_SIZE bytes each, slot = index % capacity
/// ```
///
/// The producer writes slot `head % capacity` and then `head + 1` only while
/// `head - tail < capacity`; else it counts a drop and goes on: it never
/// waits. The consumer reads `head`, the events below it, then stores
/// `tail`. x86-64 (TSO) keeps both sides' stores in program order, so plain
/// loads and stores suffice.
///
/// An event: the raw wall reading (the timers' ticks,
/// [`RegionHeader::timer_ns_per_tick_q32`]) at +0; at +8 the function's
/// metric base (its row byte offset, 8-byte aligned) with the kind in its
/// low 3 bits; at +12 the low 32 bits of the activation's cell address,
/// which names its depth (`(cell - cells) / CELL_SIZE`, wrapping) even
/// when events were dropped.
pub mod trace {
    /// Offset in the ring of `head` (u64).
    pub const HEAD: usize = 0;
    /// Offset in the ring of `dropped` (u64).
    pub const DROPPED: usize = 8;
    /// Offset in the ring of `busy` (u64).
    pub const BUSY: usize = 16;
    /// Offset in the ring of `tail` (u64), written by the consumer.
    pub const TAIL: usize = 64;
    /// Offset in the ring of event 0.
    pub const EVENTS: usize = 128;
    /// Bytes per event.
    pub const EVENT_SIZE: usize = 16;
    /// Offset in an event of the raw wall reading (u64).
    pub const EV_TIME: usize = 0;
    /// Offset in an event of `metric base | kind` (u32).
    pub const EV_FUNCTION: usize = 8;
    /// Offset in an event of the low 32 bits of the cell address (u32).
    pub const EV_CELL: usize = 12;
    /// Kind: an activation began (the function was entered).
    pub const KIND_ENTRY: u32 = 1;
    /// Kind: an activation returned through the exit hook.
    pub const KIND_EXIT: u32 = 2;
    /// Kind: an activation was closed because its frame was discarded
    /// (longjmp, an exception, thread exit), at that moment.
    pub const KIND_UNWOUND: u32 = 3;
    /// The kind bits of [`EV_FUNCTION`].
    pub const KIND_MASK: u32 = 7;
    /// Events per ring unless asked otherwise: the most, 4 MiB of the
    /// target's memory for a thread that fills it (a tight loop of traced
    /// calls makes ~100 million events a second while it runs: a ring
    /// holds 2.6 ms of them between two reads).
    pub const DEFAULT_CAPACITY: u32 = MAX_CAPACITY;
    /// Fewest events per ring.
    pub const MIN_CAPACITY: u32 = 16;
    /// Most events per ring (4 MiB of a row's 8 MiB of words).
    pub const MAX_CAPACITY: u32 = 1 << 18;

    /// Bytes of a ring of `capacity` events (a power of two).
    pub const fn ring_bytes(capacity: u32) -> usize {
        EVENTS + EVENT_SIZE * capacity as usize
    }
}

/// Four name bytes, stored atomically so concurrent readers are sound.
#[repr(transparent)]
pub struct AtomicU8x4(pub AtomicU32);

const _: () = assert!(core::mem::size_of::<RowHeader>() == ROW_HEADER_SIZE);
const _: () = assert!(core::mem::size_of::<RegionHeader>() <= ACKS_OFFSET);

/// Most metric words a row may have: 8 MiB of address space per row. The
/// region is a sparse memfd, so a row costs memory only for the words
/// handed out so far (a page is touched when a thread first writes a word
/// in it, or when the runtime zeroes a reused row up to
/// [`RegionHeader::words_next`]): rows are sized by use, not by this limit.
/// 1 word per counted function, [`metric::TIMED_LEN`]` / 8` per timed one:
/// 100,000 counted and 10,000 timed functions fit with room to spare.
pub const MAX_METRIC_WORDS: u32 = 1 << 20;

/// Geometry of a region, derived from its two parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Rows for threads (one more, the overflow row, is always added).
    pub max_rows: u32,
    /// `u64` metric words per row.
    pub metric_words: u32,
}

impl RegionHeader {
    /// The geometry the region was made with.
    pub fn geometry(&self) -> Geometry {
        Geometry {
            max_rows: self.max_rows,
            metric_words: self.metric_words,
        }
    }

    /// Rows handed to threads so far, at most `max_rows` (the overflow row
    /// is not among them).
    pub fn rows_in_use(&self) -> u32 {
        self.rows_used
            .load(core::sync::atomic::Ordering::Acquire)
            .min(self.max_rows)
    }
}

impl Geometry {
    /// Bytes from one row to the next.
    pub const fn row_stride(&self) -> u64 {
        let raw = ROW_HEADER_SIZE as u64 + 8 * self.metric_words as u64;
        raw.div_ceil(CACHE_LINE as u64) * CACHE_LINE as u64
    }

    /// Bytes of one session's ack array, rounded up to whole pages.
    pub const fn session_acks_len(&self) -> u64 {
        (4 * self.max_rows as u64).div_ceil(PAGE) * PAGE
    }

    /// Byte offset of session slot `slot`'s ack array from the start of
    /// the region.
    pub const fn acks_offset(&self, slot: usize) -> u64 {
        ACKS_OFFSET as u64 + slot as u64 * self.session_acks_len()
    }

    /// Bytes of the ack arrays of every session slot.
    pub const fn acks_len(&self) -> u64 {
        SESSIONS as u64 * self.session_acks_len()
    }

    /// Byte offset of the probe directory from the start of the region.
    pub const fn directory_offset(&self) -> u64 {
        ACKS_OFFSET as u64 + self.acks_len()
    }

    /// Bytes of the probe directory, rounded up to whole pages.
    pub const fn directory_len(&self) -> u64 {
        ((DIRECTORY * PROBE_ENTRY_SIZE) as u64).div_ceil(PAGE) * PAGE
    }

    /// Byte offset of row 0 from the start of the region.
    pub const fn rows_offset(&self) -> u64 {
        self.directory_offset() + self.directory_len()
    }

    /// Total bytes of the region, overflow and scratch rows included.
    pub const fn region_size(&self) -> u64 {
        self.rows_offset() + (self.max_rows as u64 + 2) * self.row_stride()
    }

    /// Index of the overflow row.
    pub const fn overflow_row(&self) -> u32 {
        self.max_rows
    }

    /// Index of the scratch row, which counts calls the runtime makes itself
    /// while it registers a thread (they are weft's, not the program's, and
    /// must not recurse into registration).
    pub const fn scratch_row(&self) -> u32 {
        self.max_rows + 1
    }

    /// Byte offset of row `index` from the start of the region.
    pub const fn row_offset(&self, index: u32) -> u64 {
        self.rows_offset() + index as u64 * self.row_stride()
    }

    /// Byte offset of metric word `word` from the start of a row: what a
    /// snippet adds to the row pointer.
    pub const fn metric_offset(word: u32) -> u64 {
        ROW_HEADER_SIZE as u64 + 8 * word as u64
    }
}

#[cfg(test)]
mod tests {
    use super::metric::*;

    /// Counted only: the calls; exits hooked: the four counters; timed:
    /// the closed times too; with a histogram: its buckets. Never a start,
    /// the seqlock or the nesting depth.
    #[test]
    fn the_words_that_add_up() {
        let words = |bytes: usize| {
            let mut n = 0;
            let mut out = [usize::MAX; 64];
            for o in additive((bytes / 8) as u32) {
                out[n] = o;
                n += 1;
            }
            (n, out)
        };
        assert_eq!(words(8).0, 1);
        let (n, out) = words(UNTIMED_LEN);
        assert_eq!(&out[..n], &[ENTRIES, EXITS, UNWOUND, UNHOOKED]);
        let (n, out) = words(TIMED_LEN);
        assert_eq!(
            &out[..n],
            &[ENTRIES, EXITS, UNWOUND, UNHOOKED, WALL_TOTAL, CPU_TOTAL, SELF_TOTAL]
        );
        let (n, out) = words(TIMED_HIST_LEN);
        assert_eq!(n, 7 + HIST_BUCKETS);
        assert_eq!(out[n - 1], HIST + 8 * (HIST_BUCKETS - 1));
        for o in &out[..n] {
            assert!(![NESTING, SEQ, WALL_START, CPU_START].contains(o));
        }
    }
}
