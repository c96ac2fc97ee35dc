//! Overlapping weft sessions on a real server: Debian's memcached (package
//! `memcached`, which `scripts/test` installs; the tests fail, not skip,
//! without it). Each test starts its own memcached on loopback
//! (`-l 127.0.0.1 -p PORT -t 4 -U 0`), drives a bounded load from its own
//! client threads over the text protocol, and kills the server by its PID at
//! the end.
//!
//! # Ground truth
//!
//! The instrumented functions are libc functions whose calls in memcached
//! follow exactly from the commands sent (memcached 1.6, `memcached.c` and
//! `proto_text.c`); the binary is stripped, so its own functions have no
//! names. A unit of load on a connection is `set k`, `get k` (a hit) and
//! `get` of a key never set (a miss); the client sends each command with one
//! `write` and reads the whole reply before sending the next, so memcached
//! sees every command in one segment and never batches replies:
//!
//! | function  | calls per unit | why |
//! |-----------|---------------:|-----|
//! | `sendmsg` | 3 | one reply per command, sent by one `sendmsg` (`transmit`) |
//! | `read`    | 3 | one `read` per command (`try_read_network`; the `set` data came in the same segment) |
//! | `strtol`  | 2 | `set`: `safe_strtol` of the expiry and of the length |
//! | `strtoul` | 1 | `set`: `safe_strtoul` of the flags |
//!
//! Nothing else in memcached calls them while the load is idle (its other
//! threads sleep, its main thread's clock tick calls none of them), and the
//! connections are opened (and each has served a `version`) before any
//! session, so that no `accept`/hand-over work falls into a window.
//!
//! Per thread: memcached hands each connection to one worker thread for its
//! whole life (round robin), so a worker's calls are the calls of the
//! connections it serves. The four connections do 17, 18, 20 and 24 units
//! (16 + 2^i) per round, so any sum of them tells which ones it is made of.
//! Each test first learns which worker serves which connection from a
//! calibration session alone on `sendmsg` (its total must be exact and every
//! worker's count must decompose), then checks every later report *per
//! thread* against that: each worker thread once, named `mc-worker`, with
//! exactly the calls of its connections in the session's window; every other
//! thread with none; `functions[]` totals exact. A thread counted twice (two
//! sessions' probes stacked on one function) or a call lost fails this.
//!
//! `epoll_wait` is used as a timed function that every worker is blocked in
//! (activations open when a weft is killed or detaches); its count is not
//! determined exactly (libevent's loop), so for it the reports are only
//! checked against bounds that a double count breaks.
//!
//! After every test, memcached must still serve every key ever stored with
//! its value, its own `stats` must show exactly the commands the test sent,
//! and no thread of it may be traced or stopped.

use crate::support;

use nix::sys::signal::Signal;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use support::*;

/// Worker threads of memcached (`-t`), and client connections (one per
/// client thread).
const WORKERS: usize = 4;
/// Units per connection per round at multiplier 1: 16 + 2^i, so that a sum
/// over any set of connections names the set (16·|set| + bitmask).
const UNITS: [u64; WORKERS] = [17, 18, 20, 24];
/// The functions whose counts are exact.
const EXACT: [&str; 4] = ["sendmsg", "read", "strtol", "strtoul"];
/// A function every worker is blocked in.
const BLOCKING: &str = "epoll_wait";
/// Name memcached gives its worker threads.
const WORKER_NAME: &str = "mc-worker";
/// Bound on the units of a background load (it stops when told, sooner).
const BACKGROUND_MAX_UNITS: u64 = 20_000;

/// Calls of `f` per unit of load.
fn per_unit(f: &str) -> u64 {
    match f {
        "sendmsg" | "read" => 3,
        "strtol" => 2,
        "strtoul" => 1,
        _ => panic!("{f} has no exact count"),
    }
}

/// Commands per unit (what a worker's `epoll_wait` wakes up for).
const COMMANDS_PER_UNIT: u64 = 3;

/// Units done per connection during some window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Tally([u64; WORKERS]);

impl Tally {
    fn add(&mut self, other: Tally) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }
    fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

