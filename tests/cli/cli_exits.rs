//! Exit hooks (`-m calls,wall`): functions left through several `ret`s, a
//! tail call, deep recursion, recursion beyond the per-thread capacity,
//! `longjmp`, `pthread_exit` and C++ exceptions. Under weft the programs
//! print byte for byte what they print alone and exit the same way; weft
//! counts every call exactly and accounts for every activation as exited,
//! unwound or unhooked; a `backtrace()` through instrumented frames still
//! sees their callers.

use crate::support;

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use support::*;

/// Activations weft hooks per thread at most (deeper entries are unhooked).
const CAPACITY: u64 = 1024;

// The exits target's constants (tests/targets/exits.c).
const WORKERS: u64 = 2;
const ROUNDS: u64 = 5;
const DEEP: u64 = 1000;
const DEEPER: u64 = 1100;
const EXITERS: u64 = 3;
const BT_ROUNDS: u64 = 3;

const EXITS_FUNCS: [&str; 12] = [
    "multi_ret",
    "tail_caller",
    "tail_callee",
    "deep",
    "deeper",
    "jump_host",
    "jump_mid",
    "jumper",
    "exit_via",
    "exiter",
    "bt_outer",
    "bt_inner",
];

const EXCEPTION_FUNCS: [&str; 2] = ["thrower", "middle"];

/// What one run of a target printed and how it ended.
struct Outcome {
    stdout: String,
    stderr: String,
    code: Option<i32>,
}

/// Runs `exe args` alone.
fn run_plain(ctx: &Ctx, exe: &Path, args: &[&str]) -> Outcome {
    let mut t = ctx.target(exe, args);
    t.close_stdin();
    let st = t.wait_exit();
    Outcome {
        stdout: t.stdout_text(),
        stderr: t.stderr_text(),
        code: st.code(),
    }
}

/// Runs `weft run -m METRICS -f FUNCS --format json -o FILE -- exe args`
/// (the report goes to a file, so stdout holds only the target's output).
/// Starts `weft run -m METRICS -f FUNCS --format json -o FILE -- EXE ARGS`:
/// weft and the report file it will write.
fn start_weft(
    ctx: &Ctx,
    test: &str,
    metrics: &str,
    funcs: &[&str],
    exe: &Path,
    args: &[&str],
) -> (Proc, PathBuf) {
    let file = scratch_dir(test).join("report.json");
    let file_s = file.to_str().unwrap().to_string();
    let funcs = funcs.join(",");
    let mut all = vec![
        "run",
        "-m",
        metrics,
        "-f",
        &funcs,
        "--format",
        "json",
        "-o",
        &file_s,
        "--",
        exe.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    (ctx.weft(&all), file)
}

/// What `weft` (started by [`start_weft`]) did once it exited, and its
/// report.
fn finish_weft(ctx: &Ctx, mut weft: Proc, file: &Path) -> (Outcome, Report) {
    let st = weft.wait_exit();
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| {
        ctx.fail(format!(
            "cannot read the report file {}: {e}",
            file.display()
        ))
    });
    let report = parse_report(ctx, &text);
    (
        Outcome {
            stdout: weft.stdout_text(),
            stderr: weft.stderr_text(),
            code: st.code(),
        },
        report,
    )
}

fn run_weft(
    ctx: &Ctx,
    test: &str,
    metrics: &str,
    funcs: &[&str],
    exe: &Path,
    args: &[&str],
) -> (Outcome, Report) {
    let (weft, file) = start_weft(ctx, test, metrics, funcs, exe, args);
    finish_weft(ctx, weft, &file)
}

/// The same stdout, byte for byte, and the same exit code (0: the targets
/// check their own results) with and without weft.
#[track_caller]
fn check_same_behaviour(ctx: &Ctx, plain: &Outcome, under: &Outcome) {
    ctx.check(plain.code == Some(0), || {
        format!("the target alone exited with {:?}, expected 0", plain.code)
    });
    ctx.check(under.code == plain.code, || {
        format!(
            "exit code {:?} under weft, {:?} alone",
            under.code, plain.code
        )
    });
    ctx.check(under.stdout == plain.stdout, || {
        format!(
            "stdout differs under weft:\n--- alone ---\n{}--- under weft ---\n{}",
            plain.stdout, under.stdout
        )
    });
}

