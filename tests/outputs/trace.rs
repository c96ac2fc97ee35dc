//! Call traces (`-m trace`, docs/trace.md): every call of a known per-thread
//! sequence appears once, properly nested, in order, in the Chrome trace
//! (read by python3's json module, not by weft's code), for `weft run` and
//! `weft attach`; the flame graph is an SVG that python3's XML parser reads,
//! with the functions in its frames; a ring far too small for the call
//! rate drops events, says so, and the target finishes. Both files are
//! also loaded into real viewers in headless Chromium (Debian's
//! chromium-headless-shell; tests/viewers/): speedscope's web app imports
//! the trace, and Chromium draws the flame graph.
//!
//! The target (tests/targets/trace_calls.c) logs each call itself as it
//! happens and prints its log per thread: the reference the trace must
//! match letter for letter.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use support::viewers::{chromium, speedscope};
use support::*;

const FUNCS: [&str; 4] = ["-f", "outer,middle,recurse,leaf", "-m", "calls,trace"];

/// Reads a Chrome trace with python3's json module, checks its structure
/// (traceEvents; every event has ph; begin and end events have name, ts,
/// pid, tid; each tid has a thread_name; a thread's events go forward in
/// time and every end closes the innermost open call of its name), and
/// prints, per tid, the calls as the target logs them: first letter and
/// "(" at the start, ")" at the end.
const CHROME_READER: &str = r#"
import json, sys
d = json.load(open(sys.argv[1]))
assert isinstance(d, dict) and isinstance(d["traceEvents"], list), "no traceEvents list"
names, pids = {}, set()
# Per thread: the call sequence, the open calls (name, start), the last ts.
seqs, stacks, last = {}, {}, {}
ended = {}
for e in d["traceEvents"]:
    ph = e["ph"]
    if ph == "M":
        if e["name"] == "thread_name":
            names[e["tid"]] = e["args"]["name"]
        continue
    assert ph in ("B", "E"), "unexpected ph %r" % ph
    for k in ("name", "ts", "pid", "tid"):
        assert k in e, "event without %s: %r" % (k, e)
    assert e["ts"] >= 0, e
    pids.add(e["pid"])
    tid, ts, name = e["tid"], round(e["ts"] * 1000), e["name"]
    assert ts >= last.get(tid, 0), "%s at %d goes back in time (last %d)" % (name, ts, last[tid])
    last[tid] = ts
    seq, stack = seqs.setdefault(tid, []), stacks.setdefault(tid, [])
    if ph == "B":
        seq.append(name[0] + "(")
        stack.append((name, e.get("args")))
        kinds = ended.setdefault(name, {})
        kind = e.get("args", {}).get("ended", "returned")
        kinds[kind] = kinds.get(kind, 0) + 1
    else:
        assert stack, "%s ends at %d with no call open" % (name, ts)
        assert stack[-1] == (name, e.get("args")), "%s ends at %d inside %r" % (name, ts, stack[-1])
        stack.pop()
        seq.append(")")
assert len(pids) <= 1, "several pids: %r" % pids
for tid, stack in stacks.items():
    assert not stack, "tid %r: calls never ended: %r" % (tid, stack)
    assert tid in names, "tid %r has no thread_name" % tid
out = {str(tid): "".join(seq) for tid, seq in seqs.items()}
print(json.dumps({"threads": out, "names": {str(k): v for k, v in names.items()},
                  "ended": ended, "dropped": d.get("otherData", {}).get("dropped_events")}))
"#;

/// Parses an SVG with python3's xml.etree and prints its <title> texts.
const SVG_READER: &str = r#"
import json, sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
assert root.tag.endswith("svg"), root.tag
print(json.dumps([t.text or "" for t in root.iter() if t.tag.endswith("title")]))
"#;

