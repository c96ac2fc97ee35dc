//! The small things users hit (issue #13, item 7): several `list`
//! patterns, bad `--duration`/`--interval` values, only the clocks of the
//! metrics asked, a closed pipe, and the final marker of `--format jsonl`.

use crate::support;

use std::process::{Command, Stdio};
use support::*;

/// Starts C workers (2 threads, 1 phase) and waits for `ready`.
fn start_workers(ctx: &Ctx) -> (Proc, u32) {
    let mut t = ctx.target(workers_c(), &["--threads", "2"]);
    let (pid, _) = wait_ready(&mut t);
    (t, pid)
}

/// A PID that no process has (a reaped child's).
fn dead_pid() -> String {
    let mut child = Command::new("true").spawn().expect("spawn true");
    let pid = child.id().to_string();
    child.wait().expect("reap true");
    pid
}

/// Negative, NaN, infinite, too large and non-numeric `--duration` and
/// `--interval` values, and an interval of 0, each get weft's own one-line
/// error naming the option (checked before weft touches any process), not
/// clap's usage error nor a panic.
#[test]
fn bad_seconds_get_weft_errors() {
    let ctx = Ctx::new("bad_seconds_get_weft_errors");
    let pid = dead_pid();
    let cases: &[(&str, &str)] = &[
        ("--duration", "-1"),
        ("--duration", "-0.5"),
        ("--duration", "NaN"),
        ("--duration", "inf"),
        ("--duration", "-inf"),
        ("--duration", "1e300"),
        ("--duration", "soon"),
        ("--interval", "-1"),
        ("--interval", "nan"),
        ("--interval", "0"),
        ("--interval", "1e-300"),
    ];
    for &(option, value) in cases {
        let mut w = ctx.weft(&["attach", "-p", &pid, "-f", "work_a", option, value]);
        let (_, err) = expect_weft_error(&mut w);
        ctx.check(err.lines().count() == 1, || {
            format!("{option} {value}: more than one stderr line: {err:?}")
        });
        ctx.check(err.contains(option) && err.contains("seconds"), || {
            format!("{option} {value}: the error should name {option} and say it takes seconds: {err:?}")
        });
    }
}

/// The lines `weft list` printed, after it exited 0.
fn list_lines(ctx: &Ctx, args: &[&str]) -> Vec<String> {
    let mut w = ctx.weft(args);
    w.wait_code(0);
    w.stdout_text().lines().map(str::to_string).collect()
}

/// `weft list -p PID P1 P2 P3` prints the union of what each pattern lists
/// alone, each function once (here `work_a` matches two of the patterns);
/// a pattern that matches nothing is named, the others listed (status 1).
#[test]
fn list_takes_several_patterns() {
    let ctx = Ctx::new("list_takes_several_patterns");
    let (_t, pid) = start_workers(&ctx);
    let p = pid.to_string();
    let patterns = ["work_*", "libc.so.6:malloc", "work_a"];
    let mut args = vec!["list", "-p", p.as_str()];
    args.extend(patterns);
    let all = list_lines(&ctx, &args);
    let mut expected = std::collections::BTreeSet::new();
    for pattern in patterns {
        let alone = list_lines(&ctx, &["list", "-p", &p, pattern]);
        ctx.check(!alone.is_empty(), || format!("{pattern} lists nothing"));
        expected.extend(alone);
    }
    let got: std::collections::BTreeSet<String> = all.iter().cloned().collect();
    ctx.check(got.len() == all.len(), || {
        format!("a function listed twice:\n{}", all.join("\n"))
    });
    ctx.check(got == expected, || {
        format!("listed {got:#?}\nexpected the union of the patterns alone: {expected:#?}")
    });
    for name in ["work_a", "malloc"] {
        ctx.check(all.iter().any(|l| l.ends_with(&format!(" {name}"))), || {
            format!("{name} is not listed:\n{}", all.join("\n"))
        });
    }
    // One pattern matching nothing: the others are listed, it is named,
    // and the status is 1.
    let mut w = ctx.weft(&["list", "-p", &p, "work_a", "no_such_function_here"]);
    w.wait_code(1);
    let (out, err) = (w.stdout_text(), w.stderr_text());
    ctx.check(out.lines().any(|l| l.ends_with(" work_a")), || {
        format!("work_a should still be listed:\n{out}")
    });
    ctx.check(err.contains("no_such_function_here"), || {
        format!("stderr should name the pattern that matched nothing: {err:?}")
    });
    // All of them matching nothing: an error, as for `attach`.
    let mut w = ctx.weft(&["list", "-p", &p, "no_such_function_here"]);
    let (_, err) = expect_weft_error(&mut w);
    ctx.check(err.contains("no_such_function_here"), || {
        format!("the error should name the pattern that matched nothing: {err:?}")
    });
}

