//! The small things users hit (issue #13, item 7): several `list`
//! patterns, bad `--duration`/`--interval` values, only the clocks of the
//! metrics asked, a closed pipe, and the final marker of `--format jsonl`.

mod support;

use std::process::{Command, Stdio};
use support::*;

/// Starts C workers (2 threads, 1 phase) and waits for `ready`.
fn start_workers(ctx: &Ctx) -> (Proc, u32) {
    let mut t = ctx.target(workers_c(), &["--threads", "2"]);
    let (pid, _) = wait_ready(&mut t);
    (t, pid)
}

/// A PID that no process has (a reaped child's).
fn dead_pid() -> String {
    let mut child = Command::new("true").spawn().expect("spawn true");
    let pid = child.id().to_string();
    child.wait().expect("reap true");
    pid
}

/// Negative, NaN, infinite, too large and non-numeric `--duration` and
/// `--interval` values, and an interval of 0, each get weft's own one-line
/// error naming the option (checked before weft touches any process), not
/// clap's usage error nor a panic.
#[test]
fn bad_seconds_get_weft_errors() {
    let ctx = Ctx::new("bad_seconds_get_weft_errors");
    let pid = dead_pid();
    let cases: &[(&str, &str)] = &[
        ("--duration", "-1"),
        ("--duration", "-0.5"),
        ("--duration", "NaN"),
        ("--duration", "inf"),
        ("--duration", "-inf"),
        ("--duration", "1e300"),
        ("--duration", "soon"),
        ("--interval", "-1"),
        ("--interval", "nan"),
        ("--interval", "0"),
        ("--interval", "1e-300"),
    ];
    for &(option, value) in cases {
        let mut w = ctx.weft(&["attach", "-p", &pid, "-f", "work_a", option, value]);
        let (_, err) = expect_weft_error(&mut w);
        ctx.check(err.lines().count() == 1, || {
            format!("{option} {value}: more than one stderr line: {err:?}")
        });
        ctx.check(err.contains(option) && err.contains("seconds"), || {
            format!("{option} {value}: the error should name {option} and say it takes seconds: {err:?}")
        });
    }
}
