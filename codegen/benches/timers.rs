//! Cost of the generated timer hot path and of sampling timers (issue #3),
//! kept so that later changes can be compared with these numbers.
//!
//! `call/*`: ns per call of a tiny function `f(x) = x + 1` (`lea rax,
//! [rdi+1]; ret`, built at run time, so it is never inlined), unpatched and
//! then patched like the injector patches functions: a trampoline with
//! `Snippet::CountCall`, with `Snippet::CountCallHookExit` (return slots
//! and the exit handler) without timers, and with timers that call the
//! runtime's real clock readers (`weft_rt_wall_now`, `weft_rt_cpu_now`) on
//! real `WallClock` / `ThreadCpuClock` states. `call/cpu_syscall` forces
//! the CPU clock's syscall fallback to show what the best mode saves.
//!
//! `sample/*`: ns per sample of one function's timer while it runs (the
//! benchmark itself runs inside a hooked, timed function): the seqlock copy
//! and value (`read_timer_words` + `timer_value`), the outside CPU time
//! read (`thread_cpu_ns_from_outside`, a `/proc/.../schedstat` read), and
//! the two with a wall clock read, as a sampler does per thread.
//!
//! The bare clock readers are in `rt/benches/clock.rs`, not repeated here.
//!
//! The setup (an RWX area, a thread row reached through a TLS word, a
//! return-slot block) is that of `tests/timer_exec.rs`, reduced to what the
//! benchmark needs.
//!
//! Run: `cargo bench -p weft-codegen --bench timers` (about 15 s).

use std::any::Any;
use std::arch::asm;
use std::cell::Cell;
use std::hint::black_box;
use std::panic::{self, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion};
use iced_x86::code_asm::*;
use weft_codegen::*;
use weft_rt::clock::{
    thread_cpu_ns_from_outside, thread_cputime_ns, weft_rt_cpu_now, weft_rt_wall_now,
    CpuPreference, ThreadCpuClock, WallClock, WallPreference,
};

/// Row layout (byte offsets), as in the timer tests.
const BLOCK: i32 = 0;
const DEPTH: i32 = 8;
const BOUNDS: i32 = 16; // [lo, hi)
const CPU_STATE: i32 = 32;
const METRICS: i32 = 64;
const ROW_WORDS: usize = 128;
/// Activations per return-slot block: these calls nest at most 2 deep.
const CAPACITY: u32 = 64;
/// Bytes of RWX memory per lab: a few functions, trampolines and a block.
const LAB_LEN: usize = 1 << 20;

thread_local! {
    /// This thread's row, read by generated code with `mov rcx, fs:[off]`.
    static ROW: Cell<*mut u64> = const { Cell::new(ptr::null_mut()) };
}

