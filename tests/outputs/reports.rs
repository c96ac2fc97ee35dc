//! Reports at any size (#13): self (exclusive) times checked exactly
//! against the report's own inclusive times on a known call tree,
//! recursion included, per thread; latency histograms whose buckets add up
//! to the calls and put 1 ms and 10 µs sleeps where they belong; the long
//! table of a few hundred functions within 120 columns.

use crate::support;

use serde_json::Value;
use support::*;

const TREE: &str = "outer,mid,leaf_m,leaf_o,rec,rleaf,nap_ms,nap_us";
const THREADS: u64 = 3;
/// calltree.c's rounds of `outer()` and `rec(6)` per thread.
const ROUNDS: u64 = 50;

/// `weft run --format json` of the call tree, parsed.
fn run_tree(ctx: &Ctx, extra: &[&str]) -> Value {
    let threads = THREADS.to_string();
    let mut args = vec!["run", "-f", TREE, "--format", "json"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", calltree().to_str().unwrap(), &threads]);
    let mut w = ctx.weft(&args);
    w.wait_code(0);
    let out = w.stdout_text();
    let json = out
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| ctx.fail(format!("no JSON report:\n{out}")));
    serde_json::from_str(json).unwrap_or_else(|e| ctx.fail(format!("{e}: {json}")))
}

fn num(v: &Value, what: &str) -> u64 {
    v[what]
        .as_u64()
        .unwrap_or_else(|| panic!("no {what} in {v}"))
}

/// Self time is inclusive time less the inclusive time of the timed
/// functions called, exactly: each callee here has one caller, so
/// self(outer) = wall(outer) - wall(mid) - wall(leaf_o), self(mid) =
/// wall(mid) - wall(leaf_m), self(rec) = wall(rec) - wall(rleaf) (rec
/// recursing: its wall time is the outermost activation's, its self time
/// every activation's), and a leaf's self time is its wall time. Both come
/// from the same clock readings; the tolerance is the flooring of each
/// activation's conversion to ns (1 ns per activation and term), while the
/// busy loops make every term tens of microseconds a call.
#[test]
fn self_time_is_inclusive_less_callees_per_thread() {
    let ctx = Ctx::new("self_time_is_inclusive_less_callees_per_thread");
    let _turn = one_at_a_time();
    let r = run_tree(&ctx, &["-m", "calls,wall,cpu"]);
    let threads = r["threads"].as_array().unwrap();
    ctx.check(threads.len() as u64 == THREADS, || format!("threads: {r}"));
    let relations: [(&str, &[&str], u64); 6] = [
        ("outer", &["mid", "leaf_o"], 4),
        ("mid", &["leaf_m"], 3),
        ("rec", &["rleaf"], 14),
        ("leaf_m", &[], 2),
        ("rleaf", &[], 2),
        ("nap_ms", &[], 2),
    ];
    for t in threads {
        let f = &t["functions"];
        ctx.check(num(&f["outer"], "calls") == ROUNDS, || format!("{t}"));
        ctx.check(num(&f["rec"], "calls") == 7 * ROUNDS, || format!("{t}"));
        for (name, callees, per_round) in relations {
            let own = num(&f[name], "self_ns");
            let expected = num(&f[name], "wall_ns")
                - callees.iter().map(|c| num(&f[c], "wall_ns")).sum::<u64>();
            let tolerance = per_round * ROUNDS + 10;
            ctx.check(own.abs_diff(expected) <= tolerance, || {
                format!(
                    "thread {}: self({name}) = {own}, inclusive less callees = {expected} \
                     (tolerance {tolerance}): {f}",
                    t["tid"]
                )
            });
        }
        // Not trivially true: the callees' time (busy loops of tens of
        // thousands of iterations a call) dwarfs the tolerance.
        let callees = num(&f["mid"], "wall_ns") + num(&f["leaf_o"], "wall_ns");
        ctx.check(callees > 100 * (4 * ROUNDS + 10), || {
            format!("outer's callees took only {callees} ns: {f}")
        });
    }
    // The totals obey the same relation, and the averages follow.
    let functions = r["functions"].as_array().unwrap();
    let by = |name: &str| {
        functions
            .iter()
            .find(|f| f["name"] == name)
            .unwrap_or_else(|| panic!("{name} missing"))
    };
    let outer = by("outer");
    let expected = num(outer, "wall_ns") - num(by("mid"), "wall_ns") - num(by("leaf_o"), "wall_ns");
    ctx.check(
        num(outer, "self_ns").abs_diff(expected) <= 4 * ROUNDS * THREADS + 10,
        || format!("total self(outer) {outer} vs {expected}"),
    );
    let calls = num(outer, "calls");
    ctx.check(
        num(outer, "self_ns_per_call").abs_diff(num(outer, "self_ns") / calls) <= 1
            && num(outer, "threads") == THREADS,
        || format!("{outer}"),
    );
}

