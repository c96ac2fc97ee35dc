//! `weft diagnose`: runs the Performance Consultant's search on a process
//! (`weft::diagnose`), says what it tests and concludes on stderr, and
//! writes the diagnosis when the search is exhausted, `--duration` ends,
//! SIGINT/SIGTERM arrives, or the target exits; then takes every probe out.

use crate::args::seconds;
use crate::session::say_launched;
use crate::wait;
use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use weft::diagnose::{Consultant, Diagnosis, Options, Progress};
use weft::Process;

// The arguments of `Command::Diagnose` (their help is the variant's, in
// main.rs).
#[derive(clap::Args, Debug)]
pub struct DiagnoseArgs {
    /// The process (or give `-- PROGRAM ARGS` to start one).
    #[arg(short = 'p', long = "pid")]
    pid: Option<i32>,
    /// Stop after this many seconds (partial result).
    #[arg(long, value_name = "SECS", allow_hyphen_values = true)]
    duration: Option<String>,
    /// Most functions instrumented at once.
    #[arg(long, default_value_t = 64)]
    max_probes: usize,
    /// Threshold of the CPU-bound hypothesis (share of a thread's time).
    #[arg(long, default_value_t = 0.30)]
    cpu_threshold: f64,
    /// Threshold of the synchronization-waiting hypothesis.
    #[arg(long, default_value_t = 0.20)]
    sync_threshold: f64,
    /// Threshold of the I/O-blocking hypothesis.
    #[arg(long, default_value_t = 0.20)]
    io_threshold: f64,
    /// Most the instrumentation may cost, as a share of the target's
    /// CPU time: a function whose calls alone cost more is taken out
    /// (its tests skipped, with the reason), and no test starts while
    /// the total is over.
    #[arg(long, default_value_t = 0.05)]
    max_overhead: f64,
    /// Report waits at the top of a thread's loop (a pool thread
    /// waiting for work) as bottlenecks, not as idle time.
    #[arg(long)]
    report_idle: bool,
    /// How long a value must hold before a test concludes, in seconds.
    #[arg(long, value_name = "SECS", default_value = "1")]
    observe: String,
    /// A hypothesis of your own, tested next to cpu/sync/io: "the
    /// threads spend too much time in these functions". NAME=F1,F2…
    /// with an optional :wall|:cpu|:offcpu (which time, wall by
    /// default) and @SHARE (threshold, 0.2 by default), e.g.
    /// 'alloc=malloc,free,realloc:cpu@0.1'. Repeatable, up to 8.
    #[arg(long = "hypothesis", value_name = "NAME=FUNCTIONS")]
    hypotheses: Vec<String>,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    format: DiagnoseFormat,
    /// Write the diagnosis to FILE instead of standard output.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    /// Also write the search's history to FILE as a timeline (Trace
    /// Event Format JSON, as `--format chrome-trace` writes call
    /// traces): each test a slice from its first reading to its
    /// conclusion, per thread, for the Perfetto UI, chrome://tracing
    /// or speedscope (docs/diagnose.md).
    #[arg(long, value_name = "FILE")]
    timeline: Option<PathBuf>,
    /// A program to start and diagnose, with its arguments (instead
    /// of -p).
    #[arg(last = true, value_name = "PROGRAM")]
    command: Vec<String>,
}