/// `(role, index) -> tid` from the target's `tid role=... index=... tid=...`
/// stderr lines; `count` lines of role `role` expected.
#[track_caller]
fn tids(ctx: &Ctx, stderr: &str, role: &str, count: u64) -> Vec<(i64, BTreeMap<String, String>)> {
    let lines = tid_lines(stderr);
    (0..count)
        .map(|i| {
            let kv = lines
                .get(&(role.to_string(), i))
                .unwrap_or_else(|| ctx.fail(format!("no `tid role={role} index={i}` line")));
            let tid = kv
                .get("tid")
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| ctx.fail(format!("bad tid line {kv:?}")));
            (tid, kv.clone())
        })
        .collect()
}

/// Checks one function's exit accounting in one thread.
#[track_caller]
fn check_accounting(
    ctx: &Ctx,
    report: &Report,
    tid: i64,
    f: &str,
    want: (u64, u64, u64),
    why: &str,
) {
    let c = report.counts(tid, f);
    let got = (
        c.exits.unwrap_or(u64::MAX),
        c.unwound.unwrap_or(u64::MAX),
        c.unhooked.unwrap_or(u64::MAX),
    );
    ctx.check(got == want, || {
        format!(
            "tid {tid} {f}: (exits, unwound, unhooked) = {got:?}, expected {want:?}: {why}\n\
             figures: {c:?}\nreport: {report:#?}"
        )
    });
    ctx.check(c.calls == 0 || c.wall_ns.is_some_and(|w| w > 0), || {
        format!("tid {tid} {f}: {} calls but no wall time: {c:?}", c.calls)
    });
}

/// Instructions of `func` in `exe`, from `objdump -d` (mnemonic and operands).
fn disassembly(ctx: &Ctx, exe: &Path, func: &str) -> Vec<String> {
    let mut c = Command::new("objdump");
    c.args(["-d", "--no-show-raw-insn"]).arg(exe);
    let mut p = ctx.spawn("objdump", c, false);
    p.wait_code(0);
    let text = p.stdout_text();
    let head = format!("<{func}>:");
    let mut out = Vec::new();
    let mut inside = false;
    for l in text.lines() {
        if l.ends_with(&head) {
            inside = true;
        } else if inside {
            if l.trim().is_empty() {
                break;
            }
            if let Some((_, insn)) = l.split_once(":\t") {
                out.push(insn.trim().to_string());
            }
        }
    }
    ctx.check(!out.is_empty(), || {
        format!("objdump shows no function {func} in {}", exe.display())
    });
    out
}

/// The compiler did build what the exits test relies on: several `ret`s in
/// `multi_ret`, a `jmp` (no `call`) from `tail_caller` to `tail_callee`,
/// real (non-loop) recursion in `deep` and `deeper`.
fn check_exits_codegen(ctx: &Ctx, exe: &Path) {
    let rets = |f: &str| {
        disassembly(ctx, exe, f)
            .iter()
            .filter(|i| i.starts_with("ret"))
            .count()
    };
    let n = rets("multi_ret");
    ctx.check(n >= 2, || {
        format!("multi_ret has {n} ret instruction(s), the test needs several")
    });
    let tail = disassembly(ctx, exe, "tail_caller");
    ctx.check(
        tail.iter()
            .any(|i| i.starts_with("jmp") && i.ends_with("<tail_callee>"))
            && !tail.iter().any(|i| i.starts_with("call")),
        || format!("tail_caller does not tail-call tail_callee with a jmp: {tail:#?}"),
    );
    for f in ["deep", "deeper"] {
        let d = disassembly(ctx, exe, f);
        ctx.check(
            d.iter()
                .any(|i| i.starts_with("call") && i.ends_with(&format!("<{f}>"))),
            || format!("{f} does not call itself (turned into a loop?): {d:#?}"),
        );
    }
}

