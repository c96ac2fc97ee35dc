//! `weft attach --serve`: a real Prometheus (Debian's `prometheus`
//! package, started here on loopback) scrapes weft for 30 s; the per-thread
//! `weft_calls_total` it stored equal the target's own counts, and
//! `promtool check metrics` accepts the exposition.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};
use support::*;

/// A port free on loopback now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// GET `path` from 127.0.0.1:`port` (HTTP/1.0): (status line, headers, body).
fn get(port: u16, path: &str, accept: Option<&str>) -> std::io::Result<(String, String, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n{accept}Connection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let raw = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    Ok((status.to_string(), headers.to_string(), body.to_string()))
}

/// The `http://127.0.0.1:PORT/metrics` weft printed: PORT.
fn served_port(ctx: &Ctx, w: &mut Proc) -> u16 {
    let line = w.expect_line(Stream::Stderr, "serving line", |l| {
        l.contains("serving metrics at")
    });
    line.rsplit("127.0.0.1:")
        .next()
        .and_then(|rest| rest.split('/').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| ctx.fail(format!("no port in {line:?}")))
}

#[test]
fn a_real_prometheus_stores_each_threads_counts_as_the_target_counts_them() {
    let ctx = Ctx::new("a_real_prometheus_stores_each_threads_counts_as_the_target_counts_them");
    let _turn = one_at_a_time();
    for tool in ["prometheus", "promtool"] {
        ctx.check(Command::new(tool).arg("--version").output().is_ok(), || {
            format!(
                "`{tool}` is not installed (Debian package `prometheus`; scripts/test installs it)"
            )
        });
    }
    let mut t = ctx.target(workers_c(), &["--threads", "3", "--phases", "2"]);
    t.expect_stdout("ready", |l| l.starts_with("ready"));
    let pid = t.pid_str();
    let mut w = ctx.weft(&[
        "attach",
        "-p",
        &pid,
        "-f",
        "work_a,work_b,lib_work",
        "-m",
        "calls,wall",
        "--histogram",
        "--serve",
        ":0",
        "--format",
        "json",
    ]);
    let port = served_port(&ctx, &mut w);

    // The exposition itself: Prometheus text by default, OpenMetrics when
    // asked, both accepted by promtool; anything else is 404.
    let (status, headers, body) =
        get(port, "/metrics", None).unwrap_or_else(|e| ctx.fail(format!("GET /metrics: {e}")));
    ctx.check(status.contains("200"), || format!("{status}\n{body}"));
    ctx.check(headers.contains("text/plain; version=0.0.4"), || {
        headers.clone()
    });
    ctx.check(body.contains("weft_up 1"), || body.clone());
    let dir = scratch_dir("serve_prometheus");
    let check = |text: &str, what: &str| {
        let file = dir.join(format!("{what}.txt"));
        std::fs::write(&file, text).expect("writing the exposition");
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("promtool check metrics < {}", file.display()))
            .output()
            .expect("promtool runs");
        ctx.check(out.status.success(), || {
            format!(
                "promtool check metrics rejected the {what} exposition:\n{}{}\n{text}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
    };
    check(&body, "prometheus-text");
    let (_, om_headers, om) = get(port, "/metrics", Some("application/openmetrics-text"))
        .unwrap_or_else(|e| ctx.fail(format!("GET /metrics (OpenMetrics): {e}")));
    ctx.check(om_headers.contains("application/openmetrics-text"), || {
        om_headers.clone()
    });
    ctx.check(om.trim_end().ends_with("# EOF"), || om.clone());
    let (status, _, _) = get(port, "/nothing", None).unwrap_or_else(|e| ctx.fail(format!("{e}")));
    ctx.check(status.contains("404"), || status.clone());

    // Prometheus scrapes every second, for 30 s; the target works meanwhile.
    let prom_port = free_port();
    std::fs::write(
        dir.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n  - job_name: weft\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
        ),
    )
    .expect("writing prometheus.yml");
    let mut prom_cmd = Command::new("prometheus");
    prom_cmd.args([
        &format!("--config.file={}", dir.join("prometheus.yml").display()),
        &format!("--storage.tsdb.path={}", dir.join("data").display()),
        &format!("--web.listen-address=127.0.0.1:{prom_port}"),
        "--log.level=warn",
    ]);
    let _prometheus = ctx.spawn("prometheus", prom_cmd, false);
    let scraping = Instant::now();
    t.send("go");
    t.expect_stdout("phase 1 done", |l| l == "phase 1 done");
    let own = check_worker_phase(&ctx, &t.stdout_text(), 1, 3);
    while scraping.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(200));
    }

    // What Prometheus stored, per thread and function, against the
    // target's own counts.
    let query = |q: &str| -> serde_json::Value {
        let (status, _, body) = get(prom_port, &format!("/api/v1/query?query={q}"), None)
            .unwrap_or_else(|e| ctx.fail(format!("querying Prometheus: {e}")));
        ctx.check(status.contains("200"), || format!("{status}\n{body}"));
        serde_json::from_str(&body).unwrap_or_else(|e| ctx.fail(format!("{e}: {body}")))
    };
    let up = query("up");
    ctx.check(up["data"]["result"][0]["value"][1] == "1", || {
        format!("Prometheus could not scrape weft: {up}")
    });
    let scrapes = query("weft_scrapes_total");
    let n: f64 = scrapes["data"]["result"][0]["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    ctx.check(n >= 20.0, || format!("only {n} scrapes in 30 s: {scrapes}"));
    let stored = query("weft_calls_total");
    let results = stored["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for line in &own {
        for f in WORKER_FUNCS {
            let found = results.iter().find(|r| {
                r["metric"]["tid"] == line.tid.to_string().as_str() && r["metric"]["function"] == f
            });
            let value: Option<u64> = found
                .and_then(|r| r["value"][1].as_str())
                .and_then(|v| v.parse().ok());
            ctx.check(value == Some(line.count(f)), || {
                format!(
                    "thread {} ({}) {f}: Prometheus has {value:?}, the target counted {}\n{stored}",
                    line.tid,
                    line.name,
                    line.count(f)
                )
            });
            ctx.check(
                found.is_some_and(|r| r["metric"]["thread"] == line.name.as_str()),
                || format!("thread name of {}: {found:?}", line.tid),
            );
        }
    }
    // The latency histogram is there for each function, counting every
    // outermost call (work_* are leaves: every call).
    let hist = query("weft_call_duration_seconds_count");
    for f in WORKER_FUNCS {
        let want: u64 = own.iter().map(|l| l.count(f)).sum();
        let got: Option<u64> = hist["data"]["result"]
            .as_array()
            .and_then(|a| a.iter().find(|r| r["metric"]["function"] == f))
            .and_then(|r| r["value"][1].as_str())
            .and_then(|v| v.parse().ok());
        ctx.check(got == Some(want), || {
            format!("{f}: histogram count {got:?}, {want} calls\n{hist}")
        });
    }

    // SIGTERM: weft detaches cleanly, its final report agrees, and the
    // target works on, uninstrumented.
    w.signal(nix::sys::signal::Signal::SIGTERM);
    w.wait_code(0);
    let report = parse_report(&ctx, &w.stdout_text());
    for line in &own {
        for f in WORKER_FUNCS {
            let c = report.counts(line.tid, f).calls;
            ctx.check(c == line.count(f), || {
                format!(
                    "final report: thread {} {f} {c}, target {}",
                    line.tid,
                    line.count(f)
                )
            });
        }
    }
    ctx.check(get(port, "/metrics", None).is_err(), || {
        "weft still serves after detaching".into()
    });
    t.send("go");
    t.expect_stdout("phase 2 done", |l| l == "phase 2 done");
    check_worker_phase(&ctx, &t.stdout_text(), 2, 3);
    t.wait_code(0);
}