/// Runs `weft diagnose`: checks the arguments, then [`diagnose`].
pub fn exec(args: DiagnoseArgs) -> Result<ExitCode> {
    let DiagnoseArgs {
        pid,
        duration,
        max_probes,
        cpu_threshold,
        sync_threshold,
        io_threshold,
        max_overhead,
        report_idle,
        observe,
        hypotheses,
        format,
        output,
        timeline,
        command,
    } = args;
    let target = match (pid, command.split_first()) {
        (Some(pid), None) => Target::Pid(pid),
        (None, Some((program, args))) => Target::Launch(program.clone(), args.to_vec()),
        (Some(_), Some(_)) => {
            bail!("give either -p PID or -- PROGRAM ARGS, not both")
        }
        (None, None) => {
            bail!("nothing to diagnose: give -p PID, or -- PROGRAM ARGS to start a program")
        }
    };
    let duration = seconds("--duration", duration.as_deref(), true)?;
    let observe = seconds("--observe", Some(&observe), true)?.unwrap_or_default();
    for (name, t) in [
        ("--cpu-threshold", cpu_threshold),
        ("--sync-threshold", sync_threshold),
        ("--io-threshold", io_threshold),
    ] {
        if !(t > 0.0 && t < 1.0) {
            bail!("{name} {t}: give a share of a thread's time between 0 and 1, e.g. 0.3");
        }
    }
    if !(max_overhead > 0.0 && max_overhead < 1.0) {
        bail!("--max-overhead {max_overhead}: give a share of the target's CPU time between 0 and 1, e.g. 0.05");
    }
    let defaults = weft::diagnose::Options::default();
    let options = weft::diagnose::Options {
        max_probes: max_probes.max(1),
        max_overhead,
        report_idle,
        thresholds: weft::diagnose::Thresholds {
            cpu: cpu_threshold,
            sync: sync_threshold,
            io: io_threshold,
            min_observation: observe,
            ..defaults.thresholds
        },
        custom: hypotheses
            .iter()
            .map(|h| parse_hypothesis(h))
            .collect::<Result<_>>()?,
        ..defaults
    };
    diagnose(
        target,
        duration,
        options,
        format,
        Files {
            output: output.as_deref(),
            timeline: timeline.as_deref(),
        },
    )
}

/// What to diagnose.
enum Target {
    /// A running process.
    Pid(i32),
    /// A program weft starts (stopped before `main` until the search's
    /// first probes are in), with its arguments.
    Launch(String, Vec<String>),
}

/// How the diagnosis is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DiagnoseFormat {
    /// For people.
    Text,
    /// `docs/diagnose.md`'s JSON.
    Json,
}

/// Where the diagnosis goes.
struct Files<'a> {
    /// The diagnosis (standard output if none).
    output: Option<&'a Path>,
    /// The search's history as a Trace Event Format timeline, if asked.
    timeline: Option<&'a Path>,
}

/// Runs the search on `target` until it ends; writes the diagnosis. A
/// program weft started runs on after the diagnosis; weft waits for it and
/// exits with its exit code.
fn diagnose(
    target: Target,
    duration: Option<Duration>,
    options: Options,
    format: DiagnoseFormat,
    files: Files,
) -> Result<ExitCode> {
    let output = files.output;
    let (mut process, launched) = match &target {
        Target::Pid(pid) => (
            Process::open(*pid).with_context(|| format!("opening process {pid}"))?,
            false,
        ),
        Target::Launch(program, args) => {
            let process =
                Process::launch(program, args).with_context(|| format!("starting {program}"))?;
            say_launched(program, &process);
            (process, true)
        }
    };
    let pid = process.pid();
    let mut consultant =
        Consultant::new(&mut process, options.clone()).context("preparing the search")?;
    wait::install_stop_handlers();
    let started = Instant::now();
    let mut why = "the search is exhausted";
    loop {
        let progress = match consultant.step(&mut process) {
            Ok(p) => p,
            Err(_) if !process.is_alive() => {
                why = "the target exited (partial result)";
                break;
            }
            Err(e) => {
                let _ = consultant.finish(&mut process);
                return Err(e).context("testing");
            }
        };
        for p in progress {
            say(&p);
        }
        if consultant.exhausted() {
            break;
        }
        let left = duration.map(|d| d.saturating_sub(started.elapsed()));
        if left == Some(Duration::ZERO) {
            why = "--duration ended (partial result)";
            break;
        }
        let wait = left.map_or(options.interval, |l| l.min(options.interval));
        match wait::wait(pid, Some(wait), &mut || None) {
            wait::End::Duration => {}
            wait::End::Signal => {
                why = "stopped by a signal (partial result)";
                break;
            }
            wait::End::TargetExited => {
                why = "the target exited (partial result)";
                break;
            }
        }
    }
    consultant
        .finish(&mut process)
        .context("removing the search's probes")?;
    eprintln!("weft: diagnose: {why}");
    let diagnosis = consultant.diagnosis();
    let text = match format {
        DiagnoseFormat::Json => serde_json::to_string_pretty(&diagnosis)? + "\n",
        DiagnoseFormat::Text => to_text(&diagnosis),
    };
    if let Some(path) = files.timeline {
        let process = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|s| s.trim_end().to_string())
            .unwrap_or_else(|_| format!("pid {pid}"));
        std::fs::write(path, diagnosis.to_chrome_trace(pid, &process) + "\n")
            .with_context(|| format!("writing the timeline to {}", path.display()))?;
    }
    match output {
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?
        }
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())?;
            out.flush()?;
        }
    }
    if !launched {
        return Ok(ExitCode::SUCCESS);
    }
    // The program weft started runs to its end, uninstrumented now.
    let code = match process.wait_exit() {
        Ok(exit) => exit.shell_code(),
        Err(_) => 1,
    };
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

