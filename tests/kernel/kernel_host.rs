//! Kernel probes on this machine's own kernel: system calls through the
//! `raw_syscalls` tracepoints and CPU time from `sched_switch`, per thread,
//! split by the instrumented user function each thread was in; the
//! capability line; the refusal without privileges; nothing left loaded
//! after weft detaches or dies.
//!
//! (kprobes and fentry/fexit need a kernel that allows them: see
//! kernel_guest.rs, which boots Debian's stock kernel under QEMU.)

use crate::support;

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use support::kernel_calls::*;
use support::*;

// One test at a time (support::one_at_a_time, the binary's turn): the
// timing comparisons need the two CPUs.

/// A test that needs root (BPF), alone on the machine; `None` (skipped,
/// said on stderr) when not root.
fn as_root(test: &str) -> Option<(Ctx, std::sync::MutexGuard<'static, ()>)> {
    if !running_as_root() {
        eprintln!("skipped: kernel probes need root");
        return None;
    }
    Some((Ctx::new(test), one_at_a_time()))
}

#[test]
fn syscalls_per_thread_split_by_user_function() {
    let Some((ctx, _alone)) = as_root("syscalls_per_thread_split_by_user_function") else {
        return;
    };
    let exe = kernel_calls();
    let data = data_file("syscalls_per_thread");
    let data = data.to_str().unwrap();
    // Real-time workers: nothing else on the machine preempts them while
    // they time their calls (see kernel_calls.c).
    let mut c = Command::new(weft_bin());
    c.env("KERNEL_CALLS_FIFO", "1");
    c.args([
        "run",
        "-f",
        "open_config,read_cache,rewrite_file,wait_pipe",
        "-m",
        "wall",
        "-f",
        "syscall:openat,syscall:read,syscall:close,syscall:write",
        "--format",
        "json",
        "--",
        exe.to_str().unwrap(),
        "2",
        "40",
        data,
    ]);
    let steal_before = steal_ticks();
    let mut w = ctx.spawn("weft run (FIFO workers)", c, false);
    w.wait_code(0);
    let steal = machine_steal_share(steal_before, steal_ticks());
    if steal > STEAL_QUIET {
        eprintln!(
            "the hypervisor stole {:.1}% of the machine: CPU times checked against wall time only",
            100.0 * steal
        );
    }
    let out = w.stdout_text();
    let report = json_report(&ctx, &out);
    let truth = truth(&out);
    ctx.check(truth.len() == 2 * 10, || {
        format!("2 threads × 10 (function, call) lines expected: {truth:?}")
    });
    let err = w.stderr_text();
    let caps = err
        .lines()
        .find(|l| l.starts_with("weft: kernel probes:"))
        .unwrap_or_else(|| ctx.fail("no capability line on stderr"));
    for name in ["bpf", "btf", "syscall tracepoints", "sched_switch"] {
        ctx.check(caps.contains(&format!("{name} yes")), || {
            format!("`{name} yes` expected in {caps:?}")
        });
    }
    let preempted = preempted(&out);
    let run = Observed {
        report: &report,
        truth: &truth,
        preempted: &preempted,
        long_call_ns: LONG_CALL_NS,
        cpu_tolerance: 0.05,
        pipe_sleeps: true,
        steal,
        host_delay_ns: 0,
    };
    let mut compared = 0;
    for call in ["openat", "read", "close", "write"] {
        compared += check_against_truth(&ctx, &run, &format!("syscall:{call}"), call, true).wall;
    }
    ctx.check(compared >= 4, || {
        format!("only {compared} long calls to compare times on")
    });
    // The mechanism is said.
    let read = report["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "syscall:read")
        .unwrap();
    ctx.check(read["module"] == "syscall", || format!("{read}"));
    ctx.check(read["mechanism"] == "raw_syscalls tracepoints", || {
        format!("{read}")
    });
}

#[test]
fn other_processes_calls_are_not_counted() {
    let Some((ctx, _alone)) = as_root("other_processes_calls_are_not_counted") else {
        return;
    };
    let exe = kernel_calls();
    let data = data_file("other_processes");
    let data = data.to_str().unwrap();
    // Another process making the same calls at the same time.
    let mut other = ctx.target(&exe, &["2", "30", data]);
    let mut w = ctx.weft(&[
        "run",
        "-f",
        "syscall:openat,syscall:read,syscall:close,syscall:write",
        "--format",
        "json",
        "--",
        exe.to_str().unwrap(),
        "2",
        "30",
        data,
    ]);
    w.wait_code(0);
    other.wait_code(0);
    let out = w.stdout_text();
    let report = json_report(&ctx, &out);
    let others = truth_tids(&other.stdout_text());
    let mine = truth(&out);
    for t in report["threads"].as_array().unwrap() {
        let tid = t["tid"].as_u64().unwrap();
        ctx.check(!others.contains(&tid), || {
            format!("thread {tid} of the other process is in the report")
        });
    }
    // Without user functions every call is attributed to none, and each
    // worker's figures are its own.
    for ((tid, _, syscall), _) in mine.iter() {
        let want: u64 = mine
            .iter()
            .filter(|((t, _, s), _)| t == tid && s == syscall)
            .map(|(_, v)| v.0)
            .sum();
        let got = measured(&report, *tid, &format!("syscall:{syscall}"), "(none)").0;
        ctx.check(got == want, || {
            format!("thread {tid} {syscall}: {got} counted, {want} made")
        });
    }
}

/// weft's JSON report among the lines of `out` (the target's come first).
fn json_report(ctx: &Ctx, out: &str) -> Value {
    let line = out
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| ctx.fail("no JSON report"));
    serde_json::from_str(line).unwrap_or_else(|e| ctx.fail(format!("weft's report: {e}")))
}

