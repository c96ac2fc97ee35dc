//! The runtime's side of exit hooks and timers: the *call records* timed
//! functions are called through, each thread's activation stack (its
//! *cells*), its CPU clock and stack bounds, and the closing of activations
//! that the thread's generated code cannot close itself (an exception
//! unwinds through them, or the thread exits).
//!
//! The generated code (`weft_codegen::exit`) does all per-call work; this
//! module runs once per thread (set-up at its first hit, clean-up at its
//! exit), once per session ([`weft_rt_enable_exits`]), and when an
//! exception or forced unwind passes through a timed frame.
//!
//! # Call records
//!
//! A timed function is entered through its trampoline, which pushes an
//! activation (the original return address and the entry `rsp` go into
//! the thread's next cell), drops the return address from the stack and
//! jumps to the function's call record with every register, the flags and
//! the rest of the stack as the caller left them:
//!
//! ```text
//! record i:  call qword ptr [rip + weft_rt_call_targets + 8*i]  ; the function's body
//!            jmp  qword ptr [rip + weft_rt_exit_handler_slot]   ; its exit
//! ```
//!
//! The `call` pushes the record's return point exactly where the original
//! return address was (stack arguments stay where the function expects
//! them), and because it is a real `call`, the function's `ret` is
//! predicted correctly; so is the exit handler's own `ret` to the original
//! caller (that return-stack entry was never consumed). The records live
//! here, in the runtime's own `.text`, because unwinders find their unwind
//! information there without any registration.
//!
//! # Unwinding through a record
//!
//! No register of the body may carry the activation (Go's register ABI
//! passes arguments in `rbx`, and the project's rule is that a body sees
//! its caller's registers unchanged), so the records' CFI finds it from
//! the frame alone: the entry `rsp` of the activation is the record
//! frame's CFA − 16, and stack addresses are unique among live threads. A
//! DWARF expression ([`UNWIND_RA_EXPR`]) walks every row's open cells
//! ([`UnwindRows`], published by the runtime at its set-up) for the
//! oldest one whose entry `rsp` is that, and reads the caller's `rip` from
//! it; the caller's `rsp` is CFA − 8 and every other register is unchanged
//! by the record. The oldest, because a tail call from a timed function
//! into another nests an activation with the same entry `rsp`: the
//! unwinder then goes from the innermost body straight to the original
//! caller, as it would without weft (tail-called frames vanish), and never
//! loops. The expression reaches [`UnwindRows`] from the record's own
//! address (its return point is on the stack at the entry `rsp`; its `jmp`
//! names the handler slot, which the rows description follows), so
//! `.eh_frame` needs no relocation. gdb, libgcc (C++
//! exceptions, `backtrace()`, Rust panics) read it from the runtime's
//! `.eh_frame`; the cost is one scan of the open activations per record
//! frame unwound.
//!
//! The records' personality routine ([`weft_rt_personality`]) closes the
//! activation an exception or forced unwind discards, at that moment.

