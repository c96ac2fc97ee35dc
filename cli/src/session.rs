//! The live-session driver `attach`, `top` and `run` share: a target with
//! weft's probes in it, from the attach (or launch) to the final report.

use crate::args::{Measure, Refusals};
use crate::kernel;
use crate::timing::Timing;
use crate::wait;
use anyhow::{anyhow, bail, Result};
use std::fmt::Write as _;
use weft::report::group_digits;
use weft::{Pattern, Process, RealtimeGuard, Report};

/// Keeps a live session's real-time priority until the process exits.
/// Dropped at the end of the session, the guard gave back normal priority
/// before weft's teardown (dropping the session, unmapping the region,
/// exiting), which then waited 0.2-0.35 s behind a busy target's threads
/// (200 here) after the final report was written.
pub fn keep_until_exit(boost: Option<RealtimeGuard>) {
    std::mem::forget(boost);
}

/// How long a loading thread may wait for weft to instrument its library
/// (`--later`).
const LOAD_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// A target with weft's probes in it, live: what `attach`, `top` and
/// `--serve` share, from the attach to the final report.
pub struct Attached {
    pub process: Process,
    kernel: Option<weft::kernel::Session>,
    /// Loads watched for `--later` patterns.
    watcher: Option<weft::events::Watcher>,
    /// User functions are instrumented (else kernel probes only).
    user: bool,
    /// Functions instrumented (user and kernel).
    pub functions: usize,
    /// Threads when attached.
    pub threads: usize,
    /// Its children running the same program, seen while live.
    pub children: Children,
}

/// The children of a session's process that run the same program (a
/// server's workers), seen while the session is live: weft follows one
/// process, and a master whose workers do the work reports no call.
#[derive(Debug)]
pub struct Children {
    pid: i32,
    seen: std::collections::BTreeSet<i32>,
    looked: Option<std::time::Instant>,
}

impl Children {
    pub fn of(pid: i32) -> Children {
        Children {
            pid,
            seen: Default::default(),
            looked: None,
        }
    }

    /// Looks at the process's children (at most every 200 ms).
    pub fn look(&mut self) {
        let now = std::time::Instant::now();
        if self
            .looked
            .is_some_and(|at| now.duration_since(at) < std::time::Duration::from_millis(200))
        {
            return;
        }
        self.looked = Some(now);
        self.seen
            .extend(weft::inspect::children_running_the_same_program(self.pid));
    }

    /// What to tell the user when `report` counted no call of its user
    /// functions while children running the same program were seen.
    pub fn hint(&self, report: &Report) -> Option<String> {
        let calls: u64 = report
            .functions
            .iter()
            .filter(|f| f.mechanism.is_none())
            .map(|f| f.calls)
            .sum();
        if calls > 0 || self.seen.is_empty() || report.functions.is_empty() {
            return None;
        }
        let list: Vec<String> = self.seen.iter().map(|c| c.to_string()).collect();
        let name = weft::inspect::command(self.pid).unwrap_or_else(|| "PROGRAM".into());
        Some(format!(
            "weft: pid {} made no instrumented call, but its children {} ran the same program \
             (a server's workers?): weft measures the processes it is given: attach to the \
             master and its workers while they run, weft attach -p {} --children \
             (or -p {}, or --pid-of {name})",
            self.pid,
            list.join(", "),
            self.pid,
            list.join(","),
        ))
    }
}

impl Attached {
    /// Attaches to `pid` and puts in the probes `split` asks for: the user
    /// functions in one stop of the world, then the kernel probes with the
    /// target running (the verifier's milliseconds are nobody's wait).
    /// All or nothing: an error leaves nothing in the target.
    pub fn attach(
        pid: i32,
        split: &kernel::Patterns,
        caps: Option<&weft::kernel::Capabilities>,
        measure: &Measure,
        refusals: &Refusals,
        later: bool,
    ) -> Result<Attached> {
        Attached::attach_as(pid, split, caps, measure, refusals, later, false)
    }

