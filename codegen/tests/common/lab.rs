//! An in-process lab for executing generated code, shared by the execution
//! tests and the timers benchmark (which includes this file by `#[path]`):
//! an RWX area holding functions, trampolines, the exit code and threads'
//! cells, a thread row reached through a TLS word, and the runtime's real
//! call records (weft-rt is linked in).
//!
//! The runtime has one exit-handler slot per process, so one lab at a time
//! may be in use: [`Lab::new`] takes a process-wide lock that the lab holds
//! until it is dropped. Labs are never unmapped (a test's leftover open
//! activations may point into one).

#![allow(dead_code)] // each user takes a different subset

use std::arch::asm;
use std::cell::Cell;
use std::ptr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use iced_x86::code_asm::*;
use iced_x86::BlockEncoderOptions;
use weft_codegen::*;
use weft_rt::clock::{
    weft_rt_cpu_ticks, weft_rt_wall_raw, CpuPreference, ThreadCpuClock, WallClock,
};

/// Row layout (byte offsets).
pub const CELLS: i32 = 0;
pub const TOP: i32 = 8;
pub const BOUNDS: i32 = 16; // [lo, hi)
pub const END: i32 = 32;
pub const CPU_STATE: i32 = 40;
pub const ACTIVITY: i32 = 48;
/// The thread's index (u32), for probe contexts.
pub const ROW_INDEX: i32 = 56;
/// The thread's self-ticks word (`TimerSpec::self_ticks_row`).
pub const SELF_TICKS: i32 = 64;
pub const METRICS: i32 = 128;
pub const ROW_WORDS: usize = 1024;
/// Activations per thread.
pub const CAPACITY: u32 = 1024;

/// The rows' activation-stack fields.
pub const ROW: ActivationRow = ActivationRow {
    cells: CELLS,
    top: TOP,
    end: END,
    stack_bounds: Some(BOUNDS),
    activity: Some(ACTIVITY),
};

thread_local! {
    /// This thread's row, read by generated code with `mov rcx, fs:[off]`.
    static THREAD_ROW: Cell<*mut u64> = const { Cell::new(ptr::null_mut()) };
}

fn thread_pointer() -> u64 {
    let tp: u64;
    // SAFETY: reads the TCB self-pointer, always mapped on x86-64 Linux.
    unsafe { asm!("mov {}, fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags)) };
    tp
}

/// Offset of this binary's row pointer from the thread pointer.
pub fn tls_offset() -> i32 {
    let var = THREAD_ROW.with(|r| r as *const Cell<*mut u64> as u64);
    i32::try_from(var.wrapping_sub(thread_pointer()) as i64).unwrap()
}

/// The registration function: the lab installs rows itself, so a thread
/// without one simply is not counted.
extern "C" fn register_thread() -> *mut u8 {
    ptr::null_mut()
}

/// The runtime's call records, linked into this binary.
pub fn records() -> CallRecords {
    CallRecords {
        first: weft_rt::call_record_addresses().0,
        count: weft_rt::layout::CALL_RECORDS as u32,
    }
}

/// The next unused call record (records are never reused here).
fn next_record() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let r = NEXT.fetch_add(1, Ordering::Relaxed);
    assert!(
        (r as usize) < weft_rt::layout::CALL_RECORDS,
        "out of records"
    );
    r
}

/// Points call record `record` at `target`.
fn set_record_target(record: u32, target: u64) {
    let targets = weft_rt::call_record_addresses().1;
    // SAFETY: the targets table has CALL_RECORDS aligned u64 slots; the
    // record is not in use by any thread yet.
    unsafe { ((targets + 8 * u64::from(record)) as *mut u64).write_volatile(target) };
}

/// Installs a fresh row for this thread using `cells` (0: none), with stack
/// bounds covering everything; returns it (leaked: another thread may read
/// it).
pub fn install_row(cells: u64) -> &'static mut [u64] {
    let row = new_row();
    row[(CELLS / 8) as usize] = cells;
    row[(TOP / 8) as usize] = cells;
    if cells != 0 {
        row[(END / 8) as usize] = cells + u64::from(CAPACITY * CELL_SIZE);
    }
    row[(BOUNDS / 8) as usize + 1] = u64::MAX;
    THREAD_ROW.with(|r| r.set(row.as_mut_ptr()));
    row
}

