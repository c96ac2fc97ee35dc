//! A real server of several processes (issue 32): Debian 12's nginx
//! (package `nginx-light`, which `scripts/test` installs; the test fails,
//! not skips, without it), a master and two workers on a free port of
//! 127.0.0.1, measured by one weft given all three (`-p M,W1,W2`).
//!
//! The test starts its own server (`nginx -p DIR -c nginx.conf`, `daemon
//! off`, its files in the test's scratch directory) and stops it by its
//! master's PID (SIGQUIT) at the end.
//!
//! # Ground truth
//!
//! `/usr/sbin/nginx` is stripped but exports its functions for dynamic
//! modules: `ngx_http_process_request` is called once per request a worker
//! has read the header of (`ngx_http_request.c`), in the worker that
//! accepted the connection; the master serves none. The client sends
//! REQUESTS requests, each on its own connection (HTTP/1.0, no keep-alive),
//! and checks each answer: the sum over the workers must be exactly
//! REQUESTS, and the master's 0; nginx's own `stub_status` counter (not in
//! nginx-light) is not needed: each answer is checked.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use support::*;

/// Requests sent while weft is attached.
const REQUESTS: u64 = 1001;

/// One HTTP/1.0 request on a new connection: the answer's body.
fn request(port: u16, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)?;
    if !raw.starts_with("HTTP/1.1 200") {
        return Err(std::io::Error::other(format!("answer {raw:?}")));
    }
    Ok(raw
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string())
}

/// A server of this test's own: nginx with a master and two workers on a
/// free port of 127.0.0.1, its files in scratch directory `name`; serving.
struct Nginx {
    master: Proc,
    port: u16,
    workers: Vec<i32>,
    dir: std::path::PathBuf,
}

fn start_nginx(ctx: &Ctx, name: &str) -> Nginx {
    let (dir, port, args) = nginx_config(ctx, name);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let master = ctx.target(std::path::Path::new("/usr/sbin/nginx"), &args);
    let workers = serving_workers(ctx, &master.pid, port, &dir, &[]);
    Nginx {
        master,
        port,
        workers,
        dir,
    }
}

