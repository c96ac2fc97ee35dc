//! Threads that start after the search began, inside a function they
//! never leave (tests/targets/diagnose_late.c, built `-O2 -g`): the
//! probe on that function goes in after the thread entered it, so its
//! timer never runs; the search must see the thread inside it when the
//! probe goes in (Paradyn's catch-up) and go on down to the CPU-bound
//! leaf, with values near the threads' own clocks. Before the catch-up
//! the frame read 0% and the search stopped at the thread's root (CPython
//! workers started by a script after `weft diagnose` attached: every
//! test of theirs false at 0%).

use crate::support;

use support::*;

/// The latest `crunch=` share thread `tid` printed.
fn own_share(text: &str, tid: u64) -> Option<f64> {
    let prefix = format!("share tid={tid} crunch=");
    text.lines()
        .rev()
        .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
}

#[test]
fn threads_started_during_the_search_are_followed_into_frames_they_never_leave() {
    let _one = one_at_a_time();
    let ctx =
        Ctx::new("threads_started_during_the_search_are_followed_into_frames_they_never_leave");
    let exe = build_c_target("diagnose_late", &["-O2", "-g", "-pthread"]);
    let mut t = ctx.target(&exe, &[]);
    t.expect_stdout("ready", |l| l == "ready");
    let pid = t.pid.to_string();
    let mut w = ctx.weft(&[
        "diagnose",
        "-p",
        &pid,
        "--duration",
        "40",
        "--format",
        "json",
    ]);
    // The search has begun (its first tests are said) before the
    // threads exist.
    w.expect_line(Stream::Stderr, "the first test", |l| {
        l.starts_with("weft: testing")
    });
    t.send("go");
    t.expect_stdout("started", |l| l == "started");
    let late: Vec<u64> = {
        let mut v: Vec<u64> = std::fs::read_dir(format!("/proc/{}/task", t.pid))
            .unwrap()
            .flatten()
            .filter(|e| {
                std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "late")
            })
            .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
            .collect();
        v.sort();
        v
    };
    ctx.check(late.len() == 2, || format!("late threads: {late:?}"));
    w.wait_code(0);
    let d: serde_json::Value = serde_json::from_str(&w.stdout_text())
        .unwrap_or_else(|e| ctx.fail(format!("the diagnosis is not JSON: {e}")));
    let text = t.stdout_text();
    let all = d["bottlenecks"].as_array().cloned().unwrap_or_default();
    let path = |b: &serde_json::Value| -> Vec<String> {
        b["path"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect()
    };
    let crunch: Vec<&serde_json::Value> = all
        .iter()
        .filter(|b| {
            let p = path(b);
            b["hypothesis"] == "cpu"
                && p.last().is_some_and(|f| f == "crunch")
                && p.iter().any(|f| f == "serve")
        })
        .collect();
    ctx.check(!crunch.is_empty(), || {
        format!(
            "no CPU bottleneck down to serve > crunch: {all:?}\n{}",
            w.stderr_text()
        )
    });
    let mut seen: Vec<u64> = Vec::new();
    for b in &crunch {
        let threads: Vec<u64> = b["threads"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_u64())
            .collect();
        let value = b["value"].as_f64().unwrap_or(-1.0);
        for tid in &threads {
            ctx.check(late.contains(tid), || {
                format!("{b}: thread {tid} is not a late one {late:?}")
            });
            let own = own_share(&text, *tid).unwrap_or(-1.0);
            ctx.check((value - own).abs() <= 0.1, || {
                format!("{b}: value {value:.3}, thread {tid}'s own {own:.3}")
            });
        }
        seen.extend(threads);
    }
    seen.sort();
    seen.dedup();
    ctx.check(seen == late, || {
        format!("crunch found on threads {seen:?}, the late ones are {late:?}")
    });
    // Nothing above the leaf is called the bottleneck on its own.
    ctx.check(
        !all.iter().any(|b| {
            b["hypothesis"] == "cpu" && path(b).last().is_some_and(|f| f == "serve" || f == "batch")
        }),
        || format!("a frame above crunch named: {all:?}"),
    );
    t.close_stdin();
    t.wait_exit();
}
