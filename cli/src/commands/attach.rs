//! `weft attach`: attaches to a running process, measures until it exits,
//! `--duration` ends or SIGINT/SIGTERM arrives (with live reports every
//! `--interval`, or scrapes of `--serve`), then takes everything out and
//! detaches.

use crate::args::{check_trace_format, seconds, Measure, Output, Refusals};
use crate::kernel::{self, Patterns};
use crate::output::{Sink, StdoutClosed};
use crate::serve;
use crate::session::{keep_until_exit, Attached};
use crate::timing::{monotonic_ns, Timing};
use crate::wait;
use anyhow::{bail, Result};
use std::process::ExitCode;
use weft::kernel::{Capabilities, Session};
use weft::report::{ProcessReport, ProcessesReport};
use weft::{RealtimeGuard, Report};

// The arguments of `Command::Attach` (their help is the variant's, in
// main.rs).
#[derive(clap::Args, Debug)]
pub struct AttachArgs {
    /// The process to attach to; several as a list (`-p 101,102`) or
    /// repeated (`-p 101 -p 102`), each instrumented with the same
    /// patterns and reported on its own, then in totals.
    #[arg(
        short = 'p',
        long = "pid",
        value_name = "PID",
        value_delimiter = ',',
        allow_hyphen_values = true,
        required_unless_present = "pid_of"
    )]
    pids: Vec<String>,
    /// Every process running the program NAME, as `pidof` finds them: the
    /// file name of its executable (or its whole path, with a slash), or
    /// its command; repeatable, and beside -p.
    #[arg(long = "pid-of", value_name = "NAME")]
    pid_of: Vec<String>,
    /// Also the processes the given ones have forked (their descendants
    /// now: a server's workers or backends), each instrumented with the
    /// same patterns where they match (a child that has none of the
    /// functions is left alone, and said), and those forked after the
    /// attach, each followed with every call it made since its fork.
    #[arg(long)]
    children: bool,
    /// Functions to count (as for `run`).
    #[arg(
        short = 'f',
        long = "function",
        value_name = "PATTERN",
        required = true
    )]
    functions: Vec<String>,
    /// Stop after this many seconds.
    // Taken as text, `-1` too, so that every bad value gets weft's
    // own error (see `seconds`), not clap's.
    #[arg(long, value_name = "SECS", allow_hyphen_values = true)]
    duration: Option<String>,
    /// Also write a report every SECS seconds while live (read without
    /// stopping the target); best with --format jsonl.
    #[arg(long, value_name = "SECS", allow_hyphen_values = true)]
    interval: Option<String>,
    /// Patterns that match nothing now wait for libraries the process
    /// loads later (dlopen): each is instrumented as it loads, before
    /// any of its code runs (the loading thread waits for weft, at
    /// most a second).
    #[arg(long)]
    later: bool,
    /// Serve the live figures at http://ADDR:PORT/metrics in the
    /// Prometheus text format (OpenMetrics when the scraper asks for
    /// it), read from the target on each scrape without stopping it;
    /// stays attached until SIGINT/SIGTERM or --duration. `PORT` or
    /// `:PORT` alone is loopback (127.0.0.1); port 0 picks a free one
    /// (printed). See docs/prometheus.md.
    #[arg(long, value_name = "ADDR:PORT")]
    serve: Option<String>,
    /// Allow a --serve address other than loopback: the metrics name
    /// the target's functions and threads, for anyone who can reach
    /// the port.
    #[arg(long)]
    serve_public: bool,
    /// With --serve: an exited thread keeps its own series this many
    /// seconds, then its figures fold into its functions' `tid="exited"`
    /// series (bounds the labels of a target whose threads come and go).
    #[arg(
        long,
        value_name = "SECS",
        default_value = "60",
        allow_hyphen_values = true
    )]
    fold_after: String,
    #[command(flatten)]
    measure: Measure,
    #[command(flatten)]
    refusals: Refusals,
    #[command(flatten)]
    output: Output,
}

