//! A real server with several hundred threads (issue 29): Debian 12's
//! MariaDB (package `mariadb-server`, which `scripts/test` installs; the
//! test fails, not skips, without it) with 300 client connections held open
//! at once, one server thread each (`--thread-handling=one-thread-per-connection`),
//! attached with `-m calls,wall,cpu` while every connection runs its queries,
//! then detached.
//!
//! The test starts its own server: a fresh data directory in its scratch
//! directory (`mariadb-install-db --no-defaults`), `mariadbd --no-defaults`
//! on a free port of 127.0.0.1 with `--skip-grant-tables` (any user, no
//! password) and the performance schema on, and kills it by its PID at the
//! end. The client is the small MySQL-protocol client below (handshake,
//! `COM_QUERY`, text result sets) over TCP, driven by a few client threads.
//!
//! # Ground truth
//!
//! `mariadbd` is stripped; the functions measured are libc's `send`, `recv`
//! and `poll`, which MariaDB's network layer (`vio/viosocket.c`) calls on a
//! connection's socket, all with `MSG_DONTWAIT`, seen with `strace -f`:
//!
//! * a query is read by one `recv` of the 4-byte packet header and one of
//!   the payload (the client writes both at once, so the payload is there);
//! * its reply (an OK packet, or a result set: column count, column
//!   definition, EOF, row, EOF) is buffered and flushed by one `send`;
//! * when the next header is not there yet, that `recv` fails with `EAGAIN`
//!   and the thread waits in `poll` for it, then calls `recv` again.
//!
//! So in a window in which connection *i* runs q(i) queries, its server
//! thread makes exactly q(i) `send`s, and `recv` − `poll` = 2·q(i) exactly
//! (the thread is blocked in a `poll` entered before the window when the
//! window opens, and in one entered within it when it closes), with at most
//! q(i) `poll`s. A client has its reply before the server's `send` returns,
//! so the test opens and closes the window only once every server thread
//! is back in `poll` (`/proc/PID/task/TID/syscall`). The connections run q(i) = 6 + i queries, all different,
//! alternately `SELECT i*1000+k` (a result set, whose value the client
//! checks) and `DO k` (an OK packet).
//!
//! Per thread: each connection learns its server thread's OS TID from the
//! server itself before the window (`performance_schema.threads.THREAD_OS_ID`
//! of its `CONNECTION_ID()`, which also matches the handshake's connection
//! id); every one of those threads must show exactly its counts, under its
//! name in `/proc`; every other thread no `send` nor `recv` at all. The
//! `functions[]` totals must be the sums, and the server's own counters
//! (`Questions`, `Com_select`, `Com_do`) must have grown by exactly the
//! queries sent. After the detach every connection is served again, no
//! thread of the server is traced or stopped, and the first bytes of the
//! three functions in the server's memory are libc's, from the file.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};
use support::mariadb::{start_mariadb, status, Conn, Reply};
use support::*;

/// Client connections held open at once (one server thread each).
const CONNECTIONS: usize = 300;
/// Client threads driving them (each a share of the connections, in turns).
const CLIENT_THREADS: usize = 10;
/// The functions measured.
const FUNCS: [&str; 3] = ["send", "recv", "poll"];
/// `poll`'s system call number (x86-64), as `/proc/PID/task/TID/syscall`
/// shows it.
const SYS_POLL: &str = "7";

/// Queries connection `i` runs in the window: all different, so that any
/// mix-up of threads shows.
fn queries_of(i: usize) -> u64 {
    6 + i as u64
}

/// Query `k` of connection `i` and the one value of its reply (`None`: an
/// OK packet).
fn query(i: usize, k: u64) -> (String, Option<String>) {
    if k % 2 == 0 {
        (
            format!("SELECT {i}*1000+{k}"),
            Some((i as u64 * 1000 + k).to_string()),
        )
    } else {
        (format!("DO {k}"), None)
    }
}

// ---------------------------------------------------------------------------
// A minimal MySQL client (protocol 4.1, text protocol)
// ---------------------------------------------------------------------------

