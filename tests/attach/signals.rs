//! Signals while weft attaches and detaches: a storm of queued real-time
//! signals to a target whose handler calls an instrumented function, sent
//! while `weft attach` comes and goes six times. Every signal is handled
//! exactly once (none lost, none duplicated by weft's stops), the handler's
//! instrumented calls all happen, and the workers' results are unchanged.

use crate::support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use support::*;

const CYCLES: usize = 6;

#[test]
fn signal_storm_during_attach_and_detach() {
    let ctx = Ctx::new("signal_storm_during_attach_and_detach");
    let mut t = ctx.target(signals(), &[]);
    let (pid, _) = wait_ready(&mut t);
    let sent = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // The sender only ever signals the target this test started; it keeps
    // the storm going until every attach/detach cycle is over.
    let sender = {
        let (sent, stop) = (sent.clone(), stop.clone());
        std::thread::spawn(move || {
            let sig = libc::SIGRTMIN() + 1;
            let mut full = 0u64;
            while !stop.load(Ordering::Acquire) {
                for _ in 0..20 {
                    // SAFETY: kill with our own child's PID and a valid signal.
                    let r = unsafe { libc::kill(pid as i32, sig) };
                    if r == 0 {
                        sent.fetch_add(1, Ordering::Relaxed);
                    } else {
                        // Queue full (EAGAIN), e.g. while weft holds the target.
                        full += 1;
                    }
                }
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
            full
        })
    };
    for cycle in 0..CYCLES {
        let before = sent.load(Ordering::Relaxed);
        let p = pid.to_string();
        let mut weft = ctx.weft(&[
            "attach",
            "-p",
            &p,
            "-f",
            "work,in_handler",
            "--duration",
            "0.2",
            "--format",
            "json",
        ]);
        weft.wait_code(0);
        let report = parse_report(&ctx, &weft.stdout_text());
        ctx.check(report.pid == pid as i64, || "report for another pid".into());
        let during = sent.load(Ordering::Relaxed) - before;
        ctx.check(during > 100, || {
            format!("cycle {cycle}: only {during} signals sent while weft was attached")
        });
    }
    stop.store(true, Ordering::Release);
    let full = sender.join().expect("sender thread");
    let sent = sent.load(Ordering::Relaxed);
    // Queued signals may still be on their way: wait for the count to get
    // there (it must never pass it).
    let handled = loop {
        t.send("count");
        let line = t.expect_stdout("a `count` line", |l| l.starts_with("count "));
        let n: u64 = line[6..].trim().parse().unwrap_or(u64::MAX);
        ctx.check(n <= sent, || {
            format!("{n} signals handled, only {sent} sent")
        });
        if n == sent {
            break n;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    t.send("stop");
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
    let out = t.stdout_text();
    let last = out
        .lines()
        .find(|l| l.starts_with("handled "))
        .unwrap_or_else(|| ctx.fail("no `handled` line"));
    ctx.check(
        last == format!("handled {sent} in_handler {sent} work_ok 1"),
        || format!("sent {sent}: the target says {last:?}"),
    );
    eprintln!(
        "{sent} signals sent ({full} refused: queue full), {handled} handled, {CYCLES} attach/detach cycles"
    );
}
