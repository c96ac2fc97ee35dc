//! Cost of the generated timer hot path and of sampling timers, kept so
//! that later changes can be compared with these numbers.
//!
//! `call/*`: ns per call of a tiny function `f(x) = x + 1` (`lea rax,
//! [rdi+1]; ret`, built at run time, so it is never inlined), unpatched and
//! then patched like the injector patches functions: a trampoline with
//! `Snippet::CountCall`, with `Snippet::CountCallHookExit` (called through
//! the runtime's call records, returning through the exit handler) without
//! timers, and with timers reading the clocks as the injector sets them up
//! (`rdtsc` inline, the CPU clock's anchor inline, the runtime's slow path
//! `weft_rt_cpu_ticks` after a context switch). `call/cpu_syscall` forces
//! the CPU clock's syscall fallback to show what the anchor saves;
//! `call/rdtsc_pair` is two back-to-back `rdtsc`s, the floor of any timer
//! that reads the TSC at both ends. `call/wall_histogram` is `call/wall`
//! with a latency histogram.
//!
//! `sample/*`: ns per sample of one function's timer while it runs (the
//! benchmark itself runs inside a hooked, timed function): the seqlock copy
//! and value (`read_timer_words` + `timer_value`), the outside CPU time
//! read (`thread_cpu_ns_from_outside`, a `/proc/.../schedstat` read), and
//! the two with a wall clock read, as a sampler does per thread.
//!
//! The bare clock readers are in `rt/benches/clock.rs`, not repeated here.
//! The lab (an RWX area, a thread row reached through a TLS word, the
//! runtime's call records) is the execution tests' `tests/common/lab.rs`.
//!
//! Run: `cargo bench -p weft-codegen --bench timers` (about 15 s).

#[path = "../tests/common/lab.rs"]
mod lab;

use std::any::Any;
use std::hint::black_box;
use std::panic::{self, AssertUnwindSafe};
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion};
use iced_x86::code_asm::*;
use lab::*;
use weft_codegen::*;
use weft_rt::clock::{
    rdtsc, thread_cpu_ns_from_outside, thread_cputime_ns, CpuPreference, ThreadCpuClock, WallClock,
    WallPreference,
};

/// `f(x) = x + 1`.
fn increment(lab: &mut Lab) -> (u64, usize) {
    lab.assemble(|a, end| {
        a.lea(rax, qword_ptr(rdi + 1)).unwrap();
        a.ret().unwrap();
        a.set_label(end).unwrap();
    })
}

fn cpu_mode_name(c: &ThreadCpuClock) -> &'static str {
    match c.mode() {
        weft_rt::clock::CPU_PERF_TIME => "perf_time",
        weft_rt::clock::CPU_ANCHOR => "anchor",
        _ => "syscall",
    }
}

/// Benchmarks calls of `f` as `call/{name}`.
fn bench_calls(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, f: u64) {
    let f = fn1(f);
    // First touches (the cells' page, the readers' code) outside the
    // measurement.
    f(0);
    group.bench_function(name, |b| b.iter(|| f(black_box(1))));
}

fn calls(c: &mut Criterion) {
    let wall: &'static WallClock = Box::leak(Box::new(WallClock::new(WallPreference::Auto)));
    eprintln!("wall clock: {}", wall.source());
    let mut group = c.benchmark_group("call");
    group.bench_function("rdtsc_pair", |b| {
        b.iter(|| black_box(rdtsc()) ^ black_box(rdtsc()))
    });

    // Plain, entry counter and exit hook: one timer-less lab.
    {
        let mut lab = Lab::new();
        let plain = increment(&mut lab);
        let count = increment(&mut lab);
        let m_count = lab.count(count);
        let exit = increment(&mut lab);
        let m_exit = lab.hook(exit);
        let _row = install_row(lab.cells());
        bench_calls(&mut group, "plain", plain.0);
        bench_calls(&mut group, "count", count.0);
        assert!(word(m_count) > 0, "count: not counted");
        bench_calls(&mut group, "exit_hook", exit.0);
        check_exits(m_exit, "exit_hook");
    }

    // Wall timer only.
    {
        let wall_only = Timers {
            wall: true,
            cpu: false,
        };
        let mut lab = Lab::timed(timer_spec(wall_only, wall));
        let f = increment(&mut lab);
        let m = lab.hook(f);
        let _row = install_timed_row(lab.cells(), None, wall);
        bench_calls(&mut group, "wall", f.0);
        check_timed(m, "wall", false);
        // The same with a latency histogram (a `bsr` and an increment).
        let g = increment(&mut lab);
        let hooks = lab.hooks().with_histogram(true);
        let m = lab.hook_as(g, hooks);
        bench_calls(&mut group, "wall_histogram", g.0);
        check_timed(m, "wall_histogram", false);
    }

    // Wall and CPU timers: the CPU clock in its best mode here, then its
    // syscall fallback (same code, another clock state in a fresh row).
    let both = Timers {
        wall: true,
        cpu: true,
    };
    let mut lab = Lab::timed(timer_spec(both, wall));
    let f = increment(&mut lab);
    let m = lab.hook(f);
    for (name, pref) in [
        ("wall_cpu", CpuPreference::Auto),
        ("cpu_syscall", CpuPreference::Syscall),
    ] {
        let row = install_timed_row(lab.cells(), Some(pref), wall);
        let cpu = row.cpu.as_ref().unwrap();
        eprintln!("cpu clock, {} mode: {}", cpu_mode_name(cpu), cpu.source());
        bench_calls(&mut group, name, f.0);
        check_timed(m, name, true);
        let cpu = row.cpu.as_ref().unwrap();
        eprintln!(
            "{name}: cpu clock {} slow reads, {} syscalls",
            cpu.reads(),
            cpu.syscalls()
        );
    }
    group.finish();
}

