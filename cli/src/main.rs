//! The `weft` command: a thin client of the `weft` library.

mod cli_demo;
mod cli_diagnose;
mod cli_kernel;
mod cli_serve;
mod cli_top;
mod cli_wait;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use std::fmt::Write as _;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::ExitCode;
use weft::RealtimeGuard;
use weft::{Pattern, Process, Report};

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

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum Format {
    /// A per-thread table for people.
    Table,
    /// One JSON object (see docs/report-format.md).
    Json,
    /// JSON Lines: one report per line (with --interval, one per interval
    /// while live, then the final one); each has "final": false or true.
    Jsonl,
    /// The call trace (needs `-m …,trace`) as Trace Event Format JSON, one
    /// track per thread: for the Perfetto UI, chrome://tracing, speedscope
    /// (docs/trace.md). Written once, at the end.
    ChromeTrace,
    /// The call trace (needs `-m …,trace`) as an SVG flame graph of wall
    /// time by call path, merged over the threads (one tower per thread
    /// with --by-thread; docs/trace.md).
    Flamegraph,
}

/// What to measure.
#[derive(clap::Args, Debug)]
struct Measure {
    /// Metrics, comma-separated: `calls` (entry counter only, cheapest),
    /// `wall` and `cpu` (per-thread inclusive time of each function's
    /// outermost activation; these hook the function's exit), `trace`
    /// (every call's entry and exit with a timestamp, per thread, for
    /// `--format chrome-trace` or `flamegraph`; docs/trace.md).
    #[arg(
        short = 'm',
        long = "metrics",
        value_name = "LIST",
        default_value = "calls,wall,cpu",
        value_parser = parse_metrics
    )]
    metrics: MetricList,
    /// Latency histograms of each timed function's outermost calls (log2
    /// buckets of their wall time, per thread; 320 bytes per function and
    /// thread, a few ns per call): `on` (`--histogram`) with `-m wall`,
    /// `auto` with `-m wall` for up to 16 functions, `off` (the default)
    /// never.
    #[arg(
        long,
        value_enum,
        value_name = "WHEN",
        default_value = "off",
        num_args = 0..=1,
        default_missing_value = "on"
    )]
    histogram: HistogramMode,
}

/// When latency histograms are kept (`--histogram`).
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum HistogramMode {
    /// With wall time, for up to `HISTOGRAM_AUTO_MAX` functions.
    Auto,
    /// With wall time, always.
    On,
    /// Never.
    Off,
}

/// `--histogram=auto` keeps histograms up to this many functions: 16 ×
/// 320 bytes = 5 KiB per thread (docs/report-format.md).
const HISTOGRAM_AUTO_MAX: usize = 16;

impl Measure {
    /// The metrics for `functions` functions (whether they keep a
    /// histogram depends on how many there are).
    fn metrics_for(&self, functions: usize) -> weft::Metrics {
        let keep = match self.histogram {
            HistogramMode::Auto => functions <= HISTOGRAM_AUTO_MAX,
            HistogramMode::On => true,
            HistogramMode::Off => false,
        };
        self.metrics.metrics.with_histogram(keep)
    }
}

/// `-m`: the metrics of each probe, and whether calls are traced.
#[derive(Clone, Copy, Debug)]
struct MetricList {
    metrics: weft::Metrics,
    trace: bool,
}

fn parse_metrics(text: &str) -> Result<MetricList, String> {
    let (metrics, trace) = weft::Metrics::parse_with_trace(text)?;
    Ok(MetricList { metrics, trace })
}

fn parse_sort(text: &str) -> Result<weft::report::SortKey, String> {
    weft::report::SortKey::parse(text)
}

/// What to do with the functions a pattern matches that cannot be
/// instrumented safely.
#[derive(clap::Args, Debug)]
struct Refusals {
    /// List every function weft refused to instrument, with the reason
    /// (after the one-line summary on standard error).
    #[arg(long)]
    explain: bool,
    /// All or nothing: one function refused refuses the whole request and
    /// nothing is changed. By default a glob (`-f 'libc.so.6:*'`)
    /// instruments every function it matches that can be instrumented
    /// safely and says how many it refused; a name given exactly that is
    /// refused fails the request either way.
    #[arg(long)]
    strict: bool,
}

