//! A hot function under many threads: 200 threads on 2 cores spin through
//! a 4-instruction leaf, so at every stop of the world some are preempted
//! inside the bytes the patch overwrites. weft moves them to the same
//! instruction's copy in the trampoline instead of waiting for them to
//! leave (which never happened: "thread stayed inside a patch site ...
//! even after letting it run 50 times"). Every attach succeeds, counts are
//! exact, and the target's results never change.

use crate::support;

use std::collections::BTreeMap;
use support::*;
use weft::{Metrics, Pattern, Process};

const THREADS: usize = 200;

// The two tests each saturate the machine: they take turns
// (support::one_at_a_time, the binary's turn).

/// Parks every worker and returns each one's calls so far (by TID),
/// checking that no call returned a wrong result.
fn pause(ctx: &Ctx, t: &mut Proc) -> BTreeMap<u32, u64> {
    let before = t.stdout_text().len();
    t.send("pause");
    t.expect_stdout("`paused`", |l| l == "paused");
    let text = t.stdout_text();
    let mut calls = BTreeMap::new();
    for line in text[before..].lines().filter(|l| l.starts_with("thread ")) {
        let f: Vec<&str> = line.split_whitespace().collect();
        ctx.check(f.len() == 6 && f[5] == "0", || {
            format!("a worker computed a wrong result: {line}")
        });
        calls.insert(f[1].parse().unwrap(), f[3].parse().unwrap());
    }
    ctx.check(calls.len() == THREADS, || {
        format!("{} worker lines, expected {THREADS}", calls.len())
    });
    calls
}

fn go(t: &mut Proc) {
    t.send("go");
    t.expect_stdout("`going`", |l| l == "going");
}

/// Calls of probe `word` per thread, as weft reads them now.
fn counted(process: &Process, word: u32) -> BTreeMap<u32, u64> {
    process
        .snapshot()
        .iter()
        .map(|r| (r.tid, r.words.get(word as usize).copied().unwrap_or(0)))
        .collect()
}

/// 20 of 20 attaches while every worker spins; the calls made while the
/// probe is live are counted exactly, per thread.
#[test]
fn attaches_to_a_leaf_two_hundred_threads_spin_through() {
    let _turn = one_at_a_time();
    let ctx = Ctx::new("attaches_to_a_leaf_two_hundred_threads_spin_through");
    let threads = THREADS.to_string();
    let mut t = ctx.target(hotleaf(), &[&threads]);
    let (pid, _) = wait_ready(&mut t);
    let mut moved = 0;
    for round in 0..20 {
        if round == 0 {
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        let mut process = Process::open(pid as i32)
            .unwrap_or_else(|e| ctx.fail(format!("round {round}: attach: {e}")));
        let mut held = process
            .hold()
            .unwrap_or_else(|e| ctx.fail(format!("round {round}: attach: {e}")));
        let leaf = held
            .find_functions(&[Pattern::parse("leaf").unwrap()])
            .unwrap_or_else(|e| ctx.fail(format!("round {round}: find: {e}")));
        let metrics = if round % 2 == 0 {
            Metrics::CALLS
        } else {
            Metrics::ALL
        };
        let ids = held
            .insert(&leaf, metrics)
            .unwrap_or_else(|e| ctx.fail(format!("round {round}: insert: {e}")));
        let word = held.probes()[ids[0].0 as usize].calls_word().unwrap();
        held.release()
            .unwrap_or_else(|e| ctx.fail(format!("round {round}: release: {e}")));
        // Exact between two pauses: what weft counted is what each thread
        // counted itself.
        let (own0, weft0) = (pause(&ctx, &mut t), counted(&process, word));
        go(&mut t);
        // Long enough for the workers woken by `go` to get back to the
        // leaf: 200 of them share 2 cores.
        std::thread::sleep(std::time::Duration::from_millis(200));
        let (own1, weft1) = (pause(&ctx, &mut t), counted(&process, word));
        for (tid, calls) in &own1 {
            let own = calls - own0[tid];
            let seen = weft1.get(tid).copied().unwrap_or(0) - weft0.get(tid).copied().unwrap_or(0);
            ctx.check(own == seen, || {
                format!("round {round}: thread {tid} made {own} calls, weft counted {seen}")
            });
        }
        let total: u64 = own1.values().sum::<u64>() - own0.values().sum::<u64>();
        ctx.check(total > 0, || {
            format!("round {round}: no call between the pauses")
        });
        go(&mut t);
        // Every worker back in its loop before the next attach.
        std::thread::sleep(std::time::Duration::from_millis(300));
        let mut held = process
            .hold()
            .unwrap_or_else(|e| ctx.fail(format!("round {round}: hold: {e}")));
        held.remove_all()
            .unwrap_or_else(|e| ctx.fail(format!("round {round}: remove: {e}")));
        moved += held.threads_moved();
        held.release()
            .unwrap_or_else(|e| ctx.fail(format!("round {round}: release: {e}")));
    }
    eprintln!(
        "20 attaches to a leaf 200 threads spin through: {moved} threads moved out of its patch"
    );
    pause(&ctx, &mut t);
    t.send("quit");
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
}

/// 1,000 insert/remove cycles while the 200 threads spin through the leaf:
/// every one succeeds, and the workers' results stay right.
#[test]
fn thousand_cycles_on_a_leaf_two_hundred_threads_spin_through() {
    let _turn = one_at_a_time();
    let ctx = Ctx::new("thousand_cycles_on_a_leaf_two_hundred_threads_spin_through");
    let threads = THREADS.to_string();
    let mut t = ctx.target(hotleaf(), &[&threads]);
    let (pid, _) = wait_ready(&mut t);
    let mut process = Process::open(pid as i32).unwrap_or_else(|e| ctx.fail(format!("open: {e}")));
    let leaf = process
        .find_functions(&[Pattern::parse("leaf").unwrap()])
        .unwrap_or_else(|e| ctx.fail(format!("find: {e}")));
    let mut longest = std::time::Duration::ZERO;
    // 1,000 cycles, and more (up to 4,000) until some stop has found a
    // thread inside the patch: where preemptions land is up to the
    // processor, and the point is to go through moving threads.
    let mut cycles = 0;
    for cycle in 0..4_000 {
        if cycle >= 1_000 && process.threads_moved() > 0 {
            break;
        }
        cycles += 1;
        let metrics = if cycle % 2 == 0 {
            Metrics::CALLS
        } else {
            Metrics::ALL
        };
        let mut held = process
            .hold()
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: hold: {e}")));
        let ids = held
            .insert(&leaf, metrics)
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: insert: {e}")));
        held.release()
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: release: {e}")));
        longest = longest.max(process.longest_stop());
        let mut held = process
            .hold()
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: hold: {e}")));
        held.remove(&ids)
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: remove: {e}")));
        held.release()
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: release: {e}")));
        longest = longest.max(process.longest_stop());
    }
    eprintln!(
        "{cycles} cycles under 200 spinning threads: {} threads moved, longest stop {longest:?}",
        process.threads_moved()
    );
    // Some stops found threads inside the patch: the cycles really went
    // through moving them.
    ctx.check(process.threads_moved() > 0, || {
        "no stop found a thread inside the leaf's patch: the test did not test moving".into()
    });
    pause(&ctx, &mut t);
    t.send("quit");
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
}
