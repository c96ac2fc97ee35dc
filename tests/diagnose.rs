//! `weft diagnose` on a target with a planted CPU bottleneck behind a
//! function-pointer table: the search refines down the true path only,
//! resolves the table's targets at run time, finds `hot` in the worker
//! thread with about the share the target measures itself, reports no
//! decoy, and leaves the target running unchanged.

mod support;

use std::path::PathBuf;
use std::process::Command;
use support::*;

fn target() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("weft-targets-diagnose");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("diagnose_cpu");
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/targets/diagnose_cpu.c");
    let out = Command::new("gcc")
        .args(["-O1", "-fno-inline", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("gcc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// The target's own latest `share hot=… decoy=…` line.
fn own_shares(text: &str) -> Option<(f64, f64)> {
    let l = text.lines().rev().find(|l| l.starts_with("share "))?;
    let mut it = l.split_whitespace().skip(1).map(|kv| {
        kv.split_once('=')
            .and_then(|(_, v)| v.parse::<f64>().ok())
            .unwrap_or(-1.0)
    });
    Some((it.next()?, it.next()?))
}

#[test]
fn finds_the_cpu_bottleneck_behind_a_function_pointer_table() {
    let ctx = Ctx::new("finds_the_cpu_bottleneck_behind_a_function_pointer_table");
    let exe = target();
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
    w.wait_code(0);
    let d: serde_json::Value = serde_json::from_str(&w.stdout_text())
        .unwrap_or_else(|e| ctx.fail(format!("diagnosis is not JSON: {e}")));
    let err = w.stderr_text();
    ctx.check(err.contains("the search is exhausted"), || {
        format!("the search did not finish by itself:\n{err}")
    });
    ctx.check(
        err.contains("weft: testing cpu in worker > step > handle > hot"),
        || "no progress line for the test of hot".into(),
    );
    let bottlenecks = d["bottlenecks"].as_array().cloned().unwrap_or_default();
    ctx.check(bottlenecks.len() == 1, || {
        format!("one bottleneck expected: {bottlenecks:?}")
    });
    let b = &bottlenecks[0];
    let path: Vec<&str> = b["path"]
        .as_array()
        .map(|p| p.iter().filter_map(|s| s.as_str()).collect())
        .unwrap_or_default();
    ctx.check(path == ["worker", "step", "handle", "hot"], || {
        format!("bottleneck path {path:?}")
    });
    ctx.check(b["hypothesis"] == "cpu", || {
        format!("hypothesis {}", b["hypothesis"])
    });
    // The worker thread: not the main thread (the target's pid).
    let threads: Vec<u64> = b["threads"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_u64()).collect())
        .unwrap_or_default();
    ctx.check(threads.len() == 1 && threads[0] != t.pid as u64, || {
        format!("threads {threads:?} (target pid {})", t.pid)
    });
    // No decoy: decoy (~15%) tested false.
    let nodes = d["nodes"].as_array().cloned().unwrap_or_default();
    let decoy = nodes
        .iter()
        .find(|n| n["path"].as_array().and_then(|p| p.last()) == Some(&"decoy".into()));
    ctx.check(decoy.is_some_and(|n| n["state"] == "false"), || {
        format!("decoy's test: {decoy:?}")
    });
    // The value agrees with the target's own clocks.
    let (hot, _) = own_shares(&t.stdout_text()).unwrap_or_else(|| ctx.fail("no share line"));
    let value = b["value"].as_f64().unwrap_or(-1.0);
    eprintln!("hot: weft {value:.3}, the target's own clocks {hot:.3}");
    ctx.check((value - hot).abs() <= 0.10, || {
        format!("weft says hot takes {value:.3}, the target {hot:.3}")
    });
    // Bounded instrumentation: fewer functions than the executable has.
    let s = &d["summary"];
    ctx.check(
        s["functions_probed"].as_u64() < s["functions_reachable"].as_u64(),
        || format!("summary {s}"),
    );
    // The target runs on.
    let before = t.stdout_text().lines().count();
    std::thread::sleep(std::time::Duration::from_millis(2500));
    ctx.check(
        t.is_running() && t.stdout_text().lines().count() > before,
        || "the target stopped after the diagnosis".into(),
    );
    t.close_stdin();
    t.wait_exit();
}
