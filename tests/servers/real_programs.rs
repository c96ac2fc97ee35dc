//! Programs nobody here wrote, instrumented on two dozen libc functions
//! with `weft run`, or by `weft attach` sessions that come and go while they
//! work: their output is byte-identical to an uninstrumented run, they exit
//! the same way, and weft's reports count their calls.

use crate::support;

use std::path::PathBuf;
use std::process::Command;
use support::*;

fn scratch() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("weft-real-programs");
    std::fs::create_dir_all(&dir).expect("creating the scratch directory");
    dir
}

const LIBC: &str = "malloc,free,calloc,realloc,strlen,strcmp,memset,read,write,open,close,fstat,\
pthread_mutex_lock,pthread_mutex_unlock,strchr,qsort,fwrite,fread,getc,putc,strcoll,memcmp,\
pthread_create,pthread_join";

/// Runs `program args` plain and under `weft run -f LIBC`, compares, and
/// returns weft's JSON report.
fn compare(ctx: &Ctx, program: &str, args: &[&str], extra: &str) -> serde_json::Value {
    let plain = Command::new(program)
        .args(args)
        .output()
        .expect("running the program");
    let report = scratch().join(format!("{}.json", program.replace('/', "_")));
    let functions = format!("{LIBC}{extra}");
    let mut weft_args = vec![
        "run",
        "--format",
        "json",
        "-o",
        report.to_str().unwrap(),
        "-f",
        &functions,
        "--",
        program,
    ];
    weft_args.extend_from_slice(args);
    let under = Command::new(weft_bin())
        .args(&weft_args)
        .output()
        .expect("running weft");
    ctx.check(under.status.code() == plain.status.code(), || {
        format!(
            "{program}: exit {:?} under weft, {:?} plain; weft said {}",
            under.status.code(),
            plain.status.code(),
            String::from_utf8_lossy(&under.stderr)
        )
    });
    ctx.check(under.stdout == plain.stdout, || {
        format!(
            "{program}: output differs under weft ({} vs {} bytes)",
            under.stdout.len(),
            plain.stdout.len()
        )
    });
    ctx.check(under.stderr == plain.stderr, || {
        format!(
            "{program}: stderr differs: {}",
            String::from_utf8_lossy(&under.stderr)
        )
    });
    let text = std::fs::read_to_string(&report).unwrap_or_default();
    let json: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| ctx.fail(format!("bad report {text:?}: {e}")));
    let total: u64 = json["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["calls"].as_u64().unwrap())
        .sum();
    ctx.check(total > 0, || {
        format!("{program}: weft counted no call at all: {text}")
    });
    json
}

#[test]
fn sort_gzip_and_threaded_python_are_unchanged() {
    let ctx = Ctx::new("sort_gzip_and_threaded_python_are_unchanged");
    // A large input, deterministic.
    let input = scratch().join("input.txt");
    let mut x = 12345u64;
    let lines: String = (0..200_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            format!("{}\n", x % 1_000_003)
        })
        .collect();
    std::fs::write(&input, lines).unwrap();
    let input = input.to_str().unwrap();

    let sorted = compare(&ctx, "sort", &[input], "");
    ctx.check(
        sorted["threads"].as_array().is_some_and(|t| !t.is_empty()),
        || "sort: no thread in the report".into(),
    );
    compare(&ctx, "gzip", &["-c", "-6", input], "");

    // The real interpreter (a `python3` on PATH may be a wrapper script).
    let exe = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3");
    let python = String::from_utf8_lossy(&exe.stdout).trim().to_string();
    let script = "import threading, hashlib\n\
out = []\n\
def work(i):\n    h = hashlib.sha256()\n    for k in range(20000): h.update(str(k * i).encode())\n    out.append(h.hexdigest())\n\
ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]\n\
[t.start() for t in ts]; [t.join() for t in ts]\nprint(sorted(out))\n";
    let report = compare(&ctx, &python, &["-c", script], ",PyObject_Malloc");
    let threads = report["threads"].as_array().map_or(0, |t| t.len());
    ctx.check(threads >= 5, || {
        format!("python: {threads} threads in the report, expected the main thread and 4 workers")
    });
}