fn say(p: &Progress) {
    match p {
        Progress::Testing(tests) => {
            for (h, path, tid) in tests {
                eprintln!("weft: testing {h} in {} (thread {tid})", display_path(path));
            }
        }
        Progress::TooCostly(function, share) => eprintln!(
            "weft: {function}: taken out, its calls cost {:.1}% of the target's CPU \
             (over --max-overhead); its tests are skipped",
            share * 100.0
        ),
        Progress::ClocksCostly(share, switches) => eprintln!(
            "weft: the threads' CPU clocks cost {:.1}% of the target's CPU, more than \
             --max-overhead: a perf event each, which the kernel switches with its thread \
             ({switches:.0} switches a second); no probe taken out lowers it, so the search goes \
             on (docs/diagnose.md, bounded perturbation)",
            share * 100.0
        ),
        Progress::Concluded(h, path, tid, holds, value) => eprintln!(
            "weft: {h} in {} (thread {tid}): {} ({:.0}%)",
            display_path(path),
            if *holds { "true" } else { "false" },
            value * 100.0
        ),
    }
}

fn to_text(d: &Diagnosis) -> String {
    let mut s = String::new();
    if d.bottlenecks.is_empty() {
        s.push_str("no bottleneck found\n");
    }
    // What could not be tested is said, not left to look like health.
    if let Some(what) = &d.summary.cannot_time {
        s.push_str(&format!("{what}\n"));
    }
    let refused: usize = d.summary.refused.values().sum();
    if refused > 0 {
        let kinds: Vec<String> = d
            .summary
            .refused
            .iter()
            .map(|(kind, n)| format!("{n} {kind}"))
            .collect();
        s.push_str(&format!(
            "{refused} function(s) could not be timed, so their tests were given up ({}){}\n",
            kinds.join(", "),
            d.summary
                .refused_example
                .as_ref()
                .map_or(String::new(), |e| format!("; e.g. {e}"))
        ));
    }
    for b in &d.bottlenecks {
        s.push_str(&format!(
            "{:>4.0}%  {:<4}  {}  threads {}{}\n",
            b.value * 100.0,
            b.hypothesis,
            display_path(&b.path),
            thread_list(b),
            object_text(b)
        ));
    }
    for b in &d.idle {
        s.push_str(&format!(
            "idle  {:>4.0}%  {:<4}  {}  threads {}{}  (waiting for work)\n",
            b.value * 100.0,
            b.hypothesis,
            display_path(&b.path),
            thread_list(b),
            object_text(b)
        ));
    }
    let m = &d.summary;
    s.push_str(&format!(
        "tests {}, peak probes {}, functions probed {} of {}, overhead {:.2}% of the target's \
         CPU (of which {:.2}% the threads' CPU clocks' events), {} stops (longest {:.1} ms: {:.1} for the threads to stop, {:.1} to resume them; \
         {} given up for a late thread){}{}\n",
        m.tests,
        m.peak_probes,
        m.functions_probed,
        m.functions_reachable,
        m.overhead * 100.0,
        m.clock_overhead * 100.0,
        m.stops,
        m.longest_stop_ms,
        m.longest_stop_stopping_ms,
        m.longest_stop_resuming_ms,
        m.stops_given_up,
        m.start_held_ms
            .map(|ms| format!("; held {ms:.1} ms at its start, before it ran"))
            .unwrap_or_default(),
        if m.exhausted {
            ""
        } else {
            " (search cut short)"
        }
    ));
    s
}

