//! One weft for several processes (`-p A,B`, `--pid-of NAME`): each
//! process instrumented with the same patterns and reported on its own,
//! exactly as the target counts its own calls, and the totals the sum of
//! them; a process that exits during the session is reported as exited,
//! with its figures.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use support::*;

/// Each worker's own count of `work_a` calls in `phase`, by TID, from the
/// target's JSON lines.
fn own_counts(ctx: &Ctx, text: &str, phase: u64) -> BTreeMap<u64, u64> {
    text.lines()
        .filter(|l| l.starts_with("{\"phase\""))
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .unwrap_or_else(|e| ctx.fail(format!("{e}: {l}")))
        })
        .filter(|v| v["phase"] == phase)
        .map(|v| (v["tid"].as_u64().unwrap(), v["work_a"].as_u64().unwrap()))
        .collect()
}

/// The `weft: attached pid=P` lines of a weft attached to `n` processes.
fn attached_pids(weft: &mut Proc, n: usize) -> BTreeSet<u32> {
    (0..n).map(|_| wait_attached(weft).pid).collect()
}

/// Checks one process's part of a report against its own counts.
fn check_process(ctx: &Ctx, report: &serde_json::Value, t: &Proc, phase: u64) -> u64 {
    let own = own_counts(ctx, &t.stdout_text(), phase);
    ctx.check(!own.is_empty(), || {
        format!("pid {}: no own counts for phase {phase}", t.pid)
    });
    let Some(p) = report["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["pid"] == t.pid)
    else {
        ctx.fail(format!("no report for pid {}: {report}", t.pid));
    };
    for (tid, calls) in &own {
        let got = p["threads"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|th| th["tid"] == *tid)
            .map_or(0, |th| {
                th["functions"]["work_a"]["calls"].as_u64().unwrap_or(0)
            });
        ctx.check(got == *calls, || {
            format!(
                "pid {} thread {tid}: work_a {got} calls, the thread made {calls}",
                t.pid
            )
        });
    }
    ctx.check(p["command"].as_str().is_some_and(|c| !c.is_empty()), || {
        format!("pid {}: no command", t.pid)
    });
    own.values().sum()
}

/// Ends weft `w` as a user's Ctrl-C does; its JSON report, and the text.
fn interrupt_for_report(ctx: &Ctx, w: &mut Proc) -> (serde_json::Value, String) {
    w.signal(nix::sys::signal::Signal::SIGINT);
    w.wait_code(0);
    let out = w.stdout_text();
    let report =
        serde_json::from_str(&out).unwrap_or_else(|e| ctx.fail(format!("not JSON: {e}: {out}")));
    (report, out)
}

/// Process `pid`'s calls of its report's first function, if reported.
fn first_function_calls(report: &serde_json::Value, pid: i64) -> Option<u64> {
    report["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["pid"] == pid)
        .map(|p| p["functions"][0]["calls"].as_u64().unwrap_or(0))
}

/// The totals' `work_a` calls and processes.
fn total(ctx: &Ctx, report: &serde_json::Value) -> (u64, u64) {
    total_of(ctx, report, "work_a")
}

/// The totals' calls of `function`, and its processes.
fn total_of(ctx: &Ctx, report: &serde_json::Value, function: &str) -> (u64, u64) {
    let Some(t) = report["totals"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| f["name"] == function)
    else {
        ctx.fail(format!("no {function} in the totals: {report}"));
    };
    (
        t["calls"].as_u64().unwrap(),
        t["processes"].as_u64().unwrap(),
    )
}

#[test]
fn several_processes_each_exact_and_totals_their_sum() {
    let ctx = Ctx::new("several_processes_each_exact_and_totals_their_sum");
    // A copy of the workers under a name of this test's own, beside
    // libwork.so (found through $ORIGIN): --pid-of must find only the
    // processes this test started.
    let name = format!("wk-several-{}", std::process::id());
    let copy = workers_c().with_file_name(&name);
    std::fs::copy(workers_c(), &copy).unwrap();
    let mut a = ctx.target(&copy, &["--threads", "2", "--phases", "3"]);
    let mut b = ctx.target(&copy, &["--threads", "3", "--phases", "3"]);
    // Ends after one phase, during the session (reaped before --pid-of
    // looks).
    let mut c = ctx.target(&copy, &["--threads", "1", "--phases", "1"]);
    for t in [&mut a, &mut b, &mut c] {
        t.expect_stdout("ready", |l| l.starts_with("ready "));
    }

    // -p as a list, and repeated.
    let list = format!("{},{}", a.pid, b.pid);
    let cpid = c.pid.to_string();
    let mut w = ctx.weft(&[
        "attach", "-p", &list, "-p", &cpid, "-f", "work_a", "--format", "json",
    ]);
    let pids = attached_pids(&mut w, 3);
    ctx.check(pids == BTreeSet::from([a.pid, b.pid, c.pid]), || {
        format!("attached to {pids:?}")
    });
    for t in [&mut a, &mut b, &mut c] {
        t.send("go");
        t.expect_stdout("phase done", |l| l == "phase 1 done");
    }
    c.expect_stdout("`done`", |l| l == "done");
    c.wait_code(0);
    w.signal(nix::sys::signal::Signal::SIGINT);
    w.wait_code(0);
    let report: serde_json::Value = serde_json::from_str(&w.stdout_text())
        .unwrap_or_else(|e| ctx.fail(format!("not JSON: {e}: {}", w.stdout_text())));
    let made: u64 = [&a, &b, &c]
        .iter()
        .map(|t| check_process(&ctx, &report, t, 1))
        .sum();
    let exited: Vec<bool> = report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["exited"] == true)
        .collect();
    ctx.check(exited == [false, false, true], || {
        format!("exited flags {exited:?}: only the third process ended")
    });
    let (calls, processes) = total(&ctx, &report);
    ctx.check(calls == made && processes == 3, || {
        format!("totals: work_a {calls} calls in {processes} processes; they made {made} in 3")
    });

    // --pid-of: exactly the two copies.
    let mut w = ctx.weft(&[
        "attach", "--pid-of", &name, "-f", "work_a", "--format", "json",
    ]);
    let pids = attached_pids(&mut w, 2);
    ctx.check(pids == BTreeSet::from([a.pid, b.pid]), || {
        format!(
            "--pid-of {name}: attached to {pids:?}, expected {} and {}",
            a.pid, b.pid
        )
    });
    for t in [&mut a, &mut b] {
        t.send("go");
        t.expect_stdout("phase done", |l| l == "phase 2 done");
    }
    w.signal(nix::sys::signal::Signal::SIGINT);
    w.wait_code(0);
    let report: serde_json::Value = serde_json::from_str(&w.stdout_text())
        .unwrap_or_else(|e| ctx.fail(format!("not JSON: {e}: {}", w.stdout_text())));
    let made: u64 = [&a, &b]
        .iter()
        .map(|t| check_process(&ctx, &report, t, 2))
        .sum();
    let (calls, processes) = total(&ctx, &report);
    ctx.check(calls == made && processes == 2, || {
        format!(
            "--pid-of totals: work_a {calls} calls in {processes} processes; they made {made} in 2"
        )
    });
    let attached = w
        .stderr_text()
        .lines()
        .filter(|l| l.starts_with("weft: attached"))
        .count();
    ctx.check(attached == 2, || format!("{attached} attached lines"));

    for t in [&mut a, &mut b] {
        t.send("go");
        t.expect_stdout("`done`", |l| l == "done");
        t.wait_code(0);
    }
    let _ = std::fs::remove_file(&copy);
}

/// Bad targets get weft's own errors, and change nothing.
#[test]
fn several_processes_bad_targets_are_refused() {
    let ctx = Ctx::new("several_processes_bad_targets_are_refused");
    for (args, says) in [
        (
            vec!["attach", "-p", "12x", "-f", "work_a"],
            "bad PID \"12x\"",
        ),
        (vec!["attach", "-p", "0", "-f", "work_a"], "bad PID \"0\""),
        (
            vec!["attach", "--pid-of", "no-such-program-here", "-f", "work_a"],
            "no process runs \"no-such-program-here\"",
        ),
    ] {
        let mut w = ctx.weft(&args);
        let (line, _) = expect_weft_error(&mut w);
        ctx.check(line.contains(says), || format!("{args:?}: {line}"));
    }
}

/// A master whose workers (forked, the same program) do the work: weft
/// given the master counts its calls truthfully (none), and says that
/// its children ran the same program and how to measure them, under
/// `attach` and under `run --no-follow`; `run` follows them, each exact.
#[test]
fn a_master_whose_workers_do_the_work_is_told() {
    let ctx = Ctx::new("a_master_whose_workers_do_the_work_is_told");
    let exe = build_c_target_with("gcc", "forker", &["-O2", "-g"]);
    let workers_of = |line: &str| -> Vec<String> {
        line.split_once("workers=")
            .map(|(_, w)| w.split(',').map(str::to_string).collect())
            .unwrap_or_default()
    };
    let check_hint = |stderr: &str, workers: &[String], how: &str| {
        let hint = stderr
            .lines()
            .find(|l| l.contains("made no instrumented call, but its children"));
        ctx.check(
            hint.is_some_and(|h| {
                workers.iter().all(|w| h.contains(w.as_str())) && h.contains("-p ")
            }),
            || format!("{how}: no hint naming the workers {workers:?}: {stderr}"),
        );
    };

    let mut t = ctx.target(&exe, &["3"]);
    let ready = t.expect_stdout("ready", |l| l.starts_with("ready pid="));
    let workers = workers_of(&ready);
    ctx.check(workers.len() == 3, || ready.clone());
    let (mut w, _) = attach(&ctx, t.pid, &["-f", "handle", "--format", "json"], 1);
    // Seen while live (weft looks every 200 ms).
    std::thread::sleep(std::time::Duration::from_millis(400));
    t.send("go");
    t.expect_stdout("`done`", |l| l == "done");
    let out = detach_with_sigint(&mut w);
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    ctx.check(report["functions"][0]["calls"] == 0, || {
        format!("the master made no call of handle: {out}")
    });
    check_hint(&w.stderr_text(), &workers, "attach");
    t.send("quit");
    t.wait_code(0);

    // Under `run --no-follow`, the workers have exited by the report.
    let path = exe.to_str().unwrap();
    let run_forker = |follow: &[&str]| {
        let mut args = vec!["run", "-f", "handle", "--format", "json"];
        args.extend_from_slice(follow);
        args.extend_from_slice(&["--", path, "2"]);
        let mut run = std::process::Command::new(weft_bin());
        run.args(&args);
        // The program reads weft's standard input.
        let mut w = ctx.spawn(&format!("weft {}", args.join(" ")), run, true);
        let ready = w.expect_stdout("ready", |l| l.starts_with("ready pid="));
        let workers = workers_of(&ready);
        std::thread::sleep(std::time::Duration::from_millis(300));
        w.send("go");
        w.expect_stdout("`done`", |l| l == "done");
        w.send("quit");
        w.wait_code(0);
        (w, workers)
    };
    let (w, workers) = run_forker(&["--no-follow"]);
    check_hint(&w.stderr_text(), &workers, "run");

    // Under `run`, which follows them: each worker's 2,000 calls.
    let (w, workers) = run_forker(&[]);
    let out = w.stdout_text();
    let json = out
        .find("\n{")
        .map(|i| &out[i + 1..])
        .unwrap_or_else(|| ctx.fail(format!("no report: {out}")));
    let report: serde_json::Value =
        serde_json::from_str(json).unwrap_or_else(|e| ctx.fail(format!("not JSON: {e}: {out}")));
    for worker in &workers {
        let calls = report["processes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| {
                p["pid"]
                    .as_i64()
                    .is_some_and(|pid| worker.parse() == Ok(pid))
            })
            .and_then(|p| p["functions"][0]["calls"].as_u64());
        ctx.check(calls == Some(2000), || {
            format!("run: worker {worker} made 2000 calls: {calls:?} in {out}")
        });
    }
    let (total, processes) = total_of(&ctx, &report, "handle");
    ctx.check(total == 4000 && processes == 3, || {
        format!("run: totals {total} in {processes} processes: {out}")
    });
}

