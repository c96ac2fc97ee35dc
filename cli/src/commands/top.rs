//! `weft top`: a live full-screen view of a process's instrumented
//! functions and threads, like `top` or `py-spy top`. Each reading is a
//! live report (the target is never stopped for it); rates and shares are
//! the difference between two readings.
//!
//! The terminal is restored whatever ends the view: `q`, SIGINT/SIGTERM,
//! the target's exit, an error, or a panic (`tui::Screen`, a guard).

use crate::args::{seconds, Measure, Refusals};
use crate::kernel;
use crate::output::{to_stdout, StdoutClosed};
use crate::session::{keep_until_exit, Attached};
use crate::tui::{full_screen, Pace, View};
use crate::wait;
use anyhow::{bail, Context, Result};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Instant;
use weft::RealtimeGuard;

// The arguments of `Command::Top` (their help is the variant's, in
// main.rs).
#[derive(clap::Args, Debug)]
pub struct TopArgs {
    /// The process (or give `-- PROGRAM ARGS` to start one).
    #[arg(short = 'p', long = "pid")]
    pid: Option<i32>,
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
        pid,
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
    let target = match (pid, command.split_first()) {
        (Some(pid), None) => Target::Pid(pid),
        (None, Some((program, args))) => Target::Launch(program.clone(), args.to_vec()),
        (Some(_), Some(_)) => bail!("give either -p PID or -- PROGRAM ARGS, not both"),
        (None, None) => {
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
    Pid(i32),
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
        Target::Pid(pid) => {
            let split = kernel::split(functions)?;
            if split.user.is_empty() {
                anyhow::bail!(
                    "weft top needs at least one user function (-f NAME) next to kernel patterns"
                );
            }
            let caps = kernel::capabilities(&split)?;
            (
                Attached::attach(*pid, &split, caps.as_ref(), measure, refusals, false)?,
                false,
            )
        }
        Target::Launch(program, args) => (
            Attached::launch(program, args, functions, measure, refusals)
                .with_context(|| format!("starting {program}"))?,
            true,
        ),
    };
    // Kept while live: the view is redrawn on time however busy the
    // target keeps the CPUs (weft sleeps between readings; see `attach`).
    keep_until_exit(boost);
    let pid = attached.process.pid();
    eprintln!(
        "weft: attached pid={pid} threads={} functions={}",
        attached.threads, attached.functions
    );
    let view = View::new(pid, attached.functions);
    let outcome = if std::io::stdout().is_terminal() {
        full_screen(&mut attached, view, &pace)
    } else {
        plain(&mut attached, &pace)
    };
    let ended = match outcome {
        Ok(ended) => ended,
        Err(e) => {
            // Nothing stays in the target whatever went wrong.
            let _ = attached.finish(wait::End::Signal);
            return Err(e);
        }
    };
    let report = attached.finish(ended)?;
    eprintln!(
        "weft: detached from {pid} ({} calls counted)",
        report.functions.iter().map(|f| f.calls).sum::<u64>()
    );
    if !launched || ended == wait::End::TargetExited {
        return Ok(ExitCode::SUCCESS);
    }
    // The program weft started runs to its end, uninstrumented now.
    let code = attached.process.wait_exit().map_or(1, |e| e.shell_code());
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

/// Standard output is no terminal: a plain table every interval.
fn plain(attached: &mut Attached, pace: &Pace) -> Result<wait::End> {
    let pid = attached.process.pid();
    let mut next = Instant::now() + pace.interval;
    let mut failed = None;
    let started = Instant::now();
    let ended = wait::wait(pid, pace.duration, &mut || {
        attached.tick();
        if Instant::now() >= next && failed.is_none() {
            next += pace.interval;
            failed = attached
                .live_report()
                .and_then(|r| {
                    let text = format!(
                        "weft top: pid {pid}, {:.1} s\n{}\n",
                        started.elapsed().as_secs_f64(),
                        r.to_table_with(&crate::hints::table_options())
                    );
                    to_stdout(text.as_bytes())
                })
                .err();
            if failed.is_some() {
                wait::stop_now();
            }
        }
        Some(next)
    });
    match failed {
        Some(e) if !e.is::<StdoutClosed>() => Err(e),
        _ => Ok(ended),
    }
}
