//! `weft top`: a live full-screen view of the instrumented functions and
//! threads of a process, or of several (`-p A,B`, `--pid-of NAME`,
//! `--children`), like `top` or `py-spy top`. Each reading is a live
//! report (the targets are never stopped for it); rates and shares are the
//! difference between two readings.
//!
//! The terminal is restored whatever ends the view: `q`, SIGINT/SIGTERM,
//! the target's exit, an error, or a panic (`tui::Screen`, a guard).

use super::attach::{attach_family, finish_all, targets, Family, Followed};
use crate::args::{seconds, Measure, Refusals};
use crate::kernel::{self, Patterns};
use crate::output::{to_stdout, StdoutClosed};
use crate::session::{keep_until_exit, Attached};
use crate::tui::{full_screen, reading, Pace, Part, View};
use crate::wait;
use anyhow::{bail, Context, Result};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Instant;
use weft::report::{ProcessReport, ProcessesReport};
use weft::RealtimeGuard;

// The arguments of `Command::Top` (their help is the variant's, in
// main.rs).
#[derive(clap::Args, Debug)]
pub struct TopArgs {
    /// The process (or give `-- PROGRAM ARGS` to start one); several as
    /// a list (`-p 101,102`) or repeated, shown merged or one at a time.
    #[arg(
        short = 'p',
        long = "pid",
        value_name = "PID",
        value_delimiter = ',',
        allow_hyphen_values = true
    )]
    pids: Vec<String>,
    /// Every process running the program NAME, as `pidof` finds them (as
    /// for `attach`).
    #[arg(long = "pid-of", value_name = "NAME")]
    pid_of: Vec<String>,
    /// Also the descendants of the given processes (a server's workers),
    /// those now and those forked later, each instrumented where the
    /// patterns match and counted from its fork.
    #[arg(long)]
    children: bool,
    /// Functions to watch (as for `run`).
    #[arg(
        short = 'f',
        long = "function",
        value_name = "PATTERN",
        required = true
    )]
    functions: Vec<String>,
    /// Seconds between two readings.
    #[arg(
        long,
        value_name = "SECS",
        default_value = "1",
        allow_hyphen_values = true
    )]
    interval: String,
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECS", allow_hyphen_values = true)]
    duration: Option<String>,
    #[command(flatten)]
    measure: Measure,
    #[command(flatten)]
    refusals: Refusals,
    /// A program to start and watch, with its arguments (instead of
    /// -p).
    #[arg(last = true, value_name = "PROGRAM")]
    command: Vec<String>,
}

/// Runs `weft top`: checks the arguments, then [`top`].
pub fn exec(args: TopArgs, boost: Option<RealtimeGuard>) -> Result<ExitCode> {
    let TopArgs {
        pids,
        pid_of,
        children,
        functions,
        interval,
        duration,
        measure,
        refusals,
        command,
    } = args;
    if measure.metrics.trace {
        bail!(
            "weft top shows counts and times, not a call trace: drop `trace` from -m, \
             or record one with `weft attach -m calls,wall,trace --format chrome-trace`"
        );
    }
    let interval = seconds("interval", Some(&interval), true)?.unwrap_or_default();
    let duration = seconds("duration", duration.as_deref(), false)?;
    let given = !pids.is_empty() || !pid_of.is_empty();
    let target = match (given, command.split_first()) {
        (true, None) => Target::Pids(Family::of(&targets(&pids, &pid_of)?, children)),
        (false, Some((program, args))) if !children => {
            Target::Launch(program.clone(), args.to_vec())
        }
        (false, Some(_)) => bail!("--children takes the children of -p or --pid-of processes"),
        (true, Some(_)) => bail!("give either -p PID (or --pid-of) or -- PROGRAM ARGS, not both"),
        (false, None) => {
            bail!("nothing to watch: give -p PID, or -- PROGRAM ARGS to start a program")
        }
    };
    top(
        target,
        &functions,
        &measure,
        &refusals,
        Pace { interval, duration },
        boost,
    )
}

/// What to watch.
enum Target {
    /// Running processes (with `--children`, their descendants too).
    Pids(Family),
    /// A program to start instrumented (it runs on, uninstrumented, after
    /// the view ends; weft waits for it).
    Launch(String, Vec<String>),
}

