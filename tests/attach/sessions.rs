//! Several weft sessions on one target: at the same time, on the same
//! functions, and after a weft was killed while its probes were live. The
//! target owns its instrumentation state (the runtime's shared region), so
//! each session sees exactly what is in place: each counts exactly its own
//! window, none corrupts another's, and whatever a dead one left is taken
//! out by the next.

use crate::support;

use nix::sys::signal::Signal;
use support::*;

/// Expected counts of `phases` for `funcs`, from the target's own lines.
fn expected(
    ctx: &Ctx,
    text: &str,
    phases: &[u64],
    funcs: &[&str],
) -> std::collections::BTreeMap<i64, ExpThread> {
    let lines: Vec<WorkerLine> = worker_lines(ctx, text)
        .into_iter()
        .filter(|l| phases.contains(&l.phase))
        .collect();
    expect_from_workers(&lines, funcs)
}

/// Runs phase `p` of a workers target with `threads` workers and checks the
/// target's own results.
fn run_phase(ctx: &Ctx, t: &mut Proc, p: u64, threads: u64) {
    t.send("go");
    t.expect_stdout("phase done", |l| l == format!("phase {p} done"));
    check_worker_phase(ctx, &t.stdout_text(), p, threads);
}

/// The target after its last phase: it prints `done` and exits 0.
fn finish(t: &mut Proc) {
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
}

fn json(funcs: &[&str], metrics: &str) -> Vec<String> {
    let mut args = Vec::new();
    for f in funcs {
        args.push("-f".to_string());
        args.push(f.to_string());
    }
    args.extend([
        "-m".into(),
        metrics.into(),
        "--format".into(),
        "json".into(),
    ]);
    args
}

fn attach_with(ctx: &Ctx, pid: u32, funcs: &[&str], metrics: &str) -> Proc {
    let args = json(funcs, metrics);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    attach(ctx, pid, &args, funcs.len() as u32).0
}

/// (a) and (b): A lives; B attaches to other functions and to one of A's;
/// each report holds exactly the calls made while it was attached.
#[test]
fn overlapping_sessions_each_count_exactly_their_own_window() {
    let ctx = Ctx::new("overlapping_sessions_each_count_exactly_their_own_window");
    let mut t = ctx.target(workers_c(), &["--threads", "4", "--phases", "4"]);
    let (pid, _) = wait_ready(&mut t);
    let a_funcs = ["work_a", "work_b"];
    let b_funcs = ["work_b", "lib_work"];
    let mut a = attach_with(&ctx, pid, &a_funcs, "calls,wall,cpu");
    run_phase(&ctx, &mut t, 1, 4);
    // B shares A's probe on work_b and has its own on lib_work.
    let mut b = attach_with(&ctx, pid, &b_funcs, "calls,wall");
    run_phase(&ctx, &mut t, 2, 4);
    let b_report = parse_report(&ctx, &detach_with_sigint(&mut b));
    run_phase(&ctx, &mut t, 3, 4);
    let a_report = parse_report(&ctx, &detach_with_sigint(&mut a));
    run_phase(&ctx, &mut t, 4, 4);
    finish(&mut t);
    let text = t.stdout_text();
    check_report_counts(
        &ctx,
        &b_report,
        &expected(&ctx, &text, &[2], &b_funcs),
        &b_funcs,
    );
    check_report_counts(
        &ctx,
        &a_report,
        &expected(&ctx, &text, &[1, 2, 3], &a_funcs),
        &a_funcs,
    );
    check_exit_balance(&ctx, &a_report);
    check_exit_balance(&ctx, &b_report);
}