#[derive(clap::Args, Debug)]
struct Output {
    /// Report format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
    /// Write the report to FILE instead of standard output.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    /// Table: show the first N functions (and threads) of the long table,
    /// one row per function (0: all; default 50). More than 4 functions
    /// always get the long table.
    #[arg(long, value_name = "N")]
    top: Option<usize>,
    /// Table: order of the long table's rows: calls, wall, cpu, self or
    /// name (default: wall time, else cpu time, else calls).
    #[arg(long, value_name = "KEY", value_parser = parse_sort)]
    sort: Option<weft::report::SortKey>,
    /// Table: each thread's own function rows after the functions.
    /// Flame graph: one tower per thread (named and with its TID) instead
    /// of the threads merged.
    #[arg(long)]
    by_thread: bool,
    /// Table: show the latency histogram of FUNCTION (repeatable; default:
    /// the first 3 rows that keep one).
    #[arg(long = "histogram-of", value_name = "FUNCTION")]
    histogram_of: Vec<String>,
}

impl Output {
    fn table(&self) -> weft::report::TableOptions {
        weft::report::TableOptions {
            top: self.top,
            sort: self.sort,
            by_thread: self.by_thread,
            histograms: self.histogram_of.clone(),
        }
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start PROGRAM instrumented from before main; report when it exits.
    Run {
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
    },
    /// Attach to a running process, count until it exits, --duration ends,
    /// or SIGINT/SIGTERM; then remove everything and detach.
    Attach {
        /// The process to attach to.
        #[arg(short = 'p', long = "pid")]
        pid: i32,
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
    },
    /// A live full-screen view of a running process's functions and
    /// threads (or of PROGRAM, started instrumented): calls per second,
    /// shares of wall and CPU time, inclusive and self time. Keys: q quit,
    /// s sort, t threads, [ ] thread filter, p pause. Plain tables every
    /// interval when standard output is not a terminal.
    Top {
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
    },
    /// List the functions of a running process: MODULE ADDRESS SIZE NAME.
    List {
        /// The process.
        #[arg(short = 'p', long = "pid")]
        pid: i32,
        /// Add a fifth column, FILE:LINE of each function's first line
        /// from DWARF (the module's or its debug file's), `-` if unknown.
        #[arg(long)]
        lines: bool,
        /// Only functions matching one of these patterns (as for `run`;
        /// each function is listed once). A pattern that matches nothing
        /// is named on standard error and makes the status 1.
        #[arg(value_name = "PATTERN")]
        patterns: Vec<String>,
    },
    /// Find a running process's bottlenecks by itself (the Performance
    /// Consultant): tests CPU-bound, lock-waiting and I/O-blocking
    /// hypotheses per thread down the call graph, instrumenting only what
    /// each test needs. See docs/diagnose.md.
    Diagnose {
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
        format: cli_diagnose::DiagnoseFormat,
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
    },
    /// Say what this machine lets weft do: BPF, BTF, syscall and
    /// scheduler tracepoints, fentry/fexit, kprobes (each tried on the
    /// running kernel, with the reason when it is missing), ptrace.
    Doctor,
    /// Start a bundled threaded server, attach, show live per-thread counts,
    /// detach, and check the counts against the server's own.
    Demo {
        /// Worker threads.
        #[arg(long, default_value_t = 4)]
        threads: usize,
        /// Requests each worker serves (more takes longer).
        #[arg(long, default_value_t = 150_000)]
        requests: u64,
    },
    /// The demo's target program (started by `weft demo`).
    #[command(name = "__demo-target", hide = true)]
    DemoTarget {
        #[arg(long)]
        threads: usize,
        #[arg(long)]
        requests: u64,
    },
}

/// Keeps a live session's real-time priority until the process exits.
/// Dropped at the end of the session, the guard gave back normal priority
/// before weft's teardown (dropping the session, unmapping the region,
/// exiting), which then waited 0.2-0.35 s behind a busy target's threads
/// (200 here) after the final report was written.
pub(crate) fn keep_until_exit(boost: Option<RealtimeGuard>) {
    std::mem::forget(boost);
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
            eprintln!("weft: error: {}", one_line(&e));
            ExitCode::from(1)
        }
    }
}

/// Standard output's reader went away. weft keeps Rust's SIGPIPE ignored
/// (a death by SIGPIPE while probes are live would leave them in the
/// target), so writes fail with EPIPE instead: not an error for the user,
/// who closed the pipe on purpose; weft exits 0 without a message, as
/// when it has written everything.
#[derive(Debug)]
struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("standard output was closed")
    }
}

