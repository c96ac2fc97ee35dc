//! Code entered by a jump, not a call (issue #12 item 3): GCC's `.cold`
//! parts, by name and as `fun_<addr>` FDE fragments of a stripped binary.
//! Timing one used to hook an "exit" it does not have: the hook replaced a
//! slot of its parent's frame and the callee-saved register it uses, and
//! both threads of the target looped forever, even after weft detached.
//! Such code is now refused for timing with the reason (nothing is
//! changed, as for any refusal); counting it still works, exactly.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use support::*;
use weft_codegen::BranchKind;

/// Calls of `work` per thread; each covers SPAN values, one in RARE takes
/// the cold path (tests/targets/cold.c).
const CALLS: u64 = 200_000;
const SPAN: u64 = 4;
const RARE: u64 = 1000;
const THREADS: usize = 2;
/// Long enough for the target (tens of ms), short enough that a hung
/// target fails the test quickly.
const RUN_LIMIT: Duration = Duration::from_secs(20);

struct Built {
    named: PathBuf,
    stripped: PathBuf,
    /// File addresses of `work` and `work.cold` (from the named build).
    work: u64,
    cold: u64,
}

fn built() -> &'static Built {
    static B: OnceLock<Built> = OnceLock::new();
    B.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("weft-targets-cold_parts");
        std::fs::create_dir_all(&dir).unwrap();
        let named = dir.join("cold");
        let stripped = dir.join("cold-stripped");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/targets/cold.c");
        let ok = Command::new("gcc")
            .args(["-O2", "-pthread", "-o"])
            .arg(&named)
            .arg(&src)
            .status()
            .expect("run gcc");
        assert!(ok.success(), "gcc failed on {}", src.display());
        let symbols = strip_copy(&named, &stripped);
        let address = |name: &str| {
            symbol_address(&symbols, name).unwrap_or_else(|| {
                panic!("gcc emitted no `{name}` in {}:\n{symbols}", named.display())
            })
        };
        Built {
            work: address("work"),
            cold: address("work.cold"),
            named,
            stripped,
        }
    })
}

/// The target's output without weft, sorted (threads finish in any order).
fn plain_output() -> &'static Vec<String> {
    static P: OnceLock<Vec<String>> = OnceLock::new();
    P.get_or_init(|| {
        let out = Command::new(&built().named)
            .args([&CALLS.to_string(), "now"])
            .output()
            .expect("run the cold target");
        assert!(out.status.success());
        sorted_lines(&String::from_utf8_lossy(&out.stdout))
    })
}

fn sorted_lines(text: &str) -> Vec<String> {
    let mut v: Vec<String> = text.lines().map(str::to_string).collect();
    v.sort();
    v
}