/// The table's `times:` line is followed by the clock of each time metric
/// asked and no other: `-m wall` has no CPU clock line, `-m cpu` no wall
/// clock.
#[test]
fn table_names_only_the_clocks_asked() {
    let ctx = Ctx::new("table_names_only_the_clocks_asked");
    let exe = workers_c().to_str().unwrap();
    for (metrics, wall, cpu) in [
        ("wall", true, false),
        ("cpu", false, true),
        ("calls,wall,cpu", true, true),
    ] {
        // The workers target under `weft run -m METRICS FORMAT...`.
        let run = |format: &[&str]| {
            let mut args = vec!["run", "-m", metrics];
            args.extend_from_slice(format);
            args.extend(["-f", "work_a", "--", exe, "--no-wait", "--threads", "2"]);
            let mut w = ctx.weft(&args);
            w.wait_code(0);
            w.stdout_text()
        };
        let out = run(&[]);
        let times: Vec<&str> = out.lines().filter(|l| l.starts_with("times:")).collect();
        ctx.check(times.len() == 1, || {
            format!("-m {metrics}: expected one `times:` line:\n{out}")
        });
        let shown = |clock: &str| out.lines().any(|l| l.starts_with(clock));
        ctx.check(shown("wall clock: ") == wall, || {
            format!("-m {metrics}: wall clock shown: {}:\n{out}", !wall)
        });
        ctx.check(shown("cpu clock: ") == cpu, || {
            format!("-m {metrics}: cpu clock shown: {}:\n{out}", !cpu)
        });
        // And the JSON report's `clocks` the same.
        let out = run(&["--format", "json"]);
        let (_, json) = split_at_done(&ctx, &out);
        let report: serde_json::Value = serde_json::from_str(&json)
            .unwrap_or_else(|e| ctx.fail(format!("-m {metrics}: report is not JSON: {e}")));
        let clocks = &report["clocks"];
        ctx.check(clocks["wall"].is_string() == wall, || {
            format!("-m {metrics}: JSON clocks {clocks}: wall expected {wall}")
        });
        ctx.check(clocks["cpu"].is_string() == cpu, || {
            format!("-m {metrics}: JSON clocks {clocks}: cpu expected {cpu}")
        });
    }
}

/// Runs weft with the read end of its stdout closed before it writes
/// anything; returns its exit status, stderr and how long it took.
fn weft_into_closed_pipe(args: &[&str]) -> (std::process::ExitStatus, String, std::time::Duration) {
    let start = std::time::Instant::now();
    let mut child = Command::new(weft_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn weft");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait for weft");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status, err, start.elapsed())
}