impl std::error::Error for StdoutClosed {}

/// Writes `text` to standard output and flushes it; a closed pipe is
/// [`StdoutClosed`].
fn to_stdout(text: &[u8]) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        r => Ok(r.context("writing to standard output")?),
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
    weft::inspect::set_debug_note_reporter(|note| eprintln!("weft: {note}"));
    match cli.command {
        Command::Run {
            functions,
            measure,
            refusals,
            output,
            command,
        } => check_trace_format(&measure, &output)
            .and_then(|()| run_program(&functions, &measure, &refusals, &output, &command)),
        Command::Diagnose {
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
        } => {
            let target = match (pid, command.split_first()) {
                (Some(pid), None) => cli_diagnose::Target::Pid(pid),
                (None, Some((program, args))) => {
                    cli_diagnose::Target::Launch(program.clone(), args.to_vec())
                }
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
                    .map(|h| cli_diagnose::parse_hypothesis(h))
                    .collect::<Result<_>>()?,
                ..defaults
            };
            cli_diagnose::diagnose(
                target,
                duration,
                options,
                format,
                cli_diagnose::Files {
                    output: output.as_deref(),
                    timeline: timeline.as_deref(),
                },
            )
        }
        Command::Attach {
            pid,
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
        } => check_trace_format(&measure, &output).and_then(|()| {
            attach(
                pid,
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
        }),
        Command::Top {
            pid,
            functions,
            interval,
            duration,
            measure,
            refusals,
            command,
        } => {
            if measure.metrics.trace {
                bail!(
                    "weft top shows counts and times, not a call trace: drop `trace` from -m, \
                     or record one with `weft attach -m calls,wall,trace --format chrome-trace`"
                );
            }
            let interval = seconds("interval", Some(&interval), true)?.unwrap_or_default();
            let duration = seconds("duration", duration.as_deref(), false)?;
            let target = match (pid, command.split_first()) {
                (Some(pid), None) => cli_top::Target::Pid(pid),
                (None, Some((program, args))) => {
                    cli_top::Target::Launch(program.clone(), args.to_vec())
                }
                (Some(_), Some(_)) => bail!("give either -p PID or -- PROGRAM ARGS, not both"),
                (None, None) => {
                    bail!("nothing to watch: give -p PID, or -- PROGRAM ARGS to start a program")
                }
            };
            cli_top::top(
                target,
                &functions,
                &measure,
                &refusals,
                cli_top::Pace { interval, duration },
                boost,
            )
        }
        Command::List {
            pid,
            lines,
            patterns,
        } => list(pid, &patterns, lines),
        Command::Doctor => {
            to_stdout(cli_kernel::doctor().as_bytes())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo { threads, requests } => cli_demo::demo(threads, requests),
        Command::DemoTarget { threads, requests } => cli_demo::target(threads, requests),
    }
}

/// `--format chrome-trace` and `flamegraph` write the call trace: refused
/// before anything starts when it is not recorded.
fn check_trace_format(measure: &Measure, output: &Output) -> Result<()> {
    if matches!(output.format, Format::ChromeTrace | Format::Flamegraph) && !measure.metrics.trace {
        bail!(
            "--format {} writes the call trace: add trace to the metrics (e.g. -m calls,trace)",
            if output.format == Format::ChromeTrace {
                "chrome-trace"
            } else {
                "flamegraph"
            }
        );
    }
    Ok(())
}

/// Where reports go: standard output or a file created once, one report
/// after the other.
struct Sink {
    format: Format,
    table: weft::report::TableOptions,
    file: Option<(PathBuf, std::fs::File)>,
}

impl Sink {
    fn new(output: &Output) -> Result<Sink> {
        let file = match &output.output {
            // Reports name the target's functions and threads: readable by
            // the user only (0600) when weft creates the file.
            Some(path) => Some((
                path.clone(),
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(path)
                    .with_context(|| format!("creating the report file {}", path.display()))?,
            )),
            None => None,
        };
        Ok(Sink {
            format: output.format,
            table: output.table(),
            file,
        })
    }

    /// Writes one report; `last` for the final one (taken at detach or
    /// when the target exited), which `--format jsonl` marks.
    fn write(&mut self, report: &Report, last: bool) -> Result<()> {
        if let (true, Some(t)) = (last, &report.trace) {
            if t.dropped_events > 0 {
                eprintln!(
                    "weft: trace: {} events dropped on {} thread(s): their rings ({} events) were full before weft read them; a larger ring: {}=N{}",
                    t.dropped_events,
                    t.threads.iter().filter(|t| t.dropped_events > 0).count(),
                    t.ring_events,
                    weft::trace::RING_ENV,
                    if t.drain_realtime {
                        ""
                    } else {
                        "; weft's drain thread ran without real-time priority (as root or with CAP_SYS_NICE it keeps up with more)"
                    }
                );
            }
            if t.discarded_events > 0 {
                eprintln!(
                    "weft: trace: {} events not kept on {} thread(s): {}; a larger budget: {}=SIZE (e.g. 4G), with room for it in TMPDIR",
                    t.discarded_events,
                    t.threads.iter().filter(|t| t.discarded_events > 0).count(),
                    t.not_kept.as_deref().unwrap_or("the trace reached its budget"),
                    weft::trace::BUDGET_ENV
                );
            }
        }
        let trace = || {
            report
                .trace_log
                .clone()
                .ok_or(weft::trace::CallTraceError::NotTraced)
        };
        let text = match self.format {
            Format::Json => report.to_json() + "\n",
            Format::Jsonl => jsonl_line(report, last)? + "\n",
            Format::Table => report.to_table_with(&self.table),
            // The trace is written once, whole, at the end, streamed: it
            // can be far larger than weft's memory.
            Format::ChromeTrace | Format::Flamegraph if !last => return Ok(()),
            Format::ChromeTrace => {
                let trace = trace()?;
                return self.stream(|out| trace.with(|log| log.write_chrome_trace(out)));
            }
            Format::Flamegraph => {
                let (trace, by_thread) = (trace()?, self.table.by_thread);
                return self.stream(|out| trace.with(|log| log.write_flamegraph(by_thread, out)));
            }
        };
        match &mut self.file {
            Some((path, file)) => file
                .write_all(text.as_bytes())
                .with_context(|| format!("writing the report to {}", path.display())),
            None => to_stdout(text.as_bytes()),
        }
    }
}

impl Sink {
    /// Runs `write` on the output file or standard output.
    fn stream(
        &mut self,
        write: impl FnOnce(&mut dyn Write) -> Result<(), weft::trace::CallTraceError>,
    ) -> Result<()> {
        match &mut self.file {
            Some((path, file)) => {
                write(file).with_context(|| format!("writing the trace to {}", path.display()))
            }
            None => match write(&mut std::io::stdout().lock()) {
                Err(weft::trace::CallTraceError::Io(e))
                    if e.kind() == std::io::ErrorKind::BrokenPipe =>
                {
                    Err(StdoutClosed.into())
                }
                r => Ok(r.context("writing the trace to standard output")?),
            },
        }
    }
}

fn write_report(report: &Report, output: &Output) -> Result<()> {
    Sink::new(output)?.write(report, true)
}

/// A `--format jsonl` line: the report's fields, then `"final"`: true on
/// the final report, false on the live ones (docs/report-format.md).
fn jsonl_line(report: &Report, last: bool) -> Result<String> {
    #[derive(serde::Serialize)]
    struct Line<'a> {
        #[serde(flatten)]
        report: &'a Report,
        #[serde(rename = "final")]
        last: bool,
    }
    Ok(serde_json::to_string(&Line { report, last })?)
}