/// `--children`: a master and the workers it has forked, in one session,
/// each worker exact; a worker forked after the attach is followed, and
/// counted from its fork: it calls `handle` 500 times at once, before weft
/// can have seen it (weft looks every 200 ms), and all 2,500 of its calls
/// are in the report.
#[test]
fn children_taken_with_their_master_and_late_ones_followed() {
    let ctx = Ctx::new("children_taken_with_their_master_and_late_ones_followed");
    let exe = build_c_target_with("gcc", "forker", &["-O2", "-g"]);
    let mut t = ctx.target(&exe, &["2"]);
    let ready = t.expect_stdout("ready", |l| l.starts_with("ready pid="));
    let workers: Vec<i64> = ready
        .split_once("workers=")
        .map(|(_, w)| w.split(',').filter_map(|p| p.parse().ok()).collect())
        .unwrap_or_default();
    ctx.check(workers.len() == 2, || ready.clone());
    let mut w = attach_children(&ctx, t.pid, "handle");
    let pids = attached_pids(&mut w, 3);
    let want: BTreeSet<u32> = [t.pid]
        .into_iter()
        .chain(workers.iter().map(|&p| p as u32))
        .collect();
    ctx.check(pids == want, || {
        format!("attached to {pids:?}, expected {want:?}")
    });
    t.send("spawn 500");
    let spawned = t.expect_stdout("spawned", |l| l.starts_with("spawned "));
    let late = spawned.trim_start_matches("spawned ").to_string();
    let note = w.expect_line(Stream::Stderr, "the late child followed", |l| {
        l.contains("forked after the attach")
    });
    ctx.check(note.contains(&format!("following pid={late} ")), || {
        format!("the note {note:?}, the late worker is {late}")
    });
    t.send("go");
    t.expect_stdout("`done`", |l| l == "done");
    let made = format!("worker {late} calls=2500");
    ctx.check(t.stdout_text().lines().any(|l| l == made), || {
        format!(
            "the late worker did not report {made:?}: {}",
            t.stdout_text()
        )
    });
    let (report, out) = interrupt_for_report(&ctx, &mut w);
    let calls = |pid: i64| first_function_calls(&report, pid);
    ctx.check(calls(i64::from(t.pid)) == Some(0), || {
        format!("the master: {out}")
    });
    for &wk in &workers {
        ctx.check(calls(wk) == Some(2000), || {
            format!("worker {wk}: {:?} calls, it made 2000: {out}", calls(wk))
        });
    }
    let late: i64 = late.parse().unwrap_or(0);
    ctx.check(calls(late) == Some(2500), || {
        format!(
            "the late worker {late}: {:?} calls, it made 2500 since its fork: {out}",
            calls(late)
        )
    });
    let (total, processes) = total_of(&ctx, &report, "handle");
    ctx.check(total == 6500 && processes == 4, || {
        format!("totals: {total} calls in {processes} processes: {out}")
    });
    t.send("quit");
    t.wait_code(0);
}

