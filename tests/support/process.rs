//! Running processes: the test's context ([`Ctx`]), which shows every
//! process's output when the test fails; the processes it starts
//! ([`Proc`]), read line by line, killed by their PID and reaped on drop,
//! every wait with a deadline ([`TIMEOUT`]); and weft's side of it: its
//! `weft: attached` line, detaching with SIGINT, its error contract.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Deadline for every single wait in the tests.
pub const TIMEOUT: Duration = Duration::from_secs(60);

pub fn weft_bin() -> &'static str {
    env!("CARGO_BIN_EXE_weft")
}

struct Logs {
    name: String,
    pid: u32,
    stdout: Mutex<String>,
    stderr: Mutex<String>,
}

/// The set of processes a test started, for failure messages.
#[derive(Clone)]
pub struct Ctx {
    test: String,
    procs: Arc<Mutex<Vec<Arc<Logs>>>>,
}

impl Ctx {
    pub fn new(test: &str) -> Ctx {
        Ctx {
            test: test.to_string(),
            procs: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Everything every process of this test printed so far.
    pub fn dump(&self) -> String {
        let mut s = String::new();
        for l in self.procs.lock().unwrap().iter() {
            s += &format!(
                "----- {} (pid {}) stdout -----\n{}\n----- {} (pid {}) stderr -----\n{}\n",
                l.name,
                l.pid,
                l.stdout.lock().unwrap(),
                l.name,
                l.pid,
                l.stderr.lock().unwrap()
            );
        }
        s
    }

    /// Fails the test, showing every process's output. The guards then kill
    /// whatever is still running.
    #[track_caller]
    pub fn fail(&self, msg: impl AsRef<str>) -> ! {
        panic!("[{}] {}\n{}", self.test, msg.as_ref(), self.dump())
    }

    #[track_caller]
    pub fn check(&self, cond: bool, msg: impl FnOnce() -> String) {
        if !cond {
            self.fail(msg())
        }
    }

    /// Spawns `cmd` with stdout and stderr captured line by line.
    pub fn spawn(&self, name: &str, mut cmd: Command, piped_stdin: bool) -> Proc {
        cmd.stdin(if piped_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| self.fail(format!("cannot spawn {cmd:?}: {e}")));
        let pid = child.id();
        let logs = Arc::new(Logs {
            name: name.to_string(),
            pid,
            stdout: Mutex::new(String::new()),
            stderr: Mutex::new(String::new()),
        });
        self.procs.lock().unwrap().push(logs.clone());
        let (otx, orx) = mpsc::channel();
        let (etx, erx) = mpsc::channel();
        let so = child.stdout.take().unwrap();
        let se = child.stderr.take().unwrap();
        let l1 = logs.clone();
        let l2 = logs.clone();
        std::thread::spawn(move || pump(so, otx, &l1, true));
        std::thread::spawn(move || pump(se, etx, &l2, false));

        let stdin = child.stdin.take();
        Proc {
            ctx: self.clone(),
            name: name.to_string(),
            logs,
            child,
            pid,
            stdin,
            out_rx: orx,
            err_rx: erx,
            out_eof: false,
            err_eof: false,
            status: None,
        }
    }

    /// Starts a target program with a piped stdin.
    pub fn target(&self, exe: &Path, args: &[&str]) -> Proc {
        let mut c = Command::new(exe);
        c.args(args);
        self.spawn(&format!("target {}", exe.display()), c, true)
    }

    /// Starts `weft ARGS...` (stdin closed).
    pub fn weft(&self, args: &[&str]) -> Proc {
        self.weft_with_env(args, &[])
    }

    /// Starts `weft ARGS...` (stdin closed) with `env` added to its
    /// environment.
    pub fn weft_with_env(&self, args: &[&str], env: &[(&str, &str)]) -> Proc {
        let mut c = Command::new(weft_bin());
        c.args(args);
        c.envs(env.iter().copied());
        self.spawn(&format!("weft {}", args.join(" ")), c, false)
    }
}

fn pump(r: impl Read, tx: mpsc::Sender<Option<String>>, logs: &Logs, is_stdout: bool) {
    let mut r = BufReader::new(r);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match r.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let line = String::from_utf8_lossy(&buf).into_owned();
                {
                    let mut l = if is_stdout {
                        logs.stdout.lock()
                    } else {
                        logs.stderr.lock()
                    }
                    .unwrap();
                    l.push_str(&line);
                }
                let _ = tx.send(Some(line.trim_end_matches('\n').to_string()));
            }
        }
    }
    let _ = tx.send(None);
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// A started process; killed (SIGKILL to its PID) and reaped on drop.
pub struct Proc {
    ctx: Ctx,
    name: String,
    logs: Arc<Logs>,
    child: Child,
    pub pid: u32,
    stdin: Option<ChildStdin>,
    out_rx: Receiver<Option<String>>,
    err_rx: Receiver<Option<String>>,
    out_eof: bool,
    err_eof: bool,
    status: Option<ExitStatus>,
}