/// A closed pipe ends `weft list` quietly: exit 0, nothing on stderr (no
/// "Broken pipe" error, no panic), both when the reader is gone before
/// weft writes and with a real `| head -1`.
#[test]
fn list_into_a_closed_pipe_ends_quietly() {
    let ctx = Ctx::new("list_into_a_closed_pipe_ends_quietly");
    let (_t, pid) = start_workers(&ctx);
    let p = pid.to_string();
    let (status, err, _) = weft_into_closed_pipe(&["list", "-p", &p, "*"]);
    ctx.check(status.code() == Some(0) && err.is_empty(), || {
        format!("weft list into a closed pipe: {status:?}, stderr {err:?}")
    });
    let script = format!("'{}' list -p {p} '*' | head -1", weft_bin());
    let out = Command::new("sh")
        .args(["-c", &script])
        .output()
        .expect("run sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ctx.check(stdout.lines().count() == 1 && stderr.is_empty(), || {
        format!("`{script}`: stdout {stdout:?}, stderr {stderr:?}")
    });
}

/// `attach --interval` whose reader went away detaches at its next report
/// (not at --duration), exits 0 with only its `attached` line on stderr,
/// and leaves the target untraced and working.
#[test]
fn attach_into_a_closed_pipe_detaches_quietly() {
    let ctx = Ctx::new("attach_into_a_closed_pipe_detaches_quietly");
    let (mut t, pid) = start_workers(&ctx);
    let p = pid.to_string();
    let args = [
        "attach",
        "-p",
        &p,
        "-f",
        "work_a",
        "--format",
        "jsonl",
        "--interval",
        "0.05",
        "--duration",
        "20",
    ];
    let (status, err, took) = weft_into_closed_pipe(&args);
    ctx.check(status.code() == Some(0), || {
        format!("weft attach into a closed pipe: {status:?}, stderr {err:?}")
    });
    ctx.check(
        err.lines().count() == 1 && err.starts_with("weft: attached"),
        || format!("stderr should be the `attached` line only: {err:?}"),
    );
    ctx.check(took < std::time::Duration::from_secs(10), || {
        format!("weft took {took:?}: it waited for --duration instead of detaching")
    });
    check_not_traced_nor_stopped(&ctx, pid);
    t.send("go");
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
    check_worker_phase(&ctx, &t.stdout_text(), 1, 2);
}