/// Rows the records' unwind information can find (the runtime's
/// `set_unwind_rows`); more are plain allocations, which unwinders do not
/// see.
const UNWINDABLE_ROWS: u32 = 256;

/// A zeroed row, from the rows registered for unwinding while they last.
fn new_row() -> &'static mut [u64] {
    struct Pool(*mut u64);
    // SAFETY (both): the pointer is to leaked memory, handed out in
    // disjoint rows (by `USED`), never through the Pool itself.
    unsafe impl Sync for Pool {}
    unsafe impl Send for Pool {}
    static POOL: std::sync::OnceLock<Pool> = std::sync::OnceLock::new();
    static USED: AtomicU32 = AtomicU32::new(0);
    let stride = (ROW_WORDS * 8) as u64;
    let pool = POOL.get_or_init(|| {
        let rows = Box::leak(vec![0u64; ROW_WORDS * UNWINDABLE_ROWS as usize].into_boxed_slice());
        // SAFETY: the pool is leaked (never freed) and USED is a static.
        unsafe {
            weft_rt::set_unwind_rows(weft_rt::UnwindRows {
                first: rows.as_ptr() as u64,
                stride,
                count: &USED,
                max: u64::from(UNWINDABLE_ROWS),
                cells: CELLS as u64,
                top: TOP as u64,
            })
        };
        Pool(rows.as_mut_ptr())
    });
    let index = USED.fetch_add(1, Ordering::AcqRel);
    if index >= UNWINDABLE_ROWS {
        return Box::leak(vec![0u64; ROW_WORDS].into_boxed_slice());
    }
    // SAFETY: row `index` of the pool is handed out once (USED only grows).
    unsafe { std::slice::from_raw_parts_mut(pool.0.add(index as usize * ROW_WORDS), ROW_WORDS) }
}

/// This thread's row.
pub fn my_row() -> *const u64 {
    THREAD_ROW.with(|r| r.get())
}

/// Word `off` of the row at `row`, read as another thread would.
pub fn load(row: *const u64, off: i32) -> u64 {
    // SAFETY: rows are leaked ROW_WORDS-word, 8-aligned allocations; the
    // owning thread writes them with plain aligned stores, so an atomic
    // 8-byte load is never torn.
    unsafe { AtomicU64::from_ptr(row.add((off / 8) as usize).cast_mut()).load(Ordering::Relaxed) }
}

/// Word `off` of this thread's row.
pub fn word(off: i32) -> u64 {
    load(my_row(), off)
}

/// Sets word `off` of this thread's row.
pub fn set_word(off: i32, v: u64) {
    // SAFETY: as in `load`; only this thread writes its row, and it is not
    // running generated code now.
    unsafe {
        my_row()
            .cast_mut()
            .add((off / 8) as usize)
            .write_volatile(v)
    }
}

/// Open activations of this thread.
pub fn depth() -> u64 {
    (word(TOP) - word(CELLS)) / u64::from(CELL_SIZE)
}

/// The address of cell `index` of this thread's row.
pub fn cell(index: u32) -> u64 {
    word(CELLS) + u64::from(index * CELL_SIZE)
}

/// (entries, exits, unwound, unhooked) of metric `m` on this thread.
pub fn counts(m: i32) -> [u64; 4] {
    [
        word(m + METRIC_ENTRIES),
        word(m + METRIC_EXITS),
        word(m + METRIC_UNWOUND),
        word(m + METRIC_UNHOOKED),
    ]
}

/// This thread's (wall_total, cpu_total, nesting) of metric `m`.
pub fn totals(m: i32) -> (u64, u64, u64) {
    (
        word(m + METRIC_WALL_TOTAL),
        word(m + METRIC_CPU_TOTAL),
        word(m + METRIC_NESTING),
    )
}

/// `addr` as a C-ABI `fn(i64) -> i64`.
pub fn fn1(addr: u64) -> extern "C" fn(i64) -> i64 {
    // SAFETY: `addr` holds a C-ABI function with this signature.
    unsafe { std::mem::transmute::<usize, extern "C" fn(i64) -> i64>(addr as usize) }
}

