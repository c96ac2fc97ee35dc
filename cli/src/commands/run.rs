//! `weft run`: starts a program instrumented from before main, follows the
//! processes it forks (each with every call since its fork), and reports
//! when it exits; the program's exit status is weft's.

use super::attach::{finish_all, Family, Followed};
use crate::args::{check_trace_format, Measure, Output, Refusals};
use crate::kernel::{self, Patterns};
use crate::output::{write_report, Sink, StdoutClosed};
use crate::session::{Attached, Children};
use crate::wait;
use anyhow::{Context, Result};
use std::process::ExitCode;

// The arguments of `Command::Run` (their help is the variant's, in
// main.rs).
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Functions to count: names, globs (`work_*`), `MODULE:NAME`;
    /// repeat or separate with commas.
    #[arg(
        short = 'f',
        long = "function",
        value_name = "PATTERN",
        required = true
    )]
    functions: Vec<String>,
    #[command(flatten)]
    measure: Measure,
    #[command(flatten)]
    refusals: Refusals,
    #[command(flatten)]
    output: Output,
    /// Do not follow the processes the program forks. By default each
    /// (a server's workers) is instrumented with the same patterns from
    /// its fork on, and the report has every process, then the totals.
    #[arg(long)]
    no_follow: bool,
    /// The program and its arguments.
    #[arg(last = true, required = true, value_name = "PROGRAM")]
    command: Vec<String>,
}

/// Runs `weft run`.
pub fn exec(args: RunArgs) -> Result<ExitCode> {
    let RunArgs {
        functions,
        measure,
        refusals,
        output,
        no_follow,
        command,
    } = args;
    check_trace_format(&measure, &output).and_then(|()| {
        run_program(
            &functions, &measure, &refusals, &output, &command, !no_follow,
        )
    })
}

fn run_program(
    functions: &[String],
    measure: &Measure,
    refusals: &Refusals,
    output: &Output,
    command: &[String],
    follow: bool,
) -> Result<ExitCode> {
    let (program, args) = command.split_first().context("no program given after --")?;
    // Children are followed for the user functions (kernel probes are the
    // program's alone).
    let user = Patterns {
        user: kernel::split(functions)?.user,
        kernel: Vec::new(),
    };
    let mut attached = Attached::launch(program, args, functions, measure, refusals)?;
    let pid = attached.process.pid();
    // Every child is forked after the start (none is taken as already
    // there: those the program forked before this line are followed too).
    let family = Family {
        given: vec![pid],
        children: Vec::new(),
        follow,
    };
    let mut followed = Followed::new(&family);
    let mut others: Vec<(String, Attached)> = Vec::new();
    // Without following: its children running the same program, looked
    // at while it runs, for a hint.
    let mut children = Children::of(pid);
    let exit = attached.process.wait_exit_with(&mut || {
        if follow {
            others.extend(followed.look(&user, measure, refusals));
            for (_, a) in &mut others {
                a.tick();
            }
        } else {
            children.look();
        }
    })?;
    let code = ExitCode::from(exit.shell_code().clamp(0, 255) as u8);
    if !others.is_empty() {
        // Children still running are let go (they run on, uninstrumented).
        let mut all = vec![(
            weft::inspect::command(pid).unwrap_or_else(|| program.clone()),
            attached,
        )];
        all.extend(others);
        let report = finish_all(&mut all, wait::End::Signal)?;
        return match Sink::new(output).and_then(|mut s| s.write_processes(&report, true)) {
            Err(e) if e.is::<StdoutClosed>() => Ok(code),
            r => r.map(|()| code),
        };
    }
    let report = attached.finish(wait::End::TargetExited)?;
    if let Some(hint) = children.hint(&report) {
        eprintln!("{hint}");
    }
    match write_report(&report, output) {
        // The program's status still is weft's.
        Err(e) if e.is::<StdoutClosed>() => {}
        r => r?,
    }
    Ok(code)
}