/// `--format jsonl`: every line is a report with a `final` field, false on
/// the live ones (`--interval`) and true on the last, the final report at
/// detach; `run` writes one line, final.
#[test]
fn jsonl_marks_the_final_report() {
    let ctx = Ctx::new("jsonl_marks_the_final_report");
    let (_t, pid) = start_workers(&ctx);
    let flags = ["-f", "work_a", "--format", "jsonl", "--interval", "0.05"];
    let (mut weft, _) = attach(&ctx, pid, &flags, 1);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let out = detach_with_sigint(&mut weft);
    let finals: Vec<Option<bool>> = out
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("one JSON report a line");
            ctx.check(v["pid"].as_u64() == Some(pid.into()), || {
                format!("not a report: {l}")
            });
            v["final"].as_bool()
        })
        .collect();
    ctx.check(finals.len() >= 2, || {
        format!("only {} lines:\n{out}", finals.len())
    });
    let (last, live) = finals.split_last().unwrap();
    ctx.check(
        *last == Some(true) && live.iter().all(|f| *f == Some(false)),
        || format!("`final` per line should be false... then true: {finals:?}"),
    );
    let exe = workers_c().to_str().unwrap();
    let mut w = ctx.weft(&[
        "run",
        "--format",
        "jsonl",
        "-f",
        "work_a",
        "--",
        exe,
        "--no-wait",
        "--threads",
        "2",
    ]);
    w.wait_code(0);
    let out = w.stdout_text();
    let reports: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with(r#"{"pid":"#))
        .collect();
    ctx.check(
        reports.len() == 1 && reports[0].ends_with(r#","final":true}"#),
        || format!("run --format jsonl: one final line expected:\n{out}"),
    );
}

/// `weft list` prints an IFUNC at the implementation the process uses, the
/// address `attach --format json` reports for it, or says it is resolved
/// at the first call; never the resolver's address.
#[test]
fn list_and_attach_agree_on_ifuncs() {
    let ctx = Ctx::new("list_and_attach_agree_on_ifuncs");
    let (_t, pid) = start_workers(&ctx);
    let p = pid.to_string();
    let mut agreed = Vec::new();
    for name in ["strlen", "memset", "strchr", "__memmove_chk"] {
        let pattern = format!("libc.so.6:{name}");
        let lines = list_lines(&ctx, &["list", "-p", &p, &pattern]);
        ctx.check(lines.len() == 1, || format!("{pattern}: {lines:?}"));
        let fields: Vec<&str> = lines[0].split(' ').collect();
        if lines[0].ends_with(&format!(" {name} (ifunc, resolved at first call)")) {
            ctx.check(fields[1] == "-", || format!("{pattern}: {lines:?}"));
            continue;
        }
        ctx.check(fields.len() == 4 && fields[3] == name, || {
            format!("{pattern}: {lines:?}")
        });
        let (mut weft, _) = attach(&ctx, pid, &["-f", &pattern, "--format", "json"], 1);
        let out = detach_with_sigint(&mut weft);
        let v: serde_json::Value = serde_json::from_str(out.trim()).expect("a JSON report");
        let attached = v["functions"][0]["address"]
            .as_str()
            .unwrap_or("")
            .to_string();
        ctx.check(attached == fields[1], || {
            format!(
                "{pattern}: list says {}, attach instrumented {attached}",
                fields[1]
            )
        });
        agreed.push(name);
    }
    // libc calls strlen itself through a slot the loader filled.
    ctx.check(agreed.contains(&"strlen"), || {
        format!("strlen was not resolved by list; agreed on {agreed:?}")
    });
}

/// Two names of one libc function (`printf` and its alias `_IO_printf`,
/// one address) in one attach are one function: instrumented once, one
/// report entry under the first name with the other in `aliases`, its calls
/// counted once and exact; the table heads it `printf (= _IO_printf)`.
/// The same with `--later`.
#[test]
fn aliases_are_one_function_in_the_report() {
    let ctx = Ctx::new("aliases_are_one_function_in_the_report");
    // With --later too, where patterns that match now are searched apart
    // from those that wait for a library.
    for (format, later) in [("json", false), ("table", false), ("json", true)] {
        let mut t = ctx.target(workers_c(), &["--threads", "2", "--phases", "2"]);
        let (pid, _) = wait_ready(&mut t);
        let mut flags = vec![
            "-f",
            "libc.so.6:printf",
            "-f",
            "libc.so.6:_IO_printf",
            "--format",
            format,
        ];
        if later {
            flags.extend(["--later", "-f", "libnot_loaded_yet.so:f"]);
        }
        let (mut weft, _) = attach(&ctx, pid, &flags, 1);
        t.send("go");
        t.expect_stdout("`phase 1 done`", |l| l == "phase 1 done");
        let out = detach_with_sigint(&mut weft);
        t.send("go");
        t.expect_stdout("`done`", |l| l == "done");
        t.wait_code(0);
        if format == "table" {
            ctx.check(out.contains("printf (= _IO_printf)"), || {
                format!("the table should head the column `printf (= _IO_printf)`:\n{out}")
            });
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(out.trim()).expect("a JSON report");
        let functions = v["functions"].as_array().expect("functions[]");
        ctx.check(functions.len() == 1, || {
            format!("one entry expected for printf and _IO_printf: {out}")
        });
        let f = &functions[0];
        ctx.check(
            f["name"] == "printf" && f["aliases"] == serde_json::json!(["_IO_printf"]),
            || format!("name printf, aliases [_IO_printf] expected: {out}"),
        );
        // Phase 1: one line per worker and `phase 1 done`, all printf.
        ctx.check(f["calls"].as_u64() == Some(3), || {
            format!("printf should count 3 calls: {out}")
        });
        let per_thread: u64 = v["threads"]
            .as_array()
            .expect("threads[]")
            .iter()
            .map(|t| t["functions"]["printf"]["calls"].as_u64().unwrap_or(0))
            .sum();
        ctx.check(per_thread == 3, || {
            format!("the threads' printf calls should add up to 3: {out}")
        });
    }
}
