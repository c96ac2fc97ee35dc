//! Removal under load: 1,000 insert/remove cycles on a function two threads
//! call in a tight loop, through the library API. No crash, counts never go
//! back within a window, the target's results unchanged, and the target
//! memory weft uses stays bounded (removed trampolines are reused).

mod support;

use support::*;
use weft::{Metrics, Pattern, Process};

const CYCLES: u32 = 1_000;

/// weft's tracer collects ptrace events with `waitpid(-1)`: two targets
/// traced from one process would take each other's events (documented on
/// `weft::Process`). The tests in this file take turns.
static ONE_TRACER: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_tracer() -> std::sync::MutexGuard<'static, ()> {
    ONE_TRACER.lock().unwrap_or_else(|e| e.into_inner())
}

/// Calls counted in the probe's word over every thread right now.
fn calls(process: &Process, word: u32) -> u64 {
    process
        .snapshot()
        .iter()
        .map(|r| r.words.get(word as usize).copied().unwrap_or(0))
        .sum()
}

#[test]
fn thousand_insert_remove_cycles_under_load() {
    let _turn = one_tracer();
    let ctx = Ctx::new("thousand_insert_remove_cycles_under_load");
    let mut t = ctx.target(cycles(), &[]);
    let (pid, _) = wait_ready(&mut t);
    let pid = pid as i32;
    let mut process = Process::open(pid).unwrap_or_else(|e| ctx.fail(format!("open: {e}")));
    let hot = process
        .find_functions(&[Pattern::parse("hot").unwrap()])
        .unwrap_or_else(|e| ctx.fail(format!("find: {e}")));
    let mut bytes_early = (0, 0);
    let mut windows_counting = 0;
    for cycle in 0..CYCLES {
        // Alternate entry counters and timed probes (exit hooks).
        let metrics = if cycle % 2 == 0 {
            Metrics::CALLS
        } else {
            Metrics::ALL
        };
        process
            .hold()
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: hold: {e}")));
        let ids = process
            .insert(&hot, metrics)
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: insert: {e}")));
        let word = process.probes()[ids[0].0 as usize].calls_word;
        process
            .release()
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: release: {e}")));
        // The window: the probe is live and weft is detached.
        let a = calls(&process, word);
        std::thread::yield_now();
        let b = calls(&process, word);
        ctx.check(b >= a, || {
            format!("cycle {cycle}: the count went back from {a} to {b}")
        });
        if b > 0 {
            windows_counting += 1;
        }
        process
            .hold()
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: hold: {e}")));
        process
            .remove(&ids)
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: remove: {e}")));
        let c = calls(&process, word);
        ctx.check(c >= b, || {
            format!("cycle {cycle}: the count went back from {b} to {c} at removal")
        });
        if cycle == 10 {
            bytes_early = process.trampoline_memory();
        }
    }
    let bytes = process.trampoline_memory();
    process
        .release()
        .unwrap_or_else(|e| ctx.fail(format!("release: {e}")));
    eprintln!(
        "{CYCLES} cycles: {windows_counting} windows saw calls; trampoline memory (mapped, used) \
         {bytes:?} (after 10 cycles: {bytes_early:?})"
    );
    // Bound: two trampoline areas mapped (one near the executable for the
    // trampolines, one near the runtime for the exit handler), and handed-out
    // space that does not grow with the cycles: a removed trampoline is
    // reused as soon as no thread is in it or has an address in it on its
    // stack; at most a few are pinned at any time (a thread stopped inside a
    // timer's clock call). Without reuse it grows ~400 bytes per cycle.
    ctx.check(
        bytes.0 == bytes_early.0
            && bytes.0 <= 2 * 256 * 1024
            && bytes.1 <= bytes_early.1 + 8 * 1024,
        || {
            format!(
                "trampoline memory (mapped, used) grew from {bytes_early:?} (cycle 10) to \
                 {bytes:?} bytes over {CYCLES} cycles"
            )
        },
    );
    ctx.check(windows_counting > CYCLES / 2, || {
        format!("only {windows_counting} of {CYCLES} windows counted any call")
    });
    t.send("stop");
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
    let out = t.stdout_text();
    let workers: Vec<serde_json::Value> = out
        .lines()
        .filter(|l| l.starts_with("{\"worker\""))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| ctx.fail(format!("{l}: {e}"))))
        .collect();
    ctx.check(
        workers.len() == 2 && workers.iter().all(|w| w["ok"] == true),
        || format!("the target's results changed: {workers:?}"),
    );
}

