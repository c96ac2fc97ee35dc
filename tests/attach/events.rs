//! Process events through the library API (issue #6): threads that start
//! and end and libraries loaded after attach are reported by a
//! `weft::events::Watcher`, and probes deferred for a library are applied
//! when it is loaded and count its calls exactly.

use crate::support;

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
    let mut held = p.hold().unwrap_or_else(|e| ctx.fail(format!("hold: {e}")));
    held.remove_all()
        .unwrap_or_else(|e| ctx.fail(format!("remove: {e}")));
    held.release()
        .unwrap_or_else(|e| ctx.fail(format!("release: {e}")));
    t.send("quit");
    t.wait_code(0);
    let end = poll_until(&ctx, &mut w, &mut p, "Exited", |e| *e == Event::Exited);
    ctx.check(end.contains(&Event::Exited), || format!("{end:?}"));
}

/// Probes deferred *at load*: the library is instrumented while its
/// `dlopen` waits inside the loader, so calls made right after the load —
/// with no moment in between for a poll — are all counted; and with the
/// watcher gone quiet a load waits no longer than asked.
#[test]
fn deferred_probes_go_in_at_the_load_itself() {
    let ctx = Ctx::new("deferred_probes_go_in_at_the_load_itself");
    let (exe, lib) = lateload();
    let mut t = ctx.target(exe, &[]);
    let (pid, _) = wait_ready(&mut t);
    // A second thread, blocked: a safe thread for weft's remote calls
    // while the main one waits inside the loader.
    t.send("thread");
    t.expect_stdout("`started TID`", |l| l.starts_with("started "));
    let fail = |what: &str, e: weft::Error| -> ! { ctx.fail(format!("{what}: {e}")) };
    let mut p = Process::open(pid as i32).unwrap_or_else(|e| fail("open", e));
    let mut w = Watcher::new(&p);
    w.defer(
        vec![Pattern::parse("libwork.so:lib_work").unwrap()],
        Metrics::CALLS,
    );
    let mut held = p.hold().unwrap_or_else(|e| fail("hold", e));
    let hook = w
        .defer_at_load(&mut held, Duration::from_secs(5))
        .unwrap_or_else(|e| fail("defer_at_load", e));
    held.release().unwrap_or_else(|e| fail("release", e));

    // The target loads and calls at once, on another thread of the test;
    // this one only waits on the watcher.
    let line = format!("loadcall 300 {}", lib.display());
    let driver = std::thread::spawn(move || {
        t.send(&line);
        let l = t.expect_stdout("`called 300`", |l| {
            l.starts_with("called ") || l.starts_with("FAIL")
        });
        (t, l)
    });
    let mut events = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !driver.is_finished() && Instant::now() < deadline {
        events.extend(
            w.wait(&mut p, Duration::from_millis(50))
                .unwrap_or_else(|e| fail("wait", e)),
        );
    }
    let (mut t, line) = driver.join().unwrap();
    ctx.check(line == "called 300", || format!("the target said {line:?}"));
    ctx.check(
        events
            .iter()
            .any(|e| matches!(e, Event::ProbesApplied { .. })),
        || format!("no ProbesApplied: {events:?}"),
    );
    let calls = p
        .report()
        .functions
        .iter()
        .find(|f| f.name == "lib_work")
        .map(|f| f.calls);
    ctx.check(calls == Some(300), || {
        format!("lib_work, instrumented at its load, counted {calls:?} of the 300 calls made right after it")
    });

    // Nobody polling: a load waits at most what was asked, then goes on.
    let mut held = p.hold().unwrap_or_else(|e| fail("hold", e));
    w.defer_at_load(&mut held, Duration::from_millis(300))
        .unwrap_or_else(|e| fail("defer_at_load again", e));
    held.release().unwrap_or_else(|e| fail("release", e));
    // How long `loadcall 5` of a fresh copy of the library takes (a new
    // file each time, so the loader really maps it).
    let mut copies = 0;
    let mut timed_load = |t: &mut support::Proc| {
        copies += 1;
        let copy = scratch_dir("deferred_at_load").join(format!("libwork-copy{copies}.so"));
        std::fs::copy(lib, &copy).unwrap();
        let started = Instant::now();
        t.send(&format!("loadcall 5 {}", copy.display()));
        t.expect_stdout("`called 5`", |l| l == "called 5");
        started.elapsed()
    };
    let waited = timed_load(&mut t);
    ctx.check(waited >= Duration::from_millis(250), || {
        format!("the unpolled load went on after {waited:?}: it did not wait")
    });
    ctx.check(waited < Duration::from_secs(4), || {
        format!("the unpolled load waited {waited:?}, asked 300 ms")
    });
    // And a watcher not seen for over a second plus the wait (gone, or no
    // longer looking) is not waited for at all.
    std::thread::sleep(Duration::from_millis(1_500));
    let waited = timed_load(&mut t);
    ctx.check(waited < Duration::from_millis(250), || {
        format!("a load waited {waited:?} for a watcher gone quiet 1.5 s ago")
    });

    // The loader's hook saw the loads (its state changes twice each), and
    // stays out of reports (it is weft's, not the user's).
    let word = p.probes()[hook.0 as usize].calls_word().unwrap() as usize;
    let hook_calls: u64 = p
        .snapshot()
        .iter()
        .map(|r| r.words.get(word).copied().unwrap_or(0))
        .sum();
    ctx.check(
        hook_calls >= 6 && p.probes()[hook.0 as usize].active,
        || format!("_dl_debug_state counted {hook_calls} calls for three loads or more"),
    );
    let report = p.report();
    ctx.check(
        report.functions.iter().all(|f| f.name != "_dl_debug_state"),
        || format!("weft's loader hook in the report: {:?}", report.functions),
    );
    // Stopped: with the watcher just seen (so a load would wait the whole
    // 5 s, unpolled), a load goes on at once.
    let mut held = p.hold().unwrap_or_else(|e| fail("hold", e));
    w.defer_at_load(&mut held, Duration::from_secs(5))
        .unwrap_or_else(|e| fail("defer_at_load a third time", e));
    held.release().unwrap_or_else(|e| fail("release", e));
    w.stop_deferring_at_load(&p);
    let waited = timed_load(&mut t);
    ctx.check(waited < Duration::from_millis(250), || {
        format!("a load waited {waited:?} after stop_deferring_at_load")
    });
    let mut held = p.hold().unwrap_or_else(|e| fail("hold", e));
    held.remove_all().unwrap_or_else(|e| fail("remove", e));
    held.release().unwrap_or_else(|e| fail("release", e));
    t.send("join");
    t.expect_stdout("`joined`", |l| l == "joined");
    t.send("quit");
    t.wait_code(0);
}