fn python(ctx: &Ctx, script: &str, file: &Path) -> serde_json::Value {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(file)
        .output()
        .unwrap_or_else(|e| ctx.fail(format!("cannot run python3: {e}")));
    ctx.check(out.status.success(), || {
        format!(
            "python3 rejected {}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| ctx.fail(format!("python3's output: {e}")))
}

/// `weft run WEFT_ARGS --format FORMAT -o FILE -- PROGRAM…`, waited for
/// (exit 0).
fn run_to_file(ctx: &Ctx, weft_args: &[&str], format: &str, file: &Path, program: &[&str]) -> Proc {
    let mut args = vec!["run"];
    args.extend(weft_args);
    args.extend(["--format", format, "-o", file.to_str().unwrap(), "--"]);
    args.extend(program);
    let mut weft = ctx.weft(&args);
    weft.wait_code(0);
    weft
}

/// The `<title>` texts of an SVG, as python's XML parser reads them.
fn svg_titles(ctx: &Ctx, file: &Path) -> Vec<String> {
    python(ctx, SVG_READER, file)
        .as_array()
        .unwrap_or_else(|| ctx.fail("no titles"))
        .iter()
        .filter_map(|t| t.as_str().map(str::to_string))
        .collect()
}

/// The target's own log per tid ("T <tid> <log>" lines).
fn logged(stdout: &str) -> BTreeMap<String, String> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("T "))
        .filter_map(|l| l.split_once(' '))
        .map(|(tid, log)| (tid.to_string(), log.to_string()))
        .collect()
}

/// Every thread's trace is exactly its log.
#[track_caller]
fn check_sequences(
    ctx: &Ctx,
    trace: &serde_json::Value,
    want: &BTreeMap<String, String>,
    threads: usize,
    how: &str,
) {
    ctx.check(want.len() == threads, || {
        format!(
            "{how}: the target printed {} thread logs, expected {threads}",
            want.len()
        )
    });
    for (tid, log) in want {
        let got = trace["threads"][tid].as_str().unwrap_or_else(|| {
            ctx.fail(format!(
                "{how}: thread {tid} is not in the trace: {}",
                trace["names"]
            ))
        });
        if got != log {
            let at = got
                .bytes()
                .zip(log.bytes())
                .position(|(a, b)| a != b)
                .unwrap_or(got.len().min(log.len()));
            ctx.fail(format!(
                "{how}: thread {tid}'s trace differs from its own log at letter {at} of {} (trace {} letters): …{}… vs …{}…",
                log.len(),
                got.len(),
                &got[at.saturating_sub(20)..(at + 20).min(got.len())],
                &log[at.saturating_sub(20)..(at + 20).min(log.len())],
            ));
        }
        let name = trace["names"][tid].as_str().unwrap_or("");
        ctx.check(name.starts_with("tracer-"), || {
            format!("{how}: thread {tid} is named {name:?}, expected tracer-N")
        });
    }
    ctx.check(trace["dropped"] == 0, || {
        format!(
            "{how}: {} events dropped with the default ring",
            trace["dropped"]
        )
    });
}

#[test]
fn run_writes_every_call_once_nested_in_order() {
    let ctx = Ctx::new("run_writes_every_call_once_nested_in_order");
    let _turn = one_at_a_time();
    let exe = build_c_target("trace_calls", &["-O2"]);
    let dir = scratch_dir("trace_run");
    let file = dir.join("trace.json");
    let weft = run_to_file(
        &ctx,
        &FUNCS,
        "chrome-trace",
        &file,
        &[exe.to_str().unwrap(), "4", "300"],
    );
    let trace = python(&ctx, CHROME_READER, &file);
    check_sequences(&ctx, &trace, &logged(&weft.stdout_text()), 4, "weft run");
}

#[test]
fn attach_writes_every_call_once_nested_in_order() {
    let ctx = Ctx::new("attach_writes_every_call_once_nested_in_order");
    let _turn = one_at_a_time();
    let exe = build_c_target("trace_calls", &["-O2"]);
    let dir = scratch_dir("trace_attach");
    let file = dir.join("trace.json");
    let file_s = file.to_str().unwrap();
    let mut target = ctx.target(&exe, &["5", "2000", "wait"]);
    target.expect_stdout("ready", |l| l == "ready");
    let args = [
        "-f",
        "outer,middle,recurse,leaf",
        "-m",
        "calls,wall,trace",
        "--format",
        "chrome-trace",
        "-o",
        file_s,
    ];
    let (mut weft, _) = attach(&ctx, target.pid, &args, 4);
    target.send("go");
    target.expect_stdout("done", |l| l == "done");
    detach_with_sigint(&mut weft);
    target.send("exit");
    target.wait_code(0);
    let trace = python(&ctx, CHROME_READER, &file);
    check_sequences(
        &ctx,
        &trace,
        &logged(&target.stdout_text()),
        5,
        "weft attach",
    );
}

#[test]
fn flamegraph_is_an_svg_with_the_functions() {
    let ctx = Ctx::new("flamegraph_is_an_svg_with_the_functions");
    let _turn = one_at_a_time();
    let exe = build_c_target("trace_calls", &["-O2"]);
    let dir = scratch_dir("trace_flamegraph");
    let file = dir.join("flame.svg");
    let exe_s = exe.to_str().unwrap();
    run_to_file(&ctx, &FUNCS, "flamegraph", &file, &[exe_s, "3", "200"]);
    let titles = svg_titles(&ctx, &file);
    for f in ["outer", "middle", "recurse", "leaf"] {
        ctx.check(
            titles.iter().any(|t| t.starts_with(&format!("{f} ("))),
            || format!("no frame of {f} in the flame graph's titles: {titles:?}"),
        );
    }

    // --by-thread: one tower per thread, under the thread's name and TID.
    let file = dir.join("by_thread.svg");
    let mut with = vec!["--by-thread"];
    with.extend(FUNCS);
    let weft = run_to_file(&ctx, &with, "flamegraph", &file, &[exe_s, "3", "200"]);
    let tids: Vec<String> = logged(&weft.stdout_text()).into_keys().collect();
    let titles = svg_titles(&ctx, &file);
    ctx.check(tids.len() == 3, || format!("threads logged: {tids:?}"));
    for tid in &tids {
        ctx.check(
            titles
                .iter()
                .any(|t| t.starts_with("tracer-") && t.contains(&format!("({tid})"))),
            || format!("no tower of thread {tid} in the flame graph's titles: {titles:?}"),
        );
    }
}

#[test]
fn a_full_ring_drops_reports_and_never_blocks() {
    let ctx = Ctx::new("a_full_ring_drops_reports_and_never_blocks");
    let _turn = one_at_a_time();
    let exe = build_c_target("trace_calls", &["-O2"]);
    let dir = scratch_dir("trace_drops");
    let file = dir.join("report.json");
    let (file_s, exe_s) = (file.to_str().unwrap(), exe.to_str().unwrap());
    const CALLS: u64 = 2_000_000;
    let rounds = format!("-{CALLS}");
    let mut cmd = Command::new(weft_bin());
    cmd.env("WEFT_TRACE_RING", "16").args([
        "run",
        "-f",
        "leaf",
        "-m",
        "calls,trace",
        "--format",
        "json",
        "-o",
        file_s,
        "--",
        exe_s,
        "2",
        &rounds,
    ]);
    let mut weft = ctx.spawn("weft run (ring of 16)", cmd, false);
    weft.wait_code(0);
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| ctx.fail(format!("{e}")));
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let report = parse_report(&ctx, &text);
    let trace = &json["trace"];
    let dropped = trace["dropped_events"].as_u64().unwrap_or(0);
    ctx.check(trace["ring_events"] == 16 && dropped > 0, || {
        format!("a ring of 16 events and {CALLS} calls a thread: the report's trace says {trace}")
    });
    ctx.check(
        weft.stderr_text()
            .contains(&format!("weft: trace: {dropped} events dropped")),
        || "no `weft: trace: N events dropped` line on stderr".into(),
    );
    // The counters lose nothing; the trace holds what was not dropped.
    let stdout = weft.stdout_text();
    let finished: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("F "))
        .map(|l| l.split(' ').nth(1).unwrap_or(""))
        .collect();
    ctx.check(finished.len() == 2, || {
        format!("{} threads finished, expected 2", finished.len())
    });
    for tid in finished {
        let tid: i64 = tid.parse().unwrap();
        let c = report.counts(tid, "leaf");
        ctx.check(c.calls == CALLS && c.exits == Some(CALLS), || {
            format!("thread {tid}: {c:?}, expected {CALLS} calls and exits")
        });
        let t = trace["threads"]
            .as_array()
            .and_then(|ts| ts.iter().find(|t| t["tid"] == tid))
            .unwrap_or_else(|| ctx.fail(format!("thread {tid} not in the trace summary")));
        let (calls, lost) = (
            t["calls"].as_u64().unwrap(),
            t["dropped_events"].as_u64().unwrap(),
        );
        // Every entry written is a call; every event not written is a drop.
        ctx.check(
            calls > 0 && calls < CALLS && lost <= 2 * CALLS - calls,
            || {
                format!(
                    "thread {tid}: {calls} calls traced, {lost} events dropped, of {CALLS} calls"
                )
            },
        );
    }
}

