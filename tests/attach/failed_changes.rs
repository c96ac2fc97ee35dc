//! Every change is a transaction: an insertion that fails at any step —
//! after taking metric words, a call record, trampoline space, after
//! writing a trampoline, entering the probes in the target's directory,
//! moving threads, or half-way through writing the patches — leaves the
//! target exactly where it was: its code, the words, records and directory
//! entries its shared region has handed out, and its threads' registers.
//! Failures are injected through a hook that exists in debug builds only.

use crate::support;

use support::*;
use weft::internals::Fault;
use weft::{Held, Metrics, Pattern, Process};

const FAILURES: usize = 1_000;

#[test]
fn a_thousand_failed_insertions_leave_the_target_where_it_was() {
    let ctx = Ctx::new("a_thousand_failed_insertions_leave_the_target_where_it_was");
    let mut t = ctx.target(workers_c(), &["--threads", "3", "--phases", "2"]);
    let (pid, _) = wait_ready(&mut t);
    let mut process =
        Process::open(pid as i32).unwrap_or_else(|e| ctx.fail(format!("attach: {e}")));
    let mut held = process
        .hold()
        .unwrap_or_else(|e| ctx.fail(format!("attach: {e}")));
    let functions = held
        .find_functions(&[
            Pattern::parse("work_a").unwrap(),
            Pattern::parse("work_b").unwrap(),
            Pattern::parse("libwork.so:lib_work").unwrap(),
        ])
        .unwrap_or_else(|e| ctx.fail(format!("find: {e}")));
    // A first insertion and removal loads the runtime and installs the
    // exit code: what stays after a success, not what a failure leaves.
    let ids = held
        .insert(&functions, Metrics::ALL)
        .unwrap_or_else(|e| ctx.fail(format!("first insert: {e}")));
    held.remove(&ids)
        .unwrap_or_else(|e| ctx.fail(format!("first remove: {e}")));

    let state = |held: &Held| {
        let code: Vec<Vec<u8>> = functions
            .iter()
            .map(|f| {
                held.read_memory(f.address, 16)
                    .unwrap_or_else(|e| ctx.fail(format!("read {}: {e}", f.name)))
            })
            .collect();
        let threads = held.threads();
        let pcs: Vec<(i32, u64)> = threads
            .iter()
            .map(|&tid| {
                let regs = held
                    .registers(tid)
                    .unwrap_or_else(|e| ctx.fail(format!("registers of {tid}: {e}")));
                (tid, regs.rip)
            })
            .collect();
        let active = held.probes().iter().filter(|p| p.active).count();
        (code, held.ledger_state(), pcs, active)
    };
    // One failed insertion first: the first change after a removal finds
    // the threads as the removal's last stop left them, some just at the
    // `syscall` a restart steps back onto; from then on they show the PC
    // after it. (The same instruction to run next either way.)
    held.fail_next_insertion_at(Fault::Words);
    let _ = held.insert(&functions, Metrics::ALL);
    let before = state(&held);
    let mut pool_after_first_round = None;
    for i in 0..FAILURES {
        let step = Fault::ALL[i % Fault::ALL.len()];
        held.fail_next_insertion_at(step);
        match held.insert(&functions, Metrics::ALL) {
            Ok(_) => ctx.fail(format!("failure {i} at {step:?}: the insertion succeeded")),
            Err(e) => ctx.check(e.to_string().contains("inject"), || {
                format!("failure {i} at {step:?} failed for another reason: {e}")
            }),
        }
        let after = state(&held);
        ctx.check(after == before, || {
            format!(
                "failure {i} at {step:?} left the target changed:\nbefore {before:x?}\nafter  \
                 {after:x?}"
            )
        });
        // Trampoline space given back is reused: no growth after a round.
        let used = held.trampoline_memory().1;
        if i + 1 == Fault::ALL.len() {
            pool_after_first_round = Some(used);
        }
        if let Some(first) = pool_after_first_round {
            ctx.check(used <= first, || {
                format!("failure {i}: trampoline space in use grew from {first} to {used}")
            });
        }
    }
    // And the process is as good as new: an insertion works and counts.
    let ids = held
        .insert(&functions, Metrics::ALL)
        .unwrap_or_else(|e| ctx.fail(format!("insert after the failures: {e}")));
    held.release()
        .unwrap_or_else(|e| ctx.fail(format!("release: {e}")));
    t.send("go");
    t.expect_stdout("phase 1 done", |l| l == "phase 1 done");
    let lines = check_worker_phase(&ctx, &t.stdout_text(), 1, 3);
    let report = process.report();
    for f in ["work_a", "work_b", "lib_work"] {
        let want: u64 = lines.iter().map(|l| l.count(f)).sum();
        let got: u64 = report
            .functions
            .iter()
            .filter(|r| r.name == f)
            .map(|r| r.calls)
            .sum();
        ctx.check(got == want, || {
            format!("{f}: weft counted {got}, the target {want}")
        });
    }
    remove(&ctx, &mut process, &ids);
    t.send("go");
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
    check_worker_phase(&ctx, &t.stdout_text(), 2, 3);
}

/// Takes the probes `ids` out of `process`, in a hold of its own.
fn remove(ctx: &Ctx, process: &mut Process, ids: &[weft::ProbeId]) {
    let mut held = process
        .hold()
        .unwrap_or_else(|e| ctx.fail(format!("hold: {e}")));
    held.remove(ids)
        .unwrap_or_else(|e| ctx.fail(format!("remove: {e}")));
    held.release()
        .unwrap_or_else(|e| ctx.fail(format!("release: {e}")));
}