    /// [`Attached::attach`] to a child forked from a process this weft
    /// instruments with the same patterns: the probes it inherited are
    /// taken over with what they counted since the fork
    /// ([`weft::Process::adopt_forked_probes`]), so none of its calls is
    /// missed.
    pub fn follow(
        pid: i32,
        split: &kernel::Patterns,
        measure: &Measure,
        refusals: &Refusals,
    ) -> Result<Attached> {
        Attached::attach_as(pid, split, None, measure, refusals, false, true)
    }

    fn attach_as(
        pid: i32,
        split: &kernel::Patterns,
        caps: Option<&weft::kernel::Capabilities>,
        measure: &Measure,
        refusals: &Refusals,
        later: bool,
        adopt: bool,
    ) -> Result<Attached> {
        let timing = Timing::from_env();
        let patterns = &split.user;
        // Everything that needs no stopped target happens before the pause.
        let mut process = Process::open(pid)?;
        if adopt {
            process.adopt_forked_probes();
        }
        // With --later, a pattern that matches nothing yet waits for the
        // libraries loaded from now on.
        let (found, pending) = if patterns.is_empty() {
            (Vec::new(), Vec::new())
        } else if later {
            let mut matching = Vec::new();
            let mut pending = Vec::new();
            for pattern in patterns {
                match process.find_functions(std::slice::from_ref(pattern)) {
                    Ok(_) => matching.push(pattern.clone()),
                    Err(weft::Error::NoMatch { .. }) => pending.push(pattern.clone()),
                    Err(e) => return Err(e.into()),
                }
            }
            // Searched together: a function several patterns match is one,
            // its other names its aliases.
            (process.find_functions(&matching)?, pending)
        } else {
            (process.find_functions(patterns)?, Vec::new())
        };
        let inside = find_inside(&mut process, measure, &found)?;
        let metrics = measure.metrics_for(found.len() + inside.len());
        let mut watcher = (!pending.is_empty()).then(|| {
            let mut w = weft::events::Watcher::new(&process);
            w.defer(pending.clone(), metrics);
            w
        });
        let mut instrumented = 0;
        let mut threads = 0;
        if !patterns.is_empty() {
            process.prepare(&found)?;
            if metrics.cpu {
                process.prepare_cpu_clocks();
            }
            timing.mark("found functions and swept their modules (target running)");
            let mut held = process.hold()?;
            held.set_trace_calls(measure.metrics.trace);
            timing.mark("seized and stopped every thread");
            instrumented = instrument(&mut held, patterns, &found, &inside, metrics, refusals)?;
            if let Some(w) = &mut watcher {
                if let Err(e) = w.defer_at_load(&mut held, LOAD_WAIT) {
                    // A weft that gives up leaves nothing in place.
                    let _ = held.remove_all();
                    return Err(e.into());
                }
                let names: Vec<String> = pending.iter().map(|p| p.to_string()).collect();
                eprintln!(
                    "weft: waiting for libraries loaded later for {}",
                    names.join(", ")
                );
            }
            timing.mark("loaded the runtime and spliced");
            threads = held.threads_at_attach();
            held.release()?;
            timing.mark("detached");
            timing.note(&format!(
                "longest stop of the world: {:.2} ms",
                process.longest_stop().as_secs_f64() * 1e3
            ));
        }
        let kernel = match kernel::start(&process, split, caps) {
            Ok(k) => k,
            Err(e) => {
                if !patterns.is_empty() {
                    // All or nothing: the user functions come out again.
                    let mut held = process.hold()?;
                    held.remove_all()?;
                    held.release()?;
                }
                return Err(e);
            }
        };
        if threads == 0 {
            threads = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count());
        }
        let functions = instrumented + kernel.as_ref().map_or(0, |k| k.probes().len());
        Ok(Attached {
            process,
            kernel,
            watcher,
            user: !patterns.is_empty(),
            functions,
            threads,
            children: Children::of(pid),
        })
    }

    /// Starts `program` with the probes `functions` ask for in place
    /// before its first instruction (no call is missed). An error kills
    /// the program before main.
    pub fn launch(
        program: &str,
        args: &[String],
        functions: &[String],
        measure: &Measure,
        refusals: &Refusals,
    ) -> Result<Attached> {
        let split = kernel::split(functions)?;
        let caps = kernel::capabilities(&split)?;
        let mut process = Process::launch(program, args)?;
        say_launched(program, &process);
        let found = if split.user.is_empty() {
            Vec::new()
        } else {
            process.find_functions(&split.user)?
        };
        let inside = find_inside(&mut process, measure, &found)?;
        let metrics = measure.metrics_for(found.len() + inside.len());
        if metrics.cpu {
            process.prepare_cpu_clocks();
        }
        // Its first hold is the stop at its entry: dropped on an error, it
        // kills the program before main.
        let mut held = process.hold()?;
        held.set_trace_calls(measure.metrics.trace);
        let instrumented = if found.is_empty() {
            0
        } else {
            instrument(&mut held, &split.user, &found, &inside, metrics, refusals)?
        };
        // The kernel probes go in while the program is still at its entry.
        let kernel = kernel::start(&held, &split, caps.as_ref())?;
        held.release()?;
        let functions = instrumented + kernel.as_ref().map_or(0, |k| k.probes().len());
        let pid = process.pid();
        Ok(Attached {
            process,
            kernel,
            watcher: None,
            user: !split.user.is_empty(),
            functions,
            threads: 1,
            children: Children::of(pid),
        })
    }

    /// Runs about every 10 ms while live: instruments libraries loaded
    /// for `--later` patterns and keeps exited threads' figures.
    pub fn tick(&mut self) {
        if let Some(w) = &mut self.watcher {
            match w.poll(&mut self.process) {
                Ok(events) => {
                    for e in events {
                        if let weft::events::Event::ProbesApplied { path, probes } = e {
                            eprintln!(
                                "weft: instrumented {} functions of {}",
                                probes.len(),
                                path.display()
                            );
                        }
                    }
                }
                Err(e) => eprintln!("weft: warning: a library loaded later: {e}"),
            }
        }
        self.process.harvest();
        self.children.look();
    }

    /// A report read live, without stopping the target.
    pub fn live_report(&self) -> Result<Report> {
        kernel::report(&self.process, self.kernel.as_ref())
    }

    /// Takes everything out (unless the target is gone) and detaches;
    /// returns the final report.
    pub fn finish(&mut self, ended: wait::End) -> Result<Report> {
        let process = &mut self.process;
        let gone = |process: &mut Process| {
            process.harvest();
            process.report()
        };
        let mut report = if ended == wait::End::TargetExited || !process.is_alive() {
            gone(process)
        } else if !self.user {
            process.report()
        } else {
            if let Some(w) = &mut self.watcher {
                w.stop_deferring_at_load(process);
            }
            match take_out(process) {
                Ok(report) => report,
                // It exited meanwhile (a server's worker ending with its
                // connection): its figures are those it left, as for one
                // that had exited before. A process in the middle of its
                // exit has let its memory go (`/proc/PID/mem`: no such
                // process) before it is a zombie: a PostgreSQL backend
                // ending with pgbench failed a whole report so.
                Err(_) if exits_soon(process) => gone(process),
                Err(e) => return Err(e),
            }
        };
        if let Some(k) = &self.kernel {
            process.add_kernel_to(&mut report, k)?;
        }
        // Detaches and unloads the kernel probes.
        drop(self.kernel.take());
        Ok(report)
    }
}

