//! Error cases: one `weft: error:` line (plus optional `weft:` hints),
//! non-zero exit, and the target keeps running unharmed.

use crate::support;

use nix::sys::ptrace;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use support::*;

/// Starts C workers (2 threads, 1 phase) and waits for `ready`.
fn start_workers(ctx: &Ctx) -> (Proc, u32) {
    let mut t = ctx.target(workers_c(), &["--threads", "2"]);
    let (pid, _) = wait_ready(&mut t);
    (t, pid)
}

/// The target is untouched: same mappings as before, not traced or stopped,
/// and its phase still produces exact results.
fn check_workers_unharmed(ctx: &Ctx, t: &mut Proc, pid: u32, maps_before: &str) {
    ctx.check(t.is_running(), || "the target died".into());
    let after = maps_text(pid);
    ctx.check(after == maps_before, || {
        format!(
            "the target's mappings changed:\n--- before ---\n{maps_before}\n--- after ---\n{after}"
        )
    });
    check_not_traced_nor_stopped(ctx, pid);
    t.send("go");
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
    check_worker_phase(ctx, &t.stdout_text(), 1, 2);
}

#[test]
fn error_no_such_pid() {
    let ctx = Ctx::new("error_no_such_pid");
    let mut child = Command::new("true").spawn().expect("spawn true");
    let pid = child.id().to_string();
    child.wait().expect("reap true");
    let mut w = ctx.weft(&["attach", "-p", &pid, "-f", "work_a"]);
    expect_weft_error(&mut w);
    let mut w = ctx.weft(&["list", "-p", &pid]);
    expect_weft_error(&mut w);
}

#[test]
fn error_not_permitted() {
    let ctx = Ctx::new("error_not_permitted");
    let (mut t, pid) = start_workers(&ctx);
    let maps = maps_text(pid);
    let p = pid.to_string();
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        weft_bin(),
        "attach",
        "-p",
        &p,
        "-f",
        "work_a",
    ]);
    let mut w = ctx.spawn("weft (as nobody via setpriv)", c, false);
    let (_, err) = expect_weft_error(&mut w);
    let e = err.to_lowercase();
    ctx.check(
        e.contains("permission") || e.contains("not permitted"),
        || format!("the error should mention permission: {err:?}"),
    );
    check_workers_unharmed(&ctx, &mut t, pid, &maps);
}

/// The test PTRACE_SEIZEs its own target from a dedicated thread (the tracer
/// must stay alive), runs weft, then detaches.
#[test]
fn error_already_traced() {
    let ctx = Ctx::new("error_already_traced");
    let (mut t, pid) = start_workers(&ctx);
    let maps = maps_text(pid);
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let tracer = std::thread::spawn(move || -> Result<(), String> {
        let p = Pid::from_raw(pid as i32);
        if let Err(e) = ptrace::seize(p, ptrace::Options::empty()) {
            let _ = ready_tx.send(Err(format!("PTRACE_SEIZE: {e}")));
            return Ok(());
        }
        let _ = ready_tx.send(Ok(()));
        // Until the test is done (or panicked and dropped the sender).
        let _ = done_rx.recv_timeout(TIMEOUT * 2);
        // PTRACE_DETACH needs a ptrace-stop: interrupt, wait for it, detach.
        ptrace::interrupt(p).map_err(|e| format!("PTRACE_INTERRUPT: {e}"))?;
        let deadline = Instant::now() + TIMEOUT;
        loop {
            match waitpid(p, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => {
                    if Instant::now() > deadline {
                        return Err("the target never stopped for PTRACE_INTERRUPT".into());
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(WaitStatus::PtraceEvent(..)) | Ok(WaitStatus::PtraceSyscall(..)) => {
                    return ptrace::detach(p, None).map_err(|e| format!("PTRACE_DETACH: {e}"));
                }
                Ok(WaitStatus::Stopped(_, sig)) => {
                    return ptrace::detach(p, Some(sig)).map_err(|e| format!("PTRACE_DETACH: {e}"));
                }
                Ok(other) => return Err(format!("unexpected wait status {other:?}")),
                Err(e) => return Err(format!("waitpid: {e}")),
            }
        }
    });
    match ready_rx.recv_timeout(TIMEOUT) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => ctx.fail(e),
        Err(e) => ctx.fail(format!("tracer thread: {e}")),
    }
    let p = pid.to_string();
    let mut w = ctx.weft(&["attach", "-p", &p, "-f", "work_a"]);
    let (_, err) = expect_weft_error(&mut w);
    let after = maps_text(pid);
    let _ = done_tx.send(());
    match tracer.join() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => ctx.fail(format!("the test's own tracer failed to detach: {e}")),
        Err(_) => ctx.fail("the tracer thread panicked"),
    }
    ctx.check(err.to_lowercase().contains("already traced"), || {
        format!("the error should say `already traced`: {err:?}")
    });
    ctx.check(after == maps, || {
        "weft changed the traced target's mappings".into()
    });
    check_workers_unharmed(&ctx, &mut t, pid, &maps);
}