/// The latency histograms (`--histogram=auto`: this handful of functions):
/// per thread and function, the buckets add up to the outermost calls;
/// 1 ms sleeps land at 2^19 ns or more, 10 µs sleeps at 2^13 ns or more
/// and mostly below 2^19 ns (generous: timer slack, a loaded machine).
#[test]
fn histograms_count_every_outermost_call_in_its_bucket() {
    let ctx = Ctx::new("histograms_count_every_outermost_call_in_its_bucket");
    let _turn = one_at_a_time();
    let r = run_tree(&ctx, &["-m", "wall", "--histogram=auto"]);
    let buckets = |h: &Value| -> Vec<(u64, u64)> {
        h.as_array()
            .unwrap_or_else(|| panic!("no histogram: {h}"))
            .iter()
            .map(|b| (num(b, "from_ns"), num(b, "count")))
            .collect()
    };
    for t in r["threads"].as_array().unwrap() {
        let f = &t["functions"];
        for (name, outermost) in [
            ("outer", ROUNDS),
            ("mid", 2 * ROUNDS),
            ("rec", ROUNDS),
            ("rleaf", 7 * ROUNDS),
            ("nap_ms", 5),
            ("nap_us", 20),
        ] {
            let sum: u64 = buckets(&f[name]["histogram"]).iter().map(|b| b.1).sum();
            ctx.check(sum == outermost, || {
                format!(
                    "thread {}: {name}'s buckets add up to {sum}, not {outermost}: {f}",
                    t["tid"]
                )
            });
        }
        let ms = buckets(&f["nap_ms"]["histogram"]);
        ctx.check(ms.iter().all(|&(from, _)| from >= 1 << 19), || {
            format!("1 ms sleeps below 2^19 ns: {ms:?}")
        });
        let us = buckets(&f["nap_us"]["histogram"]);
        let low: u64 = us.iter().filter(|b| b.0 < 1 << 19).map(|b| b.1).sum();
        ctx.check(
            us.iter().all(|&(from, _)| from >= 1 << 13) && low >= 10,
            || format!("10 µs sleeps: {us:?}"),
        );
    }
    let total: u64 = r["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "nap_us")
        .map(|f| buckets(&f["histogram"]).iter().map(|b| b.1).sum())
        .unwrap_or(0);
    ctx.check(total == 20 * THREADS, || format!("nap_us total {total}"));
    // Off (the default): no histogram words, no field.
    let r = run_tree(&ctx, &["-m", "wall"]);
    ctx.check(r["functions"][0].get("histogram").is_none(), || {
        format!("{r}")
    });
}

/// The table of the call tree: the long form (8 functions), its self
/// column, and the histograms of the first rows.
#[test]
fn table_of_the_call_tree() {
    let ctx = Ctx::new("table_of_the_call_tree");
    let _turn = one_at_a_time();
    let threads = THREADS.to_string();
    let mut w = ctx.weft(&[
        "run",
        "-f",
        TREE,
        "--sort",
        "self",
        "--histogram",
        "--histogram-of",
        "nap_ms",
        "--",
        calltree().to_str().unwrap(),
        &threads,
    ]);
    w.wait_code(0);
    let out = w.stdout_text();
    ctx.check(out.contains("functions by self time:"), || out.clone());
    ctx.check(
        out.lines()
            .any(|l| l.starts_with("FUNCTION") && l.contains("SELF/CALL")),
        || out.clone(),
    );
    ctx.check(out.contains("latency of nap_ms: 15 call(s)"), || {
        out.clone()
    });
    ctx.check(out.lines().all(|l| l.chars().count() <= 120), || {
        out.clone()
    });
}

/// A real run with a few hundred timed functions: the long table fits 120
/// columns, shows the first 50 and says how many it left out; `--top 0`
/// lists them all.
#[test]
fn hundreds_of_functions_fit_120_columns() {
    let ctx = Ctx::new("hundreds_of_functions_fit_120_columns");
    let _turn = one_at_a_time();
    let exe = many_functions(300);
    let exe = exe.to_str().unwrap();
    for (top, rows) in [(None, 50), (Some("0"), 300)] {
        let mut args = vec!["run", "-m", "calls,wall,cpu", "-f", "many:f[0-9]*"];
        if let Some(top) = top {
            args.extend_from_slice(&["--top", top]);
        }
        args.extend_from_slice(&["--", exe, "2"]);
        let mut w = ctx.weft(&args);
        w.wait_code(0);
        let out = w.stdout_text();
        let wide: Vec<&str> = out.lines().filter(|l| l.chars().count() > 120).collect();
        ctx.check(wide.is_empty(), || {
            format!("lines past 120 columns: {wide:#?}")
        });
        let shown = out
            .lines()
            .filter(|l| l.starts_with('f') && l.contains(" many "))
            .count();
        ctx.check(shown == rows, || {
            format!("{shown} function rows, not {rows}:\n{out}")
        });
        ctx.check(
            out.contains("250 more function(s) not shown") == top.is_none(),
            || out.clone(),
        );
    }
}

/// A target that has the runtime of another weft build loaded (its layout
/// may differ: this one's `layout::VERSION` is 8, an older weft's 6) is
/// refused before anything calls into that runtime or reads its words:
/// here the "other build" is this weft's runtime with one byte of its
/// build-id changed, loaded through `WEFT_RT`.
#[test]
fn a_runtime_of_another_build_is_refused() {
    use object::{Object, ObjectSection};
    let ctx = Ctx::new("a_runtime_of_another_build_is_refused");
    let _turn = one_at_a_time();
    let exe = many_functions(4);
    // First, this weft's own runtime, to copy it out of the target (the
    // runtime's memfd stays open there).
    let mut t = ctx.target(&exe, &["1"]);
    let (pid, _) = wait_ready(&mut t);
    let (mut weft, _) = attach(&ctx, pid, &["-m", "calls", "-f", "f1"], 1);
    detach_with_sigint(&mut weft);
    let memfd = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|l| l.to_string_lossy().starts_with("/memfd:weft-rt"))
        })
        .unwrap_or_else(|| ctx.fail("no runtime memfd in the target"));
    let mut rt = std::fs::read(memfd.path()).unwrap();
    t.close_stdin();
    t.wait_code(0);
    let (at, len) = object::File::parse(&*rt)
        .unwrap()
        .section_by_name(".note.gnu.build-id")
        .and_then(|s| s.file_range())
        .unwrap_or_else(|| ctx.fail("the runtime has no build-id note"));
    rt[(at + len - 1) as usize] ^= 0xff;
    let other = scratch_dir("a_runtime_of_another_build_is_refused").join("other-rt.so");
    std::fs::write(&other, &rt).unwrap();

    // A target with the "other" runtime loaded (it works: it is a whole
    // runtime), then this weft: refused, the target untouched.
    let mut t = ctx.target(&exe, &["1"]);
    let (pid, _) = wait_ready(&mut t);
    let p = pid.to_string();
    let args = [
        "attach",
        "-p",
        &p,
        "-m",
        "calls",
        "-f",
        "f1",
        "--duration",
        "0.1",
    ];
    let mut cmd = std::process::Command::new(weft_bin());
    cmd.args(args).env("WEFT_RT", &other);
    let mut first = ctx.spawn("weft with another runtime", cmd, false);
    first.wait_code(0);
    let mut second = ctx.weft(&args);
    second.wait_code(1);
    let err = second.stderr_text();
    ctx.check(err.contains("runtime of another weft build"), || {
        format!("second weft: {err}")
    });
    ctx.check(t.is_running(), || "the target died".into());
    t.close_stdin();
    t.wait_code(0);
}

