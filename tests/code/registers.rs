//! The target's registers, flags and stack reach an instrumented function
//! exactly as its caller left them, under every metric selection (issue
//! #12: timers used to hand the function `rbx` = its activation cell, which
//! Go's register ABI reads as an argument). The target (tests/targets/regs.c
//! and regs_asm.S) checks every general register, the arithmetic flags, DF,
//! `rsp` and its own frame inside `checked`, and the return value,
//! callee-saved registers and `rsp` after it returns.

use crate::support;

use support::*;
use weft::{Metrics, Pattern, ProbeSpec, Process, UserProbe};

const THREADS: u64 = 3;
const CALLS: u64 = 20_000;
const METRIC_SETS: [&str; 5] = [
    "calls",
    "calls,wall",
    "calls,wall,cpu",
    "calls,trace",
    "calls,wall,cpu,trace",
];

/// Checks the target's per-thread lines and verdict: every call made, no
/// mismatch.
#[track_caller]
fn check_target_output(ctx: &Ctx, stdout: &str, how: &str) {
    let lines: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("{\"thread\""))
        .collect();
    ctx.check(lines.len() as u64 == THREADS, || {
        format!("{how}: {} thread lines, expected {THREADS}", lines.len())
    });
    for l in &lines {
        let v: serde_json::Value = serde_json::from_str(l)
            .unwrap_or_else(|e| ctx.fail(format!("{how}: bad line {l:?}: {e}")));
        ctx.check(
            v["calls"] == CALLS && v["inside"] == 0 && v["after"] == 0,
            || {
                format!(
                    "{how}: the instrumented function saw a changed register, flag or stack \
                     word (mask bits: 0-14 rax..r15 inside, 15 rsp, 16 flags, 17-25 frame \
                     words, 32+ after the return): {l}"
                )
            },
        );
    }
    ctx.check(stdout.lines().any(|l| l == "verdict ok"), || {
        format!("{how}: no `verdict ok` line")
    });
}

/// Every thread's `checked` counts add up to the exact number of calls,
/// and with exit hooks every call returned through them.
#[track_caller]
fn check_report(ctx: &Ctx, report: &Report, metrics: &str, how: &str) {
    let mut calls = 0;
    for t in &report.threads {
        let c = report.counts(t.tid, "checked");
        if c.calls == 0 {
            continue;
        }
        ctx.check(c.calls == CALLS, || {
            format!(
                "{how}: thread {} made {} calls, expected {CALLS}",
                t.tid, c.calls
            )
        });
        if metrics != "calls" {
            ctx.check(c.exits == Some(CALLS) && c.unwound == Some(0), || {
                format!(
                    "{how}: thread {}: {c:?}, every call returned normally",
                    t.tid
                )
            });
        }
        calls += c.calls;
    }
    ctx.check(calls == THREADS * CALLS, || {
        format!(
            "{how}: {calls} calls of `checked` in the report, expected {}",
            THREADS * CALLS
        )
    });
}

#[test]
fn run_every_metric_set() {
    let ctx = Ctx::new("run_every_metric_set");
    let exe = regs().to_str().unwrap().to_string();
    let (threads, calls) = (THREADS.to_string(), CALLS.to_string());
    for metrics in METRIC_SETS {
        let how = format!("weft run -m {metrics}");
        let file = scratch_dir(&format!("run_every_metric_set_{metrics}")).join("report.json");
        let file_s = file.to_str().unwrap().to_string();
        let mut weft = ctx.weft(&[
            "run", "-m", metrics, "-f", "checked", "--format", "json", "-o", &file_s, "--", &exe,
            &threads, &calls, "now",
        ]);
        let st = weft.wait_exit();
        check_target_output(&ctx, &weft.stdout_text(), &how);
        ctx.check(st.code() == Some(0), || format!("{how} ended with {st:?}"));
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| ctx.fail(format!("{how}: cannot read {file_s}: {e}")));
        check_report(&ctx, &parse_report(&ctx, &text), metrics, &how);
    }
}

#[test]
fn attach_every_metric_set() {
    let ctx = Ctx::new("attach_every_metric_set");
    let (threads, calls) = (THREADS.to_string(), CALLS.to_string());
    for metrics in METRIC_SETS {
        let how = format!("weft attach -m {metrics}");
        let mut t = ctx.target(regs(), &[&threads, &calls]);
        let (pid, _) = wait_ready(&mut t);
        let (mut weft, _) = attach(
            &ctx,
            pid,
            &["-f", "checked", "-m", metrics, "--format", "json"],
            1,
        );
        t.send("go");
        t.expect_stdout("the verdict", |l| l.starts_with("verdict"));
        t.wait_exit();
        check_target_output(&ctx, &t.stdout_text(), &how);
        weft.wait_code(0);
        check_report(
            &ctx,
            &parse_report(&ctx, &weft.stdout_text()),
            metrics,
            &how,
        );
    }
}

/// User probes (a C function that changes every caller-saved register and
/// DF on its way): exit-only on a counted and on a timed function, and at
/// entry and exit of a timed one.
#[test]
fn user_probes_change_nothing_the_caller_sees() {
    let ctx = Ctx::new("user_probes_change_nothing_the_caller_sees");
    let (threads, calls) = (THREADS.to_string(), CALLS.to_string());
    for (metrics, at_entry) in [
        (Metrics::CALLS, false),
        (Metrics::ALL, false),
        (Metrics::ALL, true),
    ] {
        let how = format!(
            "{} probe with {:?}",
            if at_entry { "entry and exit" } else { "exit" },
            metrics.names()
        );
        let mut t = ctx.target(regs(), &[&threads, &calls]);
        let (pid, _) = wait_ready(&mut t);
        let fail = |what: &str, e: weft::Error| -> ! { ctx.fail(format!("{how}: {what}: {e}")) };
        let mut p = Process::open(pid as i32).unwrap_or_else(|e| fail("open", e));
        let checked = p
            .find_functions(&[Pattern::parse("checked").unwrap()])
            .unwrap_or_else(|e| fail("find_functions", e))
            .remove(0);
        let mut held = p.hold().unwrap_or_else(|e| fail("hold", e));
        let lib = held
            .load_library(probe_lib())
            .unwrap_or_else(|e| fail("load_library", e));
        let function = lib
            .symbol(held.image(), "on_clobber")
            .unwrap_or_else(|| ctx.fail(format!("{how}: no on_clobber in the probe library")));
        let probe = UserProbe {
            function,
            user: 0,
            predicate: None,
        };
        held.insert_probes(&[ProbeSpec {
            on_entry: at_entry.then_some(probe),
            on_exit: Some(probe),
            ..ProbeSpec::measure(checked, metrics)
        }])
        .unwrap_or_else(|e| fail("insert_probes", e));
        held.release().unwrap_or_else(|e| fail("release", e));
        t.send("go");
        t.expect_stdout("the verdict", |l| l.starts_with("verdict"));
        t.wait_exit();
        check_target_output(&ctx, &t.stdout_text(), &how);
        let report = p.report();
        let total: u64 = report.functions.iter().map(|f| f.calls).sum();
        ctx.check(total == THREADS * CALLS, || {
            format!("{how}: {total} calls counted, expected {}", THREADS * CALLS)
        });
    }
}