/// Runs `weft attach`, keeping `boost` (real-time priority) to the end.
pub fn exec(args: AttachArgs, boost: Option<RealtimeGuard>) -> Result<ExitCode> {
    let AttachArgs {
        pids,
        pid_of,
        children,
        functions,
        duration,
        interval,
        later,
        serve,
        serve_public,
        fold_after,
        measure,
        refusals,
        output,
    } = args;
    let given = targets(&pids, &pid_of)?;
    let family = Family::of(&given, children);
    check_trace_format(&measure, &output).and_then(|()| {
        attach(
            &family,
            &functions,
            Live {
                duration,
                interval,
                later,
                serve,
                serve_public,
                fold_after,
            },
            &measure,
            &refusals,
            &output,
            boost,
        )
    })
}

/// How `attach` stays live.
struct Live {
    duration: Option<String>,
    interval: Option<String>,
    /// `--later`: patterns matching nothing yet wait for libraries loaded
    /// later.
    later: bool,
    /// `--serve ADDR:PORT`: where to serve /metrics.
    serve: Option<String>,
    /// `--serve-public`: a non-loopback `--serve` address is meant.
    serve_public: bool,
    /// `--fold-after SECS`: how long an exited thread keeps its own series.
    fold_after: String,
}

/// Writes a live report with `write` when the next is due (`--interval`),
/// unless one failed already; a reader that went away ends the wait.
/// Returns when the next one is due (for the wait's tick).
fn live_report_when_due(
    next: &mut Option<std::time::Instant>,
    interval: Option<std::time::Duration>,
    failed: &mut Option<anyhow::Error>,
    write: impl FnOnce() -> Result<()>,
) -> Option<std::time::Instant> {
    if let (Some(at), Some(every)) = (*next, interval) {
        if std::time::Instant::now() >= at && failed.is_none() {
            *failed = write().err();
            *next = Some(at + every);
            if failed.as_ref().is_some_and(|e| e.is::<StdoutClosed>()) {
                // Nobody reads any more: detach now.
                wait::stop_now();
            }
        }
    }
    next.filter(|_| failed.is_none())
}

/// The processes `-p` and `--pid-of` name, each once, in the order given.
pub(crate) fn targets(pids: &[String], names: &[String]) -> Result<Vec<i32>> {
    let mut all = Vec::new();
    for text in pids {
        match text.trim().parse::<i32>() {
            Ok(pid) if pid > 0 => all.push(pid),
            _ => bail!("bad PID {text:?}: give a process ID (a positive number), or --pid-of NAME"),
        }
    }
    for name in names {
        let found = weft::inspect::pids_of(name);
        if found.is_empty() {
            bail!(
                "no process runs {name:?} (--pid-of matches an executable's file name, \
                 its whole path with a slash, or a command, as pidof does)"
            );
        }
        all.extend(found);
    }
    let mut seen = std::collections::HashSet::new();
    all.retain(|pid| seen.insert(*pid));
    Ok(all)
}

/// The processes a session takes: those given, and with `--children`
/// their descendants at the attach (optional: one the patterns miss is
/// left alone).
pub(crate) struct Family {
    pub(crate) given: Vec<i32>,
    pub(crate) children: Vec<i32>,
    /// `--children`: follow children forked later.
    pub(crate) follow: bool,
}

impl Family {
    pub(crate) fn of(given: &[i32], follow: bool) -> Family {
        let mut children = Vec::new();
        if follow {
            for &pid in given {
                for child in weft::inspect::descendants(pid) {
                    if !given.contains(&child) && !children.contains(&child) {
                        children.push(child);
                    }
                }
            }
        }
        Family {
            given: given.to_vec(),
            children,
            follow,
        }
    }

    pub(crate) fn all(&self) -> Vec<i32> {
        self.given.iter().chain(&self.children).copied().collect()
    }
}

