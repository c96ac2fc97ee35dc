//! A real server that forks a process per connection (issue 32): Debian
//! 12's PostgreSQL (package `postgresql`, which `scripts/test` installs),
//! its cluster made by `initdb` in the test's scratch directory, serving on
//! a free port of 127.0.0.1, run as the `postgres` user (it refuses root).
//! weft is given the postmaster alone with `--children`: the backends
//! pgbench's connections fork after the attach are followed, each from its
//! fork.
//!
//! # Ground truth
//!
//! `/usr/lib/postgresql/15/bin/postgres` is stripped but exports its
//! functions for extensions: `pg_parse_query` parses the text of every
//! simple-protocol query once (`exec_simple_query`, postgres.c). pgbench
//! runs a script of one `SELECT 1;` per transaction (`-n`: no vacuum, so
//! no other query) and prints the transactions it made: the calls over
//! every process must be exactly that many.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use support::*;

/// The newest PostgreSQL's programs Debian installed.
fn postgres_bin(ctx: &Ctx) -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|p| p.join("postgres").exists())
        .collect();
    versions.sort();
    versions.pop().unwrap_or_else(|| {
        ctx.fail(
            "Debian's PostgreSQL is not installed (package postgresql; scripts/test installs it)",
        )
    })
}

/// `program args` as the `postgres` user (setpriv execs it: same PID).
fn as_postgres(program: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=postgres", "--regid=postgres", "--init-groups"])
        .arg(program)
        .args(args);
    cmd
}

#[test]
fn postgres_backends_forked_after_the_attach_each_counted_from_their_fork() {
    let ctx = Ctx::new("postgres_backends_forked_after_the_attach_each_counted_from_their_fork");
    let bin = postgres_bin(&ctx);
    let dir = scratch_dir("postgres_children");
    let data = dir.join("data");
    let _ = std::fs::remove_dir_all(&data);
    std::fs::create_dir_all(&data).unwrap();
    let chown = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(&dir)
        .status()
        .expect("chown runs");
    ctx.check(chown.success(), || format!("chown {}", dir.display()));
    let data_s = data.display().to_string();
    let init = as_postgres(
        &bin.join("initdb"),
        &["-D", &data_s, "-A", "trust", "-U", "postgres"],
    )
    .output()
    .expect("initdb runs");
    ctx.check(init.status.success(), || {
        format!("initdb: {}", String::from_utf8_lossy(&init.stderr))
    });
    let script = dir.join("select1.sql");
    std::fs::write(&script, "SELECT 1;\n").unwrap();
    let port = free_port().to_string();
    let setpriv = Path::new("/usr/bin/setpriv");
    let postgres = bin.join("postgres");
    let mut server = ctx.target(
        setpriv,
        &[
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            postgres.to_str().unwrap(),
            "-D",
            &data_s,
            // TCP only: a Unix socket's path under the scratch directory
            // can be longer than the 107 bytes allowed.
            "-k",
            "",
            "-p",
            &port,
            "-c",
            "listen_addresses=127.0.0.1",
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !as_postgres(
        &bin.join("pg_isready"),
        &["-h", "127.0.0.1", "-p", &port, "-q"],
    )
    .status()
    .is_ok_and(|s| s.success())
    {
        ctx.check(Instant::now() < deadline, || {
            format!("PostgreSQL did not accept connections on 127.0.0.1:{port}")
        });
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut w = attach_children(&ctx, server.pid, "pg_parse_query");
    // The postmaster, then its background processes (checkpointer,
    // writers, launchers), all before weft goes live: done once no line
    // has come for half a second.
    wait_attached(&mut w);
    let mut seen = (0, Instant::now());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n = w.stderr_text().matches("attached pid=").count();
        if n != seen.0 {
            seen = (n, Instant::now());
        } else if seen.1.elapsed() > Duration::from_millis(500) {
            break;
        }
        ctx.check(Instant::now() < deadline, || {
            format!("weft did not settle: {}", w.stderr_text())
        });
        std::thread::sleep(Duration::from_millis(50));
    }
    // Four connections for two seconds: four backends forked now.
    let bench = as_postgres(
        &bin.join("pgbench"),
        &[
            "-n",
            "-f",
            script.to_str().unwrap(),
            "-c",
            "4",
            "-T",
            "2",
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-U",
            "postgres",
            "postgres",
        ],
    )
    .output()
    .expect("pgbench runs");
    let said = String::from_utf8_lossy(&bench.stdout).to_string();
    ctx.check(bench.status.success(), || {
        format!("pgbench: {said}{}", String::from_utf8_lossy(&bench.stderr))
    });
    let made: u64 = said
        .lines()
        .find_map(|l| l.strip_prefix("number of transactions actually processed: "))
        .and_then(|n| n.split('/').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| ctx.fail(format!("pgbench's count: {said}")));
    // Its backends have exited when pgbench has; weft reports them.
    w.signal(nix::sys::signal::Signal::SIGINT);
    w.wait_code(0);
    let out = w.stdout_text();
    let report: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| ctx.fail(format!("not JSON: {e}: {out}")));
    let total = report["totals"][0]["calls"].as_u64().unwrap_or(0);
    let followed = w.stderr_text().matches("following pid=").count();
    ctx.check(total == made && made > 0, || {
        format!(
            "pgbench made {made} transactions of one query; weft counted {total} parses in \
             {followed} backends followed: {out}"
        )
    });
    ctx.check(followed >= 4, || {
        format!("{followed} backends followed, pgbench had 4 connections")
    });
    // Unharmed: a fast shutdown, as `pg_ctl stop` does.
    server.signal(nix::sys::signal::Signal::SIGINT);
    server.wait_code(0);
}
