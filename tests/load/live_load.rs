//! Live reports while the target keeps every CPU busy (issue #17): 200
//! threads spin on a timed function; `weft attach --interval 0.5` must
//! give one report per interval, each a fresh reading. Nothing is timed
//! here, only counted: one more thread of the target counts its own calls
//! and publishes the count in a shared file, which the test reads the
//! moment each report arrives. Each report's count for that thread must lie
//! between what the thread had made when the report before arrived (the
//! reading is newer than the previous report) and what it had made when
//! this one arrived (weft counts no call that was not made).

use crate::support;

use std::time::Duration;
use support::*;

/// The test's own thread at real-time priority while it watches (root):
/// behind 200 busy threads it would otherwise read the count late, and a
/// late reading makes a fresh report look stale. Its children do not
/// inherit it (`SCHED_RESET_ON_FORK`).
fn watch_at_realtime_priority() -> bool {
    let fifo = libc::sched_param { sched_priority: 1 };
    // SAFETY: sets this thread's own policy; the param is valid.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &fifo) == 0 }
}

/// The count the target's counter thread has published.
fn published(file: &std::path::Path) -> u64 {
    let bytes = std::fs::read(file).unwrap_or_default();
    bytes
        .get(..8)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()))
}

#[test]
fn live_reports_come_every_interval_and_fresh_under_200_busy_threads() {
    // 200 busy threads: the machine is this test's alone.
    let _turn = one_at_a_time();
    let ctx = Ctx::new("live_reports_come_every_interval_and_fresh_under_200_busy_threads");
    let exe = build_c_target("busy_counted", &["-O2", "-pthread"]);
    let file = scratch_dir("live_load").join("count");
    let mut target = ctx.target(&exe, &["200", file.to_str().unwrap()]);
    let ready = target.expect_stdout("ready", |l| l.starts_with("ready counter="));
    let counter: i64 = ready
        .trim()
        .strip_prefix("ready counter=")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| ctx.fail(format!("the target's ready line: {ready:?}")));
    let realtime = watch_at_realtime_priority();
    if !realtime {
        eprintln!("note: not permitted real-time priority; readings of the count may come late");
    }
    let pid = target.pid.to_string();
    // weft counts the calls made once its probe is in: between these two
    // readings (weft started; its `attached` line seen).
    let base_lo = published(&file);
    let mut base_hi = None;
    let mut weft = ctx.weft(&[
        "attach",
        "-p",
        &pid,
        "-f",
        "leaf",
        "-m",
        "calls,wall,cpu",
        "--interval",
        "0.5",
        "--duration",
        "4",
        "--format",
        "jsonl",
    ]);
    // (report line, the count published when it arrived)
    let mut seen: Vec<(String, u64)> = Vec::new();
    loop {
        let running = weft.is_running();
        if base_hi.is_none() && weft.stderr_text().contains("weft: attached") {
            base_hi = Some(published(&file));
        }
        let text = weft.stdout_text();
        let lines: Vec<&str> = text.lines().collect();
        if lines.len() > seen.len() {
            let own = published(&file);
            for l in &lines[seen.len()..] {
                seen.push((l.to_string(), own));
            }
        }
        if !running {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    weft.wait_code(0);
    // Lines still in the pipe when weft ended.
    let text = weft.stdout_text();
    let own = published(&file);
    for l in text.lines().skip(seen.len()) {
        seen.push((l.to_string(), own));
    }
    ctx.check(target.is_running(), || "the target died under weft".into());

    let reports: Vec<(serde_json::Value, Report, u64)> = seen
        .iter()
        .map(|(l, own)| {
            let v: serde_json::Value = serde_json::from_str(l)
                .unwrap_or_else(|e| ctx.fail(format!("a report line is not JSON ({e}): {l}")));
            (v, parse_report(&ctx, l), *own)
        })
        .collect();
    let live = reports
        .iter()
        .filter(|(v, _, _)| v["final"] == false)
        .count();
    ctx.check(
        reports.last().is_some_and(|(v, _, _)| v["final"] == true),
        || "the last line is not the final report".into(),
    );
    // 4 s at 0.5 s: a report at 0.5, 1.0, … 3.5 s (the one at 4.0 s may
    // give way to the final one).
    ctx.check((7..=8).contains(&live), || {
        format!("{live} live reports in 4 s at --interval 0.5, expected 7 or 8")
    });
    let base_hi = base_hi.unwrap_or_else(|| ctx.fail("no `weft: attached` line"));
    eprintln!("the counter thread had made {base_lo}..{base_hi} calls when the probe went in");
    let mut before: Option<u64> = None;
    for (i, (_, report, own)) in reports.iter().enumerate() {
        let calls = report.counts(counter, "leaf").calls;
        let own = own - base_hi.min(*own);
        let made = reports[i].2 - base_lo;
        eprintln!(
            "report {i}: the counter thread's calls {calls}; made since the probe went in, at arrival: {own}..{made}"
        );
        // +1: a call is counted as it begins, published once it returns.
        ctx.check(calls <= made + 1, || {
            format!("report {i} counts {calls} calls of a thread that had made at most {made}")
        });
        if let Some(b) = before {
            ctx.check(calls >= b, || {
                format!(
                    "report {i} counts {calls} calls of the counter thread, fewer than the {b} it \
                     had made when report {} arrived: not a fresh reading",
                    i - 1
                )
            });
        }
        before = Some(own);
    }
}