// ---------------------------------------------------------------------------
// Attaching to, and detaching from, programs in the middle of their work
// ---------------------------------------------------------------------------
//
// Each program is started by the test and fed by it, so that it cannot end
// before the test lets it: `sort` and `xz` read a generated input from a pipe
// the test writes (gated: the test decides how much may flow, and when), the
// SQL shell reads statements line by line, the Python script's threads work
// until a line arrives on stdin. Several `weft attach ... -f LIBC` sessions
// come and go while data flows; each must end with exit code 0 and a report
// that counted calls; the program must go on untraced, and its output, exit
// code and stderr must be byte-identical to a plain run on the same input.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Attach/detach cycles per program.
const CYCLES: usize = 3;

/// The number of functions `-f LIBC` resolves to (each pattern is one
/// exact libc name).
fn libc_count() -> u32 {
    LIBC.split(',').count() as u32
}

/// The real interpreter (a `python3` on PATH may be a wrapper script, and
/// weft must attach to the interpreter itself).
fn python() -> String {
    let exe = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3");
    String::from_utf8_lossy(&exe.stdout).trim().to_string()
}

/// `lines` deterministic lines of numbers, from `seed`.
fn numbers(seed: u64, lines: usize) -> String {
    let mut x = seed | 1;
    (0..lines)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            format!("{}\n", x % 1_000_003)
        })
        .collect()
}

/// Makes `cmd` read its stdin from a new pipe (whose write end is returned)
/// and, with `stdout`, write its stdout to that file: `ctx.spawn` sets up
/// the standard streams, then the `pre_exec` hook replaces these (it runs
/// after them). The second value must live until the spawn.
fn redirect(cmd: &mut Command, stdout: Option<&Path>) -> (File, Vec<OwnedFd>) {
    // O_CLOEXEC: no other child the tests start concurrently inherits them.
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe2");
    let out: Option<OwnedFd> = stdout.map(|p| File::create(p).expect("creating the output").into());
    let rfd = r.as_raw_fd();
    let ofd = out.as_ref().map(|o| o.as_raw_fd());
    // SAFETY: the hook only calls dup2, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(rfd, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(o) = ofd {
                if libc::dup2(o, 1) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut keep = vec![r];
    keep.extend(out);
    (File::from(w), keep)
}

/// Writes fixed chunks to a program's stdin from a thread, as far as the
/// gate allows, pausing `pace` after each; closes the pipe once every chunk
/// is written and the test said it is done. If the test fails first, the
/// writer ends (when dropped, or on EPIPE once the program is killed).
struct Feeder {
    gate: Arc<AtomicUsize>,
    sent: Arc<AtomicUsize>,
    done: Arc<AtomicBool>,
    chunks: Arc<Vec<Vec<u8>>>,
    thread: Option<JoinHandle<()>>,
}