fn attach(
    family: &Family,
    functions: &[String],
    live: Live,
    measure: &Measure,
    refusals: &Refusals,
    output: &Output,
    boost: Option<RealtimeGuard>,
) -> Result<ExitCode> {
    let pid = match (
        family.given.as_slice(),
        family.children.is_empty() && !family.follow,
    ) {
        ([pid], true) => *pid,
        _ => return attach_several(family, functions, live, measure, refusals, output, boost),
    };
    let split = kernel::split(functions)?;
    let caps = kernel::capabilities(&split)?;
    let duration = seconds("duration", live.duration.as_deref(), false)?;
    let interval = seconds("interval", live.interval.as_deref(), true)?;
    let server = match &live.serve {
        Some(addr) => Some(serve::Server::start(addr, live.serve_public)?),
        None => None,
    };
    let fold_after = seconds("fold-after", Some(&live.fold_after), false)?.unwrap_or_default();
    let mut sink = Sink::new(output)?;
    wait::install_stop_handlers();
    if let (true, Some(caps)) = (split.user.is_empty(), &caps) {
        if server.is_some() {
            bail!("--serve needs at least one user function (-f NAME) next to kernel patterns");
        }
        drop(boost);
        attach_kernel_only(pid, &split, caps, duration, interval, &mut sink)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut attached = Attached::attach(pid, &split, caps.as_ref(), measure, refusals, live.later)?;
    eprintln!(
        "weft: attached pid={pid} threads={} functions={}",
        attached.threads, attached.functions
    );
    if std::env::var_os("WEFT_TIMING").is_some() {
        // For a harness timing the attach from before it started weft.
        eprintln!(
            "weft: timing: attached at CLOCK_MONOTONIC {} ns",
            monotonic_ns()
        );
    }
    if let Some(server) = &server {
        eprintln!(
            "weft: serving metrics at http://{}/metrics",
            server.local_addr()
        );
    }
    // Live, weft keeps its real-time priority to the end (the final
    // report and the detach included). It sleeps between readings, so this
    // costs the target only the readings themselves; at normal priority,
    // behind a target whose threads keep every CPU busy, each report waited
    // seconds for a turn and held counts already stale (issue #17).
    keep_until_exit(boost);
    let mut server = server.map(|s| {
        let exporter = serve::Exporter::new(
            &[pid],
            fold_after,
            measure.metrics.metrics,
            attached.functions,
        );
        (s, exporter)
    });
    let mut next_report = interval.map(|i| std::time::Instant::now() + i);
    let mut failed = None;
    let ended = wait::wait(pid, duration, &mut || {
        attached.tick();
        if let Some((server, exporter)) = &mut server {
            server.answer(|openmetrics| {
                let report = attached.live_report()?;
                exporter.exposition(&report, openmetrics)
            });
        }
        // Read live: the target is not stopped.
        live_report_when_due(&mut next_report, interval, &mut failed, || {
            attached
                .live_report()
                .and_then(|report| sink.write(&report, false))
        })
    });
    // No scrape is answered from a target being detached.
    drop(server);
    let timing = Timing::from_env();
    timing.note(&format!(
        "waiting ended at CLOCK_MONOTONIC {} ns",
        monotonic_ns()
    ));
    attached.children.look();
    let report = attached.finish(ended)?;
    if let Some(e) = failed {
        return Err(e);
    }
    if let Some(hint) = attached.children.hint(&report) {
        eprintln!("{hint}");
    }
    sink.write(&report, true)?;
    timing.note(&format!(
        "final report written at CLOCK_MONOTONIC {} ns",
        monotonic_ns()
    ));
    Ok(ExitCode::SUCCESS)
}

/// `attach` to several processes: each instrumented with the same
/// patterns (all or nothing: a process that cannot be leaves none of them
/// instrumented), then live until all have exited, `--duration` ends or
/// SIGINT/SIGTERM; each reported on its own, then in totals.
fn attach_several(
    family: &Family,
    functions: &[String],
    live: Live,
    measure: &Measure,
    refusals: &Refusals,
    output: &Output,
    boost: Option<RealtimeGuard>,
) -> Result<ExitCode> {
    let split = kernel::split(functions)?;
    if !split.kernel.is_empty() {
        bail!(
            "kernel patterns with several processes are not supported yet: run one weft per process"
        );
    }
    let duration = seconds("duration", live.duration.as_deref(), false)?;
    let interval = seconds("interval", live.interval.as_deref(), true)?;
    let server = match &live.serve {
        Some(addr) => Some(serve::Server::start(addr, live.serve_public)?),
        None => None,
    };
    let fold_after = seconds("fold-after", Some(&live.fold_after), false)?.unwrap_or_default();
    let mut sink = Sink::new(output)?;
    wait::install_stop_handlers();
    let mut attached = attach_family(family, &split, measure, refusals, live.later)?;
    if let Some(server) = &server {
        eprintln!(
            "weft: serving metrics at http://{}/metrics",
            server.local_addr()
        );
    }
    keep_until_exit(boost);
    let pids: Vec<i32> = attached.iter().map(|(_, a)| a.process.pid()).collect();
    let functions_total = attached.iter().map(|(_, a)| a.functions).sum();
    let mut server = server.map(|s| {
        let exporter =
            serve::Exporter::new(&pids, fold_after, measure.metrics.metrics, functions_total);
        (s, exporter)
    });
    let pids = std::cell::RefCell::new(pids);
    let mut children = Followed::new(family);
    let report = |attached: &[(String, Attached)]| -> Result<ProcessesReport> {
        let mut processes = Vec::new();
        for (command, a) in attached {
            processes.push(ProcessReport {
                command: command.clone(),
                exited: !a.process.is_alive(),
                report: a.live_report()?,
            });
        }
        Ok(ProcessesReport::new(processes))
    };
    let mut next_report = interval.map(|i| std::time::Instant::now() + i);
    let mut failed = None;
    let ended = wait::wait_all_of(&pids, duration, &mut || {
        for (_, a) in &mut attached {
            a.tick();
        }
        for (command, a) in children.look(&split, measure, refusals) {
            let pid = a.process.pid();
            pids.borrow_mut().push(pid);
            if let Some((_, exporter)) = &mut server {
                exporter.track(pid);
            }
            attached.push((command, a));
        }
        if let Some((server, exporter)) = &mut server {
            server.answer(|openmetrics| {
                let reports = attached
                    .iter()
                    .map(|(_, a)| Ok((a.process.pid(), !a.process.is_alive(), a.live_report()?)))
                    .collect::<Result<Vec<_>>>()?;
                let parts: Vec<serve::Part> = reports
                    .iter()
                    .map(|(pid, exited, report)| serve::Part {
                        pid: *pid,
                        exited: *exited,
                        report,
                    })
                    .collect();
                exporter.exposition_of(&parts, openmetrics)
            });
        }
        live_report_when_due(&mut next_report, interval, &mut failed, || {
            report(&attached).and_then(|r| sink.write_processes(&r, false))
        })
    });
    // No scrape is answered from targets being detached.
    drop(server);
    let report = finish_all(&mut attached, ended)?;
    if let Some(e) = failed {
        return Err(e);
    }
    sink.write_processes(&report, true)?;
    Ok(ExitCode::SUCCESS)
}

/// With `--children` (and `weft run`): the processes the family forks
/// after the attach,
/// each followed as it is seen (every 200 ms), with what it counted since
/// its fork (its probes are its parent's, inherited: see
/// [`Attached::follow`]).
pub(crate) struct Followed<'a> {
    family: &'a Family,
    known: std::collections::HashSet<i32>,
    looked: std::time::Instant,
}

