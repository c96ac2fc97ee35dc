//! Processes with as many threads as servers run, each made the way
//! programs make them (`pthread_create(&t, NULL, ...)`: 8 MiB stacks):
//! attached, timed and detached, every thread's calls exact against its
//! own count, the program's output unchanged and its code restored; a
//! target under an address-space limit (`ulimit -v`); and a process that
//! has mapped all the memory around one of its libraries, whose functions
//! are refused with the reason while the others are counted exactly.
//!
//! (Before weft placed its region far from code, a process with more than
//! ~125 such threads could not be attached at all: the 32 GiB region sat
//! next to the runtime between the stacks, and nothing near it was free.)

use crate::support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use support::*;

/// What the target's `leaf` computes (tests/targets/many_threads.c).
fn leaf(x: u64) -> u64 {
    x.wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
}

/// Calls thread `t` makes per round.
fn calls_of(t: u64, unit: u64) -> u64 {
    (t % 5 + 1) * unit
}

/// The target's `sum=` after `rounds` rounds of `threads` threads.
fn expected_sum(threads: u64, unit: u64, rounds: u64) -> u64 {
    (0..threads).fold(0, |sum, t| {
        let x = (0..calls_of(t, unit) * rounds).fold(t, |x, _| leaf(x));
        sum ^ x
    })
}

/// Sends `go` and reads the round's `thread T tid=TID calls=C` lines: the
/// threads' TIDs by index, each checked to have made its calls.
fn round(target: &mut support::Proc, threads: u64, unit: u64, rounds: u64) -> BTreeMap<u64, i64> {
    target.send("go");
    let mut tids = BTreeMap::new();
    loop {
        let line = target.expect_stdout("a thread line or `round done`", |l| {
            l.starts_with("thread ") || l == "round done"
        });
        if line == "round done" {
            break;
        }
        let fields: BTreeMap<&str, &str> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|f| f.split_once('='))
            .collect();
        let t: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        let calls: u64 = fields["calls"].parse().unwrap();
        target.ctx().check(calls == calls_of(t, unit) * rounds, || {
            format!("thread {t} says it made {calls} calls in {rounds} rounds")
        });
        tids.insert(t, fields["tid"].parse().unwrap());
    }
    target.ctx().check(tids.len() as u64 == threads, || {
        format!("{} thread lines, wanted {threads}", tids.len())
    });
    tids
}

/// Starts `many_threads THREADS UNIT` (through `sh -c 'ulimit -v KB; exec
/// ...'` when `limit_kb` is given, as a user limits a program), runs a
/// round uninstrumented, attaches weft with calls, wall and CPU time on
/// `leaf`, runs a second round and detaches; checks every thread's figures
/// against its own count, then that the code is restored and the program's
/// result unchanged after a third round.
fn attach_and_check(test: &str, threads: u64, unit: u64, limit_kb: Option<u64>) {
    let ctx = Ctx::new(test);
    let exe = build_c_target("many_threads", &["-O2", "-g"]);
    let (threads_s, unit_s) = (threads.to_string(), unit.to_string());
    let mut target = match limit_kb {
        None => ctx.target(&exe, &[&threads_s, &unit_s]),
        Some(kb) => {
            let mut c = Command::new("sh");
            c.args(["-c", &format!("ulimit -v {kb} && exec \"$0\" \"$@\"")])
                .arg(&exe)
                .args([&threads_s, &unit_s]);
            ctx.spawn("target under ulimit -v", c, true)
        }
    };
    target.expect_stdout("the ready line", |l| l == format!("ready {threads}"));
    round(&mut target, threads, unit, 1);

    let report_path = scratch_dir(test).join("report.json");
    let (mut weft, attached) = attach(
        &ctx,
        target.pid,
        &[
            "-f",
            "leaf",
            "-m",
            "calls,wall,cpu",
            "--format",
            "json",
            "-o",
            report_path.to_str().unwrap(),
        ],
        1,
    );
    ctx.check(u64::from(attached.threads) == threads + 1, || {
        format!(
            "attached to {} threads, the target has {}",
            attached.threads,
            threads + 1
        )
    });
    let tids = round(&mut target, threads, unit, 2);
    detach_with_sigint(&mut weft);
    let report = parse_report(&ctx, &std::fs::read_to_string(&report_path).unwrap());

    ctx.check(report.overflow_threads == 0, || {
        format!(
            "{} threads shared the overflow row",
            report.overflow_threads
        )
    });
    let mut total = 0;
    for (&t, &tid) in &tids {
        let got = report.counts(tid, "leaf");
        let want = calls_of(t, unit);
        ctx.check(got.calls == want, || {
            format!(
                "thread {t} (tid {tid}): weft counted {} calls, it made {want}",
                got.calls
            )
        });
        ctx.check(got.exits == Some(want), || {
            format!(
                "thread {t} (tid {tid}): {:?} exits of {want} calls",
                got.exits
            )
        });
        let (wall, cpu) = (got.wall_ns.unwrap_or(0), got.cpu_ns.unwrap_or(0));
        ctx.check(wall > 0 && cpu > 0, || {
            format!("thread {t} (tid {tid}): wall {wall} ns, cpu {cpu} ns")
        });
        total += want;
    }
    let function = report
        .function("leaf")
        .unwrap_or_else(|| ctx.fail("no `leaf` in the report"));
    ctx.check(function.calls == total, || {
        format!(
            "leaf: {} calls in all, the threads made {total}",
            function.calls
        )
    });

    target.send("check");
    target.expect_stdout("the code check", |l| l.starts_with("code "));
    ctx.check(target.stdout_text().contains("code intact"), || {
        "leaf's code differs from what it was before weft attached".into()
    });
    round(&mut target, threads, unit, 3);
    target.send("exit");
    let want = format!("sum={}", expected_sum(threads, unit, 3));
    target.expect_stdout("the program's result", |l| l.starts_with("sum="));
    ctx.check(target.stdout_text().contains(&want), || {
        format!("the program's result changed: wanted {want}")
    });
    target.wait_code(0);
}

