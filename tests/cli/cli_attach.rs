//! `weft attach` and `weft list` against running workers targets.

use crate::support;

use std::path::Path;
use support::*;

const FLAGS: [&str; 8] = [
    "-f",
    "work_a",
    "-f",
    "work_b",
    "-f",
    "libwork.so:lib_work",
    "--format",
    "json",
];

fn modules(exe: &Path) -> Vec<(&'static str, String)> {
    worker_modules(exe)
}

fn check_modules(ctx: &Ctx, report: &Report, exe: &Path) {
    let m = modules(exe);
    let m: Vec<(&str, &str)> = m.iter().map(|(f, s)| (*f, s.as_str())).collect();
    check_report_modules(ctx, report, &m);
}

/// Attach before `go`; the target does one phase (including 2 threads created
/// after attach) and exits; weft ends with it and reports exact counts.
fn attach_until_exit(test: &str, exe: &Path) {
    let ctx = Ctx::new(test);
    let mut t = ctx.target(exe, &["--threads", "4", "--late-threads", "2"]);
    let (pid, threads) = wait_ready(&mut t);
    let before = thread_count(pid) as u32;
    ctx.check(threads == Some(before), || {
        format!("target says threads={threads:?}, /proc has {before}")
    });
    let (mut weft, a) = attach(&ctx, pid, &FLAGS, 3);
    ctx.check(a.threads == before, || {
        format!(
            "attached line says threads={}, the target has {before}",
            a.threads
        )
    });
    t.send("go");
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
    weft.wait_code(0);
    check_single_attached_line(&weft);
    let lines = check_worker_phase(&ctx, &t.stdout_text(), 1, 6);
    let report = parse_report(&ctx, &weft.stdout_text());
    ctx.check(report.pid == pid as i64, || {
        format!("report pid {} != {pid}", report.pid)
    });
    check_report_counts(
        &ctx,
        &report,
        &expect_from_workers(&lines, &WORKER_FUNCS),
        &WORKER_FUNCS,
    );
    check_modules(&ctx, &report, exe);
}

#[test]
fn attach_c_counts_exact_including_late_threads() {
    attach_until_exit("attach_c_counts_exact_including_late_threads", workers_c());
}

#[test]
fn attach_c_cf_protection_counts_exact() {
    attach_until_exit("attach_c_cf_protection_counts_exact", workers_c_cet());
}

#[test]
fn attach_rust_counts_exact_including_late_threads() {
    attach_until_exit(
        "attach_rust_counts_exact_including_late_threads",
        workers_rs(),
    );
}

/// Phase 1 attached (SIGINT detaches), phase 2 without weft, phase 3 attached
/// again until the target exits. Each attached phase is counted exactly, the
/// un-instrumented phase is correct by the target's own count.
fn phases(test: &str, exe: &Path) {
    let ctx = Ctx::new(test);
    let mut t = ctx.target(
        exe,
        &["--threads", "4", "--late-threads", "2", "--phases", "3"],
    );
    let (pid, _) = wait_ready(&mut t);

    // Phase 1, attached.
    let (mut weft1, _) = attach(&ctx, pid, &FLAGS, 3);
    t.send("go");
    t.expect_stdout("`phase 1 done`", |l| l == "phase 1 done");
    let out1 = detach_with_sigint(&mut weft1);
    let p1 = check_worker_phase(&ctx, &t.stdout_text(), 1, 6);
    let r1 = parse_report(&ctx, &out1);
    ctx.check(r1.pid == pid as i64, || {
        format!("report pid {} != {pid}", r1.pid)
    });
    check_report_counts(
        &ctx,
        &r1,
        &expect_from_workers(&p1, &WORKER_FUNCS),
        &WORKER_FUNCS,
    );
    check_modules(&ctx, &r1, exe);
    for th in &r1.threads {
        ctx.check(!th.exited, || {
            format!("thread {} is alive but the report says exited", th.tid)
        });
    }
    ctx.check(t.is_running(), || "the target died after detach".into());
    check_not_traced_nor_stopped(&ctx, pid);

    // Phase 2, no weft.
    t.send("go");
    t.expect_stdout("`phase 2 done`", |l| l == "phase 2 done");
    check_worker_phase(&ctx, &t.stdout_text(), 2, 6);

    // Phase 3, attached again; weft ends when the target exits.
    let before = thread_count(pid) as u32;
    let (mut weft2, a2) = attach(&ctx, pid, &FLAGS, 3);
    ctx.check(a2.threads == before, || {
        format!(
            "second attach: threads={}, the target has {before}",
            a2.threads
        )
    });
    t.send("go");
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
    weft2.wait_code(0);
    check_single_attached_line(&weft2);
    let p3 = check_worker_phase(&ctx, &t.stdout_text(), 3, 6);
    let r3 = parse_report(&ctx, &weft2.stdout_text());
    check_report_counts(
        &ctx,
        &r3,
        &expect_from_workers(&p3, &WORKER_FUNCS),
        &WORKER_FUNCS,
    );
}

