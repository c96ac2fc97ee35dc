//! Attach and detach while the target's threads sit in read(), nanosleep(),
//! pthread_cond_wait(), a raw FUTEX_WAIT and epoll_wait() with no timeout
//! (which the kernel never restarts): no EINTR, no shortened sleep,
//! exact `tick` counts. And the first attach (weft's `dlopen` of its
//! runtime) while threads hold the dynamic loader's lock.

use crate::support;

use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;
use support::*;

const FLAGS: [&str; 4] = ["-f", "tick", "--format", "json"];
const NT: usize = 5;

#[derive(Deserialize, Debug)]
struct BlockLine {
    index: u64,
    tid: i64,
    kind: String,
    name: String,
    ticks: Vec<u64>,
    ok: bool,
}

/// Checks the target's final output; returns its per-thread lines.
fn check_target(ctx: &Ctx, t: &mut Proc, rounds: usize) -> Vec<BlockLine> {
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
    let text = t.stdout_text();
    let fails: Vec<&str> = text.lines().filter(|l| l.starts_with("FAIL")).collect();
    ctx.check(fails.is_empty(), || {
        format!("the target reported failures: {fails:?}")
    });
    for kind in ["read", "nanosleep", "condvar", "futex", "epoll"] {
        let want = format!("ok {kind}");
        ctx.check(text.lines().any(|l| l == want), || {
            format!("missing `{want}`")
        });
    }
    let lines: Vec<BlockLine> = text
        .lines()
        .filter(|l| l.starts_with("{\"index\""))
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| ctx.fail(format!("bad line {l:?}: {e}")))
        })
        .collect();
    ctx.check(lines.len() == NT, || {
        format!("{} thread lines, expected {NT}", lines.len())
    });
    for l in &lines {
        ctx.check(l.ok, || format!("thread {} ({}) failed", l.index, l.kind));
        ctx.check(l.ticks.len() == rounds, || {
            format!("{l:?}: expected {rounds} rounds")
        });
        for (r, &n) in l.ticks.iter().enumerate() {
            let want = 1000 * (l.index + 1) + 7 * (r as u64 + 1);
            ctx.check(n == want, || {
                format!("{l:?}: round {} ticks {n}, expected {want}", r + 1)
            });
        }
    }
    lines
}

/// Expected weft counts: the ticks of round `round` (1-based) of every thread.
fn expect_round(lines: &[BlockLine], round: usize) -> BTreeMap<i64, ExpThread> {
    lines
        .iter()
        .map(|l| {
            let mut calls = BTreeMap::new();
            calls.insert("tick".to_string(), l.ticks[round - 1]);
            (
                l.tid,
                ExpThread {
                    name: l.name.clone(),
                    calls,
                },
            )
        })
        .collect()
}

/// Lets the sleeping thread get well into a nanosleep (not a timing assertion).
fn settle() {
    std::thread::sleep(Duration::from_millis(300));
}

/// Attach while every thread is blocked (block 1), release (the ticks of
/// round 1 are counted), detach while they are blocked again (block 2),
/// release: the target finishes cleanly and weft counted round 1 exactly.
#[test]
fn attach_and_detach_while_blocked() {
    let ctx = Ctx::new("attach_and_detach_while_blocked");
    let mut t = ctx.target(blocking(), &["--rounds", "2", "--sleep-ms", "2000"]);
    let (pid, threads) = wait_ready(&mut t);
    settle();
    let (mut weft, a) = attach(&ctx, pid, &FLAGS, 1);
    ctx.check(Some(a.threads) == threads, || {
        format!("attached threads={}, target has {threads:?}", a.threads)
    });
    settle();
    t.send("release");
    t.expect_stdout("`blocked 2`", |l| l == "blocked 2");
    settle();
    let out = detach_with_sigint(&mut weft);
    ctx.check(t.is_running(), || "the target died after detach".into());
    check_not_traced_nor_stopped(&ctx, pid);
    settle();
    t.send("release");
    let lines = check_target(&ctx, &mut t, 2);
    let report = parse_report(&ctx, &out);
    check_report_counts(&ctx, &report, &expect_round(&lines, 1), &["tick"]);
}

/// Two attach/detach cycles, each starting and ending with the threads
/// blocked: the first counts nothing, the second exactly round 2.
#[test]
fn repeated_attach_detach_while_blocked() {
    let ctx = Ctx::new("repeated_attach_detach_while_blocked");
    let mut t = ctx.target(blocking(), &["--rounds", "3", "--sleep-ms", "2000"]);
    let (pid, _) = wait_ready(&mut t);

    // Cycle 1: attached and detached inside block 1.
    settle();
    let (mut weft1, _) = attach(&ctx, pid, &FLAGS, 1);
    settle();
    let out1 = detach_with_sigint(&mut weft1);
    check_report_zero(&ctx, &parse_report(&ctx, &out1), &["tick"]);
    check_not_traced_nor_stopped(&ctx, pid);

    // Round 1 ticks run without weft.
    t.send("release");
    t.expect_stdout("`blocked 2`", |l| l == "blocked 2");

    // Cycle 2: attach inside block 2, detach inside block 3.
    settle();
    let (mut weft2, _) = attach(&ctx, pid, &FLAGS, 1);
    settle();
    t.send("release");
    t.expect_stdout("`blocked 3`", |l| l == "blocked 3");
    settle();
    let out2 = detach_with_sigint(&mut weft2);
    check_not_traced_nor_stopped(&ctx, pid);
    settle();
    t.send("release");
    let lines = check_target(&ctx, &mut t, 3);
    check_report_counts(
        &ctx,
        &parse_report(&ctx, &out2),
        &expect_round(&lines, 2),
        &["tick"],
    );
}