/// Phase timings on stderr when `WEFT_TIMING` is set (for people sizing
/// weft's pauses; the brief asks for progress on long work).
struct Timing(
    Option<std::cell::Cell<std::time::Instant>>,
    std::time::Instant,
);

impl Timing {
    fn from_env() -> Timing {
        let now = std::time::Instant::now();
        Timing(
            std::env::var_os("WEFT_TIMING").map(|_| std::cell::Cell::new(now)),
            now,
        )
    }

    fn note(&self, what: &str) {
        if self.0.is_some() {
            eprintln!("weft: timing: {what}");
        }
    }

    fn mark(&self, what: &str) {
        if let Some(last) = &self.0 {
            let now = std::time::Instant::now();
            eprintln!(
                "weft: timing: {what}: {:.2} ms (total {:.2} ms)",
                (now - last.get()).as_secs_f64() * 1e3,
                (now - self.1).as_secs_f64() * 1e3
            );
            last.set(now);
        }
    }
}

/// `CLOCK_MONOTONIC` now, ns.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Milliseconds since this process was created, from its start time in
/// /proc/self/stat (clock ticks: 10 ms resolution).
fn since_start_ms() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let start: f64 = after
        .split_whitespace()
        .nth(19)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    let now = ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9;
    // SAFETY: no arguments.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (now - start / hz) * 1e3
}