/// longjmp and pthread_exit: the frames they discard end as `unwound`
/// slices, still nested, and the functions that return are `returned`
/// (tests/targets/exits.c: 2 workers x 5 rounds of jump_host, which calls
/// setjmp then jumper directly or through jump_mid, which longjmp back; 2
/// exiters whose exiter calls pthread_exit under exit_via).
#[test]
fn longjmp_and_thread_exit_end_as_unwound() {
    let ctx = Ctx::new("longjmp_and_thread_exit_end_as_unwound");
    let _turn = one_at_a_time();
    let dir = scratch_dir("trace_exits");
    let file = dir.join("trace.json");
    let exe = exits();
    let funcs = "jump_host,jump_mid,jumper,exit_via,exiter,multi_ret";
    run_to_file(
        &ctx,
        &["-m", "calls,trace", "-f", funcs],
        "chrome-trace",
        &file,
        &[exe.to_str().unwrap()],
    );
    let trace = python(&ctx, CHROME_READER, &file);
    let ended = &trace["ended"];
    let count = |f: &str, kind: &str| ended[f][kind].as_u64().unwrap_or(0);
    for f in ["jumper", "jump_mid", "exiter", "exit_via"] {
        ctx.check(count(f, "unwound") > 0 && count(f, "returned") == 0, || {
            format!("{f} never returns: its slices must all be unwound: {ended}")
        });
    }
    for f in ["jump_host", "multi_ret"] {
        ctx.check(count(f, "returned") > 0 && count(f, "unwound") == 0, || {
            format!("{f} returns: {ended}")
        });
    }
}