fn truth_tids(stdout: &str) -> BTreeSet<u64> {
    truth(stdout).keys().map(|k| k.0).collect()
}

#[test]
fn doctor_names_each_capability_and_why_it_is_missing() {
    let ctx = Ctx::new("doctor_names_each_capability");
    let _alone = one_at_a_time();
    let mut w = ctx.weft(&["doctor"]);
    w.wait_code(0);
    let out = w.stdout_text();
    for name in [
        "bpf",
        "btf",
        "syscall tracepoints",
        "sched_switch",
        "fentry/fexit",
        "kprobes",
        "ptrace",
    ] {
        let line = out
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| ctx.fail(format!("`{name}` missing from weft doctor")));
        ctx.check(line.contains(" yes ") || line.contains(" no "), || {
            format!("{line:?}: yes or no")
        });
    }
    // Every "no" is followed by its reason.
    let lines: Vec<&str> = out.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        if !l.starts_with(' ')
            && l.split_whitespace().nth(1) == Some("no")
            && !l.starts_with("ptrace")
        {
            let why = lines.get(i + 1).map_or("", |w| w.trim());
            ctx.check(why.starts_with("no: ") && why.len() > 8, || {
                format!("no reason after {l:?}: {why:?}")
            });
        }
    }
    if !Path::new("/sys/bus/event_source/devices/kprobe").exists() && running_as_root() {
        ctx.check(out.contains("no kprobe PMU"), || {
            format!("kprobes missing here, and doctor should say why: {out}")
        });
    }
}

#[test]
fn unprivileged_kernel_patterns_refuse_the_whole_command() {
    let Some((ctx, _alone)) = as_root("unprivileged_kernel_patterns") else {
        return;
    };
    let data = data_file("unprivileged");
    // The target (run as nobody) writes its scratch files next to it, and
    // runs from there: the build directory's parents may be closed to
    // nobody (a clone in root's 0700 home).
    let exe = {
        use std::os::unix::fs::PermissionsExt;
        let dir = data.parent().unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let copy = dir.join("kernel_calls");
        std::fs::copy(kernel_calls(), &copy).unwrap();
        copy
    };
    let data = data.to_str().unwrap();
    let as_nobody = |args: &[&str]| {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            weft_bin(),
        ]);
        c.args(args);
        c
    };
    let exe_s = exe.to_str().unwrap();
    let mut w = ctx.spawn(
        "weft run (nobody, kernel pattern)",
        as_nobody(&[
            "run",
            "-f",
            "open_config",
            "-f",
            "syscall:read",
            "--",
            exe_s,
            "1",
            "3",
            data,
        ]),
        false,
    );
    let status = w.wait_exit();
    ctx.check(!status.success(), || {
        "a kernel pattern without BPF privileges must fail".into()
    });
    let err = w.stderr_text();
    ctx.check(err.lines().count() == 1 && err.contains("CAP_BPF"), || {
        format!("one line naming CAP_BPF expected: {err:?}")
    });
    ctx.check(!w.stdout_text().contains("T "), || {
        "the program must not have run".into()
    });
    // The same user functions alone work unprivileged.
    let mut w = ctx.spawn(
        "weft run (nobody, user pattern)",
        as_nobody(&[
            "run",
            "-f",
            "open_config",
            "--format",
            "json",
            "--",
            exe_s,
            "1",
            "3",
            data,
        ]),
        false,
    );
    w.wait_code(0);
    let out = w.stdout_text();
    let report = json_report(&ctx, &out);
    let f = &report["functions"][0];
    ctx.check(f["name"] == "open_config" && f["calls"] == 3, || {
        format!("open_config ×3 expected: {f}")
    });
}