/// `--NAME SECS`: a finite number of seconds, 0 or more (more than 0 when
/// `positive`).
fn seconds(name: &str, value: Option<&str>, positive: bool) -> Result<Option<std::time::Duration>> {
    let Some(text) = value else {
        return Ok(None);
    };
    let parsed = text
        .trim()
        .parse::<f64>()
        .ok()
        .and_then(|v| std::time::Duration::try_from_secs_f64(v).ok())
        .filter(|d| !(positive && d.is_zero()));
    match parsed {
        Some(d) => Ok(Some(d)),
        None => bail!(
            "--{name} takes a number of seconds {}, like --{name} 2.5, not `{text}`",
            if positive {
                "more than 0"
            } else {
                "(0 or more)"
            }
        ),
    }
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
    metrics: weft::Metrics,
    refusals: &Refusals,
) -> Result<usize> {
    if refusals.strict {
        held.insert(found, metrics)?;
        return Ok(found.len());
    }
    let specs: Vec<weft::ProbeSpec> = found
        .iter()
        .map(|f| weft::ProbeSpec::measure(f.clone(), metrics))
        .collect();
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
        return Ok(done);
    }
    if done == 0 {
        // Nothing to measure: an error, as all or nothing would say.
        return Err(weft::Error::Refused(refused).into());
    }
    let mut text = format!(
        "weft: {} of {} functions instrumented; {} refused{}\n",
        thousands(done),
        thousands(found.len()),
        thousands(refused.len()),
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
                "weft:   `{}` ({}, {:#x}): {}",
                r.function.name, r.function.module, r.function.address, r.reason
            );
        }
    }
    eprint!("{text}");
    Ok(done)
}

/// `n` with a comma between thousands: 1,957 (the reports' grouping).
fn thousands(n: usize) -> String {
    weft::report::group_digits(n as u64)
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
    let exit = attached.process.wait_exit()?;
    let report = attached.finish(cli_wait::End::TargetExited)?;
    match write_report(&report, output) {
        // The program's status still is weft's.
        Err(e) if e.is::<StdoutClosed>() => {}
        r => r?,
    }
    Ok(ExitCode::from(exit.shell_code().clamp(0, 255) as u8))
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

/// How long a loading thread may wait for weft to instrument its library
/// (`--later`).
const LOAD_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

fn attach(
    pid: i32,
    functions: &[String],
    live: Live,
    measure: &Measure,
    refusals: &Refusals,
    output: &Output,
    boost: Option<RealtimeGuard>,
) -> Result<ExitCode> {
    let split = cli_kernel::split(functions)?;
    let caps = cli_kernel::capabilities(&split)?;
    let duration = seconds("duration", live.duration.as_deref(), false)?;
    let interval = seconds("interval", live.interval.as_deref(), true)?;
    let server = match &live.serve {
        Some(addr) => Some(cli_serve::Server::start(addr, live.serve_public)?),
        None => None,
    };
    let fold_after = seconds("fold-after", Some(&live.fold_after), false)?.unwrap_or_default();
    let mut sink = Sink::new(output)?;
    cli_wait::install_stop_handlers();
    if let (true, Some(caps)) = (split.user.is_empty(), &caps) {
        if server.is_some() {
            bail!("--serve needs at least one user function (-f NAME) next to kernel patterns");
        }
        drop(boost);
        cli_kernel::attach_kernel_only(pid, &split, caps, duration, interval, &mut sink)?;
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
        let exporter =
            cli_serve::Exporter::new(pid, fold_after, measure.metrics.metrics, attached.functions);
        (s, exporter)
    });
    let mut next_report = interval.map(|i| std::time::Instant::now() + i);
    let mut failed = None;
    let ended = cli_wait::wait(pid, duration, &mut || {
        attached.tick();
        if let Some((server, exporter)) = &mut server {
            server.answer(|openmetrics| {
                let report = attached.live_report()?;
                exporter.exposition(&report, openmetrics)
            });
        }
        if let (Some(at), Some(every)) = (next_report, interval) {
            if std::time::Instant::now() >= at && failed.is_none() {
                // Read live: the target is not stopped.
                failed = attached
                    .live_report()
                    .and_then(|report| sink.write(&report, false))
                    .err();
                next_report = Some(at + every);
                if failed.as_ref().is_some_and(|e| e.is::<StdoutClosed>()) {
                    // Nobody reads any more: detach now.
                    cli_wait::stop_now();
                }
            }
        }
        next_report.filter(|_| failed.is_none())
    });
    // No scrape is answered from a target being detached.
    drop(server);
    let timing = Timing::from_env();
    timing.note(&format!(
        "waiting ended at CLOCK_MONOTONIC {} ns",
        monotonic_ns()
    ));
    let report = attached.finish(ended)?;
    if let Some(e) = failed {
        return Err(e);
    }
    sink.write(&report, true)?;
    timing.note(&format!(
        "final report written at CLOCK_MONOTONIC {} ns",
        monotonic_ns()
    ));
    Ok(ExitCode::SUCCESS)
}

