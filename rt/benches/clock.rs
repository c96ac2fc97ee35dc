//! Cost of one read of each clock source (ns per read). Per-thread state
//! is created on the benchmark thread, which is the one reading it.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use std::time::Duration;
use weft_rt::clock::*;

fn clocks(c: &mut Criterion) {
    let wall = WallClock::new(WallPreference::Auto);
    let mono = WallClock::new(WallPreference::Monotonic);
    eprintln!("wall source: {}", wall.source());
    let mut group = c.benchmark_group("clock");
    group.bench_function("rdtsc", |b| b.iter(rdtsc));
    group.bench_function("wall_now/rust", |b| b.iter(|| black_box(&wall).now()));
    group.bench_function("wall_now/asm", |b| b.iter(|| black_box(&wall).now_asm()));
    group.bench_function("wall_now/asm_monotonic_syscall", |b| {
        b.iter(|| black_box(&mono).now_asm())
    });
    group.bench_function("clock_gettime/MONOTONIC", |b| b.iter(monotonic_ns));
    group.bench_function("clock_gettime/THREAD_CPUTIME_ID", |b| {
        b.iter(thread_cputime_ns)
    });
    for preference in [
        CpuPreference::PerfTime,
        CpuPreference::Anchor,
        CpuPreference::Syscall,
    ] {
        let mut cpu = ThreadCpuClock::new(&wall, preference);
        if preference == CpuPreference::PerfTime && cpu.mode() != CPU_PERF_TIME {
            eprintln!("cap_user_time not offered here: no perf-time bench");
            continue;
        }
        let name = match cpu.mode() {
            CPU_PERF_TIME => "perf_time",
            CPU_ANCHOR => "anchor",
            _ => "syscall",
        };
        eprintln!("cpu {name}: {}", cpu.source());
        group.bench_function(format!("cpu_now/{name}/rust"), |b| b.iter(|| cpu.now()));
        group.bench_function(format!("cpu_now/{name}/asm"), |b| b.iter(|| cpu.now_asm()));
        eprintln!(
            "cpu {name}: {} reads, {} syscalls",
            cpu.reads(),
            cpu.syscalls()
        );
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    targets = clocks
}
criterion_main!(benches);
