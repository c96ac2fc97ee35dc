//! `weft diagnose` on Debian's MariaDB under a bounded load the test
//! drives (issue #31, §3): the server's background threads wait for work
//! (`handle_manager`, InnoDB's timers and purge, the signal handler) and
//! must never be reported as bottlenecks — once they were, `100 % sync
//! fun_c7f450 > handle_manager > pthread_cond_wait` — and every object
//! named must be the server's: a futex word in its memory, a descriptor it
//! has.
//!
//! The load: client threads, each on its own connection, read and update
//! rows of a small table (some rows hot, so that updates wait for row
//! locks), until the diagnosis ends or a minute has passed.

use crate::support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use support::mariadb::{start_mariadb, status, Conn};
use support::*;

const CLIENTS: usize = 6;
const ROWS: u64 = 200;

/// The server thread serving connection `c` (from the performance schema).
fn server_tid(ctx: &Ctx, c: &mut Conn) -> u64 {
    c.value(
        "SELECT THREAD_OS_ID FROM performance_schema.threads WHERE PROCESSLIST_ID = \
         CONNECTION_ID()",
    )
    .unwrap_or_else(|e| ctx.fail(e))
    .parse()
    .unwrap_or_else(|e| ctx.fail(format!("a thread id: {e}")))
}

/// Whether `addr` lies in a mapping of process `pid`.
fn mapped(pid: u32, addr: u64) -> bool {
    mappings(pid)
        .iter()
        .any(|m| m.start <= addr && addr < m.end)
}

#[test]
fn background_threads_of_mariadb_are_idle_not_bottlenecks() {
    let _one = one_at_a_time();
    let ctx = Ctx::new("background_threads_of_mariadb_are_idle_not_bottlenecks");
    let (_dir, mut server, port) = start_mariadb(&ctx, "mariadb_diagnose", &[]);
    let pid = server.pid;
    let mut control = Conn::connect(port).unwrap_or_else(|e| ctx.fail(e));
    for q in [
        "CREATE DATABASE bench".to_string(),
        "CREATE TABLE bench.t (id INT PRIMARY KEY, v BIGINT NOT NULL, pad CHAR(100)) \
         ENGINE=InnoDB"
            .to_string(),
        format!(
            "INSERT INTO bench.t VALUES {}",
            (0..ROWS)
                .map(|i| format!("({i}, 0, 'x')"))
                .collect::<Vec<_>>()
                .join(",")
        ),
    ] {
        control.query(&q).unwrap_or_else(|e| ctx.fail(e));
    }
    let mut conns: Vec<Conn> = (0..CLIENTS)
        .map(|_| Conn::connect(port).unwrap_or_else(|e| ctx.fail(e)))
        .collect();
    let serving: BTreeSet<u64> = conns.iter_mut().map(|c| server_tid(&ctx, c)).collect();
    let questions = status(&ctx, &mut control, "Questions");

    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let began = Instant::now();
    let (d, failures) = std::thread::scope(|scope| {
        let clients: Vec<_> = conns
            .iter_mut()
            .enumerate()
            .map(|(i, c)| {
                let (stop, done) = (&stop, &done);
                scope.spawn(move || -> Result<(), String> {
                    let mut k = i as u64;
                    while !stop.load(Ordering::Relaxed) && began.elapsed() < TIMEOUT {
                        k = (k * 7 + 3) % ROWS;
                        // Rows 0..4 are hot: updates there wait for locks.
                        let row = if k % 3 == 0 { k % 4 } else { k };
                        c.query(&format!("UPDATE bench.t SET v = v + 1 WHERE id = {row}"))?;
                        c.value(&format!("SELECT v FROM bench.t WHERE id = {k}"))?;
                        c.query("SELECT SUM(v), COUNT(*) FROM bench.t")?;
                        done.fetch_add(3, Ordering::Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        // The load runs a moment before the diagnosis, and on during it.
        std::thread::sleep(Duration::from_millis(500));
        let pid_s = pid.to_string();
        let mut w = ctx.weft(&[
            "diagnose",
            "-p",
            &pid_s,
            "--duration",
            "20",
            "--format",
            "json",
        ]);
        w.wait_code(0);
        stop.store(true, Ordering::Relaxed);
        let failures: Vec<String> = clients
            .into_iter()
            .filter_map(|h| h.join().unwrap_or(Err("a client panicked".into())).err())
            .collect();
        let d: serde_json::Value = serde_json::from_str(&w.stdout_text())
            .unwrap_or_else(|e| ctx.fail(format!("diagnosis is not JSON: {e}")));
        (d, failures)
    });
    ctx.check(failures.is_empty(), || {
        format!("clients failed: {failures:?}")
    });
    // The load ran: the server counted the queries.
    let ran = done.load(Ordering::Relaxed);
    let counted = status(&ctx, &mut control, "Questions") - questions;
    ctx.check(ran > 1000 && counted > ran, || {
        format!("{ran} queries sent, the server counted {counted}")
    });

    let bottlenecks = d["bottlenecks"].as_array().cloned().unwrap_or_default();
    eprintln!(
        "{} bottlenecks, {} idle; {ran} queries",
        bottlenecks.len(),
        d["idle"].as_array().map_or(0, |a| a.len())
    );
    for b in &bottlenecks {
        let path: Vec<&str> = b["path"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str())
            .collect();
        let threads: Vec<u64> = b["threads"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t.as_u64())
            .collect();
        eprintln!(
            "  {} {} threads {threads:?} object {}",
            b["hypothesis"],
            path.join(" > "),
            b["object"]
        );
        // Only the threads serving the load can be its bottlenecks.
        let background: Vec<u64> = threads
            .iter()
            .copied()
            .filter(|t| !serving.contains(t))
            .collect();
        ctx.check(background.is_empty(), || {
            format!(
                "a bottleneck in threads not serving the load ({background:?}; serving \
                 {serving:?}): {b}"
            )
        });
        // Every object is the server's.
        match b["object"].as_str() {
            None => {}
            Some(o) if o.starts_with("0x") => {
                let addr = u64::from_str_radix(&o[2..], 16).unwrap_or(0);
                ctx.check(addr != 0 && mapped(pid, addr), || {
                    format!("object {o} is not in the server's memory: {b}")
                });
            }
            Some(o) => {
                let fd: Option<i64> = o
                    .strip_prefix("fd ")
                    .and_then(|r| r.split_whitespace().next())
                    .and_then(|n| n.parse().ok());
                ctx.check(
                    fd.is_some_and(|fd| {
                        fd >= 0 && std::path::Path::new(&format!("/proc/{pid}/fd/{fd}")).exists()
                    }),
                    || format!("object {o:?} is no descriptor of the server: {b}"),
                );
            }
        }
    }
    // The background threads' waits are there, reported as idle.
    let idle = d["idle"].as_array().cloned().unwrap_or_default();
    for b in &idle {
        eprintln!("  idle: {} {}", b["hypothesis"], b["path"]);
    }
    let background_idle = idle.iter().any(|b| {
        b["threads"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t.as_u64())
            .any(|t| !serving.contains(&t))
    });
    ctx.check(background_idle, || {
        format!("no background thread's wait reported as idle: {idle:?}")
    });
    ctx.check(server.is_running(), || "the server stopped".into());
    drop(conns);
    server.signal(nix::sys::signal::Signal::SIGTERM);
    server.wait_exit();
}