/// The target's mappings (`start-end perms path`) and open descriptors
/// (number and what it names).
fn footprint(pid: u32) -> (Vec<String>, Vec<(String, String)>) {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            format!("{} {} {}", f[0], f[1], f.get(5).unwrap_or(&""))
        })
        .collect();
    let mut fds: Vec<(String, String)> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .map(|e| {
                    let to = std::fs::read_link(e.path()).unwrap_or_default();
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        to.to_string_lossy().into_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    fds.sort();
    (maps, fds)
}

/// Whether mapping `m` (a line of [`footprint`]) is part of a glibc malloc
/// arena's heap: anonymous, inside a 64 MiB-aligned 64 MiB range that
/// mappings of `maps` cover whole, read-write at its start. The remote
/// `dlopen` allocates on the thread it runs on, and glibc gives a thread
/// that never allocated an arena of its own: the target's allocator's, not
/// weft's (it stays after `dlclose`, free).
fn malloc_arena(maps: &[String], m: &str) -> bool {
    const HEAP: u64 = 64 << 20;
    let range = |l: &str| -> Option<(u64, u64, String, bool)> {
        let mut f = l.split(' ');
        let (a, b) = f.next()?.split_once('-')?;
        let perms = f.next()?.to_string();
        let anonymous = f.next().unwrap_or("").is_empty();
        Some((
            u64::from_str_radix(a, 16).ok()?,
            u64::from_str_radix(b, 16).ok()?,
            perms,
            anonymous,
        ))
    };
    let Some((start, end, _, true)) = range(m) else {
        return false;
    };
    let base = start / HEAP * HEAP;
    if end > base + HEAP {
        return false;
    }
    let mut inside: Vec<(u64, u64, String, bool)> = maps
        .iter()
        .filter_map(|l| range(l))
        .filter(|r| r.0 >= base && r.1 <= base + HEAP)
        .collect();
    inside.sort();
    let whole = inside
        .first()
        .is_some_and(|r| r.0 == base && r.2.starts_with("rw"))
        && inside.last().is_some_and(|r| r.1 == base + HEAP)
        && inside.windows(2).all(|w| w[0].1 == w[1].0)
        && inside.iter().all(|r| r.3);
    whole
}

/// A first attach that fails at any step, once weft's runtime went in for
/// it, takes the runtime back out: the target's mappings and descriptors
/// are exactly what they were (no library, region, exit code or
/// trampoline area of weft's), and a later attach loads it afresh and
/// counts exactly.
#[test]
fn a_failed_first_attach_leaves_nothing_of_weft_in_the_target() {
    let ctx = Ctx::new("a_failed_first_attach_leaves_nothing_of_weft_in_the_target");
    let mut t = ctx.target(workers_c(), &["--threads", "3", "--phases", "2"]);
    let (pid, _) = wait_ready(&mut t);
    let before = footprint(pid);
    for step in Fault::ALL {
        let mut process =
            Process::open(pid as i32).unwrap_or_else(|e| ctx.fail(format!("attach: {e}")));
        let mut held = process
            .hold()
            .unwrap_or_else(|e| ctx.fail(format!("attach: {e}")));
        let functions = held
            .find_functions(&[
                Pattern::parse("work_a").unwrap(),
                Pattern::parse("libwork.so:lib_work").unwrap(),
            ])
            .unwrap_or_else(|e| ctx.fail(format!("find: {e}")));
        held.fail_next_insertion_at(step);
        match held.insert(&functions, Metrics::ALL) {
            Ok(_) => ctx.fail(format!("at {step:?}: the insertion succeeded")),
            Err(e) => ctx.check(e.to_string().contains("inject"), || {
                format!("at {step:?}: failed for another reason: {e}")
            }),
        }
        held.release()
            .unwrap_or_else(|e| ctx.fail(format!("release: {e}")));
        drop(process);
        let after = footprint(pid);
        ctx.check(after.1 == before.1, || {
            format!(
                "a first attach failing at {step:?} left descriptors open:\nbefore {:#?}\n\
                 after {:#?}",
                before.1, after.1
            )
        });
        let new: Vec<&String> = after.0.iter().filter(|m| !before.0.contains(m)).collect();
        let gone: Vec<&String> = before.0.iter().filter(|m| !after.0.contains(m)).collect();
        ctx.check(
            gone.is_empty() && new.iter().all(|m| malloc_arena(&after.0, m)),
            || {
                format!(
                "a first attach failing at {step:?} changed the target's mappings: new {new:#?}, \
                 gone {gone:#?}"
            )
            },
        );
    }
    let mut process =
        Process::open(pid as i32).unwrap_or_else(|e| ctx.fail(format!("attach: {e}")));
    let mut held = process
        .hold()
        .unwrap_or_else(|e| ctx.fail(format!("attach: {e}")));
    let functions = held
        .find_functions(&[Pattern::parse("work_a").unwrap()])
        .unwrap_or_else(|e| ctx.fail(format!("find: {e}")));
    let ids = held
        .insert(&functions, Metrics::ALL)
        .unwrap_or_else(|e| ctx.fail(format!("insert after the failures: {e}")));
    held.release()
        .unwrap_or_else(|e| ctx.fail(format!("release: {e}")));
    t.send("go");
    t.expect_stdout("phase 1 done", |l| l == "phase 1 done");
    let lines = check_worker_phase(&ctx, &t.stdout_text(), 1, 3);
    let want: u64 = lines.iter().map(|l| l.count("work_a")).sum();
    let got: u64 = process.report().functions.iter().map(|r| r.calls).sum();
    ctx.check(got == want, || {
        format!("work_a: weft counted {got}, the target {want}")
    });
    remove(&ctx, &mut process, &ids);
    t.send("go");
    t.expect_stdout("phase 2 done", |l| l == "phase 2 done");
    t.wait_code(0);
}
