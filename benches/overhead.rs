//! weft's costs, measured side by side in one run (issue #5):
//!
//! 1. **Per call**: the same target (`benches/overhead_target.c`: threads
//!    calling a trivial `work()` in a tight loop) uninstrumented, under
//!    `weft run` with each metric set, and under bpftrace's uprobe
//!    (`@[tid] = count()`) when bpftrace is installed, at 1, 2 and 4
//!    threads: nanoseconds per call as the target measures them, the added
//!    cost, and the 2-thread/1-thread ratio of weft's added cost. Every
//!    weft run's report is checked: all calls counted, timers sane.
//! 2. **Attach**: a process with 200 busy threads: the time the target is
//!    stopped (seize, load the runtime, splice, detach), and the whole
//!    attach.
//! 3. **Many functions**: instrumenting 1,000 functions at once: the pause
//!    and the whole insertion.
//! 4. **Sampling**: one live report of many threads x 100 timed functions
//!    (read without stopping the target), and what 10 reports a second cost
//!    as a share of one core.
//! 5. **Live reports**: `weft attach --interval 0.5` on 200 busy threads:
//!    each report's punctuality and freshness.
//! 6. **Trace rate**: the highest event rate `-m calls,trace` keeps whole
//!    (every call in the trace, 0 lost), by pacing a target.
//! 7. **Diagnose on CPython**: Debian's `python3` running four threads
//!    around a `threading.Lock` (work inside and outside it), alone and
//!    under `weft diagnose`, alternated: the script's own elapsed and CPU
//!    time, the slowdown, the overhead the diagnosis reports, and whether
//!    it found the lock wait of every worker.
//!
//! `cargo bench --bench overhead` runs the full mode (a few minutes);
//! `WEFT_BENCH_QUICK=1` (or running it as a test) a short one, as CI does.

use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use weft::{Metrics, Pattern, Process};

fn bench_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("weft-bench");
    std::fs::create_dir_all(&dir).expect("creating the bench directory");
    dir
}

fn gcc(src: &Path, exe: &Path) {
    let status = Command::new("gcc")
        .args(["-O2", "-pthread", "-o"])
        .arg(exe)
        .arg(src)
        .status()
        .expect("running gcc (install it: apt-get install gcc)");
    assert!(status.success(), "building {}", src.display());
}

fn build_overhead_target() -> PathBuf {
    let exe = bench_dir().join("overhead_target");
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../benches/overhead_target.c");
    gcc(&src, &exe);
    exe
}

/// A target with `functions` instrumentable functions `f0`..: each of its
/// `threads` threads calls all of them, then sleeps 200 ms, until killed.
/// Prints "ready" once every thread made its first round.
fn build_many_target(functions: usize) -> PathBuf {
    let dir = bench_dir();
    let src = dir.join(format!("many_{functions}.c"));
    let exe = dir.join(format!("many_{functions}"));
    let mut c = String::from(
        "#include <pthread.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <unistd.h>\n\
         #include <stdatomic.h>\n",
    );
    for i in 0..functions {
        c.push_str(&format!(
            "__attribute__((noinline, noipa)) long f{i}(long x) {{ return x * {m} + {i}; }}\n",
            m = 2 * i + 3
        ));
    }
    c.push_str("typedef long (*fn_t)(long);\nstatic fn_t table[] = {");
    for i in 0..functions {
        c.push_str(&format!("f{i},"));
    }
    c.push_str(
        "};\nstatic atomic_int started;\n\
         static void *run(void *a) { long x = (long)a; int first = 1; for (;;) {\n\
           for (unsigned i = 0; i < sizeof table / sizeof *table; i++) x = table[i](x);\n\
           if (first) { first = 0; atomic_fetch_add(&started, 1); }\n\
           usleep(200000); } return (void *)x; }\n\
         int main(int argc, char **argv) { int n = atoi(argv[1]);\n\
           for (int i = 0; i < n; i++) { pthread_t t; pthread_attr_t at; pthread_attr_init(&at);\n\
             pthread_attr_setstacksize(&at, 256 * 1024);\n\
             if (pthread_create(&t, &at, run, (void *)(long)i)) return 1; }\n\
           while (atomic_load(&started) < n) usleep(1000);\n\
           printf(\"ready\\n\"); fflush(stdout); for (;;) pause(); }\n",
    );
    std::fs::write(&src, c).expect("writing the generated target");
    gcc(&src, &exe);
    exe
}

/// A target with `threads` threads spinning in a loop (busy, never in a
/// system call), until killed. Prints "ready".
fn build_busy_target() -> PathBuf {
    let dir = bench_dir();
    let src = dir.join("busy.c");
    let exe = dir.join("busy");
    std::fs::write(
        &src,
        "#include <pthread.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <unistd.h>\n\
         __attribute__((noinline, noipa)) long work(long x) { return x * 3 + 1; }\n\
         static void *spin(void *a) { long x = (long)a; for (;;) x = work(x); return 0; }\n\
         int main(int argc, char **argv) { int n = atoi(argv[1]);\n\
           for (int i = 1; i < n; i++) { pthread_t t; pthread_attr_t at; pthread_attr_init(&at);\n\
             pthread_attr_setstacksize(&at, 64 * 1024);\n\
             if (pthread_create(&t, &at, spin, (void *)(long)i)) return 1; }\n\
           printf(\"ready\\n\"); fflush(stdout); for (;;) pause(); }\n",
    )
    .expect("writing the busy target");
    gcc(&src, &exe);
    exe
}

/// A started target, killed (by PID) when dropped.
struct Target(Child);

impl Target {
    fn start(exe: &Path, args: &[String]) -> Target {
        let (target, line) = Target::spawn(exe, args);
        assert_eq!(line.trim(), "ready", "{} did not start", exe.display());
        target
    }

