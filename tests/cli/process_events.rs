//! Process events while weft's probes are live: `fork()` inside an
//! instrumented program (the child runs correctly; its calls are not
//! counted: the runtime gives a forked child a private copy of the
//! counters), `exec()` (the new program runs correctly and weft ends with
//! the report of the old one), and a target stopped by SIGSTOP when weft
//! attaches (weft works, and leaves it stopped).

use crate::support;

use std::process::Command;
use support::*;

/// The target's answers to `commands`, run without weft.
fn plain(commands: &str) -> Vec<String> {
    use std::io::Write;
    let mut child = Command::new(events())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("running events");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(commands.as_bytes())
        .unwrap();
    let out = child.wait_with_output().expect("events output");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with("ready"))
        .map(str::to_string)
        .collect()
}

const FLAGS: [&str; 4] = ["-f", "work", "--format", "json"];

/// The target's answers so far (its stdout without the `ready` line).
fn answers(t: &Proc) -> Vec<String> {
    t.stdout_text()
        .lines()
        .filter(|l| !l.starts_with("ready"))
        .map(str::to_string)
        .collect()
}

#[test]
fn fork_in_an_instrumented_target() {
    let ctx = Ctx::new("fork_in_an_instrumented_target");
    let want = plain("fork\nquit\n");
    let mut t = ctx.target(events(), &[]);
    let (pid, _) = wait_ready(&mut t);
    let (mut weft, _) = attach(&ctx, pid, &FLAGS, 1);
    t.send("fork");
    t.expect_stdout("the parent's line", |l| l.starts_with("parent "));
    let report = parse_report(&ctx, &detach_with_sigint(&mut weft));
    t.send("quit");
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
    let got = answers(&t);
    ctx.check(got == want, || {
        format!("output under weft {got:?}, plain {want:?}")
    });
    // The parent's 200 calls, exactly; the child's 100 went to its own
    // private copy of the counters.
    let c = report.counts(pid as i64, "work");
    ctx.check(c.calls == 200 && c.exits == Some(200), || {
        format!("the parent's work: {c:?}, 200 calls and exits expected")
    });
    let total = report.function("work").map(|f| f.calls);
    ctx.check(total == Some(200), || {
        format!("work counted {total:?} times in all, 200 expected (the child is not counted)")
    });
}

#[test]
fn exec_while_probes_are_live() {
    let ctx = Ctx::new("exec_while_probes_are_live");
    let want = plain("calls 10\nexec\n");
    let mut t = ctx.target(events(), &[]);
    let (pid, _) = wait_ready(&mut t);
    let (mut weft, _) = attach(&ctx, pid, &FLAGS, 1);
    t.send("calls 10");
    t.expect_stdout("`calls`", |l| l.starts_with("calls "));
    t.send("exec");
    t.expect_stdout("`after exec`", |l| l.starts_with("after exec "));
    t.wait_code(0);
    // weft ends with the process and reports the old program's calls.
    weft.wait_code(0);
    let got = answers(&t);
    ctx.check(got == want, || {
        format!("output under weft {got:?}, plain {want:?}")
    });
    let report = parse_report(&ctx, &weft.stdout_text());
    let c = report.counts(pid as i64, "work");
    ctx.check(c.calls == 110, || {
        format!("work before the exec: {c:?}, 110 calls expected")
    });
}

#[test]
fn attach_to_a_stopped_target() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let ctx = Ctx::new("attach_to_a_stopped_target");
    let want = plain("calls 1000\nquit\n");
    let mut t = ctx.target(events(), &[]);
    let (pid, _) = wait_ready(&mut t);
    // The target is this test's own child.
    kill(Pid::from_raw(pid as i32), Signal::SIGSTOP).expect("SIGSTOP");
    let stopped = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit(')')
                    .next()
                    .map(|r| r.trim_start().starts_with('T'))
            })
            .unwrap_or(false)
    };
    let deadline = std::time::Instant::now() + TIMEOUT;
    while !stopped() {
        ctx.check(std::time::Instant::now() < deadline, || {
            "the target never stopped".into()
        });
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let p = pid.to_string();
    let mut weft = ctx.weft(&[
        "attach",
        "-p",
        &p,
        "-f",
        "work",
        "--duration",
        "0.3",
        "--format",
        "json",
    ]);
    weft.wait_code(0);
    // Still stopped: weft did not continue a process job control stopped.
    std::thread::sleep(std::time::Duration::from_millis(50));
    ctx.check(stopped(), || {
        "weft left the SIGSTOPped target running".into()
    });
    kill(Pid::from_raw(pid as i32), Signal::SIGCONT).expect("SIGCONT");
    t.send("calls 1000");
    t.expect_stdout("`calls`", |l| l.starts_with("calls "));
    t.send("quit");
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
    let got = answers(&t);
    ctx.check(got == want, || format!("output {got:?}, plain {want:?}"));
}

/// Loading the runtime calls `dlopen` in the target; on a thread stopped
/// inside malloc (in `brk`, arena lock held) that corrupted the heap or
/// deadlocked. A target that is almost always there, alone or with an idle
/// thread, gets weft's first attach four times each and must finish
/// normally every time (weft runs a thread until it returns to its own
/// code, or picks the idle one).
#[test]
fn first_attach_to_a_target_inside_malloc() {
    let ctx = Ctx::new("first_attach_to_a_target_inside_malloc");
    for run in 0..8 {
        let idle = run % 2 == 1;
        let args: &[&str] = if idle { &["800", "idle"] } else { &["800"] };
        let mut t = ctx.target(brkloop(), args);
        let (pid, _) = wait_ready(&mut t);
        std::thread::sleep(std::time::Duration::from_millis(100));
        let p = pid.to_string();
        let mut weft = ctx.weft(&[
            "attach",
            "-p",
            &p,
            "-f",
            "getpid",
            "-m",
            "calls",
            "--duration",
            "0.1",
        ]);
        weft.wait_code(0);
        t.expect_stdout("`done`", |l| l.starts_with("done "));
        t.wait_code(0);
    }
}