/// One lab at a time (the runtime's handler slot is process-wide).
static EXCLUSIVE: Mutex<()> = Mutex::new(());

/// An RWX mapping holding the exit code, cells, functions and trampolines,
/// all within rel32 reach of each other.
pub struct Lab {
    base: *mut u8,
    len: usize,
    used: usize,
    stub: u64,
    hooks: ExitHooks,
    next_metric: i32,
    /// The record of the last hooked function.
    pub last_record: u32,
    _exclusive: MutexGuard<'static, ()>,
}

// SAFETY: the mapping is only written before threads run the code in it.
unsafe impl Sync for Lab {}

impl Lab {
    /// A lab whose functions are hooked without timers.
    pub fn new() -> Lab {
        Lab::with(None, 16 << 20)
    }

    /// A lab whose functions are timed per `spec`.
    pub fn timed(spec: TimerSpec) -> Lab {
        Lab::with(Some(spec), 16 << 20)
    }

    /// A lab of `len` bytes; its exit code is built for `timers` and
    /// installed as the runtime's exit handler.
    pub fn with(timers: Option<TimerSpec>, len: usize) -> Lab {
        Lab::build(timers, None, None, len)
    }

    /// A lab whose exit code also calls exit probes from `probes`' table.
    pub fn with_exit_probes(timers: Option<TimerSpec>, probes: ExitProbes) -> Lab {
        Lab::build(timers, Some(probes), None, 16 << 20)
    }

    /// A lab whose exit code writes the closes of traced activations into
    /// the rows' trace ring `ring` (functions are traced when hooked with
    /// `hooks().tracing(true)`).
    #[allow(dead_code)]
    pub fn traced(timers: Option<TimerSpec>, ring: TraceRing) -> Lab {
        Lab::build(timers, None, Some(ring), 16 << 20)
    }

    fn build(
        timers: Option<TimerSpec>,
        probes: Option<ExitProbes>,
        ring: Option<TraceRing>,
        len: usize,
    ) -> Lab {
        let exclusive = EXCLUSIVE.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: a fresh anonymous mapping; no existing memory is affected.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let layout = |at: u64| {
            let mut hooks = ExitHooks::new(ROW, records(), at).unwrap();
            if let Some(spec) = timers {
                hooks = hooks.with_timers(spec).unwrap();
            }
            if let Some(p) = probes {
                hooks = hooks.with_exit_probes(p).unwrap();
            }
            if let Some(r) = ring {
                hooks = hooks.with_trace(r).unwrap();
            }
            hooks
        };
        let mut lab = Lab {
            base: base.cast(),
            len,
            used: 0,
            stub: 0,
            hooks: layout(0x1000),
            next_metric: METRICS,
            last_record: 0,
            _exclusive: exclusive,
        };
        let save = VectorSave::Fxsave64;
        lab.stub = lab.alloc(register_stub_len(save), 64);
        let stub = register_stub(lab.stub, register_thread as *const () as u64, save).unwrap();
        lab.write(lab.stub, &stub);
        let at = lab.alloc(exit_code_len(tls_offset(), &lab.hooks), 64);
        lab.hooks = layout(at);
        let code = exit_code(tls_offset(), &lab.hooks).unwrap();
        lab.write(at, &code.bytes);
        // SAFETY: the handler was built for this binary's row layout;
        // CAPACITY is the one capacity every lab uses.
        assert_eq!(
            unsafe { weft_rt::weft_rt_enable_exits(CAPACITY, code.handler) },
            0
        );
        lab
    }

    /// The lab's exit-hook layout.
    pub fn hooks(&self) -> ExitHooks {
        self.hooks
    }

    pub fn alloc(&mut self, n: usize, align: usize) -> u64 {
        let at = self.used.next_multiple_of(align);
        assert!(at + n <= self.len);
        self.used = at + n;
        self.base as u64 + at as u64
    }

    pub fn write(&self, addr: u64, bytes: &[u8]) {
        let off = (addr - self.base as u64) as usize;
        assert!(off + bytes.len() <= self.len);
        // SAFETY: in bounds of our mapping (checked above); nothing executes
        // these bytes while we write them.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(off), bytes.len()) };
    }

    pub fn read(&self, addr: u64) -> u64 {
        u64::from_le_bytes(self.bytes(addr, 8).try_into().unwrap())
    }