/// Every measured call went through the exit hook.
fn check_exits(m: i32, name: &str) {
    let [entries, exits, unwound, unhooked] = counts(m);
    assert!(
        entries > 0 && exits == entries && unwound == 0 && unhooked == 0,
        "{name}: {:?}",
        counts(m)
    );
    assert_eq!(depth(), 0, "{name}");
}

/// ... and was timed by the selected clocks.
fn check_timed(m: i32, name: &str, cpu: bool) {
    check_exits(m, name);
    let (wall_total, cpu_total, nesting) = totals(m);
    assert!(wall_total > 0, "{name}: no wall time");
    assert_eq!(cpu_total > 0, cpu, "{name}: cpu time {cpu_total}");
    assert_eq!(nesting, 0, "{name}");
}

/// What `run_inside` runs, and a panic it caught.
struct Inside<'a> {
    body: &'a mut dyn FnMut(),
    panic: Option<Box<dyn Any + Send>>,
}

/// The hooked wrapper's callee: runs the body of the `Inside` that `ctx`
/// points to, inside the wrapper's timed activation. A panic is caught and
/// handed back (the lab's function has no unwind information).
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
    let mut lab = Lab::timed(timer_spec(both, wall));
    let w = lab.wrapper(run_inside);
    let m = lab.hook(w);
    let _row = install_timed_row(lab.cells(), Some(CpuPreference::Auto), wall);
    let row = my_row();
    let q32 = wall.units().ns_per_tick_q32;
    let (pid, tid) = (std::process::id(), {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        u32::try_from(tid).unwrap()
    });
    let words = || read_timer_words(|off| load(row, m + off as i32), 1000).expect("seqlock stuck");

    while_timed(w.0, &mut || {
        // The wrapper's timer is running: the words are those a sampler
        // sees for a function in progress.
        // (The thread's own CPU clock, not schedstat, which lags by the
        // current run's unaccounted part and can still be below the start.)
        let (wall_now, cpu_now) = (wall.raw(), Some(thread_cputime_ns()));
        let v = timer_value(&words(), wall_now, cpu_now, q32);
        assert!(v.running && v.wall_ns > 0 && v.cpu_ns > 0, "{v:?}");

        let mut group = c.benchmark_group("sample");
        // The seqlock copy and the value, the clocks given (read above).
        group.bench_function("timer_words", |b| {
            b.iter(|| timer_value(&words(), black_box(wall_now), black_box(cpu_now), q32))
        });
        // The thread's CPU time as another process reads it.
        group.bench_function("schedstat", |b| {
            b.iter(|| thread_cpu_ns_from_outside(black_box(pid), black_box(tid)).unwrap())
        });
        // One whole sample of one thread's timer: both clocks, then the
        // words (the order `timer_value` asks for).
        group.bench_function("full", |b| {
            b.iter(|| {
                let wall_now = wall.raw();
                let cpu_now = thread_cpu_ns_from_outside(pid, tid).ok();
                timer_value(&words(), wall_now, cpu_now, q32)
            })
        });
        group.finish();
    });
    check_timed(m, "sample", true);
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
