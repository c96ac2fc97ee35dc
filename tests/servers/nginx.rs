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

#[test]
fn nginx_master_and_workers_each_request_counted_once() {
    let ctx = Ctx::new("nginx_master_and_workers_each_request_counted_once");
    ctx.check(std::path::Path::new("/usr/sbin/nginx").exists(), || {
        "Debian's nginx is not installed (package nginx-light; scripts/test installs it)".into()
    });
    let dir = scratch_dir("nginx_several_processes");
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
    let dir_s = dir.display().to_string();
    let conf = dir.join("nginx.conf").display().to_string();
    let mut master = ctx.target(
        std::path::Path::new("/usr/sbin/nginx"),
        &["-p", &dir_s, "-c", &conf],
    );
    // Serving, with its two workers.
    let deadline = Instant::now() + Duration::from_secs(20);
    let workers = loop {
        let workers = weft::inspect::children_running_the_same_program(master.pid as i32);
        if workers.len() == 2 && request(port, "/").is_ok() {
            break workers;
        }
        if Instant::now() > deadline {
            ctx.fail(format!(
                "nginx did not serve on 127.0.0.1:{port} with 2 workers ({workers:?}): {}",
                std::fs::read_to_string(dir.join("logs/error.log")).unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
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
    for i in 0..REQUESTS {
        match request(port, &format!("/r{i}")) {
            Ok(body) => ctx.check(body == "served\n", || format!("request {i}: body {body:?}")),
            Err(e) => ctx.fail(format!("request {i}: {e}")),
        }
    }
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
