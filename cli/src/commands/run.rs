//! `weft run`: starts a program instrumented from before main and reports
//! when it exits; the program's exit status is weft's.

use crate::args::{check_trace_format, Measure, Output, Refusals};
use crate::output::{write_report, StdoutClosed};
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
        command,
    } = args;
    check_trace_format(&measure, &output)
        .and_then(|()| run_program(&functions, &measure, &refusals, &output, &command))
}

fn run_program(
    functions: &[String],
    measure: &Measure,
    refusals: &Refusals,
    output: &Output,
    command: &[String],
) -> Result<ExitCode> {
    let (program, args) = command.split_first().context("no program given after --")?;
    let mut attached = Attached::launch(program, args, functions, measure, refusals)?;
    // Its children running the same program, looked at while it runs (a
    // thread of weft's that only reads /proc).
    let running = std::sync::atomic::AtomicBool::new(true);
    let mut children = Children::of(attached.process.pid());
    let exit = std::thread::scope(|scope| {
        let watch = scope.spawn(|| {
            while running.load(std::sync::atomic::Ordering::Relaxed) {
                children.look();
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        });
        let exit = attached.process.wait_exit();
        running.store(false, std::sync::atomic::Ordering::Relaxed);
        let _ = watch.join();
        exit
    })?;
    let report = attached.finish(wait::End::TargetExited)?;
    if let Some(hint) = children.hint(&report) {
        eprintln!("{hint}");
    }
    match write_report(&report, output) {
        // The program's status still is weft's.
        Err(e) if e.is::<StdoutClosed>() => {}
        r => r?,
    }
    Ok(ExitCode::from(exit.shell_code().clamp(0, 255) as u8))
}