use crate::clock::{CpuPreference, ThreadCpuClock, WallClock};
use crate::layout::{
    metric, RegionHeader, RowHeader, CALL_RECORDS, EXITS_CPU, EXIT_PROBE_SIZE, ROW_HEADER_SIZE,
};
use core::arch::global_asm;
use core::ptr;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The DWARF expression (`DW_CFA_expression` for `rip`, DWARF register
/// 16) of every call record: with the record frame's CFA pushed, it leaves
/// the address of the caller's `rip`, the first word of the oldest open
/// cell (any row) whose entry `rsp` is CFA − 16, or of a zero word (end of
/// the stack) when none is. See the module docs. The record is found from
/// its return point, which the record's `call` left at the entry `rsp`
/// (libgcc cannot read `rip` in an expression: `DW_OP_breg16` aborts).
/// Opcodes, and the stack after each line (top last; the CFA stays at the
/// bottom because libgcc's `DW_OP_pick n` wants n + 2 entries):
///
/// ```text
///   0 dup, lit16 minus                  C E
///   3 dup deref, const1s -16, and       C E rec          (this record)
///   8 dup, plus_uconst 8, deref_size 4,
///     const1u 32 shl, const1u 32 shra,
///     plus, plus_uconst 20              C E dir          (jmp's slot + 8)
///  22 dup deref, over plus_uconst 16
///     deref deref_size 4, pick 2
///     plus_uconst 24 deref              C E dir first count max
///  35 over over lt, bra +1, swap, drop  C E dir first n  (n = min)
///  43 pick 2 plus_uconst 8 deref, mul,
///     over plus                         C E dir row end
///  51 rows: over over lt, bra +3,
///     skip none
///  60 pick 2 plus_uconst 32 deref, pick
///     2 plus deref, pick 3 plus_uconst
///     40 deref, pick 3 plus deref       C E dir row end c top
///  78 cells: over over lt, bra +13
///  84 drop drop, swap, pick 2
///     plus_uconst 8 deref, plus swap,
///     skip rows                         C E dir row+stride end
///  97 over plus_uconst 8 deref, pick 6
///     eq, bra found, swap plus_uconst
///     32 swap, skip cells
/// 114 found: drop, skip end             ... c
/// 118 none: drop drop plus_uconst 48    C E zero-word
/// 122 end
/// ```
pub const UNWIND_RA_EXPR: [u8; 122] = [
    0x12, 0x40, 0x1c, // 0: dup; lit16 minus
    0x12, 0x06, 0x09, 0xf0, 0x1a, // 3: dup deref; const1s -16; and
    0x12, 0x23, 0x08, 0x94, 0x04, // 8: dup; plus_uconst 8; deref_size 4
    0x08, 0x20, 0x24, 0x08, 0x20, 0x26, // 13: const1u 32 shl; const1u 32 shra (sign-extends)
    0x22, 0x23, 0x14, // 19: plus; plus_uconst 20
    0x12, 0x06, // 22: dup deref
    0x14, 0x23, 0x10, 0x06, 0x94, 0x04, // 24: over; plus_uconst 16; deref; deref_size 4
    0x15, 0x02, 0x23, 0x18, 0x06, // 30: pick 2; plus_uconst 24; deref
    0x14, 0x14, 0x2d, 0x28, 0x01, 0x00, 0x16, 0x13, // 35: over over lt; bra +1; swap; drop
    0x15, 0x02, 0x23, 0x08, 0x06, 0x1e, 0x14, 0x22, // 43: stride; mul; over plus
    0x14, 0x14, 0x2d, 0x28, 0x03, 0x00, // 51: rows: over over lt; bra +3
    0x2f, 0x3a, 0x00, // 57: skip +58 (none)
    0x15, 0x02, 0x23, 0x20, 0x06, // 60: pick 2; plus_uconst 32; deref
    0x15, 0x02, 0x22, 0x06, // 65: pick 2; plus; deref
    0x15, 0x03, 0x23, 0x28, 0x06, // 69: pick 3; plus_uconst 40; deref
    0x15, 0x03, 0x22, 0x06, // 74: pick 3; plus; deref
    0x14, 0x14, 0x2d, 0x28, 0x0d, 0x00, // 78: cells: over over lt; bra +13
    0x13, 0x13, 0x16, // 84: drop drop swap
    0x15, 0x02, 0x23, 0x08, 0x06, // 87: pick 2; plus_uconst 8; deref
    0x22, 0x16, // 92: plus swap
    0x2f, 0xd2, 0xff, // 94: skip -46 (rows)
    0x14, 0x23, 0x08, 0x06, // 97: over; plus_uconst 8; deref
    0x15, 0x06, 0x29, // 101: pick 6; eq
    0x28, 0x07, 0x00, // 104: bra +7 (found)
    0x16, 0x23, 0x20, 0x16, // 107: swap; plus_uconst 32; swap
    0x2f, 0xdc, 0xff, // 111: skip -36 (cells)
    0x13, 0x2f, 0x04, 0x00, // 114: found: drop; skip +4 (end)
    0x13, 0x13, 0x23, 0x30, // 118: none: drop drop; plus_uconst 48
];

/// Where the records' unwind expression finds the threads' activation
/// stacks: `count` rows (at most `max`) from `first`, `stride` bytes
/// apart, each with its first cell's address at byte `cells` and its first
/// free cell's at byte `top`.
#[derive(Debug, Clone, Copy)]
pub struct UnwindRows {
    /// Address of row 0.
    pub first: u64,
    /// Bytes from one row to the next.
    pub stride: u64,
    /// Rows handed out so far (read at every unwind).
    pub count: *const AtomicU32,
    /// Rows that exist.
    pub max: u64,
    /// Row byte offset of the first cell's address.
    pub cells: u64,
    /// Row byte offset of the first free cell's address.
    pub top: u64,
}

/// Publishes where the unwind expression finds activations (the runtime
/// does at its set-up; in-process users such as tests with rows of their
/// own do it themselves). An unwind running meanwhile sees no rows or the
/// old ones, never a torn description: `max` goes to 0 first and is set
/// last.
///
/// # Safety
///
/// `rows.count` must point at a live `u32` and the rows (up to `max`) must
/// stay mapped for as long as anything may unwind through a record.
pub unsafe fn set_unwind_rows(rows: UnwindRows) {
    // SAFETY: a static of seven words defined in the assembly above.
    let words = unsafe { &*ptr::addr_of!(weft_rt_unwind_rows) };
    words[UNWIND_MAX].store(0, Ordering::Release);
    words[0].store(rows.first, Ordering::Relaxed);
    words[1].store(rows.stride, Ordering::Relaxed);
    words[2].store(rows.count as u64, Ordering::Relaxed);
    words[4].store(rows.cells, Ordering::Relaxed);
    words[5].store(rows.top, Ordering::Relaxed);
    words[UNWIND_MAX].store(rows.max, Ordering::Release);
}

/// Index in `weft_rt_unwind_rows` of the row limit.
const UNWIND_MAX: usize = 3;

// Expands to the records' assembly with one `.cfi_escape` per byte of
// UNWIND_RA_EXPR (global_asm! takes integers, not byte strings, as
// constants).
macro_rules! call_records_asm {
    ($($i:literal)*) => {
        global_asm!(
            ".pushsection .text.weft_rt_call_records,\"ax\",@progbits",
            ".globl weft_rt_call_records",
            ".hidden weft_rt_call_records",
            ".type weft_rt_call_records,@function",
            ".p2align 4",
            "weft_rt_call_records:",
            ".cfi_startproc",
            ".cfi_personality 0x9b, DW.ref.weft_rt_personality",
            ".cfi_escape 0x14, 0x07, 0x01",
            ".cfi_escape 0x10, 0x10, {LEN}",
            $(concat!(".cfi_escape {", stringify!($i), "}"),)*
            ".set weft_rt_record_index, 0",
            ".rept {RECORDS}",
            "call qword ptr [rip + weft_rt_call_targets + 8 * weft_rt_record_index]",
            "jmp qword ptr [rip + weft_rt_exit_handler_slot]",
            ".balign {RECORD_SIZE}, 0xcc",
            ".set weft_rt_record_index, weft_rt_record_index + 1",
            ".endr",
            ".cfi_endproc",
            ".size weft_rt_call_records, . - weft_rt_call_records",
            ".popsection",
            ".pushsection .bss.weft_rt_call_targets,\"aw\",@nobits",
            ".globl weft_rt_call_targets",
            ".hidden weft_rt_call_targets",
            ".p2align 6",
            "weft_rt_call_targets:",
            ".zero 8 * {RECORDS}",
            ".popsection",
            ".pushsection .bss.weft_rt_exit_probes,\"aw\",@nobits",
            ".globl weft_rt_exit_probes",
            ".hidden weft_rt_exit_probes",
            ".p2align 6",
            "weft_rt_exit_probes:",
            ".zero {EXIT_PROBE_SIZE} * {RECORDS}",
            ".popsection",
            // The unwind expression finds the rows description 8 bytes
            // after the slot the records' `jmp` names: one section keeps
            // them together. Its `count` starts out pointing at the zero
            // word that ends it (no rows).
            ".pushsection .data.weft_rt_exit_handler_slot,\"aw\",@progbits",
            ".globl weft_rt_exit_handler_slot",
            ".hidden weft_rt_exit_handler_slot",
            ".p2align 3",
            "weft_rt_exit_handler_slot:",
            ".quad 0",
            ".globl weft_rt_unwind_rows",
            ".hidden weft_rt_unwind_rows",
            "weft_rt_unwind_rows:",
            ".quad 0, 0, weft_rt_unwind_rows + 48, 0, 0, 0, 0",
            ".popsection",
            ".pushsection .data.rel.local.DW.ref.weft_rt_personality,\"awG\",@progbits,DW.ref.weft_rt_personality,comdat",
            ".p2align 3",
            ".hidden DW.ref.weft_rt_personality",
            ".weak DW.ref.weft_rt_personality",
            "DW.ref.weft_rt_personality:",
            ".quad {personality}",
            ".popsection",
            $(const UNWIND_RA_EXPR[$i],)*
            LEN = const UNWIND_RA_EXPR.len(),
            RECORDS = const CALL_RECORDS,
            RECORD_SIZE = const crate::layout::RECORD_SIZE,
            EXIT_PROBE_SIZE = const EXIT_PROBE_SIZE,
            personality = sym weft_rt_personality,
        );
    };
}

call_records_asm!(
    0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33
    34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64
    65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95
    96 97 98 99 100 101 102 103 104 105 106 107 108 109 110 111 112 113 114 115 116 117 118 119
    120 121
);

const _: () = {
    // The expression hard-codes the cell layout and must fit a one-byte
    // ULEB128 length.
    assert!(metric::CELL_RETURN_ADDRESS == 0 && metric::CELL_ENTRY_RSP == 8);
    assert!(metric::CELL_SIZE == 32 && crate::layout::RECORD_SIZE == 16);
    assert!(UNWIND_RA_EXPR.len() < 128);
};

extern "C" {
    /// The first call record (see the module docs); never called from Rust.
    pub static weft_rt_call_records: u8;
    /// One target per record: the function body record `i` calls. Written
    /// by the injector (through `/proc/PID/mem`) before it patches the
    /// function that uses the record.
    pub static weft_rt_call_targets: [AtomicU64; CALL_RECORDS];
    /// The exit handler every record jumps to (written by
    /// [`weft_rt_enable_exits`] only): each session installs a handler
    /// built for its own row layout, and activations left open by an
    /// earlier session still return through it.
    pub static weft_rt_exit_handler_slot: AtomicU64;
    /// The exit-probe table: per call record, the probe function, its
    /// constant and the instrumented function (`weft_codegen::ExitProbes`),
    /// written by the injector.
    static weft_rt_exit_probes: [[AtomicU64; EXIT_PROBE_SIZE / 8]; CALL_RECORDS];
    /// The rows description the unwind expression reads ([`UnwindRows`]:
    /// first, stride, count address, max, cells, top, and a zero word).
    static weft_rt_unwind_rows: [AtomicU64; 7];
}

/// Address of the exit-probe table.
pub(crate) fn exit_probe_table() -> u64 {
    ptr::addr_of!(weft_rt_exit_probes) as u64
}

/// Largest activation capacity accepted.
const MAX_CAPACITY: u32 = 1 << 20;

/// Activations per thread; 0 while exits are not enabled.
static CAPACITY: AtomicU32 = AtomicU32::new(0);

/// Bytes of a thread's activation stack of `capacity` cells.
pub const fn cells_len(capacity: u32) -> usize {
    (capacity as usize * metric::CELL_SIZE).next_multiple_of(4096)
}

/// Enables exit hooks for the process (first call) and installs `handler`
/// as the exit handler every call record jumps to (every call).
///
/// `capacity` is the activations per thread (fixed by the first call: a
/// later call with another capacity fails with `-EEXIST`). Returns 0 or a
/// negated errno. Called by the injector with the world stopped: it takes
/// no lock and makes no system call.
///
/// # Safety
///
/// `handler` must be an exit handler built for this process's row layout.
#[no_mangle]
pub unsafe extern "C" fn weft_rt_enable_exits(capacity: u32, handler: u64) -> i64 {
    if capacity == 0 || capacity > MAX_CAPACITY || handler == 0 {
        return -i64::from(libc::EINVAL);
    }
    if let Err(existing) =
        CAPACITY.compare_exchange(0, capacity, Ordering::AcqRel, Ordering::Acquire)
    {
        if existing != capacity {
            return -i64::from(libc::EEXIST);
        }
    }
    // SAFETY: a static the records read; one aligned store.
    unsafe { weft_rt_exit_handler_slot.store(handler, Ordering::Release) };
    if let Some(header) = crate::state::region_header() {
        header.exit_capacity.store(capacity, Ordering::Release);
    }
    0
}

/// The call records' addresses in this process: (first record, targets
/// table, exit-handler slot). The runtime publishes them in the region
/// header for the injector; in-process users (tests) call this.
pub fn call_record_addresses() -> (u64, u64, u64) {
    // Only the statics' addresses are taken (no read: no unsafe needed).
    (
        ptr::addr_of!(weft_rt_call_records) as u64,
        ptr::addr_of!(weft_rt_call_targets) as u64,
        ptr::addr_of!(weft_rt_exit_handler_slot) as u64,
    )
}

/// A new activation stack: `capacity` zeroed cells. None when exits are not
/// enabled or the mapping failed.
fn new_cells(capacity: u32) -> Option<u64> {
    if capacity == 0 {
        return None;
    }
    // SAFETY: a fresh anonymous mapping, published in the row by the caller.
    let cells = unsafe {
        libc::mmap(
            ptr::null_mut(),
            cells_len(capacity),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    (cells != libc::MAP_FAILED).then_some(cells as u64)
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
/// row: cells (kept from the row's previous thread, else allocated), no
/// open activation, stack bounds, CPU clock. Runs at the thread's first
/// hit, with the scratch row installed.
pub(crate) fn setup_thread(header: &RegionHeader, row: &RowHeader) {
    let state = &row.thread;
    // No stale clock may be used while it is rebuilt.
    state.cpu_clock.store(0, Ordering::Relaxed);
    let (lo, hi) = stack_bounds();
    state.stack_lo.store(lo, Ordering::Relaxed);
    state.stack_hi.store(hi, Ordering::Relaxed);
    let capacity = CAPACITY.load(Ordering::Acquire);
    let mut cells = state.cells.load(Ordering::Relaxed);
    if cells == 0 {
        match new_cells(capacity) {
            Some(fresh) => {
                cells = fresh;
                let end = fresh + u64::from(capacity) * metric::CELL_SIZE as u64;
                // `end` before `cells`: generated code tests `top < end`, and
                // `top` is still 0 here.
                state.cells_end.store(end, Ordering::Relaxed);
                state.cells.store(fresh, Ordering::Relaxed);
            }
            None => {
                if capacity != 0 {
                    header.blocks_failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    state.top.store(cells, Ordering::Release);
    let clock_at = ptr::addr_of!(row.clock) as *mut ThreadCpuClock;
    // A perf event only where a CPU timer is installed: the kernel switches
    // it with the thread at every context switch, for the thread's life.
    let wall = WallClock::in_region(header);
    let mut clock = if header.exit_flags.load(Ordering::Acquire) & EXITS_CPU != 0 {
        ThreadCpuClock::new(wall, CpuPreference::Auto)
    } else {
        ThreadCpuClock::without_event(wall)
    };
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

/// Stops one activation's timer exactly as the generated stop does (see
/// `weft_codegen::timer`): every activation adds its self time (to the
/// function's total and to the thread's self-ticks word, which keeps the
/// self times of activations still open around it right), only the
/// outermost activation of the function stops the inclusive timers and
/// fills the histogram. Reads the clocks through the assembly readers (raw
/// system calls), never through libc: the program's own `clock_gettime`
/// may be instrumented, and this runs while the thread's activations are
/// being taken apart.
fn close_timer(
    row: *mut u8,
    base: usize,
    cell: u64,
    wall: &WallClock,
    cpu: Option<&mut ThreadCpuClock>,
) {
    let nesting = word(row, base + metric::NESTING);
    let depth = nesting.load(Ordering::Relaxed);
    if depth == 0 {
        return;
    }
    let units = wall.units();
    let seq = word(row, base + metric::SEQ);
    seq.fetch_add(1, Ordering::Release);
    let raw = wall_raw(wall);
    // SAFETY: the caller passes one of this thread's cells.
    let self_base = unsafe { ((cell + metric::CELL_SELF_BASE as u64) as *const u64).read() };
    // SAFETY: as above.
    let flags = unsafe { ((cell + metric::CELL_FLAGS as u64) as *const u32).read() };
    let n = word(row, crate::layout::ROW_SELF_TICKS);
    let own = raw
        .wrapping_sub(n.load(Ordering::Relaxed))
        .wrapping_sub(self_base);
    // Inside another tool's timed activation of the same call (its probe
    // chained over this one's), this one is no callee of it: N stays.
    if !inside_chained(row, cell) {
        n.fetch_add(own, Ordering::Relaxed);
    }
    let own_ns = if (own as i64) < 0 {
        0
    } else {
        units.to_ns(own)
    };
    word(row, base + metric::SELF_TOTAL).fetch_add(own_ns, Ordering::Relaxed);
    if depth == 1 {
        let cpu_start = word(row, base + metric::CPU_START);
        if let (start @ 1.., Some(clock)) = (cpu_start.load(Ordering::Relaxed), cpu) {
            let spent = clock.ticks_asm(raw).saturating_sub(start);
            word(row, base + metric::CPU_TOTAL).fetch_add(units.to_ns(spent), Ordering::Relaxed);
        }
        cpu_start.store(0, Ordering::Relaxed);
        let wall_start = word(row, base + metric::WALL_START);
        if let start @ 1.. = wall_start.load(Ordering::Relaxed) {
            let spent = units.to_ns(raw.saturating_sub(start));
            word(row, base + metric::WALL_TOTAL).fetch_add(spent, Ordering::Relaxed);
            if flags & metric::CELL_HISTOGRAM != 0 {
                let bucket = weft_abi::timer::histogram_bucket(spent);
                word(row, base + metric::HIST + 8 * bucket).fetch_add(1, Ordering::Relaxed);
            }
        }
        wall_start.store(0, Ordering::Relaxed);
    }
    seq.fetch_add(1, Ordering::Release);
    nesting.fetch_sub(1, Ordering::Relaxed);
}

/// The raw wall reading generated code takes, without libc.
fn wall_raw(wall: &WallClock) -> u64 {
    if wall.kind == crate::clock::WALL_TSC {
        return crate::clock::rdtsc();
    }
    let out: u64;
    // SAFETY: the routine reads the clock state in rax and preserves every
    // register but rax and the flags.
    unsafe {
        core::arch::asm!(
            "call {f}",
            f = sym crate::clock::weft_rt_wall_raw,
            inout("rax") wall as *const WallClock => out,
        );
    }
    out
}

/// Whether the cell below `cell` (one of the thread's cells) is a timed
/// activation of the same call by a probe chained over this one's
/// (`CELL_CHAIN`, the same entry `rsp`), as the generated stop checks.
fn inside_chained(row: *mut u8, cell: u64) -> bool {
    // SAFETY: row is this thread's row.
    let first = unsafe { &(*(row as *const RowHeader)).thread }
        .cells
        .load(Ordering::Relaxed);
    let size = metric::CELL_SIZE as u64;
    if first == 0 || cell < first + size {
        return false;
    }
    let below = cell - size;
    let wanted = metric::CELL_CHAIN | metric::CELL_TIMED;
    // SAFETY: `below` is one of the thread's cells too (at or above the
    // first); both cells are the thread's own memory.
    unsafe {
        ((below + metric::CELL_FLAGS as u64) as *const u32).read() & wanted == wanted
            && ((below + metric::CELL_ENTRY_RSP as u64) as *const u64).read()
                == ((cell + metric::CELL_ENTRY_RSP as u64) as *const u64).read()
    }
}

/// Closes every open activation from the cell at `from` up, innermost
/// first, as unwound (their frames are gone), stopping their timers. The
/// caller is the row's own thread. A `from` outside the thread's open cells
/// closes nothing.
pub(crate) fn close_from(header: &RegionHeader, row_ptr: *mut u8, from: u64) {
    // SAFETY: row_ptr is this thread's row.
    let row = unsafe { &*(row_ptr as *const RowHeader) };
    let state = &row.thread;
    let (cells, end) = (
        state.cells.load(Ordering::Relaxed),
        state.cells_end.load(Ordering::Relaxed),
    );
    let size = metric::CELL_SIZE as u64;
    if cells == 0 || from < cells || from >= end || (from - cells) % size != 0 {
        return;
    }
    loop {
        let top = state.top.load(Ordering::Relaxed);
        if top <= from || top > end {
            // A sampler must see the words this changed (see
            // RowHeader::activity).
            row.activity.fetch_add(1, Ordering::Release);
            return;
        }
        let cell = top - size;
        state.top.store(cell, Ordering::Relaxed);
        close_cell(header, row_ptr, cell);
    }
}

/// Counts the activation of `cell` (one of the thread's cells) as unwound
/// and stops its timer.
fn close_cell(header: &RegionHeader, row_ptr: *mut u8, cell: u64) {
    // SAFETY: row_ptr is this thread's row.
    let state = unsafe { &(*(row_ptr as *const RowHeader)).thread };
    // SAFETY: the caller passes one of the thread's cells.
    let (base, flags) = unsafe {
        (
            ((cell + metric::CELL_METRIC as u64) as *const i32).read(),
            ((cell + metric::CELL_FLAGS as u64) as *const u32).read(),
        )
    };
    let len = if flags & metric::CELL_HISTOGRAM != 0 {
        metric::TIMED_HIST_LEN
    } else {
        metric::TIMED_LEN
    };
    let limit = (ROW_HEADER_SIZE as u64 + 8 * u64::from(header.metric_words))
        .saturating_sub(len as u64) as i64;
    let base = i64::from(base);
    if base < ROW_HEADER_SIZE as i64 || base > limit || base % 8 != 0 {
        return; // not a metric base of this row (or retired): never write there
    }
    let base = base as usize;
    word(row_ptr, base + metric::UNWOUND).fetch_add(1, Ordering::Relaxed);
    if flags & metric::CELL_TRACE != 0 {
        trace_close(header, row_ptr, cell, base as u32);
    }
    if flags & metric::CELL_TIMED != 0 {
        let clock = state.cpu_clock.load(Ordering::Relaxed) as *mut ThreadCpuClock;
        // SAFETY: the clock pointer, when set, is this thread's own clock.
        let cpu = unsafe { clock.as_mut() };
        close_timer(row_ptr, base, cell, WallClock::in_region(header), cpu);
    }
}

/// Writes the unwound close of `cell`'s activation (metric base `base`)
/// into the thread's trace ring, as the generated exit code does (see
/// `weft_abi::layout::trace`): never waits, a full ring (or a write this
/// one interrupted, in a signal handler) counts a drop.
fn trace_close(header: &RegionHeader, row_ptr: *mut u8, cell: u64, base: u32) {
    use crate::layout::trace as ring;
    let capacity = header.trace_capacity.load(Ordering::Acquire);
    let Some(first) = header.trace_ring.load(Ordering::Acquire).checked_sub(1) else {
        return;
    };
    if !capacity.is_power_of_two()
        || !(ring::MIN_CAPACITY..=ring::MAX_CAPACITY).contains(&capacity)
        || u64::from(first) * 8 + ring::ring_bytes(capacity) as u64
            > 8 * u64::from(header.metric_words)
    {
        return; // not a ring this runtime's rows hold: never write there
    }
    let at = crate::layout::Geometry::metric_offset(first) as usize;
    let raw = wall_raw(WallClock::in_region(header));
    let busy = word(row_ptr, at + ring::BUSY);
    if busy.fetch_add(1, Ordering::Relaxed) != 0 {
        word(row_ptr, at + ring::DROPPED).fetch_add(1, Ordering::Relaxed);
        busy.fetch_sub(1, Ordering::Relaxed);
        return;
    }
    let head = word(row_ptr, at + ring::HEAD).load(Ordering::Relaxed);
    let tail = word(row_ptr, at + ring::TAIL).load(Ordering::Acquire);
    if head.wrapping_sub(tail) >= u64::from(capacity) {
        word(row_ptr, at + ring::DROPPED).fetch_add(1, Ordering::Relaxed);
    } else {
        let slot = at + ring::EVENTS + ring::EVENT_SIZE * (head & u64::from(capacity - 1)) as usize;
        word(row_ptr, slot + ring::EV_TIME).store(raw, Ordering::Relaxed);
        let meta = u64::from(base | ring::KIND_UNWOUND) | (cell << 32);
        word(row_ptr, slot + ring::EV_FUNCTION).store(meta, Ordering::Relaxed);
        word(row_ptr, at + ring::HEAD).store(head.wrapping_add(1), Ordering::Release);
    }
    busy.fetch_sub(1, Ordering::Relaxed);
}

/// A metric base no cell of a live activation has: closing a cell that
/// holds it counts nothing (generated code skips negative bases too).
const RETIRED: i32 = i32::MIN;

/// Marks `cell` (one of this thread's open cells, closed already) retired:
/// whoever pops it later counts nothing, and no flag calls anything.
fn mark_retired(cell: u64) {
    // SAFETY: the caller passes one of the thread's cells; only this
    // thread writes them.
    unsafe {
        ((cell + metric::CELL_METRIC as u64) as *mut i32).write(RETIRED);
        ((cell + metric::CELL_FLAGS as u64) as *mut u32).write(0);
    }
}

/// Closes the activation of `cell`, whose frame an unwind is discarding,
/// and every activation nested in it, while leaving `cell` itself on the
/// stack of open cells: the unwinder reads the caller's return address from
/// it right after the personality routine returns (the records' CFI only
/// looks at open cells). The cell is counted and its timer stopped now, and
/// its metric base is retired so that whoever pops it later (the next
/// entry's stale check, an outer exit) counts nothing more.
fn retire(header: &RegionHeader, row_ptr: *mut u8, cell: u64) {
    close_from(header, row_ptr, cell + metric::CELL_SIZE as u64);
    close_cell(header, row_ptr, cell);
    mark_retired(cell);
    // SAFETY: row_ptr is this thread's row.
    let row = unsafe { &*(row_ptr as *const RowHeader) };
    row.activity.fetch_add(1, Ordering::Release);
}

extern "C" {
    /// libgcc's canonical frame address of an unwind frame (the runtime
    /// links libgcc_s, whose unwinder is the one that reads the records'
    /// unwind information and calls the routine below).
    fn _Unwind_GetCFA(context: *mut core::ffi::c_void) -> usize;
}

const UA_CLEANUP_PHASE: i32 = 2;
const URC_CONTINUE_UNWIND: i32 = 8;

/// The oldest open cell of the row at `row_ptr` whose entry `rsp` is
/// `entry_rsp` (the activation a record frame belongs to; see the module
/// docs), if any.
fn open_cell_at(row_ptr: *mut u8, entry_rsp: u64) -> Option<u64> {
    // SAFETY: row_ptr is this thread's row.
    let state = unsafe { &(*(row_ptr as *const RowHeader)).thread };
    let (cells, top, end) = (
        state.cells.load(Ordering::Relaxed),
        state.top.load(Ordering::Relaxed),
        state.cells_end.load(Ordering::Relaxed),
    );
    let size = metric::CELL_SIZE as u64;
    (0..top.min(end).saturating_sub(cells) / size)
        .map(|i| cells + i * size)
        // SAFETY: the cell lies in the thread's cells.
        .find(|&cell| unsafe { ((cell + metric::CELL_ENTRY_RSP as u64) as *const u64).read() } == entry_rsp)
}

/// The personality routine of the call records. An exception, Rust panic
/// or forced unwind (`pthread_exit`, cancellation) that reaches a record
/// has just discarded the frame of that record's activation (the oldest
/// open cell whose entry `rsp` is the record frame's `rsp` − 8, which is
/// its CFA − 16 in the records' CFI) and of any nested in it: in the cleanup phase they are closed
/// (counted as unwound, timers stopped) now rather than at the thread's
/// next instrumented call; the frame's own cell stays on the stack, retired,
/// until then (see [`retire`]). Never stops the unwind, never catches.
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
    let (Some(header), row_ptr) = (crate::state::region_header(), crate::state::tls_row_get())
    else {
        return URC_CONTINUE_UNWIND;
    };
    if row_ptr.is_null() {
        return URC_CONTINUE_UNWIND;
    }
    // libgcc's "CFA" of a frame's context is the frame's own `rsp` (its
    // callee's CFA): the body returned to the record with `rsp` = entry
    // `rsp` + 8.
    // SAFETY: the unwinder passes its live context.
    let rsp = unsafe { _Unwind_GetCFA(context) } as u64;
    if let Some(cell) = open_cell_at(row_ptr, rsp.wrapping_sub(8)) {
        retire(header, row_ptr, cell);
    }
    URC_CONTINUE_UNWIND
}

/// At thread exit: closes the activations still open (the thread left them
/// by `pthread_exit`, cancellation or an exception that ended it, or they
/// are of the functions exiting it: `start_thread`, the destructor loop
/// this runs in) and releases the CPU clock. Later destructors may still
/// run instrumented code: they find no CPU clock and count no CPU time.
///
/// The cells stay on the stack of open cells, retired (as [`retire`]
/// leaves a cell): the functions still running here (`__call_tls_dtors`)
/// return through them later, and an instrumented call they make first
/// (`free`) must push above them, not over the return addresses they
/// hold. Closed later, a retired cell counts nothing.
pub(crate) fn finish_thread(header: &RegionHeader, row_ptr: *mut u8) {
    // SAFETY: row_ptr is this thread's row.
    let row = unsafe { &*(row_ptr as *const RowHeader) };
    let state = &row.thread;
    let (cells, top, end) = (
        state.cells.load(Ordering::Relaxed),
        state.top.load(Ordering::Relaxed),
        state.cells_end.load(Ordering::Relaxed),
    );
    let size = metric::CELL_SIZE as u64;
    if cells != 0 && top > cells && top <= end && (top - cells) % size == 0 {
        let mut cell = top;
        while cell > cells {
            cell -= size;
            close_cell(header, row_ptr, cell);
            mark_retired(cell);
        }
        row.activity.fetch_add(1, Ordering::Release);
    }
    let mut clock = row.thread.cpu_clock.swap(0, Ordering::AcqRel) as *mut ThreadCpuClock;
    if clock.is_null()
        && row.thread.cpu_why.swap(0, Ordering::AcqRel) == crate::clock::WHY_CPU_PAUSED
    {
        // Paused by the injector: the clock is still in the row's storage.
        clock = ptr::addr_of!(row.clock) as *mut ThreadCpuClock;
    }
    if !clock.is_null() {
        // SAFETY: the clock was written by setup_thread and is dropped once:
        // its pointer was swapped out above, or it was paused (the pointer
        // already 0) and the pause mark was swapped out with it.
        unsafe { ptr::drop_in_place(clock) };
    }
}

/// Lets go of the perf events of the CPU clocks the injector asked about
/// (their `why` is [`crate::clock::WHY_CPU_RELEASE_ASKED`]), and of the
/// CPU-time table with every clock on it, called by the injector with
/// every thread stopped when the last weft session ends: a perf event
/// costs its thread at every context switch for as long as it lives, and
/// nothing reads the clocks any more. The clocks read a system call
/// afterwards (a later session's CPU timers still work). Makes system
/// calls (`mmap`, `close`), takes no lock. Returns how many clocks (and
/// tables) were let go.
#[no_mangle]
pub extern "C" fn weft_rt_release_cpu_clocks() -> i64 {
    let Some(header) = crate::state::region_header() else {
        return 0;
    };
    let mut released = 0;
    for_live_clocks(header, |row, clock| {
        let why = clock.why();
        if why != crate::clock::WHY_CPU_RELEASE_ASKED && why != crate::clock::WHY_CPU_ON_TABLE {
            return;
        }
        // SAFETY: the injector asked only for clocks whose page it found
        // mapped as a perf event, or the clock is on the CPU-time table
        // (no page of its own); their threads are stopped.
        if unsafe { clock.release_event() } {
            released += 1;
        }
        row.thread.cpu_why.store(clock.why(), Ordering::Relaxed);
        row.thread
            .cpu_source
            .store(1 + clock.mode(), Ordering::Relaxed);
    });
    // Every clock is off the table now.
    if crate::clock::release_table() {
        released += 1;
    }
    released
}

/// Runs `f` on every live row's thread and its CPU clock.
fn for_live_clocks(header: &RegionHeader, mut f: impl FnMut(&RowHeader, &mut ThreadCpuClock)) {
    let base = header as *const RegionHeader as *const u8;
    let geometry = header.geometry();
    let used = header.rows_in_use();
    for index in 0..used {
        // SAFETY: index < used <= max_rows: the row lies inside the region.
        let row = unsafe { &*(base.add(geometry.row_offset(index) as usize) as *const RowHeader) };
        if row.state.load(Ordering::Acquire) != crate::layout::ROW_LIVE {
            continue;
        }
        let clock = row.thread.cpu_clock.load(Ordering::Acquire) as *mut ThreadCpuClock;
        if clock.is_null() {
            continue;
        }
        // SAFETY: a live row's clock pointer points at its own storage,
        // holding the clock setup_thread wrote; the callers run with every
        // other thread stopped, so no reader is running.
        f(row, unsafe { &mut *clock });
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

    /// The runtime's closer (thread exit, exceptions) keeps self times and
    /// histograms as the generated stop does: two activations opened the
    /// way generated entries open them (`g` nested in `f`, and `f`
    /// recursing once inside `g`) are closed as unwound, innermost first.
    #[test]
    fn closing_unwound_activations_keeps_self_times() {
        use std::alloc::{alloc_zeroed, Layout};
        const WORDS: u32 = 256;
        let layout = |len: usize| Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: non-zero sizes; leaked (the test's whole life).
        let (header_at, row_at, cells) = unsafe {
            (
                alloc_zeroed(layout(crate::layout::ACKS_OFFSET)),
                alloc_zeroed(layout(ROW_HEADER_SIZE + 8 * WORDS as usize)),
                alloc_zeroed(layout(4096)) as u64,
            )
        };
        let wall = WallClock::new(crate::clock::WallPreference::Auto);
        // SAFETY: a zeroed header is valid (integers and atomics); the
        // fields written are plain integers inside the allocation.
        let header = unsafe {
            let h = header_at as *mut RegionHeader;
            ptr::addr_of_mut!((*h).metric_words).write(WORDS);
            ptr::addr_of_mut!((*h).wall)
                .cast::<[u8; 32]>()
                .write(wall.to_bytes());
            &*h
        };
        // SAFETY: as above, for the row header.
        let row = unsafe { &*(row_at as *const RowHeader) };
        row.thread.cells.store(cells, Ordering::Relaxed);
        row.thread.top.store(cells, Ordering::Relaxed);
        row.thread.cells_end.store(cells + 4096, Ordering::Relaxed);
        row.thread.self_ticks.store(12345, Ordering::Relaxed);
        let (f, g) = (ROW_HEADER_SIZE, ROW_HEADER_SIZE + metric::TIMED_HIST_LEN);
        let w = |base: usize, off: usize| word(row_at, base + off);
        // What a generated entry does: push, nesting += 1, self base, and
        // the start of an outermost activation.
        let enter = |base: usize, flags: u32| {
            let cell = row.thread.top.load(Ordering::Relaxed);
            let raw = wall_raw(WallClock::in_region(header));
            // SAFETY: the cell lies inside the cells allocation.
            unsafe {
                ((cell + metric::CELL_METRIC as u64) as *mut i32).write(base as i32);
                ((cell + metric::CELL_FLAGS as u64) as *mut u32).write(flags);
                ((cell + metric::CELL_SELF_BASE as u64) as *mut u64)
                    .write(raw.wrapping_sub(row.thread.self_ticks.load(Ordering::Relaxed)));
            }
            row.thread
                .top
                .store(cell + metric::CELL_SIZE as u64, Ordering::Relaxed);
            if w(base, metric::NESTING).fetch_add(1, Ordering::Relaxed) == 0 {
                w(base, metric::WALL_START).store(raw, Ordering::Relaxed);
            }
            let end = std::time::Instant::now() + std::time::Duration::from_micros(300);
            while std::time::Instant::now() < end {}
        };
        enter(f, metric::CELL_TIMED | metric::CELL_HISTOGRAM);
        enter(g, metric::CELL_TIMED);
        enter(f, metric::CELL_TIMED | metric::CELL_HISTOGRAM);
        close_from(header, row_at, cells);
        assert_eq!(row.thread.top.load(Ordering::Relaxed), cells);
        let get = |base: usize, off: usize| w(base, off).load(Ordering::Relaxed);
        assert_eq!((get(f, metric::UNWOUND), get(g, metric::UNWOUND)), (2, 1));
        assert_eq!((get(f, metric::NESTING), get(g, metric::NESTING)), (0, 0));
        let (wall_f, wall_g) = (get(f, metric::WALL_TOTAL), get(g, metric::WALL_TOTAL));
        let (self_f, self_g) = (get(f, metric::SELF_TOTAL), get(g, metric::SELF_TOTAL));
        assert!(wall_f > wall_g && wall_g >= 600_000, "{wall_f} {wall_g}");
        // g's self time excludes the inner f; the two add up to the
        // outermost f's inclusive time (a ns of flooring per activation).
        assert!(self_g + 300_000 <= wall_g, "{self_g} {wall_g}");
        assert!(
            (self_f + self_g).abs_diff(wall_f) <= 3,
            "{self_f} {self_g} {wall_f}"
        );
        assert!(self_f >= 600_000);
        // One histogram count, f's outermost activation; none for g.
        let bucket = weft_abi::timer::histogram_bucket(wall_f);
        let hist = |base: usize, b: usize| get(base, metric::HIST + 8 * b);
        assert_eq!(hist(f, bucket), 1);
        assert_eq!(
            (0..metric::HIST_BUCKETS).map(|b| hist(f, b)).sum::<u64>(),
            1
        );
        assert_eq!(get(g + metric::TIMED_LEN, 0), 0);
    }

    #[test]
    fn records_are_where_the_layout_says() {
        let (records, targets, slot) = call_record_addresses();
        assert_eq!(records % 16, 0);
        assert_ne!(targets, 0);
        assert_ne!(slot, 0);
        // Record i calls through target i and jumps through the slot.
        for i in [0u64, 1, CALL_RECORDS as u64 - 1] {
            let at = records + i * crate::layout::RECORD_SIZE as u64;
            // SAFETY: the records are mapped code of this binary.
            let code = unsafe { core::slice::from_raw_parts(at as *const u8, 12) };
            assert_eq!(&code[..2], &[0xff, 0x15]);
            let disp = i32::from_le_bytes(code[2..6].try_into().unwrap());
            assert_eq!(at + 6 + disp as i64 as u64, targets + 8 * i);
            assert_eq!(&code[6..8], &[0xff, 0x25]);
            let disp = i32::from_le_bytes(code[8..12].try_into().unwrap());
            assert_eq!(at + 12 + disp as i64 as u64, slot);
        }
        assert_eq!(cells_len(1024), 32 * 1024);
    }
}