/// A child that runs another program: followed into it when the
/// patterns match there (a new image: counted from weft's attach, by a
/// runtime of its own), left alone, unharmed, when they do not.
#[test]
fn a_child_that_execs_is_followed_into_its_new_program() {
    let ctx = Ctx::new("a_child_that_execs_is_followed_into_its_new_program");
    let exe = build_c_target_with("gcc", "forker", &["-O2", "-g"]);
    let mut t = ctx.target(&exe, &["1"]);
    let ready = t.expect_stdout("ready", |l| l.starts_with("ready pid="));
    let worker: i64 = ready
        .split_once("workers=")
        .and_then(|(_, w)| w.parse().ok())
        .unwrap_or_else(|| ctx.fail(format!("the ready line: {ready}")));
    let mut w = attach_children(&ctx, t.pid, "handle");
    attached_pids(&mut w, 2);
    t.send("exec");
    let spawned = t.expect_stdout("spawned", |l| l.starts_with("spawned "));
    let execed: i64 = spawned["spawned ".len()..].parse().unwrap_or(0);
    let note = w.expect_line(Stream::Stderr, "the exec'd child followed", |l| {
        l.contains("forked after the attach")
    });
    ctx.check(note.contains(&format!("following pid={execed} ")), || {
        format!("the note {note:?}, the exec'd worker is {execed}")
    });
    t.send("execsleep");
    let spawned = t.expect_stdout("spawned", |l| l.starts_with("spawned "));
    let sleeper = spawned["spawned ".len()..].to_string();
    let note = w.expect_line(Stream::Stderr, "the sleeper left alone", |l| {
        l.contains(&format!("pid {sleeper} "))
    });
    ctx.check(note.contains("left alone"), || {
        format!("the note on the sleeper: {note:?}")
    });
    t.send("go");
    t.expect_stdout("`done`", |l| l == "done");
    let out = t.stdout_text();
    ctx.check(
        out.lines()
            .any(|l| l == format!("worker {execed} calls=2000"))
            && out
                .lines()
                .any(|l| l == format!("sleeper {sleeper} code=0")),
        || format!("the children's own lines: {out}"),
    );
    let (report, out) = interrupt_for_report(&ctx, &mut w);
    let calls = |pid: i64| first_function_calls(&report, pid);
    ctx.check(
        calls(i64::from(t.pid)) == Some(0)
            && calls(worker) == Some(2000)
            && calls(execed) == Some(2000),
        || format!("master, worker, exec'd worker: {out}"),
    );
    let (total, processes) = total_of(&ctx, &report, "handle");
    ctx.check(total == 4000 && processes == 3, || {
        format!("totals: {total} calls in {processes} processes: {out}")
    });
    t.send("quit");
    t.wait_code(0);
}

