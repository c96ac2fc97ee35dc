//! A thread's CPU clock is a perf event, which the kernel switches out
//! and in with the thread at every context switch for the rest of its
//! life (2.4 µs a switch on a KVM guest, measured: two threads passing a
//! turn on one CPU took 8.2 µs a round alone and 12.5 µs after a
//! `-m calls` attach, detached or not). The runtime makes one only for a
//! thread that registers while a CPU timer is installed: a session that
//! counts, or times wall time alone, leaves the threads' switches as they
//! were. The last session out lets the events go; a later session that
//! times CPU gives them back. The events are seen where the kernel shows
//! their pages: the target's mappings named `[perf_event]`.

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

/// One session on `pid` timing `function` with `metrics` over the
/// target's next phase: its JSON report, and the perf event pages seen
/// in the target while it was attached and after it detached.
fn session(
    ctx: &Ctx,
    t: &mut Proc,
    function: &str,
    metrics: &str,
    phase: u64,
) -> (serde_json::Value, usize, usize) {
    let (mut w, _) = attach(
        ctx,
        t.pid,
        &["-f", function, "-m", metrics, "--format", "json"],
        1,
    );
    t.send("go");
    t.expect_stdout("phase done", |l| l == format!("phase {phase} done"));
    let during = perf_event_maps(t.pid);
    let out = detach_with_sigint(&mut w);
    let after = perf_event_maps(t.pid);
    (json_report(ctx, &out), during, after)
}

#[test]
fn perf_events_only_while_a_cpu_timer_is_installed() {
    let ctx = Ctx::new("perf_events_only_while_a_cpu_timer_is_installed");
    // A phase more than the sessions: the workers exit after the last.
    let mut t = ctx.target(workers_c(), &["--threads", "3", "--phases", "5"]);
    t.expect_stdout("ready", |l| l.starts_with("ready "));
    for (phase, metrics) in [(1u64, "calls"), (2, "calls,wall")] {
        let (report, during, _) = session(&ctx, &mut t, "work_a", metrics, phase);
        // The workers ran instrumented code (they registered).
        ctx.check(total(&report, "calls") > 0, || {
            format!("-m {metrics}: no call counted")
        });
        ctx.check(during == 0, || {
            format!("-m {metrics}: {during} perf event pages in the target")
        });
    }
    // Twice a session that times CPU: the threads, registered before any
    // CPU timer, get their events while it is attached, and lose them
    // when it ends.
    for phase in [3u64, 4] {
        let (report, during, after) = session(&ctx, &mut t, "work_b", "calls,cpu", phase);
        let cpu = report["clocks"]["cpu"].as_str().unwrap_or("").to_string();
        // Where perf events cannot be opened the clock reads a system
        // call instead, and says so.
        let want = if cpu.contains("perf task-clock") {
            3
        } else {
            0
        };
        ctx.check(during == want, || {
            format!(
                "session {phase}: {during} perf event pages for 3 workers while attached ({cpu})"
            )
        });
        ctx.check(after == 0, || {
            format!("session {phase}: {after} perf event pages after weft detached")
        });
        ctx.check(total(&report, "cpu_ns") > 0, || {
            format!("session {phase}: no CPU time read ({cpu})")
        });
        // work_b is a few instructions: a clock given its event in a stop
        // and read with a stale anchor would charge it the stop (ms).
        let per_call = total(&report, "cpu_ns") / total(&report, "calls").max(1);
        ctx.check(per_call < 2_000, || {
            format!("session {phase}: work_b took {per_call} ns of CPU a call ({cpu})")
        });
    }
    t.send("go");
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);

    // Threads that register under a CPU timer get their events at once.
    let mut u = ctx.target(workers_c(), &["--threads", "3", "--phases", "2"]);
    u.expect_stdout("ready", |l| l.starts_with("ready "));
    let (report, during, after) = session(&ctx, &mut u, "work_a", "calls,cpu", 1);
    let cpu = report["clocks"]["cpu"].as_str().unwrap_or("").to_string();
    let want = if cpu.contains("perf task-clock") {
        3
    } else {
        0
    };
    ctx.check(during == want && after == 0, || {
        format!("{during} perf event pages while attached, {after} after ({cpu})")
    });
    u.send("go");
    u.expect_stdout("`done`", |l| l == "done");
    u.wait_code(0);
}