#[test]
fn attach_detach_reattach_phases_c() {
    phases("attach_detach_reattach_phases_c", workers_c());
}

#[test]
fn attach_detach_reattach_phases_rust() {
    phases("attach_detach_reattach_phases_rust", workers_rs());
}

/// `--duration 1` ends by itself (exit 0, nothing counted: the target was
/// idle), and the target then runs its phases correctly.
#[test]
fn attach_duration_ends_by_itself() {
    let ctx = Ctx::new("attach_duration_ends_by_itself");
    let mut t = ctx.target(workers_c(), &["--threads", "4", "--phases", "2"]);
    let (pid, _) = wait_ready(&mut t);
    let mut args = FLAGS.to_vec();
    args.extend_from_slice(&["--duration", "1"]);
    let (mut weft, _) = attach(&ctx, pid, &args, 3);
    weft.wait_code(0);
    check_single_attached_line(&weft);
    let report = parse_report(&ctx, &weft.stdout_text());
    ctx.check(report.pid == pid as i64, || {
        format!("report pid {} != {pid}", report.pid)
    });
    check_report_zero(&ctx, &report, &WORKER_FUNCS);
    ctx.check(t.is_running(), || "the target died".into());
    check_not_traced_nor_stopped(&ctx, pid);
    t.send("go");
    t.expect_stdout("`phase 1 done`", |l| l == "phase 1 done");
    t.send("go");
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
    let text = t.stdout_text();
    check_worker_phase(&ctx, &text, 1, 4);
    check_worker_phase(&ctx, &text, 2, 4);
}

/// One parsed line of `weft list`: MODULE ADDRESS SIZE NAME.
#[derive(Debug)]
struct Listed {
    module: String,
    address: u64,
    name: String,
}

fn list(ctx: &Ctx, pid: u32, pattern: &str) -> Vec<Listed> {
    let p = pid.to_string();
    let mut w = ctx.weft(&["list", "-p", &p, pattern]);
    w.wait_code(0);
    let out = w.stdout_text();
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            ctx.check(f.len() == 4, || {
                format!("list line {l:?} is not `MODULE ADDRESS SIZE NAME`")
            });
            let size_ok = f[2].parse::<u64>().is_ok()
                || f[2]
                    .strip_prefix("0x")
                    .is_some_and(|h| u64::from_str_radix(h, 16).is_ok());
            ctx.check(size_ok, || format!("list line {l:?}: bad SIZE"));
            Listed {
                module: f[0].to_string(),
                address: parse_hex(ctx, f[1]),
                name: f[3].to_string(),
            }
        })
        .collect()
}

#[test]
fn list_functions_globs_modules_and_ifunc() {
    let ctx = Ctx::new("list_functions_globs_modules_and_ifunc");
    let exe = workers_c();
    let exe_name = exe.file_name().unwrap().to_string_lossy().into_owned();
    let mut t = ctx.target(exe, &["--threads", "2"]);
    let (pid, _) = wait_ready(&mut t);

    let l = list(&ctx, pid, "work_*");
    let mut names: Vec<&str> = l.iter().map(|x| x.name.as_str()).collect();
    names.sort();
    ctx.check(names == ["work_a", "work_b"], || {
        format!("`list work_*` gave {l:?}")
    });
    for x in &l {
        ctx.check(x.module == exe_name, || {
            format!("{x:?}: module should be {exe_name}")
        });
        ctx.check(
            addr_in_exec_mapping(pid, x.address, |f| f == exe_name),
            || {
                format!(
                    "{x:?}: address not in the executable's text\n{}",
                    maps_text(pid)
                )
            },
        );
    }

    let l = list(&ctx, pid, "libwork.so:*");
    ctx.check(l.iter().any(|x| x.name == "lib_work"), || {
        format!("`list libwork.so:*` lacks lib_work: {l:?}")
    });
    for x in &l {
        ctx.check(x.module == "libwork.so", || {
            format!("{x:?}: module should be libwork.so")
        });
    }
    let lw = l.iter().find(|x| x.name == "lib_work").unwrap();
    ctx.check(
        addr_in_exec_mapping(pid, lw.address, |f| f == "libwork.so"),
        || {
            format!(
                "{lw:?}: address not in libwork.so's text\n{}",
                maps_text(pid)
            )
        },
    );

    // memcpy is an IFUNC in glibc: listed, in libc.
    let l = list(&ctx, pid, "memcpy");
    let m = l
        .iter()
        .find(|x| x.name == "memcpy" && x.module.starts_with("libc.so"));
    ctx.check(m.is_some(), || {
        format!("`list memcpy` has no libc memcpy line: {l:?}")
    });
    let m = m.unwrap();
    ctx.check(
        addr_in_exec_mapping(pid, m.address, |f| f.starts_with("libc.so")),
        || format!("{m:?}: address not in libc's text\n{}", maps_text(pid)),
    );

    // Listing did not disturb the target.
    check_not_traced_nor_stopped(&ctx, pid);
    t.send("go");
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
    check_worker_phase(&ctx, &t.stdout_text(), 1, 2);
}

