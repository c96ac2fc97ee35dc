//! Live sampling through the library API (`weft::Sampler`): values agree
//! with full snapshots taken around each sample and with the target's own
//! counts, running timers grow, and rows whose threads did nothing are not
//! read again (the row's activity word).

use crate::support;

use support::*;
use weft::{Metrics, Pattern, Process, Sampler};

// The tests in this file load the machine (busy threads on every core):
// they take turns (support::one_at_a_time, the binary's turn), so that
// each measures what it means to.

/// Calls counted in `word` per thread (tid → calls), from a full snapshot.
fn snapshot_calls(process: &Process, word: u32) -> std::collections::HashMap<u32, u64> {
    process
        .snapshot()
        .iter()
        .map(|r| (r.tid, r.words.get(word as usize).copied().unwrap_or(0)))
        .collect()
}

/// Opens `pid`, instruments `name` with `metrics` and lets it run.
fn instrument(ctx: &Ctx, pid: u32, name: &str, metrics: Metrics) -> (Process, u32) {
    let mut p = Process::open(pid as i32).unwrap_or_else(|e| ctx.fail(format!("open: {e}")));
    let f = p
        .find_functions(&[Pattern::parse(name).unwrap()])
        .unwrap_or_else(|e| ctx.fail(format!("find: {e}")));
    p.prepare(&f)
        .unwrap_or_else(|e| ctx.fail(format!("prepare: {e}")));
    let mut held = p.hold().unwrap_or_else(|e| ctx.fail(format!("hold: {e}")));
    let ids = held
        .insert(&f, metrics)
        .unwrap_or_else(|e| ctx.fail(format!("insert: {e}")));
    let word = held.probes()[ids[0].0 as usize].calls_word().unwrap();
    held.release()
        .unwrap_or_else(|e| ctx.fail(format!("release: {e}")));
    (p, word)
}

/// Four threads call `hot` in a tight loop while a sampler samples 300
/// times: every sample lies between the snapshots taken just before and
/// after it, thread by thread; timers never go back; and once the target
/// has stopped, the sample is the final snapshot.
#[test]
fn samples_agree_with_snapshots_and_the_targets_own_counts() {
    let _turn = one_at_a_time();
    let ctx = Ctx::new("samples_agree_with_snapshots_and_the_targets_own_counts");
    let mut t = ctx.target(cycles(), &["4"]);
    let (pid, _) = wait_ready(&mut t);
    let (p, word) = instrument(&ctx, pid, "hot", Metrics::ALL);
    let mut sampler = Sampler::new();
    let mut last: std::collections::HashMap<u32, (u64, u64, u64)> = Default::default();
    let mut running_seen = 0;
    for i in 0..300 {
        let before = snapshot_calls(&p, word);
        let sample: Vec<(u32, weft::sample::Value)> =
            sampler.sample(&p).map(|t| (t.tid, t.values[0])).collect();
        let after = snapshot_calls(&p, word);
        for (tid, v) in sample {
            let (lo, hi) = (
                before.get(&tid).copied().unwrap_or(0),
                after.get(&tid).copied().unwrap_or(u64::MAX),
            );
            ctx.check(lo <= v.calls && v.calls <= hi, || {
                format!(
                    "sample {i}, tid {tid}: {} calls, not within [{lo}, {hi}]",
                    v.calls
                )
            });
            let prev = last.insert(tid, (v.calls, v.wall_ns, v.cpu_ns));
            if let Some((calls, wall, cpu)) = prev {
                ctx.check(
                    v.calls >= calls && v.wall_ns >= wall && v.cpu_ns >= cpu,
                    || {
                        format!(
                            "sample {i}, tid {tid}: went back from {calls}/{wall}/{cpu} to {v:?}"
                        )
                    },
                );
            }
            // A row appears when its thread registers, in its first call's
            // trampoline, just before that call is counted and its timer
            // started: only a thread with a finished call must show time.
            ctx.check(v.calls < 2 || (v.wall_ns > 0 && v.cpu_ns > 0), || {
                format!("sample {i}, tid {tid}: no time in {v:?}")
            });
        }
        running_seen += sampler.stats().rows;
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    // (The first samples may come before every thread's first call.)
    ctx.check(running_seen >= 4 * 250, || {
        format!("the sampler saw {running_seen} rows in 300 samples of 4 threads")
    });
    t.send("stop");
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
    // The workers are gone: the sample is final, every row exited, and it
    // holds exactly what a full snapshot holds. (The target counted calls
    // made before weft instrumented `hot` too: more than either.)
    let out = t.stdout_text();
    let counted: u64 = out.lines().filter_map(|l| json_field(l, "calls")).sum();
    let sampled: Vec<(u32, u64, bool)> = sampler
        .sample(&p)
        .map(|t| (t.tid, t.values[0].calls, t.exited))
        .collect();
    let snap = snapshot_calls(&p, word);
    let total: u64 = sampled.iter().map(|s| s.1).sum();
    ctx.check(
        sampled.len() == 4
            && sampled.iter().all(|s| s.2 && snap.get(&s.0) == Some(&s.1))
            && total > 0
            && total <= counted,
        || format!("final sample {sampled:?}, snapshot {snap:?}, the target made {counted}"),
    );
}

/// Threads blocked outside the instrumented function leave their rows
/// alone: a second sample reads none again and gives the same values; a
/// round of calls makes each thread's row be read once more, with the new
/// counts.
#[test]
fn unchanged_rows_are_not_read_again() {
    let _turn = one_at_a_time();
    let ctx = Ctx::new("unchanged_rows_are_not_read_again");
    let mut t = ctx.target(blocking(), &["--rounds", "3", "--sleep-ms", "20"]);
    let (pid, _) = wait_ready(&mut t);
    let (p, word) = instrument(&ctx, pid, "tick", Metrics::ALL);
    let mut sampler = Sampler::new();
    let mut rounds = Vec::new();
    for r in 1..=2u32 {
        t.send("release");
        t.expect_stdout("the next block", |l| l == format!("blocked {}", r + 1));
        let first: Vec<(u32, u64, u64)> = sampler
            .sample(&p)
            .map(|t| (t.tid, t.values[0].calls, t.values[0].wall_ns))
            .collect();
        let read_first = sampler.stats().rows_read;
        let again: Vec<(u32, u64, u64)> = sampler
            .sample(&p)
            .map(|t| (t.tid, t.values[0].calls, t.values[0].wall_ns))
            .collect();
        let stats = sampler.stats();
        ctx.check(first.len() == 5 && read_first == 5, || {
            format!("round {r}: the first sample read {read_first} of {first:?} (5 threads ticked)")
        });
        ctx.check(stats.rows_read == 0 && again == first, || {
            format!(
                "round {r}: the second sample read {} rows: {again:?} vs {first:?}",
                stats.rows_read
            )
        });
        let snap = snapshot_calls(&p, word);
        for (tid, calls, _) in &first {
            ctx.check(snap.get(tid) == Some(calls), || {
                format!(
                    "round {r}, tid {tid}: sampled {calls}, snapshot {:?}",
                    snap.get(tid)
                )
            });
        }
        rounds.push(first);
    }
    // Each thread ticks 1000*(i+1)+7*r times in round r: the second round
    // added exactly that.
    for (a, b) in rounds[0].iter().zip(&rounds[1]) {
        ctx.check(a.0 == b.0 && b.1 > a.1 && (b.1 - a.1) % 1000 == 14, || {
            format!("a thread's second round: {a:?} then {b:?}")
        });
    }
    t.send("release");
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
}

/// The integer value of `"key":N` in a JSON line.
fn json_field(line: &str, key: &str) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    v.get(key)?.as_u64()
}