/// Runs query `k` of connection `i` and checks its reply.
fn run(c: &mut Conn, i: usize, k: u64) -> Result<(), String> {
    let (q, want) = query(i, k);
    let got = c.query(&q)?;
    let want = match want {
        Some(v) => Reply::Rows(vec![vec![Some(v)]]),
        None => Reply::Ok,
    };
    if got == want {
        Ok(())
    } else {
        Err(format!(
            "connection {i}: {q:?} replied {got:?}, expected {want:?}"
        ))
    }
}

/// Runs queries `from..` of every connection `i` (up to `queries_of(i)`, or
/// `from + 1` when `one` is set) from [`CLIENT_THREADS`] threads, each
/// taking its connections in turns; returns the first failure.
fn drive(conns: &mut [Conn], from: u64, one: bool) -> Result<(), String> {
    let per = conns.len().div_ceil(CLIENT_THREADS);
    std::thread::scope(|scope| {
        let handles: Vec<_> = conns
            .chunks_mut(per)
            .enumerate()
            .map(|(chunk, cs)| {
                scope.spawn(move || -> Result<(), String> {
                    let first = chunk * per;
                    let end = |i: usize| if one { from + 1 } else { queries_of(i) };
                    let last = (0..cs.len()).map(|j| end(first + j)).max().unwrap_or(0);
                    for k in from..last {
                        for (j, c) in cs.iter_mut().enumerate() {
                            if k < end(first + j) {
                                run(c, first + j, k)?;
                            }
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a client thread panicked".into()))
            })
            .collect::<Result<Vec<()>, String>>()
            .map(|_| ())
    })
}

/// The bytes of `len` at `addr` in the file mapped there in process `pid`
/// (from `/proc/PID/maps`'s offset), and the file's path.
fn file_bytes_at(ctx: &Ctx, pid: u32, addr: u64, len: usize) -> (String, Vec<u8>) {
    let maps = maps_text(pid);
    let line = maps
        .lines()
        .find(|l| {
            let range = l.split_whitespace().next().unwrap_or("");
            range.split_once('-').is_some_and(|(s, e)| {
                let s = u64::from_str_radix(s, 16).unwrap_or(u64::MAX);
                let e = u64::from_str_radix(e, 16).unwrap_or(0);
                addr >= s && addr + len as u64 <= e
            })
        })
        .unwrap_or_else(|| ctx.fail(format!("no mapping of {pid} holds {addr:#x}")));
    let f: Vec<&str> = line.split_whitespace().collect();
    ctx.check(f.len() >= 6 && f[1].contains('x'), || {
        format!("{addr:#x} is not in an executable file mapping: {line}")
    });
    let start = u64::from_str_radix(f[0].split_once('-').unwrap().0, 16).unwrap();
    let offset = u64::from_str_radix(f[2], 16).unwrap();
    let path = f[5].to_string();
    let mut buf = vec![0u8; len];
    std::fs::File::open(&path)
        .and_then(|file| file.read_exact_at(&mut buf, addr - start + offset))
        .unwrap_or_else(|e| ctx.fail(format!("reading {path}: {e}")));
    (path, buf)
}

/// The bytes of `len` at `addr` in process `pid`'s memory.
fn memory_at(ctx: &Ctx, pid: u32, addr: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    std::fs::File::open(format!("/proc/{pid}/mem"))
        .and_then(|f| f.read_exact_at(&mut buf, addr))
        .unwrap_or_else(|e| ctx.fail(format!("reading {addr:#x} of {pid}: {e}")));
    buf
}

/// The OS thread serving connection `c` (named `what`), from the server's
/// performance schema; checks that its `CONNECTION_ID()` is the
/// handshake's and that the thread is one of process `pid`.
fn server_thread(ctx: &Ctx, pid: u32, c: &mut Conn, what: &str) -> i64 {
    let row = match c.query(
        "SELECT CONNECTION_ID(), THREAD_OS_ID FROM performance_schema.threads \
         WHERE PROCESSLIST_ID = CONNECTION_ID()",
    ) {
        Ok(Reply::Rows(rows)) if rows.len() == 1 => rows[0].clone(),
        r => ctx.fail(format!("{what}: its thread: {r:?}")),
    };
    let id: u64 = row[0].as_deref().and_then(|v| v.parse().ok()).unwrap_or(0);
    ctx.check(id == c.id, || {
        format!("{what}: CONNECTION_ID() {id}, the handshake said {}", c.id)
    });
    let tid: i64 = row[1].as_deref().and_then(|v| v.parse().ok()).unwrap_or(0);
    ctx.check(
        tid > 0 && Path::new(&format!("/proc/{pid}/task/{tid}")).exists(),
        || format!("{what}: THREAD_OS_ID {:?} is no thread of {pid}", row[1]),
    );
    tid
}

/// Waits until every thread `tids` of `pid` waits in `poll` for its
/// connection's next query: a client has its reply as soon as the server's
/// `send` put it on the socket, before that `send` returns and the thread
/// makes its `recv` (`EAGAIN`) and enters `poll`. A window opened or closed
/// in between would cut a query's calls in two.
fn wait_all_in_poll(ctx: &Ctx, pid: u32, tids: &[i64]) {
    let deadline = Instant::now() + TIMEOUT;
    for tid in tids {
        let path = format!("/proc/{pid}/task/{tid}/syscall");
        loop {
            let now = std::fs::read_to_string(&path).unwrap_or_default();
            if now.split_whitespace().next() == Some(SYS_POLL) {
                break;
            }
            ctx.check(Instant::now() < deadline, || {
                format!("thread {tid} of {pid} is not back in poll: {path} says {now:?}")
            });
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[test]
fn mariadb_with_three_hundred_connections() {
    let began = Instant::now();
    let ctx = Ctx::new("mariadb_with_three_hundred_connections");
    let (dir, mut server, port) = start_mariadb(
        &ctx,
        "mariadb",
        &["--thread-handling=one-thread-per-connection"],
    );
    let pid = server.pid;
    let started = began.elapsed();

    // The connections, and each one's server thread, from the server.
    let mut control = Conn::connect(port).unwrap_or_else(|e| ctx.fail(e));
    let mut conns: Vec<Conn> = (0..CONNECTIONS)
        .map(|i| Conn::connect(port).unwrap_or_else(|e| ctx.fail(format!("connection {i}: {e}"))))
        .collect();
    let tid_of: Vec<i64> = conns
        .iter_mut()
        .enumerate()
        .map(|(i, c)| server_thread(&ctx, pid, c, &format!("connection {i}")))
        .collect();
    let control_tid = server_thread(&ctx, pid, &mut control, "the control connection");
    let distinct: BTreeSet<i64> = tid_of.iter().copied().collect();
    ctx.check(
        distinct.len() == CONNECTIONS && !distinct.contains(&control_tid),
        || {
            format!(
                "{} distinct server threads for {CONNECTIONS} connections",
                distinct.len()
            )
        },
    );
    let names: BTreeMap<i64, String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter_map(|t| {
            let tid = t.file_name().to_string_lossy().parse().ok()?;
            let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
            Some((tid, comm.trim_end().to_string()))
        })
        .collect();
    let threads = thread_count(pid);
    ctx.check(threads > CONNECTIONS, || {
        format!("mariadbd runs {threads} threads for {CONNECTIONS} connections")
    });
    let questions = status(&ctx, &mut control, "Questions");
    let selects = status(&ctx, &mut control, "Com_select");
    let dos = status(&ctx, &mut control, "Com_do");
    let mut serving = tid_of.clone();
    serving.push(control_tid);
    wait_all_in_poll(&ctx, pid, &serving);

    // The window.
    let report_path = dir.join("report.json");
    let patterns = FUNCS.map(|f| format!("libc.so.6:{f}")).join(",");
    let attaching = Instant::now();
    let (mut weft, attached) = attach(
        &ctx,
        pid,
        &[
            "-f",
            &patterns,
            "-m",
            "calls,wall,cpu",
            "--format",
            "json",
            "-o",
            report_path.to_str().unwrap(),
        ],
        FUNCS.len() as u32,
    );
    let attach_time = attaching.elapsed();
    ctx.check(attached.threads as usize >= threads, || {
        format!("attached to {} of {threads} threads", attached.threads)
    });
    let loading = Instant::now();
    drive(&mut conns, 0, false).unwrap_or_else(|e| ctx.fail(format!("in the window: {e}")));
    wait_all_in_poll(&ctx, pid, &tid_of);
    let load_time = loading.elapsed();
    let detaching = Instant::now();
    detach_with_sigint(&mut weft);
    let detach_time = detaching.elapsed();
    let report = parse_report(&ctx, &std::fs::read_to_string(&report_path).unwrap());

    // Every connection's thread, exactly.
    check_metrics(&ctx, &report, &["calls", "wall", "cpu"]);
    check_metric_fields(&ctx, &report, true, true);
    check_timer_totals(&ctx, &report);
    ctx.check(report.overflow_threads == 0, || {
        format!(
            "{} threads shared the overflow row",
            report.overflow_threads
        )
    });
    let show = |tid: i64| format!("{:#?}", report.thread(tid));
    let mut total = 0;
    for (i, &tid) in tid_of.iter().enumerate() {
        let q = queries_of(i);
        total += q;
        let row = report.thread(tid).unwrap_or_else(|| {
            ctx.fail(format!(
                "connection {i}'s thread {tid} is not in the report"
            ))
        });
        ctx.check(Some(&row.name) == names.get(&tid), || {
            format!(
                "thread {tid}: weft names it {:?}, /proc {:?}",
                row.name,
                names.get(&tid)
            )
        });
        let (send, recv, poll) = (
            report.counts(tid, "send"),
            report.counts(tid, "recv"),
            report.counts(tid, "poll"),
        );
        ctx.check(send.calls == q, || {
            format!(
                "connection {i} (thread {tid}) ran {q} queries, weft counted {} sends\n{}",
                send.calls,
                show(tid)
            )
        });
        ctx.check(recv.calls == 2 * q + poll.calls && poll.calls <= q, || {
            format!(
                "connection {i} (thread {tid}) ran {q} queries, weft counted {} recvs and {} \
                     polls (expected recv = 2·{q} + poll, poll <= {q})\n{}",
                recv.calls,
                poll.calls,
                show(tid)
            )
        });
        // send and recv all returned; the last poll may still be waiting.
        ctx.check(
            send.exits == Some(q)
                && recv.exits == Some(recv.calls)
                && poll.exits.unwrap_or(0) + 1 >= poll.calls,
            || {
                format!(
                    "connection {i} (thread {tid}) ran {q} queries: exits of send {:?}, of \
                     recv {:?} ({} calls), of poll {:?} ({} calls)\n{}",
                    send.exits,
                    recv.exits,
                    recv.calls,
                    poll.exits,
                    poll.calls,
                    show(tid)
                )
            },
        );
        // Timed: within the window, and send and recv took some time. (Not
        // checked per thread: CPU time within wall time. A thread's short
        // recvs, ~1.3 µs each, showed up to +121 µs of CPU over 250 µs of
        // wall in all, in a few of the 300 threads; see the functions[]
        // check below.)
        for (f, c) in [("send", &send), ("recv", &recv), ("poll", &poll)] {
            let (wall, cpu) = (c.wall_ns.unwrap_or(0), c.cpu_ns.unwrap_or(0));
            ctx.check(
                (wall > 0 && cpu > 0 || f == "poll")
                    && wall <= report.duration_ns
                    && cpu <= report.duration_ns,
                || {
                    format!(
                        "connection {i} (thread {tid}): {f} wall {wall} ns, cpu {cpu} ns in a \
                         window of {} ns",
                        report.duration_ns
                    )
                },
            );
        }
    }
    // Every other thread: no send nor recv; a few polls at most.
    let mut other_polls = 0;
    for t in &report.threads {
        if distinct.contains(&t.tid) {
            continue;
        }
        let calls = |f: &str| t.functions.get(f).map_or(0, |c| c.calls);
        ctx.check(calls("send") == 0 && calls("recv") == 0, || {
            format!("thread {} serves no connection, yet: {t:#?}", t.tid)
        });
        other_polls += calls("poll");
    }
    ctx.check(other_polls <= 10, || {
        format!("the threads serving no connection called poll {other_polls} times")
    });
    let calls_of = |f: &str| {
        report
            .function(f)
            .unwrap_or_else(|| ctx.fail(format!("no {f} in functions[]")))
            .calls
    };
    let sum_of = |f: &str| -> u64 {
        report
            .threads
            .iter()
            .map(|t| t.functions.get(f).map_or(0, |c| c.calls))
            .sum()
    };
    for f in FUNCS {
        let (wall, cpu) = (
            report.function(f).unwrap().wall_ns.unwrap_or(0),
            report.function(f).unwrap().cpu_ns.unwrap_or(0),
        );
        ctx.check(cpu <= wall, || {
            format!("functions[] {f}: cpu {cpu} ns above wall {wall} ns")
        });
        ctx.check(calls_of(f) == sum_of(f), || {
            format!(
                "functions[] {f}: {} calls, the threads' sum {}",
                calls_of(f),
                sum_of(f)
            )
        });
    }
    ctx.check(calls_of("send") == total, || {
        format!("{} sends for {total} queries", calls_of("send"))
    });
    ctx.check(
        calls_of("recv") == 2 * total + calls_of("poll") - other_polls,
        || {
            format!(
                "{} recvs and {} polls ({other_polls} of other threads) for {total} queries",
                calls_of("recv"),
                calls_of("poll")
            )
        },
    );

    // The server's own counters: the window's queries, then the status
    // queries themselves (SHOW STATUS counts in Questions).
    let want_selects: u64 = (0..CONNECTIONS).map(|i| queries_of(i).div_ceil(2)).sum();
    ctx.check(
        status(&ctx, &mut control, "Questions") == questions + total + 3,
        || format!("Questions grew otherwise than by the {total} queries sent (+3)"),
    );
    ctx.check(
        status(&ctx, &mut control, "Com_select") == selects + want_selects,
        || format!("Com_select did not grow by the {want_selects} SELECTs sent"),
    );
    ctx.check(
        status(&ctx, &mut control, "Com_do") == dos + total - want_selects,
        || {
            format!(
                "Com_do did not grow by the {} DOs sent",
                total - want_selects
            )
        },
    );

    // After the detach: nothing of weft is left running or changed.
    check_not_traced_nor_stopped(&ctx, pid);
    for f in FUNCS {
        let addr = parse_hex(&ctx, &report.function(f).unwrap().address);
        let (path, want) = file_bytes_at(&ctx, pid, addr, 16);
        let got = memory_at(&ctx, pid, addr, 16);
        ctx.check(got == want, || {
            format!("{f} at {addr:#x}: {got:02x?} in memory, {want:02x?} in {path}")
        });
    }
    let big = 1_000_000;
    drive(&mut conns, big, true).unwrap_or_else(|e| ctx.fail(format!("after the detach: {e}")));
    ctx.check(
        control.value("SELECT COUNT(*) FROM information_schema.PROCESSLIST")
            == Ok((CONNECTIONS + 1).to_string()),
        || "the server lost connections".into(),
    );
    drop(conns);
    drop(control);
    server.signal(nix::sys::signal::Signal::SIGTERM);
    server.wait_exit();
    eprintln!(
        "mariadbd: {threads} threads, {CONNECTIONS} connections, {total} queries in the window \
         ({} send, {} recv, {} poll); attached to {} threads in {attach_time:?}, load {load_time:?}, \
         detach {detach_time:?}; up at {started:?}, all {:?}",
        calls_of("send"),
        calls_of("recv"),
        calls_of("poll"),
        attached.threads,
        began.elapsed()
    );
}