/// (b), the other order: B's shared probe outlives A, which removed its
/// share first; then B alone, then nothing left in place.
#[test]
fn a_shared_probe_outlives_the_session_that_put_it_in() {
    let ctx = Ctx::new("a_shared_probe_outlives_the_session_that_put_it_in");
    let mut t = ctx.target(workers_c(), &["--threads", "3", "--phases", "5"]);
    let (pid, _) = wait_ready(&mut t);
    let funcs = ["work_a"];
    let mut a = attach_with(&ctx, pid, &funcs, "calls");
    run_phase(&ctx, &mut t, 1, 3);
    let mut b = attach_with(&ctx, pid, &funcs, "calls");
    run_phase(&ctx, &mut t, 2, 3);
    let a_report = parse_report(&ctx, &detach_with_sigint(&mut a));
    run_phase(&ctx, &mut t, 3, 3);
    let b_report = parse_report(&ctx, &detach_with_sigint(&mut b));
    // Nothing of either is left: a third session counts from zero, once.
    let mut c = attach_with(&ctx, pid, &funcs, "calls");
    run_phase(&ctx, &mut t, 4, 3);
    let c_report = parse_report(&ctx, &detach_with_sigint(&mut c));
    run_phase(&ctx, &mut t, 5, 3);
    finish(&mut t);
    let text = t.stdout_text();
    check_report_counts(
        &ctx,
        &a_report,
        &expected(&ctx, &text, &[1, 2], &funcs),
        &funcs,
    );
    check_report_counts(
        &ctx,
        &b_report,
        &expected(&ctx, &text, &[2, 3], &funcs),
        &funcs,
    );
    check_report_counts(
        &ctx,
        &c_report,
        &expected(&ctx, &text, &[4], &funcs),
        &funcs,
    );
}

/// `work_a`'s code after every tool left is as compiled.
fn check_as_compiled(ctx: &Ctx, after: &[u8], compiled: &[u8]) {
    ctx.check(after == compiled, || {
        format!("work_a's code after every tool left: {after:02x?}, as compiled: {compiled:02x?}")
    });
}

/// A tool that times a leaf reports self time equal to wall time, whatever
/// other tools measure in the same function (their trampolines run inside
/// its activation but are not calls of timed functions).
fn check_self_time_of_leaf(ctx: &Ctx, report: &Report, f: &str, who: &str) {
    let Some(func) = report.function(f) else {
        ctx.check(false, || format!("{who}: no {f} in its report"));
        return;
    };
    let (Some(wall), Some(own)) = (func.wall_ns, func.self_ns) else {
        ctx.check(false, || {
            format!("{who}: {f} has no wall or self time: {func:?}")
        });
        return;
    };
    ctx.check(own <= wall && own * 100 >= wall * 99, || {
        format!("{who}: {f} is a leaf: its self time {own} ns should be its wall time {wall} ns")
    });
}

/// Per thread, the calls of `f` a Chrome trace holds (its begin events).
fn traced_calls(path: &std::path::Path, f: &str) -> std::collections::BTreeMap<i64, u64> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let trace: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{}: not a Chrome trace ({e}): {text:.300}", path.display()));
    let mut calls = std::collections::BTreeMap::new();
    for e in trace["traceEvents"].as_array().into_iter().flatten() {
        if e["ph"] == "B" && e["name"] == f {
            *calls.entry(e["tid"].as_i64().unwrap_or(-1)).or_insert(0) += 1;
        }
    }
    calls
}

/// The target's own count of `f` per thread in `phases`.
fn made(ctx: &Ctx, text: &str, phases: &[u64], f: &str) -> std::collections::BTreeMap<i64, u64> {
    expected(ctx, text, phases, &[f])
        .into_iter()
        .map(|(tid, e)| (tid, e.calls.get(f).copied().unwrap_or(0)))
        .filter(|&(_, n)| n > 0)
        .collect()
}