#[test]
fn error_no_function_matches_suggests() {
    let ctx = Ctx::new("error_no_function_matches_suggests");
    let (mut t, pid) = start_workers(&ctx);
    let maps = maps_text(pid);
    let p = pid.to_string();
    let mut w = ctx.weft(&["attach", "-p", &p, "-f", "wrok_a"]);
    let (_, err) = expect_weft_error(&mut w);
    ctx.check(err.contains("work_a"), || {
        format!("no suggestion of work_a: {err:?}")
    });
    check_workers_unharmed(&ctx, &mut t, pid, &maps);
}

/// `tiny` (1 byte, no padding after it) and `loopy` (a loop head inside its
/// first 5 bytes) cannot take an entry patch: clean errors naming them, the
/// target still computes correctly; `work_a` in the same target attaches
/// fine, and so does `shared_body`, which `sibling_entry` jumps 3 bytes
/// into (a companion sends that jump around the patch): each counted
/// exactly once per `go`, the sibling's call not counted as
/// `shared_body`'s.
#[test]
fn error_unpatchable_functions() {
    let ctx = Ctx::new("error_unpatchable_functions");
    let mut t = ctx.target(unpatchable(), &[]);
    let (pid, _) = wait_ready(&mut t);
    let p = pid.to_string();
    const RESULT: &str = "result tiny=0 loopy=5050 after_tiny=42 shared=42 sibling=42 work_a=";
    for f in ["tiny", "loopy"] {
        let mut w = ctx.weft(&["attach", "-p", &p, "-f", f]);
        let (line, _) = expect_weft_error(&mut w);
        ctx.check(line.contains(f), || {
            format!("the error does not name {f}: {line:?}")
        });
        let reason = line.trim_start_matches("weft: error:").replace(f, "");
        ctx.check(reason.split_whitespace().count() >= 3, || {
            format!("the error gives no reason: {line:?}")
        });
        ctx.check(t.is_running(), || "the target died".into());
        check_not_traced_nor_stopped(&ctx, pid);
        t.send("go");
        t.expect_stdout("a result line", |l| l.starts_with("result "));
    }
    let got: Vec<String> = t
        .stdout_text()
        .lines()
        .filter(|l| l.starts_with("result "))
        .map(String::from)
        .collect();
    ctx.check(
        got == [format!("{RESULT}1000"), format!("{RESULT}2000")],
        || format!("wrong results {got:?}"),
    );

    // Control: a normal function in the same target is patchable, and so
    // is code a sibling entry point jumps into.
    let (mut w, _) = attach(
        &ctx,
        pid,
        &["-f", "work_a,shared_body,sibling_entry", "--format", "json"],
        3,
    );
    t.send("go");
    t.expect_stdout("the third result line", |l| l == format!("{RESULT}3000"));
    let out = detach_with_sigint(&mut w);
    let report = parse_report(&ctx, &out);
    let mut exp = std::collections::BTreeMap::new();
    let mut calls = std::collections::BTreeMap::new();
    calls.insert("work_a".to_string(), 1000);
    calls.insert("shared_body".to_string(), 1);
    calls.insert("sibling_entry".to_string(), 1);
    exp.insert(
        pid as i64,
        ExpThread {
            name: "unpatchable".into(),
            calls,
        },
    );
    check_report_counts(
        &ctx,
        &report,
        &exp,
        &["work_a", "shared_body", "sibling_entry"],
    );
    t.close_stdin();
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
}

#[test]
fn error_statically_linked_target() {
    let ctx = Ctx::new("error_statically_linked_target");
    let mut t = ctx.target(workers_static(), &["--threads", "2"]);
    let (pid, _) = wait_ready(&mut t);
    let maps = maps_text(pid);
    let p = pid.to_string();
    let mut w = ctx.weft(&["attach", "-p", &p, "-f", "work_a"]);
    expect_weft_error(&mut w);
    check_workers_unharmed(&ctx, &mut t, pid, &maps);
}