/// `--interval --format jsonl` writes reports read live, without stopping the
/// target: while it works, counts grow from line to line and never go back;
/// the last line is the final, exact report.
#[test]
fn attach_interval_jsonl_reports_live() {
    let ctx = Ctx::new("attach_interval_jsonl_reports_live");
    let mut t = ctx.target(workers_c(), &["--threads", "3", "--phases", "3"]);
    let (pid, _) = wait_ready(&mut t);
    let flags = ["-f", "work_a", "--format", "jsonl", "--interval", "0.05"];
    let (mut weft, _) = attach(&ctx, pid, &flags, 1);
    let mut done = Vec::new();
    for phase in 1..=3 {
        t.send("go");
        let line = format!("phase {phase} done");
        t.expect_stdout(&format!("`{line}`"), |l| l == line);
        done.push(check_worker_phase(&ctx, &t.stdout_text(), phase, 3));
        // Let a few interval reports see this phase's counts.
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let out = detach_with_sigint(&mut weft);
    let reports: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is one JSON report"))
        .collect();
    ctx.check(reports.len() >= 4, || {
        format!("only {} report lines:\n{out}", reports.len())
    });
    let totals: Vec<u64> = reports
        .iter()
        .map(|r| r["functions"][0]["calls"].as_u64().unwrap_or(0))
        .collect();
    ctx.check(totals.windows(2).all(|w| w[0] <= w[1]), || {
        format!("totals went back: {totals:?}")
    });
    // The live lines carry self times too (closed activations: they only
    // grow, and stay within the inclusive time).
    let own: Vec<Option<(u64, u64)>> = reports
        .iter()
        .map(|r| {
            let f = &r["functions"][0];
            Some((f["self_ns"].as_u64()?, f["wall_ns"].as_u64()?))
        })
        .collect();
    ctx.check(
        own.iter().all(|o| o.is_some_and(|(s, w)| s <= w))
            && own.windows(2).all(|w| w[0].unwrap().0 <= w[1].unwrap().0),
        || format!("self times of the live lines: {own:?}"),
    );
    // Intermediate reports saw the phases one after the other.
    let per_phase: Vec<u64> = done
        .iter()
        .map(|lines| lines.iter().map(|l| l.work_a).sum())
        .collect();
    let after_one = per_phase[0];
    let after_two = per_phase[0] + per_phase[1];
    ctx.check(totals.contains(&after_one) && totals.contains(&after_two), || {
        format!("no live report showed the totals after phase 1 ({after_one}) and 2 ({after_two}): {totals:?}")
    });
    let all: u64 = per_phase.iter().sum();
    ctx.check(totals.last() == Some(&all), || {
        format!("final total {:?}, the target made {all}", totals.last())
    });
    t.close_stdin();
}

/// `weft attach --later`: a pattern for a library the program has not
/// loaded yet waits for it; the program loads it and calls it at once,
/// and every call is counted (the load waited for weft); weft says what it
/// waits for and what it instrumented, and the report has no trace of its
/// own loader hook.
#[test]
fn attach_later_instruments_a_library_at_its_load() {
    let ctx = Ctx::new("attach_later_instruments_a_library_at_its_load");
    let (exe, lib) = lateload();
    let mut t = ctx.target(exe, &[]);
    let (pid, _) = wait_ready(&mut t);
    let p = pid.to_string();
    // Without --later the pattern is an error, as before.
    let mut plain = ctx.weft(&["attach", "-p", &p, "-f", "libwork.so:lib_work"]);
    plain.wait_code(1);
    ctx.check(plain.stderr_text().contains("no function matches"), || {
        format!("without --later: {}", plain.stderr_text())
    });
    let mut weft = ctx.weft(&[
        "attach",
        "-p",
        &p,
        "-f",
        "libwork.so:lib_work",
        "--later",
        "-m",
        "calls",
        "--format",
        "json",
    ]);
    weft.expect_line(Stream::Stderr, "the waiting line", |l| {
        l.starts_with("weft: waiting for libraries loaded later for libwork.so:lib_work")
    });
    let a = wait_attached(&mut weft);
    ctx.check(a.functions == 0, || {
        format!("functions now: {}", a.functions)
    });
    t.send(&format!("loadcall 300 {}", lib.display()));
    t.expect_stdout("`called 300`", |l| l == "called 300");
    weft.expect_line(Stream::Stderr, "the instrumented line", |l| {
        l.starts_with("weft: instrumented 1 functions of") && l.ends_with("libwork.so")
    });
    let text = detach_with_sigint(&mut weft);
    let report = parse_report(&ctx, &text);
    let calls: Vec<(String, u64)> = report
        .functions
        .iter()
        .map(|f| (f.name.clone(), f.calls))
        .collect();
    ctx.check(calls == [("lib_work".to_string(), 300)], || {
        format!("the report's functions: {calls:?}")
    });
    check_not_traced_nor_stopped(&ctx, pid);
    t.send("quit");
    t.wait_code(0);
}