#[derive(Deserialize, Debug)]
struct ExitsWorker {
    worker: u64,
    multi_ret: u64,
    tail_caller: u64,
    tail_callee: u64,
    deep: u64,
    deeper: u64,
    jump_host: u64,
    jump_mid: u64,
    jumper: u64,
    ok: bool,
}

impl ExitsWorker {
    fn calls(&self) -> [(&'static str, u64); 8] {
        [
            ("multi_ret", self.multi_ret),
            ("tail_caller", self.tail_caller),
            ("tail_callee", self.tail_callee),
            ("deep", self.deep),
            ("deeper", self.deeper),
            ("jump_host", self.jump_host),
            ("jump_mid", self.jump_mid),
            ("jumper", self.jumper),
        ]
    }
}

#[derive(Deserialize, Debug)]
struct ExitsExiter {
    exiter: u64,
    exit_via: u64,
    exiter_calls: u64,
    ok: bool,
}

#[derive(Deserialize, Debug)]
struct ExitsBacktrace {
    bt: Vec<String>,
    bt_outer: u64,
    bt_inner: u64,
    ok: bool,
}

/// Parses the JSON lines of `text` that start with `prefix`.
#[track_caller]
fn json_lines<T: for<'de> Deserialize<'de>>(ctx: &Ctx, text: &str, prefix: &str) -> Vec<T> {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| ctx.fail(format!("bad target line {l:?}: {e}")))
        })
        .collect()
}