fn weft_programs(pid: u32) -> Vec<String> {
    let prefix = format!("weft_{pid}_");
    let mut names: Vec<String> = weft::kernel::loaded_programs()
        .unwrap()
        .into_iter()
        .map(|p| p.name)
        .filter(|n| n.starts_with(&prefix))
        .collect();
    // bpftool, an independent reader, when installed.
    if let Ok(out) = Command::new("bpftool").args(["prog", "show"]).output() {
        let text = String::from_utf8_lossy(&out.stdout);
        names.extend(
            text.split_whitespace()
                .filter(|w| w.starts_with(&prefix))
                .map(|w| format!("bpftool:{w}")),
        );
    }
    names
}

fn wait_for(what: &str, ctx: &Ctx, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        if Instant::now() > deadline {
            ctx.fail(format!("timed out waiting for {what}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn nothing_stays_loaded_after_detach_or_kill() {
    let Some((ctx, _alone)) = as_root("nothing_stays_loaded") else {
        return;
    };
    let exe = kernel_calls();
    let data = data_file("nothing_stays_loaded");
    let mut t = ctx.target(&exe, &["1", "1000000", data.to_str().unwrap()]);
    let pid = t.pid;
    let p = pid.to_string();
    // Detach at --duration.
    let mut w = ctx.weft(&[
        "attach",
        "-p",
        &p,
        "-f",
        "syscall:read,syscall:openat",
        "--duration",
        "2",
    ]);
    wait_for("weft's programs to load", &ctx, || {
        !weft_programs(pid).is_empty()
    });
    w.wait_code(0);
    wait_for("no weft program after detach", &ctx, || {
        weft_programs(pid).is_empty()
    });
    // Killed outright: the kernel closes its descriptors, which detaches
    // and unloads everything.
    let mut w = ctx.weft(&["attach", "-p", &p, "-f", "syscall:read", "-f", "read_cache"]);
    wait_for("weft's programs to load again", &ctx, || {
        !weft_programs(pid).is_empty()
    });
    w.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = w.wait_exit();
    wait_for("no weft program after kill -9", &ctx, || {
        weft_programs(pid).is_empty()
    });
    ctx.check(t.is_running(), || "the target died".into());
}

#[test]
fn bad_kernel_patterns_say_what_to_write() {
    let Some((ctx, _alone)) = as_root("bad_kernel_patterns") else {
        return;
    };
    for (pattern, expect) in [
        ("syscall:opnat", "did you mean"),
        ("kernel:vfs_*+4", "one function by its exact name"),
        ("kernel:vfs_read+zz", "is not an offset"),
        ("syscall:", "nothing after the prefix"),
    ] {
        let mut w = ctx.weft(&["run", "-f", pattern, "--", "true"]);
        let status = w.wait_exit();
        let err = w.stderr_text();
        ctx.check(!status.success() && err.contains(expect), || {
            format!("{pattern}: expected an error with {expect:?}: {err:?}")
        });
    }
}

#[test]
fn live_reports_show_kernel_calls_growing() {
    let Some((ctx, _alone)) = as_root("live_reports_show_kernel_calls_growing") else {
        return;
    };
    let exe = kernel_calls();
    let data = data_file("live_reports");
    let t = ctx.target(&exe, &["1", "1000000", data.to_str().unwrap()]);
    let p = t.pid.to_string();
    let mut w = ctx.weft(&[
        "attach",
        "-p",
        &p,
        "-f",
        "read_cache",
        "-f",
        "syscall:read",
        "--interval",
        "0.4",
        "--duration",
        "2",
        "--format",
        "jsonl",
    ]);
    w.wait_code(0);
    let reads: Vec<u64> = w
        .stdout_text()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|r| {
            r["functions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|f| f["name"] == "syscall:read")
                .and_then(|f| f["by_user_function"]["read_cache"]["calls"].as_u64())
                .unwrap_or(0)
        })
        .collect();
    ctx.check(reads.len() >= 4, || format!("live reports: {reads:?}"));
    ctx.check(
        reads.windows(2).all(|w| w[0] <= w[1]) && reads[0] < reads[reads.len() - 1],
        || format!("read_cache's reads should grow from report to report: {reads:?}"),
    );
}

#[test]
fn list_names_system_calls_and_how_they_are_probed() {
    let ctx = Ctx::new("list_names_system_calls");
    let _alone = one_at_a_time();
    let me = std::process::id().to_string();
    let mut w = ctx.weft(&["list", "-p", &me, "syscall:open*"]);
    w.wait_code(0);
    let out = w.stdout_text();
    for want in [
        "syscall 257 openat ",
        "syscall 437 openat2 ",
        "syscall 2 open ",
    ] {
        ctx.check(out.contains(want), || format!("`{want}` missing: {out}"));
    }
    // A kernel function nothing can probe here says why, in one line.
    if !Path::new("/sys/bus/event_source/devices/kprobe").exists() && running_as_root() {
        let mut w = ctx.weft(&["list", "-p", &me, "kernel:vfs_read"]);
        let status = w.wait_exit();
        let err = w.stderr_text();
        ctx.check(!status.success() && err.contains("kprobes no"), || {
            format!("expected the capability line in the error: {err}")
        });
    }
}

/// The long table's function rows as header → cell, cut at the headers'
/// right edges (numbers are right-aligned; FUNCTION and MODULE left).
fn table_rows(table: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    let mut lines = table.lines().skip_while(|l| !l.starts_with("FUNCTION "));
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let mut edges = Vec::new();
    let mut at = 0;
    for name in header.split_whitespace() {
        let start = at + header[at..].find(name).unwrap();
        at = start + name.len();
        edges.push((name.to_string(), start, at));
    }
    lines
        .take_while(|l| !l.is_empty() && !l.starts_with('…') && !l.starts_with("threads"))
        .map(|l| {
            let chars: Vec<char> = l.chars().collect();
            let cut = |a: usize, b: usize| -> String {
                chars[a.min(chars.len())..b.min(chars.len())]
                    .iter()
                    .collect::<String>()
                    .trim()
                    .to_string()
            };
            edges
                .iter()
                .enumerate()
                .map(|(i, (name, start, end))| {
                    let cell = match i {
                        0 | 1 => cut(*start, edges[i + 1].1),
                        2 => cut(0, *end).rsplit(' ').next().unwrap_or("").to_string(),
                        _ => cut(edges[i - 1].2, *end),
                    };
                    (name.clone(), cell)
                })
                .collect()
        })
        .collect()
}

/// A human duration as the table writes it (`12.3 ms`, `450.0 µs`, `7 ns`).
fn is_duration(cell: &str) -> bool {
    let mut parts = cell.split(' ');
    matches!(
        (
            parts.next().map(str::parse::<f64>),
            parts.next(),
            parts.next()
        ),
        (Some(Ok(_)), Some("ns" | "µs" | "ms" | "s"), None)
    )
}

/// User functions and every system call (`syscall:*`) in one table: each
/// figure stays under its header (a kernel probe has no self time: `-`
/// under SELF and SELF/CALL, its CPU time under CPU, its thread count
/// under THREADS), and the hundreds of system calls nothing made are left
/// out of the table (a line counts them) but kept in the JSON report.
#[test]
fn mixed_user_and_kernel_tables_keep_their_columns() {
    let Some((ctx, _alone)) = as_root("mixed_user_and_kernel_tables_keep_their_columns") else {
        return;
    };
    let exe = kernel_calls();
    let data = data_file("mixed_tables");
    let mut w = ctx.weft(&[
        "run",
        "-f",
        "open_config,read_cache,rewrite_file,wait_pipe",
        "-m",
        "wall,cpu",
        "-f",
        "syscall:*",
        "--top",
        "0",
        "--",
        exe.to_str().unwrap(),
        "2",
        "4",
        data.to_str().unwrap(),
    ]);
    w.wait_code(0);
    let out = w.stdout_text();
    let rows = table_rows(&out);
    let kernel: Vec<_> = rows.iter().filter(|r| r["MODULE"] == "syscall").collect();
    let user: Vec<_> = rows.iter().filter(|r| r["MODULE"] != "syscall").collect();
    ctx.check(user.len() == 4 && kernel.len() >= 4, || {
        format!("4 user rows and the system calls made expected:\n{out}")
    });
    for r in &rows {
        let calls: Option<u64> = r["CALLS"].replace(',', "").parse().ok();
        let kernel_row = r["MODULE"] == "syscall";
        ctx.check(
            calls.is_some_and(|c| c > 0)
                && is_duration(&r["WALL"])
                // (A kernel without `sched_switch` gives kernel rows no CPU time.)
                && (is_duration(&r["CPU"]) || kernel_row && r["CPU"] == "-")
                && is_duration(&r["WALL/CALL"])
                && r["THREADS"].parse::<u32>().is_ok_and(|t| t > 0)
                && if kernel_row {
                    r["SELF"] == "-" && r["SELF/CALL"] == "-"
                } else {
                    is_duration(&r["SELF"]) && is_duration(&r["SELF/CALL"])
                },
            || format!("a row whose figures are not under their headers: {r:?}\n{out}"),
        );
    }
    let hidden = out
        .lines()
        .find_map(|l| {
            l.strip_suffix(" kernel probe(s) with no calls not shown (the JSON report lists them)")
        })
        .and_then(|l| l.strip_prefix("… "))
        .and_then(|n| n.parse::<usize>().ok());
    ctx.check(hidden.is_some_and(|n| n > 100), || {
        format!("no line counting the uncalled system calls left out:\n{out}")
    });
}