#[test]
fn a_thousand_threads_on_default_stacks() {
    attach_and_check("a_thousand_threads_on_default_stacks", 1_000, 300, None);
}

#[test]
fn ten_thousand_threads_on_default_stacks() {
    attach_and_check("ten_thousand_threads_on_default_stacks", 10_000, 20, None);
}

/// `ulimit -v 4000000` (3.8 GiB) on a program with 100 threads (800 MiB of
/// stacks): the region used to reserve 32 GiB and the attach failed with
/// `weft_rt_init failed in the target: Cannot allocate memory`.
#[test]
fn a_target_under_an_address_space_limit() {
    attach_and_check(
        "a_target_under_an_address_space_limit",
        100,
        300,
        Some(4_000_000),
    );
}

/// All the memory within reach of `libcrowded.so` is mapped: its
/// `lib_work` is refused with the reason, `main_work` (in the executable)
/// is counted exactly, and the program runs on unharmed.
#[test]
fn a_library_whose_neighbourhood_is_full() {
    let ctx = Ctx::new("a_library_whose_neighbourhood_is_full");
    let exe: &Path = crowded();
    let mut target = ctx.target(exe, &[]);
    let ready = target.expect_stdout("the ready line", |l| l.starts_with("ready pid="));
    let filled: u64 = ready
        .split("filled=")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    ctx.check(filled > 1 << 30, || {
        format!("the target filled only {filled} bytes around its library")
    });
    let report_path = scratch_dir("crowded").join("report.json");
    let (mut weft, _) = attach(
        &ctx,
        target.pid,
        &[
            "-f",
            "*_work",
            "-m",
            "calls,wall",
            "--explain",
            "--format",
            "json",
            "-o",
            report_path.to_str().unwrap(),
        ],
        1,
    );
    for _ in 0..3 {
        target.send("go");
        target.expect_stdout("a calls line", |l| l.starts_with("calls "));
    }
    detach_with_sigint(&mut weft);
    let stderr = weft.stderr_text();
    ctx.check(
        stderr.contains("lib_work") && stderr.contains("no free address range within 1 GiB"),
        || format!("weft did not refuse lib_work for want of room near it:\n{stderr}"),
    );
    let report = parse_report(&ctx, &std::fs::read_to_string(&report_path).unwrap());
    let main_work = report
        .function("main_work")
        .unwrap_or_else(|| ctx.fail("no main_work in the report"));
    ctx.check(main_work.calls == 3_000, || {
        format!(
            "main_work: {} calls counted, the target made 3,000",
            main_work.calls
        )
    });
    ctx.check(report.function("lib_work").is_none(), || {
        "lib_work is in the report although it was refused".into()
    });
    // Uninstrumented again, it still computes what it did.
    target.send("go");
    target.expect_stdout("the last calls line", |l| {
        l.starts_with("calls main_work=4000")
    });
    target.close_stdin();
    target.wait_code(0);
}