/// A second weft shares a first one's probe whatever their histogram
/// settings: wanting a histogram the probe does not keep is no reason to
/// refuse, and the share then has none (its words have none); both count
/// self times.
#[test]
fn a_histogram_is_no_reason_to_refuse_a_share() {
    let ctx = Ctx::new("a_histogram_is_no_reason_to_refuse_a_share");
    let _turn = one_at_a_time();
    let mut t = ctx.target(workers_c(), &["--threads", "2", "--phases", "2"]);
    let (pid, _) = wait_ready(&mut t);
    let json = ["-f", "work_a", "-m", "calls,wall", "--format", "json"];
    let (mut a, _) = attach(&ctx, pid, &json, 1);
    let mut on = json.to_vec();
    on.push("--histogram");
    let (mut b, _) = attach(&ctx, pid, &on, 1);
    t.send("go");
    t.expect_stdout("phase done", |l| l == "phase 1 done");
    let b_report: Value = serde_json::from_str(detach_with_sigint(&mut b).trim()).unwrap();
    let a_report: Value = serde_json::from_str(detach_with_sigint(&mut a).trim()).unwrap();
    for (who, r) in [("first", &a_report), ("second", &b_report)] {
        let f = &r["functions"][0];
        ctx.check(
            f.get("histogram").is_none() && f["self_ns"].as_u64().is_some() && num(f, "calls") > 0,
            || format!("{who} weft's report: {r}"),
        );
    }
    ctx.check(
        num(&a_report["functions"][0], "calls") == num(&b_report["functions"][0], "calls"),
        || format!("{a_report}\n{b_report}"),
    );
    t.send("go");
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
}