fn thread_pointer() -> u64 {
    let tp: u64;
    // SAFETY: reads the TCB self-pointer, always mapped on x86-64 Linux.
    unsafe { asm!("mov {}, fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags)) };
    tp
}

/// Offset of `ROW` from the thread pointer (the same for every thread).
fn tls_offset() -> i32 {
    let var = ROW.with(|r| r as *const Cell<*mut u64> as u64);
    i32::try_from(var.wrapping_sub(thread_pointer()) as i64).unwrap()
}

/// The registration function the trampolines call for a thread without a
/// row: never reached, the benchmark thread installs its rows itself.
extern "C" fn register_thread() -> *mut u8 {
    ptr::null_mut()
}

/// Return slots of `CAPACITY`, with the given timers (none: `Timers::NONE`).
fn slots(timers: Timers, wall: &'static WallClock) -> ReturnSlots {
    ReturnSlots::new(CAPACITY, BLOCK, DEPTH, Some(BOUNDS))
        .unwrap()
        .with_timers(TimerSpec {
            timers,
            wall_fn: weft_rt_wall_now as *const () as u64,
            wall_state: wall as *const WallClock as u64,
            cpu_fn: weft_rt_cpu_now as *const () as u64,
            cpu_state_row_offset: CPU_STATE,
        })
        .unwrap()
}

/// How a function is patched.
#[derive(Clone, Copy)]
enum Hook {
    /// `Snippet::CountCall` on the metric's entries word.
    Count,
    /// `Snippet::CountCallHookExit` with the lab's layout.
    Exit,
}

/// An RWX mapping holding the registration stub, the exit handler, the
/// functions, their trampolines and the blocks, all within rel32 reach of
/// each other. One per `ReturnSlots` layout (the exit handler depends on
/// it).
struct Lab {
    base: *mut u8,
    used: usize,
    stub: u64,
    handler: u64,
    slots: ReturnSlots,
    next_metric: i32,
}

impl Lab {
    fn new(slots: ReturnSlots) -> Lab {
        // SAFETY: a fresh anonymous mapping; no existing memory is affected.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                LAB_LEN,
                libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let mut lab = Lab {
            base: base.cast(),
            used: 0,
            stub: 0,
            handler: 0,
            slots,
            next_metric: METRICS,
        };
        let save = VectorSave::Fxsave64;
        lab.stub = lab.alloc(register_stub_len(save), 64);
        let stub = register_stub(lab.stub, register_thread as *const () as u64, save).unwrap();
        lab.write(lab.stub, &stub);
        lab.handler = lab.alloc(exit_handler_len(tls_offset(), &slots), 64);
        let handler = exit_handler(lab.handler, tls_offset(), &slots).unwrap();
        lab.write(lab.handler, &handler);
        lab
    }

    fn alloc(&mut self, n: usize, align: usize) -> u64 {
        let at = self.used.next_multiple_of(align);
        assert!(at + n <= LAB_LEN);
        self.used = at + n;
        self.base as u64 + at as u64
    }

    fn offset(&self, addr: u64, len: usize) -> usize {
        let off = (addr - self.base as u64) as usize;
        assert!(off + len <= LAB_LEN);
        off
    }

    fn write(&self, addr: u64, bytes: &[u8]) {
        let off = self.offset(addr, bytes.len());
        // SAFETY: in bounds of our mapping (checked by `offset`); nothing
        // executes these bytes while we write them.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(off), bytes.len()) };
    }

    fn bytes(&self, addr: u64, len: usize) -> Vec<u8> {
        let off = self.offset(addr, len);
        // SAFETY: in bounds of our mapping, which lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.base.add(off), len) }.to_vec()
    }

    /// A new return-slot block (its data part is zero: fresh mapping).
    fn block(&mut self) -> u64 {
        let block = self.alloc(self.slots.block_len() as usize, 4096);
        self.write(block, &return_block_code(&self.slots, self.handler));
        block
    }

    /// Assembles a function followed by int3 padding (what `analyze_entry`
    /// may use); returns its address and code length.
    fn assemble(&mut self, build: impl FnOnce(&mut CodeAssembler)) -> (u64, usize) {
        let addr = self.alloc(256, 64);
        let mut a = CodeAssembler::new(64).unwrap();
        build(&mut a);
        let bytes = a.assemble(addr).unwrap();
        assert!(bytes.len() <= 240);
        self.write(addr, &[0xcc; 256]);
        self.write(addr, &bytes);
        (addr, bytes.len())
    }

    /// `f(x) = x + 1`.
    fn increment(&mut self) -> (u64, usize) {
        self.assemble(|a| {
            a.lea(rax, qword_ptr(rdi + 1)).unwrap();
            a.ret().unwrap();
        })
    }

    /// `f(x) = callback(x)`: `push rbx; mov rax, callback; call rax; pop rbx;
    /// ret` (the push keeps the callee's stack ABI-aligned).
    fn wrapper(&mut self, callback: extern "C" fn(i64) -> i64) -> (u64, usize) {
        self.assemble(|a| {
            a.push(rbx).unwrap();
            a.mov(rax, callback as *const () as u64).unwrap();
            a.call(rax).unwrap();
            a.pop(rbx).unwrap();
            a.ret().unwrap();
        })
    }

    /// Patches the function at `addr` as `hook` says; returns its metric
    /// base (row byte offset).
    fn hook(&mut self, (addr, len): (u64, usize), hook: Hook) -> i32 {
        let metric = self.next_metric;
        self.next_metric += self.slots.metric_len();
        assert!(metric + self.slots.metric_len() <= (ROW_WORDS * 8) as i32);
        let code = self.bytes(addr, len);
        let padding = self.bytes(addr + len as u64, 16);
        let site = analyze_entry(&FunctionCode {
            address: addr,
            bytes: &code,
            padding: &padding,
        })
        .unwrap();
        let snippets = [match hook {
            Hook::Count => Snippet::CountCall {
                offset: metric + METRIC_ENTRIES,
            },
            Hook::Exit => Snippet::CountCallHookExit {
                metric,
                slots: self.slots,
            },
        }];
        let max = max_trampoline_len(&site, &snippets);
        let t_addr = self.alloc(max, 64);
        let t = build_trampoline(&TrampolineSpec {
            address: t_addr,
            site: &site,
            row: ThreadRow {
                tls_offset: tls_offset(),
                register_stub: self.stub,
            },
            snippets: &snippets,
        })
        .unwrap();
        assert!(t.bytes.len() <= max);
        self.write(t_addr, &t.bytes);
        self.write(
            site.patch_address,
            &jmp_rel32(site.patch_address, t_addr).unwrap(),
        );
        metric
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // SAFETY: our own mapping; no code in it is running any more.
        unsafe { libc::munmap(self.base.cast(), LAB_LEN) };
    }
}

fn fn1(addr: u64) -> extern "C" fn(i64) -> i64 {
    // SAFETY: `addr` holds a C-ABI function with this signature.
    unsafe { std::mem::transmute::<usize, extern "C" fn(i64) -> i64>(addr as usize) }
}

/// The benchmark thread's row (leaked: generated code keeps its address)
/// and CPU clock, whose address the row holds until this is dropped.
struct Row {
    words: *mut u64,
    cpu: Option<Box<ThreadCpuClock>>,
}

impl Row {
    /// Installs a fresh row for this thread using `block`, with stack
    /// bounds covering everything and (unless `cpu` is None) a CPU clock of
    /// its own.
    fn install(block: u64, wall: &WallClock, cpu: Option<CpuPreference>) -> Row {
        let words = Box::leak(vec![0u64; ROW_WORDS].into_boxed_slice());
        words[(BLOCK / 8) as usize] = block;
        words[(BOUNDS / 8) as usize + 1] = u64::MAX;
        let cpu = cpu.map(|p| Box::new(ThreadCpuClock::new(wall, p)));
        if let Some(c) = &cpu {
            eprintln!("cpu clock, {} mode: {}", cpu_mode_name(c), c.source());
            words[(CPU_STATE / 8) as usize] = &**c as *const ThreadCpuClock as u64;
        }
        ROW.with(|r| r.set(words.as_mut_ptr()));
        Row {
            words: words.as_mut_ptr(),
            cpu,
        }
    }

    /// The live word at row byte offset `off`, loaded as another thread or
    /// a sampler would (one aligned 8-byte load, not elided).
    fn load(&self, off: i32) -> u64 {
        assert!(off >= 0 && (off as usize) < ROW_WORDS * 8 && off % 8 == 0);
        // SAFETY: in bounds of the leaked, 8-aligned row (checked above);
        // only this thread's generated code writes it, with plain aligned
        // stores, so an atomic load is never torn.
        unsafe { AtomicU64::from_ptr(self.words.add((off / 8) as usize)).load(Ordering::Relaxed) }
    }

    /// (entries, exits, unwound, unhooked) of metric `m`.
    fn counts(&self, m: i32) -> [u64; 4] {
        [
            METRIC_ENTRIES,
            METRIC_EXITS,
            METRIC_UNWOUND,
            METRIC_UNHOOKED,
        ]
        .map(|o| self.load(m + o))
    }
}

impl Drop for Row {
    fn drop(&mut self) {
        // The clock is freed: the row must not point at it.
        // SAFETY: in bounds of the leaked row; no generated code runs now.
        unsafe { self.words.add((CPU_STATE / 8) as usize).write(0) };
        ROW.with(|r| r.set(ptr::null_mut()));
    }
}

fn cpu_mode_name(c: &ThreadCpuClock) -> &'static str {
    match c.mode() {
        weft_rt::clock::CPU_PERF_TIME => "perf_time",
        weft_rt::clock::CPU_ANCHOR => "anchor",
        _ => "syscall",
    }
}

/// Benchmarks calls of `f` as `call/{name}` (with the row it needs
/// installed).
fn bench_calls(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, f: u64) {
    let f = fn1(f);
    // First touches (the block's data page, the readers' code) outside the
    // measurement.
    f(0);
    group.bench_function(name, |b| b.iter(|| f(black_box(1))));
}

fn calls(c: &mut Criterion) {
    let wall: &'static WallClock = Box::leak(Box::new(WallClock::new(WallPreference::Auto)));
    eprintln!("wall clock: {}", wall.source());
    let mut group = c.benchmark_group("call");

    // Plain, entry counter and exit hook: one timer-less lab.
    let mut lab = Lab::new(slots(Timers::NONE, wall));
    let plain = lab.increment();
    let count = lab.increment();
    let m_count = lab.hook(count, Hook::Count);
    let exit = lab.increment();
    let m_exit = lab.hook(exit, Hook::Exit);
    let row = Row::install(lab.block(), wall, None);
    bench_calls(&mut group, "plain", plain.0);
    bench_calls(&mut group, "count", count.0);
    assert!(row.counts(m_count)[0] > 0, "count: not counted");
    bench_calls(&mut group, "exit_hook", exit.0);
    check_exits(&row, m_exit, "exit_hook");
    drop(row);

    // Wall timer only.
    let mut lab = Lab::new(slots(
        Timers {
            wall: true,
            cpu: false,
        },
        wall,
    ));
    let f = lab.increment();
    let m = lab.hook(f, Hook::Exit);
    let row = Row::install(lab.block(), wall, None);
    bench_calls(&mut group, "wall", f.0);
    check_timed(&row, m, "wall", false);
    drop(row);

    // Wall and CPU timers: the CPU clock in its best mode here, then its
    // syscall fallback (same code, another clock state in a fresh row).
    let both = Timers {
        wall: true,
        cpu: true,
    };
    let mut lab = Lab::new(slots(both, wall));
    let f = lab.increment();
    let m = lab.hook(f, Hook::Exit);
    for (name, pref) in [
        ("wall_cpu", CpuPreference::Auto),
        ("cpu_syscall", CpuPreference::Syscall),
    ] {
        let row = Row::install(lab.block(), wall, Some(pref));
        bench_calls(&mut group, name, f.0);
        check_timed(&row, m, name, true);
        let cpu = row.cpu.as_ref().unwrap();
        eprintln!(
            "{name}: cpu clock {} reads, {} syscalls",
            cpu.reads(),
            cpu.syscalls()
        );
    }
    group.finish();
}

/// Every measured call went through the exit hook.
fn check_exits(row: &Row, m: i32, name: &str) {
    let [entries, exits, unwound, unhooked] = row.counts(m);
    assert!(
        entries > 0 && exits == entries && unwound == 0 && unhooked == 0,
        "{name}: {:?}",
        row.counts(m)
    );
    assert_eq!(row.load(DEPTH), 0, "{name}");
}

/// ... and was timed by the selected clocks.
fn check_timed(row: &Row, m: i32, name: &str, cpu: bool) {
    check_exits(row, m, name);
    let (wall_total, cpu_total) = (
        row.load(m + METRIC_WALL_TOTAL),
        row.load(m + METRIC_CPU_TOTAL),
    );
    assert!(wall_total > 0, "{name}: no wall time");
    assert_eq!(cpu_total > 0, cpu, "{name}: cpu time {cpu_total}");
    assert_eq!(row.load(m + METRIC_NESTING), 0, "{name}");
}

/// What `run_inside` runs, and a panic it caught.
struct Inside<'a> {
    body: &'a mut dyn FnMut(),
    panic: Option<Box<dyn Any + Send>>,
}

