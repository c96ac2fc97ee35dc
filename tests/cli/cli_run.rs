//! `weft run`: instrument from before `main`, pass the program's output
//! through, report after it exits, propagate its exit code.

use crate::support;

use std::path::Path;
use support::*;

const N: u64 = 4;
const LATE: u64 = 2;
const PHASES: u64 = 2;

/// Every line of the target's part must be one the target prints itself.
fn check_only_target_lines(ctx: &Ctx, text: &str) {
    let lines: Vec<&str> = text.lines().collect();
    ctx.check(
        lines.first().is_some_and(|l| l.starts_with("ready pid=")),
        || "the target's `ready` line must come first on stdout".into(),
    );
    ctx.check(lines.last() == Some(&"done"), || {
        "the target's `done` line must be last".into()
    });
    for l in &lines {
        let ok = l.starts_with("ready pid=")
            || l.starts_with("{\"phase\"")
            || (l.starts_with("phase ") && l.ends_with(" done"))
            || *l == "done";
        ctx.check(ok, || {
            format!("unexpected line {l:?} among the target's output")
        });
    }
}

fn ready_pid(ctx: &Ctx, text: &str) -> i64 {
    text.lines()
        .find_map(|l| l.strip_prefix("ready pid="))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| ctx.fail("no `ready pid=` line from the target"))
}

fn workers_args(exe: &Path) -> Vec<String> {
    vec![
        exe.to_str().unwrap().to_string(),
        "--no-wait".into(),
        "--threads".into(),
        N.to_string(),
        "--late-threads".into(),
        LATE.to_string(),
        "--phases".into(),
        PHASES.to_string(),
    ]
}

/// Checks the target's output and the JSON report against each other.
fn check_run(ctx: &Ctx, exe: &Path, target_text: &str, report_text: &str) {
    check_only_target_lines(ctx, target_text);
    let mut all = Vec::new();
    for p in 1..=PHASES {
        all.extend(check_worker_phase(ctx, target_text, p, N + LATE));
    }
    let report = parse_report(ctx, report_text);
    let pid = ready_pid(ctx, target_text);
    ctx.check(report.pid == pid, || {
        format!("report pid {} != target pid {pid}", report.pid)
    });
    ctx.check(report.duration_ns > 0, || "report duration_ns is 0".into());
    let exp = expect_from_workers(&all, &WORKER_FUNCS);
    ctx.check(exp.len() as u64 == N + LATE, || {
        "target TIDs not distinct".into()
    });
    check_report_counts(ctx, &report, &exp, &WORKER_FUNCS);
    let mods = worker_modules(exe);
    let mods: Vec<(&str, &str)> = mods.iter().map(|(f, m)| (*f, m.as_str())).collect();
    check_report_modules(ctx, &report, &mods);
}