/// `1234 (mc-worker),1235 (mc-worker)`: each thread with its name.
fn thread_list(b: &weft::diagnose::Bottleneck) -> String {
    b.threads
        .iter()
        .enumerate()
        .map(
            |(i, t)| match b.thread_names.get(i).filter(|n| !n.is_empty()) {
                Some(name) => format!("{t} ({name})"),
                None => t.to_string(),
            },
        )
        .collect::<Vec<_>>()
        .join(",")
}

/// A call path for people: Rust and C++ names demangled, without their
/// hashes.
fn display_path(path: &[String]) -> String {
    path.iter()
        .map(|f| format!("{:#}", rustc_demangle::demangle(f)))
        .collect::<Vec<_>>()
        .join(" > ")
}

fn object_text(b: &weft::diagnose::Bottleneck) -> String {
    let mut s = String::new();
    if !b.also_via.is_empty() {
        s.push_str(&format!(" (and by {} other paths)", b.also_via.len()));
    }
    if let Some(o) = &b.object {
        s.push_str(&format!("  on {o}"));
    }
    if let Some(n) = b.bytes_per_call {
        s.push_str(&format!(", {n} B per transfer"));
    }
    if b.small_io {
        s.push_str(&format!(
            ", too many small I/O operations ({:.0} calls/s)",
            b.calls_per_s.unwrap_or(0.0)
        ));
    }
    s
}

/// `NAME=F1,F2[:wall|:cpu|:offcpu][@SHARE]` as a custom hypothesis.
fn parse_hypothesis(spec: &str) -> Result<weft::diagnose::CustomHypothesis> {
    use weft::diagnose::{CustomHypothesis, Measure};
    let usage = "give NAME=FUNCTION,FUNCTION…, optionally :wall|:cpu|:offcpu and @SHARE, \
                 e.g. 'alloc=malloc,free:cpu@0.1'";
    let (name, rest) = spec
        .split_once('=')
        .with_context(|| format!("--hypothesis {spec:?}: {usage}"))?;
    let (rest, threshold) = match rest.rsplit_once('@') {
        Some((r, t)) => {
            let t: f64 = t
                .parse()
                .ok()
                .filter(|t| *t > 0.0 && *t < 1.0)
                .with_context(|| {
                    format!("--hypothesis {spec:?}: @{t} is not a share between 0 and 1")
                })?;
            (r, t)
        }
        None => (rest, 0.20),
    };
    let (functions, measure) = match rest.rsplit_once(':') {
        Some((f, "wall")) => (f, Measure::Wall),
        Some((f, "cpu")) => (f, Measure::Cpu),
        Some((f, "offcpu")) => (f, Measure::OffCpu),
        Some((_, m)) => bail!("--hypothesis {spec:?}: :{m} is not wall, cpu or offcpu"),
        None => (rest, Measure::Wall),
    };
    let functions: Vec<String> = functions
        .split(',')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(String::from)
        .collect();
    let name = name.trim();
    if name.is_empty() || functions.is_empty() {
        bail!("--hypothesis {spec:?}: {usage}");
    }
    if ["cpu", "sync", "io"].contains(&name) {
        bail!("--hypothesis {spec:?}: {name} is a built-in hypothesis; choose another name");
    }
    Ok(CustomHypothesis {
        name: name.to_string(),
        functions,
        measure,
        threshold,
    })
}