/// Removal while far more threads than cores spin through the function:
/// at any stop some of them are preempted inside the trampoline, so waiting
/// for all to be out never ends. Removal restores the bytes anyway (a
/// thread inside finishes the trampoline normally) and reuses the memory
/// only once none is in it.
#[test]
fn remove_while_many_threads_spin_through_the_function() {
    let _turn = one_tracer();
    let ctx = Ctx::new("remove_while_many_threads_spin_through_the_function");
    let mut t = ctx.target(cycles(), &["48"]);
    let (pid, _) = wait_ready(&mut t);
    let mut process = Process::open(pid as i32).unwrap_or_else(|e| ctx.fail(format!("open: {e}")));
    let hot = process
        .find_functions(&[Pattern::parse("hot").unwrap()])
        .unwrap_or_else(|e| ctx.fail(format!("find: {e}")));
    for cycle in 0..10 {
        process
            .hold()
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: hold: {e}")));
        let ids = process
            .insert(&hot, Metrics::CALLS)
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: insert: {e}")));
        process
            .release()
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: release: {e}")));
        std::thread::sleep(std::time::Duration::from_millis(20));
        process
            .hold()
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: hold: {e}")));
        process
            .remove(&ids)
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: remove: {e}")));
        process
            .release()
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: release: {e}")));
    }
    t.send("stop");
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
    let ok = t
        .stdout_text()
        .lines()
        .filter(|l| l.starts_with("{\"worker\""))
        .filter(|l| l.contains("\"ok\":true"))
        .count();
    ctx.check(ok == 48, || {
        format!(
            "{ok} of 48 workers' results unchanged:\n{}",
            t.stdout_text()
        )
    });
}

/// A batch of 1,000 probes applies in one stop of the world (the target is
/// stopped once, by `hold`, and resumed once), and every one counts.
#[test]
fn thousand_probes_in_one_stop() {
    let _turn = one_tracer();
    let ctx = Ctx::new("thousand_probes_in_one_stop");
    let exe = many_functions(1001);
    let mut t = ctx.target(&exe, &["2"]);
    let (pid, _) = wait_ready(&mut t);
    let mut p = Process::open(pid as i32).unwrap_or_else(|e| ctx.fail(format!("open: {e}")));
    let mut f: Vec<weft::Function> = p
        .find_functions(&[Pattern::parse("f*").unwrap()])
        .unwrap_or_else(|e| ctx.fail(format!("find: {e}")))
        .into_iter()
        .filter(|f| f.name[1..].parse::<u32>().is_ok())
        .collect();
    f.sort_by_key(|f| f.name[1..].parse::<u32>().unwrap());
    ctx.check(f.len() == 1001, || format!("{} functions found", f.len()));
    p.prepare(&f)
        .unwrap_or_else(|e| ctx.fail(format!("prepare: {e}")));
    // The runtime first (its loading lets the world run).
    p.hold().unwrap_or_else(|e| ctx.fail(format!("hold: {e}")));
    p.insert(&f[..1], Metrics::CALLS)
        .unwrap_or_else(|e| ctx.fail(format!("insert f0: {e}")));
    p.release()
        .unwrap_or_else(|e| ctx.fail(format!("release: {e}")));
    let before = p.stops();
    p.hold().unwrap_or_else(|e| ctx.fail(format!("hold: {e}")));
    let ids = p
        .insert(&f[1..], Metrics::CALLS)
        .unwrap_or_else(|e| ctx.fail(format!("insert 1000: {e}")));
    p.release()
        .unwrap_or_else(|e| ctx.fail(format!("release: {e}")));
    let stops = p.stops() - before;
    ctx.check(ids.len() == 1000 && stops == 1, || {
        format!(
            "{} probes inserted in {stops} stops of the world",
            ids.len()
        )
    });
    std::thread::sleep(std::time::Duration::from_millis(100));
    let rows = p.snapshot();
    let words: Vec<u32> = ids
        .iter()
        .map(|id| p.probes()[id.0 as usize].calls_word)
        .collect();
    let silent: Vec<u32> = words
        .iter()
        .copied()
        .filter(|&w| {
            rows.iter()
                .map(|r| r.words.get(w as usize).copied().unwrap_or(0))
                .sum::<u64>()
                == 0
        })
        .collect();
    ctx.check(silent.is_empty(), || {
        format!("{} probes counted nothing", silent.len())
    });
    p.hold().unwrap_or_else(|e| ctx.fail(format!("hold: {e}")));
    p.remove_all()
        .unwrap_or_else(|e| ctx.fail(format!("remove: {e}")));
    p.release()
        .unwrap_or_else(|e| ctx.fail(format!("release: {e}")));
    t.close_stdin();
    t.wait_code(0);
}