/// A call still running counts in self time as it counts in wall time:
/// a thread blocked in `lone()` (no timed callee) shows self = wall in a
/// live report; a thread in `outer()` → `inner()` (blocked) shows
/// `inner`'s self = its wall and `outer`'s self = the time it spent
/// before calling `inner` (the target's own clock), never more than its
/// wall. Before, a running activation counted in wall time only (idle
/// memcached's `epoll_wait`: wall 3.50 s, self 2.95 s).
#[test]
fn a_running_call_counts_in_self_time_as_in_wall_time() {
    let ctx = Ctx::new("a_running_call_counts_in_self_time_as_in_wall_time");
    let _turn = one_at_a_time();
    let exe = build_c_target("opencalls", &["-O2", "-g"]);
    let mut t = ctx.target(&exe, &["30"]);
    t.expect_stdout("ready", |l| l == "ready");
    let (mut weft, _) = attach(
        &ctx,
        t.pid,
        &[
            "-f",
            "lone,outer,inner",
            "-m",
            "calls,wall",
            "--interval",
            "0.2",
            "--format",
            "jsonl",
        ],
        3,
    );
    t.send("go");
    let line = t.expect_stdout("both blocked", |l| l.starts_with("{\"outer_spin_ns\""));
    let spin = serde_json::from_str::<serde_json::Value>(&line).unwrap()["outer_spin_ns"]
        .as_u64()
        .unwrap();
    // A report read a good while after both blocked.
    std::thread::sleep(std::time::Duration::from_millis(600));
    let seen = weft.stdout_text().lines().count();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while weft.stdout_text().lines().count() < seen + 2 {
        ctx.check(std::time::Instant::now() < deadline, || {
            "no live report after the threads blocked".into()
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let text = weft.stdout_text();
    let last = text.lines().nth(seen + 1).unwrap().to_string();
    let report: serde_json::Value = serde_json::from_str(&last).unwrap();
    let figures = |thread: &str, f: &str| -> (u64, u64) {
        let c = report["threads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == thread)
            .map(|t| &t["functions"][f])
            .unwrap_or_else(|| ctx.fail(format!("no thread {thread} in {last}")));
        (
            c["wall_ns"].as_u64().unwrap_or(0),
            c["self_ns"].as_u64().unwrap_or(0),
        )
    };
    let (lone_wall, lone_self) = figures("lone", "lone");
    let (inner_wall, inner_self) = figures("nest", "inner");
    let (outer_wall, outer_self) = figures("nest", "outer");
    let says = format!(
        "lone wall {lone_wall} self {lone_self}; inner wall {inner_wall} self {inner_self}; \
         outer wall {outer_wall} self {outer_self}; outer's own time before inner {spin} ns\n{last}"
    );
    ctx.check(lone_wall > 500_000_000 && inner_wall > 500_000_000, || {
        format!("the blocked calls' wall time is not counted up to the report: {says}")
    });
    let within = |got: u64, want: u64, slack: u64| got.abs_diff(want) <= slack;
    ctx.check(within(lone_self, lone_wall, lone_wall / 1000), || {
        format!("lone's self time is not its wall time: {says}")
    });
    ctx.check(within(inner_self, inner_wall, inner_wall / 1000), || {
        format!("inner's self time is not its wall time: {says}")
    });
    ctx.check(
        outer_self <= outer_wall && outer_wall >= inner_wall + spin,
        || format!("outer's figures do not nest: {says}"),
    );
    // Outer's self time: its spin (and the few µs around it), not inner's.
    ctx.check(within(outer_self, spin, spin / 20 + 1_000_000), || {
        format!("outer's self time is not the time it spent before calling inner: {says}")
    });
    for (name, f) in [("lone", "lone"), ("outer", "outer"), ("inner", "inner")] {
        let all = report["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == f)
            .unwrap();
        ctx.check(all["self_ns"].as_u64() <= all["wall_ns"].as_u64(), || {
            format!("{name}: self above wall in the totals: {says}")
        });
    }
    // The final report, weft detaching while both threads are still
    // blocked (their cells now point at the sink words): the same.
    let out = detach_with_sigint(&mut weft);
    let last = out.lines().last().unwrap_or_default();
    let report: serde_json::Value = serde_json::from_str(last).unwrap();
    ctx.check(report["final"] == true, || {
        format!("no final report: {out}")
    });
    for (thread, f) in [("lone", "lone"), ("nest", "inner")] {
        let c = report["threads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == thread)
            .map(|t| t["functions"][f].clone())
            .unwrap_or_default();
        let (wall, own) = (
            c["wall_ns"].as_u64().unwrap_or(0),
            c["self_ns"].as_u64().unwrap_or(0),
        );
        ctx.check(wall > 500_000_000 && within(own, wall, wall / 1000), || {
            format!("{f}: the final report's self time {own} is not its wall time {wall}: {last}")
        });
    }
    // The target, uninstrumented now, returns from both calls unharmed.
    t.send("quit");
    t.expect_stdout("done", |l| l == "done");
    t.wait_code(0);
}
