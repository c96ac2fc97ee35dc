//! The command line's flags added to what the library says. The library's
//! messages speak of the library (count instead of timing, a debug
//! directory, all rows); each hint here names the flag that does it, so a
//! flag is spelled in one place and a tool built on the library never
//! tells its users to type `weft`'s options.

use weft::report::TableHints;
use weft::{Error, Refusal, Refused, Room};

/// The flag that does what `error` advises, if it advises something a
/// flag does: added to the error line.
pub fn for_error(error: &anyhow::Error) -> Option<&'static str> {
    let error = error.chain().find_map(|c| c.downcast_ref::<Error>())?;
    match error {
        Error::Refused(refused) if refused.iter().any(not_timeable) => {
            Some("`-m calls` counts what cannot be timed")
        }
        Error::OutOfRoom {
            room: Room::MetricWords,
            ..
        } => Some("`-m calls` counts without timing; a timer without --histogram takes 11 words"),
        Error::OutOfRoom {
            room: Room::CallRecords,
            ..
        } => Some("`-m calls` counts without timing"),
        _ => None,
    }
}

/// The flag that does what the refusal `r` advises, if any (`--explain`'s
/// lines).
pub fn for_refusal(r: &Refused) -> Option<&'static str> {
    not_timeable(r).then_some("-m calls counts it")
}

fn not_timeable(r: &Refused) -> bool {
    matches!(r.why, Refusal::NotTimeable(_))
}

/// A library note on a module's debug information, with the flag that
/// answers it.
pub fn debug_note(note: &weft::inspect::DebugNote) -> String {
    match note {
        weft::inspect::DebugNote::NoDebugFile { .. } => {
            format!("{note}; --debug-dir DIR adds such a directory")
        }
        _ => note.to_string(),
    }
}

/// The table's lines that leave something out, with the flags that show it.
pub fn table() -> TableHints {
    TableHints {
        show_all: Some("--top N, --top 0 shows all"),
        by_thread: Some("--by-thread: each thread's functions"),
        write_trace: Some("--format chrome-trace or flamegraph writes them"),
        keep_histogram: Some("kept with -m wall and --histogram"),
    }
}

/// `error`'s line with its hint, if any.
pub fn with_hint(line: String, error: &anyhow::Error) -> String {
    match for_error(error) {
        Some(hint) => format!("{line} ({hint})"),
        None => line,
    }
}

/// The table's default layout, with the flags' hints.
pub fn table_options() -> weft::report::TableOptions {
    weft::report::TableOptions {
        hints: table(),
        ..Default::default()
    }
}
