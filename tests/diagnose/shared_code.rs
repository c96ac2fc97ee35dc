//! Bottlenecks behind shared code (issue #31, §1): a CPU leaf and two
//! decoys that all spin through one helper, a contended mutex taken
//! through a wrapper shared with an uncontended one, and blocking small
//! reads through a helper shared with a fast path
//! (tests/targets/diagnose_shared.c, built `-O2 -g`: the wrappers and
//! the dispatcher end in tail calls, so stacks skip their frames). Every
//! search must name exactly the planted paths, threads and objects — never
//! a decoy's path, which an unconstrained timer of the shared helper makes
//! look as hot as the planted one — with values near the target's own
//! clocks.

use crate::diagnose_acceptance::STEAL_QUIET;
use crate::support;

use std::collections::BTreeMap;
use support::*;

/// Searches of one target, one after another.
const RUNS: usize = 20;
/// Searches more that may be made for those the hypervisor disturbed
/// (see [`STEAL_DISTURBING`]): a machine stolen for longer fails the test.
const RETRIES: usize = 10;
/// The share of the machine stolen beyond which a wrong search is printed,
/// not counted: the CPU leaf's share shrinks with the steal (the kernel
/// leaves stolen time out of the thread's CPU time, not out of its wall
/// time), and a fresh-clone CI run with 8.1% stolen found the CPU path
/// only down to the dispatcher. diagnose_acceptance holds 10% for a
/// target whose leaf stands further above its threshold.
const STEAL_DISTURBING: f64 = 0.05;

fn target() -> std::path::PathBuf {
    build_c_target("diagnose_shared", &["-O2", "-g", "-pthread"])
}

/// `want` appears in `path` in this order, others between.
fn in_order(path: &[String], want: &[&str]) -> bool {
    let mut it = path.iter();
    want.iter().all(|w| it.any(|p| p == w))
}

fn strs(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect()
}

/// The target's threads by name (`/proc/PID/task/*/comm`).
fn threads_by_name(pid: u32) -> BTreeMap<String, Vec<u64>> {
    let mut by = BTreeMap::<String, Vec<u64>>::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let tid: u64 = e.file_name().to_string_lossy().parse().unwrap();
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        by.entry(comm.trim().to_string()).or_default().push(tid);
    }
    by
}

/// The latest `key=value` of a line starting with `prefix`.
fn own(text: &str, prefix: &str, key: &str) -> f64 {
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with(prefix))
        .unwrap_or("");
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(-1.0)
}

/// The target's own share `key` over `[from, to]` (CLOCK_MONOTONIC
/// seconds, the span weft says it measured over), from its `wait` lines,
/// which give each share since the start over `span_key` seconds: the
/// line at or before `from` and the one at or after `to` (or the nearest)
/// bound the window. None when they are one line.
fn own_over(text: &str, key: &str, span_key: &str, from: f64, to: f64) -> Option<f64> {
    let lines: Vec<(f64, f64, f64)> = text
        .lines()
        .filter(|l| l.starts_with("wait "))
        .filter_map(|l| {
            let field = |k: &str| {
                l.split_whitespace()
                    .filter_map(|kv| kv.split_once('='))
                    .find(|(name, _)| *name == k)
                    .and_then(|(_, v)| v.parse::<f64>().ok())
            };
            Some((field("now")?, field(key)?, field(span_key)?))
        })
        .collect();
    let a = lines.iter().rev().find(|l| l.0 <= from).or(lines.first())?;
    let b = lines.iter().find(|l| l.0 >= to).or(lines.last())?;
    (b.2 > a.2).then(|| (b.1 * b.2 - a.1 * a.2) / (b.2 - a.2))
}

/// The span a bottleneck's value was measured over (`measured`).
fn measured(b: &serde_json::Value) -> Option<(f64, f64)> {
    Some((b["measured"][0].as_f64()?, b["measured"][1].as_f64()?))
}