/// The sampler counts a running call's self time as reports do (one
/// definition): with a thread blocked in `lone()` (no timed callee) and
/// one in `outer()` → `inner()` (blocked), `lone` and `inner` sample self
/// = wall, `outer` its time before `inner` (the target's own clock), and
/// each lies between the reports read just before and after the sample.
#[test]
fn samples_count_a_running_calls_self_time_as_reports_do() {
    let _turn = one_at_a_time();
    let ctx = Ctx::new("samples_count_a_running_calls_self_time_as_reports_do");
    let exe = build_c_target("opencalls", &["-O2", "-g"]);
    let mut t = ctx.target(&exe, &["30"]);
    t.expect_stdout("ready", |l| l == "ready");
    let mut p = Process::open(t.pid as i32).unwrap_or_else(|e| ctx.fail(format!("open: {e}")));
    let names = ["lone", "outer", "inner"];
    let f = p
        .find_functions(&names.map(|n| Pattern::parse(n).unwrap()))
        .unwrap_or_else(|e| ctx.fail(format!("find: {e}")));
    p.prepare(&f)
        .unwrap_or_else(|e| ctx.fail(format!("prepare: {e}")));
    let mut held = p.hold().unwrap_or_else(|e| ctx.fail(format!("hold: {e}")));
    held.insert(&f, Metrics::ALL)
        .unwrap_or_else(|e| ctx.fail(format!("insert: {e}")));
    held.release()
        .unwrap_or_else(|e| ctx.fail(format!("release: {e}")));
    t.send("go");
    let line = t.expect_stdout("both blocked", |l| l.starts_with("{\"outer_spin_ns\""));
    let spin = json_field(&line, "outer_spin_ns").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(400));
    let self_of = |r: &weft::Report, f: &str| -> (u64, u64) {
        let f = r.functions.iter().find(|x| x.name == f).unwrap();
        (f.wall_ns.unwrap_or(0), f.self_ns.unwrap_or(0))
    };
    let before = p.report();
    let mut sampler = Sampler::new();
    let sampled: Vec<(String, u64, u64)> = {
        // A first sample learns the probes (their order in the values).
        sampler.sample(&p).count();
        let order: Vec<String> = sampler
            .probes()
            .map(|id| p.probes()[id.0 as usize].function.name.clone())
            .collect();
        let mut sums = std::collections::BTreeMap::new();
        for thread in sampler.sample(&p) {
            for (name, v) in order.iter().zip(thread.values) {
                let e = sums.entry(name.clone()).or_insert((0, 0));
                e.0 += v.wall_ns;
                e.1 += v.self_ns;
            }
        }
        sums.into_iter().map(|(n, (w, s))| (n, w, s)).collect()
    };
    let after = p.report();
    let says = format!(
        "sampled (name, wall, self): {sampled:?}; reports before {:?} after {:?}; outer's own \
         time before inner {spin}",
        names.map(|n| self_of(&before, n)),
        names.map(|n| self_of(&after, n))
    );
    for (name, wall, own) in &sampled {
        let (b, a) = (self_of(&before, name), self_of(&after, name));
        ctx.check(*own <= *wall && b.1 <= *own && *own <= a.1, || {
            format!("{name}: the sample's self time is not between the reports': {says}")
        });
        let want = match name.as_str() {
            "outer" => spin,
            _ => *wall,
        };
        ctx.check(own.abs_diff(want) <= want / 20 + 1_000_000, || {
            format!("{name}: self time {own}, expected {want}: {says}")
        });
    }
    ctx.check(sampled.len() == 3, || says.clone());
    t.send("quit");
    t.expect_stdout("done", |l| l == "done");
    t.wait_code(0);
}