/// `weft top`.
fn top(
    target: Target,
    functions: &[String],
    measure: &Measure,
    refusals: &Refusals,
    pace: Pace,
    boost: Option<RealtimeGuard>,
) -> Result<ExitCode> {
    wait::install_stop_handlers();
    let (mut attached, launched) = match &target {
        Target::Pids(family) => (attach_target(family, functions, measure, refusals)?, false),
        Target::Launch(program, args) => (
            vec![(
                program.clone(),
                Attached::launch(program, args, functions, measure, refusals)
                    .with_context(|| format!("starting {program}"))?,
            )],
            true,
        ),
    };
    // Kept while live: the view is redrawn on time however busy the
    // target keeps the CPUs (weft sleeps between readings; see `attach`).
    keep_until_exit(boost);
    let pids: Vec<i32> = attached.iter().map(|(_, a)| a.process.pid()).collect();
    if let [(_, a)] = attached.as_slice() {
        // Several processes said so each as they were attached.
        eprintln!(
            "weft: attached pid={} threads={} functions={}",
            pids[0], a.threads, a.functions
        );
    }
    let instrumented = attached.iter().map(|(_, a)| a.functions).sum();
    let view = View::new(pids.clone(), instrumented);
    // With --children, the processes forked from now on too.
    let no_family = Family {
        given: Vec::new(),
        children: Vec::new(),
        follow: false,
    };
    let family = match &target {
        Target::Pids(family) => family,
        Target::Launch(..) => &no_family,
    };
    let user = Patterns {
        user: kernel::split(functions)?.user,
        kernel: Vec::new(),
    };
    let mut followed = Followed::new(family);
    let mut more = || followed.look(&user, measure, refusals);
    let outcome = if std::io::stdout().is_terminal() {
        full_screen(&mut attached, view, &pace, &mut more)
    } else {
        plain(&mut attached, &pace, &mut more, family.follow)
    };
    let pids: Vec<i32> = attached.iter().map(|(_, a)| a.process.pid()).collect();
    let ended = match outcome {
        Ok(ended) => ended,
        Err(e) => {
            // Nothing stays in any target whatever went wrong.
            let _ = finish_all(&mut attached, wait::End::Signal);
            return Err(e);
        }
    };
    let report = finish_all(&mut attached, ended)?;
    let calls: u64 = report
        .processes
        .iter()
        .flat_map(|p| &p.report.functions)
        .map(|f| f.calls)
        .sum();
    let pids_text: Vec<String> = pids.iter().map(i32::to_string).collect();
    eprintln!(
        "weft: detached from {} ({calls} calls counted)",
        pids_text.join(",")
    );
    if !launched || ended == wait::End::TargetExited {
        return Ok(ExitCode::SUCCESS);
    }
    // The program weft started runs to its end, uninstrumented now.
    let code = attached[0]
        .1
        .process
        .wait_exit()
        .map_or(1, |e| e.shell_code());
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

/// Attaches to the processes of `family`: one alone as `attach` would
/// (kernel patterns too), several as `attach -p A,B` does (all or none).
fn attach_target(
    family: &Family,
    functions: &[String],
    measure: &Measure,
    refusals: &Refusals,
) -> Result<Vec<(String, Attached)>> {
    let split = kernel::split(functions)?;
    if split.user.is_empty() {
        bail!("weft top needs at least one user function (-f NAME) next to kernel patterns");
    }
    if let ([pid], true) = (family.given.as_slice(), family.children.is_empty()) {
        let caps = kernel::capabilities(&split)?;
        let command = weft::inspect::command(*pid).unwrap_or_default();
        let a = Attached::attach(*pid, &split, caps.as_ref(), measure, refusals, false)?;
        return Ok(vec![(command, a)]);
    }
    if !split.kernel.is_empty() {
        bail!(
            "kernel patterns with several processes are not supported yet: run one weft top per \
             process"
        );
    }
    attach_family(family, &split, measure, refusals, false)
}

/// Standard output is no terminal: a plain table every interval (with
/// several processes, each one's and their totals). `more` gives the
/// processes followed since the last call.
fn plain(
    attached: &mut Vec<(String, Attached)>,
    pace: &Pace,
    more: &mut dyn FnMut() -> Vec<(String, Attached)>,
    more_possible: bool,
) -> Result<wait::End> {
    let pids = std::cell::RefCell::new(
        attached
            .iter()
            .map(|(_, a)| a.process.pid())
            .collect::<Vec<i32>>(),
    );
    let mut next = Instant::now() + pace.interval;
    let mut failed = None;
    let started = Instant::now();
    let mut tick = || {
        for (command, a) in more() {
            pids.borrow_mut().push(a.process.pid());
            attached.push((command, a));
        }
        for (_, a) in attached.iter_mut() {
            a.tick();
        }
        if Instant::now() >= next && failed.is_none() {
            next += pace.interval;
            failed = reading(attached)
                .and_then(|parts| {
                    let text = format!(
                        "weft top: {}, {:.1} s\n{}\n",
                        watched(&pids.borrow()),
                        started.elapsed().as_secs_f64(),
                        table(attached, parts)
                    );
                    to_stdout(text.as_bytes())
                })
                .err();
            if failed.is_some() {
                wait::stop_now();
            }
        }
        Some(next)
    };
    let single = match pids.borrow().as_slice() {
        [pid] => Some(*pid),
        _ => None,
    };
    let ended = match single {
        Some(pid) if !more_possible => wait::wait(pid, pace.duration, &mut tick),
        _ => wait::wait_all_of(&pids, pace.duration, &mut tick),
    };
    match failed {
        Some(e) if !e.is::<StdoutClosed>() => Err(e),
        _ => Ok(ended),
    }
}

/// `pid N`, or `pids A,B,C`.
fn watched(pids: &[i32]) -> String {
    let list: Vec<String> = pids.iter().map(i32::to_string).collect();
    match pids {
        [_] => format!("pid {}", list[0]),
        _ => format!("pids {}", list.join(",")),
    }
}

/// One reading as `attach` prints a report: one process's table, or each
/// process's and the totals.
fn table(attached: &[(String, Attached)], parts: Vec<Part>) -> String {
    let options = crate::hints::table_options();
    if let [part] = parts.as_slice() {
        return part.report.to_table_with(&options);
    }
    let processes = parts
        .into_iter()
        .zip(attached)
        .map(|(part, (_, a))| ProcessReport {
            command: part.command,
            exited: !a.process.is_alive(),
            report: part.report,
        })
        .collect();
    ProcessesReport::new(processes).to_table_with(&options)
}