#[test]
fn serving_beyond_loopback_must_be_asked_for() {
    let ctx = Ctx::new("serving_beyond_loopback_must_be_asked_for");
    let _turn = one_at_a_time();
    let mut t = ctx.target(workers_c(), &["--threads", "1"]);
    t.expect_stdout("ready", |l| l.starts_with("ready"));
    let mut w = ctx.weft(&[
        "attach",
        "-p",
        &t.pid_str(),
        "-f",
        "work_a",
        "--serve",
        "0.0.0.0:0",
    ]);
    w.wait_code(1);
    let err = w.stderr_text();
    ctx.check(err.contains("--serve-public"), || err.clone());
    ctx.check(!err.contains("attached"), || {
        "weft attached before refusing the address".into()
    });
    t.send("quit");
    t.wait_exit();
}

/// A production agent counts a function and serves /metrics; an engineer
/// runs `weft top` on the same function with timers (its own probe over
/// the agent's), then quits. top's table shows the calls of its window with
/// wall time; the agent's per-thread counts stay the target's own through
/// top's arrival and departure.
#[test]
fn an_agent_serving_counts_and_top_timing_the_same_function_are_both_exact() {
    let ctx = Ctx::new("an_agent_serving_counts_and_top_timing_the_same_function_are_both_exact");
    let _turn = one_at_a_time();
    let mut t = ctx.target(workers_c(), &["--threads", "3", "--phases", "4"]);
    t.expect_stdout("ready", |l| l.starts_with("ready"));
    let pid = t.pid_str();
    let mut agent = ctx.weft(&[
        "attach", "-p", &pid, "-f", "work_a", "-m", "calls", "--serve", ":0",
    ]);
    let port = served_port(&ctx, &mut agent);
    let phase = |t: &mut Proc, p: u64| {
        t.send("go");
        t.expect_stdout("phase done", |l| l == format!("phase {p} done"));
        check_worker_phase(&ctx, &t.stdout_text(), p, 3)
    };
    phase(&mut t, 1);
    let mut top = ctx.weft(&[
        "top",
        "-p",
        &pid,
        "-f",
        "work_a",
        "-m",
        "calls,wall,cpu",
        "--interval",
        "0.2",
    ]);
    top.expect_line(Stream::Stderr, "attached", |l| l.contains("attached"));
    let during: u64 = phase(&mut t, 2).iter().map(|l| l.work_a).sum();
    // A table after the phase holds its calls, timed.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !top.stdout_text().contains(&thousands(during)) {
        ctx.check(Instant::now() < deadline, || {
            format!(
                "top shows no table with the {during} calls of work_a made while it ran:\n{}\n{}",
                top.stdout_text(),
                top.stderr_text()
            )
        });
        std::thread::sleep(Duration::from_millis(100));
    }
    let table = top.stdout_text();
    let row = table
        .lines()
        .rev()
        .find(|l| l.starts_with("total") && l.contains(&thousands(during)))
        .unwrap_or_default()
        .to_string();
    ctx.check(
        row.contains("µs") || row.contains("ns") || row.contains("ms"),
        || format!("top's total row of work_a has no time in it: {row:?}\n{table}"),
    );
    top.signal(nix::sys::signal::Signal::SIGTERM);
    top.wait_code(0);
    phase(&mut t, 3);
    // The agent: every thread's calls of phases 1 to 3, as the target
    // counted them.
    let (_, _, body) =
        get(port, "/metrics", None).unwrap_or_else(|e| ctx.fail(format!("GET /metrics: {e}")));
    let lines = worker_lines(&ctx, &t.stdout_text());
    for tid in lines
        .iter()
        .map(|l| l.tid)
        .collect::<std::collections::BTreeSet<_>>()
    {
        let want: u64 = lines
            .iter()
            .filter(|l| l.tid == tid)
            .map(|l| l.work_a)
            .sum();
        let key = format!("function=\"work_a\",module=\"workers\",tid=\"{tid}\"");
        let got: u64 = body
            .lines()
            .filter(|l| l.starts_with("weft_calls_total{") && l.contains(&key))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|v| v as u64)
            .sum();
        ctx.check(got == want, || {
            format!("the agent counts {got} calls of work_a in tid {tid}, the target made {want}:\n{body}")
        });
    }
    agent.signal(nix::sys::signal::Signal::SIGINT);
    agent.wait_code(0);
    phase(&mut t, 4);
    t.wait_code(0);
}

