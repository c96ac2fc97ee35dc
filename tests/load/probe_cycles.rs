//! Removal under load: 1,000 insert/remove cycles on a function two threads
//! call in a tight loop, through the library API. No crash, counts never go
//! back within a window, the target's results unchanged, and the target
//! memory weft uses stays bounded (removed trampolines are reused). And
//! 200 functions planned while the target ran, inserted in one stop: all
//! counted, results unchanged; a function whose code changed since it was
//! planned makes the insertion change nothing.

use crate::support;

use support::*;
use weft::{Metrics, Pattern, Process};

const CYCLES: u32 = 1_000;

// The tests in this file load the machine (busy threads on every core):
// they take turns (support::one_at_a_time, the binary's turn), so that
// each measures what it means to.

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
    let _turn = one_at_a_time();
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
    // Each removal's hold goes on into the next cycle's insertion.
    let mut held = process
        .hold()
        .unwrap_or_else(|e| ctx.fail(format!("cycle 0: hold: {e}")));
    for cycle in 0..CYCLES {
        // Alternate entry counters and timed probes (exit hooks).
        let metrics = if cycle % 2 == 0 {
            Metrics::CALLS
        } else {
            Metrics::ALL
        };
        let ids = held
            .insert(&hot, metrics)
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: insert: {e}")));
        let word = held.probes()[ids[0].0 as usize].calls_word().unwrap();
        held.release()
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
        held = process
            .hold()
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: hold: {e}")));
        held.remove(&ids)
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: remove: {e}")));
        let c = calls(&held, word);
        ctx.check(c >= b, || {
            format!("cycle {cycle}: the count went back from {b} to {c} at removal")
        });
        if cycle == 10 {
            bytes_early = held.trampoline_memory();
        }
    }
    let bytes = held.trampoline_memory();
    held.release()
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
            && bytes.0 <= 2 * weft::TRAMPOLINE_AREA_SIZE
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
    stop_cycles(&mut t, 2, "after 1,000 insert/remove cycles");
}

/// Removal while far more threads than cores spin through the function:
/// at any stop some of them are preempted inside the trampoline, so waiting
/// for all to be out never ends. Removal restores the bytes anyway (a
/// thread inside finishes the trampoline normally) and reuses the memory
/// only once none is in it.
#[test]
fn remove_while_many_threads_spin_through_the_function() {
    let _turn = one_at_a_time();
    let ctx = Ctx::new("remove_while_many_threads_spin_through_the_function");
    let mut t = ctx.target(cycles(), &["48"]);
    let (pid, _) = wait_ready(&mut t);
    let mut process = Process::open(pid as i32).unwrap_or_else(|e| ctx.fail(format!("open: {e}")));
    let hot = process
        .find_functions(&[Pattern::parse("hot").unwrap()])
        .unwrap_or_else(|e| ctx.fail(format!("find: {e}")));
    for cycle in 0..10 {
        let mut held = process
            .hold()
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: hold: {e}")));
        let ids = held
            .insert(&hot, Metrics::CALLS)
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: insert: {e}")));
        held.release()
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: release: {e}")));
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut held = process
            .hold()
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: hold: {e}")));
        held.remove(&ids)
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: remove: {e}")));
        held.release()
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: release: {e}")));
    }
    stop_cycles(&mut t, 48, "after removals with 48 spinning threads");
}

/// A batch of 1,000 probes applies in one stop of the world (the target is
/// stopped once, by `hold`, and resumed once), and every one counts.
#[test]
fn thousand_probes_in_one_stop() {
    let _turn = one_at_a_time();
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
    let mut held = p.hold().unwrap_or_else(|e| ctx.fail(format!("hold: {e}")));
    held.insert(&f[..1], Metrics::CALLS)
        .unwrap_or_else(|e| ctx.fail(format!("insert f0: {e}")));
    held.release()
        .unwrap_or_else(|e| ctx.fail(format!("release: {e}")));
    let before = p.stops();
    let mut held = p.hold().unwrap_or_else(|e| ctx.fail(format!("hold: {e}")));
    let ids = held
        .insert(&f[1..], Metrics::CALLS)
        .unwrap_or_else(|e| ctx.fail(format!("insert 1000: {e}")));
    held.release()
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
        .map(|id| p.probes()[id.0 as usize].calls_word().unwrap())
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
    let mut held = p.hold().unwrap_or_else(|e| ctx.fail(format!("hold: {e}")));
    held.remove_all()
        .unwrap_or_else(|e| ctx.fail(format!("remove: {e}")));
    held.release()
        .unwrap_or_else(|e| ctx.fail(format!("release: {e}")));
    t.close_stdin();
    t.wait_code(0);
}