fn run_json_exact(test: &str, exe: &Path) {
    let ctx = Ctx::new(test);
    let mut args: Vec<String> = ["run", "--format", "json", "-f", WORKER_PATTERNS, "--"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(workers_args(exe));
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let mut weft = ctx.weft(&args);
    weft.wait_code(0);
    let (target, report) = split_at_done(&ctx, &weft.stdout_text());
    check_run(&ctx, exe, &target, &report);
}

#[test]
fn run_c_o2_counts_exact_per_thread() {
    run_json_exact("run_c_o2_counts_exact_per_thread", workers_c());
}

#[test]
fn run_c_cf_protection_counts_exact_per_thread() {
    run_json_exact(
        "run_c_cf_protection_counts_exact_per_thread",
        workers_c_cet(),
    );
}

#[test]
fn run_rust_counts_exact_per_thread() {
    run_json_exact("run_rust_counts_exact_per_thread", workers_rs());
}

/// `-f` repeated (instead of one comma-separated list) selects the same set.
#[test]
fn run_repeated_f_flags() {
    let ctx = Ctx::new("run_repeated_f_flags");
    let exe = workers_c();
    let mut args: Vec<String> = [
        "run",
        "--format",
        "json",
        "-f",
        "work_a",
        "-f",
        "work_b",
        "-f",
        "libwork.so:lib_work",
        "--",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(workers_args(exe));
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let mut weft = ctx.weft(&args);
    weft.wait_code(0);
    let (target, report) = split_at_done(&ctx, &weft.stdout_text());
    check_run(&ctx, exe, &target, &report);
}

/// With `-o FILE` the report goes to FILE and stdout holds only the target's output.
#[test]
fn run_report_to_file() {
    let ctx = Ctx::new("run_report_to_file");
    let exe = workers_c();
    let file = scratch_dir("run_report_to_file").join("report.json");
    let file_s = file.to_str().unwrap().to_string();
    let mut args: Vec<String> = [
        "run",
        "--format",
        "json",
        "-o",
        file_s.as_str(),
        "-f",
        WORKER_PATTERNS,
        "--",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(workers_args(exe));
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let mut weft = ctx.weft(&args);
    weft.wait_code(0);
    let out = weft.stdout_text();
    check_only_target_lines(&ctx, &out);
    let report = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| ctx.fail(format!("cannot read the report file {file_s}: {e}")));
    check_run(&ctx, exe, &out, &report);
}

/// Runs the 2-thread workers target with `how` (its way of ending) under
/// `weft run`: weft exits with `code` and the exact report still follows.
fn run_ending(test: &str, how: [&str; 2], code: i32) {
    let ctx = Ctx::new(test);
    let exe = workers_c();
    let mut weft = ctx.weft(&[
        "run",
        "--format",
        "json",
        "-f",
        WORKER_PATTERNS,
        "--",
        exe.to_str().unwrap(),
        "--no-wait",
        "--threads",
        "2",
        how[0],
        how[1],
    ]);
    weft.wait_code(code);
    let (target, report) = split_at_done(&ctx, &weft.stdout_text());
    let lines = check_worker_phase(&ctx, &target, 1, 2);
    let report = parse_report(&ctx, &report);
    check_report_counts(
        &ctx,
        &report,
        &expect_from_workers(&lines, &WORKER_FUNCS),
        &WORKER_FUNCS,
    );
}

/// A target exiting with code 3 makes weft exit 3; the report still follows.
#[test]
fn run_propagates_exit_code() {
    run_ending("run_propagates_exit_code", ["--exit-code", "3"], 3);
}

/// A target killed by SIGTERM makes weft exit 128+15.
#[test]
fn run_propagates_death_by_signal() {
    run_ending(
        "run_propagates_death_by_signal",
        ["--raise", "15"],
        128 + 15,
    );
}

/// The target's stderr passes through, and its exit code (64, bad argument).
#[test]
fn run_passes_stderr_through() {
    let ctx = Ctx::new("run_passes_stderr_through");
    let exe = workers_c();
    let mut weft = ctx.weft(&[
        "run",
        "-f",
        "work_a",
        "--",
        exe.to_str().unwrap(),
        "--bogus",
    ]);
    weft.wait_code(64);
    let err = weft.stderr_text();
    ctx.check(
        err.lines().any(|l| l == "workers: bad argument --bogus"),
        || "the target's stderr line did not pass through unchanged".into(),
    );
}

/// Table format: names, TIDs and counts of every thread appear.
#[test]
fn run_table_format_smoke() {
    let ctx = Ctx::new("run_table_format_smoke");
    let exe = workers_c();
    let mut weft = ctx.weft(&[
        "run",
        "--format",
        "table",
        "-f",
        "work_a,work_b",
        "--",
        exe.to_str().unwrap(),
        "--no-wait",
        "--threads",
        "4",
    ]);
    weft.wait_code(0);
    let (target, table) = split_at_done(&ctx, &weft.stdout_text());
    let lines = check_worker_phase(&ctx, &target, 1, 4);
    ctx.check(!table.trim().is_empty(), || {
        "no table after the target's output".into()
    });
    // Tokens: split on whitespace and table rules; numbers also without digit separators.
    let mut tokens = std::collections::BTreeSet::new();
    let separators = [
        '|', '│', '(', ')', '[', ']', '{', '}', '/', ':', ';', '=', '"', '\'',
    ];
    for t in table.split(|c: char| c.is_whitespace() || separators.contains(&c)) {
        let t = t.trim_matches(|c: char| !c.is_alphanumeric() && c != '_' && c != '-');
        if t.is_empty() {
            continue;
        }
        tokens.insert(t.to_string());
        if t.chars()
            .all(|c| c.is_ascii_digit() || c == ',' || c == '_')
        {
            tokens.insert(t.replace([',', '_'], ""));
        }
    }
    let has = |s: &str| tokens.contains(s);
    for f in ["work_a", "work_b"] {
        ctx.check(has(f), || format!("the table does not mention {f}"));
    }
    for l in &lines {
        ctx.check(has(&l.tid.to_string()), || {
            format!("the table lacks tid {}", l.tid)
        });
        ctx.check(has(&l.name), || {
            format!("the table lacks thread name {}", l.name)
        });
        ctx.check(has(&l.work_a.to_string()), || {
            format!("the table lacks the count {} ({} work_a)", l.work_a, l.name)
        });
        ctx.check(has(&l.work_b.to_string()), || {
            format!("the table lacks the count {} ({} work_b)", l.work_b, l.name)
        });
    }
}

/// Functions the runtime itself calls while it registers a thread (prctl,
/// syscall, calloc via the TLS destructor list, malloc, free) can be
/// instrumented too: the runtime's own calls must neither recurse into
/// registration nor count as the program's, and every thread registers once.
#[test]
fn run_with_functions_the_runtime_uses() {
    let ctx = Ctx::new("run_with_functions_the_runtime_uses");
    let exe = workers_c();
    let patterns =
        format!("{WORKER_PATTERNS},prctl,syscall,calloc,malloc,free,__cxa_thread_atexit_impl");
    let mut args: Vec<String> = ["run", "--format", "json", "-f", &patterns, "--"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(workers_args(exe));
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let mut weft = ctx.weft(&args);
    weft.wait_code(0);
    let (target, report) = split_at_done(&ctx, &weft.stdout_text());
    check_run(&ctx, exe, &target, &report);
}

/// 10,000 short-lived threads, 8 alive at a time, 10 calls each: every call
/// is counted in its own thread's entry, and the runtime reuses the rows of
/// exited threads instead of growing with the total.
#[test]
fn run_many_short_lived_threads_reuses_rows() {
    let ctx = Ctx::new("run_many_short_lived_threads_reuses_rows");
    let exe = churn().to_str().unwrap().to_string();
    let mut weft = ctx.weft(&[
        "run", "--format", "json", "-f", "work", "--", &exe, "10000", "8",
    ]);
    weft.wait_code(0);
    let out = weft.stdout_text();
    let mut lines = out.lines();
    let own: serde_json::Value = serde_json::from_str(lines.next().unwrap_or("")).unwrap();
    let report: serde_json::Value = serde_json::from_str(lines.next().unwrap_or("")).unwrap();
    ctx.check(own["calls"] == 100_000, || {
        format!("the target counted {}", own["calls"])
    });
    ctx.check(report["functions"][0]["calls"] == 100_000, || {
        format!(
            "weft counted {} calls, not 100000",
            report["functions"][0]["calls"]
        )
    });
    let threads = report["threads"].as_array().unwrap();
    let tens = threads
        .iter()
        .filter(|t| t["functions"]["work"]["calls"] == 10)
        .count();
    ctx.check(threads.len() == 10_000 && tens == 10_000, || {
        format!(
            "{} threads reported, {tens} with exactly 10 calls",
            threads.len()
        )
    });
    let mut tids: Vec<u64> = threads.iter().map(|t| t["tid"].as_u64().unwrap()).collect();
    tids.sort_unstable();
    tids.dedup();
    ctx.check(tids.len() == 10_000, || {
        format!("only {} distinct tids", tids.len())
    });
    ctx.check(threads.iter().all(|t| t["exited"] == true), || {
        "a thread is not marked exited".into()
    });
    let used = report["runtime"]["rows_used"].as_u64().unwrap_or(u64::MAX);
    let reused = report["runtime"]["rows_reused"].as_u64().unwrap_or(0);
    // Bounded by the threads alive at once plus those created between two
    // harvests (every 5 ms), not by the 10,000 ever created.
    ctx.check(used < 2_000 && reused > 8_000, || {
        format!("rows used {used}, reused {reused}: the table grows with the total")
    });
    ctx.check(report.get("overflow_threads").is_none(), || {
        "threads overflowed".into()
    });
}

/// Threads with the smallest stack the system allows (16 KiB here) call an
/// instrumented function: their first call registers them on that stack
/// (the registration stub saves the vector state there, without the AMX
/// tiles' 8 KiB) and every call is counted, timed or not. Before the AMX
/// state was left out, such a thread crashed at its first call.
#[test]
fn run_threads_with_the_smallest_stacks() {
    let ctx = Ctx::new("run_threads_with_the_smallest_stacks");
    let exe = smallstack().to_str().unwrap().to_string();
    for metrics in ["calls", "calls,wall,cpu"] {
        let mut weft = ctx.weft(&[
            "run", "--format", "json", "-m", metrics, "-f", "work", "--", &exe, "8", "1000",
        ]);
        weft.wait_code(0);
        let out = weft.stdout_text();
        let mut lines = out.lines();
        let own: serde_json::Value = serde_json::from_str(lines.next().unwrap_or("")).unwrap();
        let report: serde_json::Value = serde_json::from_str(lines.next().unwrap_or("")).unwrap();
        ctx.check(own["calls"] == 8_000, || {
            format!("{metrics}: the target said {own}")
        });
        let threads = report["threads"].as_array().cloned().unwrap_or_default();
        let thousands = threads
            .iter()
            .filter(|t| t["functions"]["work"]["calls"] == 1_000)
            .count();
        ctx.check(
            report["functions"][0]["calls"] == 8_000 && thousands == 8,
            || format!("{metrics}: weft counted {report}"),
        );
    }
}

/// A wrapper script as users have them (pyenv's shims, a `run.sh`): found
/// by `env`, it runs a command of its own, then `exec`s the program through
/// `env`. weft follows it into the program and stops that at its entry:
/// every call of every thread is counted, as when given the program itself.
#[test]
fn run_follows_a_wrapper_script_into_its_program() {
    let ctx = Ctx::new("run_follows_a_wrapper_script_into_its_program");
    let exe = workers_c();
    let script = write_script(
        "run_follows_a_wrapper_script",
        &format!(
            "#!/usr/bin/env bash\nsetup=$(echo ready)\nexec env WEFT_WRAPPED=$setup {} \"$@\"\n",
            exe.display()
        ),
    );
    let mut args: Vec<String> = ["run", "--format", "json", "-f", WORKER_PATTERNS, "--"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(script.display().to_string());
    args.extend(workers_args(exe).into_iter().skip(1));
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let mut weft = ctx.weft(&args);
    weft.wait_code(0);
    let err = weft.stderr_text();
    ctx.check(
        err.contains(&format!("runs {}", exe.display())) && err.contains("bash"),
        || format!("weft did not say it followed the script: {err}"),
    );
    let (target, report) = split_at_done(&ctx, &weft.stdout_text());
    check_run(&ctx, exe, &target, &report);
}

/// A script that starts its program as a child (no `exec`) cannot be
/// followed: weft says so and how to fix it, and exits non-zero.
#[test]
fn run_refuses_a_script_that_does_not_exec() {
    let ctx = Ctx::new("run_refuses_a_script_that_does_not_exec");
    let exe = workers_c();
    let script = write_script(
        "run_refuses_a_script_that_does_not_exec",
        &format!("#!/bin/sh\n{} --no-wait --threads 1\n", exe.display()),
    );
    let mut weft = ctx.weft(&["run", "-f", "work_a", "--", script.to_str().unwrap()]);
    let code = weft.wait_exit().code();
    let err = weft.stderr_text();
    ctx.check(code != Some(0), || "weft succeeded".into());
    ctx.check(
        err.contains("without `exec`ing a program") && err.contains("exec PROGRAM"),
        || format!("no clear error: {err}"),
    );
}

/// An executable script `text` in a scratch directory of the test's own.
fn write_script(test: &str, text: &str) -> std::path::PathBuf {
    let script = scratch_dir(test).join("script");
    std::fs::write(&script, text).expect("write the script");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("make the script executable");
    script
}