/// Every way out of a C function, under `weft run -m calls,wall`:
///
/// * same stdout (results, checksums, own call counts, the backtrace's
///   names) and exit code as without weft;
/// * calls exact per thread and function;
/// * every exited thread: calls = exits + unwound + unhooked;
/// * several `ret`s (`multi_ret`), a tail call (`tail_caller` → `jmp`
///   `tail_callee`: both exit), 1000-deep recursion (`deep`): exits = calls;
/// * 1100-deep recursion (`deeper`): 1024 activations hooked and exited per
///   round, the 76 deeper ones unhooked, the program unharmed;
/// * `longjmp` from `jumper` (directly, or through `jump_mid`) back to
///   `jump_host`: `jumper` and `jump_mid` unwound, `jump_host` exits;
/// * `pthread_exit` in `exiter` (called through `exit_via`): both unwound,
///   once per thread;
/// * `backtrace()` in `bt_inner` through instrumented `bt_inner` and
///   `bt_outer` frames names `bt_inner`, `bt_outer`, `main`.
#[test]
fn run_every_way_out_of_a_c_function() {
    let test = "run_every_way_out_of_a_c_function";
    let ctx = Ctx::new(test);
    let exe = exits();
    check_exits_codegen(&ctx, exe);

    let plain = run_plain(&ctx, exe, &[]);
    let (under, report) = run_weft(&ctx, test, "calls,wall", &EXITS_FUNCS, exe, &[]);
    check_same_behaviour(&ctx, &plain, &under);
    check_metrics(&ctx, &report, &["calls", "wall"]);
    check_metric_fields(&ctx, &report, true, false);

    let out = &under.stdout;
    ctx.check(out.ends_with("done\n"), || "no `done` line".into());
    let workers: Vec<ExitsWorker> = json_lines(&ctx, out, "{\"worker\"");
    let exiters: Vec<ExitsExiter> = json_lines(&ctx, out, "{\"exiter\"");
    let bts: Vec<ExitsBacktrace> = json_lines(&ctx, out, "{\"bt\"");
    ctx.check(
        workers.len() as u64 == WORKERS && exiters.len() as u64 == EXITERS && bts.len() == 1,
        || "the target printed unexpected lines".into(),
    );
    for (i, w) in workers.iter().enumerate() {
        ctx.check(w.ok && w.worker == i as u64, || {
            format!("worker line {w:?}")
        });
        ctx.check(
            w.deep == DEEP * ROUNDS && w.deeper == DEEPER * ROUNDS && w.jumper == ROUNDS,
            || format!("worker line {w:?}: unexpected counts"),
        );
    }
    for (i, x) in exiters.iter().enumerate() {
        ctx.check(
            x.ok && x.exiter == i as u64 && x.exit_via == 1 && x.exiter_calls == 1,
            || format!("exiter line {x:?}"),
        );
    }
    let bt = &bts[0];
    ctx.check(
        bt.ok && bt.bt_outer == BT_ROUNDS && bt.bt_inner == BT_ROUNDS,
        || format!("backtrace line {bt:?}"),
    );
    ctx.check(
        bt.bt
            .windows(3)
            .any(|w| w == ["bt_inner", "bt_outer", "main"]),
        || {
            format!(
                "the backtrace through instrumented frames lacks bt_inner, bt_outer, main: {:?}",
                bt.bt
            )
        },
    );

    // Thread ids, from the target's stderr under weft.
    let main_tid = tids(&ctx, &under.stderr, "main", 1)[0].0;
    let worker_tids = tids(&ctx, &under.stderr, "worker", WORKERS);
    let exiter_tids = tids(&ctx, &under.stderr, "exiter", EXITERS);

    // Exact calls per thread.
    let exe_name = exe.file_name().unwrap().to_string_lossy().into_owned();
    let mut exp: BTreeMap<i64, ExpThread> = BTreeMap::new();
    for (w, (tid, _)) in workers.iter().zip(&worker_tids) {
        exp.insert(
            *tid,
            ExpThread {
                name: format!("worker-{}", w.worker),
                calls: w.calls().iter().map(|(f, n)| (f.to_string(), *n)).collect(),
            },
        );
    }
    for (x, (tid, _)) in exiters.iter().zip(&exiter_tids) {
        exp.insert(
            *tid,
            ExpThread {
                name: format!("exiter-{}", x.exiter),
                calls: [("exit_via".to_string(), 1), ("exiter".to_string(), 1)].into(),
            },
        );
    }
    exp.insert(
        main_tid,
        ExpThread {
            name: exe_name.clone(),
            calls: [
                ("bt_outer".to_string(), bt.bt_outer),
                ("bt_inner".to_string(), bt.bt_inner),
            ]
            .into(),
        },
    );
    check_report_counts(&ctx, &report, &exp, &EXITS_FUNCS);
    let modules: Vec<(&str, &str)> = EXITS_FUNCS
        .iter()
        .map(|f| (*f, exe_name.as_str()))
        .collect();
    check_report_modules(&ctx, &report, &modules);

    // Exit accounting.
    for (w, (tid, _)) in workers.iter().zip(&worker_tids) {
        let t = report.thread(*tid).unwrap();
        ctx.check(t.exited, || {
            format!("worker tid {tid} was joined, not marked exited")
        });
        for f in [
            "multi_ret",
            "tail_caller",
            "tail_callee",
            "deep",
            "jump_host",
        ] {
            let n = report.counts(*tid, f).calls;
            check_accounting(
                &ctx,
                &report,
                *tid,
                f,
                (n, 0, 0),
                "every activation returned",
            );
        }
        check_accounting(
            &ctx,
            &report,
            *tid,
            "jumper",
            (0, w.jumper, 0),
            "every activation left by longjmp",
        );
        check_accounting(
            &ctx,
            &report,
            *tid,
            "jump_mid",
            (0, w.jump_mid, 0),
            "every activation skipped by a longjmp from jumper",
        );
        check_accounting(
            &ctx,
            &report,
            *tid,
            "deeper",
            (ROUNDS * CAPACITY, 0, ROUNDS * (DEEPER - CAPACITY)),
            "per round, the first 1024 activations hooked and returned, the 76 deeper ones not \
             hooked",
        );
    }
    for (tid, _) in &exiter_tids {
        let t = report.thread(*tid).unwrap();
        ctx.check(t.exited, || {
            format!("exiter tid {tid} ended, not marked exited")
        });
        for f in ["exit_via", "exiter"] {
            check_accounting(&ctx, &report, *tid, f, (0, 1, 0), "left by pthread_exit");
        }
    }
    for f in ["bt_outer", "bt_inner"] {
        let n = report.counts(main_tid, f).calls;
        check_accounting(
            &ctx,
            &report,
            main_tid,
            f,
            (n, 0, 0),
            "every activation returned",
        );
    }
    check_exit_balance(&ctx, &report);
    check_timer_totals(&ctx, &report);
}