/// A target with weft's probes in it, live: what `attach`, `top` and
/// `--serve` share, from the attach to the final report.
struct Attached {
    process: Process,
    kernel: Option<weft::kernel::Session>,
    /// Loads watched for `--later` patterns.
    watcher: Option<weft::events::Watcher>,
    /// User functions are instrumented (else kernel probes only).
    user: bool,
    /// Functions instrumented (user and kernel).
    functions: usize,
    /// Threads when attached.
    threads: usize,
}

impl Attached {
    /// Attaches to `pid` and puts in the probes `split` asks for: the user
    /// functions in one stop of the world, then the kernel probes with the
    /// target running (the verifier's milliseconds are nobody's wait).
    /// All or nothing: an error leaves nothing in the target.
    fn attach(
        pid: i32,
        split: &cli_kernel::Patterns,
        caps: Option<&weft::kernel::Capabilities>,
        measure: &Measure,
        refusals: &Refusals,
        later: bool,
    ) -> Result<Attached> {
        let timing = Timing::from_env();
        let patterns = &split.user;
        // Everything that needs no stopped target happens before the pause.
        let mut process = Process::open(pid)?;
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
        let metrics = measure.metrics_for(found.len());
        let mut watcher = (!pending.is_empty()).then(|| {
            let mut w = weft::events::Watcher::new(&process);
            w.defer(pending.clone(), metrics);
            w
        });
        let mut instrumented = 0;
        let mut threads = 0;
        if !patterns.is_empty() {
            process.prepare(&found)?;
            timing.mark("found functions and swept their modules (target running)");
            let mut held = process.hold()?;
            held.set_trace_calls(measure.metrics.trace);
            timing.mark("seized and stopped every thread");
            instrumented = instrument(&mut held, patterns, &found, metrics, refusals)?;
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
        let kernel = match cli_kernel::start(&process, split, caps) {
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
        })
    }

    /// Starts `program` with the probes `functions` ask for in place
    /// before its first instruction (no call is missed). An error kills
    /// the program before main.
    fn launch(
        program: &str,
        args: &[String],
        functions: &[String],
        measure: &Measure,
        refusals: &Refusals,
    ) -> Result<Attached> {
        let split = cli_kernel::split(functions)?;
        let caps = cli_kernel::capabilities(&split)?;
        let mut process = Process::launch(program, args)?;
        say_launched(program, &process);
        let found = if split.user.is_empty() {
            Vec::new()
        } else {
            process.find_functions(&split.user)?
        };
        let metrics = measure.metrics_for(found.len());
        // Its first hold is the stop at its entry: dropped on an error, it
        // kills the program before main.
        let mut held = process.hold()?;
        held.set_trace_calls(measure.metrics.trace);
        let instrumented = if found.is_empty() {
            0
        } else {
            instrument(&mut held, &split.user, &found, metrics, refusals)?
        };
        // The kernel probes go in while the program is still at its entry.
        let kernel = cli_kernel::start(&held, &split, caps.as_ref())?;
        held.release()?;
        let functions = instrumented + kernel.as_ref().map_or(0, |k| k.probes().len());
        Ok(Attached {
            process,
            kernel,
            watcher: None,
            user: !split.user.is_empty(),
            functions,
            threads: 1,
        })
    }

    /// Runs about every 10 ms while live: instruments libraries loaded
    /// for `--later` patterns and keeps exited threads' figures.
    fn tick(&mut self) {
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
    }

    /// A report read live, without stopping the target.
    fn live_report(&self) -> Result<Report> {
        cli_kernel::report(&self.process, self.kernel.as_ref())
    }