/// The calls of `handle` in a one-process JSON report.
fn handle_calls(ctx: &Ctx, w: &Proc) -> u64 {
    let out = w.stdout_text();
    let report: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| ctx.fail(format!("not JSON: {e}: {out}")));
    report["functions"][0]["calls"]
        .as_u64()
        .unwrap_or_else(|| ctx.fail(format!("no calls of handle: {out}")))
}

/// A worker forked from a master that a weft instruments inherits the
/// patched code, but none of that weft's sessions: a weft attached to the
/// worker on its own measures it in the worker's own region (before, it
/// read — and joined the ledger of — the master's, and reported 0 for the
/// worker's 2,000 calls), takes the inherited probe out with its own when
/// it leaves, and the next weft counts the worker exactly. The master's
/// session is untouched throughout, and leaves the master as compiled.
#[test]
fn a_worker_forked_from_an_instrumented_master_is_measured_on_its_own() {
    let ctx = Ctx::new("a_worker_forked_from_an_instrumented_master_is_measured_on_its_own");
    let exe = build_c_target_with("gcc", "forker", &["-O2", "-g"]);
    let mut t = ctx.target(&exe, &["1"]);
    t.expect_stdout("ready", |l| l.starts_with("ready pid="));
    let handle = address_of(&ctx, t.pid, "handle");
    let compiled = code_at(t.pid, handle);
    let pid = t.pid_str();
    let mut master = ctx.weft(&["attach", "-p", &pid, "-f", "handle", "--format", "json"]);
    wait_attached(&mut master);
    t.send("spawn");
    let spawned = t.expect_stdout("spawned", |l| l.starts_with("spawned "));
    let late: u32 = spawned
        .trim_start_matches("spawned ")
        .parse()
        .unwrap_or_else(|_| ctx.fail(format!("spawned line {spawned:?}")));
    ctx.check(code_at(late, handle) != compiled, || {
        "the worker forked after the attach does not have the master's patch".into()
    });
    let late_pid = late.to_string();
    let watch = |ctx: &Ctx| {
        let mut w = ctx.weft(&[
            "attach", "-p", &late_pid, "-f", "handle", "--format", "json",
        ]);
        wait_attached(&mut w);
        w
    };
    // A first weft on the worker, gone before the worker works: it takes
    // the inherited probe out with its own.
    let mut first = watch(&ctx);
    first.signal(nix::sys::signal::Signal::SIGINT);
    first.wait_code(0);
    ctx.check(handle_calls(&ctx, &first) == 0, || first.stdout_text());
    ctx.check(code_at(late, handle) == compiled, || {
        format!(
            "the worker's handle after the first weft left: {:02x?}, as compiled: {compiled:02x?}",
            code_at(late, handle)
        )
    });
    let mut second = watch(&ctx);
    t.send("go");
    t.expect_stdout("`done`", |l| l == "done");
    let made = format!("worker {late} calls=2000");
    ctx.check(t.stdout_text().lines().any(|l| l == made), || {
        format!("the worker did not report {made:?}: {}", t.stdout_text())
    });
    second.wait_code(0);
    ctx.check(handle_calls(&ctx, &second) == 2000, || {
        format!("the worker made 2000 calls: {}", second.stdout_text())
    });
    master.signal(nix::sys::signal::Signal::SIGINT);
    master.wait_code(0);
    ctx.check(handle_calls(&ctx, &master) == 0, || master.stdout_text());
    ctx.check(code_at(t.pid, handle) == compiled, || {
        "the master's handle after its weft left is not as compiled".into()
    });
    t.send("quit");
    t.wait_code(0);
}