#[derive(Deserialize, Debug)]
struct ExceptionsWorker {
    worker: u64,
    rounds: u64,
    thrower: u64,
    middle: u64,
    throws: u64,
    catches: u64,
    dtors: u64,
    ok: bool,
}

impl ExceptionsWorker {
    /// The worker's own counts of the functions, as the report's should be.
    fn expected(&self) -> ExpThread {
        ExpThread {
            name: format!("worker-{}", self.worker),
            calls: [
                ("thrower".to_string(), self.thrower),
                ("middle".to_string(), self.middle),
            ]
            .into(),
        }
    }
}

/// C++ exceptions thrown by `thrower` through `middle` (which runs a
/// destructor on the way) to a catch in `outer`, every other round, under
/// `weft run -m calls,wall -f thrower,middle`: same stdout and exit code as
/// without weft; calls exact; per thread, the throwing activations of both
/// functions unwound and the others exited (calls = exits + unwound +
/// unhooked); wall times within the loop's own CLOCK_MONOTONIC time.
#[test]
fn run_cxx_exceptions_through_instrumented_frames() {
    let test = "run_cxx_exceptions_through_instrumented_frames";
    let ctx = Ctx::new(test);
    let exe = exceptions();
    let rounds: u64 = 1000;
    let r = rounds.to_string();
    let plain = run_plain(&ctx, exe, &[&r]);
    let (under, report) = run_weft(&ctx, test, "calls,wall", &EXCEPTION_FUNCS, exe, &[&r]);
    check_same_behaviour(&ctx, &plain, &under);
    check_metrics(&ctx, &report, &["calls", "wall"]);
    check_metric_fields(&ctx, &report, true, false);

    let workers: Vec<ExceptionsWorker> = json_lines(&ctx, &under.stdout, "{\"worker\"");
    ctx.check(workers.len() == 2, || {
        format!("{} worker lines, expected 2", workers.len())
    });
    let wtids = tids(&ctx, &under.stderr, "worker", 2);
    let mut exp = BTreeMap::new();
    for (w, (tid, _)) in workers.iter().zip(&wtids) {
        ctx.check(
            w.ok && w.rounds == rounds
                && w.throws == rounds / 2
                && w.catches == w.throws
                && w.dtors == rounds,
            || format!("worker line {w:?}"),
        );
        exp.insert(*tid, w.expected());
    }
    check_report_counts(&ctx, &report, &exp, &EXCEPTION_FUNCS);

    for (w, (tid, kv)) in workers.iter().zip(&wtids) {
        let t = report.thread(*tid).unwrap();
        ctx.check(t.exited, || {
            format!("worker tid {tid} was joined, not marked exited")
        });
        for f in EXCEPTION_FUNCS {
            check_accounting(
                &ctx,
                &report,
                *tid,
                f,
                (w.rounds - w.throws, w.throws, 0),
                "the throwing rounds unwound, the others returned",
            );
        }
        let loop_ns: u64 = kv
            .get("loop_wall_ns")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| ctx.fail(format!("no loop_wall_ns in {kv:?}")));
        let middle = report.counts(*tid, "middle").wall_ns.unwrap_or(0);
        let thrower = report.counts(*tid, "thrower").wall_ns.unwrap_or(0);
        // Every activation starts and (the last round returns normally, so
        // the unwound ones are closed by the next entry at the latest) ends
        // inside the loop.
        let slack = loop_ns / 50 + 200_000;
        ctx.check(middle > 0 && middle <= loop_ns + slack, || {
            format!(
                "tid {tid}: middle's wall_ns {middle} is not within the loop's own {loop_ns} ns \
                 (+{slack}); clocks: {:?}",
                report.clocks
            )
        });
        // The unwind closes the activations as it passes their call records
        // (the records' personality routine), not at the next call: the 200 us
        // the thread idles after each catch is not in middle's time.
        let own: u64 = kv
            .get("middle_wall_ns")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| ctx.fail(format!("no middle_wall_ns in {kv:?}")));
        // The thread's own bracket starts before each call and ends after
        // the return or at the handler, so weft's time lies inside it
        // whatever the scheduler does; only the clocks' rates differ. The
        // lower bound is loose: a preemption inside the bracket but outside
        // middle (the rest of the unwind, the clock reads) inflates `own`
        // alone, and on a loaded machine such preemptions add up.
        let idle = w.throws * 200_000;
        ctx.check(
            middle <= own + own / 33 + 100_000 && middle >= own / 10,
            || {
                format!(
                    "tid {tid}: middle's wall_ns {middle} vs the thread's own {own} ns around \
                 middle (at most +3% +100 us, at least a tenth); {idle} ns of idling after \
                 catches must not be in it"
                )
            },
        );
        // thrower's activations lie inside middle's.
        ctx.check(thrower > 0 && thrower <= middle + 10_000, || {
            format!("tid {tid}: thrower's wall_ns {thrower} exceeds middle's {middle}")
        });
    }
    check_exit_balance(&ctx, &report);
    check_timer_totals(&ctx, &report);
}