/// C++ exceptions: the frames an exception passes through end as `unwound`
/// slices when the unwinder leaves them (the runtime's personality
/// routine), the calls that return as `returned`, half each
/// (tests/targets/exceptions.cpp: rounds alternate throwing and not).
#[test]
fn exceptions_end_traced_frames_as_unwound() {
    let ctx = Ctx::new("exceptions_end_traced_frames_as_unwound");
    let _turn = one_at_a_time();
    let dir = scratch_dir("trace_exceptions");
    let file = dir.join("trace.json");
    let exe = exceptions();
    run_to_file(
        &ctx,
        &["-m", "calls,trace", "-f", "thrower,middle"],
        "chrome-trace",
        &file,
        &[exe.to_str().unwrap(), "200"],
    );
    let trace = python(&ctx, CHROME_READER, &file);
    let ended = &trace["ended"];
    let count = |f: &str, kind: &str| ended[f][kind].as_u64().unwrap_or(0);
    for f in ["thrower", "middle"] {
        let (unwound, returned) = (count(f, "unwound"), count(f, "returned"));
        ctx.check(unwound > 0 && unwound == returned, || {
            format!("{f}: half its calls throw through it, half return: {ended}")
        });
    }
}

/// The rings have one reader: a second weft that asks to trace calls in a
/// process another live weft traces is refused, saying which; the first
/// goes on unharmed.
#[test]
fn a_second_tracing_weft_is_refused() {
    let ctx = Ctx::new("a_second_tracing_weft_is_refused");
    let _turn = one_at_a_time();
    let exe = build_c_target("trace_calls", &["-O2"]);
    let mut target = ctx.target(&exe, &["2", "300", "wait"]);
    target.expect_stdout("ready", |l| l == "ready");
    let args = ["-f", "leaf", "-m", "calls,trace", "--format", "json"];
    let (mut first, _) = attach(&ctx, target.pid, &args, 1);
    let pid = target.pid.to_string();
    let mut second = ctx.weft(&["attach", "-p", &pid, "-f", "outer", "-m", "calls,trace"]);
    let (line, _) = expect_weft_error(&mut second);
    ctx.check(
        line.contains(&format!("another weft (pid {})", first.pid))
            && line.contains("tracing calls"),
        || format!("the second weft's error: {line}"),
    );
    target.send("go");
    target.expect_stdout("done", |l| l == "done");
    let report = detach_with_sigint(&mut first);
    let json: serde_json::Value = serde_json::from_str(&report)
        .unwrap_or_else(|e| ctx.fail(format!("first weft's report: {e}")));
    ctx.check(json["trace"]["calls"].as_u64().unwrap_or(0) > 0, || {
        format!("the first weft's trace: {}", json["trace"])
    });
    target.send("exit");
    target.wait_code(0);
}

/// Per function, its total time (calls inside a call of itself counted
/// once) and self time (less its callees'), in ns, in one thread's begin
/// and end events of a Chrome trace: what a viewer's table must show.
fn totals_and_self(trace: &serde_json::Value, tid: i64) -> BTreeMap<String, (f64, f64)> {
    let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    // The open calls: (start, name), in the file's (nesting) order.
    let mut stack: Vec<(f64, String)> = Vec::new();
    let events = trace["traceEvents"].as_array().into_iter().flatten();
    for e in events.filter(|e| e["tid"] == tid) {
        let ts = e["ts"].as_f64().unwrap_or(0.0) * 1000.0;
        let name = e["name"].as_str().unwrap_or("").to_string();
        match e["ph"].as_str() {
            Some("B") => stack.push((ts, name)),
            Some("E") => {
                let Some((start, name)) = stack.pop() else {
                    continue;
                };
                let dur = ts - start;
                let recursive = stack.iter().any(|(_, n)| *n == name);
                let entry = out.entry(name).or_default();
                if !recursive {
                    entry.0 += dur;
                }
                entry.1 += dur;
                if let Some((_, parent)) = stack.last() {
                    out.entry(parent.clone()).or_default().1 -= dur;
                }
            }
            _ => {}
        }
    }
    out
}