/// Our memcached and the test's connections to it.
struct Memcached {
    ctx: Ctx,
    server: Proc,
    pid: u32,
    conns: Vec<TcpStream>,
    rounds: u64,
    /// Every key set so far, with its value (all must still be served).
    stored: Vec<(String, String)>,
    /// Commands sent, to compare with memcached's own `stats`.
    sets: u64,
    hits: u64,
    misses: u64,
    /// The worker thread serving each connection (learned by `calibrate`).
    worker_of: [i64; WORKERS],
}

fn memcached_version() -> Result<String, String> {
    let out = Command::new("memcached")
        .arg("-V")
        .output()
        .map_err(|e| format!("cannot run `memcached -V`: {e}"))?;
    let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() && v.starts_with("memcached ") {
        Ok(v)
    } else {
        Err(format!("`memcached -V` printed {v:?} ({:?})", out.status))
    }
}

/// Whether this test runs as root (the owner of /proc/self is the
/// effective user).
/// Sends `req` with one write and reads the reply, which must be `want`
/// byte for byte (fails as soon as it diverges).
fn exchange(s: &mut TcpStream, req: &[u8], want: &[u8]) -> Result<(), String> {
    s.write_all(req)
        .map_err(|e| format!("sending {:?}: {e}", String::from_utf8_lossy(req)))?;
    let mut got = Vec::with_capacity(want.len());
    let mut buf = [0u8; 4096];
    while got.len() < want.len() {
        let n = s.read(&mut buf).map_err(|e| {
            format!(
                "reading the reply to {:?} (got {:?} so far): {e}",
                String::from_utf8_lossy(req),
                String::from_utf8_lossy(&got)
            )
        })?;
        if n == 0 {
            return Err(format!(
                "memcached closed the connection after {:?} in reply to {:?}",
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(req)
            ));
        }
        got.extend_from_slice(&buf[..n]);
        if !want.starts_with(&got) {
            return Err(format!(
                "memcached replied {:?} to {:?}, expected {:?}",
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(req),
                String::from_utf8_lossy(want)
            ));
        }
    }
    Ok(())
}

/// One unit on `s`: set, get (hit), get (miss). Returns the key and value.
fn unit(s: &mut TcpStream, tag: &str, conn: usize, n: u64) -> Result<(String, String), String> {
    let key = format!("{tag}c{conn}u{n}");
    // Values of varying length and content.
    let value = format!("{key}-{}", "v".repeat((n % 23) as usize));
    let set = format!("set {key} 0 0 {}\r\n{value}\r\n", value.len());
    exchange(s, set.as_bytes(), b"STORED\r\n")?;
    let want = format!("VALUE {key} 0 {}\r\n{value}\r\nEND\r\n", value.len());
    exchange(s, format!("get {key}\r\n").as_bytes(), want.as_bytes())?;
    exchange(s, format!("get miss-{key}\r\n").as_bytes(), b"END\r\n")?;
    Ok((key, value))
}