/// The functions `f0`..`f199` of the `many_spare` target.
fn spare_target_functions(ctx: &Ctx, process: &mut Process) -> Vec<weft::Function> {
    let found: Vec<weft::Function> = process
        .find_functions(&[Pattern::parse("f*").unwrap()])
        .unwrap_or_else(|e| ctx.fail(format!("find: {e}")))
        .into_iter()
        .filter(|f| f.name[1..].parse::<u32>().is_ok())
        .collect();
    ctx.check(found.len() == 200, || {
        format!("found {} of the 200 functions", found.len())
    });
    found
}

/// Ends the `many_spare` target and checks its threads' results.
fn quit_many_spare(ctx: &Ctx, t: &mut Proc) {
    t.send("quit");
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
    let out = t.stdout_text();
    let threads: Vec<&str> = out.lines().filter(|l| l.starts_with("thread ")).collect();
    ctx.check(
        threads.len() == 2 && threads.iter().all(|l| l.ends_with(" failures 0")),
        || format!("the target's results changed:\n{out}"),
    );
}

/// The first `n` bytes of each function, as the target has them now.
fn code_of(ctx: &Ctx, pid: u32, functions: &[weft::Function], n: usize) -> Vec<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem"))
        .unwrap_or_else(|e| ctx.fail(format!("opening the target's memory: {e}")));
    functions
        .iter()
        .map(|f| {
            let mut bytes = vec![0u8; n];
            mem.read_exact_at(&mut bytes, f.address)
                .unwrap_or_else(|e| ctx.fail(format!("reading {}: {e}", f.name)));
            bytes
        })
        .collect()
}

/// Opens the `many_spare` target, plans `functions` and loads the runtime
/// with a first probe on `spare` (a later hold builds the others'
/// trampolines before stopping the world).
fn planned_with_runtime(ctx: &Ctx, pid: u32) -> (Process, Vec<weft::Function>, weft::Function) {
    let mut process = Process::open(pid as i32).unwrap_or_else(|e| ctx.fail(format!("open: {e}")));
    let functions = spare_target_functions(ctx, &mut process);
    let spare = process
        .find_functions(&[Pattern::parse("spare").unwrap()])
        .unwrap_or_else(|e| ctx.fail(format!("find spare: {e}")))
        .remove(0);
    process
        .prepare(&functions)
        .unwrap_or_else(|e| ctx.fail(format!("prepare: {e}")));
    let mut held = process
        .hold()
        .unwrap_or_else(|e| ctx.fail(format!("hold: {e}")));
    held.insert(std::slice::from_ref(&spare), Metrics::CALLS)
        .unwrap_or_else(|e| ctx.fail(format!("insert spare: {e}")));
    held.release()
        .unwrap_or_else(|e| ctx.fail(format!("release: {e}")));
    (process, functions, spare)
}