/// The Chrome trace, imported by a real viewer: speedscope's web app in
/// headless Chromium makes one profile per thread, named as the thread,
/// and its table of each function's total and self time equals what the
/// trace's slices give. The flame graph, rendered by Chromium, has a
/// frame for every function and its root spans the picture.
#[test]
fn speedscope_and_chromium_read_the_trace_and_the_flame_graph() {
    let ctx = Ctx::new("speedscope_and_chromium_read_the_trace_and_the_flame_graph");
    let _turn = one_at_a_time();
    let index = speedscope(&ctx);
    let exe = build_c_target("trace_calls", &["-O2"]);
    let dir = scratch_dir("trace_viewers");
    let (json, svg) = (dir.join("trace.json"), dir.join("flame.svg"));
    let mut logs = BTreeMap::new();
    for (format, file) in [("chrome-trace", &json), ("flamegraph", &svg)] {
        let weft = run_to_file(
            &ctx,
            &FUNCS,
            format,
            file,
            &[exe.to_str().unwrap(), "3", "100"],
        );
        if format == "chrome-trace" {
            logs = logged(&weft.stdout_text());
        }
    }
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();

    let shot = dir.join("speedscope.png");
    let shown = chromium(
        &ctx,
        &[
            "speedscope".as_ref(),
            index.as_os_str(),
            json.as_os_str(),
            shot.as_os_str(),
        ],
    );
    ctx.check(shown.get("error").is_none(), || {
        format!("speedscope refused the trace: {shown}")
    });
    let profiles = shown["profiles"].as_array().cloned().unwrap_or_default();
    ctx.check(profiles.len() == 3, || {
        format!(
            "speedscope made {} profiles of 3 threads: {shown}",
            profiles.len()
        )
    });
    let mut seen = Vec::new();
    for p in &profiles {
        let title = p["title"].as_str().unwrap_or("");
        let tid = logs
            .keys()
            .find(|tid| title.contains(&format!("(tid {tid})")))
            .unwrap_or_else(|| {
                ctx.fail(format!(
                    "profile {title:?} is none of threads {:?}",
                    logs.keys().collect::<Vec<_>>()
                ))
            });
        ctx.check(title.contains("tracer-"), || {
            format!("profile {title:?} is not named as its thread (tracer-N)")
        });
        seen.push(tid.clone());
        let want = totals_and_self(&trace, tid.parse().unwrap());
        let rows = p["rows"].as_array().cloned().unwrap_or_default();
        let names: BTreeSet<&str> = rows.iter().filter_map(|r| r["name"].as_str()).collect();
        ctx.check(
            names == ["leaf", "middle", "outer", "recurse"].into(),
            || format!("{title}: speedscope's functions {names:?}"),
        );
        for r in &rows {
            let name = r["name"].as_str().unwrap_or("");
            let (total, own) = want.get(name).copied().unwrap_or_default();
            // speedscope prints 4 significant digits.
            let close = |shown: f64, want: f64| (shown - want).abs() <= want * 0.005 + 2.0;
            let (s_total, s_self) = (
                r["total_ns"].as_f64().unwrap_or(-1.0),
                r["self_ns"].as_f64().unwrap_or(-1.0),
            );
            ctx.check(close(s_total, total) && close(s_self, own), || {
                format!(
                    "{title}: {name}: speedscope shows total {s_total} ns, self {s_self} ns; \
                     the trace's slices give {total:.0} and {own:.0}"
                )
            });
        }
    }
    seen.sort();
    seen.dedup();
    ctx.check(seen.len() == 3, || format!("profiles of threads {seen:?}"));

    let shot = dir.join("flame.png");
    let drawn = chromium(&ctx, &["svg".as_ref(), svg.as_os_str(), shot.as_os_str()]);
    let width = drawn["width"].as_f64().unwrap_or(0.0);
    let frames = drawn["frames"].as_array().cloned().unwrap_or_default();
    let widest = |f: &str| {
        frames
            .iter()
            .filter(|fr| {
                fr["title"]
                    .as_str()
                    .is_some_and(|t| t.starts_with(&format!("{f} (")))
            })
            .map(|fr| fr["width"].as_f64().unwrap_or(0.0))
            .fold(0.0, f64::max)
    };
    ctx.check(width > 0.0 && widest("all") >= 0.9 * width, || {
        format!("the root frame is {} px of {width}: {drawn}", widest("all"))
    });
    for f in ["outer", "middle", "recurse", "leaf"] {
        ctx.check(widest(f) > 0.0, || {
            format!("Chromium drew no frame of {f}: {drawn}")
        });
    }
}

