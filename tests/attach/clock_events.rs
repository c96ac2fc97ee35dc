//! A thread's CPU clock must notice its context switches. Where weft may
//! load BPF it reads a CPU-time table a `sched_switch` program writes (the
//! target maps it: `anon_inode:bpf-map`); elsewhere (and with
//! `WEFT_CPU_CLOCK=perf`) each thread has a perf event, which the kernel
//! switches out and in with the thread at every context switch for the
//! rest of its life (2.4 µs a switch on a KVM guest, measured: two threads
//! passing a turn on one CPU took 8.2 µs a round alone and 12.5 µs after
//! a `-m calls` attach, detached or not). Either is made only while a CPU
//! timer is installed: a session that counts, or times wall time alone,
//! leaves the threads' switches as they were. The last session out lets
//! them go; a later session that times CPU gives them back. The events
//! are seen where the kernel shows their pages: the target's mappings
//! named `[perf_event]`.

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

/// The target's mappings of perf event pages, and of BPF maps (the
/// CPU-time table).
fn clock_maps(pid: u32) -> (usize, usize) {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let count = |name: &str| maps.lines().filter(|l| l.ends_with(name)).count();
    (count("[perf_event]"), count("anon_inode:bpf-map"))
}

/// Which CPU clock a test asks weft for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Clock {
    /// `WEFT_CPU_CLOCK=table`: the CPU-time table where BPF is permitted.
    Table,
    /// The default: a perf event per thread (`WEFT_CPU_CLOCK=perf` too).
    Perf,
}

impl Clock {
    fn env(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Clock::Table => &[("WEFT_CPU_CLOCK", "table")],
            Clock::Perf => &[("WEFT_CPU_CLOCK", "perf")],
        }
    }

    /// The perf event pages and table mappings a session timing CPU on
    /// `threads` threads must show, by the clock its report names.
    fn expected(self, ctx: &Ctx, threads: usize, named: &str) -> (usize, usize) {
        if named.contains("sched_switch table") {
            ctx.check(self == Clock::Table, || {
                format!("{self:?} asked, the report says {named}")
            });
            (0, 1)
        } else if named.contains("perf task-clock") {
            // As root weft may load BPF: the table, unless perf was asked.
            // SAFETY: geteuid cannot fail.
            let root = unsafe { libc::geteuid() } == 0;
            ctx.check(self == Clock::Perf || !root, || {
                format!("{self:?} asked as root, the report says {named}")
            });
            (threads, 0)
        } else {
            (0, 0)
        }
    }
}

/// One session on `pid` timing `function` with `metrics` over the
/// target's next phase: its JSON report, and the perf event pages seen
/// in the target while it was attached and after it detached.
fn session(
    ctx: &Ctx,
    t: &mut Proc,
    clock: Clock,
    function: &str,
    metrics: &str,
    phase: u64,
) -> (serde_json::Value, (usize, usize), (usize, usize)) {
    let (mut w, _) = attach_with_env(
        ctx,
        t.pid,
        &["-f", function, "-m", metrics, "--format", "json"],
        1,
        clock.env(),
    );
    t.send("go");
    t.expect_stdout("phase done", |l| l == format!("phase {phase} done"));
    let during = clock_maps(t.pid);
    let out = detach_with_sigint(&mut w);
    let after = clock_maps(t.pid);
    (json_report(ctx, &out), during, after)
}

#[test]
fn cpu_clocks_only_while_a_cpu_timer_is_installed_on_the_table() {
    cpu_clocks_only_while_a_cpu_timer_is_installed(Clock::Table);
}

#[test]
fn perf_events_only_while_a_cpu_timer_is_installed() {
    cpu_clocks_only_while_a_cpu_timer_is_installed(Clock::Perf);
}

fn cpu_clocks_only_while_a_cpu_timer_is_installed(clock: Clock) {
    let ctx = Ctx::new(&format!(
        "cpu_clocks_only_while_a_cpu_timer_is_installed_{clock:?}"
    ));
    // A phase more than the sessions: the workers exit after the last.
    let mut t = ctx.target(workers_c(), &["--threads", "3", "--phases", "5"]);
    t.expect_stdout("ready", |l| l.starts_with("ready "));
    for (phase, metrics) in [(1u64, "calls"), (2, "calls,wall")] {
        let (report, during, _) = session(&ctx, &mut t, clock, "work_a", metrics, phase);
        // The workers ran instrumented code (they registered).
        ctx.check(total(&report, "calls") > 0, || {
            format!("-m {metrics}: no call counted")
        });
        ctx.check(during == (0, 0), || {
            format!("-m {metrics}: (perf event pages, tables) {during:?} in the target")
        });
    }
    // Twice a session that times CPU: the threads, registered before any
    // CPU timer, get their events while it is attached, and lose them
    // when it ends.
    for phase in [3u64, 4] {
        let (report, during, after) = session(&ctx, &mut t, clock, "work_b", "calls,cpu", phase);
        let cpu = report["clocks"]["cpu"].as_str().unwrap_or("").to_string();
        // Where neither can be had the clock reads a system call instead,
        // and says so.
        let want = clock.expected(&ctx, 3, &cpu);
        ctx.check(during == want, || {
            format!(
                "session {phase}: (perf event pages, tables) {during:?} for 3 workers while attached ({cpu})"
            )
        });
        ctx.check(after == (0, 0), || {
            format!("session {phase}: (perf event pages, tables) {after:?} after weft detached")
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
    let (report, during, after) = session(&ctx, &mut u, clock, "work_a", "calls,cpu", 1);
    let cpu = report["clocks"]["cpu"].as_str().unwrap_or("").to_string();
    let want = clock.expected(&ctx, 3, &cpu);
    ctx.check(during == want && after == (0, 0), || {
        format!("(perf event pages, tables) {during:?} while attached, {after:?} after ({cpu})")
    });
    ctx.check(total(&report, "cpu_ns") > 0, || {
        format!("no CPU time read ({cpu})")
    });
    u.send("go");
    u.expect_stdout("`done`", |l| l == "done");
    u.wait_code(0);
}

/// A CPU timer no thread ever reached (the workers wait for `go`): no
/// clock was made, and what weft made for them goes all the same (a table
/// mapped with no clock on it was once left behind).
#[test]
fn an_unreached_cpu_timer_leaves_no_table_or_event() {
    let ctx = Ctx::new("an_unreached_cpu_timer_leaves_no_table_or_event");
    for clock in [Clock::Table, Clock::Perf] {
        let mut t = ctx.target(workers_c(), &["--threads", "3", "--phases", "1"]);
        t.expect_stdout("ready", |l| l.starts_with("ready "));
        // A CPU timer no thread ever reached (the workers wait for `go`):
        // no clock was made, and what weft made for them goes all the same
        // (a table mapped with no clock on it was once left behind).
        let (mut w, _) = attach_with_env(
            &ctx,
            t.pid,
            &["-f", "work_b", "-m", "calls,cpu", "--format", "json"],
            1,
            clock.env(),
        );
        let out = detach_with_sigint(&mut w);
        let bpf_fds = std::fs::read_dir(format!("/proc/{}/fd", t.pid))
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| {
                        std::fs::read_link(e.path())
                            .is_ok_and(|l| l.to_string_lossy().contains("bpf"))
                    })
                    .count()
            })
            .unwrap_or(0);
        ctx.check(clock_maps(t.pid) == (0, 0) && bpf_fds == 0, || {
            format!(
                "(perf event pages, tables) {:?} and {bpf_fds} BPF descriptors left after an \
                 unreached CPU timer: {out}",
                clock_maps(t.pid)
            )
        });
    }
}