#[test]
fn shared_helpers_hide_no_path_every_run() {
    let _one = one_at_a_time();
    let ctx = Ctx::new("shared_helpers_hide_no_path_every_run");
    let mut t = ctx.target(&target(), &[]);
    let objects = t.expect_stdout("objects", |l| l.starts_with("objects "));
    t.expect_stdout("ready", |l| l == "ready");
    let field = |k: &str| {
        objects
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(k))
            .unwrap_or_else(|| ctx.fail(format!("no {k} in {objects:?}")))
            .to_string()
    };
    let mutex = u64::from_str_radix(field("mutex=").trim_start_matches("0x"), 16).unwrap();
    let pipe_fd = field("pipe=");
    let names = threads_by_name(t.pid);
    let tids = |n: &str| names.get(n).cloned().unwrap_or_default();
    let pid = t.pid.to_string();
    let mut failures = Vec::new();
    let (mut counted, mut disturbed, mut compared) = (0, 0, 0);
    for run in 1..=RUNS + RETRIES {
        if counted == RUNS {
            break;
        }
        let steal_before = steal_ticks();
        let mut w = ctx.weft(&[
            "diagnose",
            "-p",
            &pid,
            // Ends (partial) before the wait below gives up (60 s): a
            // search the hypervisor slowed to the bound once outlived it.
            "--duration",
            "45",
            "--format",
            "json",
        ]);
        w.wait_code(0);
        let d: serde_json::Value = serde_json::from_str(&w.stdout_text())
            .unwrap_or_else(|e| ctx.fail(format!("run {run}: diagnosis is not JSON: {e}")));
        let text = t.stdout_text();
        // The hypervisor taking the vCPUs away stretches the target's
        // elapsed time, not its CPU time, and weft's CPU clock counts
        // part of it (docs/exits-and-timers.md): values are compared on a
        // machine it leaves alone, as in diagnose_acceptance.
        let steal = machine_steal_share(steal_before, steal_ticks());
        let compare = steal <= STEAL_QUIET;
        compared += usize::from(compare);
        let off = |value: f64, truth: f64| compare && (value - truth).abs() > 0.05;
        let mut wrong = Vec::new();
        let bottlenecks = d["bottlenecks"].as_array().cloned().unwrap_or_default();
        let mut found = [false; 3];
        // (weft's value, the target's own) of each planted bottleneck.
        let mut values = [(f64::NAN, f64::NAN); 3];
        for b in &bottlenecks {
            let path = strs(&b["path"]);
            let threads: Vec<u64> = b["threads"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_u64())
                .collect();
            let value = b["value"].as_f64().unwrap_or(-1.0);
            let hypothesis = b["hypothesis"].as_str().unwrap_or("");
            let object = b["object"].as_str().unwrap_or("");
            // Neither the path nor any other path merged into it (a
            // tail call hides the caller's frame from a stack, so one
            // finding may be reached by several) passes a decoy.
            let mut paths = vec![path.clone()];
            paths.extend(b["also_via"].as_array().into_iter().flatten().map(strs));
            let decoy = paths.iter().find(|p| {
                ["h_checksum", "decode", "update_local", "fast_path"]
                    .iter()
                    .any(|d| p.iter().any(|f| f == d))
            });
            if let Some(p) = decoy {
                wrong.push(format!("a decoy's path: {hypothesis} {}", p.join(" > ")));
                continue;
            }
            // dispatch and h_transform end in tail calls: a path from a
            // stack goes from serve_batch to kernel_mix.
            if hypothesis == "cpu" && in_order(&path, &["serve_batch", "kernel_mix"]) {
                found[0] = true;
                let truth = own(&text, "share ", "kernel_mix");
                values[0] = (value, truth);
                if threads != tids("compute") || off(value, truth) {
                    wrong.push(format!(
                        "cpu: threads {threads:?} (compute {:?}), value {value:.3} against the \
                         target's {truth:.3}",
                        tids("compute")
                    ));
                }
            } else if hypothesis == "sync"
                && path.iter().any(|f| f == "update_shared")
                && path
                    .iter()
                    .any(|f| f.contains("mutex_lock") || f.contains("lll_lock"))
            {
                found[1] = true;
                // Over the span weft measured it (the lock's share moves
                // with the machine's load: since the start it read 0.38
                // while a loaded run's window read 0.33).
                let truth = measured(b)
                    .and_then(|(from, to)| own_over(&text, "lock", "lock_t", from, to))
                    .unwrap_or_else(|| own(&text, "wait ", "lock"));
                values[1] = (value, truth);
                let at = u64::from_str_radix(object.trim_start_matches("0x"), 16).unwrap_or(0);
                let mut lockers = tids("locker");
                lockers.sort();
                let mut th = threads.clone();
                th.sort();
                if th != lockers || at != mutex || off(value, truth) {
                    wrong.push(format!(
                        "sync: threads {th:?} (lockers {lockers:?}), object {object} (mutex \
                         {mutex:#x}), value {value:.3} against the target's {truth:.3}"
                    ));
                }
            } else if hypothesis == "io"
                && path.iter().any(|f| f == "read_record")
                && path
                    .last()
                    .is_some_and(|f| f == "read" || f == "__libc_read")
            {
                found[2] = true;
                let truth = measured(b)
                    .and_then(|(from, to)| own_over(&text, "read", "read_t", from, to))
                    .unwrap_or_else(|| own(&text, "wait ", "read"));
                values[2] = (value, truth);
                let fd_ok =
                    object.starts_with(&format!("fd {pipe_fd} ")) && object.contains("pipe:");
                if threads != tids("reader") || !fd_ok || off(value, truth) {
                    wrong.push(format!(
                        "io: threads {threads:?} (reader {:?}), object {object:?} (pipe fd \
                         {pipe_fd}), value {value:.3} against the target's {truth:.3}",
                        tids("reader")
                    ));
                }
            } else {
                wrong.push(format!("not planted: {hypothesis} {}", path.join(" > ")));
            }
        }
        for (i, what) in ["the CPU leaf", "the contended lock", "the blocking read"]
            .iter()
            .enumerate()
        {
            if !found[i] {
                wrong.push(format!("{what} not found"));
            }
        }
        // Frugal: a small part of what the executable and its libraries
        // hold.
        let s = &d["summary"];
        let (probed, reachable) = (
            s["functions_probed"].as_u64().unwrap_or(u64::MAX),
            s["functions_reachable"].as_u64().unwrap_or(0),
        );
        if probed * 10 >= reachable {
            wrong.push(format!(
                "{probed} of {reachable} reachable functions probed"
            ));
        }
        eprintln!(
            "run {run}: {} bottlenecks, {probed} of {reachable} functions probed, the \
             hypervisor stole {:.1}% of the machine; (weft, own) cpu {:.3?} lock {:.3?} read \
             {:.3?}{}{}",
            bottlenecks.len(),
            100.0 * steal,
            values[0],
            values[1],
            values[2],
            if compare {
                ""
            } else {
                " (values not compared)"
            },
            if wrong.is_empty() {
                String::new()
            } else {
                format!(": {wrong:?}")
            }
        );
        // Steal can leave the CPU leaf under its threshold and make stolen
        // time inside a function read as a wait: such a search is printed,
        // not counted, and another made.
        if !wrong.is_empty() && steal > STEAL_DISTURBING {
            disturbed += 1;
            continue;
        }
        counted += 1;
        if !wrong.is_empty() {
            failures.push(format!("run {run}: {}", wrong.join("; ")));
        }
    }
    ctx.check(counted == RUNS, || {
        format!(
            "only {counted} of {RUNS} searches counted: the hypervisor stole over {:.0}% of the \
             machine in {disturbed} others",
            100.0 * STEAL_DISTURBING
        )
    });
    ctx.check(failures.is_empty(), || {
        format!(
            "{} of {RUNS} searches wrong:\n{}",
            failures.len(),
            failures.join("\n")
        )
    });
    eprintln!("{compared} of {counted} searches compared values with the target's own");
    ctx.check(t.is_running(), || "the target stopped".into());
    // Every search over, the threads' CPU clocks have let their perf
    // events go (each costs its thread at every context switch), or the
    // CPU-time table.
    let events = std::fs::read_to_string(format!("/proc/{}/maps", t.pid))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.ends_with("[perf_event]") || l.ends_with("anon_inode:bpf-map"))
        .count();
    ctx.check(events == 0, || {
        format!("{events} perf event pages or CPU-time tables in the target after the searches")
    });
    t.close_stdin();
    t.wait_exit();
}
