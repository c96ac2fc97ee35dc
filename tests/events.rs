//! Process events through the library API (issue #6): threads that start
//! and end and libraries loaded after attach are reported by a
//! `weft::events::Watcher`, and probes deferred for a library are applied
//! when it is loaded and count its calls exactly.

mod support;

use std::time::{Duration, Instant};

use support::*;
use weft::events::{Event, Watcher};
use weft::{Metrics, Pattern, Process};

/// Polls until an event satisfying `pred` comes (5 s at most).
fn poll_until(
    ctx: &Ctx,
    w: &mut Watcher,
    p: &mut Process,
    what: &str,
    pred: impl Fn(&Event) -> bool,
) -> Vec<Event> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut seen = Vec::new();
    loop {
        let events = w.poll(p).unwrap_or_else(|e| ctx.fail(format!("poll: {e}")));
        let done = events.iter().any(&pred);
        seen.extend(events);
        if done {
            return seen;
        }
        if Instant::now() > deadline {
            ctx.fail(format!("no {what} after 5 s; events: {seen:?}"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn threads_libraries_and_deferred_probes() {
    let ctx = Ctx::new("threads_libraries_and_deferred_probes");
    let (exe, lib) = lateload();
    let mut t = ctx.target(exe, &[]);
    let (pid, _) = wait_ready(&mut t);
    let mut p = Process::open(pid as i32).unwrap_or_else(|e| ctx.fail(format!("open: {e}")));
    let mut w = Watcher::new(&p);
    w.defer(
        vec![Pattern::parse("libwork.so:lib_work").unwrap()],
        Metrics::CALLS,
    );
    let quiet = w
        .poll(&mut p)
        .unwrap_or_else(|e| ctx.fail(format!("poll: {e}")));
    ctx.check(quiet.is_empty(), || {
        format!("events before anything happened: {quiet:?}")
    });

    t.send("thread");
    let line = t.expect_stdout("`started TID`", |l| l.starts_with("started "));
    let tid: i32 = line["started ".len()..].parse().unwrap();
    poll_until(&ctx, &mut w, &mut p, "ThreadStarted", |e| {
        *e == Event::ThreadStarted(tid)
    });
    t.send("join");
    t.expect_stdout("`joined`", |l| l == "joined");
    poll_until(&ctx, &mut w, &mut p, "ThreadExited", |e| {
        *e == Event::ThreadExited(tid)
    });

    t.send(&format!("load {}", lib.display()));
    t.expect_stdout("`loaded`", |l| l == "loaded");
    let events = poll_until(&ctx, &mut w, &mut p, "ProbesApplied", |e| {
        matches!(e, Event::ProbesApplied { .. })
    });
    ctx.check(
        events.iter().any(
            |e| matches!(e, Event::LibraryLoaded { path, .. } if path.ends_with("libwork.so")),
        ),
        || format!("no LibraryLoaded for libwork.so: {events:?}"),
    );
    t.send("call 250");
    t.expect_stdout("`called 250`", |l| l == "called 250");
    let report = p.report();
    let calls = report
        .functions
        .iter()
        .find(|f| f.name == "lib_work")
        .map(|f| f.calls);
    ctx.check(calls == Some(250), || {
        format!("lib_work, instrumented when it was loaded, counted {calls:?} of 250 calls")
    });
    p.hold().unwrap_or_else(|e| ctx.fail(format!("hold: {e}")));
    p.remove_all()
        .unwrap_or_else(|e| ctx.fail(format!("remove: {e}")));
    p.release()
        .unwrap_or_else(|e| ctx.fail(format!("release: {e}")));
    t.send("quit");
    t.wait_code(0);
    let end = poll_until(&ctx, &mut w, &mut p, "Exited", |e| *e == Event::Exited);
    ctx.check(end.contains(&Event::Exited), || format!("{end:?}"));
}