/// Peak resident memory in KiB of our child `pid` once it has exited,
/// left unreaped (`waitid` with `WNOWAIT`, whose rusage is the child's
/// and that of the children it reaped: an upper bound of its own), or
/// None if it did not exit within the timeout.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while std::time::Instant::now() < deadline {
        // SAFETY: zeroed siginfo and rusage are valid out-parameters.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: waitid on our own child, into the two structs above;
        // WNOWAIT leaves it for Proc::wait_code to reap.
        let r = unsafe {
            libc::syscall(
                libc::SYS_waitid,
                libc::P_PID,
                pid,
                &mut info as *mut libc::siginfo_t,
                libc::WEXITED | libc::WNOWAIT | libc::WNOHANG,
                &mut usage as *mut libc::rusage,
            )
        };
        // SAFETY: si_pid is set by waitid when a child was found.
        if r == 0 && unsafe { info.si_pid() } == pid as i32 {
            return Some(usage.ru_maxrss as u64);
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    None
}

/// A Chrome trace read by serde_json event by event (the file is too big
/// to read whole comfortably): per tid the call sequence as the target
/// logs it ("x(" at a begin, ")" at an end) with every end closing the
/// innermost open call of its name and times going forward; the lost
/// events marked; and `otherData`.
#[derive(Default)]
struct Streamed {
    seqs: BTreeMap<i64, String>,
    open: BTreeMap<i64, Vec<String>>,
    last_ns: BTreeMap<i64, i64>,
    names: BTreeMap<i64, String>,
    lost_marked: u64,
    errors: Vec<String>,
}

impl<'de> serde::de::Visitor<'de> for &mut Streamed {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of trace events")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(e) = seq.next_element::<serde_json::Value>()? {
            let (ph, tid) = (
                e["ph"].as_str().unwrap_or(""),
                e["tid"].as_i64().unwrap_or(-1),
            );
            let name = e["name"].as_str().unwrap_or("").to_string();
            if ph == "M" {
                if name == "thread_name" {
                    let n = e["args"]["name"].as_str().unwrap_or("").to_string();
                    self.names.insert(tid, n);
                }
                continue;
            }
            let ns = (e["ts"].as_f64().unwrap_or(-1.0) * 1000.0).round() as i64;
            let last = self.last_ns.entry(tid).or_insert(0);
            if ns < *last && self.errors.len() < 5 {
                self.errors
                    .push(format!("{name} at {ns} ns goes back in time ({last})"));
            }
            *last = ns;
            if e["cat"] == "weft-gap" {
                if ph == "B" {
                    self.lost_marked += e["args"]["lost_events"].as_u64().unwrap_or(0);
                }
                continue;
            }
            let seq = self.seqs.entry(tid).or_default();
            let open = self.open.entry(tid).or_default();
            match ph {
                "B" => {
                    seq.push(name.chars().next().unwrap_or('?'));
                    seq.push('(');
                    open.push(name);
                }
                "E" => {
                    if open.pop().as_ref() != Some(&name) && self.errors.len() < 5 {
                        self.errors
                            .push(format!("{name} ends on tid {tid} inside another call"));
                    }
                    seq.push(')');
                }
                _ if self.errors.len() < 5 => self.errors.push(format!("unexpected ph {ph:?}")),
                _ => {}
            }
        }
        Ok(())
    }
}

/// Reads `file` with [`Streamed`]; returns it and `otherData`.
fn read_streamed(ctx: &Ctx, file: &Path) -> (Streamed, serde_json::Value) {
    struct Events<'a>(&'a mut Streamed);
    impl<'de> serde::de::DeserializeSeed<'de> for Events<'_> {
        type Value = ();
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_seq(self.0)
        }
    }
    struct Top<'a>(&'a mut Streamed, &'a mut serde_json::Value);
    impl<'de> serde::de::Visitor<'de> for Top<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a Chrome trace object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<String>()? {
                match key.as_str() {
                    "traceEvents" => map.next_value_seed(Events(&mut *self.0))?,
                    "otherData" => *self.1 = map.next_value()?,
                    _ => {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
            }
            Ok(())
        }
    }
    let reader = std::io::BufReader::new(
        std::fs::File::open(file).unwrap_or_else(|e| ctx.fail(format!("{}: {e}", file.display()))),
    );
    let mut streamed = Streamed::default();
    let mut other = serde_json::Value::Null;
    let mut de = serde_json::Deserializer::from_reader(reader);
    serde::Deserializer::deserialize_map(&mut de, Top(&mut streamed, &mut other))
        .unwrap_or_else(|e| ctx.fail(format!("{} is not a Chrome trace: {e}", file.display())));
    ctx.check(streamed.errors.is_empty(), || {
        format!("the trace's events: {:?}", streamed.errors)
    });
    for (tid, open) in &streamed.open {
        ctx.check(open.is_empty(), || {
            format!("tid {tid}: calls never ended: {open:?}")
        });
    }
    (streamed, other)
}