/// 200 functions planned while the target ran, their trampolines built
/// by `hold` before it stops the world: inserted in one stop, many patches
/// to a page. Every function counts, the results stay right, and removal
/// puts every byte back.
#[test]
fn two_hundred_planned_functions_in_one_stop() {
    let _turn = one_at_a_time();
    let ctx = Ctx::new("two_hundred_planned_functions_in_one_stop");
    let mut t = ctx.target(many_spare(), &["2"]);
    let (pid, _) = wait_ready(&mut t);
    let (mut process, functions, _) = planned_with_runtime(&ctx, pid);
    let before = code_of(&ctx, pid, &functions, 16);
    let stops = process.stops();
    let (mapped, _) = process.trampoline_memory();
    let mut held = process
        .hold()
        .unwrap_or_else(|e| ctx.fail(format!("hold: {e}")));
    let ids = held
        .insert(&functions, Metrics::CALLS)
        .unwrap_or_else(|e| ctx.fail(format!("insert: {e}")));
    held.release()
        .unwrap_or_else(|e| ctx.fail(format!("release: {e}")));
    ctx.check(ids.len() == 200 && process.stops() == stops + 1, || {
        format!(
            "{} probes inserted in {} stops of the world",
            ids.len(),
            process.stops() - stops
        )
    });
    // They went into the area `spare`'s probe mapped next to them, written
    // while the target ran: no new area.
    ctx.check(process.trampoline_memory().0 == mapped, || {
        format!(
            "trampoline memory mapped grew from {mapped} to {} bytes",
            process.trampoline_memory().0
        )
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    for id in &ids {
        let probe = &process.probes()[id.0 as usize];
        let counted = calls(&process, probe.calls_word().unwrap());
        ctx.check(counted > 0, || {
            format!("{} counted no call in 300 ms", probe.function.name)
        });
    }
    let mut held = process
        .hold()
        .unwrap_or_else(|e| ctx.fail(format!("hold: {e}")));
    held.remove_all()
        .unwrap_or_else(|e| ctx.fail(format!("remove: {e}")));
    held.release()
        .unwrap_or_else(|e| ctx.fail(format!("release: {e}")));
    ctx.check(code_of(&ctx, pid, &functions, 16) == before, || {
        "the functions' code is not as it was after removal".into()
    });
    quit_many_spare(&ctx, &mut t);
}

/// A function whose code changes after `prepare` planned it (and `hold`
/// built its trampoline): the insertion is refused, naming it, and changes
/// nothing, not even the other functions' code. Planned again (its plan
/// was dropped), the insertion goes through once the code is back.
#[test]
fn code_changed_since_prepare_is_refused() {
    use std::os::unix::fs::FileExt;
    let _turn = one_at_a_time();
    let ctx = Ctx::new("code_changed_since_prepare_is_refused");
    let mut t = ctx.target(many_spare(), &["2"]);
    let (pid, _) = wait_ready(&mut t);
    let (mut process, functions, _) = planned_with_runtime(&ctx, pid);
    let before = code_of(&ctx, pid, &functions, 16);
    // f7's first bytes are another tool's now (written back later; no
    // thread runs them meanwhile, weft holds the target): the planned
    // site no longer matches.
    let victim = functions
        .iter()
        .find(|f| f.name == "f7")
        .unwrap_or_else(|| ctx.fail("no f7"))
        .clone();
    let mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .unwrap_or_else(|e| ctx.fail(format!("opening the target's memory: {e}")));
    let mut held = process
        .hold()
        .unwrap_or_else(|e| ctx.fail(format!("hold: {e}")));
    let at = victim.address + 1;
    let mut old = [0u8; 1];
    mem.read_exact_at(&mut old, at).unwrap();
    mem.write_all_at(&[old[0] ^ 0x5a], at).unwrap();
    match held.insert(&functions, Metrics::CALLS) {
        Err(weft::Error::Refused(refused)) => ctx.check(
            refused.len() == 1
                && refused[0].function.name == "f7"
                && refused[0].reason.contains("changed"),
            || format!("refused: {refused:?}"),
        ),
        Err(e) => ctx.fail(format!("insert failed otherwise: {e}")),
        Ok(_) => ctx.fail("insert succeeded over changed code"),
    }
    ctx.check(
        held.probes()
            .iter()
            .filter(|p| p.active)
            .all(|p| p.function.name == "spare"),
        || "a probe is active after a refused insertion".into(),
    );
    let mut now = code_of(&ctx, pid, &functions, 16);
    let i = functions.iter().position(|f| f.name == "f7").unwrap();
    now[i][1] ^= 0x5a;
    ctx.check(now == before, || {
        "a refused insertion changed the functions' code".into()
    });
    mem.write_all_at(&old, at).unwrap();
    let ids = held
        .insert(&functions, Metrics::CALLS)
        .unwrap_or_else(|e| ctx.fail(format!("insert once the code is back: {e}")));
    ctx.check(ids.len() == 200, || {
        format!("{} probes inserted", ids.len())
    });
    held.release()
        .unwrap_or_else(|e| ctx.fail(format!("release: {e}")));
    std::thread::sleep(std::time::Duration::from_millis(100));
    let mut held = process
        .hold()
        .unwrap_or_else(|e| ctx.fail(format!("hold: {e}")));
    held.remove_all()
        .unwrap_or_else(|e| ctx.fail(format!("remove: {e}")));
    held.release()
        .unwrap_or_else(|e| ctx.fail(format!("release: {e}")));
    ctx.check(code_of(&ctx, pid, &functions, 16) == before, || {
        "the functions' code is not as it was after removal".into()
    });
    quit_many_spare(&ctx, &mut t);
}