impl Feeder {
    fn start(mut pipe: File, chunks: Vec<Vec<u8>>, gate: usize, pace: Duration) -> Feeder {
        let mut f = Feeder {
            gate: Arc::new(AtomicUsize::new(gate)),
            sent: Arc::new(AtomicUsize::new(0)),
            done: Arc::new(AtomicBool::new(false)),
            chunks: Arc::new(chunks),
            thread: None,
        };
        let (g, s, d, c) = (
            f.gate.clone(),
            f.sent.clone(),
            f.done.clone(),
            f.chunks.clone(),
        );
        f.thread = Some(std::thread::spawn(move || {
            for (i, chunk) in c.iter().enumerate() {
                while g.load(Ordering::SeqCst) <= i {
                    if d.load(Ordering::SeqCst) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                if pipe.write_all(chunk).is_err() {
                    return;
                }
                s.store(i + 1, Ordering::SeqCst);
                std::thread::sleep(pace);
            }
            while !d.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
        }));
        f
    }

    /// Lets `n` more chunks flow.
    fn open(&self, n: usize) -> usize {
        let total = self.chunks.len();
        let g = (self.gate.load(Ordering::SeqCst) + n).min(total);
        self.gate.store(g, Ordering::SeqCst);
        g
    }

    /// Waits until the program took the first `n` chunks (all but the last
    /// pipe-full of them are read).
    #[track_caller]
    fn wait_sent(&self, ctx: &Ctx, n: usize) {
        let deadline = Instant::now() + TIMEOUT;
        while self.sent.load(Ordering::SeqCst) < n {
            if self.thread.as_ref().is_some_and(|t| t.is_finished()) {
                ctx.fail(format!(
                    "the program stopped reading its input after {} chunks",
                    self.sent.load(Ordering::SeqCst)
                ));
            }
            if Instant::now() >= deadline {
                ctx.fail(format!(
                    "timed out: the program took {} chunks of its input in {TIMEOUT:?}, \
                     expected {n}",
                    self.sent.load(Ordering::SeqCst)
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Sends everything left, closes the pipe; returns the whole input.
    #[track_caller]
    fn finish(mut self, ctx: &Ctx) -> Vec<u8> {
        self.gate.store(self.chunks.len(), Ordering::SeqCst);
        self.done.store(true, Ordering::SeqCst);
        self.wait_sent(ctx, self.chunks.len());
        if let Some(t) = self.thread.take() {
            t.join().expect("the feeder thread");
        }
        self.chunks.concat()
    }
}

impl Drop for Feeder {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
    }
}

/// Checks one attach session's JSON report: the target's pid, each of the
/// `functions` exactly once, calls counted (of each of `called` in
/// particular), and every activation closed in the threads that exited.
#[track_caller]
fn check_session(
    ctx: &Ctx,
    what: &str,
    text: &str,
    pid: u32,
    functions: &[&str],
    called: &[&str],
) -> Report {
    let report = parse_report(ctx, text);
    ctx.check(report.pid == pid as i64, || {
        format!("{what}: report pid {} != {pid}", report.pid)
    });
    check_metrics(ctx, &report, &["calls", "wall", "cpu"]);
    for f in functions {
        let n = report.functions.iter().filter(|x| x.name == *f).count();
        ctx.check(n == 1, || {
            format!("{what}: {f} appears {n} times in functions[]: {text}")
        });
    }
    let total: u64 = report.functions.iter().map(|f| f.calls).sum();
    ctx.check(total > 0, || {
        format!("{what}: weft counted no call at all: {text}")
    });
    for f in called {
        let n = report.function(f).map_or(0, |x| x.calls);
        ctx.check(n > 0, || {
            format!("{what}: weft counted no call of {f} while the program worked: {text}")
        });
    }
    check_exit_balance(ctx, &report);
    check_timer_totals(ctx, &report);
    report
}

/// After a detach: the program still runs, untraced.
#[track_caller]
fn check_goes_on(ctx: &Ctx, t: &mut Proc, what: &str) {
    ctx.check(t.is_running(), || format!("{what}: the program died"));
    check_not_traced_nor_stopped(ctx, t.pid);
}

/// `exit code, stdout, stderr` of the plain run must equal the watched
/// run's; `out` names the files the two runs wrote, if any.
#[track_caller]
fn check_same(
    ctx: &Ctx,
    what: &str,
    watched: (Option<i32>, &str, &str),
    plain: &std::process::Output,
    out: Option<(&Path, &Path)>,
) {
    let text = |b: &[u8]| {
        String::from_utf8(b.to_vec())
            .unwrap_or_else(|_| ctx.fail(format!("{what}: the plain run's output is not UTF-8")))
    };
    ctx.check(watched.0 == plain.status.code(), || {
        format!(
            "{what}: exit code {:?} after the attach/detach cycles, {:?} plain \
             (stderr {:?}, plain {:?})",
            watched.0,
            plain.status.code(),
            watched.2,
            String::from_utf8_lossy(&plain.stderr)
        )
    });
    let (po, pe) = (text(&plain.stdout), text(&plain.stderr));
    ctx.check(watched.1 == po, || {
        format!(
            "{what}: stdout differs ({} vs {} bytes plain)",
            watched.1.len(),
            po.len()
        )
    });
    ctx.check(watched.2 == pe, || {
        format!("{what}: stderr differs; plain: {pe:?}")
    });
    if let Some((a, b)) = out {
        let (x, y) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
        let at = x.iter().zip(&y).position(|(p, q)| p != q);
        ctx.check(x == y, || {
            format!(
                "{what}: output file differs: {} bytes vs {} plain, first difference at {at:?}",
                x.len(),
                y.len()
            )
        });
        ctx.check(!x.is_empty(), || format!("{what}: empty output"));
    }
}

/// `program args` reads `chunks` from a pipe fed by the test; during the
/// flow, `CYCLES` attach/detach cycles:
///
/// * while `lead` chunks flow, `weft attach` starts;
/// * once it is live, `during` chunks flow, all read while instrumented;
/// * then `trail` more chunks are let go and weft is interrupted, so that
///   it detaches while the program works.
///
/// Then the rest flows and the program ends; its output (stdout, and the
/// file `out`: written by the program itself, e.g. `-o`, or its stdout
/// when `out_is_stdout`) is compared with a plain run on the same bytes.
#[allow(clippy::too_many_arguments)]
fn fed_cycles(
    ctx: &Ctx,
    what: &str,
    program: &str,
    args: &[&str],
    chunks: Vec<Vec<u8>>,
    (lead, during, trail): (usize, usize, usize),
    out: &Path,
    out_is_stdout: bool,
) {
    let dir = scratch();
    let mut cmd = Command::new(program);
    cmd.args(args);
    let (pipe, keep) = redirect(&mut cmd, out_is_stdout.then_some(out));
    let mut t = ctx.spawn(what, cmd, false);
    drop(keep);
    let pid = t.pid;
    let feeder = Feeder::start(pipe, chunks, lead, Duration::from_millis(10));
    // Mid-work before the first attach (a chunk in the pipe is not yet a
    // started program: its loader may still be mapping libc).
    feeder.wait_sent(ctx, 1);
    wait_libc_mapped(ctx, pid);
    let n = libc_count();
    let funcs: Vec<&str> = LIBC.split(',').collect();
    let weft_args = ["-f", LIBC, "--format", "json"];
    for c in 0..CYCLES {
        let what = format!("{what} cycle {c}");
        let started = Instant::now();
        let (mut weft, a) = attach(ctx, pid, &weft_args, n);
        let live = started.elapsed();
        ctx.check(a.threads >= 1, || format!("{what}: attached to no thread"));
        let target = feeder.open(during);
        feeder.wait_sent(ctx, target);
        feeder.open(trail);
        let text = detach_with_sigint(&mut weft);
        let r = check_session(ctx, &what, &text, pid, &funcs, &["read"]);
        eprintln!(
            "{what}: live after {live:?}, session {:?}, {} threads counted",
            started.elapsed(),
            r.threads.len()
        );
        check_goes_on(ctx, &mut t, &what);
        feeder.open(lead);
    }
    let input = feeder.finish(ctx);
    let status = t.wait_exit();

    let input_file = dir.join(format!("{what}.in"));
    std::fs::write(&input_file, &input).unwrap();
    let plain_out = dir.join(format!("{what}.plain.out"));
    let mut plain = Command::new(program);
    let args: Vec<String> = args
        .iter()
        .map(|a| a.replace(out.to_str().unwrap(), plain_out.to_str().unwrap()))
        .collect();
    plain.args(&args).stdin(File::open(&input_file).unwrap());
    if out_is_stdout {
        plain.stdout(File::create(&plain_out).unwrap());
    }
    let plain = plain.output().expect("the plain run");
    check_same(
        ctx,
        what,
        (status.code(), &t.stdout_text(), &t.stderr_text()),
        &plain,
        Some((out, &plain_out)),
    );
}

/// `chunks` chunks of `lines` lines of numbers each.
fn number_chunks(seed: u64, chunks: usize, lines: usize) -> Vec<Vec<u8>> {
    (0..chunks)
        .map(|i| numbers(seed + i as u64 * 7919, lines).into_bytes())
        .collect()
}

#[test]
fn attach_detach_cycles_on_sort_leave_its_output_unchanged() {
    let ctx = Ctx::new("attach_detach_cycles_on_sort_leave_its_output_unchanged");
    let out = scratch().join("sort-cycles.out");
    let tmp = scratch().join("sort-tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    // 16 KiB chunks, ~6 MB in all. With a 12 MB buffer sort fills it about
    // every 2.4 MB of input and sorts it with two threads (then writes a
    // temporary file); the final merge runs after the end of the input.
    let (lead, during, trail) = (50, 30, 30);
    let chunks = number_chunks(1, 2 * lead + CYCLES * (lead + during + trail), 2000);
    fed_cycles(
        &ctx,
        "sort",
        "sort",
        &[
            "--parallel=2",
            "-S",
            "12M",
            "-T",
            tmp.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ],
        chunks,
        (lead, during, trail),
        &out,
        false,
    );
}

#[test]
fn attach_detach_cycles_on_threaded_xz_leave_its_output_unchanged() {
    let ctx = Ctx::new("attach_detach_cycles_on_threaded_xz_leave_its_output_unchanged");
    let out = scratch().join("xz-cycles.xz");
    // Two compressing threads, each on its own 256 KiB block.
    let (lead, during, trail) = (50, 30, 30);
    let chunks = number_chunks(2, 2 * lead + CYCLES * (lead + during + trail), 2000);
    fed_cycles(
        &ctx,
        "xz",
        "xz",
        &["-T2", "-1", "--block-size=256KiB", "-c"],
        chunks,
        (lead, during, trail),
        &out,
        true,
    );
}

/// Four threads building dicts, lists and strings and hashing them, round
/// after round, until a line arrives on stdin; every round must give the
/// thread's first digest again. Prints `ready` once they run, then the
/// digests. The output does not depend on how many rounds ran.
const BUSY_PY: &str = "import sys, threading, hashlib
stop = threading.Event()
def round_(i):
    d = {}
    for k in range(2000):
        d[str(k * (i + 3))] = [k, str(k) * 3, (k, i)]
    h = hashlib.sha256()
    for k, v in sorted(d.items()):
        h.update(k.encode())
        h.update(repr(v).encode())
    return h.hexdigest()
digests = [None] * 4
bad = []
def work(i):
    first = round_(i)
    while not stop.is_set():
        if round_(i) != first:
            bad.append(i)
    digests[i] = first
ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
for t in ts:
    t.start()
print('ready', flush=True)
sys.stdin.readline()
stop.set()
for t in ts:
    t.join()
print('\\n'.join(digests))
print('inconsistent rounds:', bad)
";

#[test]
fn attach_detach_cycles_on_threaded_python_leave_its_output_unchanged() {
    let ctx = Ctx::new("attach_detach_cycles_on_threaded_python_leave_its_output_unchanged");
    let python = python();
    let mut cmd = Command::new(&python);
    cmd.args(["-c", BUSY_PY]);
    let mut t = ctx.spawn("python", cmd, true);
    let pid = t.pid;
    t.expect_stdout("`ready`", |l| l == "ready");
    let functions = format!("{LIBC},PyObject_Malloc");
    let funcs: Vec<&str> = functions.split(',').collect();
    let mut tids = std::collections::BTreeSet::new();
    // Each session ends by itself (`--duration`), while the four threads
    // work: they stop only when the test says so.
    for c in 0..CYCLES {
        let what = format!("python cycle {c}");
        let started = Instant::now();
        let (mut weft, a) = attach(
            &ctx,
            pid,
            &["-f", &functions, "--duration", "0.3", "--format", "json"],
            libc_count() + 1,
        );
        let live = started.elapsed();
        ctx.check(a.threads >= 5, || {
            format!(
                "{what}: attached to {} threads, expected at least 5",
                a.threads
            )
        });
        weft.wait_code(0);
        check_single_attached_line(&weft);
        let r = check_session(
            &ctx,
            &what,
            &weft.stdout_text(),
            pid,
            &funcs,
            &["PyObject_Malloc"],
        );
        let busy: Vec<i64> = r
            .threads
            .iter()
            .filter(|t| t.functions.values().any(|f| f.calls > 0))
            .map(|t| t.tid)
            .collect();
        // All four take turns holding the GIL many times in 0.3 s (it
        // switches every 5 ms), but a loaded machine may starve some.
        ctx.check(busy.len() >= 2, || {
            format!("{what}: calls in {} threads only: {r:#?}", busy.len())
        });
        tids.extend(busy);
        eprintln!(
            "{what}: live after {live:?}, session {:?}, {} threads counted",
            started.elapsed(),
            r.threads.len()
        );
        check_goes_on(&ctx, &mut t, &what);
    }
    ctx.check(tids.len() >= 4, || {
        format!(
            "calls in {} threads over all cycles, expected the 4 workers",
            tids.len()
        )
    });
    t.send("stop");
    let status = t.wait_exit();

    let mut plain = Command::new(&python)
        .args(["-c", BUSY_PY])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the plain run");
    plain.stdin.take().unwrap().write_all(b"stop\n").unwrap();
    let plain = plain.wait_with_output().expect("the plain run");
    check_same(
        &ctx,
        "python",
        (status.code(), &t.stdout_text(), &t.stderr_text()),
        &plain,
        None,
    );
    ctx.check(t.stdout_text().contains("inconsistent rounds: []"), || {
        "python: a thread's rounds disagreed".into()
    });
}

/// SQL statement `i` (after `SQL_SETUP`): a sorted query, or inserts and
/// deletes; each prints one line starting with `q<i>|`.
fn sql(i: usize) -> String {
    if i % 2 == 0 {
        format!(
            "SELECT 'q{i}', count(*), sum(k % {m}), min(v), max(v) FROM \
             (SELECT k, v FROM t WHERE k % 7 = {r} ORDER BY v DESC LIMIT 8000);",
            m = i + 7,
            r = i % 7
        )
    } else {
        format!(
            "INSERT INTO t SELECT k + {i}, upper(v) || '{i}' FROM t WHERE k % 97 = {a}; \
             DELETE FROM t WHERE k % 89 = {b}; SELECT 'q{i}', count(*), total(length(v)) FROM t;",
            a = i % 97,
            b = i % 89
        )
    }
}

const SQL_SETUP: &str = "CREATE TABLE t(k INTEGER, v TEXT);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100000)
INSERT INTO t SELECT x * 7919 % 1000003, printf('%08d-%s', x, hex(x * x)) FROM c;";

#[test]
fn attach_detach_cycles_on_sqlite3_leave_its_output_unchanged() {
    let ctx = Ctx::new("attach_detach_cycles_on_sqlite3_leave_its_output_unchanged");
    // Statements of ~30 ms each: `lead` sent before an attach, `during`
    // sent once live and all answered, `trail` sent just before detaching.
    let (lead, during, trail) = (20, 5, 10);
    let mut cmd = Command::new("sqlite3");
    cmd.arg(":memory:");
    let mut t = ctx.spawn("sqlite3", cmd, true);
    let pid = t.pid;
    let mut script = format!("{SQL_SETUP}\n");
    let mut next = 0;
    let mut send = |t: &mut Proc, n: usize| {
        for _ in 0..n {
            let s = sql(next);
            t.send(&s);
            script += &s;
            script += "\n";
            next += 1;
        }
        next
    };
    t.send(SQL_SETUP);
    // sqlite3 has started (its loader mapped libc) once it answers.
    let last = send(&mut t, lead) - 1;
    let tag = format!("q{last}|");
    t.expect_stdout("the answer to the lead statements", |l| l.starts_with(&tag));
    let funcs: Vec<&str> = LIBC.split(',').collect();
    for c in 0..CYCLES {
        let what = format!("sqlite3 cycle {c}");
        let started = Instant::now();
        let (mut weft, _) = attach(&ctx, pid, &["-f", LIBC, "--format", "json"], libc_count());
        let live = started.elapsed();
        // In two batches, the second sent once the first is answered: the
        // `read` sqlite3 was blocked in when weft attached started before
        // the probe (it is not counted) and may return the whole first
        // batch; the second batch needs a `read` made while live.
        for batch in [1, during - 1] {
            let last = send(&mut t, batch) - 1;
            let tag = format!("q{last}|");
            t.expect_stdout("the answer to the last statement", |l| l.starts_with(&tag));
        }
        send(&mut t, trail);
        let text = detach_with_sigint(&mut weft);
        let r = check_session(&ctx, &what, &text, pid, &funcs, &["read", "malloc", "free"]);
        eprintln!(
            "{what}: live after {live:?}, session {:?}, {} threads counted",
            started.elapsed(),
            r.threads.len()
        );
        check_goes_on(&ctx, &mut t, &what);
        send(&mut t, lead);
    }
    t.close_stdin();
    let status = t.wait_exit();

    let input = scratch().join("sqlite3.sql");
    std::fs::write(&input, &script).unwrap();
    let plain = Command::new("sqlite3")
        .arg(":memory:")
        .stdin(File::open(&input).unwrap())
        .output()
        .expect("the plain run");
    check_same(
        &ctx,
        "sqlite3",
        (status.code(), &t.stdout_text(), &t.stderr_text()),
        &plain,
        None,
    );
    let answers = t.stdout_text().lines().count();
    ctx.check(answers == next, || {
        format!("sqlite3: {answers} answers to {next} statements")
    });
}