impl Memcached {
    /// Starts memcached on a free loopback port and opens the connections.
    fn start(ctx: &Ctx) -> Memcached {
        let version = memcached_version().unwrap_or_else(|e| {
            ctx.fail(format!(
                "memcached is needed by these tests and is not usable ({e}); \
                 install Debian's package: apt-get install memcached"
            ))
        });
        for _attempt in 0..5 {
            let port = free_port();
            let mut cmd = Command::new("memcached");
            cmd.args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0"])
                .args(["-t", &WORKERS.to_string()]);
            // memcached refuses to run as root without `-u`.
            if running_as_root() {
                cmd.args(["-u", "root"]);
            }
            let mut server = ctx.spawn(&format!("{version} on port {port}"), cmd, false);
            // Connect only once memcached itself listens on the port: a
            // connect before could reach whatever else holds the port then
            // (or the socket itself, a TCP self-connect).
            let deadline = Instant::now() + Duration::from_secs(20);
            let listening = loop {
                if !server.is_running() {
                    break false; // the port was taken meanwhile: try another
                }
                if listens_on(server.pid, port) {
                    break true;
                }
                if Instant::now() > deadline {
                    ctx.fail(format!("memcached does not listen on port {port}"));
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            if !listening {
                server.wait_exit();
                continue;
            }
            let pid = server.pid;
            let conns: Vec<TcpStream> = (0..WORKERS)
                .map(|_| {
                    TcpStream::connect(("127.0.0.1", port))
                        .unwrap_or_else(|e| ctx.fail(format!("connecting to memcached: {e}")))
                })
                .collect();
            let mut conns = conns;
            for s in &mut conns {
                s.set_nodelay(true).expect("TCP_NODELAY");
                s.set_read_timeout(Some(Duration::from_secs(30)))
                    .expect("read timeout");
                s.set_write_timeout(Some(Duration::from_secs(30)))
                    .expect("write timeout");
                // The worker owns the connection once it has answered.
                let v = version.trim_start_matches("memcached ");
                exchange(s, b"version\r\n", format!("VERSION {v}\r\n").as_bytes())
                    .unwrap_or_else(|e| ctx.fail(format!("port {port}: {e}")));
            }
            return Memcached {
                ctx: ctx.clone(),
                server,
                pid,
                conns,
                rounds: 0,
                stored: Vec::new(),
                sets: 0,
                hits: 0,
                misses: 0,
                worker_of: [0; WORKERS],
            };
        }
        ctx.fail("memcached could not listen on a free port in 5 attempts")
    }

    /// One bounded round: connection i does `mult · UNITS[i]` units, all
    /// connections at once (one client thread each). Every reply checked.
    fn round(&mut self, mult: u64) -> Tally {
        self.rounds += 1;
        let tag = format!("r{}", self.rounds);
        let results: Vec<Result<Vec<(String, String)>, String>> = std::thread::scope(|sc| {
            let handles: Vec<_> = self
                .conns
                .iter_mut()
                .enumerate()
                .map(|(i, s)| {
                    let tag = &tag;
                    sc.spawn(move || {
                        (0..mult * UNITS[i])
                            .map(|n| unit(s, tag, i, n))
                            .collect::<Result<Vec<_>, String>>()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut tally = Tally::default();
        for (i, r) in results.into_iter().enumerate() {
            let kv =
                r.unwrap_or_else(|e| self.ctx.fail(format!("round {tag}, connection {i}: {e}")));
            tally.0[i] = kv.len() as u64;
            self.count_units(kv);
        }
        self.settle();
        tally
    }

    /// Waits until every worker thread is back in `epoll_wait` (the system
    /// call). The client has every reply once memcached's `sendmsg` queued
    /// it, possibly before `sendmsg` returned: without this, a session
    /// detached right after a round may find a worker still inside it (an
    /// activation open, rightly not counted as an exit).
    fn settle(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let tasks = format!("/proc/{}/task", self.pid);
        loop {
            let busy: Vec<String> = std::fs::read_dir(&tasks)
                .unwrap_or_else(|e| self.ctx.fail(format!("listing {tasks}: {e}")))
                .flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim_end() == WORKER_NAME)
                })
                .filter_map(|t| {
                    let sc = std::fs::read_to_string(t.path().join("syscall")).unwrap_or_default();
                    // epoll_wait, epoll_pwait, epoll_pwait2 (x86-64).
                    let nr = sc.split_whitespace().next().unwrap_or("");
                    (!["232", "281", "441"].contains(&nr))
                        .then(|| format!("{:?}: {}", t.file_name(), sc.trim_end()))
                })
                .collect();
            if busy.is_empty() {
                return;
            }
            if Instant::now() > deadline {
                self.ctx.fail(format!(
                    "memcached's workers are not back in epoll_wait after the load: {busy:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Load on every connection around `during`: it runs once every
    /// connection has done some units, and the load goes on until every
    /// connection has done some more after it (at most BACKGROUND_MAX_UNITS
    /// units per connection). Every reply checked.
    fn load_during(&mut self, during: impl FnOnce()) {
        self.rounds += 1;
        let tag = format!("bg{}", self.rounds);
        let stop = AtomicBool::new(false);
        let done: [AtomicU64; WORKERS] = Default::default();
        let ctx = self.ctx.clone();
        // Waits until every connection did `n` units (or one gave up).
        let wait_for = |n: [u64; WORKERS], what: &str| {
            let deadline = Instant::now() + Duration::from_secs(20);
            while (0..WORKERS).any(|i| done[i].load(Ordering::Relaxed) < n[i]) {
                if stop.load(Ordering::Relaxed) {
                    return; // a client failed: its error is reported below
                }
                if Instant::now() > deadline {
                    stop.store(true, Ordering::Relaxed);
                    ctx.fail(format!("background load: no progress {what}: {done:?}"));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        let results: Vec<Result<Vec<(String, String)>, String>> = std::thread::scope(|sc| {
            let handles: Vec<_> = self
                .conns
                .iter_mut()
                .enumerate()
                .map(|(i, s)| {
                    let (tag, stop, done) = (&tag, &stop, &done);
                    sc.spawn(move || {
                        let mut kv = Vec::new();
                        for n in 0..BACKGROUND_MAX_UNITS {
                            if stop.load(Ordering::Relaxed) {
                                break;
                            }
                            match unit(s, tag, i, n) {
                                Ok(x) => kv.push(x),
                                Err(e) => {
                                    stop.store(true, Ordering::Relaxed);
                                    return Err(e);
                                }
                            }
                            done[i].fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(kv)
                    })
                })
                .collect();
            wait_for([20; WORKERS], "before");
            during();
            let now: [u64; WORKERS] = std::array::from_fn(|i| done[i].load(Ordering::Relaxed) + 20);
            wait_for(now, "after");
            stop.store(true, Ordering::Relaxed);
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (i, r) in results.into_iter().enumerate() {
            let kv = r.unwrap_or_else(|e| {
                self.ctx
                    .fail(format!("background load, connection {i}: {e}"))
            });
            self.count_units(kv);
        }
        self.settle();
    }

    fn count_units(&mut self, kv: Vec<(String, String)>) {
        let n = kv.len() as u64;
        self.sets += n;
        self.hits += n;
        self.misses += n;
        self.stored.extend(kv);
    }

    /// Learns which worker serves which connection from a session alone on
    /// `sendmsg`; checks its total against the load, and that every
    /// thread's count is the count of a set of connections (each once).
    fn calibrate(&mut self) {
        let ctx = self.ctx.clone();
        let mut s = Session::attach(self, &["sendmsg"], "calls");
        let tally = self.round(1);
        let report = s.detach();
        let show = || format!("calibration report: {report:#?}");
        let total = report.function("sendmsg").map_or(0, |f| f.calls);
        ctx.check(total == per_unit("sendmsg") * tally.total(), || {
            format!(
                "calibration: weft counted {total} sendmsg calls, memcached made {} \
                 (3 per unit, units {tally:?})\n{}",
                per_unit("sendmsg") * tally.total(),
                show()
            )
        });
        let mut seen = 0u64;
        for t in &report.threads {
            let c = t.functions.get("sendmsg").map_or(0, |c| c.calls);
            if c == 0 {
                continue;
            }
            ctx.check(t.name == WORKER_NAME, || {
                format!("thread {} ({}) sent replies\n{}", t.tid, t.name, show())
            });
            let units = c / per_unit("sendmsg");
            let (k, mask) = (units / 16, units % 16);
            ctx.check(
                c % per_unit("sendmsg") == 0
                    && mask != 0
                    && u64::from(mask.count_ones()) == k
                    && mask & seen == 0,
                || {
                    format!(
                        "tid {}: {c} sendmsg calls is not 3 × the units of a set of \
                         connections not served by another thread ({UNITS:?})\n{}",
                        t.tid,
                        show()
                    )
                },
            );
            seen |= mask;
            for (i, w) in self.worker_of.iter_mut().enumerate() {
                if mask & 1 << i != 0 {
                    *w = t.tid;
                }
            }
        }
        ctx.check(seen == (1 << WORKERS) - 1, || {
            format!("calibration: connections {seen:#b} found\n{}", show())
        });
        self.check(&report, &s.funcs, tally);
    }

    /// Expected per-thread counts of `funcs` for a window with `tally`.
    fn expected(&self, funcs: &[&str], tally: Tally) -> BTreeMap<i64, ExpThread> {
        let mut m: BTreeMap<i64, ExpThread> = BTreeMap::new();
        for (i, &tid) in self.worker_of.iter().enumerate() {
            let e = m.entry(tid).or_default();
            e.name = WORKER_NAME.to_string();
            for f in funcs.iter().filter(|f| EXACT.contains(f)) {
                *e.calls.entry(f.to_string()).or_default() += per_unit(f) * tally.0[i];
            }
        }
        m
    }

    /// Checks a report of a session that ended with SIGINT after a window
    /// with `tally`: exact per thread for the exact functions, bounds for
    /// `epoll_wait`, timers consistent, no activation of an exact function
    /// left open (every worker was back in epoll_wait at detach).
    #[track_caller]
    fn check(&self, report: &Report, funcs: &[&'static str], tally: Tally) {
        let ctx = &self.ctx;
        ctx.check(report.pid == i64::from(self.pid), || {
            format!("report for pid {}, expected {}", report.pid, self.pid)
        });
        let exact: Vec<&str> = funcs
            .iter()
            .copied()
            .filter(|f| EXACT.contains(f))
            .collect();
        check_report_counts(ctx, report, &self.expected(&exact, tally), &exact);
        check_timer_totals(ctx, report);
        for t in &report.threads {
            for f in &exact {
                let Some(c) = t.functions.get(*f) else {
                    continue;
                };
                if let (Some(e), Some(u), Some(h)) = (c.exits, c.unwound, c.unhooked) {
                    ctx.check(e == c.calls && u == 0 && h == 0, || {
                        format!(
                            "tid {} {f}: calls {} but exits {e}, unwound {u}, unhooked {h} \
                             (every worker was in epoll_wait at detach)\nreport: {report:#?}",
                            t.tid, c.calls
                        )
                    });
                }
            }
        }
        if funcs.contains(&BLOCKING) {
            self.check_blocking(report, tally);
        }
    }

    /// `epoll_wait`: a worker is woken once for each command of a connection
    /// (the client waits for every reply), then waits again: at least as
    /// many entries as the commands of its busiest connection. It also
    /// enters again after every stop of the world (any weft's attach or
    /// detach), since a stop makes a blocked `epoll_wait` fail with EINTR
    /// (signal(7)): a few more than the commands, never twice as many
    /// (which a double count would show). Threads other than the workers
    /// and the main thread (a 1 s clock tick) never call it.
    #[track_caller]
    fn check_blocking(&self, report: &Report, tally: Tally) {
        let ctx = &self.ctx;
        let total = report.function(BLOCKING).map_or(0, |f| f.calls);
        let sum: u64 = report
            .threads
            .iter()
            .filter_map(|t| t.functions.get(BLOCKING))
            .map(|c| c.calls)
            .sum();
        ctx.check(total == sum, || {
            format!("{BLOCKING}: functions[] says {total}, the threads sum to {sum}\n{report:#?}")
        });
        let workers: BTreeSet<i64> = self.worker_of.iter().copied().collect();
        for &tid in &workers {
            let calls = report.counts(tid, BLOCKING).calls;
            let per_conn = (0..WORKERS)
                .filter(|&i| self.worker_of[i] == tid)
                .map(|i| COMMANDS_PER_UNIT * tally.0[i]);
            let (busiest, commands) = (per_conn.clone().max().unwrap_or(0), per_conn.sum::<u64>());
            ctx.check(calls >= busiest && calls < 2 * commands.max(1), || {
                format!(
                    "worker {tid}: {calls} {BLOCKING} calls for {commands} commands served \
                     (its busiest connection: {busiest})\nreport: {report:#?}"
                )
            });
        }
        for t in &report.threads {
            if !workers.contains(&t.tid) && t.tid != i64::from(self.pid) {
                let calls = t.functions.get(BLOCKING).map_or(0, |c| c.calls);
                ctx.check(calls == 0, || {
                    format!(
                        "thread {} ({}) called {BLOCKING} {calls} times\n{report:#?}",
                        t.tid, t.name
                    )
                });
            }
        }
    }

    /// memcached serves every key stored so far with its value; its `stats`
    /// count exactly the commands sent; no thread of it is traced or stopped.
    fn check_healthy(&mut self) {
        let ctx = self.ctx.clone();
        ctx.check(self.server.is_running(), || "memcached died".into());
        let stored = std::mem::take(&mut self.stored);
        let results: Vec<Result<(), String>> = std::thread::scope(|sc| {
            let handles: Vec<_> = self
                .conns
                .iter_mut()
                .enumerate()
                .map(|(i, s)| {
                    let stored = &stored;
                    sc.spawn(move || {
                        for (key, value) in stored.iter().skip(i).step_by(WORKERS) {
                            let want =
                                format!("VALUE {key} 0 {}\r\n{value}\r\nEND\r\n", value.len());
                            exchange(s, format!("get {key}\r\n").as_bytes(), want.as_bytes())?;
                        }
                        Ok(())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for r in results {
            r.unwrap_or_else(|e| ctx.fail(format!("after the sessions: {e}")));
        }
        self.hits += stored.len() as u64;
        self.stored = stored;
        let stats = self.stats();
        let want = [
            ("cmd_set", self.sets),
            ("cmd_get", self.hits + self.misses),
            ("get_hits", self.hits),
            ("get_misses", self.misses),
            ("curr_items", self.sets),
        ];
        for (name, n) in want {
            ctx.check(stats.get(name) == Some(&n), || {
                format!(
                    "memcached's stats say {name} {:?}, the test sent {n}\nstats: {stats:?}",
                    stats.get(name)
                )
            });
        }
        check_not_traced_nor_stopped(&ctx, self.pid);
    }

    /// memcached's `stats` (numeric ones).
    fn stats(&mut self) -> BTreeMap<String, u64> {
        let s = &mut self.conns[0];
        s.write_all(b"stats\r\n").expect("sending stats");
        let mut text = Vec::new();
        let mut buf = [0u8; 4096];
        while !text.ends_with(b"END\r\n") {
            let n = s.read(&mut buf).expect("reading stats");
            self.ctx
                .check(n > 0, || "memcached closed during stats".into());
            text.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&text)
            .lines()
            .filter_map(|l| {
                let mut it = l.strip_prefix("STAT ")?.split_whitespace();
                Some((it.next()?.to_string(), it.next()?.parse().ok()?))
            })
            .collect()
    }

    /// Kills memcached (by its PID) and reaps it.
    fn stop(mut self) {
        self.conns.clear();
        self.server.signal(Signal::SIGKILL);
        self.server.wait_exit();
    }
}

/// One `weft attach --format json` session on our memcached.
struct Session {
    weft: Proc,
    funcs: Vec<&'static str>,
    metrics: &'static str,
    /// Units done while it was live.
    tally: Tally,
}

impl Session {
    fn args(pid: u32, funcs: &[&str], metrics: &str) -> Vec<String> {
        let mut args: Vec<String> = vec!["attach".into(), "-p".into(), pid.to_string()];
        for f in funcs {
            args.extend(["-f".to_string(), f.to_string()]);
        }
        args.extend(["-m", metrics, "--format", "json"].map(String::from));
        args
    }

    #[track_caller]
    fn attach(mc: &Memcached, funcs: &[&'static str], metrics: &'static str) -> Session {
        let args = Session::args(mc.pid, funcs, metrics);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut weft = mc.ctx.weft(&args);
        let a = wait_attached(&mut weft);
        mc.ctx
            .check(a.pid == mc.pid && a.functions == funcs.len() as u32, || {
                format!(
                    "attached line {a:?}, expected pid {} and {} functions",
                    mc.pid,
                    funcs.len()
                )
            });
        Session {
            weft,
            funcs: funcs.to_vec(),
            metrics,
            tally: Tally::default(),
        }
    }

    /// SIGINT; the report, after checking its metric fields.
    #[track_caller]
    fn detach(&mut self) -> Report {
        let ctx = self.weft.ctx().clone();
        let report = parse_report(&ctx, &detach_with_sigint(&mut self.weft));
        let want: Vec<&str> = self.metrics.split(',').collect();
        check_metrics(&ctx, &report, &want);
        let (wall, cpu) = (want.contains(&"wall"), want.contains(&"cpu"));
        check_fields_of(
            &ctx,
            &report,
            wall,
            cpu,
            wall || cpu || want.contains(&"trace"),
        );
        report
    }

    /// SIGINT, then the checks of `Memcached::check` for its window.
    #[track_caller]
    fn detach_and_check(mut self, mc: &Memcached) {
        let report = self.detach();
        mc.check(&report, &self.funcs, self.tally);
    }

    /// SIGKILL while live.
    fn kill(mut self) {
        self.weft.signal(Signal::SIGKILL);
        let st = self.weft.wait_exit();
        let ctx = self.weft.ctx().clone();
        ctx.check(
            std::os::unix::process::ExitStatusExt::signal(&st) == Some(Signal::SIGKILL as i32),
            || format!("weft ended with {st:?} instead of being killed"),
        );
    }
}

/// Runs a round and adds it to every session in `live`.
fn round_for(mc: &mut Memcached, mult: u64, live: &mut [&mut Session]) {
    let t = mc.round(mult);
    for s in live {
        s.tally.add(t);
    }
}

/// (a) A is live on sendmsg and strtol (timed); B attaches to read and
/// strtoul; each report holds exactly the calls of its own window, and
/// memcached answered every request right.
#[test]
fn a_live_session_and_one_on_other_functions_count_their_own_windows() {
    let ctx = Ctx::new("a_live_session_and_one_on_other_functions_count_their_own_windows");
    let mut mc = Memcached::start(&ctx);
    mc.calibrate();
    let mut a = Session::attach(&mc, &["sendmsg", "strtol"], "calls,wall,cpu");
    round_for(&mut mc, 1, &mut [&mut a]);
    let mut b = Session::attach(&mc, &["read", "strtoul"], "calls,wall");
    round_for(&mut mc, 2, &mut [&mut a, &mut b]);
    b.detach_and_check(&mc);
    round_for(&mut mc, 1, &mut [&mut a]);
    a.detach_and_check(&mc);
    // Nothing of either left: a last session alone is exact.
    let mut c = Session::attach(&mc, &EXACT, "calls");
    round_for(&mut mc, 1, &mut [&mut c]);
    c.detach_and_check(&mc);
    mc.check_healthy();
    mc.stop();
}

/// (b) A and B on the same function: B shares A's timed probe on sendmsg
/// with fewer metrics (and has its own on strtoul); A leaves first, B's
/// share outlives it; both exact; then nothing is left in place.
#[test]
fn two_sessions_on_the_same_function_both_count_exactly() {
    let ctx = Ctx::new("two_sessions_on_the_same_function_both_count_exactly");
    let mut mc = Memcached::start(&ctx);
    mc.calibrate();
    let mut a = Session::attach(&mc, &["sendmsg", "strtol"], "calls,wall,cpu");
    round_for(&mut mc, 1, &mut [&mut a]);
    let mut b = Session::attach(&mc, &["sendmsg", "strtoul"], "calls,wall");
    round_for(&mut mc, 2, &mut [&mut a, &mut b]);
    // A third on the very same functions as A, counting only.
    let mut c = Session::attach(&mc, &["sendmsg", "strtol"], "calls");
    round_for(&mut mc, 1, &mut [&mut a, &mut b, &mut c]);
    a.detach_and_check(&mc);
    round_for(&mut mc, 1, &mut [&mut b, &mut c]);
    c.detach_and_check(&mc);
    round_for(&mut mc, 2, &mut [&mut b]);
    b.detach_and_check(&mc);
    let mut d = Session::attach(&mc, &["sendmsg", "strtol", "strtoul"], "calls,wall,cpu");
    round_for(&mut mc, 1, &mut [&mut d]);
    d.detach_and_check(&mc);
    mc.check_healthy();
    mc.stop();
}

/// (c) A is SIGKILLed live, with counters and timers, while memcached
/// serves a load and every worker is blocked in A's timed epoll_wait: the
/// load's replies stay right; B on other functions is exact; C on A's
/// functions counts every call once (A's probes were taken out, not
/// stacked on).
#[test]
fn a_session_killed_live_harms_nothing_and_is_not_counted_twice() {
    let ctx = Ctx::new("a_session_killed_live_harms_nothing_and_is_not_counted_twice");
    let mut mc = Memcached::start(&ctx);
    mc.calibrate();
    let a_funcs = ["sendmsg", "strtol", BLOCKING];
    let mut a = Session::attach(&mc, &a_funcs, "calls,wall,cpu");
    round_for(&mut mc, 1, &mut [&mut a]);
    mc.load_during(|| a.kill());
    // A's probes, orphaned, still count: harmless.
    mc.round(1);
    let mut b = Session::attach(&mc, &["read", "strtoul"], "calls,wall");
    round_for(&mut mc, 2, &mut [&mut b]);
    b.detach_and_check(&mc);
    let mut c = Session::attach(&mc, &a_funcs, "calls,wall,cpu");
    round_for(&mut mc, 1, &mut [&mut c]);
    c.detach_and_check(&mc);
    mc.round(1);
    mc.check_healthy();
    mc.stop();
}

/// (e) Several tools on one function, each with the metrics it asks: A
/// counts sendmsg; B times it (its own probe over A's, which measures
/// less); B leaves; C traces it; A leaves; each exact per thread for its
/// window, and nothing is left in place.
#[test]
fn several_tools_on_one_function_each_count_exactly() {
    let ctx = Ctx::new("several_tools_on_one_function_each_count_exactly");
    let mut mc = Memcached::start(&ctx);
    mc.calibrate();
    let mut a = Session::attach(&mc, &["sendmsg"], "calls");
    round_for(&mut mc, 1, &mut [&mut a]);
    let mut b = Session::attach(&mc, &["sendmsg", "strtol"], "calls,wall,cpu");
    round_for(&mut mc, 2, &mut [&mut a, &mut b]);
    b.detach_and_check(&mc);
    round_for(&mut mc, 1, &mut [&mut a]);
    let mut c = Session::attach(&mc, &["sendmsg"], "calls,trace");
    round_for(&mut mc, 1, &mut [&mut a, &mut c]);
    // D times it over C's, then A leaves from under both.
    let mut d = Session::attach(&mc, &["sendmsg"], "calls,wall");
    round_for(&mut mc, 1, &mut [&mut a, &mut c, &mut d]);
    a.detach_and_check(&mc);
    round_for(&mut mc, 1, &mut [&mut c, &mut d]);
    c.detach_and_check(&mc);
    d.detach_and_check(&mc);
    let mut e = Session::attach(&mc, &EXACT, "calls");
    round_for(&mut mc, 1, &mut [&mut e]);
    e.detach_and_check(&mc);
    mc.check_healthy();
    mc.stop();
}

/// (d) 20 rounds: sessions with random functions and metrics come (up to
/// three at once: sharing a live probe that measures what they ask, with a
/// probe of their own over it where it does not) and go, killed or
/// detached at random; a load in every round. Every session that ends with
/// SIGINT is exact for its window; then a last one alone is exact, and
/// memcached is healthy.
#[test]
fn twenty_rounds_of_random_kills_and_attaches() {
    let ctx = Ctx::new("twenty_rounds_of_random_kills_and_attaches");
    let mut mc = Memcached::start(&ctx);
    mc.calibrate();
    let pool = ["sendmsg", "read", "strtol", "strtoul", BLOCKING];
    let metrics = ["calls", "calls,wall", "calls,cpu", "calls,wall,cpu"];
    let mut rng = rng_from_env("WEFT_SESSIONS_SEED");
    let mut live: Vec<(u64, Session)> = Vec::new();
    let (mut killed, mut detached) = (0, 0);
    for round in 1..=20u64 {
        // End one session: always when three are live, else by chance.
        if !live.is_empty() && (live.len() == 3 || rng.below(2) == 0) {
            let (_, s) = live.remove(rng.index(live.len()));
            // Both kinds of end at least once, then at random.
            let kill = match (killed, detached) {
                (0, _) => true,
                (_, 0) => false,
                _ => rng.below(2) == 0,
            };
            if kill {
                s.kill();
                killed += 1;
            } else {
                s.detach_and_check(&mc);
                detached += 1;
            }
        }
        // A new one.
        let mut funcs: Vec<&'static str> = pool
            .iter()
            .copied()
            .filter(|f| rng.below(if *f == BLOCKING { 4 } else { 2 }) == 0)
            .collect();
        if funcs.is_empty() {
            funcs.push(rng.pick(&EXACT));
        }
        let m = rng.pick(&metrics);
        live.push((round, Session::attach(&mc, &funcs, m)));
        let mult = 1 + rng.below(2);
        let mut refs: Vec<&mut Session> = live.iter_mut().map(|(_, s)| s).collect();
        round_for(&mut mc, mult, &mut refs);
    }
    for (_, s) in live.drain(..) {
        s.detach_and_check(&mc);
        detached += 1;
    }
    ctx.check(killed > 0 && detached > 0, || {
        format!("killed {killed}, detached {detached}: the mix should have both")
    });
    eprintln!("{killed} killed, {detached} detached");
    let all = ["sendmsg", "read", "strtol", "strtoul", BLOCKING];
    let mut last = Session::attach(&mc, &all, "calls,wall,cpu");
    round_for(&mut mc, 2, &mut [&mut last]);
    last.detach_and_check(&mc);
    mc.check_healthy();
    mc.stop();
}
