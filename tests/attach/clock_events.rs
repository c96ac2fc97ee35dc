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

/// Each worker's `work_b` figures from the report: (calls, CPU ns), by
/// thread id.
fn work_b_by_thread(p: &weft::Process) -> std::collections::BTreeMap<u32, (u64, u64)> {
    p.report()
        .threads
        .iter()
        .filter_map(|t| {
            let c = t.functions.get("work_b")?;
            Some((t.tid, (c.calls, c.cpu_ns.unwrap_or(0))))
        })
        .collect()
}

/// A tool that chooses each thread's CPU clock (the diagnosis does, by
/// what an event costs the thread at its switches against a system call
/// at its readings): a thread asked to let its event go does so at its
/// next reading, a later insertion does not give it one back, one paused
/// counts its calls and no CPU time until given back, and one asked for
/// an event makes it; the CPU time read stays right across each change.
#[test]
fn cpu_clocks_chosen_thread_by_thread() {
    use weft::CpuClock;
    let ctx = Ctx::new("cpu_clocks_chosen_thread_by_thread");
    let mut t = ctx.target(workers_c(), &["--threads", "3", "--phases", "7"]);
    t.expect_stdout("ready", |l| l.starts_with("ready "));
    let mut p = weft::Process::open(t.pid as i32).expect("open the target");
    p.choose_cpu_clocks(true);
    let find = |p: &mut weft::Process, name: &str| {
        let mut held = p.hold().expect("hold");
        let f = held
            .find_functions(&[weft::Pattern::parse(name).unwrap()])
            .expect("find the function");
        let ids = held.insert(&f, weft::Metrics::ALL).expect("time it");
        held.release().expect("release");
        ids
    };
    let mut ids = find(&mut p, "work_b");
    let phase = |t: &mut Proc, n: u64| {
        t.send("go");
        t.expect_stdout("phase done", |l| l == format!("phase {n} done"));
    };
    // work_b is a few instructions: a reading charged a stop, or a stale
    // anchor across a change, would put ms into its CPU time.
    let mut before = work_b_by_thread(&p);
    // Each thread's (calls, CPU ns) in the phase, checked.
    let mut check_phase = |p: &weft::Process, what: &str| {
        let now = work_b_by_thread(p);
        let mut phase = std::collections::BTreeMap::new();
        for (tid, (calls, cpu)) in &now {
            let (c0, t0) = before.get(tid).copied().unwrap_or((0, 0));
            let (calls, cpu) = (calls - c0, cpu - t0);
            ctx.check(calls > 0 && cpu / calls < 5_000, || {
                format!("{what}: thread {tid}: {calls} calls, {cpu} ns of CPU")
            });
            phase.insert(*tid, (calls, cpu));
        }
        before = now;
        phase
    };
    // The workers register in phase 1, each with its event.
    phase(&mut t, 1);
    let clocks = p.cpu_clocks();
    let workers: Vec<weft::Tid> = clocks.iter().map(|c| c.0).collect();
    ctx.check(
        workers.len() == 3 && clocks.iter().all(|c| c.1 == CpuClock::Event),
        || format!("clocks after phase 1: {clocks:?}"),
    );
    ctx.check(clock_maps(t.pid).0 == 3, || {
        format!("perf event pages of 3 workers: {:?}", clock_maps(t.pid))
    });
    check_phase(&p, "phase 1, events");
    let first = workers[0];
    ctx.check(p.set_cpu_clock(first, false).expect("ask to drop"), || {
        "the first worker's event was not asked to go".into()
    });
    ctx.check(!p.set_cpu_clock(first, false).expect("ask again"), || {
        "a clock asked twice".into()
    });
    phase(&mut t, 2);
    let clocks = p.cpu_clocks();
    let of =
        |clocks: &[(weft::Tid, CpuClock)], tid| clocks.iter().find(|c| c.0 == tid).map(|c| c.1);
    ctx.check(
        of(&clocks, first) == Some(CpuClock::SystemCall)
            && workers[1..]
                .iter()
                .all(|&w| of(&clocks, w) == Some(CpuClock::Event)),
        || format!("clocks after phase 2: {clocks:?}"),
    );
    ctx.check(clock_maps(t.pid).0 == 2, || {
        format!(
            "perf event pages with one event let go: {:?}",
            clock_maps(t.pid)
        )
    });
    check_phase(&p, "phase 2, one event let go");
    // Another CPU timer: the clock let go stays as it is.
    ids.extend(find(&mut p, "work_a"));
    phase(&mut t, 3);
    let clocks = p.cpu_clocks();
    ctx.check(of(&clocks, first) == Some(CpuClock::SystemCall), || {
        format!("clocks after an insertion: {clocks:?}")
    });
    check_phase(&p, "phase 3, after an insertion");
    // Paused, the first worker's timers count its calls and no CPU time;
    // a clock with an event is not paused.
    ctx.check(p.pause_cpu_clock(first, true).expect("pause"), || {
        "the first worker's clock was not paused".into()
    });
    ctx.check(!p.pause_cpu_clock(workers[1], true).expect("pause"), || {
        "a clock with an event was paused".into()
    });
    phase(&mut t, 4);
    let clocks = p.cpu_clocks();
    ctx.check(of(&clocks, first) == Some(CpuClock::Paused), || {
        format!("clocks after a pause: {clocks:?}")
    });
    let paused = check_phase(&p, "phase 4, one clock paused");
    ctx.check(
        paused
            .iter()
            .all(|(&tid, &(calls, cpu))| calls > 0 && (cpu == 0) == (tid as weft::Tid == first)),
        || format!("(calls, CPU ns) with the first worker's clock paused: {paused:?}"),
    );
    ctx.check(p.pause_cpu_clock(first, false).expect("resume"), || {
        "the first worker's clock was not given back".into()
    });
    phase(&mut t, 5);
    let clocks = p.cpu_clocks();
    ctx.check(of(&clocks, first) == Some(CpuClock::SystemCall), || {
        format!("clocks after the pause: {clocks:?}")
    });
    let resumed = check_phase(&p, "phase 5, the clock given back");
    ctx.check(resumed.values().all(|&(_, cpu)| cpu > 0), || {
        format!("(calls, CPU ns) with the clock given back: {resumed:?}")
    });
    ctx.check(
        p.set_cpu_clock(first, true).expect("ask for an event"),
        || "the first worker's clock was not asked for an event".into(),
    );
    phase(&mut t, 6);
    let clocks = p.cpu_clocks();
    ctx.check(clocks.iter().all(|c| c.1 == CpuClock::Event), || {
        format!("clocks after phase 6: {clocks:?}")
    });
    ctx.check(clock_maps(t.pid).0 == 3, || {
        format!(
            "perf event pages with the event back: {:?}",
            clock_maps(t.pid)
        )
    });
    check_phase(&p, "phase 6, the event back");
    p.choose_cpu_clocks(false);
    let mut held = p.hold().expect("hold");
    held.remove(&ids).expect("remove");
    held.release().expect("release");
    drop(p);
    ctx.check(clock_maps(t.pid) == (0, 0), || {
        format!("clock mappings after the detach: {:?}", clock_maps(t.pid))
    });
    t.send("go");
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
}