/// Debian's memcached with 400 worker threads (as a thread-per-core
/// setting on a large machine would start it), 40 connections served
/// across them: every reply is one `sendmsg`, so weft's count of it equals
/// the commands sent, which memcached's own `stats` confirms.
#[test]
fn memcached_with_four_hundred_workers() {
    use std::io::{Read, Write};
    const CONNECTIONS: usize = 40;
    const PER_CONNECTION: u64 = 50;
    let ctx = Ctx::new("memcached_with_four_hundred_workers");
    let port = free_port();
    let mut c = Command::new("memcached");
    c.args([
        "-t",
        "400",
        "-c",
        "4096",
        "-U",
        "0",
        "-l",
        "127.0.0.1",
        "-p",
    ])
    .arg(port.to_string());
    if running_as_root() {
        c.args(["-u", "root"]);
    }
    let mut server = ctx.spawn("memcached", c, false);
    let deadline = std::time::Instant::now() + TIMEOUT;
    while !listens_on(server.pid, port) {
        ctx.check(
            server.is_running() && std::time::Instant::now() < deadline,
            || "memcached did not start listening".into(),
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let threads = thread_count(server.pid);
    ctx.check(threads > 400, || {
        format!("memcached runs {threads} threads")
    });
    let mut conns: Vec<std::net::TcpStream> = (0..CONNECTIONS)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let exchange = |s: &mut std::net::TcpStream, req: &[u8], want: &[u8]| {
        s.write_all(req).unwrap();
        let mut got = vec![0u8; want.len()];
        s.read_exact(&mut got).unwrap();
        assert_eq!(
            got,
            want,
            "memcached's reply to {:?}",
            String::from_utf8_lossy(req)
        );
    };
    let report_path = scratch_dir("memcached_400").join("report.json");
    let (mut weft, attached) = attach(
        &ctx,
        server.pid,
        &[
            "-f",
            "libc.so.6:sendmsg",
            "-m",
            "calls,wall,cpu",
            "--format",
            "json",
            "-o",
            report_path.to_str().unwrap(),
        ],
        1,
    );
    ctx.check(attached.threads as usize >= threads, || {
        format!("attached to {} of {threads} threads", attached.threads)
    });
    for round in 0..PER_CONNECTION {
        for (i, s) in conns.iter_mut().enumerate() {
            let key = format!("k{i}-{round}");
            exchange(
                s,
                format!("set {key} 0 0 2\r\nab\r\n").as_bytes(),
                b"STORED\r\n",
            );
            let reply = format!("VALUE {key} 0 2\r\nab\r\nEND\r\n");
            exchange(s, format!("get {key}\r\n").as_bytes(), reply.as_bytes());
        }
    }
    detach_with_sigint(&mut weft);
    let report = parse_report(&ctx, &std::fs::read_to_string(&report_path).unwrap());
    let sent = 2 * PER_CONNECTION * CONNECTIONS as u64;
    let counted = report.function("sendmsg").map_or(0, |f| f.calls);
    ctx.check(counted == sent, || {
        format!("weft counted {counted} sendmsg calls for {sent} replies")
    });
    let per_thread: u64 = report
        .threads
        .iter()
        .map(|t| t.functions.get("sendmsg").map_or(0, |c| c.calls))
        .sum();
    ctx.check(per_thread == sent, || {
        format!("the threads' sendmsg calls add up to {per_thread}")
    });
    // memcached's own figures, and every key still served.
    let s = &mut conns[0];
    s.write_all(b"stats\r\n").unwrap();
    let mut stats = String::new();
    let mut buf = [0u8; 4096];
    while !stats.ends_with("END\r\n") {
        let n = s.read(&mut buf).unwrap();
        ctx.check(n > 0, || "memcached closed the stats connection".into());
        stats.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let stat = |name: &str| -> u64 {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("STAT {name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| ctx.fail(format!("no {name} in memcached's stats")))
    };
    let commands = PER_CONNECTION * CONNECTIONS as u64;
    ctx.check(
        stat("cmd_set") == commands && stat("get_hits") == commands,
        || format!("memcached's stats disagree with the commands sent:\n{stats}"),
    );
    for (i, s) in conns.iter_mut().enumerate() {
        let key = format!("k{i}-0");
        let reply = format!("VALUE {key} 0 2\r\nab\r\nEND\r\n");
        exchange(s, format!("get {key}\r\n").as_bytes(), reply.as_bytes());
    }
    server.signal(nix::sys::signal::Signal::SIGTERM);
    server.wait_exit();
}

/// A request refused as a whole (a function named exactly that cannot be
/// timed) is refused before weft's runtime goes in: the target's memory
/// holds nothing of weft's afterwards, and it runs on unchanged.
#[test]
fn a_refused_attach_leaves_nothing_behind() {
    let ctx = Ctx::new("a_refused_attach_leaves_nothing_behind");
    let exe = build_c_target("many_threads", &["-O2", "-g"]);
    let mut target = ctx.target(&exe, &["8", "100"]);
    target.expect_stdout("the ready line", |l| l == "ready 8");
    let pid = target.pid_str();
    let mut weft = ctx.weft(&["attach", "-p", &pid, "-f", "_start", "-m", "calls,wall"]);
    let (_, stderr) = expect_weft_error(&mut weft);
    ctx.check(
        stderr.contains("nothing was changed") && stderr.contains("_start"),
        || format!("weft did not refuse timing _start: {stderr}"),
    );
    // weft's runtime and region (memfds), and trampoline areas (anonymous
    // executable memory, which the program itself has none of).
    let weft_mappings: Vec<String> = maps_text(target.pid)
        .lines()
        .filter(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            l.contains("memfd:weft") || (fields.len() == 5 && fields[1].contains('x'))
        })
        .map(str::to_string)
        .collect();
    ctx.check(weft_mappings.is_empty(), || {
        format!(
            "the refused attach left mappings behind:\n{}",
            weft_mappings.join("\n")
        )
    });
    round(&mut target, 8, 100, 1);
    target.send("exit");
    let want = format!("sum={}", expected_sum(8, 100, 1));
    target.expect_stdout("the program's result", |l| l.starts_with("sum="));
    ctx.check(target.stdout_text().contains(&want), || {
        format!("the program's result changed: wanted {want}")
    });
    target.wait_code(0);
}