/// A worker followed as it was forked is left as compiled when weft
/// detaches while it still runs, with what it did until then in the
/// report (300 calls made at once after its fork), and goes on unharmed.
#[test]
fn a_followed_worker_is_left_as_compiled() {
    let ctx = Ctx::new("a_followed_worker_is_left_as_compiled");
    let exe = build_c_target_with("gcc", "forker", &["-O2", "-g"]);
    let mut t = ctx.target(&exe, &["1"]);
    t.expect_stdout("ready", |l| l.starts_with("ready pid="));
    let handle = address_of(&ctx, t.pid, "handle");
    let compiled = code_at(t.pid, handle);
    let mut w = attach_children(&ctx, t.pid, "handle");
    attached_pids(&mut w, 2);
    t.send("spawn 300");
    let spawned = t.expect_stdout("spawned", |l| l.starts_with("spawned "));
    let late: u32 = spawned
        .trim_start_matches("spawned ")
        .parse()
        .unwrap_or_else(|_| ctx.fail(format!("spawned line {spawned:?}")));
    w.expect_line(Stream::Stderr, "the late child followed", |l| {
        l.contains(&format!("following pid={late} "))
    });
    let (report, out) = interrupt_for_report(&ctx, &mut w);
    let late_calls = first_function_calls(&report, i64::from(late));
    ctx.check(late_calls == Some(300), || {
        format!("the late worker {late} made 300 calls since its fork: {out}")
    });
    for who in [t.pid, late] {
        ctx.check(code_at(who, handle) == compiled, || {
            format!(
                "pid {who}'s handle after weft left: {:02x?}, as compiled: {compiled:02x?}",
                code_at(who, handle)
            )
        });
    }
    t.send("go");
    t.expect_stdout("`done`", |l| l == "done");
    let made = format!("worker {late} calls=2300");
    ctx.check(t.stdout_text().lines().any(|l| l == made), || {
        format!(
            "the late worker did not report {made:?}: {}",
            t.stdout_text()
        )
    });
    t.send("quit");
    t.wait_code(0);
}
