//! The `weft` command: a thin client of the `weft` library. `main` parses
//! the command line, runs the command (`commands::*::exec`) and turns its
//! error into one line on standard error and exit status 1.
//!
//! Modules depend one way: `main` → `commands` → the shared helpers
//! (`args`, `output`, `session`, `kernel`, `serve`, `tui`, `wait`,
//! `timing`) → the `weft` library.

mod args;
mod commands;
mod hints;
mod kernel;
mod output;
mod serve;
mod session;
mod timing;
mod tui;
mod wait;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};
use output::StdoutClosed;
use std::path::PathBuf;
use std::process::ExitCode;
use timing::since_start_ms;
use weft::RealtimeGuard;

/// Measure any function of a running threaded program, per thread, without
/// restarting or recompiling it.
#[derive(Parser, Debug)]
#[command(name = "weft", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Also look for separate debug files of stripped programs and
    /// libraries in DIR (laid out like /usr/lib/debug), before
    /// $WEFT_DEBUG_DIRS or /usr/lib/debug; repeatable (docs/debug-files.md).
    #[arg(long = "debug-dir", value_name = "DIR", global = true)]
    debug_dirs: Vec<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start PROGRAM instrumented from before main; report when it exits.
    Run(commands::run::RunArgs),
    /// Attach to a running process, count until it exits, --duration ends,
    /// or SIGINT/SIGTERM; then remove everything and detach.
    Attach(commands::attach::AttachArgs),
    /// A live full-screen view of a running process's functions and
    /// threads (or of PROGRAM, started instrumented): calls per second,
    /// shares of wall and CPU time, inclusive and self time. Keys: q quit,
    /// s sort, t threads, [ ] thread filter, p pause. Plain tables every
    /// interval when standard output is not a terminal.
    Top(commands::top::TopArgs),
    /// List the functions of a running process: MODULE ADDRESS SIZE NAME.
    List(commands::list::ListArgs),
    /// Find a running process's bottlenecks by itself (the Performance
    /// Consultant): tests CPU-bound, lock-waiting and I/O-blocking
    /// hypotheses per thread down the call graph, instrumenting only what
    /// each test needs. See docs/diagnose.md.
    Diagnose(commands::diagnose::DiagnoseArgs),
    /// Say what this machine lets weft do: BPF, BTF, syscall and
    /// scheduler tracepoints, fentry/fexit, kprobes (each tried on the
    /// running kernel, with the reason when it is missing), ptrace.
    Doctor,
    /// Start a bundled threaded server, attach, show live per-thread counts,
    /// detach, and check the counts against the server's own.
    Demo(commands::demo::DemoArgs),
    /// The demo's target program (started by `weft demo`).
    #[command(name = "__demo-target", hide = true)]
    DemoTarget(commands::demo::DemoTargetArgs),
}

/// Real-time priority raised by [`boost_early`], for `main` to take.
static EARLY_BOOST: std::sync::Mutex<Option<RealtimeGuard>> = std::sync::Mutex::new(None);

/// An attach to a target whose threads keep the CPUs busy is at the
/// scheduler's mercy from weft's first instruction on (preempted once, weft
/// waits 100-400 ms for its next turn): real-time priority as early as the
/// loader lets weft have it. This constructor runs before the others of
/// the executable (its `.init_array` priority): any sleep or page fault
/// before `main` at normal priority (`weft-rt`'s constructor once slept
/// 10 ms here) cost 150-400 ms behind a busy target's threads.
/// Not for a setuid or setgid weft, which refuses to run at all.
extern "C" fn boost_early() {
    // SAFETY: these getters have no preconditions and cannot fail.
    let setid = unsafe { libc::getuid() != libc::geteuid() || libc::getgid() != libc::getegid() };
    if setid {
        return;
    }
    if let Ok(mut slot) = EARLY_BOOST.lock() {
        *slot = RealtimeGuard::raise();
    }
}

#[used]
#[link_section = ".init_array.00100"]
static BOOST_EARLY: extern "C" fn() = boost_early;

fn main() -> ExitCode {
    // Kept by `attach` and `top` for the whole session (they sleep between
    // readings), dropped at once by the other commands.
    let early = EARLY_BOOST.lock().ok().and_then(|mut slot| slot.take());
    let boost = early.or_else(RealtimeGuard::raise);
    if std::env::var_os("WEFT_TIMING").is_some() {
        eprintln!(
            "weft: timing: weft's own start-up (process created to main, ±10 ms): {:.0} ms",
            since_start_ms()
        );
    }
    let cli = Cli::parse();
    match run(cli, boost) {
        Ok(code) => code,
        // The reader of standard output went away (`weft list ... | head`):
        // weft stops writing and ends quietly, after removing its probes.
        Err(e) if e.is::<StdoutClosed>() => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("weft: error: {}", hints::with_hint(one_line(&e), &e));
            ExitCode::from(1)
        }
    }
}

/// The error and its causes on one line, leaving out a cause whose text
/// the message before it already contains (library errors embed theirs).
fn one_line(error: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if !message.contains(&text) {
            if !message.is_empty() {
                message.push_str(": ");
            }
            message.push_str(&text);
        }
    }
    message.replace('\n', " ")
}

/// weft installed setuid or setgid would let any user ptrace, read and
/// patch the processes of the file's owner: refuse to run at all.
fn refuse_setuid() -> Result<()> {
    // SAFETY: these getters have no preconditions and cannot fail.
    let (uid, euid, gid, egid) = unsafe {
        (
            libc::getuid(),
            libc::geteuid(),
            libc::getgid(),
            libc::getegid(),
        )
    };
    if uid != euid || gid != egid {
        bail!(
            "weft is running setuid or setgid (uid {uid}, euid {euid}, gid {gid}, egid {egid}): \
             that would give every user ptrace over the owner's processes; remove the bit \
             (chmod u-s,g-s) and grant CAP_SYS_PTRACE to the people who need it instead"
        );
    }
    Ok(())
}

fn run(cli: Cli, boost: Option<RealtimeGuard>) -> Result<ExitCode> {
    let boost = match cli.command {
        Command::Attach { .. } | Command::Top { .. } => boost,
        _ => {
            drop(boost);
            None
        }
    };
    refuse_setuid()?;
    weft::inspect::set_debug_dirs(cli.debug_dirs);
    weft::inspect::set_debug_note_reporter(|note| eprintln!("weft: {}", hints::debug_note(note)));
    dispatch(cli.command, boost)
}

/// Runs `command`; `boost` (real-time priority) is kept by the live ones.
fn dispatch(command: Command, boost: Option<RealtimeGuard>) -> Result<ExitCode> {
    match command {
        Command::Run(args) => commands::run::exec(args),
        Command::Diagnose(args) => commands::diagnose::exec(args),
        Command::Attach(args) => commands::attach::exec(args, boost),
        Command::Top(args) => commands::top::exec(args, boost),
        Command::List(args) => commands::list::exec(args),
        Command::Doctor => commands::doctor::exec(),
        Command::Demo(args) => commands::demo::exec(args),
        Command::DemoTarget(args) => commands::demo::exec_target(args),
    }
}