impl<'a> Followed<'a> {
    pub(crate) fn new(family: &'a Family) -> Followed<'a> {
        Followed {
            family,
            known: family.all().into_iter().collect(),
            looked: std::time::Instant::now(),
        }
    }

    /// The children forked since the last look, attached (those that
    /// cannot be, such as one running another program, are said and left
    /// alone).
    pub(crate) fn look(
        &mut self,
        split: &Patterns,
        measure: &Measure,
        refusals: &Refusals,
    ) -> Vec<(String, Attached)> {
        let mut followed = Vec::new();
        if !self.family.follow || self.looked.elapsed() < std::time::Duration::from_millis(200) {
            return followed;
        }
        self.looked = std::time::Instant::now();
        for &root in &self.family.given {
            for child in weft::inspect::descendants(root) {
                if !self.known.insert(child) {
                    continue;
                }
                let command = weft::inspect::command(child).unwrap_or_default();
                match Attached::follow(child, split, measure, refusals) {
                    Ok(a) => {
                        eprintln!(
                            "weft: following pid={child} ({command}), forked after the attach: \
                             threads={} functions={}",
                            a.threads, a.functions
                        );
                        followed.push((command, a));
                    }
                    Err(e) => eprintln!(
                        "weft: pid {child} ({command}), forked after the attach, left alone: {e:#}"
                    ),
                }
            }
        }
        followed
    }
}

/// Attaches to every process of `family` (see [`attach_several`]).
pub(crate) fn attach_family(
    family: &Family,
    split: &Patterns,
    measure: &Measure,
    refusals: &Refusals,
    later: bool,
) -> Result<Vec<(String, Attached)>> {
    let mut attached: Vec<(String, Attached)> = Vec::new();
    for pid in family.all() {
        let command = weft::inspect::command(pid).unwrap_or_default();
        let result = Attached::attach(pid, split, None, measure, refusals, later);
        if let (Err(e), true) = (&result, family.children.contains(&pid)) {
            // A child is optional: one running another program (a shell,
            // a helper), or gone meanwhile, is left alone.
            eprintln!("weft: pid {pid} ({command}), a child, left alone: {e:#}");
            continue;
        }
        match result {
            Ok(a) => {
                // The same line as for one process, once per process.
                eprintln!(
                    "weft: attached pid={pid} threads={} functions={}",
                    a.threads, a.functions
                );
                attached.push((command, a));
            }
            Err(e) => {
                // All or nothing: the processes done so far are let go.
                for (_, a) in &mut attached {
                    let _ = a.finish(wait::End::Signal);
                }
                return Err(e.context(format!("pid {pid} ({command})")));
            }
        }
    }
    Ok(attached)
}

/// Takes everything out of every process still there and detaches, each
/// whatever happened to another; their final reports.
pub(crate) fn finish_all(
    attached: &mut [(String, Attached)],
    ended: wait::End,
) -> Result<ProcessesReport> {
    let mut processes = Vec::new();
    let mut first_error = None;
    for (command, a) in attached {
        let exited = !a.process.is_alive();
        let end = if exited {
            wait::End::TargetExited
        } else {
            ended
        };
        match a.finish(end) {
            Ok(report) => processes.push(ProcessReport {
                command: command.clone(),
                exited,
                report,
            }),
            Err(e) => {
                let pid = a.process.pid();
                first_error.get_or_insert(e.context(format!("pid {pid} ({command})")));
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(ProcessesReport::new(processes)),
    }
}

/// `attach` with kernel patterns only: no ptrace, no runtime, any process
/// (statically linked ones too); live reports every `interval`.
fn attach_kernel_only(
    pid: i32,
    patterns: &Patterns,
    caps: &Capabilities,
    duration: Option<std::time::Duration>,
    interval: Option<std::time::Duration>,
    sink: &mut Sink,
) -> Result<()> {
    if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
        bail!("no process {pid}: give the PID of a running process");
    }
    let session = Session::start(pid, &patterns.kernel, caps, None)?;
    let started = std::time::Instant::now();
    eprintln!(
        "weft: attached pid={pid} threads={} functions={}",
        std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count()),
        session.probes().len()
    );
    let report = |session: &Session| -> Result<Report> {
        Ok(Report::of_kernel(
            pid,
            started.elapsed().as_nanos() as u64,
            &session.snapshot()?,
        ))
    };
    let mut next = interval.map(|i| std::time::Instant::now() + i);
    let mut failed = None;
    wait::wait(pid, duration, &mut || {
        if let (Some(at), Some(every)) = (next, interval) {
            if std::time::Instant::now() >= at && failed.is_none() {
                failed = report(&session).and_then(|r| sink.write(&r, false)).err();
                next = Some(at + every);
                if failed.as_ref().is_some_and(|e| e.is::<StdoutClosed>()) {
                    wait::stop_now();
                }
            }
        }
        next.filter(|_| failed.is_none())
    });
    if let Some(e) = failed {
        return Err(e);
    }
    let last = report(&session)?;
    drop(session);
    sink.write(&last, true)
}