/// The hooked wrapper's callee: runs the body of the `Inside` that `ctx`
/// points to, inside the wrapper's timed activation. A panic is caught and
/// handed back: it cannot unwind through the generated frames (no CFI).
extern "C" fn run_inside(ctx: i64) -> i64 {
    // SAFETY: `ctx` is the `*mut Inside` made by `while_timed`, alive and
    // not otherwise borrowed for the whole call.
    let inside = unsafe { &mut *(ctx as usize as *mut Inside<'_>) };
    inside.panic = panic::catch_unwind(AssertUnwindSafe(&mut inside.body)).err();
    ctx
}

/// Runs `body` inside a call of `wrapper` (a hooked `Lab::wrapper` of
/// `run_inside`), i.e. while the wrapper's timer runs.
fn while_timed(wrapper: u64, body: &mut dyn FnMut()) {
    let mut inside = Inside { body, panic: None };
    let ctx = &mut inside as *mut Inside<'_> as usize as i64;
    assert_eq!(fn1(wrapper)(ctx), ctx);
    if let Some(p) = inside.panic {
        panic::resume_unwind(p);
    }
}

fn sampling(c: &mut Criterion) {
    let wall: &'static WallClock = Box::leak(Box::new(WallClock::new(WallPreference::Auto)));
    let both = Timers {
        wall: true,
        cpu: true,
    };
    let mut lab = Lab::new(slots(both, wall));
    let w = lab.wrapper(run_inside);
    let m = lab.hook(w, Hook::Exit);
    let row = Row::install(lab.block(), wall, Some(CpuPreference::Auto));
    let (pid, tid) = (std::process::id(), {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        u32::try_from(tid).unwrap()
    });
    let words = || read_timer_words(|off| row.load(m + off), 1000).expect("seqlock stuck");

    while_timed(w.0, &mut || {
        // The wrapper's timer is running: the words are those a sampler
        // sees for a function in progress.
        // (The thread's own CPU clock, not schedstat, which lags by the
        // current run's unaccounted part and can still be below the start.)
        let (wall_now, cpu_now) = (wall.now(), Some(thread_cputime_ns()));
        let v = timer_value(&words(), wall_now, cpu_now);
        assert!(v.running && v.wall_ns > 0 && v.cpu_ns > 0, "{v:?}");

        let mut group = c.benchmark_group("sample");
        // The seqlock copy and the value, the clocks given (read above).
        group.bench_function("timer_words", |b| {
            b.iter(|| timer_value(&words(), black_box(wall_now), black_box(cpu_now)))
        });
        // The thread's CPU time as another process reads it.
        group.bench_function("schedstat", |b| {
            b.iter(|| thread_cpu_ns_from_outside(black_box(pid), black_box(tid)).unwrap())
        });
        // One whole sample of one thread's timer: both clocks, then the
        // words (the order `timer_value` asks for).
        group.bench_function("full", |b| {
            b.iter(|| {
                let wall_now = wall.now();
                let cpu_now = thread_cpu_ns_from_outside(pid, tid).ok();
                timer_value(&words(), wall_now, cpu_now)
            })
        });
        group.finish();
    });
    check_timed(&row, m, "sample", true);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);
    targets = calls, sampling
}
criterion_main!(benches);
