//! The argument groups several commands share (what to measure, what to
//! do with refused functions, where reports go) and the checks of their
//! values.

use anyhow::{bail, Result};
use clap::ValueEnum;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Format {
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
pub struct Measure {
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
    pub metrics: MetricList,
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
    pub histogram: HistogramMode,
    /// Count and time the functions `-f` names only while the thread is
    /// inside FUNC (repeatable: inside each; a function name or pattern
    /// matching one function). Each FUNC is measured too, and is entered
    /// from the probes' insertion on. Needs `wall` or `cpu` in `-m`
    /// (docs/exits-and-timers.md, "Constraints").
    #[arg(long = "inside", value_name = "FUNC")]
    pub inside: Vec<String>,
}

/// When latency histograms are kept (`--histogram`).
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum HistogramMode {
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
    pub fn metrics_for(&self, functions: usize) -> weft::Metrics {
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
pub struct MetricList {
    pub metrics: weft::Metrics,
    pub trace: bool,
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
pub struct Refusals {
    /// List every function weft refused to instrument, with the reason
    /// (after the one-line summary on standard error).
    #[arg(long)]
    pub explain: bool,
    /// All or nothing: one function refused refuses the whole request and
    /// nothing is changed. By default a glob (`-f 'libc.so.6:*'`)
    /// instruments every function it matches that can be instrumented
    /// safely and says how many it refused; a name given exactly that is
    /// refused fails the request either way.
    #[arg(long)]
    pub strict: bool,
}

#[derive(clap::Args, Debug)]
pub struct Output {
    /// Report format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// Write the report to FILE instead of standard output.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Table: show the first N functions (and threads) of the long table,
    /// one row per function (0: all; default 50). More than 4 functions
    /// always get the long table.
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,
    /// Table: order of the long table's rows: calls, wall, cpu, self or
    /// name (default: wall time, else cpu time, else calls).
    #[arg(long, value_name = "KEY", value_parser = parse_sort)]
    pub sort: Option<weft::report::SortKey>,
    /// Table: each thread's own function rows after the functions.
    /// Flame graph: one tower per thread (named and with its TID) instead
    /// of the threads merged.
    #[arg(long)]
    pub by_thread: bool,
    /// Table: show the latency histogram of FUNCTION (repeatable; default:
    /// the first 3 rows that keep one).
    #[arg(long = "histogram-of", value_name = "FUNCTION")]
    pub histogram_of: Vec<String>,
}

impl Output {
    pub fn table(&self) -> weft::report::TableOptions {
        weft::report::TableOptions {
            top: self.top,
            sort: self.sort,
            by_thread: self.by_thread,
            histograms: self.histogram_of.clone(),
            hints: crate::hints::table(),
        }
    }
}

/// `--format chrome-trace` and `flamegraph` write the call trace: refused
/// before anything starts when it is not recorded.
pub fn check_trace_format(measure: &Measure, output: &Output) -> Result<()> {
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

/// `--NAME SECS`: a finite number of seconds, 0 or more (more than 0 when
/// `positive`).
pub fn seconds(
    name: &str,
    value: Option<&str>,
    positive: bool,
) -> Result<Option<std::time::Duration>> {
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