    /// Takes everything out (unless the target is gone) and detaches;
    /// returns the final report.
    fn finish(&mut self, ended: cli_wait::End) -> Result<Report> {
        let process = &mut self.process;
        let mut report = if ended == cli_wait::End::TargetExited || !process.is_alive() {
            process.harvest();
            process.report()
        } else if !self.user {
            process.report()
        } else {
            if let Some(w) = &mut self.watcher {
                w.stop_deferring_at_load(process);
            }
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
            report
        };
        if let Some(k) = &self.kernel {
            process.add_kernel_to(&mut report, k)?;
        }
        // Detaches and unloads the kernel probes.
        drop(self.kernel.take());
        Ok(report)
    }
}

fn list(pid: i32, specs: &[String], lines: bool) -> Result<ExitCode> {
    let patterns = if specs.is_empty() {
        vec![Pattern::parse("*")?]
    } else {
        let split = cli_kernel::split(specs)?;
        if !split.kernel.is_empty() {
            // Kernel code is the same for every process: listed first, and
            // alone when no user pattern is given.
            to_stdout(cli_kernel::list(&split.kernel)?.as_bytes())?;
            if split.user.is_empty() {
                return Ok(ExitCode::SUCCESS);
            }
        }
        split.user
    };
    let mut image = weft::inspect::ProcessImage::open(pid)?;
    // One search for all: a function several patterns match is found once.
    let mut functions = image.find_functions(&patterns)?;
    let mut unmatched = Vec::new();
    for pattern in &patterns {
        let matched = functions.iter().any(|f| {
            // Every name the module answers to (soname, `exe`, the name
            // it was started as), as the search itself matched them.
            image
                .module_of(f.address)
                .is_some_and(|m| pattern.could_match_module(m))
                && (pattern.matches_names(&f.name, image.source_names_of(f).as_ref())
                    || f.aliases.iter().any(|name| pattern.matches_function(name)))
        });
        if !matched {
            unmatched.push(weft::Error::NoMatch {
                pattern: pattern.to_string(),
                suggestions: image.suggest(pattern)?,
                still_loading: image.still_loading(),
            });
        }
    }
    if unmatched.len() == patterns.len() {
        // Nothing to list: an error, as for `attach`.
        return Err(unmatched.remove(0).into());
    }
    functions.sort_by(|a, b| (a.module.as_str(), a.address).cmp(&(b.module.as_str(), b.address)));
    let mut text = String::new();
    for f in functions {
        let name = listed_name(&f.name, image.source_names_of(&f));
        // An IFUNC is listed at the implementation the process uses (as
        // `attach` instruments it) when a GOT slot already holds it; else
        // the implementation is chosen at the first call and unknown
        // without stopping the process: no address rather than the
        // resolver's.
        match image.resolved_address(&f) {
            Some(address) if address == f.address => {
                let _ = writeln!(text, "{} {:#x} {} {name}", f.module, address, f.size);
            }
            Some(address) => {
                let size = match image.function_at(address) {
                    Ok(Some(g)) if g.address == address => g.size,
                    _ => 0,
                };
                let _ = writeln!(text, "{} {:#x} {size} {name}", f.module, address);
            }
            None => {
                let _ = writeln!(
                    text,
                    "{} - - {name} (ifunc, resolved at first call)",
                    f.module
                );
            }
        }
        if lines {
            let at = match image.source_line(f.address) {
                Ok(Some(l)) => l.to_string(),
                _ => "-".to_string(),
            };
            // The line just written ends in '\n': the column goes before.
            text.pop();
            let _ = writeln!(text, " {at}");
        }
    }
    to_stdout(text.as_bytes())?;
    // What the other patterns matched is listed; the ones that matched
    // nothing are named, and the status says something was missing.
    for e in &unmatched {
        eprintln!("weft: {e}");
    }
    Ok(if unmatched.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `NAME` as `list` prints it: the demangled or source name, and the
/// linkage name after it in parentheses when that differs
/// (`parse_field (parse_field.isra.0)`).
fn listed_name(name: &str, source: Option<weft::inspect::names::SourceNames>) -> String {
    match source {
        Some(s) if s.full != name => format!("{} ({name})", s.full),
        _ => name.to_owned(),
    }
}

/// Says which program weft stopped at when `program` is a script or an
/// exec wrapper it followed (`Process::launched_through`).
fn say_launched(program: &str, process: &Process) {
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
