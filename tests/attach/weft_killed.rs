//! weft killed (SIGKILL) at a random moment of its work, 100 times, each
//! time on a fresh target: while it seizes the threads, inside a remote
//! call (the very first one, which maps the return stub, included), while
//! it splices, or while the probes are live. Every target must finish with
//! its correct output and exit status, untraced and unstopped.

use crate::support;

use std::time::Duration;
use support::*;

const RUNS: u64 = 100;

/// Lets the target finish and checks its output: both workers' results
/// are what the same number of uninstrumented steps give.
fn finish(ctx: &Ctx, t: &mut Proc, run: u64, what: &str) {
    ctx.check(t.is_running(), || {
        format!("run {run} ({what}): the target died when weft was killed")
    });
    stop_cycles(t, 2, &format!("run {run} ({what})"));
}

#[test]
fn weft_killed_at_random_points_never_harms_the_target() {
    let ctx = Ctx::new("weft_killed_at_random_points_never_harms_the_target");
    let mut rng = rng_from_env("WEFT_KILL_SEED");
    let mut killed_before_attached = 0;
    for run in 0..RUNS {
        let mut t = ctx.target(cycles(), &[]);
        let (pid, _) = wait_ready(&mut t);
        let p = pid.to_string();
        // Every fifth run holds weft still inside each remote call, so the
        // kill lands inside one: the first (the stub's own mmap, protected
        // by the bootstrap stub) or a later one.
        let delayed = run % 5 == 4;
        let mut cmd = std::process::Command::new(weft_bin());
        cmd.args(["attach", "-p", &p, "-f", "hot"]);
        if delayed {
            // Read by debug builds of weft only (`cargo test`'s profile).
            cmd.env("WEFT_TEST_REMOTE_CALL_DELAY_MS", "200");
        }
        let mut weft = ctx.spawn("weft attach", cmd, false);
        // Attaching takes tens to hundreds of ms (debug builds, a loaded
        // machine): half the kills within 150 ms, half within 800 ms.
        let wait_us = if delayed {
            30_000 + rng.next() % 400_000
        } else if run % 2 == 0 {
            rng.next() % 150_000
        } else {
            rng.next() % 800_000
        };
        std::thread::sleep(Duration::from_micros(wait_us));
        weft.signal(nix::sys::signal::Signal::SIGKILL);
        weft.wait_exit();
        if !weft.stderr_text().contains("weft: attached") {
            killed_before_attached += 1;
        }
        std::thread::sleep(Duration::from_millis(5));
        check_not_traced_nor_stopped(&ctx, pid);
        finish(
            &ctx,
            &mut t,
            run,
            &format!("killed after {wait_us} us, delayed={delayed}"),
        );
    }
    eprintln!("{RUNS} runs, {killed_before_attached} killed before weft was live");
    ctx.check(
        killed_before_attached > RUNS / 10 && killed_before_attached < RUNS,
        || {
            format!(
                "{killed_before_attached} of {RUNS} kills landed before weft was live: the \
                 kill points do not cover both attaching and live"
            )
        },
    );
}
