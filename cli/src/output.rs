//! Where reports go: standard output (a reader that went away is not an
//! error) or a file, in the format asked for.

use crate::args::{Format, Output};
use anyhow::{Context, Result};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use weft::Report;

/// Standard output's reader went away. weft keeps Rust's SIGPIPE ignored
/// (a death by SIGPIPE while probes are live would leave them in the
/// target), so writes fail with EPIPE instead: not an error for the user,
/// who closed the pipe on purpose; weft exits 0 without a message, as
/// when it has written everything.
#[derive(Debug)]
pub struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("standard output was closed")
    }
}

impl std::error::Error for StdoutClosed {}

/// Writes `text` to standard output and flushes it; a closed pipe is
/// [`StdoutClosed`].
pub fn to_stdout(text: &[u8]) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        r => Ok(r.context("writing to standard output")?),
    }
}

/// Where reports go: standard output or a file created once, one report
/// after the other.
pub struct Sink {
    format: Format,
    table: weft::report::TableOptions,
    file: Option<(PathBuf, std::fs::File)>,
}

impl Sink {
    pub fn new(output: &Output) -> Result<Sink> {
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
    pub fn write(&mut self, report: &Report, last: bool) -> Result<()> {
        if let (true, Some(t)) = (last, &report.trace) {
            if t.dropped_events > 0 {
                eprintln!(
                    "weft: trace: {} events dropped on {} thread(s): their rings ({} events) were full before weft read them (the longest gap between two of weft's drains was {:.1} ms); a larger ring: {}=N{}",
                    t.dropped_events,
                    t.threads.iter().filter(|t| t.dropped_events > 0).count(),
                    t.ring_events,
                    t.longest_drain_gap_us as f64 / 1000.0,
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
        self.put(&text)
    }
}

impl Sink {
    /// Writes the report of several processes ([`Sink::write`] for one).
    pub fn write_processes(
        &mut self,
        report: &weft::report::ProcessesReport,
        last: bool,
    ) -> Result<()> {
        let text = match self.format {
            Format::Json => report.to_json() + "\n",
            Format::Jsonl => {
                #[derive(serde::Serialize)]
                struct Line<'a> {
                    #[serde(flatten)]
                    report: &'a weft::report::ProcessesReport,
                    #[serde(rename = "final")]
                    last: bool,
                }
                serde_json::to_string(&Line { report, last })? + "\n"
            }
            Format::Table => report.to_table_with(&self.table),
            Format::ChromeTrace | Format::Flamegraph => anyhow::bail!(
                "a call trace is written for one process at a time: attach one weft per process"
            ),
        };
        self.put(&text)
    }

    /// Writes `text` to the output file or standard output.
    fn put(&mut self, text: &str) -> Result<()> {
        match &mut self.file {
            Some((path, file)) => file
                .write_all(text.as_bytes())
                .with_context(|| format!("writing the report to {}", path.display())),
            None => to_stdout(text.as_bytes()),
        }
    }

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

pub fn write_report(report: &Report, output: &Output) -> Result<()> {
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