impl Proc {
    pub fn pid_str(&self) -> String {
        self.pid.to_string()
    }

    /// Writes one line to the process's stdin.
    #[track_caller]
    pub fn send(&mut self, line: &str) {
        let name = self.name.clone();
        let r = match self.stdin.as_mut() {
            Some(s) => s
                .write_all(format!("{line}\n").as_bytes())
                .and_then(|_| s.flush()),
            None => Err(std::io::Error::other("stdin not piped")),
        };
        if let Err(e) = r {
            self.ctx
                .fail(format!("cannot send {line:?} to {name}: {e}"));
        }
    }

    /// Closes stdin (the targets then exit).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Waits (with [`TIMEOUT`]) for a line on `stream` satisfying `pred`;
    /// earlier lines are skipped (they stay in the logs).
    #[track_caller]
    pub fn expect_line(
        &mut self,
        stream: Stream,
        what: &str,
        pred: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let now = Instant::now();
            if now >= deadline {
                self.ctx.fail(format!(
                    "timed out after {TIMEOUT:?} waiting for {what} on {stream:?} of {}",
                    self.name
                ));
            }
            let rx = if stream == Stream::Stdout {
                &self.out_rx
            } else {
                &self.err_rx
            };
            match rx.recv_timeout(deadline - now) {
                Ok(Some(line)) if pred(&line) => return line,
                Ok(Some(_)) => continue,
                Ok(None) | Err(RecvTimeoutError::Disconnected) => {
                    if stream == Stream::Stdout {
                        self.out_eof = true
                    } else {
                        self.err_eof = true
                    }
                    self.ctx
                        .fail(format!("{:?} of {} ended before {what}", stream, self.name))
                }
                Err(RecvTimeoutError::Timeout) => continue,
            }
        }
    }

    #[track_caller]
    pub fn expect_stdout(&mut self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        self.expect_line(Stream::Stdout, what, pred)
    }

    /// True while the process has not exited (reaps it if it has).
    pub fn is_running(&mut self) -> bool {
        if self.status.is_some() {
            return false;
        }
        match self.child.try_wait() {
            Ok(Some(st)) => {
                self.status = Some(st);
                false
            }
            Ok(None) => true,
            Err(e) => self.ctx.fail(format!("try_wait on {}: {e}", self.name)),
        }
    }

    /// Waits (with [`TIMEOUT`]) for the process to exit and for its output
    /// pipes to reach end of file; returns the exit status.
    #[track_caller]
    pub fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + TIMEOUT;
        while self.is_running() {
            if Instant::now() >= deadline {
                self.ctx.fail(format!(
                    "timed out after {TIMEOUT:?} waiting for {} to exit",
                    self.name
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Drain both channels to EOF so that the logs are complete.
        for stream in [Stream::Stdout, Stream::Stderr] {
            loop {
                let eof = if stream == Stream::Stdout {
                    self.out_eof
                } else {
                    self.err_eof
                };
                if eof {
                    break;
                }
                let now = Instant::now();
                if now >= deadline {
                    self.ctx.fail(format!(
                        "{} exited but its {stream:?} stayed open (a child still holds it?)",
                        self.name
                    ));
                }
                let rx = if stream == Stream::Stdout {
                    &self.out_rx
                } else {
                    &self.err_rx
                };
                match rx.recv_timeout(deadline - now) {
                    Ok(Some(_)) => {}
                    Ok(None) | Err(RecvTimeoutError::Disconnected) => {
                        if stream == Stream::Stdout {
                            self.out_eof = true
                        } else {
                            self.err_eof = true
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                }
            }
        }
        self.status.unwrap()
    }

    /// Waits for exit and requires exit code `code`.
    #[track_caller]
    pub fn wait_code(&mut self, code: i32) {
        let st = self.wait_exit();
        if st.code() != Some(code) {
            let stderr = self.stderr_text();
            let tail: Vec<&str> = stderr.lines().rev().take(8).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            self.ctx.fail(format!(
                "{} ended with {st:?}, expected exit code {code}; its stderr ends:\n{}",
                self.name,
                tail.join("\n")
            ));
        }
    }

    /// Everything the process wrote to stdout so far.
    pub fn stdout_text(&self) -> String {
        self.logs().stdout.lock().unwrap().clone()
    }

    /// Waits (20 s at most) until its stdout holds `text`: `what` names it
    /// in the failure.
    #[track_caller]
    pub fn wait_stdout_holds(&self, text: &str, what: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !self.stdout_text().contains(text) {
            self.ctx.check(std::time::Instant::now() < deadline, || {
                format!("no {what} ({text:?}) in 20 s:\n{}", self.stdout_text())
            });
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    pub fn stderr_text(&self) -> String {
        self.logs().stderr.lock().unwrap().clone()
    }

    fn logs(&self) -> Arc<Logs> {
        self.logs.clone()
    }

    pub fn ctx(&self) -> &Ctx {
        &self.ctx
    }

    /// Sends `sig` to this process (which the test started), if still running.
    #[track_caller]
    pub fn signal(&mut self, sig: nix::sys::signal::Signal) {
        if self.is_running() {
            if let Err(e) = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid as i32), sig)
            {
                self.ctx
                    .fail(format!("kill({}, {sig}) failed: {e}", self.pid));
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The fields of `weft: attached pid=PID threads=T functions=N`.
#[derive(Debug, Clone, Copy)]
pub struct Attached {
    pub pid: u32,
    pub threads: u32,
    pub functions: u32,
}

pub const ATTACHED_PREFIX: &str = "weft: attached ";

/// Waits for weft's `weft: attached ...` stderr line and parses it.
#[track_caller]
pub fn wait_attached(weft: &mut Proc) -> Attached {
    let line = weft.expect_line(Stream::Stderr, "the `weft: attached` line", |l| {
        l.starts_with(ATTACHED_PREFIX)
    });
    let mut kv = BTreeMap::new();
    for f in line[ATTACHED_PREFIX.len()..].split_whitespace() {
        let (k, v) = f
            .split_once('=')
            .unwrap_or_else(|| weft.ctx.fail(format!("bad attached line {line:?}")));
        let v: u32 = v
            .parse()
            .unwrap_or_else(|_| weft.ctx.fail(format!("bad number in {line:?}")));
        kv.insert(k.to_string(), v);
    }
    let keys: Vec<&str> = kv.keys().map(|k| k.as_str()).collect();
    if keys != ["functions", "pid", "threads"] {
        weft.ctx.fail(format!(
            "attached line {line:?} must have exactly pid=, threads=, functions="
        ));
    }
    Attached {
        pid: kv["pid"],
        threads: kv["threads"],
        functions: kv["functions"],
    }
}

/// Starts `weft attach -p PID ARGS...` and waits until it is attached;
/// checks the pid and function count of the attached line.
#[track_caller]
pub fn attach(ctx: &Ctx, pid: u32, args: &[&str], functions: u32) -> (Proc, Attached) {
    attach_with_env(ctx, pid, args, functions, &[])
}

/// [`attach`] with `env` added to weft's environment.
#[track_caller]
pub fn attach_with_env(
    ctx: &Ctx,
    pid: u32,
    args: &[&str],
    functions: u32,
    env: &[(&str, &str)],
) -> (Proc, Attached) {
    let p = pid.to_string();
    let mut all = vec!["attach", "-p", p.as_str()];
    all.extend_from_slice(args);
    let mut weft = ctx.weft_with_env(&all, env);
    let a = wait_attached(&mut weft);
    ctx.check(a.pid == pid, || {
        format!("attached line says pid={}, expected {pid}", a.pid)
    });
    ctx.check(a.functions == functions, || {
        format!(
            "attached line says functions={}, expected {functions}",
            a.functions
        )
    });
    // Exactly one such line.
    (weft, a)
}

/// Starts `weft attach -p PID --children -f FUNCTION --format json`: the
/// process, its descendants now and those it forks later (not waiting for
/// the attach).
pub fn attach_children(ctx: &Ctx, pid: u32, function: &str) -> Proc {
    let pid = pid.to_string();
    ctx.weft(&[
        "attach",
        "-p",
        &pid,
        "--children",
        "-f",
        function,
        "--format",
        "json",
    ])
}

/// Sends SIGINT to weft, waits for exit code 0 and returns its stdout.
#[track_caller]
pub fn detach_with_sigint(weft: &mut Proc) -> String {
    weft.signal(nix::sys::signal::Signal::SIGINT);
    weft.wait_code(0);
    check_single_attached_line(weft);
    weft.stdout_text()
}

/// After weft exited: its stderr has exactly one `weft: attached` line.
#[track_caller]
pub fn check_single_attached_line(weft: &Proc) {
    let n = weft
        .stderr_text()
        .lines()
        .filter(|l| l.starts_with(ATTACHED_PREFIX))
        .count();
    if n != 1 {
        weft.ctx.fail(format!(
            "weft printed {n} `weft: attached` lines, expected exactly one"
        ));
    }
}

/// Checks a failed weft run against the error contract: non-zero exit code
/// (not a signal, not a Rust panic), the first stderr line starts with
/// `weft: error:`, it is the only such line, and every stderr line starts
/// with `weft:`. Returns (error line, whole stderr).
#[track_caller]
pub fn expect_weft_error(weft: &mut Proc) -> (String, String) {
    let st = weft.wait_exit();
    let err = weft.stderr_text();
    let ctx = weft.ctx.clone();
    match st.code() {
        Some(0) => ctx.fail("weft succeeded, expected an error"),
        Some(101) => ctx.fail("weft exited 101 (a Rust panic?), expected a clean error"),
        Some(_) => {}
        None => ctx.fail(format!(
            "weft was killed by a signal ({st:?}), expected a clean error"
        )),
    }
    ctx.check(!err.contains("panicked"), || "weft panicked".into());
    let lines: Vec<&str> = err.lines().collect();
    ctx.check(!lines.is_empty(), || {
        "weft printed nothing on stderr".into()
    });
    ctx.check(lines[0].starts_with("weft: error:"), || {
        format!(
            "first stderr line {:?} must start with `weft: error:`",
            lines[0]
        )
    });
    let n = lines
        .iter()
        .filter(|l| l.starts_with("weft: error:"))
        .count();
    ctx.check(n == 1, || format!("{n} `weft: error:` lines, expected one"));
    for l in &lines {
        ctx.check(l.starts_with("weft:"), || {
            format!("stderr line {l:?} does not start with `weft:`")
        });
    }
    (lines[0].to_string(), err)
}

/// Parses `ready pid=P threads=T` (threads optional).
#[track_caller]
pub fn wait_ready(target: &mut Proc) -> (u32, Option<u32>) {
    let line = target.expect_stdout("the `ready` line", |l| l.starts_with("ready pid="));
    let mut pid = None;
    let mut threads = None;
    for f in line.split_whitespace().skip(1) {
        match f.split_once('=') {
            Some(("pid", v)) => pid = v.parse().ok(),
            Some(("threads", v)) => threads = v.parse().ok(),
            _ => {}
        }
    }
    let pid = pid.unwrap_or_else(|| target.ctx.fail(format!("bad ready line {line:?}")));
    target.ctx.check(pid == target.pid, || {
        format!("ready line says pid {pid}, spawned pid {}", target.pid)
    });
    (pid, threads)
}

/// Splits weft run's stdout into the target's part (up to and including its
/// `done` line) and what follows (the report).
#[track_caller]
pub fn split_at_done(ctx: &Ctx, out: &str) -> (String, String) {
    let mut target = String::new();
    let mut rest = out;
    loop {
        let Some(nl) = rest.find('\n') else {
            ctx.fail("no `done` line from the target in weft's stdout");
        };
        let line = &rest[..nl];
        target.push_str(line);
        target.push('\n');
        rest = &rest[nl + 1..];
        if line == "done" {
            return (target, rest.to_string());
        }
    }
}
