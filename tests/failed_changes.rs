//! Every change is a transaction: an insertion that fails at any step —
//! after taking metric words, a call record, trampoline space, after
//! writing a trampoline, entering the probes in the target's directory,
//! moving threads, or half-way through writing the patches — leaves the
//! target exactly where it was: its code, the words, records and directory
//! entries its shared region has handed out, and its threads' registers.
//! Failures are injected through a hook that exists in debug builds only.

mod support;

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
    let mut held = process
        .hold()
        .unwrap_or_else(|e| ctx.fail(format!("hold: {e}")));
    held.remove(&ids)
        .unwrap_or_else(|e| ctx.fail(format!("remove: {e}")));
    held.release()
        .unwrap_or_else(|e| ctx.fail(format!("release: {e}")));
    t.send("go");
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
    check_worker_phase(&ctx, &t.stdout_text(), 2, 3);
}