/// 3 threads x 24,000 rounds of nested calls (at least 180,000 calls a
/// thread, as fast as they go: ~100 million events a second while a
/// thread runs), gcc -O2 -g, default ring and budget: every call is in
/// the Chrome trace, in the target's own order, nothing dropped, and
/// weft's peak memory stays under 256 MiB; the flame graph of the same
/// run has every function and nothing dropped either.
#[test]
fn a_burst_of_nested_calls_is_traced_whole_in_bounded_memory() {
    let ctx = Ctx::new("a_burst_of_nested_calls_is_traced_whole_in_bounded_memory");
    let _turn = one_at_a_time();
    let exe = build_c_target("trace_calls", &["-O2", "-g"]);
    let dir = scratch_dir("trace_burst");
    let (json, svg) = (dir.join("trace.json"), dir.join("flame.svg"));
    const LIMIT_KIB: u64 = 256 * 1024;
    for (format, file) in [("chrome-trace", &json), ("flamegraph", &svg)] {
        let mut args = vec!["run"];
        args.extend(FUNCS);
        args.extend(["--format", format, "-o", file.to_str().unwrap(), "--"]);
        args.extend([exe.to_str().unwrap(), "3", "24000"]);
        let mut weft = ctx.weft(&args);
        let peak = peak_rss_kib(weft.pid);
        weft.wait_code(0);
        let peak = peak.unwrap_or_else(|| ctx.fail("weft did not exit"));
        eprintln!("{format}: weft's peak memory {} MiB", peak / 1024);
        ctx.check(peak <= LIMIT_KIB, || {
            format!("{format}: weft's peak memory {peak} KiB is over {LIMIT_KIB} KiB")
        });
        let stderr = weft.stderr_text();
        if let Some(gap) = drops_with_weft_kept_away(&stderr) {
            // The drain thread is real-time: only the machine (a stolen
            // vCPU) keeps it from the rings for longer than a ring lasts
            // (2.6 ms of a thread making events as fast as it can). What
            // the test can still ask then is that the loss is said,
            // counted and marked.
            eprintln!("{format}: weft's drain thread was kept away {gap:.1} ms: {stderr}");
            if format == "chrome-trace" {
                let (trace, other) = read_streamed(&ctx, file);
                let dropped = other["dropped_events"].as_u64().unwrap_or(0);
                ctx.check(dropped > 0 && trace.lost_marked == dropped, || {
                    format!("drops said but not marked: {other}")
                });
            }
            continue;
        }
        ctx.check(!stderr.contains("dropped"), || {
            format!("{format}: events dropped: {stderr}")
        });
        let logs = logged(&weft.stdout_text());
        ctx.check(logs.len() == 3, || format!("thread logs: {}", logs.len()));
        if format == "flamegraph" {
            let titles = svg_titles(&ctx, file);
            for f in ["outer", "middle", "recurse", "leaf"] {
                ctx.check(
                    titles.iter().any(|t| t.starts_with(&format!("{f} ("))),
                    || format!("no frame of {f} in the flame graph"),
                );
            }
            ctx.check(!titles.iter().any(|t| t.contains("events lost")), || {
                "the flame graph marks lost events".into()
            });
            continue;
        }
        let (trace, other) = read_streamed(&ctx, file);
        ctx.check(
            other["dropped_events"] == 0 && other["discarded_events"] == 0,
            || format!("events dropped with the defaults: {other}"),
        );
        for (tid, log) in &logs {
            let calls = log.matches('(').count();
            ctx.check(calls >= 180_000, || {
                format!("thread {tid} made {calls} calls")
            });
            let got = trace
                .seqs
                .get(&tid.parse().unwrap())
                .cloned()
                .unwrap_or_default();
            ctx.check(got.matches('(').count() == calls, || {
                format!(
                    "thread {tid}: {} calls in the trace, {calls} made",
                    got.matches('(').count()
                )
            });
            ctx.check(&got == log, || {
                format!("thread {tid}'s trace is not its own log")
            });
        }
    }
}

/// The longest gap between two of weft's drains, in ms, when weft said
/// that rings dropped and that gap was longer than the default ring
/// lasts for a thread making events as fast as it can (2.6 ms at ~100
/// million events a second): the machine kept weft away. None otherwise:
/// no drops, or drops weft should have prevented.
fn drops_with_weft_kept_away(stderr: &str) -> Option<f64> {
    let line = stderr.lines().find(|l| l.contains("events dropped on"))?;
    let gap: f64 = line
        .split("the longest gap between two of weft's drains was ")
        .nth(1)?
        .split(' ')
        .next()?
        .parse()
        .ok()?;
    (gap >= 2.5).then_some(gap)
}