/// gdb backtraces through timed frames: a thread blocked in `inner`, called
/// by `outer`, both with their exits hooked by `weft attach`. gdb (attached
/// while weft is live but detached) must show inner, the call record it
/// was called through (`weft_rt_call_records`, whose unwind information is
/// in the runtime library gdb reads), outer, main — not `?? ()` frames
/// that lose the callers. The target then ends
/// normally and weft's report counts both exits.
#[test]
fn gdb_backtrace_through_timed_frames() {
    let ctx = Ctx::new("gdb_backtrace_through_timed_frames");
    if Command::new("gdb").arg("--version").output().is_err() {
        ctx.fail(
            "gdb is not installed: this test needs it (apt-get install gdb; scripts/test does)",
        );
    }
    let exe = gdbwait();
    let mut t = ctx.target(exe, &[]);
    let (pid, _) = wait_ready(&mut t);
    let (mut weft, _) = attach(
        &ctx,
        pid,
        &["-f", "inner,outer", "-m", "calls,wall", "--format", "json"],
        2,
    );
    t.send("go");
    t.expect_stdout("`inside`", |l| l == "inside");
    let mut gdb = Command::new("gdb");
    gdb.args(["-nx", "-batch", "-ex", "bt", "-p", &pid.to_string()]);
    let mut gdb = ctx.spawn("gdb", gdb, false);
    gdb.wait_code(0);
    let out = gdb.stdout_text();
    let frames: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with('#'))
        .filter_map(|l| {
            ["inner", "weft_rt_call_records", "outer", "main", "??"]
                .into_iter()
                .find(|f| l.contains(&format!(" {f} (")) || l.contains(&format!(" in {f} (")))
        })
        .collect();
    let expected = [
        "inner",
        "weft_rt_call_records",
        "outer",
        "weft_rt_call_records",
        "main",
    ];
    ctx.check(frames.windows(5).any(|w| w == expected), || {
        format!(
            "gdb's backtrace does not go inner -> call record -> outer -> call record -> main: {frames:?}\n{out}"
        )
    });
    ctx.check(!frames.contains(&"??"), || {
        format!("gdb's backtrace has unknown frames: {frames:?}\n{out}")
    });
    t.send("end");
    t.expect_stdout("`done`", |l| l.starts_with("done"));
    t.wait_code(0);
    weft.wait_code(0);
    let report = parse_report(&ctx, &weft.stdout_text());
    for f in ["inner", "outer"] {
        let c = report.counts(pid as i64, f);
        ctx.check(c.calls == 1 && c.exits == Some(1), || {
            format!("{f}: {c:?}, one call that returned expected")
        });
    }
}