/// Several tools on one function, each with the metrics it asked for: A
/// counts; B times it (its own probe over A's); B leaves; C traces it; D
/// times it over C; all leave. Each counts exactly the calls made while it
/// was there, B's and D's self time of the leaf is its wall time, C's trace
/// holds every call, and the code is as compiled at the end.
#[test]
fn several_tools_measure_one_function_each_exactly() {
    let ctx = Ctx::new("several_tools_measure_one_function_each_exactly");
    let mut t = ctx.target(workers_c(), &["--threads", "4", "--phases", "8"]);
    let (pid, _) = wait_ready(&mut t);
    let f = ["work_a"];
    let at = address_of(&ctx, pid, "work_a");
    let compiled = code_at(pid, at);
    let mut a = attach_with(&ctx, pid, &f, "calls");
    run_phase(&ctx, &mut t, 1, 4);
    let mut b = attach_with(&ctx, pid, &f, "calls,wall,cpu");
    run_phase(&ctx, &mut t, 2, 4);
    let b_report = parse_report(&ctx, &detach_with_sigint(&mut b));
    run_phase(&ctx, &mut t, 3, 4);
    let trace = scratch_dir("several_tools_measure_one_function_each_exactly").join("c.json");
    let out = trace.to_str().expect("a UTF-8 path");
    let (mut c, _) = attach(
        &ctx,
        pid,
        &[
            "-f",
            "work_a",
            "-m",
            "calls,trace",
            "--format",
            "chrome-trace",
            "-o",
            out,
        ],
        1,
    );
    run_phase(&ctx, &mut t, 4, 4);
    let mut d = attach_with(&ctx, pid, &f, "calls,wall");
    run_phase(&ctx, &mut t, 5, 4);
    let d_report = parse_report(&ctx, &detach_with_sigint(&mut d));
    detach_with_sigint(&mut c);
    let a_report = parse_report(&ctx, &detach_with_sigint(&mut a));
    run_phase(&ctx, &mut t, 6, 4);
    // Nothing of any is left: a last tool counts from zero, once.
    let after = code_at(pid, at);
    let mut e = attach_with(&ctx, pid, &f, "calls");
    run_phase(&ctx, &mut t, 7, 4);
    let e_report = parse_report(&ctx, &detach_with_sigint(&mut e));
    // The target's last phase ends it: after every weft is gone.
    run_phase(&ctx, &mut t, 8, 4);
    finish(&mut t);
    let text = t.stdout_text();
    check_report_counts(
        &ctx,
        &a_report,
        &expected(&ctx, &text, &[1, 2, 3, 4, 5], &f),
        &f,
    );
    check_report_counts(&ctx, &b_report, &expected(&ctx, &text, &[2], &f), &f);
    check_report_counts(&ctx, &d_report, &expected(&ctx, &text, &[5], &f), &f);
    check_report_counts(&ctx, &e_report, &expected(&ctx, &text, &[7], &f), &f);
    for (r, who) in [(&b_report, "B"), (&d_report, "D")] {
        check_exit_balance(&ctx, r);
        check_self_time_of_leaf(&ctx, r, "work_a", who);
        ctx.check(
            r.function("work_a").and_then(|w| w.wall_ns).unwrap_or(0) > 0,
            || format!("{who} timed no wall time"),
        );
    }
    ctx.check(
        b_report
            .function("work_a")
            .and_then(|w| w.cpu_ns)
            .unwrap_or(0)
            > 0,
        || "B timed no CPU time".into(),
    );
    let traced = traced_calls(&trace, "work_a");
    let want = made(&ctx, &text, &[4, 5], "work_a");
    ctx.check(traced == want, || {
        format!("C's trace holds {traced:?} calls of work_a per thread, the target made {want:?}")
    });
    check_as_compiled(&ctx, &after, &compiled);
}

