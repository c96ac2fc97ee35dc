//! Several weft sessions on one target: at the same time, on the same
//! functions, and after a weft was killed while its probes were live. The
//! target owns its instrumentation state (the runtime's shared region), so
//! each session sees exactly what is in place: each counts exactly its own
//! window, none corrupts another's, and whatever a dead one left is taken
//! out by the next.

mod support;

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

/// Sharing needs the metrics the live probe measures: asking for more is
/// refused with the reason, and the first session is unharmed.
#[test]
fn a_session_asking_more_than_a_live_probe_measures_is_refused() {
    let ctx = Ctx::new("a_session_asking_more_than_a_live_probe_measures_is_refused");
    let mut t = ctx.target(workers_c(), &["--threads", "2", "--phases", "1"]);
    let (pid, _) = wait_ready(&mut t);
    let mut a = attach_with(&ctx, pid, &["work_a"], "calls");
    let p = pid.to_string();
    let mut b = ctx.weft(&["attach", "-p", &p, "-f", "work_a", "-m", "calls,wall"]);
    let (_, err) = expect_weft_error(&mut b);
    ctx.check(
        err.contains("another weft") && err.contains("-m calls"),
        || format!("the refusal should name the other weft and the metrics: {err}"),
    );
    run_phase(&ctx, &mut t, 1, 2);
    finish(&mut t);
    // A ends with the target.
    a.wait_code(0);
    let a_report = parse_report(&ctx, &a.stdout_text());
    check_report_counts(
        &ctx,
        &a_report,
        &expected(&ctx, &t.stdout_text(), &[1], &["work_a"]),
        &["work_a"],
    );
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