/// Two tools time the same functions while C++ exceptions go through them:
/// `weft run` times `thrower` and `middle` for the whole run; a second weft
/// attaches for a while with other metrics (its probes chained over the
/// first's, two activations per frame). The program behaves as without
/// weft; the first tool's accounting is exact (every throwing round
/// unwound, the others returned); the second saw both ways out in turn.
#[test]
fn two_tools_time_through_cxx_exceptions() {
    let test = "two_tools_time_through_cxx_exceptions";
    let ctx = Ctx::new(test);
    let exe = exceptions();
    let rounds: u64 = 4000;
    let r = rounds.to_string();
    let plain = run_plain(&ctx, exe, &[&r]);
    let (first, file) = start_weft(&ctx, test, "calls,wall", &EXCEPTION_FUNCS, exe, &[&r]);
    let funcs = EXCEPTION_FUNCS.join(",");
    // The program weft run started: its child.
    let children = format!("/proc/{0}/task/{0}/children", first.pid_str());
    let started = std::time::Instant::now();
    let pid = loop {
        let text = std::fs::read_to_string(&children).unwrap_or_default();
        if let Some(pid) = text.split_whitespace().next() {
            break pid.to_string();
        }
        ctx.check(
            started.elapsed() < std::time::Duration::from_secs(20),
            || "weft run started no program".into(),
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    std::thread::sleep(std::time::Duration::from_millis(100));
    let mut second = ctx.weft(&[
        "attach",
        "-p",
        &pid,
        "-m",
        "calls,wall,cpu",
        "-f",
        &funcs,
        "--format",
        "json",
        "--duration",
        "0.3",
    ]);
    second.wait_code(0);
    let second_report = parse_report(&ctx, &second.stdout_text());
    let (under, report) = finish_weft(&ctx, first, &file);
    check_same_behaviour(&ctx, &plain, &under);
    let workers: Vec<ExceptionsWorker> = json_lines(&ctx, &under.stdout, "{\"worker\"");
    let wtids = tids(&ctx, &under.stderr, "worker", 2);
    let mut exp = BTreeMap::new();
    for (w, (tid, _)) in workers.iter().zip(&wtids) {
        exp.insert(*tid, w.expected());
        for f in EXCEPTION_FUNCS {
            check_accounting(
                &ctx,
                &report,
                *tid,
                f,
                (w.rounds - w.throws, w.throws, 0),
                "the throwing rounds unwound, the others returned",
            );
        }
    }
    check_report_counts(&ctx, &report, &exp, &EXCEPTION_FUNCS);
    // The second tool: rounds alternate, so what it saw leave by a return
    // and by unwinding differ by at most the rounds at its window's ends.
    let mut unwound = 0;
    for (tid, _) in &wtids {
        for f in EXCEPTION_FUNCS {
            let c = second_report.counts(*tid, f);
            let (e, u, h) = (
                c.exits.unwrap_or(0),
                c.unwound.unwrap_or(0),
                c.unhooked.unwrap_or(0),
            );
            ctx.check(
                h == 0 && e + u <= c.calls && c.calls <= e + u + 1 && e.abs_diff(u) <= 2,
                || {
                    format!(
                        "second tool, tid {tid} {f}: {c:?}: every call returned or unwound in turn"
                    )
                },
            );
            ctx.check(c.calls == 0 || c.wall_ns.unwrap_or(0) > 0, || {
                format!("second tool, tid {tid} {f}: calls but no wall time: {c:?}")
            });
            unwound += u;
        }
    }
    ctx.check(unwound > 0, || {
        format!("the second tool saw no exception: {second_report:#?}")
    });
}