/// A tool leaving while another's probe is over its own: its probe passes
/// calls on from then (bypassed), the other goes on exactly, and once that
/// one leaves too the code is as compiled. Both time the leaf: each one's
/// self time is its wall time, the other's probe inside its activation
/// notwithstanding.
#[test]
fn a_tool_leaving_under_another_leaves_it_exact() {
    let ctx = Ctx::new("a_tool_leaving_under_another_leaves_it_exact");
    let mut t = ctx.target(workers_c(), &["--threads", "3", "--phases", "5"]);
    let (pid, _) = wait_ready(&mut t);
    let f = ["work_a"];
    let at = address_of(&ctx, pid, "work_a");
    let compiled = code_at(pid, at);
    let mut a = attach_with(&ctx, pid, &f, "calls,wall");
    run_phase(&ctx, &mut t, 1, 3);
    let mut b = attach_with(&ctx, pid, &f, "calls,wall,cpu");
    run_phase(&ctx, &mut t, 2, 3);
    let a_report = parse_report(&ctx, &detach_with_sigint(&mut a));
    run_phase(&ctx, &mut t, 3, 3);
    let b_report = parse_report(&ctx, &detach_with_sigint(&mut b));
    let after = code_at(pid, at);
    let mut c = attach_with(&ctx, pid, &f, "calls");
    run_phase(&ctx, &mut t, 4, 3);
    let c_report = parse_report(&ctx, &detach_with_sigint(&mut c));
    run_phase(&ctx, &mut t, 5, 3);
    finish(&mut t);
    let text = t.stdout_text();
    check_report_counts(&ctx, &a_report, &expected(&ctx, &text, &[1, 2], &f), &f);
    check_report_counts(&ctx, &b_report, &expected(&ctx, &text, &[2, 3], &f), &f);
    check_report_counts(&ctx, &c_report, &expected(&ctx, &text, &[4], &f), &f);
    for (r, who) in [(&a_report, "A"), (&b_report, "B")] {
        check_exit_balance(&ctx, r);
        check_self_time_of_leaf(&ctx, r, "work_a", who);
    }
    check_as_compiled(&ctx, &after, &compiled);
}

/// One tool on a target, as [`random_overlapping_tools_stay_exact`] runs it.
struct Tool {
    weft: Proc,
    metrics: &'static str,
    first_phase: u64,
    trace: Option<std::path::PathBuf>,
}