#[test]
fn error_zombie_pid() {
    let ctx = Ctx::new("error_zombie_pid");
    let mut t = ctx.target(zombie(), &[]);
    let line = t.expect_stdout("the `zombie pid=` line", |l| l.starts_with("zombie pid="));
    let zpid: u32 = line["zombie pid=".len()..]
        .trim()
        .parse()
        .unwrap_or_else(|_| ctx.fail(format!("bad line {line:?}")));
    wait_ready(&mut t);
    let status = std::fs::read_to_string(format!("/proc/{zpid}/status")).unwrap_or_default();
    ctx.check(
        status
            .lines()
            .any(|l| l.starts_with("State:") && l.contains('Z')),
        || format!("pid {zpid} is not a zombie:\n{status}"),
    );
    let z = zpid.to_string();
    let mut w = ctx.weft(&["attach", "-p", &z, "-f", "work_a"]);
    let (_, err) = expect_weft_error(&mut w);
    ctx.check(err.to_lowercase().contains("zombie"), || {
        format!("the error should mention zombie: {err:?}")
    });
    ctx.check(t.is_running(), || "the zombie's parent died".into());
    t.send("go");
    t.expect_stdout("`ok`", |l| l == "ok");
    t.close_stdin();
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
}

/// `weft run` that cannot instrument what it was asked to must not run the
/// program at all: it never reaches `main`, and weft fails with the reason.
#[test]
fn error_run_refuses_and_does_not_run_the_program() {
    let ctx = Ctx::new("error_run_refuses_and_does_not_run_the_program");
    let exe = unpatchable().to_str().unwrap().to_string();
    let mut w = ctx.weft(&["run", "-f", "loopy", "--", &exe]);
    let (line, _) = expect_weft_error(&mut w);
    ctx.check(
        line.contains("loopy") && line.contains("jumps into the bytes the patch"),
        || format!("the error does not explain the jump into the patch: {line:?}"),
    );
    ctx.check(!w.stdout_text().contains("ready"), || {
        format!(
            "the program ran although instrumenting it failed: {:?}",
            w.stdout_text()
        )
    });
}

/// weft installed setuid root would give every user ptrace over root's
/// processes: run as nobody from a setuid-root copy, it refuses before
/// touching the target, which stays unharmed.
#[test]
fn setuid_weft_refuses_to_run() {
    use std::os::unix::fs::PermissionsExt;
    let ctx = Ctx::new("setuid_weft_refuses_to_run");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        ctx.fail("this test makes a setuid-root copy of weft: run it as root (CI does)");
    }
    let (mut t, pid) = start_workers(&ctx);
    let maps = maps_text(pid);
    let dir = scratch_dir("setuid_weft_refuses_to_run");
    // Executable by nobody: the scratch directory's parents may not be.
    let copy = std::env::temp_dir().join(format!("weft-setuid-test-{}", std::process::id()));
    std::fs::copy(weft_bin(), &copy).expect("copying weft");
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o4755)).expect("chmod 4755");
    let _cleanup = RemoveOnDrop(copy.clone());
    let p = pid.to_string();
    let out = dir.join("never.json");
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&copy)
        .args(["attach", "-p", &p, "-f", "work_a", "-o"])
        .arg(&out);
    let mut w = ctx.spawn("setuid-root weft as nobody", c, false);
    let (_, err) = expect_weft_error(&mut w);
    ctx.check(err.contains("setuid"), || {
        format!("the error should say weft runs setuid: {err:?}")
    });
    ctx.check(!out.exists(), || {
        "the refused weft created its report file".into()
    });
    check_workers_unharmed(&ctx, &mut t, pid, &maps);
}

struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Report files name the target's functions and threads: created 0600.
#[test]
fn report_file_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let ctx = Ctx::new("report_file_is_private");
    let dir = scratch_dir("report_file_is_private");
    let out = dir.join("report.json");
    let _ = std::fs::remove_file(&out);
    let exe = churn().to_str().unwrap().to_string();
    let o = out.to_str().unwrap().to_string();
    let mut w = ctx.weft(&[
        "run", "-m", "calls", "-f", "work", "--format", "json", "-o", &o, "--", &exe, "10", "2",
    ]);
    w.wait_code(0);
    let mode = std::fs::metadata(&out)
        .unwrap_or_else(|e| ctx.fail(format!("no report file: {e}")))
        .permissions()
        .mode();
    ctx.check(mode & 0o777 == 0o600, || {
        format!("the report file has mode {:o}, 600 expected", mode & 0o777)
    });
}
