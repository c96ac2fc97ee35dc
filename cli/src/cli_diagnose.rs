//! `weft diagnose`: runs the Performance Consultant's search on a process
//! (`weft::diagnose`), says what it tests and concludes on stderr, and
//! writes the diagnosis when the search is exhausted, `--duration` ends,
//! SIGINT/SIGTERM arrives, or the target exits; then takes every probe out.

use crate::cli_wait;
use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use weft::diagnose::{Consultant, Diagnosis, Options, Progress};
use weft::Process;

/// What to diagnose.
pub enum Target {
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
pub struct Files<'a> {
    /// The diagnosis (standard output if none).
    pub output: Option<&'a Path>,
    /// The search's history as a Trace Event Format timeline, if asked.
    pub timeline: Option<&'a Path>,
}

/// Runs the search on `target` until it ends; writes the diagnosis. A
/// program weft started runs on after the diagnosis; weft waits for it and
/// exits with its exit code.
pub fn diagnose(
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
            crate::say_launched(program, &process);
            (process, true)
        }
    };
    let pid = process.pid();
    let mut consultant =
        Consultant::new(&mut process, options.clone()).context("preparing the search")?;
    cli_wait::install_stop_handlers();
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
        match cli_wait::wait(pid, Some(wait), &mut || None) {
            cli_wait::End::Duration => {}
            cli_wait::End::Signal => {
                why = "stopped by a signal (partial result)";
                break;
            }
            cli_wait::End::TargetExited => {
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
         CPU, {} stops (longest {:.1} ms: {:.1} for the threads to stop, {:.1} to resume them; \
         {} given up for a late thread){}{}\n",
        m.tests,
        m.peak_probes,
        m.functions_probed,
        m.functions_reachable,
        m.overhead * 100.0,
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
pub fn parse_hypothesis(spec: &str) -> Result<weft::diagnose::CustomHypothesis> {
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