/// A ring far too small: the drops are counted, said on stderr, and
/// marked where they happened on the threads' tracks as slices
/// `weft: N events lost` that add up to the drops; the calls around them
/// still nest.
#[test]
fn drops_are_marked_on_the_timeline() {
    let ctx = Ctx::new("drops_are_marked_on_the_timeline");
    let _turn = one_at_a_time();
    let exe = build_c_target("trace_calls", &["-O2"]);
    let dir = scratch_dir("trace_gaps");
    let file = dir.join("trace.json");
    let mut cmd = Command::new(weft_bin());
    cmd.env("WEFT_TRACE_RING", "16")
        .arg("run")
        .args(FUNCS)
        .args([
            "--format",
            "chrome-trace",
            "-o",
            file.to_str().unwrap(),
            "--",
            exe.to_str().unwrap(),
            "2",
            "3000",
        ]);
    let mut weft = ctx.spawn("weft run (ring of 16)", cmd, false);
    weft.wait_code(0);
    let (trace, other) = read_streamed(&ctx, &file);
    let dropped = other["dropped_events"].as_u64().unwrap_or(0);
    ctx.check(dropped > 0, || {
        format!("a ring of 16 dropped nothing: {other}")
    });
    ctx.check(trace.lost_marked == dropped, || {
        format!(
            "the slices mark {} lost events, otherData says {dropped}",
            trace.lost_marked
        )
    });
    ctx.check(
        weft.stderr_text()
            .contains(&format!("weft: trace: {dropped} events dropped")),
        || format!("stderr: {}", weft.stderr_text()),
    );
}

/// Past the budget (WEFT_TRACE_BUDGET) events are counted as not kept,
/// said on stderr, marked at the end of each thread's track, and the
/// trace stays small and well nested.
#[test]
fn past_the_budget_events_are_counted_and_marked() {
    let ctx = Ctx::new("past_the_budget_events_are_counted_and_marked");
    let _turn = one_at_a_time();
    let exe = build_c_target("trace_calls", &["-O2"]);
    let dir = scratch_dir("trace_budget");
    let file = dir.join("trace.json");
    let mut cmd = Command::new(weft_bin());
    cmd.env("WEFT_TRACE_BUDGET", "1M")
        .arg("run")
        .args(FUNCS)
        .args([
            "--format",
            "chrome-trace",
            "-o",
            file.to_str().unwrap(),
            "--",
            exe.to_str().unwrap(),
            "3",
            "24000",
        ]);
    let mut weft = ctx.spawn("weft run (budget 1M)", cmd, false);
    weft.wait_code(0);
    let (trace, other) = read_streamed(&ctx, &file);
    let (dropped, discarded) = (
        other["dropped_events"].as_u64().unwrap_or(0),
        other["discarded_events"].as_u64().unwrap_or(0),
    );
    ctx.check(discarded > 0 && other["budget_bytes"] == 1 << 20, || {
        format!("1 MiB kept nothing out: {other}")
    });
    ctx.check(trace.lost_marked == dropped + discarded, || {
        format!(
            "the slices mark {} lost events, otherData says {dropped} dropped and {discarded} not kept",
            trace.lost_marked
        )
    });
    // Kept about the budget: a few bytes a call.
    let kept = other["kept_bytes"].as_u64().unwrap_or(u64::MAX);
    ctx.check(kept < 2 << 20, || {
        format!("{kept} bytes kept for a 1 MiB budget")
    });
    ctx.check(
        weft.stderr_text()
            .contains(&format!("weft: trace: {discarded} events not kept")),
        || format!("stderr: {}", weft.stderr_text()),
    );
    ctx.check(
        weft.stderr_text()
            .contains("the trace reached its budget of 1 MiB (WEFT_TRACE_BUDGET)"),
        || format!("stderr does not say why: {}", weft.stderr_text()),
    );
}

/// A run that calls no traced function: the flame graph is an SVG that
/// says so (not an error), the Chrome trace an empty timeline.
#[test]
fn a_trace_without_calls_is_an_empty_flame_graph() {
    let ctx = Ctx::new("a_trace_without_calls_is_an_empty_flame_graph");
    let _turn = one_at_a_time();
    let exe = build_c_target("trace_calls", &["-O2"]);
    let dir = scratch_dir("trace_empty");
    let (svg, json) = (dir.join("flame.svg"), dir.join("trace.json"));
    let exe_s = exe.to_str().unwrap();
    run_to_file(&ctx, &FUNCS, "flamegraph", &svg, &[exe_s, "2", "0"]);
    let titles = svg_titles(&ctx, &svg);
    ctx.check(
        titles.iter().any(|t| t.contains("no calls were traced")),
        || format!("the empty flame graph's titles: {titles:?}"),
    );
    run_to_file(&ctx, &FUNCS, "chrome-trace", &json, &[exe_s, "2", "0"]);
    let (trace, other) = read_streamed(&ctx, &json);
    ctx.check(trace.seqs.is_empty() && other["tool"] == "weft", || {
        format!("calls in an empty trace: {:?}", trace.seqs)
    });
}