/// Whether `process` is gone, or is within 200 ms (an exiting process is
/// a zombie soon after it let its memory go).
fn exits_soon(process: &Process) -> bool {
    for _ in 0..20 {
        if !process.is_alive() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    false
}

/// Takes every probe out of `process` in one stop and reads the final
/// report.
fn take_out(process: &mut Process) -> Result<Report> {
    let timing = Timing::from_env();
    let mut held = process.hold()?;
    timing.mark("at the end: seized and stopped every thread");
    held.remove_all()?;
    timing.mark("removed the probes");
    held.harvest();
    let report = held.report();
    timing.mark("read the final report");
    held.release()?;
    timing.mark("detached");
    Ok(report)
}

/// Inserts probes measuring `metrics` into `found` (what `patterns`
/// matched): with `--strict` all or nothing; else every function that can
/// be instrumented safely, the others refused with one summary line on
/// standard error (and each with its reason with `--explain`), unless a
/// refused one was named exactly (no glob): then nothing is changed and
/// the error says why. Returns how many functions are instrumented.
fn instrument(
    held: &mut weft::Held<'_>,
    patterns: &[Pattern],
    found: &[weft::Function],
    inside: &[weft::Function],
    metrics: weft::Metrics,
    refusals: &Refusals,
) -> Result<usize> {
    // `--inside`: the constraining functions first (all of them, or
    // nothing), then the others counted inside them.
    let constraints = if inside.is_empty() {
        Vec::new()
    } else {
        let specs: Vec<weft::ProbeSpec> = inside
            .iter()
            .map(|f| weft::ProbeSpec::measure(f.clone(), metrics))
            .collect();
        held.insert_probes(&specs)?
    };
    let found: Vec<weft::Function> = found
        .iter()
        .filter(|f| !inside.iter().any(|i| i.address == f.address))
        .cloned()
        .collect();
    let found = &found[..];
    let specs: Vec<weft::ProbeSpec> = found
        .iter()
        .map(|f| weft::ProbeSpec::measure(f.clone(), metrics).inside(&constraints))
        .collect();
    if refusals.strict {
        held.insert_probes(&specs)?;
        return Ok(found.len() + inside.len());
    }
    let named_exactly = |f: &weft::Function| {
        patterns.iter().any(|p| {
            p.name().is_literal()
                && std::iter::once(&f.name)
                    .chain(&f.aliases)
                    .any(|n| p.matches_function(n))
        })
    };
    let applied = held.insert_what_is_safe(&specs, named_exactly)?;
    let refused = applied.refused;
    let done = found.len() - refused.len();
    if refused.is_empty() {
        return Ok(done + inside.len());
    }
    if done == 0 {
        // Nothing to measure: an error, as all or nothing would say.
        return Err(weft::Error::Refused(refused).into());
    }
    let mut text = format!(
        "weft: {} of {} functions instrumented; {} refused{}\n",
        group_digits(done as u64),
        group_digits(found.len() as u64),
        group_digits(refused.len() as u64),
        if refusals.explain {
            ":"
        } else {
            ", see --explain"
        }
    );
    if refusals.explain {
        for r in &refused {
            let _ = writeln!(
                text,
                "weft:   `{}` ({}, {:#x}): {}{}",
                r.function.name,
                r.function.module,
                r.function.address,
                r.reason,
                crate::hints::for_refusal(r).map_or(String::new(), |h| format!(" ({h})"))
            );
        }
    }
    eprint!("{text}");
    Ok(done + inside.len())
}

/// The functions `--inside` names, one each (none without it); an error
/// when one is also all that `-f` measures or the metrics have no timer.
fn find_inside(
    process: &mut Process,
    measure: &Measure,
    found: &[weft::Function],
) -> Result<Vec<weft::Function>> {
    if measure.inside.is_empty() {
        return Ok(Vec::new());
    }
    if !measure.metrics.metrics.hooks_exit() {
        bail!(
            "--inside counts calls made inside other functions by timing those: add wall or cpu \
             to -m (-m calls,wall)"
        );
    }
    let mut inside = Vec::new();
    for name in &measure.inside {
        let pattern = Pattern::parse(name).map_err(|e| anyhow!("--inside {name}: {e}"))?;
        let mut matched = process.find_functions(&[pattern])?;
        if matched.len() != 1 {
            let names: Vec<&str> = matched.iter().take(5).map(|f| f.name.as_str()).collect();
            bail!(
                "--inside {name} matches {} functions ({}{}): name one",
                matched.len(),
                names.join(", "),
                if matched.len() > 5 { ", ..." } else { "" }
            );
        }
        inside.push(matched.remove(0));
    }
    if found
        .iter()
        .all(|f| inside.iter().any(|i| i.address == f.address))
    {
        bail!("every function -f names is also an --inside function: nothing is left to constrain");
    }
    Ok(inside)
}

/// Says which program weft stopped at when `program` is a script or an
/// exec wrapper it followed (`Process::launched_through`).
pub fn say_launched(program: &str, process: &Process) {
    let through = process.launched_through();
    if through.is_empty() {
        return;
    }
    let exe = std::fs::read_link(format!("/proc/{}/exe", process.pid()))
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "its program".into());
    eprintln!(
        "weft: {program} runs {exe} (through {}): measuring that",
        through.join(", ")
    );
}