/// Up to three tools at once on one function with random metrics (at most
/// one tracing), each arriving, leaving or SIGKILLed at random between
/// phases: every tool that leaves normally counts exactly the calls made
/// while it was there (a trace holds each of them), a timing one's self
/// time of the leaf is its wall time, and at the end the code is as
/// compiled and a last tool counts exactly.
#[test]
fn random_overlapping_tools_stay_exact() {
    let ctx = Ctx::new("random_overlapping_tools_stay_exact");
    let name = "random_overlapping_tools_stay_exact";
    let rounds = 40u64;
    let phases = (rounds + 2).to_string();
    let mut t = ctx.target(workers_c(), &["--threads", "3", "--phases", &phases]);
    let (pid, _) = wait_ready(&mut t);
    let f = ["work_a"];
    let at = address_of(&ctx, pid, "work_a");
    let compiled = code_at(pid, at);
    let choices = [
        "calls",
        "calls,wall",
        "calls,cpu",
        "calls,wall,cpu",
        "calls,trace",
        "calls,wall,trace",
    ];
    let mut rng = Rng::new(0x7001_5eed);
    let mut live: Vec<Tool> = Vec::new();
    let (mut checked, mut killed, mut traces) = (0, 0, 0);
    let end = |ctx: &Ctx, tool: &mut Tool, text: &str, last_phase: u64| {
        let out = detach_with_sigint(&mut tool.weft);
        let window: Vec<u64> = (tool.first_phase..=last_phase).collect();
        match &tool.trace {
            Some(path) => {
                let traced = traced_calls(path, "work_a");
                let want = made(ctx, text, &window, "work_a");
                ctx.check(traced == want, || {
                    format!("a trace over phases {window:?} holds {traced:?} calls, the target made {want:?}")
                });
            }
            None => {
                let report = parse_report(ctx, &out);
                check_report_counts(ctx, &report, &expected(ctx, text, &window, &f), &f);
                check_exit_balance(ctx, &report);
                if tool.metrics.contains("wall") {
                    check_self_time_of_leaf(ctx, &report, "work_a", tool.metrics);
                }
            }
        }
    };
    for round in 1..=rounds {
        // Leave (once three are there, or at random), then arrive: every
        // phase runs with at least one tool there.
        if live.len() == 3 || (!live.is_empty() && rng.below(2) == 0) {
            let mut tool = live.remove(rng.below(live.len() as u64) as usize);
            if rng.below(3) == 0 {
                tool.weft.signal(Signal::SIGKILL);
                tool.weft.wait_exit();
                killed += 1;
            } else {
                end(&ctx, &mut tool, &t.stdout_text(), round - 1);
                checked += 1;
                traces += usize::from(tool.trace.is_some());
            }
        }
        let tracing = live.iter().any(|t| t.trace.is_some());
        let metrics = loop {
            let m = choices[rng.below(choices.len() as u64) as usize];
            if !(tracing && m.contains("trace")) {
                break m;
            }
        };
        let trace = metrics
            .contains("trace")
            .then(|| scratch_dir(name).join(format!("trace-{round}.json")));
        let weft = match &trace {
            Some(path) => {
                let out = path.to_str().expect("a UTF-8 path");
                let args = [
                    "-f",
                    "work_a",
                    "-m",
                    metrics,
                    "--format",
                    "chrome-trace",
                    "-o",
                    out,
                ];
                attach(&ctx, pid, &args, 1).0
            }
            None => attach_with(&ctx, pid, &f, metrics),
        };
        live.push(Tool {
            weft,
            metrics,
            first_phase: round,
            trace,
        });
        run_phase(&ctx, &mut t, round, 3);
    }
    for mut tool in live.drain(..) {
        end(&ctx, &mut tool, &t.stdout_text(), rounds);
        checked += 1;
        traces += usize::from(tool.trace.is_some());
    }
    let after = code_at(pid, at);
    let mut last = attach_with(&ctx, pid, &f, "calls");
    run_phase(&ctx, &mut t, rounds + 1, 3);
    let report = parse_report(&ctx, &detach_with_sigint(&mut last));
    run_phase(&ctx, &mut t, rounds + 2, 3);
    finish(&mut t);
    check_report_counts(
        &ctx,
        &report,
        &expected(&ctx, &t.stdout_text(), &[rounds + 1], &f),
        &f,
    );
    check_as_compiled(&ctx, &after, &compiled);
    eprintln!("{checked} tools checked ({traces} traces), {killed} killed");
    ctx.check(checked > 4 && killed > 0 && traces > 0, || {
        format!("too few tools ended either way: {checked} checked, {killed} killed")
    });
}

/// (c): A is SIGKILLed with counters and timers live; B attaches to another
/// function: the target is unharmed, B exact, A's probes gone (a third
/// session on A's functions counts each call once).
#[test]
fn a_killed_sessions_probes_are_taken_out_by_the_next() {
    let ctx = Ctx::new("a_killed_sessions_probes_are_taken_out_by_the_next");
    let mut t = ctx.target(workers_c(), &["--threads", "4", "--phases", "5"]);
    let (pid, _) = wait_ready(&mut t);
    let mut a = attach_with(&ctx, pid, &["work_a", "work_b"], "calls,wall,cpu");
    run_phase(&ctx, &mut t, 1, 4);
    a.signal(Signal::SIGKILL);
    a.wait_exit();
    run_phase(&ctx, &mut t, 2, 4);
    let mut b = attach_with(&ctx, pid, &["lib_work"], "calls,wall");
    run_phase(&ctx, &mut t, 3, 4);
    let b_report = parse_report(&ctx, &detach_with_sigint(&mut b));
    let mut c = attach_with(&ctx, pid, &["work_a", "work_b"], "calls,wall,cpu");
    run_phase(&ctx, &mut t, 4, 4);
    let c_report = parse_report(&ctx, &detach_with_sigint(&mut c));
    run_phase(&ctx, &mut t, 5, 4);
    finish(&mut t);
    let text = t.stdout_text();
    check_report_counts(
        &ctx,
        &b_report,
        &expected(&ctx, &text, &[3], &["lib_work"]),
        &["lib_work"],
    );
    check_report_counts(
        &ctx,
        &c_report,
        &expected(&ctx, &text, &[4], &["work_a", "work_b"]),
        &["work_a", "work_b"],
    );
    check_exit_balance(&ctx, &c_report);
}