/// Waits for `p` to exit within RUN_LIMIT; a target still running then
/// is hung (killed by PID when `p` drops).
fn exits_in_time(ctx: &Ctx, p: &mut Proc, what: &str) {
    let deadline = Instant::now() + RUN_LIMIT;
    while p.is_running() {
        if Instant::now() > deadline {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", p.pid)).unwrap_or_default();
            ctx.fail(format!(
                "{what} still runs after {RUN_LIMIT:?} (hung? /proc/PID/stat: {stat})"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    p.wait_exit();
}

/// Starts the target (it waits for a line on stdin before its threads run).
fn start(ctx: &Ctx, exe: &Path) -> Proc {
    let mut t = ctx.target(exe, &[&CALLS.to_string()]);
    t.expect_stdout("the `ready` line", |l| l == "ready");
    t
}

/// Lets the target's threads run; it must finish in time with the output
/// it has without weft.
fn go_and_check_output(ctx: &Ctx, t: &mut Proc) {
    t.send("go");
    exits_in_time(ctx, t, "the target");
    let got = sorted_lines(&t.stdout_text());
    ctx.check(&got == plain_output(), || {
        format!(
            "the target's output changed under weft:\n{got:#?}\nwithout weft:\n{:#?}",
            plain_output()
        )
    });
}

/// The refusal names the fragment, says it is jumped into from its parent
/// and can be counted but not timed.
fn check_refusal(ctx: &Ctx, error: &str, cold: &str, parent: &str) {
    for want in [
        format!("`{cold}`"),
        format!("entered by a jump from {parent}+0x"),
        "not called".to_string(),
        "it can be counted but not timed".to_string(),
        // The library's words, and the command line's flag for them.
        "(`-m calls` counts what cannot be timed)".to_string(),
        "nothing was changed".to_string(),
    ] {
        ctx.check(error.contains(&want), || {
            format!("the error {error:?} does not say {want:?}")
        });
    }
}

/// Each worker thread's row counts `work` CALLS times and the cold part
/// CALLS * SPAN / RARE times, exactly.
fn check_counts(ctx: &Ctx, report: &Report, work: &str, cold: &str) {
    let rows: Vec<&ReportThread> = report
        .threads
        .iter()
        .filter(|t| t.functions.get(work).is_some_and(|c| c.calls > 0))
        .collect();
    ctx.check(rows.len() == THREADS, || {
        format!("{} threads called {work}, expected {THREADS}", rows.len())
    });
    for row in rows {
        let calls = |f: &str| row.functions.get(f).map_or(0, |c| c.calls);
        ctx.check(calls(work) == CALLS, || {
            format!(
                "thread {} called {work} {} times, expected {CALLS}",
                row.tid,
                calls(work)
            )
        });
        let rare = CALLS * SPAN / RARE;
        ctx.check(calls(cold) == rare, || {
            format!(
                "thread {} entered {cold} {} times, expected {rare}",
                row.tid,
                calls(cold)
            )
        });
    }
}

/// `weft attach --strict -f PATTERNS` with the default metrics (timers) is
/// refused with the reason and changes nothing; with `-m calls` it counts
/// exactly.
/// Returns the error line.
fn attach_refused_then_counted(
    ctx: &Ctx,
    exe: &Path,
    patterns: &str,
    functions: u32,
    (cold, parent): (&str, &str),
) -> String {
    let mut t = start(ctx, exe);
    let pid = t.pid_str();
    // A --duration so that an attach that wrongly succeeds ends by itself;
    // --strict, since a glob otherwise instruments what it can (tests/globs).
    let mut weft = ctx.weft(&[
        "attach",
        "-p",
        &pid,
        "-f",
        patterns,
        "--strict",
        "--duration",
        "3",
    ]);
    let (error, _) = expect_weft_error(&mut weft);
    check_refusal(ctx, &error, cold, parent);
    go_and_check_output(ctx, &mut t);

    let mut t = start(ctx, exe);
    let (mut weft, _) = attach(
        ctx,
        t.pid,
        &["-f", patterns, "-m", "calls", "--format", "json"],
        functions,
    );
    go_and_check_output(ctx, &mut t);
    weft.wait_code(0);
    let report = parse_report(ctx, &weft.stdout_text());
    check_counts(ctx, &report, parent, cold);
    error
}

#[test]
fn attach_to_a_named_cold_part() {
    let ctx = Ctx::new("attach_to_a_named_cold_part");
    // `work*` matches work and worker; a glob leaves out the cold part
    // (a piece of `work`, not a function), so it is named.
    attach_refused_then_counted(
        &ctx,
        &built().named,
        "work*,work.cold",
        3,
        ("work.cold", "work"),
    );
}

#[test]
fn attach_to_a_stripped_cold_part() {
    let ctx = Ctx::new("attach_to_a_stripped_cold_part");
    let b = built();
    let (work, cold) = (format!("fun_{:x}", b.work), format!("fun_{:x}", b.cold));
    let patterns = format!("{work},{cold}");
    let error = attach_refused_then_counted(&ctx, &b.stripped, &patterns, 2, (&cold, &work));
    // No name to go by: the FDE says the fragment starts inside a frame.
    ctx.check(error.contains("unwind information"), || {
        format!("the error {error:?} does not say how the fragment was recognised")
    });
}

/// The function the cold part belongs to is timed correctly: its exit
/// hook sees every return, its cold part jumping out and back included.
#[test]
fn timing_the_parent_of_a_cold_part() {
    let ctx = Ctx::new("timing_the_parent_of_a_cold_part");
    let mut t = start(&ctx, &built().named);
    let (mut weft, _) = attach(&ctx, t.pid, &["-f", "work", "--format", "json"], 1);
    go_and_check_output(&ctx, &mut t);
    weft.wait_code(0);
    let report = parse_report(&ctx, &weft.stdout_text());
    let rows: Vec<&ReportThread> = report
        .threads
        .iter()
        .filter(|r| r.functions.get("work").is_some_and(|c| c.calls > 0))
        .collect();
    ctx.check(rows.len() == THREADS, || {
        format!("{} threads called work", rows.len())
    });
    for row in rows {
        let c = &row.functions["work"];
        ctx.check(c.calls == CALLS && c.exits == Some(CALLS), || {
            format!(
                "thread {}: work {c:?}, expected {CALLS} calls and exits",
                row.tid
            )
        });
        ctx.check(c.wall_ns.is_some_and(|w| w > 0), || {
            format!("work not timed: {c:?}")
        });
    }
}

/// Kills (by PID) the children of a `weft run` this test started when
/// dropped: a program that hung under weft would otherwise be left
/// spinning once weft is killed. Declared after the weft it watches, so it
/// drops first, while they are still weft's children.
struct KillChildren(u32);

impl Drop for KillChildren {
    fn drop(&mut self) {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", self.0)) else {
            return;
        };
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for pid in children
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
            {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

/// `weft run --strict`: refused before main (the program never runs), counted
/// exactly with -m calls, the program's output unchanged.
#[test]
fn run_with_a_cold_part() {
    let ctx = Ctx::new("run_with_a_cold_part");
    let exe = built().named.to_str().unwrap();
    let calls = CALLS.to_string();
    let mut weft = ctx.weft(&[
        "run",
        "--strict",
        "-f",
        "work*,work.cold",
        "--",
        exe,
        &calls,
        "now",
    ]);
    let _guard = KillChildren(weft.pid);
    exits_in_time(&ctx, &mut weft, "weft run");
    let (error, _) = expect_weft_error(&mut weft);
    check_refusal(&ctx, &error, "work.cold", "work");
    ctx.check(weft.stdout_text().is_empty(), || {
        "the refused program ran (it printed on stdout)".into()
    });

    let file = scratch_dir("run_with_a_cold_part").join("report.json");
    let file_s = file.to_str().unwrap();
    let mut weft = ctx.weft(&[
        "run",
        "-m",
        "calls",
        "-f",
        "work*,work.cold",
        "--format",
        "json",
        "-o",
        file_s,
        "--",
        exe,
        &calls,
        "now",
    ]);
    let _guard = KillChildren(weft.pid);
    exits_in_time(&ctx, &mut weft, "weft run");
    let got = sorted_lines(&weft.stdout_text());
    ctx.check(&got == plain_output(), || {
        format!(
            "output under weft run:\n{got:#?}\nwithout:\n{:#?}",
            plain_output()
        )
    });
    let report = parse_report(&ctx, &std::fs::read_to_string(&file).unwrap());
    check_counts(&ctx, &report, "work", "work.cold");
}

/// The branch index knows how each branch reaches its target: work enters
/// its cold part by a conditional jump, the cold part calls rare_path.
#[test]
fn branch_index_tells_jumps_from_calls() {
    let ctx = Ctx::new("branch_index_tells_jumps_from_calls");
    let b = built();
    let t = start(&ctx, &b.named);
    let image = weft::inspect::ProcessImage::open(t.pid as i32)
        .unwrap_or_else(|e| ctx.fail(format!("open: {e}")));
    let exe = image
        .executable()
        .unwrap_or_else(|| ctx.fail("no executable module"));
    let index = weft::internals::BranchIndex::build(exe)
        .unwrap_or_else(|e| ctx.fail(format!("index: {e}")));
    let (work, cold) = (exe.runtime_address(b.work), exe.runtime_address(b.cold));
    let into_cold: Vec<_> = index.to(cold).iter().map(|b| (b.source, b.kind)).collect();
    ctx.check(
        into_cold
            .iter()
            .any(|&(s, k)| k == BranchKind::Conditional && s > work && s < work + 0x100),
        || format!("no jcc from work ({work:#x}) to work.cold ({cold:#x}): {into_cold:#x?}"),
    );
    ctx.check(
        into_cold.iter().all(|&(_, k)| k != BranchKind::Call),
        || format!("work.cold is called? {into_cold:#x?}"),
    );
    let jump = index.jump_to_entry(cold, cold + 1);
    ctx.check(jump.is_some_and(|j| j.kind.is_jump()), || {
        format!("{jump:?}")
    });
    // worker calls work: a call, so no jump to work's entry.
    let into_work: Vec<_> = index.to(work).iter().map(|b| b.kind).collect();
    ctx.check(
        into_work.contains(&BranchKind::Call) && index.jump_to_entry(work, work + 1).is_none(),
        || format!("branches to work: {into_work:?}"),
    );
}