/// nginx's files in scratch directory `name`, a free port of 127.0.0.1 it
/// serves on, and the arguments that start it so.
fn nginx_config(ctx: &Ctx, name: &str) -> (std::path::PathBuf, u16, Vec<String>) {
    ctx.check(std::path::Path::new("/usr/sbin/nginx").exists(), || {
        "Debian's nginx is not installed (package nginx-light; scripts/test installs it)".into()
    });
    let dir = scratch_dir(name);
    let port = free_port();
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    std::fs::write(
        dir.join("nginx.conf"),
        format!(
            "daemon off;\nmaster_process on;\nworker_processes 2;\npid {d}/nginx.pid;\n\
             error_log {d}/logs/error.log;\nevents {{ worker_connections 128; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n\
               proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n\
               uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
               server {{ listen 127.0.0.1:{port}; location / {{ return 200 \"served\\n\"; }} }}\n}}\n",
            d = dir.display()
        ),
    )
    .unwrap();
    let args = vec![
        "-p".to_string(),
        dir.display().to_string(),
        "-c".to_string(),
        dir.join("nginx.conf").display().to_string(),
    ];
    (dir, port, args)
}

/// The master's two workers once it serves with them, none of `old`
/// (checked with one request, which they serve: a worker's count has it).
fn serving_workers(
    ctx: &Ctx,
    master: &u32,
    port: u16,
    dir: &std::path::Path,
    old: &[i32],
) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let workers = weft::inspect::children_running_the_same_program(*master as i32);
        if workers.len() == 2
            && !workers.iter().any(|w| old.contains(w))
            && request(port, "/").is_ok()
        {
            return workers;
        }
        if Instant::now() > deadline {
            ctx.fail(format!(
                "nginx did not serve on 127.0.0.1:{port} with 2 new workers ({workers:?}, old \
                 {old:?}): {}",
                std::fs::read_to_string(dir.join("logs/error.log")).unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until weft says it follows each of `workers` (children forked
/// after the start, seen every 200 ms).
fn expect_followed(ctx: &Ctx, w: &mut Proc, workers: &[i32]) {
    for _ in workers {
        let line = w.expect_line(Stream::Stderr, "a worker followed", |l| {
            l.contains("following pid=")
        });
        ctx.check(
            workers
                .iter()
                .any(|p| line.contains(&format!("following pid={p} "))),
            || format!("followed {line:?}, the workers are {workers:?}"),
        );
    }
}

/// Sends `n` requests named `tag`, each answer checked.
fn send_requests(ctx: &Ctx, port: u16, n: u64, tag: &str) {
    for i in 0..n {
        match request(port, &format!("/{tag}{i}")) {
            Ok(body) => ctx.check(body == "served\n", || {
                format!("request {tag}{i}: body {body:?}")
            }),
            Err(e) => ctx.fail(format!("request {tag}{i}: {e}")),
        }
    }
}

#[test]
fn nginx_master_and_workers_each_request_counted_once() {
    let ctx = Ctx::new("nginx_master_and_workers_each_request_counted_once");
    let Nginx {
        mut master,
        port,
        workers,
        dir: _,
    } = start_nginx(&ctx, "nginx_several_processes");
    let pids = format!("{},{},{}", master.pid, workers[0], workers[1]);
    let mut w = ctx.weft(&[
        "attach",
        "-p",
        &pids,
        "-f",
        "ngx_http_process_request",
        "--format",
        "json",
    ]);
    for _ in 0..3 {
        let a = wait_attached(&mut w);
        ctx.check(a.functions == 1, || {
            format!("attached with {} functions", a.functions)
        });
    }
    send_requests(&ctx, port, REQUESTS, "r");
    w.signal(nix::sys::signal::Signal::SIGINT);
    w.wait_code(0);
    let out = w.stdout_text();
    let report: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| ctx.fail(format!("not JSON: {e}: {out}")));
    let calls_of = |pid: i64| -> u64 {
        report["processes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["pid"] == pid)
            .and_then(|p| p["functions"][0]["calls"].as_u64())
            .unwrap_or_else(|| ctx.fail(format!("no figures for pid {pid}: {out}")))
    };
    let master_calls = calls_of(i64::from(master.pid));
    let worker_calls: Vec<u64> = workers.iter().map(|&p| calls_of(i64::from(p))).collect();
    let total = report["totals"][0]["calls"].as_u64().unwrap_or(0);
    ctx.check(
        master_calls == 0 && worker_calls.iter().sum::<u64>() == REQUESTS && total == REQUESTS,
        || {
            format!(
                "{REQUESTS} requests: master {master_calls} calls, workers {worker_calls:?}, \
                 total {total}"
            )
        },
    );
    // Unharmed: it serves on after the detach.
    for i in 0..20 {
        if let Err(e) = request(port, &format!("/after{i}")) {
            ctx.fail(format!("after the detach, request {i}: {e}"));
        }
    }
    master.signal(nix::sys::signal::Signal::SIGQUIT);
    master.wait_code(0);
}

/// Attached through its master alone with `--children`: the two workers
/// are taken at the attach, and the two a reload (`nginx -s reload`:
/// SIGHUP to the master) forks are followed from their fork. Every request
/// is counted once, before and after the reload: the total is what was
/// sent, the master's 0; the old workers are reported as exited, with
/// theirs.
#[test]
fn nginx_through_its_master_with_children_counts_every_request_across_a_reload() {
    let ctx =
        Ctx::new("nginx_through_its_master_with_children_counts_every_request_across_a_reload");
    let Nginx {
        mut master,
        port,
        workers,
        dir,
    } = start_nginx(&ctx, "nginx_children_reload");
    let mut w = attach_children(&ctx, master.pid, "ngx_http_process_request");
    for _ in 0..3 {
        wait_attached(&mut w);
    }
    const BEFORE: u64 = 500;
    const AFTER: u64 = 501;
    send_requests(&ctx, port, BEFORE, "before");
    master.signal(nix::sys::signal::Signal::SIGHUP);
    let new = serving_workers(&ctx, &master.pid, port, &dir, &workers);
    expect_followed(&ctx, &mut w, &new);
    send_requests(&ctx, port, AFTER, "after");
    // And the one that found the new workers serving.
    const AFTER_ALL: u64 = AFTER + 1;
    w.signal(nix::sys::signal::Signal::SIGINT);
    w.wait_code(0);
    let out = w.stdout_text();
    let report: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| ctx.fail(format!("not JSON: {e}: {out}")));
    let calls_of = |pid: i32| -> Option<u64> {
        report["processes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["pid"] == pid)
            .and_then(|p| p["functions"][0]["calls"].as_u64())
    };
    let old_calls: Vec<Option<u64>> = workers.iter().map(|&p| calls_of(p)).collect();
    let new_calls: Vec<Option<u64>> = new.iter().map(|&p| calls_of(p)).collect();
    let total = report["totals"][0]["calls"].as_u64().unwrap_or(0);
    let summed = |v: &[Option<u64>]| v.iter().map(|c| c.unwrap_or(0)).sum::<u64>();
    ctx.check(
        calls_of(master.pid as i32) == Some(0)
            && summed(&old_calls) == BEFORE
            && summed(&new_calls) == AFTER_ALL
            && total == BEFORE + AFTER_ALL,
        || {
            format!(
                "{BEFORE} requests, a reload, {AFTER_ALL}: master {:?}, old workers {old_calls:?}, \
                 new workers {new_calls:?}, total {total}: {out}",
                calls_of(master.pid as i32)
            )
        },
    );
    // Unharmed: it serves on after the detach.
    send_requests(&ctx, port, 20, "detached");
    master.signal(nix::sys::signal::Signal::SIGQUIT);
    master.wait_code(0);
}

/// Under `weft run`, which follows the workers nginx forks (and those a
/// reload forks): every request counted once, the total what was sent.
#[test]
fn nginx_under_weft_run_counts_every_request_across_a_reload() {
    let ctx = Ctx::new("nginx_under_weft_run_counts_every_request_across_a_reload");
    let (dir, port, args) = nginx_config(&ctx, "nginx_run_reload");
    let mut run = vec![
        "run",
        "-f",
        "ngx_http_process_request",
        "--format",
        "json",
        "--",
    ];
    run.push("/usr/sbin/nginx");
    run.extend(args.iter().map(String::as_str));
    let mut w = ctx.weft(&run);
    // nginx is weft's child: its pid file names it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let master: u32 = loop {
        let text = std::fs::read_to_string(dir.join("nginx.pid")).unwrap_or_default();
        if let Ok(pid) = text.trim().parse() {
            break pid;
        }
        ctx.check(Instant::now() < deadline, || {
            format!("nginx wrote no pid file: {}", w.stderr_text())
        });
        std::thread::sleep(Duration::from_millis(20));
    };
    let workers = serving_workers(&ctx, &master, port, &dir, &[]);
    // Both followed before the count starts.
    expect_followed(&ctx, &mut w, &workers);
    const BEFORE: u64 = 400;
    const AFTER: u64 = 401;
    send_requests(&ctx, port, BEFORE, "before");
    let signal = |sig| {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(master as i32), sig)
            .unwrap_or_else(|e| ctx.fail(format!("signal nginx {master} (this test's): {e}")))
    };
    signal(nix::sys::signal::Signal::SIGHUP);
    let new = serving_workers(&ctx, &master, port, &dir, &workers);
    // Followed before they are stopped: a worker that exits before weft
    // has seen it (it looks every 200 ms) takes its region with it.
    expect_followed(&ctx, &mut w, &new);
    send_requests(&ctx, port, AFTER, "after");
    signal(nix::sys::signal::Signal::SIGQUIT);
    w.wait_code(0);
    let out = w.stdout_text();
    let report: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| ctx.fail(format!("not JSON: {e}: {out}")));
    // The requests that found the workers serving: one at the start, one
    // after the reload.
    let sent = BEFORE + AFTER + 2;
    let total = report["totals"][0]["calls"].as_u64().unwrap_or(0);
    let processes = report["processes"].as_array().map_or(0, Vec::len);
    ctx.check(total == sent && processes == 5, || {
        format!("{sent} requests: {total} calls counted in {processes} processes (the master, 2 workers, 2 after the reload): {out}")
    });
}
