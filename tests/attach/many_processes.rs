//! Several processes held at once from one program, and the program's own
//! children left to it: weft's tracer waits for its own threads only (never
//! `waitpid(-1)`), so two held targets do not take each other's events and
//! a child of the tool that exits meanwhile is still there to be reaped.

use crate::support;

use support::*;
use weft::{Metrics, Pattern, Process};

/// The calls counted by the probes of `p` (all threads).
fn counted(p: &Process) -> u64 {
    p.report().functions.iter().map(|f| f.calls).sum()
}

#[test]
fn two_processes_held_at_once_and_a_child_of_ours_reaped_by_us() {
    let ctx = Ctx::new("two_processes_held_at_once_and_a_child_of_ours_reaped_by_us");
    let mut a = ctx.target(cycles(), &["2"]);
    let mut b = ctx.target(cycles(), &["3"]);
    wait_ready(&mut a);
    wait_ready(&mut b);
    let fail = |what: &str, e: weft::Error| -> ! { ctx.fail(format!("{what}: {e}")) };
    // A child of the test's own, exited (a zombie) before weft waits for
    // anything: it must still be ours to reap afterwards.
    let mut child = std::process::Command::new("true")
        .spawn()
        .expect("spawn true");
    let stat = format!("/proc/{}/stat", child.id());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !std::fs::read_to_string(&stat).is_ok_and(|s| s.contains(") Z ")) {
        ctx.check(std::time::Instant::now() < deadline, || {
            "`true` never exited".into()
        });
        std::thread::sleep(std::time::Duration::from_millis(1));
    }

    let mut pa = Process::open(a.pid as i32).unwrap_or_else(|e| fail("open a", e));
    let mut pb = Process::open(b.pid as i32).unwrap_or_else(|e| fail("open b", e));
    let hot = Pattern::parse("hot").unwrap();
    let fa = pa.find_functions(std::slice::from_ref(&hot)).unwrap();
    let fb = pb.find_functions(std::slice::from_ref(&hot)).unwrap();
    // Both held, both changed while the other is held: each loads its
    // runtime with remote calls, whose stops must reach the right tracer.
    let mut ha = pa.hold().unwrap_or_else(|e| fail("hold a", e));
    let mut hb = pb.hold().unwrap_or_else(|e| fail("hold b", e));
    let ia = ha
        .insert(&fa, Metrics::ALL)
        .unwrap_or_else(|e| fail("insert into a while b is held", e));
    let ib = hb
        .insert(&fb, Metrics::CALLS)
        .unwrap_or_else(|e| fail("insert into b while a is held", e));
    hb.release().unwrap_or_else(|e| fail("release b", e));
    ha.release().unwrap_or_else(|e| fail("release a", e));
    std::thread::sleep(std::time::Duration::from_millis(100));
    let (ca, cb) = (counted(&pa), counted(&pb));
    ctx.check(ca > 0 && cb > 0, || format!("both count: a {ca}, b {cb}"));

    // Taken out, again both held at once.
    let mut ha = pa.hold().unwrap_or_else(|e| fail("hold a", e));
    let mut hb = pb.hold().unwrap_or_else(|e| fail("hold b", e));
    ha.remove(&ia).unwrap_or_else(|e| fail("remove from a", e));
    hb.remove(&ib).unwrap_or_else(|e| fail("remove from b", e));
    ha.release().unwrap_or_else(|e| fail("release a", e));
    hb.release().unwrap_or_else(|e| fail("release b", e));

    // Our child was left to us.
    let status = child
        .wait()
        .unwrap_or_else(|e| ctx.fail(format!("our own child was reaped by weft: {e}")));
    ctx.check(status.success(), || format!("`true` exited with {status}"));

    stop_cycles(&mut a, 2, "a, held beside b");
    stop_cycles(&mut b, 3, "b, held beside a");
}