/// (d): 20 rounds of a random mix of functions and metrics, each session
/// killed or detached at random: no crash, no double count; a session that
/// ends normally has exact counts, and a final one too.
#[test]
fn random_kills_and_attaches_never_double_count() {
    let ctx = Ctx::new("random_kills_and_attaches_never_double_count");
    let rounds = 20u64;
    let phases = (rounds + 2).to_string();
    let mut t = ctx.target(workers_c(), &["--threads", "4", "--phases", &phases]);
    let (pid, _) = wait_ready(&mut t);
    let all = ["work_a", "work_b", "lib_work"];
    let metrics = ["calls", "calls,wall", "calls,wall,cpu"];
    let mut rng = Rng::new(0x5e55_1025);
    let mut checked = 0;
    for round in 1..=rounds {
        let funcs: Vec<&str> = all.iter().copied().filter(|_| rng.below(2) == 1).collect();
        let funcs = if funcs.is_empty() {
            vec![all[rng.below(3) as usize]]
        } else {
            funcs
        };
        let m = metrics[rng.below(3) as usize];
        let mut w = attach_with(&ctx, pid, &funcs, m);
        run_phase(&ctx, &mut t, round, 4);
        if rng.below(2) == 0 {
            w.signal(Signal::SIGKILL);
            w.wait_exit();
        } else {
            let report = parse_report(&ctx, &detach_with_sigint(&mut w));
            check_report_counts(
                &ctx,
                &report,
                &expected(&ctx, &t.stdout_text(), &[round], &funcs),
                &funcs,
            );
            checked += 1;
        }
    }
    let mut w = attach_with(&ctx, pid, &all, "calls,wall,cpu");
    run_phase(&ctx, &mut t, rounds + 1, 4);
    let report = parse_report(&ctx, &detach_with_sigint(&mut w));
    run_phase(&ctx, &mut t, rounds + 2, 4);
    finish(&mut t);
    check_report_counts(
        &ctx,
        &report,
        &expected(&ctx, &t.stdout_text(), &[rounds + 1], &all),
        &all,
    );
    check_exit_balance(&ctx, &report);
    ctx.check(checked > 0, || "no round ended normally".into());
}

/// Only one tracer can hold a process: wefts started at the same moment
/// wait for each other's short holds instead of failing, and each counts
/// exactly its own functions.
#[test]
fn wefts_attaching_at_the_same_moment_wait_for_each_other() {
    let ctx = Ctx::new("wefts_attaching_at_the_same_moment_wait_for_each_other");
    let mut t = ctx.target(workers_c(), &["--threads", "3", "--phases", "2"]);
    let (pid, _) = wait_ready(&mut t);
    let p = pid.to_string();
    let funcs = ["work_a", "work_b", "lib_work", "work_a"];
    let mut wefts: Vec<Proc> = funcs
        .iter()
        .map(|f| {
            ctx.weft(&[
                "attach", "-p", &p, "-f", f, "-m", "calls", "--format", "json",
            ])
        })
        .collect();
    for w in &mut wefts {
        wait_attached(w);
    }
    run_phase(&ctx, &mut t, 1, 3);
    let reports: Vec<Report> = wefts
        .iter_mut()
        .map(|w| parse_report(&ctx, &detach_with_sigint(w)))
        .collect();
    run_phase(&ctx, &mut t, 2, 3);
    finish(&mut t);
    let text = t.stdout_text();
    for (f, report) in funcs.iter().zip(&reports) {
        check_report_counts(&ctx, report, &expected(&ctx, &text, &[1], &[f]), &[f]);
    }
}
