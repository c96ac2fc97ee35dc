//! A thread that cannot stop for a while must not pause the others: a vfork
//! parent sleeps uninterruptibly until its child is gone (30 ms here), and
//! a ptrace interrupt stops it only then. A stop of the world that waited
//! for it would hold every other thread for up to 30 ms; weft gives such a
//! stop up (the threads that stopped run on), waits for the late thread
//! alone and stops the world again.

use crate::support;

use std::time::Duration;
use support::*;
use weft::Process;

const HOLDS: usize = 20;

#[test]
fn a_thread_late_to_stop_does_not_pause_the_others() {
    // Stops are timed: not beside another test's busy threads.
    let _turn = one_at_a_time();
    let ctx = Ctx::new("a_thread_late_to_stop_does_not_pause_the_others");
    let exe = build_c_target("latestop", &["-O1"]);
    let mut t = ctx.target(&exe, &["30"]);
    let (pid, _) = wait_ready(&mut t);
    let mut process = Process::open(pid as i32).unwrap_or_else(|e| ctx.fail(format!("open: {e}")));
    let steal_before = steal_ticks();
    let pressure = CpuPressure::now();
    let mut stops = Vec::new();
    for i in 0..HOLDS {
        let held = process
            .hold()
            .unwrap_or_else(|e| ctx.fail(format!("hold {i}: {e}")));
        held.release()
            .unwrap_or_else(|e| ctx.fail(format!("release {i}: {e}")));
        stops.push(process.longest_stop_time());
        std::thread::sleep(Duration::from_millis(7));
    }
    let steal = machine_steal_share(steal_before, steal_ticks());
    let stalled = pressure.share_since();
    let given_up = process.stops_given_up();
    let longest = stops.iter().max().copied().unwrap_or_default();
    eprintln!(
        "{HOLDS} holds, {given_up} stops given up for the late thread; longest stop {:.2} ms \
         ({:.2} ms stopping), the machine's steal {:.1}%, tasks waited for a CPU {:.0}% of \
         the time",
        longest.total.as_secs_f64() * 1e3,
        longest.stopping.as_secs_f64() * 1e3,
        steal * 100.0,
        stalled * 100.0
    );
    // The vforker spends all but microseconds of every 30 ms in vfork: a
    // stop nearly always finds it there.
    ctx.check(given_up as usize >= HOLDS / 2, || {
        format!("only {given_up} of {HOLDS} stops were given up: the late thread was not late?")
    });
    // Waiting for it would make stops of ~15 ms on average, up to 30 ms.
    // A stop also waits for each thread to be scheduled into it: with
    // other programs' tasks waiting for the CPUs most of the time (a load
    // average of 44: a stop of 37 ms, all of it stopping), that is the
    // kernel's, as a hypervisor's steal is.
    let bound = if steal <= 0.02 && stalled < 0.25 {
        5.0
    } else {
        25.0
    };
    ctx.check(longest.total.as_secs_f64() * 1e3 <= bound, || {
        format!("a stop of the world of {longest:?} (bound {bound} ms): the others waited for the late thread")
    });
    t.send("quit");
    let line = t.expect_stdout("the counts", |l| l.starts_with("vforks="));
    ctx.check(line.ends_with("failures=0"), || {
        format!("the target saw a failed vfork or wait: {line}")
    });
    t.wait_code(0);
}