/// `weft_calls_total` of `function` summed over the series whose labels
/// include `pid="PID"`.
fn calls_of(body: &str, function: &str, pid: &str) -> u64 {
    body.lines()
        .filter(|l| l.starts_with("weft_calls_total{"))
        .filter(|l| {
            l.contains(&format!("function=\"{function}\"")) && l.contains(&format!("pid=\"{pid}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// One weft serving several processes: each one's series under its `pid`
/// label, each equal to what that process made; a process that exits
/// folds into `pid="exited"` (with `--fold-after 0`), its counts kept;
/// `promtool` accepts the exposition.
#[test]
fn several_processes_served_each_under_its_pid() {
    let ctx = Ctx::new("several_processes_served_each_under_its_pid");
    let _turn = one_at_a_time();
    let mut a = ctx.target(workers_c(), &["--threads", "2", "--phases", "2"]);
    let mut b = ctx.target(workers_c(), &["--threads", "3", "--phases", "1"]);
    for t in [&mut a, &mut b] {
        t.expect_stdout("ready", |l| l.starts_with("ready"));
    }
    let list = format!("{},{}", a.pid, b.pid);
    let mut w = ctx.weft(&[
        "attach",
        "-p",
        &list,
        "-f",
        "work_a",
        "--serve",
        ":0",
        "--fold-after",
        "0",
        "--format",
        "json",
    ]);
    let port = served_port(&ctx, &mut w);
    for t in [&mut a, &mut b] {
        t.send("go");
        t.expect_stdout("phase done", |l| l == "phase 1 done");
    }
    let own = |t: &Proc| -> u64 {
        worker_lines(&ctx, &t.stdout_text())
            .iter()
            .map(|l| l.work_a)
            .sum()
    };
    // b's workers end with its only phase: it exits.
    b.expect_stdout("`done`", |l| l == "done");
    b.wait_code(0);
    let (_, _, body) = get(port, "/metrics", None).unwrap_or_else(|e| ctx.fail(format!("{e}")));
    let (ga, gb, gx) = (
        calls_of(&body, "work_a", &a.pid_str()),
        calls_of(&body, "work_a", &b.pid_str()),
        calls_of(&body, "work_a", "exited"),
    );
    ctx.check(ga == own(&a) && gb == 0 && gx == own(&b), || {
        format!(
            "pid {} {ga} calls (made {}), pid {} {gb} (exited: folded), exited {gx} (made {}):\n{body}",
            a.pid,
            own(&a),
            b.pid,
            own(&b)
        )
    });
    let dir = scratch_dir("serve_several");
    let file = dir.join("metrics.txt");
    std::fs::write(&file, &body).unwrap();
    // promtool: Debian's `prometheus` package, which .ci/run installs.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("promtool check metrics < {}", file.display()))
        .output()
        .expect("sh runs");
    ctx.check(out.status.success(), || {
        format!("promtool: {}{}", String::from_utf8_lossy(&out.stderr), body)
    });
    w.signal(nix::sys::signal::Signal::SIGINT);
    w.wait_code(0);
    a.send("go");
    a.expect_stdout("`done`", |l| l == "done");
    a.wait_code(0);
}