    pub fn bytes(&self, addr: u64, len: usize) -> Vec<u8> {
        let off = (addr - self.base as u64) as usize;
        assert!(off + len <= self.len);
        // SAFETY: in bounds of our mapping, which is never unmapped.
        unsafe { std::slice::from_raw_parts(self.base.add(off), len) }.to_vec()
    }

    /// New cells for a thread (zero: fresh mapping).
    pub fn cells(&mut self) -> u64 {
        self.alloc((CAPACITY * CELL_SIZE) as usize, 4096)
    }

    /// Assembles a function; `end` marks the end of its code (data may
    /// follow), then int3 padding.
    pub fn assemble(
        &mut self,
        build: impl FnOnce(&mut CodeAssembler, &mut CodeLabel),
    ) -> (u64, usize) {
        let addr = self.alloc(512, 64);
        let mut a = CodeAssembler::new(64).unwrap();
        let mut end = a.create_label();
        build(&mut a, &mut end);
        a.int3().unwrap(); // `end` labels this padding byte
        let res = a
            .assemble_options(addr, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)
            .unwrap();
        let code_len = (res.label_ip(&end).unwrap() - addr) as usize;
        let bytes = res.inner.code_buffer;
        assert!(bytes.len() <= 480);
        self.write(addr, &[0xcc; 512]);
        self.write(addr, &bytes);
        (addr, code_len)
    }

    /// Patches the function at `addr` with `snippet(metric)`; returns the
    /// metric base.
    fn patch(&mut self, (addr, len): (u64, usize), snippet: Snippet, metric_len: i32) -> i32 {
        let metric = self.next_metric;
        self.next_metric += metric_len;
        assert!(metric + metric_len <= (ROW_WORDS * 8) as i32);
        let code = self.bytes(addr, len);
        let padding = self.bytes(addr + len as u64, 16);
        let site = analyze_entry(&FunctionCode {
            address: addr,
            bytes: &code,
            padding: &padding,
        })
        .unwrap();
        let snippets = [snippet];
        let t_addr = self.alloc(max_trampoline_len(&site, &snippets), 64);
        let t = build_trampoline(&TrampolineSpec {
            address: t_addr,
            site: &site,
            row: ThreadRow {
                tls_offset: tls_offset(),
                register_stub: self.stub,
                activity: Some(ACTIVITY),
            },
            snippets: &snippets,
        })
        .unwrap();
        assert!(t.bytes.len() <= max_trampoline_len(&site, &snippets));
        self.write(t_addr, &t.bytes);
        if let Snippet::CountCallHookExit { record, .. } = snippet {
            set_record_target(record, t_addr + t.relocated_offset as u64);
        }
        self.write(
            site.patch_address,
            &jmp_rel32(site.patch_address, t_addr).unwrap(),
        );
        metric
    }

    /// Patches the function with an exit-hooking (timed, per the lab's
    /// layout) trampoline; returns its metric base.
    pub fn hook(&mut self, f: (u64, usize)) -> i32 {
        let hooks = self.hooks;
        self.hook_as(f, hooks)
    }

    /// Patches the function with an exit-hooking trampoline built from
    /// `hooks` (the lab's, changed per function); returns its metric base.
    pub fn hook_as(&mut self, f: (u64, usize), hooks: ExitHooks) -> i32 {
        self.hook_with(f, hooks, Inside::ALWAYS)
    }

    /// Patches the function with the lab's exit-hooking trampoline,
    /// counting only calls made while `inside` holds; returns its metric
    /// base.
    pub fn hook_inside(&mut self, f: (u64, usize), inside: Inside) -> i32 {
        let hooks = self.hooks;
        self.hook_with(f, hooks, inside)
    }

    fn hook_with(&mut self, f: (u64, usize), hooks: ExitHooks, inside: Inside) -> i32 {
        let record = next_record();
        self.last_record = record;
        let metric = self.next_metric;
        let snippet = Snippet::CountCallHookExit {
            metric,
            record,
            hooks,
            inside,
        };
        self.patch(f, snippet, hooks.metric_len())
    }