/// weft SIGKILLed at many points of an attach (seizing, inside the remote
/// calls that load the runtime, while splicing, while live) never hurts the
/// target: its threads blocked in read/nanosleep/futex see no EINTR and no
/// short sleep, nothing stays stopped or traced, and its output is right.
///
/// The first attach runs to completion here (tests/attach/weft_killed.rs kills
/// first attaches too).
#[test]
fn weft_killed_mid_attach_leaves_target_healthy() {
    let ctx = Ctx::new("weft_killed_mid_attach_leaves_target_healthy");
    let mut t = ctx.target(
        blocking(),
        &["--rounds", "2", "--sleep-ms", "3000", "--epoll-eintr-ok"],
    );
    let (pid, _) = wait_ready(&mut t);
    let (mut first, _) = attach(&ctx, pid, &FLAGS, 1);
    detach_with_sigint(&mut first);
    let p = pid.to_string();
    for i in 0..25u64 {
        let mut weft = ctx.weft(&["attach", "-p", &p, "-f", "tick"]);
        // Spread the kills over the attach (a few ms to tens of ms).
        std::thread::sleep(Duration::from_micros((i * 7919) % 30_000));
        weft.signal(nix::sys::signal::Signal::SIGKILL);
        weft.wait_exit();
        ctx.check(t.is_running(), || {
            format!("the target died when weft was killed (run {i})")
        });
        std::thread::sleep(Duration::from_millis(10));
        check_not_traced_nor_stopped(&ctx, pid);
    }
    // Deterministically inside a remote call: weft holds still after
    // starting each call (a test-only delay, read by debug builds of weft
    // only: `cargo test`'s profile), and is killed meanwhile.
    for i in 0..5u64 {
        let mut cmd = std::process::Command::new(weft_bin());
        cmd.args(["attach", "-p", &p, "-f", "tick"])
            .env("WEFT_TEST_REMOTE_CALL_DELAY_MS", "400");
        let mut weft = ctx.spawn("weft attach (delayed remote calls)", cmd, false);
        std::thread::sleep(Duration::from_millis(150 + 60 * i));
        weft.signal(nix::sys::signal::Signal::SIGKILL);
        weft.wait_exit();
        std::thread::sleep(Duration::from_millis(20));
        ctx.check(t.is_running(), || {
            format!("the target died when weft was killed inside a remote call (run {i})")
        });
        check_not_traced_nor_stopped(&ctx, pid);
    }
    // A killed weft may have left live probes; a new attach takes them out
    // (from the records in front of their trampolines) instead of stacking
    // on them, so it counts round 1 exactly, not twice.
    settle();
    let (mut last, _) = attach(&ctx, pid, &FLAGS, 1);
    t.send("release");
    t.expect_stdout("`blocked 2`", |l| l == "blocked 2");
    let out = detach_with_sigint(&mut last);
    settle();
    t.send("release");
    let lines = check_target(&ctx, &mut t, 2);
    check_report_counts(
        &ctx,
        &parse_report(&ctx, &out),
        &expect_round(&lines, 1),
        &["tick"],
    );
    // Only a kill in the microseconds between interrupting the thread in
    // epoll_wait and taking its stop can end that call with EINTR: at most
    // one per kill, and most kills leave none.
    let eintr = t
        .stdout_text()
        .lines()
        .filter(|l| *l == "note epoll EINTR")
        .count();
    ctx.check(eintr <= 10, || {
        format!("30 kills ended epoll_wait with EINTR {eintr} times")
    });
}

/// The first attach, loading the runtime, while two threads take turns
/// holding the dynamic loader's lock (2 ms at a time, in a
/// `dl_iterate_phdr` callback): weft's `dlopen` runs with the other threads
/// stopped, so it often finds the lock held by a stopped thread, and must
/// let the others run while it waits for it instead of deadlocking.
#[test]
fn first_attach_while_threads_hold_the_loader_lock() {
    let ctx = Ctx::new("first_attach_while_threads_hold_the_loader_lock");
    let mut t = ctx.target(loaderlock(), &["2"]);
    let (pid, _) = wait_ready(&mut t);
    settle();
    let (mut weft, a) = attach(&ctx, pid, &FLAGS, 1);
    ctx.check(a.threads == 3, || {
        format!("attached threads={}, the target has 3", a.threads)
    });
    settle();
    let out = detach_with_sigint(&mut weft);
    ctx.check(t.is_running(), || "the target died after detach".into());
    check_not_traced_nor_stopped(&ctx, pid);
    let before = ticks(&mut t);
    settle();
    ctx.check(ticks(&mut t) > before, || {
        "the target's threads stopped ticking after weft detached".into()
    });
    t.send("quit");
    t.expect_stdout("`done N`", |l| l.starts_with("done "));
    t.wait_code(0);
    let report = parse_report(&ctx, &out);
    let counted: u64 = report
        .threads
        .iter()
        .filter_map(|th| th.functions.get("tick"))
        .map(|c| c.calls)
        .sum();
    ctx.check(counted > 0, || {
        format!("no tick counted while attached:\n{out}")
    });
}

/// The target's total ticks so far.
fn ticks(t: &mut Proc) -> u64 {
    t.send("count");
    let line = t.expect_stdout("`ticks N`", |l| l.starts_with("ticks "));
    line[6..].trim().parse().unwrap_or(0)
}
