//! A thread's CPU clock is a perf event, which the kernel switches out
//! and in with the thread at every context switch for the rest of its
//! life (2.4 µs a switch on a KVM guest, measured: two threads passing a
//! turn on one CPU took 8.2 µs a round alone and 12.5 µs after a
//! `-m calls` attach, detached or not). The runtime makes one only for a
//! thread that registers while a CPU timer is installed: a session that
//! counts, or times wall time alone, leaves the threads' switches as they
//! were. The events are seen where the kernel shows their pages: the
//! target's mappings named `[perf_event]`.

use crate::support;

use support::*;

fn json_report(ctx: &Ctx, out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| ctx.fail(format!("report not JSON: {e}: {out}")))
}

/// A report's `key` summed over its functions.
fn total(report: &serde_json::Value, key: &str) -> u64 {
    report["functions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f[key].as_u64())
        .sum()
}

/// The target's mappings of perf event pages.
fn perf_event_maps(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.ends_with("[perf_event]"))
        .count()
}

#[test]
fn counting_or_wall_timing_gives_the_threads_no_perf_event_cpu_timing_does() {
    let ctx = Ctx::new("counting_or_wall_timing_gives_the_threads_no_perf_event_cpu_timing_does");
    let mut t = ctx.target(workers_c(), &["--threads", "3", "--phases", "3"]);
    t.expect_stdout("ready", |l| l.starts_with("ready "));
    let pid = t.pid;
    for (phase, metrics) in [(1u64, "calls"), (2, "calls,wall")] {
        let (mut w, _) = attach(
            &ctx,
            pid,
            &["-f", "work_a", "-m", metrics, "--format", "json"],
            1,
        );
        t.send("go");
        t.expect_stdout("phase done", |l| l == format!("phase {phase} done"));
        let out = detach_with_sigint(&mut w);
        let report = json_report(&ctx, &out);
        let calls = total(&report, "calls");
        // The workers ran instrumented code (they registered).
        ctx.check(calls > 0, || format!("-m {metrics}: no call counted"));
        let events = perf_event_maps(pid);
        ctx.check(events == 0, || {
            format!("-m {metrics}: {events} perf event pages in the target")
        });
    }
    // A third thread set, registered under a CPU timer, gets its clocks:
    // a fresh target, since the threads above keep the clock they got.
    let mut u = ctx.target(workers_c(), &["--threads", "3", "--phases", "2"]);
    u.expect_stdout("ready", |l| l.starts_with("ready "));
    let (mut w, _) = attach(
        &ctx,
        u.pid,
        &["-f", "work_a", "-m", "calls,cpu", "--format", "json"],
        1,
    );
    u.send("go");
    u.expect_stdout("phase done", |l| l == "phase 1 done");
    let events = perf_event_maps(u.pid);
    let out = detach_with_sigint(&mut w);
    let report = json_report(&ctx, &out);
    let cpu = report["clocks"]["cpu"].as_str().unwrap_or("").to_string();
    // Where perf events cannot be opened the clock reads a system call
    // instead, and says so.
    if cpu.contains("perf task-clock") {
        ctx.check(events == 3, || {
            format!("-m calls,cpu: {events} perf event pages for 3 workers ({cpu})")
        });
    } else {
        ctx.check(events == 0, || {
            format!("{events} pages with clocks {cpu:?}")
        });
    }
    // Threads that registered without a CPU timer read one with a system
    // call, exactly, when a later session times CPU.
    let (mut w, _) = attach(
        &ctx,
        pid,
        &["-f", "work_b", "-m", "calls,cpu", "--format", "json"],
        1,
    );
    t.send("go");
    t.expect_stdout("phase done", |l| l == "phase 3 done");
    let out = detach_with_sigint(&mut w);
    let report = json_report(&ctx, &out);
    let cpu = report["clocks"]["cpu"].as_str().unwrap_or("");
    ctx.check(cpu.contains("before any CPU timer"), || {
        format!("the clock of threads registered before CPU timers: {cpu:?}")
    });
    let cpu_ns = total(&report, "cpu_ns");
    ctx.check(cpu_ns > 0, || {
        "no CPU time read with the system call".into()
    });
    ctx.check(perf_event_maps(pid) == 0, || {
        "perf event pages after a later CPU session".into()
    });
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
    u.send("go");
    u.expect_stdout("`done`", |l| l == "done");
    u.wait_code(0);
}