    /// Starts `exe` and returns it with the first line it printed.
    fn spawn(exe: &Path, args: &[String]) -> (Target, String) {
        let mut child = Command::new(exe)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting a target");
        let mut line = String::new();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        std::io::BufRead::read_line(&mut out, &mut line).expect("reading the ready line");
        (Target(child), line)
    }

    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How a per-call measurement runs the target.
#[derive(Clone, Copy)]
enum Under {
    Plain,
    Weft(&'static str),
    /// Under weft, a trace ring of this many events.
    WeftRing(&'static str, u32),
    /// Under weft with `-m calls,wall`, `work` counted only inside this
    /// function (`--inside`): `run` (every call is inside) or `main`
    /// (none is: the threads never enter it).
    WeftInside(&'static str),
    Bpftrace,
}

/// Thread CPU ns per call as the target measured it (best of its 3
/// repetitions, averaged over threads). Under weft, checks the report
/// against the target's own clocks (`check_report`).
fn per_call(exe: &Path, under: Under, threads: usize, calls: u64) -> f64 {
    let t = threads.to_string();
    let n = calls.to_string();
    let report = bench_dir().join("report.json");
    let mut cmd = match under {
        Under::Plain => {
            let mut c = Command::new(exe);
            c.args([&t, &n]);
            c
        }
        Under::Weft(metrics) | Under::WeftRing(metrics, _) => {
            let mut c = Command::new(env!("CARGO_BIN_EXE_weft"));
            if metrics.contains("trace") {
                // The largest ring unless told: a tight loop of empty
                // calls fills any ring between two drains (10 ms); the
                // share dropped is printed with the cost.
                let ring = match under {
                    Under::WeftRing(_, ring) => ring,
                    _ => TRACE_RING,
                };
                c.env(weft::trace::RING_ENV, ring.to_string());
            }
            c.args(["run", "-m", metrics, "-f", "work", "--format", "json", "-o"])
                .arg(&report)
                .arg("--")
                .arg(exe)
                .args([&t, &n]);
            c
        }
        Under::WeftInside(function) => {
            let mut c = Command::new(env!("CARGO_BIN_EXE_weft"));
            c.args([
                "run",
                "-m",
                "calls,wall",
                "-f",
                "work",
                "--inside",
                function,
            ])
            .args(["--format", "json", "-o"])
            .arg(&report)
            .arg("--")
            .arg(exe)
            .args([&t, &n]);
            c
        }
        Under::Bpftrace => {
            let mut c = Command::new("bpftrace");
            c.arg("-e")
                .arg(format!(
                    "uprobe:{}:work {{ @[tid] = count(); }}",
                    exe.display()
                ))
                .arg("-c")
                .arg(format!("{} {t} {n}", exe.display()));
            c
        }
    };
    let out = cmd.output().expect("running the target");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let ns = text
        .lines()
        .find_map(|l| l.trim().parse::<f64>().ok())
        .expect("the target prints ns per call");
    if let Under::Weft(metrics) | Under::WeftRing(metrics, _) = under {
        let own: Vec<ThreadClocks> = text.lines().filter_map(ThreadClocks::parse).collect();
        assert_eq!(own.len(), threads, "the target's per-thread lines: {text}");
        check_report(&report, metrics, threads as u64 * calls * 3, &own);
    }
    if let Under::WeftInside(function) = under {
        // Every call counted inside `run`, none inside `main`.
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        let work = r["functions"]
            .as_array()
            .and_then(|f| f.iter().find(|f| f["name"] == "work"))
            .and_then(|f| f["calls"].as_u64());
        let want = if function == "run" {
            threads as u64 * calls * 3
        } else {
            0
        };
        assert_eq!(work, Some(want), "work's calls inside {function}: {r}");
    }
    if let Under::Bpftrace = under {
        // Its map at exit, `@[tid]: count`: every call counted there too.
        let counted: u64 = text
            .lines()
            .filter(|l| l.starts_with("@["))
            .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<u64>().ok())
            .sum();
        assert_eq!(
            counted,
            threads as u64 * calls * 3,
            "bpftrace counted {counted} calls: {text}"
        );
    }
    ns
}

/// A target thread's own clocks around its loops.
struct ThreadClocks {
    tid: u64,
    wall_ns: u64,
    cpu_ns: u64,
}

impl ThreadClocks {
    /// `thread tid=T wall_ns=W cpu_ns=C`.
    fn parse(line: &str) -> Option<ThreadClocks> {
        let mut fields = line
            .strip_prefix("thread ")?
            .split(' ')
            .map(|kv| kv.split_once('=').and_then(|(_, v)| v.parse::<u64>().ok()));
        Some(ThreadClocks {
            tid: fields.next()??,
            wall_ns: fields.next()??,
            cpu_ns: fields.next()??,
        })
    }
}

/// Nothing measured less: the report counts every call, and each thread's
/// timers agree with its own clocks: the timed time of `work` lies inside
/// the thread's loops (their wall and CPU time, +1% and 1 ms), is at least
/// a tenth of it (the body and half the hook are timed), and its CPU time
/// does not exceed its wall time.
fn check_report(path: &Path, metrics: &str, calls: u64, own: &[ThreadClocks]) {
    let text = std::fs::read_to_string(path).expect("reading weft's report");
    let r: serde_json::Value = serde_json::from_str(&text).expect("weft's report is JSON");
    let f = &r["functions"][0];
    assert_eq!(f["calls"].as_u64(), Some(calls), "not every call counted");
    for t in r["threads"].as_array().into_iter().flatten() {
        let c = &t["functions"]["work"];
        let Some(clocks) = own.iter().find(|o| t["tid"].as_u64() == Some(o.tid)) else {
            continue; // the main thread: it does not call work()
        };
        let within = |timed: u64, real: u64, what: &str| {
            assert!(
                timed <= real + real / 100 + 1_000_000 && timed >= real / 10,
                "{what}: weft timed {timed} ns of the thread's own {real} ns: {c}"
            );
        };
        let wall = c["wall_ns"].as_u64().unwrap_or(0);
        let cpu = c["cpu_ns"].as_u64().unwrap_or(0);
        if metrics.contains("wall") {
            within(wall, clocks.wall_ns, "wall");
        }
        if metrics.contains("cpu") {
            within(cpu, clocks.cpu_ns, "cpu");
            // (CPU time next to wall time depends on how much the thread
            // was preempted, which a loaded machine decides.)
            assert!(
                cpu <= wall + wall / 20 + 1_000_000,
                "CPU time above wall time: {c}"
            );
        }
    }
}

/// Events per thread ring in the `trace` rows (the most a ring holds).
const TRACE_RING: u32 = 1 << 18;

/// The share of trace events the last `weft run` report says were dropped.
fn dropped_share(calls: u64) -> f64 {
    let text = std::fs::read_to_string(bench_dir().join("report.json")).unwrap_or_default();
    let r: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    r["trace"]["dropped_events"].as_u64().unwrap_or(0) as f64 / (2 * calls).max(1) as f64
}

fn best_of(rounds: usize, mut f: impl FnMut() -> f64) -> f64 {
    (0..rounds).map(|_| f()).fold(f64::INFINITY, f64::min)
}

/// bpftrace installed and able to load a program here (root, a kernel
/// with BPF): a trial `BEGIN { exit(); }`.
fn have_bpftrace() -> bool {
    unsafe_is_root()
        && Command::new("bpftrace")
            .args(["-e", "BEGIN { exit(); }"])
            .output()
            .is_ok_and(|o| o.status.success())
}

fn unsafe_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// ns per pair of back-to-back `rdtsc`s in this process: the floor of a
/// timer that reads the TSC at both ends of a call.
fn rdtsc_pair_ns() -> f64 {
    let n = 2_000_000u64;
    best_of(5, || {
        let t0 = Instant::now();
        let mut x = 0u64;
        for _ in 0..n {
            x ^= weft_rt::clock::rdtsc() ^ weft_rt::clock::rdtsc();
        }
        std::hint::black_box(x);
        t0.elapsed().as_secs_f64() * 1e9 / n as f64
    })
}

fn section_per_call(quick: bool) {
    let calls: u64 = if quick { 300_000 } else { 10_000_000 };
    let rounds = if quick { 1 } else { 3 };
    let exe = build_overhead_target();
    let bpf = have_bpftrace();
    println!(
        "## Per call: thread-CPU ns added to an empty call ({calls} calls x 3 per thread, best of {rounds})"
    );
    if !bpf {
        println!(
            "(bpftrace not installed or not root: its column is skipped; apt-get install bpftrace)"
        );
    }
    let floor = rdtsc_pair_ns();
    println!("two back-to-back rdtsc here: {floor:.1} ns (the floor of any TSC timer)");
    println!(
        "{:>7} {:>8} {:>8} {:>12} {:>16} {:>12} {:>17} {:>10}",
        "threads",
        "plain",
        "calls",
        "calls,wall",
        "calls,wall,cpu",
        "calls,trace",
        "calls,wall,trace",
        "bpftrace"
    );
    let metric_sets = [
        "calls",
        "calls,wall",
        "calls,wall,cpu",
        "calls,trace",
        "calls,wall,trace",
    ];
    let mut added: Vec<Vec<f64>> = Vec::new();
    let mut dropped = Vec::new();
    for threads in [1usize, 2, 4] {
        let plain = best_of(rounds, || per_call(&exe, Under::Plain, threads, calls));
        let mut row = Vec::new();
        for m in metric_sets {
            row.push(best_of(rounds, || per_call(&exe, Under::Weft(m), threads, calls)) - plain);
            if m.contains("trace") {
                dropped.push((threads, m, dropped_share(threads as u64 * calls * 3)));
            }
        }
        let bpf_cell = if bpf {
            // Thousands of times slower: fewer calls keep it short.
            let n = (calls / 20).max(20_000);
            format!(
                "{:+.0}",
                per_call(&exe, Under::Bpftrace, threads, n) - plain
            )
        } else {
            "-".into()
        };
        println!(
            "{threads:>7} {plain:>8.2} {:>+8.2} {:>+12.1} {:>+16.1} {:>+12.1} {:>+17.1} {bpf_cell:>10}",
            row[0], row[1], row[2], row[3], row[4]
        );
        added.push(row);
    }
    for (i, m) in metric_sets.iter().enumerate() {
        println!(
            "{m}: added cost at 2 threads / 1 thread = {:.2}, 4 / 1 = {:.2} (1.0: no shared cache line)",
            added[1][i] / added[0][i].max(0.01),
            added[2][i] / added[0][i].max(0.01)
        );
    }
    println!(
        "above the rdtsc floor at 1 thread: calls,wall +{:.1} ns, calls,wall,cpu +{:.1} ns, calls,trace +{:.1} ns",
        added[0][1] - floor,
        added[0][2] - floor,
        added[0][3] - floor
    );
    // Constrained calls (`--inside`): a call inside its constraint costs
    // a timed call and a compare more; one outside, the compare and the
    // trampoline's way in and out.
    let plain = best_of(rounds, || per_call(&exe, Under::Plain, 1, calls));
    let hit = best_of(rounds, || {
        per_call(&exe, Under::WeftInside("run"), 1, calls)
    }) - plain;
    let miss = best_of(rounds, || {
        per_call(&exe, Under::WeftInside("main"), 1, calls)
    }) - plain;
    println!(
        "constrained at 1 thread: inside,hit {hit:+.1} ns (calls,wall {:+.1}), inside,miss {miss:+.1} ns (calls {:+.2})",
        added[0][1], added[0][0]
    );
    println!(
        "trace vs wall at 1 thread: calls,trace / calls,wall = {:.2}, calls,wall,trace / calls,wall = {:.2}",
        added[0][3] / added[0][1].max(0.01),
        added[0][4] / added[0][1].max(0.01)
    );
    for (threads, m, share) in dropped {
        println!(
            "{m} at {threads} thread(s): {:.0}% of the trace events dropped (ring of {TRACE_RING} events, drained every 0.5 ms; a dropped event costs a compare and a counter instead of two stores)",
            share * 100.0
        );
    }
    // docs/trace.md's bound: a full ring never slows a call more than
    // writing its events does. The smallest ring drops nearly every event.
    let plain = best_of(rounds, || per_call(&exe, Under::Plain, 1, calls));
    let full = best_of(rounds, || {
        per_call(&exe, Under::WeftRing("calls,trace", MIN_RING), 1, calls)
    }) - plain;
    let share = dropped_share(calls * 3);
    let written = added[0][3];
    println!(
        "calls,trace at 1 thread with a ring of {MIN_RING} events: {:.0}% dropped, {full:+.1} ns a call \
         against {written:+.1} with the largest ring (x{:.2}; bound: x1.5 + 10 ns)",
        share * 100.0,
        full / written.max(0.01)
    );
    assert!(
        share > 0.5,
        "a ring of {MIN_RING} events dropped only {:.1}% of a tight loop's events",
        share * 100.0
    );
    assert!(
        full <= written * 1.5 + 10.0,
        "a full ring made a call cost {full:.1} ns, more than the bound (writing: {written:.1} ns x1.5 + 10)"
    );
}

/// The smallest trace ring weft takes.
const MIN_RING: u32 = weft_rt::layout::trace::MIN_CAPACITY;

/// One `weft run -m calls,trace` of `benches/trace_rate_target.c`: its
/// threads' events a second (two per call, by the target's own count and
/// clock) and the events the trace lost (dropped or not kept).
struct RateTrial {
    events_per_sec: f64,
    lost: u64,
}

fn trace_trial(exe: &Path, threads: usize, calls_per_sec: f64, seconds: f64) -> RateTrial {
    let report = bench_dir().join("trace_rate.json");
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args([
            "run",
            "-m",
            "calls,trace",
            "-f",
            "outer,inner",
            "--format",
            "json",
            "-o",
        ])
        .arg(&report)
        .arg("--")
        .arg(exe)
        .args([
            threads.to_string(),
            format!("{calls_per_sec:.0}"),
            seconds.to_string(),
        ])
        .output()
        .expect("running weft");
    assert!(
        out.status.success(),
        "weft run of the trace rate target failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // `thread tid=T calls=N wall_ns=W`
    let text = String::from_utf8_lossy(&out.stdout);
    let own: Vec<(u64, f64)> = text
        .lines()
        .filter_map(|l| {
            let mut v = l
                .strip_prefix("thread ")?
                .split(' ')
                .map(|kv| kv.split_once('=').map(|(_, v)| v));
            let _tid = v.next()??;
            Some((v.next()??.parse().ok()?, v.next()??.parse().ok()?))
        })
        .collect();
    assert_eq!(own.len(), threads, "the target's lines: {text}");
    let made: u64 = own.iter().map(|o| o.0).sum();
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).expect("weft's report"))
            .expect("weft's report is JSON");
    let counted: u64 = r["functions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["calls"].as_u64())
        .sum();
    assert_eq!(
        counted, made,
        "weft counted {counted} calls, the target made {made}"
    );
    let t = &r["trace"];
    let lost = t["dropped_events"].as_u64().unwrap_or(u64::MAX)
        + t["discarded_events"].as_u64().unwrap_or(u64::MAX);
    if lost == 0 {
        // Nothing lost: every call the target made is in the trace.
        assert_eq!(
            t["calls"].as_u64(),
            Some(made),
            "no event lost, yet the trace has not every call: {t}"
        );
    }
    RateTrial {
        events_per_sec: own
            .iter()
            .map(|&(calls, wall)| 2.0 * calls as f64 / (wall / 1e9))
            .sum(),
        lost,
    }
}

fn section_trace_rate(quick: bool) {
    let threads = 2;
    let seconds = if quick { 0.4 } else { 2.0 };
    let steps = if quick { 4 } else { 8 };
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../benches/trace_rate_target.c");
    let exe = bench_dir().join("trace_rate_target");
    gcc(&src, &exe);
    println!(
        "## Trace: the sustained lossless event rate ({threads} threads calling a nested pair of \
         functions for {seconds} s, paced; default ring and budget, weft's drain thread)"
    );
    let tight = trace_trial(&exe, threads, 0.0, seconds);
    println!(
        "unpaced: {:.1} M events/s made, {} lost",
        tight.events_per_sec / 1e6,
        tight.lost
    );
    // Bisect the pace between a rate kept whole and one that was not.
    let (mut whole, mut over) = if tight.lost == 0 {
        (tight.events_per_sec, None)
    } else {
        (0.0, Some(tight.events_per_sec))
    };
    let mut rate = tight.events_per_sec / 2.0;
    for _ in 0..steps {
        let Some(high) = over else { break };
        // Calls a second per thread: 2 events a call.
        let trial = trace_trial(&exe, threads, rate / 2.0 / threads as f64, seconds);
        println!(
            "  paced at {:.1} M events/s: {:.1} M made, {} lost",
            rate / 1e6,
            trial.events_per_sec / 1e6,
            trial.lost
        );
        if trial.lost == 0 {
            whole = whole.max(trial.events_per_sec);
            rate = (rate + high) / 2.0;
        } else {
            over = Some(rate.min(high));
            rate = (whole + rate) / 2.0;
        }
    }
    println!(
        "sustained lossless trace rate: {:.1} M events/s ({} calls/s, {threads} threads, every call in the trace, 0 lost){}",
        whole / 1e6,
        (whole / 2.0) as u64,
        if over.is_none() {
            " = everything the threads made"
        } else {
            ""
        }
    );
    assert!(whole > 0.0, "no paced rate was traced without loss");
}

fn section_attach(quick: bool) {
    let threads = 200;
    let exe = build_busy_target();
    let rounds = if quick { 1 } else { 5 };
    println!(
        "## Attach to {threads} busy threads ({rounds} rounds: the target's longest stop of the world, \
         hold to release, the whole attach from open; first attach, so the runtime is loaded)"
    );
    let mut rows = Vec::new();
    for _ in 0..rounds {
        let target = Target::start(&exe, &[threads.to_string()]);
        let t0 = Instant::now();
        let mut p = Process::open(target.pid()).expect("open");
        let f = p
            .find_functions(&[Pattern::parse("work").unwrap()])
            .expect("find work");
        p.prepare(&f).expect("prepare");
        let t1 = Instant::now();
        let stops = p.stops();
        let mut held = p.hold().expect("hold");
        held.insert(&f, Metrics::CALLS).expect("insert");
        held.release().expect("release");
        let held = t1.elapsed();
        let whole = t0.elapsed();
        rows.push((p.longest_stop(), held, whole, p.stops() - stops));
        let mut held = p.hold().expect("hold");
        held.remove_all().expect("remove");
        held.release().expect("release");
    }
    rows.sort();
    for (stop, held, whole, stops) in &rows {
        println!(
            "longest stop {:.1} ms ({stops} stops), hold to release {:.1} ms, whole attach {:.1} ms",
            stop.as_secs_f64() * 1e3,
            held.as_secs_f64() * 1e3,
            whole.as_secs_f64() * 1e3
        );
    }
    let (stop, ..) = rows[rows.len() / 2];
    let mut wholes: Vec<Duration> = rows.iter().map(|r| r.2).collect();
    wholes.sort();
    println!(
        "median longest stop {:.1} ms, median whole attach {:.1} ms",
        stop.as_secs_f64() * 1e3,
        wholes[wholes.len() / 2].as_secs_f64() * 1e3
    );

    // The user's view: from starting the `weft` binary to its `attached`
    // line, weft's own start included (issue #17: median <= 30 ms, worst
    // <= 60 ms). weft stamps its `attached` line with CLOCK_MONOTONIC, so
    // the harness, itself behind the busy threads, reads it late without
    // harm. The harness runs at real-time priority when permitted (its own
    // turn must not count against weft) and starts weft as a shell would,
    // at normal priority, then born real-time (inheriting the harness's):
    // a new process at normal priority waits behind the busy threads
    // before its first instruction, where weft can do nothing about it.
    let rounds = if quick { 3 } else { 15 };
    let realtime = harness_at_realtime_priority();
    attach_from_process_start(&exe, threads, rounds, realtime, false);
    if realtime {
        attach_from_process_start(&exe, threads, rounds, realtime, true);
    }
    if quick {
        println!("(Frida's column: full mode only)");
    } else {
        frida_attach_from_process_start(&exe, threads, 5);
    }
    if realtime {
        let normal = libc::sched_param { sched_priority: 0 };
        // SAFETY: back to the normal policy for this thread; the param is valid.
        unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &normal) };
    }
}

/// Frida's side of the same measurement: a Python script (Frida's usual
/// front end) started as a shell would, attaching to the busy target and
/// hooking `work` with an empty `onEnter`; timed from before its process
/// is created to the hook being live, and from its `frida.attach` call.
/// `WEFT_BENCH_PYTHON` names the interpreter that has the `frida` module
/// (`pip install frida`; a virtual environment's `python3`), `python3`
/// otherwise; skipped with a note where none has it.
fn frida_attach_from_process_start(exe: &Path, threads: usize, rounds: usize) {
    let python = std::env::var("WEFT_BENCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let version = Command::new(&python)
        .args(["-c", "import frida; print(frida.__version__)"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let Some(version) = version else {
        println!(
            "(Frida not installed for {python}: its column is skipped; pip install frida, or set \
             WEFT_BENCH_PYTHON to a python3 that has it)"
        );
        return;
    };
    let script = bench_dir().join("frida_attach.py");
    std::fs::write(&script, FRIDA_ATTACH).expect("write the Frida script");
    let (mut whole, mut attach) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let target = Target::start(exe, &[threads.to_string()]);
        let started = monotonic_ns();
        let out = Command::new(&python)
            .arg(&script)
            .arg(target.pid().to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .expect("run the Frida script");
        let text = String::from_utf8_lossy(&out.stdout);
        let stamp = |key: &str| -> Option<u64> {
            text.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().parse().ok())
        };
        match (out.status.success(), stamp("attaching "), stamp("hooked ")) {
            (true, Some(from), Some(at)) => {
                whole.push(at.saturating_sub(started) as f64 / 1e6);
                attach.push(at.saturating_sub(from) as f64 / 1e6);
            }
            _ => {
                println!(
                    "(Frida {version} failed here: {}; its column is skipped)",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
                return;
            }
        }
    }
    whole.sort_by(f64::total_cmp);
    attach.sort_by(f64::total_cmp);
    println!(
        "Frida {version} (Python), hooking `work`: from its process start to the hook live: median \
         {:.1} ms, worst {:.1} ms; from frida.attach: median {:.1} ms, worst {:.1} ms ({rounds} rounds)",
        whole[whole.len() / 2],
        whole[whole.len() - 1],
        attach[attach.len() / 2],
        attach[attach.len() - 1],
    );
}

/// Attaches to argv[1], hooks `work` (found by its symbol) with an empty
/// `onEnter`, prints CLOCK_MONOTONIC stamps (ns) before the attach and once
/// the hook is live, detaches.
const FRIDA_ATTACH: &str = r#"import sys, threading, time
import frida
pid = int(sys.argv[1])
print("attaching", time.clock_gettime_ns(time.CLOCK_MONOTONIC), flush=True)
session = frida.attach(pid)
live = threading.Event()
script = session.create_script("""
const work = DebugSymbol.fromName('work').address;
Interceptor.attach(work, { onEnter(args) {} });
send('hooked');
""")
script.on("message", lambda message, data: live.set())
script.load()
if not live.wait(60):
    sys.exit("the hook never went live")
print("hooked", time.clock_gettime_ns(time.CLOCK_MONOTONIC), flush=True)
script.unload()
session.detach()
"#;

/// `weft attach` timed from before its process is created to its
/// `attached` line, `rounds` times; started as a shell would (normal
/// priority) or inheriting the harness's real-time priority (real-time
/// from its first instruction).
fn attach_from_process_start(
    exe: &Path,
    threads: usize,
    rounds: usize,
    realtime: bool,
    inherit: bool,
) {
    let mut cli: Vec<f64> = Vec::new();
    // The scheduler's part, measured in the same rounds: when the new
    // process ran its first instruction (in the child, after `fork` and
    // before `exec`), which no code of weft's can move.
    let mut first: Vec<f64> = Vec::new();
    for _ in 0..rounds {
        let target = Target::start(exe, &[threads.to_string()]);
        let pid = target.pid().to_string();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_weft"));
        cmd.env("WEFT_TIMING", "1")
            .args([
                "attach",
                "-p",
                &pid,
                "-f",
                "work",
                "-m",
                "calls",
                "--duration",
                "0.01",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if inherit {
            // The child is born real-time, as under a real-time shell.
            set_fifo(false);
        }
        let mut ends = [0i32; 2];
        // SAFETY: `ends` is a valid out-array of two descriptors.
        let piped = unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } == 0;
        assert!(piped, "pipe2: {}", std::io::Error::last_os_error());
        let write_end = ends[1];
        // SAFETY: the closure runs in the child between fork and exec and
        // calls only async-signal-safe functions (clock_gettime, write) on
        // its own stack; the write end closes at exec (O_CLOEXEC).
        unsafe {
            cmd.pre_exec(move || {
                let now = monotonic_ns().to_ne_bytes();
                libc::write(write_end, now.as_ptr().cast(), now.len());
                Ok(())
            });
        }
        let started = monotonic_ns();
        let child = cmd.spawn().expect("running weft attach");
        // SAFETY: the parent's copy of the write end, closed once.
        unsafe { libc::close(write_end) };
        if inherit {
            set_fifo(true);
        }
        let mut stamp = [0u8; 8];
        // SAFETY: reads at most 8 bytes into `stamp` from the read end,
        // which is then closed once.
        let got = unsafe {
            let got = libc::read(ends[0], stamp.as_mut_ptr().cast(), stamp.len());
            libc::close(ends[0]);
            got
        };
        assert_eq!(got, 8, "the child's first-instruction stamp");
        first.push(u64::from_ne_bytes(stamp).saturating_sub(started) as f64 / 1e6);
        let out = child.wait_with_output().expect("running weft attach");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "weft attach failed: {err}");
        let at: u64 = err
            .lines()
            .find_map(|l| l.strip_prefix("weft: timing: attached at CLOCK_MONOTONIC "))
            .and_then(|l| l.trim_end_matches(" ns").parse().ok())
            .expect("weft's `attached at` timing line");
        cli.push(at.saturating_sub(started) as f64 / 1e6);
    }
    // Paired by round, before either list is sorted.
    let mut own: Vec<f64> = cli.iter().zip(&first).map(|(c, f)| c - f).collect();
    own.sort_by(f64::total_cmp);
    cli.sort_by(f64::total_cmp);
    println!(
        "`{}weft attach` from its process start to `attached` ({rounds} rounds{}): median {:.1} ms, \
         worst {:.1} ms (goal: median <= 30 ms, worst <= 60 ms), all: {}",
        if inherit { "real-time " } else { "" },
        if realtime { "" } else { ", the harness at normal priority" },
        cli[cli.len() / 2],
        cli[cli.len() - 1],
        cli.iter().map(|v| format!("{v:.1}")).collect::<Vec<_>>().join(" ")
    );
    first.sort_by(f64::total_cmp);
    println!(
        "  of which the new process waited for its first instruction (the scheduler's, before \
         weft's code): median {:.1} ms, worst {:.1} ms; weft's own part, from its first \
         instruction to `attached`: median {:.1} ms, worst {:.1} ms",
        first[first.len() / 2],
        first[first.len() - 1],
        own[own.len() / 2],
        own[own.len() - 1]
    );
}

/// `CLOCK_MONOTONIC` now, ns (the clock weft's timing lines use).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The harness's thread at `SCHED_FIFO` 1 (root), its children not
/// (`SCHED_RESET_ON_FORK`); whether it was permitted.
fn harness_at_realtime_priority() -> bool {
    set_fifo(true)
}

/// This thread at `SCHED_FIFO` 1, its children too unless
/// `reset_on_fork`; whether it was permitted.
fn set_fifo(reset_on_fork: bool) -> bool {
    let fifo = libc::sched_param { sched_priority: 1 };
    let flag = if reset_on_fork {
        libc::SCHED_RESET_ON_FORK
    } else {
        0
    };
    // SAFETY: sets this thread's own policy; the param is valid.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO | flag, &fifo) == 0 }
}

/// Opens a generated target and finds its functions `f0`.. (not libc's
/// `free`, `fopen`...), prepared for splicing.
fn open_generated(target: &Target) -> (Process, Vec<weft::Function>) {
    let mut p = Process::open(target.pid()).expect("open");
    let f: Vec<_> = p
        .find_functions(&[Pattern::parse("f*").unwrap()])
        .expect("find f*")
        .into_iter()
        .filter(|f| f.name[1..].parse::<u32>().is_ok())
        .collect();
    (p, f)
}

fn section_many_functions(quick: bool) {
    let functions = 1000;
    let exe = build_many_target(functions);
    let rounds = if quick { 1 } else { 5 };
    println!(
        "## Instrument {functions} functions at once ({rounds} rounds, a fresh target each; \
         the runtime loaded by an earlier insertion, so the stop is the splice alone)"
    );
    let mut rows = Vec::new();
    for _ in 0..rounds {
        let target = Target::start(&exe, &["2".into()]);
        let (mut p, f) = open_generated(&target);
        assert_eq!(f.len(), functions, "generated functions found");
        p.prepare(&f).expect("prepare");
        let warm = p
            .find_functions(&[Pattern::parse("usleep").unwrap()])
            .expect("usleep");
        let mut held = p.hold().expect("hold");
        held.insert(&warm, Metrics::CALLS).expect("insert");
        held.release().expect("release");
        let stops = p.stops();
        let t0 = Instant::now();
        let mut held = p.hold().expect("hold");
        held.insert(&f, Metrics::CALLS).expect("insert 1000");
        held.release().expect("release");
        let held = t0.elapsed();
        let stops = p.stops() - stops;
        assert_eq!(stops, 1, "1,000 functions in one stop of the world");
        // Every function counts (the target calls each within 200 ms).
        std::thread::sleep(Duration::from_millis(300));
        let silent = p
            .report()
            .functions
            .iter()
            .filter(|r| r.name.starts_with('f') && r.calls == 0)
            .count();
        assert_eq!(silent, 0, "functions that counted no call");
        rows.push((p.longest_stop(), held));
    }
    rows.sort();
    for (stop, held) in &rows {
        println!(
            "the target stopped once, for {:.2} ms ({:.2} us per function); hold to release \
             {:.1} ms; every function counted",
            stop.as_secs_f64() * 1e3,
            stop.as_secs_f64() * 1e6 / functions as f64,
            held.as_secs_f64() * 1e3,
        );
    }
    let (stop, held) = rows[rows.len() / 2];
    println!(
        "median longest stop {:.2} ms, median hold to release {:.1} ms{}",
        stop.as_secs_f64() * 1e3,
        held.as_secs_f64() * 1e3,
        if quick { " [quick]" } else { "" }
    );
}

fn section_sampling(quick: bool) {
    let (threads, functions) = if quick { (50, 100) } else { (1000, 100) };
    let exe = build_many_target(functions);
    let target = Target::start(&exe, &[threads.to_string()]);
    let (mut p, f) = open_generated(&target);
    p.prepare(&f).expect("prepare");
    let mut held = p.hold().expect("hold");
    held.insert(&f, Metrics::ALL).expect("insert");
    held.release().expect("release");
    // Every thread runs every function within 200 ms, then sleeps 200 ms:
    // at 10 Hz about half the rows have changed between two samples.
    std::thread::sleep(Duration::from_millis(500));
    let samples = if quick { 10 } else { 50 };
    // As `weft attach`/`top` sample: at real-time priority for the whole
    // session where permitted, so 1,000 spinning threads do not preempt
    // the sampler in the middle of a sample (and refill its caches).
    let realtime = weft::RealtimeGuard::raise();
    let mut sampler = weft::Sampler::new();
    // The first sample reads every row.
    let cpu0 = thread_cpu();
    let rows = sampler.sample(&p).count();
    let cold = thread_cpu() - cpu0;
    let mut spent = 0.0;
    let (mut read, mut cpu_reads, mut holes, mut stuck) = (0u64, 0u64, 0u64, 0u64);
    for _ in 0..samples {
        std::thread::sleep(Duration::from_millis(100));
        let before: u64 = calls_in(&p);
        let cpu0 = thread_cpu();
        let sampled: u64 = sampler
            .sample(&p)
            .map(|t| t.values.iter().map(|v| v.calls).sum::<u64>())
            .sum();
        spent += thread_cpu() - cpu0;
        let after: u64 = calls_in(&p);
        // Nothing measured less: a sample holds every call made before it.
        assert!(
            before <= sampled && sampled <= after,
            "a sample counted {sampled} calls, between {before} and {after} expected"
        );
        read += u64::from(sampler.stats().rows_read);
        cpu_reads += u64::from(sampler.stats().cpu_reads);
        holes += u64::from(sampler.stats().holes_looked_up);
        stuck += u64::from(sampler.stats().timers_mid_update);
    }
    let sample = spent / samples as f64;
    // The floor under a sample, in the same run: the lines it must load
    // (row headers, the changed rows' words), loaded and nothing done.
    let mut floor = weft::internals::LineFloor::default();
    floor.touch(&p);
    let (mut floor_spent, mut floor_rows, mut floor_lines) = (0.0, 0u64, 0u64);
    for _ in 0..samples {
        std::thread::sleep(Duration::from_millis(100));
        let cpu0 = thread_cpu();
        let (rows, lines) = floor.touch(&p);
        floor_spent += thread_cpu() - cpu0;
        floor_rows += u64::from(rows);
        floor_lines += lines;
    }
    let floor = floor_spent / samples as f64;
    // A whole report: every row copied, names, maps and totals for people.
    let reports = if quick { 3 } else { 10 };
    let cpu0 = thread_cpu();
    for _ in 0..reports {
        std::hint::black_box(p.report());
    }
    let report = (thread_cpu() - cpu0) / reports as f64;
    println!(
        "## Sampling {rows} threads x {functions} timed functions at 10 Hz (target running, not \
         stopped; sampler at {} priority)",
        if realtime.is_some() {
            "real-time"
        } else {
            "normal"
        }
    );
    println!(
        "sample: {:.3} ms CPU ({:.0} changed rows read, {:.1} of them looked up for written \
         pages, {:.1} CPU times read, {:.1} timers found mid-update per sample), at 10 Hz \
         {:.2}% of a core; first sample (every row): {:.2} ms; full report: {:.1} ms",
        sample * 1e3,
        read as f64 / samples as f64,
        holes as f64 / samples as f64,
        cpu_reads as f64 / samples as f64,
        stuck as f64 / samples as f64,
        sample * 10.0 * 100.0,
        cold * 1e3,
        report * 1e3
    );
    println!(
        "memory floor (the lines a sample loads, loaded alone, same cadence): {:.3} ms a pass, \
         at 10 Hz {:.2}% of a core ({:.0} changed rows, {:.0} lines); per changed row, sample / \
         floor = {:.2}",
        floor * 1e3,
        floor * 10.0 * 100.0,
        floor_rows as f64 / samples as f64,
        floor_lines as f64 / samples as f64,
        (sample / read.max(1) as f64) / (floor / floor_rows.max(1) as f64)
    );
    let mut held = p.hold().expect("hold");
    held.remove_all().expect("remove");
    held.release().expect("release");
}

/// Live reports while 200 threads spin (issue #17): `weft attach -f leaf
/// -m calls,wall,cpu --interval 0.5 --format jsonl` on
/// tests/targets/busy_counted.c, whose extra thread publishes how many
/// calls it has made. Per report: when it arrived after `attached` against
/// when it was due (goal: every interval, ±50 ms), and the share of the
/// counter thread's calls made by then that it holds (a fresh reading
/// holds about all of them; a stale one, as before the fix, a fraction).
fn section_live(quick: bool) {
    const SPINNERS: usize = 200;
    const INTERVAL_MS: u64 = 500;
    let duration_ms: u64 = if quick { 1500 } else { 4000 };
    let dir = bench_dir();
    let exe = dir.join("busy_counted");
    gcc(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/targets/busy_counted.c"),
        &exe,
    );
    let count_file = dir.join("live_count");
    let (target, ready) = Target::spawn(
        &exe,
        &[SPINNERS.to_string(), count_file.display().to_string()],
    );
    let counter: u64 = ready
        .trim()
        .strip_prefix("ready counter=")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("busy_counted's ready line: {ready:?}"));
    let published = {
        let file = count_file.clone();
        move || -> u64 {
            std::fs::read(&file)
                .ok()
                .and_then(|b| Some(u64::from_le_bytes(b.get(..8)?.try_into().ok()?)))
                .unwrap_or(0)
        }
    };
    // The harness reads arrivals at real-time priority (else 200 spinners
    // make it, not weft, late); weft raises itself.
    let realtime = harness_at_realtime_priority();
    let mut weft = Command::new(env!("CARGO_BIN_EXE_weft"))
        .env("WEFT_TIMING", "1")
        .args(["attach", "-p", &target.pid().to_string(), "-f", "leaf"])
        .args([
            "-m",
            "calls,wall,cpu",
            "--interval",
            "0.5",
            "--format",
            "jsonl",
        ])
        .args(["--duration", &format!("{}", duration_ms as f64 / 1000.0)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running weft attach");
    // `attached`: weft's own clock stamp, and the count when it was seen.
    let stderr = weft.stderr.take().unwrap();
    let attached = std::thread::spawn({
        let published = published.clone();
        move || {
            set_fifo(true);
            let mut at = None;
            let mut text = String::new();
            for line in
                std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok)
            {
                if at.is_none() {
                    at = line
                        .strip_prefix("weft: timing: attached at CLOCK_MONOTONIC ")
                        .and_then(|l| l.trim_end_matches(" ns").parse::<u64>().ok())
                        .map(|ns| (ns, published()));
                }
                text.push_str(&line);
                text.push('\n');
            }
            (at, text)
        }
    });
    // Each report line, when it arrived and the count then.
    let mut lines: Vec<(String, u64, u64)> = Vec::new();
    for line in std::io::BufRead::lines(std::io::BufReader::new(weft.stdout.take().unwrap())) {
        let line = line.expect("weft's report lines");
        lines.push((line, monotonic_ns(), published()));
    }
    let ended = monotonic_ns();
    let status = weft.wait().expect("waiting for weft");
    let (at, err) = attached.join().expect("the stderr reader");
    assert!(status.success(), "weft attach failed: {err}");
    let (attached_ns, base) = at.unwrap_or_else(|| panic!("no `attached at` timing line: {err}"));
    drop(target);
    let mut live = 0;
    let (mut late, mut shares) = (Vec::new(), Vec::new());
    let mut saw_final = false;
    for (line, arrived, made) in &lines {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON report line");
        let held = v["threads"]
            .as_array()
            .and_then(|ts| ts.iter().find(|t| t["tid"] == counter))
            .and_then(|t| t["functions"]["leaf"]["calls"].as_u64())
            .unwrap_or(0);
        if v["final"] == true {
            // Read after the probes came out: calls made since are not in it.
            saw_final = true;
            continue;
        }
        shares.push(held as f64 / made.saturating_sub(base).max(1) as f64);
        live += 1;
        let due = attached_ns + live * INTERVAL_MS * 1_000_000;
        late.push((*arrived as f64 - due as f64) / 1e6);
    }
    assert!(saw_final, "no final report: {err}");
    let worst = late.iter().fold(0.0f64, |w, l| w.max(l.abs()));
    let list = |v: &[f64], f: &dyn Fn(f64) -> String| {
        v.iter().map(|x| f(*x)).collect::<Vec<_>>().join(" ")
    };
    println!(
        "## Live reports under {SPINNERS} busy threads (weft attach -m calls,wall,cpu --interval 0.5 \
         --duration {}; harness at {} priority)",
        duration_ms as f64 / 1000.0,
        if realtime { "real-time" } else { "normal" }
    );
    println!(
        "{live} live reports (one due every 500 ms for {duration_ms} ms: {} or {}); arrival minus \
         due time, ms: {}; worst {worst:.1} ms (goal: within 50 ms); weft ended {:.0} ms after \
         `attached`",
        duration_ms / INTERVAL_MS - 1,
        duration_ms / INTERVAL_MS,
        list(&late, &|l| format!("{l:+.1}")),
        (ended.saturating_sub(attached_ns)) as f64 / 1e6
    );
    println!(
        "freshness: the counter thread's calls each live report holds / the calls it had made \
         when the report arrived (1.00: read just before): {}",
        list(&shares, &|s| format!("{s:.2}"))
    );
}

/// Four CPython threads taking turns at a `threading.Lock`, each doing
/// pure-Python work inside and outside it (`ROUNDS` times); prints
/// `ready PID`, waits the seconds in argv[2], runs, prints its own elapsed
/// and process CPU time, and its workers' thread ids.
const PYTHON_LOCK: &str = r#"
import threading, time, sys, os
rounds = int(sys.argv[1])
lock = threading.Lock()
ids = []
def work(k):
    s = 0
    for i in range(k):
        s += i * i
    return s
def worker():
    ids.append(threading.get_native_id())
    for _ in range(rounds):
        with lock:
            work(300)
        work(300)
print("ready", os.getpid(), flush=True)
time.sleep(float(sys.argv[2]))
t0 = time.monotonic(); c0 = time.process_time()
ts = [threading.Thread(target=worker) for _ in range(4)]
for t in ts: t.start()
for t in ts: t.join()
print("elapsed", time.monotonic() - t0, "cpu", time.process_time() - c0, flush=True)
print("workers", ",".join(map(str, sorted(ids))), flush=True)
"#;

/// One run of the lock script, under `weft diagnose` when `diagnose`
/// (attached in its pause): (elapsed s, CPU s, workers, the diagnosis's
/// JSON).
fn python_lock_run(
    script: &Path,
    rounds: u32,
    diagnose: bool,
) -> Option<(f64, f64, Vec<u64>, serde_json::Value)> {
    let mut py = Command::new(debian_python())
        .arg(script)
        .arg(rounds.to_string())
        .arg(if diagnose { "3" } else { "0" })
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let pid = py.id();
    // weft attaches once the interpreter is up (its `ready` line), as a
    // user would to a running program.
    let mut out = std::io::BufReader::new(py.stdout.take()?);
    let mut text = String::new();
    std::io::BufRead::read_line(&mut out, &mut text).ok()?;
    // Its progress lines go to a file: a pipe nobody reads while the
    // script runs would fill and stall weft (with the target stopped).
    let err_path = bench_dir().join("python_lock_diagnose.err");
    let weft = diagnose.then(|| {
        let err = std::fs::File::create(&err_path).expect("creating the progress file");
        Command::new(env!("CARGO_BIN_EXE_weft"))
            .args(["diagnose", "-p", &pid.to_string(), "--format", "json"])
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .expect("running weft diagnose")
    });
    std::io::Read::read_to_string(&mut out, &mut text).ok()?;
    py.wait().ok()?;
    let diagnosis = match weft {
        Some(w) => {
            let out = w.wait_with_output().expect("weft diagnose's report");
            serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
                let err = std::fs::read_to_string(&err_path).unwrap_or_default();
                let tail: Vec<&str> = err.lines().rev().take(3).collect();
                println!("(weft diagnose gave no diagnosis: {})", tail.join(" | "));
                serde_json::Value::Null
            })
        }
        None => serde_json::Value::Null,
    };
    let field = |key: &str| -> Option<Vec<String>> {
        text.lines()
            .find(|l| l.starts_with(key))
            .map(|l| l.split_whitespace().map(str::to_string).collect())
    };
    let times = field("elapsed")?;
    let workers = field("workers")?[1]
        .split(',')
        .filter_map(|t| t.parse().ok())
        .collect();
    Some((
        times[1].parse().ok()?,
        times[3].parse().ok()?,
        workers,
        diagnosis,
    ))
}

/// Debian's `python3` (the interpreter itself: a `python3` found first on
/// the PATH may be a shell wrapper, and weft would diagnose the shell).
fn debian_python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// Section 7 (see the top): the script alone and under `weft diagnose`,
/// alternated, `pairs` times; medians.
fn section_diagnose_cpython(quick: bool) {
    println!("## weft diagnose on CPython: 4 threads around a threading.Lock");
    if Command::new(debian_python())
        .arg("-c")
        .arg("pass")
        .status()
        .map_or(true, |s| !s.success())
    {
        println!("(python3 not installed: skipped)");
        return;
    }
    let script = bench_dir().join("python_lock.py");
    std::fs::write(&script, PYTHON_LOCK).expect("writing the script");
    // The search ends with the script: long enough in full mode for it
    // to reach the lock's wait (about 10 s here), partial in quick mode.
    let (rounds, pairs) = if quick { (60_000, 1) } else { (150_000, 3) };
    let (mut alone, mut under) = (Vec::new(), Vec::new());
    let mut reported = Vec::new();
    let mut found = Vec::new();
    for _ in 0..pairs {
        let Some((e, c, _, _)) = python_lock_run(&script, rounds, false) else {
            println!("(the script did not run: skipped)");
            return;
        };
        alone.push((e, c));
        let Some((e, c, workers, d)) = python_lock_run(&script, rounds, true) else {
            println!("(the script did not run under weft diagnose: skipped)");
            return;
        };
        under.push((e, c));
        // The last diagnosis stays there, to read.
        let _ = std::fs::write(
            bench_dir().join("python_lock_diagnosis.json"),
            d.to_string(),
        );
        let summary = &d["summary"];
        reported.push((
            summary["overhead"].as_f64().unwrap_or(f64::NAN),
            summary["clock_overhead"].as_f64().unwrap_or(f64::NAN),
        ));
        // The lock's wait, for each worker: a sync bottleneck naming it.
        let waiting: std::collections::BTreeSet<u64> = d["bottlenecks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|b| b["hypothesis"] == "sync")
            .flat_map(|b| b["threads"].as_array().cloned().unwrap_or_default())
            .filter_map(|t| t.as_u64().or_else(|| t["tid"].as_u64()))
            .collect();
        found.push(workers.iter().filter(|w| waiting.contains(w)).count());
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (ae, ac) = (
        median(alone.iter().map(|a| a.0).collect()),
        median(alone.iter().map(|a| a.1).collect()),
    );
    let (ue, uc) = (
        median(under.iter().map(|a| a.0).collect()),
        median(under.iter().map(|a| a.1).collect()),
    );
    println!(
        "{pairs} pair(s), {rounds} rounds a worker; alone: {ae:.2} s elapsed, {ac:.2} s CPU; \
         under diagnose: {ue:.2} s, {uc:.2} s CPU; slowdown x{:.2} elapsed, x{:.2} CPU (goal: \
         at most x1.15)",
        ue / ae,
        uc / ac
    );
    println!(
        "reported overhead per run (of which the clocks' events): {}; workers whose lock wait \
         was found: {} of 4 per run",
        reported
            .iter()
            .map(|(p, c)| format!("{:.1} % ({:.1} %)", 100.0 * p, 100.0 * c))
            .collect::<Vec<_>>()
            .join("; "),
        found
            .iter()
            .map(|f| f.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// Calls counted so far in every live row (a full snapshot).
fn calls_in(p: &Process) -> u64 {
    p.snapshot()
        .iter()
        .filter(|r| r.state != weft_rt::layout::ROW_FREE)
        // Every probe here is timed: its calls are the first of its words.
        .map(|r| {
            r.words
                .iter()
                .step_by((weft_codegen::TIMER_METRIC_LEN / 8) as usize)
                .sum::<u64>()
        })
        .sum()
}

/// This thread's CPU time, seconds.
fn thread_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test` runs benches in test mode
    // with no arguments besides filters: keep that quick too.
    let quick =
        std::env::var_os("WEFT_BENCH_QUICK").is_some() || !std::env::args().any(|a| a == "--bench");
    // Figures differ by machine (rdtsc alone is 9 ns on one, 42 on
    // another): name it, and compare only within one run.
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown processor".into());
    println!(
        "# weft overhead{} — {} CPUs, {model}, kernel {}",
        if quick { " (quick mode)" } else { "" },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_or_else(|_| "unknown".into(), |r| r.trim().to_string())
    );
    // WEFT_BENCH_ONLY=per_call,attach,functions,sampling,live,trace: some
    // sections.
    let only = std::env::var("WEFT_BENCH_ONLY").unwrap_or_default();
    let run = |name: &str| only.is_empty() || only.split(',').any(|s| s == name);
    if run("per_call") {
        section_per_call(quick);
    }
    if run("attach") {
        section_attach(quick);
    }
    if run("functions") {
        section_many_functions(quick);
    }
    if run("sampling") {
        section_sampling(quick);
    }
    if run("live") {
        section_live(quick);
    }
    if run("trace") {
        section_trace_rate(quick);
    }
    if run("diagnose") {
        section_diagnose_cpython(quick);
    }
    let _ = std::io::stdout().flush();
}