    /// Patches the instruction at `at` inside the function `f` with an
    /// instruction-point trampoline running `snippet`.
    pub fn patch_instruction(&mut self, (addr, len): (u64, usize), at: u64, snippet: Snippet) {
        let code = self.bytes(addr, len);
        let padding = self.bytes(addr + len as u64, 16);
        let site = analyze_at(
            &FunctionCode {
                address: addr,
                bytes: &code,
                padding: &padding,
            },
            at,
        )
        .unwrap();
        let snippets = [snippet];
        let t_addr = self.alloc(max_trampoline_len(&site, &snippets), 64);
        let t = build_instruction_trampoline(&TrampolineSpec {
            address: t_addr,
            site: &site,
            row: ThreadRow {
                tls_offset: tls_offset(),
                register_stub: self.stub,
                activity: Some(ACTIVITY),
            },
            snippets: &snippets,
        })
        .unwrap();
        assert!(t.bytes.len() <= max_trampoline_len(&site, &snippets));
        self.write(t_addr, &t.bytes);
        self.write(
            site.patch_address,
            &jmp_rel32(site.patch_address, t_addr).unwrap(),
        );
    }

    /// Patches the function at `f` with `snippet`; returns the metric base
    /// the lab reserved (unused by snippets without words).
    pub fn patch_with(&mut self, f: (u64, usize), snippet: Snippet) -> i32 {
        self.patch(f, snippet, 8)
    }

    /// Patches the function with an entry counter only; returns its word.
    pub fn count(&mut self, f: (u64, usize)) -> i32 {
        let offset = self.next_metric;
        self.patch(f, Snippet::CountCall { offset }, 8)
    }

    /// `f(x) = callback(x)`: `push rbx; mov rax, callback; call rax; pop rbx;
    /// ret` (the push keeps the callee's stack ABI-aligned).
    pub fn wrapper(&mut self, callback: extern "C" fn(i64) -> i64) -> (u64, usize) {
        self.assemble(|a, end| {
            a.push(rbx).unwrap();
            a.mov(rax, callback as *const () as u64).unwrap();
            a.call(rax).unwrap();
            a.pop(rbx).unwrap();
            a.ret().unwrap();
            a.set_label(end).unwrap();
        })
    }
}

/// Timers read the way the injector sets them up for `wall`: `rdtsc`
/// inline for a TSC wall clock, else the runtime's raw wall routine; the
/// CPU clock's anchor inline, the runtime's slow path otherwise.
pub fn timer_spec(timers: Timers, wall: &'static WallClock) -> TimerSpec {
    TimerSpec {
        timers,
        wall: if wall.kind == weft_rt::clock::WALL_TSC {
            WallRead::Tsc
        } else {
            WallRead::Call {
                routine: weft_rt_wall_raw as *const () as u64,
                state: wall as *const WallClock as u64,
            }
        },
        cpu: CpuClockLayout {
            row_offset: CPU_STATE,
            slow_path: weft_rt_cpu_ticks as *const () as u64,
            ..CpuClockLayout::WEFT_RT
        },
        ns_per_tick_q32: wall.units().ns_per_tick_q32,
        self_ticks_row: SELF_TICKS,
    }
}

/// This thread's row and CPU clock; the row is leaked (a reader thread may
/// look at it), the clock lives as long as this value and is cleared from
/// the row when it is dropped.
pub struct TimedRow {
    pub row: &'static mut [u64],
    pub cpu: Option<Box<ThreadCpuClock>>,
}

impl Drop for TimedRow {
    fn drop(&mut self) {
        self.row[(CPU_STATE / 8) as usize] = 0;
    }
}

/// Installs a fresh row for this thread using `cells`, with stack bounds
/// covering everything and (unless `cpu` is None) a CPU clock of its own
/// in `wall`'s ticks (the runtime builds every thread's CPU clock on the
/// process's wall clock).
pub fn install_timed_row(
    cells: u64,
    cpu: Option<CpuPreference>,
    wall: &'static WallClock,
) -> TimedRow {
    let row = install_row(cells);
    let cpu = cpu.map(|p| Box::new(ThreadCpuClock::new(wall, p)));
    if let Some(c) = &cpu {
        row[(CPU_STATE / 8) as usize] = &**c as *const ThreadCpuClock as u64;
    }
    TimedRow { row, cpu }
}
