//! The library's error type, [`Error`] (also at the crate root), and the
//! errors of the layers it wraps (its variants' sources): every message says
//! what happened and what to do.

pub use crate::code::CodeError;
pub use crate::inspect::{InspectError, MapsParseError, PatternError};
pub use crate::library::LibraryError;
pub use crate::memory::MemoryError;
pub use crate::ptrace::{RemoteError, TraceError};
pub use crate::region::RegionError;
pub use crate::runtime::RuntimeError;
pub use crate::trampolines::PoolError;

pub use crate::refusal::{Refusal, Refused, SharedCode};

/// Anything that can go wrong in weft.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No process with this PID.
    #[error("no such process: {0}")]
    NoSuchProcess(i32),
    /// The process has exited and waits to be reaped.
    #[error("process {0} is a zombie: it has exited and waits for its parent to reap it; there is nothing left to instrument")]
    Zombie(i32),
    /// weft was asked to attach to itself.
    #[error("weft cannot attach to itself")]
    SelfAttach,
    /// The target has no dynamic loader, so the runtime cannot be loaded.
    #[error("process {0} is statically linked: weft loads its runtime with the target's dlopen, so it needs a dynamically linked (glibc) program")]
    StaticallyLinked(i32),
    /// `weft run` was given a statically linked program (nothing started).
    #[error("`{program}` is statically linked: weft loads its runtime with the program's dynamic loader (dlopen), so it needs a dynamically linked (glibc) program; nothing was started (relink it without -static)")]
    StaticProgram {
        /// The program as given.
        program: String,
    },
    /// A pattern matched no function.
    #[error(
        "no function matches `{pattern}`{}{}",
        suggest(suggestions),
        if *still_loading {
            "; the process has no C library mapped yet: it is probably still starting (its \
             dynamic loader runs before main), so try again in a moment"
        } else {
            ""
        }
    )]
    NoMatch {
        /// The pattern.
        pattern: String,
        /// Near names.
        suggestions: Vec<String>,
        /// The process's loader had not mapped its libraries yet
        /// ([`ProcessImage::still_loading`](crate::inspect::ProcessImage::still_loading)).
        still_loading: bool,
    },
    /// Some functions cannot be patched safely; nothing was changed.
    #[error("{}", refused_message(.0))]
    Refused(Vec<Refused>),
    /// The request does not fit one of the target's fixed-size tables.
    #[error(
        "{room} full: the limit is {limit}, {in_use} are in use and this request needs {asked} \
         more; {advice}",
        room = .room.what(), limit = .limit, in_use = .in_use, asked = .asked,
        advice = .room.advice()
    )]
    OutOfRoom {
        /// Which table.
        room: Room,
        /// Its size.
        limit: u64,
        /// Entries in use (by every session) when the request came.
        in_use: u64,
        /// Entries the whole request needs.
        asked: u64,
    },
    /// Every session slot of the target is held by a live weft.
    #[error("{0} weft sessions already have probes in this process: stop one of them first")]
    TooManySessions(usize),
    /// Another weft held the process (changing its code) and did not let
    /// go in time.
    #[error(
        "process {pid} is held by another weft (pid {weft}), which did not let go within \
         {waited:?}: it is changing the process's code; try again when it is done"
    )]
    HeldByOtherWeft {
        /// The process.
        pid: i32,
        /// The weft holding it.
        weft: i32,
        /// How long this one waited.
        waited: std::time::Duration,
    },
    /// The target's libc lacks a function weft calls.
    #[error("the target's C library has no `{0}`: weft needs glibc")]
    MissingLibc(&'static str),
    /// A thread stayed inside code weft had to change.
    #[error("thread {tid} stayed inside {what} weft must change, even after letting it run 50 times; try again")]
    ThreadStuck {
        /// The thread.
        tid: i32,
        /// Where.
        what: String,
    },
    /// Waiting for exit is only possible for processes weft launched.
    #[error("process {0} was not started by weft: its exit status cannot be collected")]
    NotOurChild(i32),
    /// The program could not be started.
    #[error("cannot run `{program}`: {source}")]
    Launch {
        /// The program.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// Every thread stayed where a remote call could deadlock or corrupt the
    /// C library (inside the allocator, `fork` or the dynamic loader).
    #[error("no thread of process {0} reached a point where weft can safely load its runtime (all stayed inside the C library's allocator, fork or the dynamic loader); try again")]
    NoSafeThread(i32),
    /// Call targets were asked of a probe that does not record them.
    #[error(
        "probe {0} records no call targets: insert a point with PointSpec::call_targets at an \
         indirect call (and read it before its words go to a later probe)"
    )]
    NotACallTargetPoint(u32),
    /// A probe to remove constrains live probes that stay
    /// ([`ProbeSpec::inside`](crate::ProbeSpec::inside)).
    #[error(
        "the probe on {function} constrains the probes on {}: remove them first, or with it",
        by.join(", ")
    )]
    ConstraintInUse {
        /// The constraining probe's function.
        function: String,
        /// The functions of the probes it constrains.
        by: Vec<String>,
    },
    /// A bug in weft.
    #[error("internal error: {0} (please report it)")]
    Internal(String),
    /// Tracing failed.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// A remote call failed.
    #[error(transparent)]
    Remote(#[from] RemoteError),
    /// Inspecting the process failed.
    #[error(transparent)]
    Inspect(#[from] InspectError),
    /// A pattern is malformed.
    #[error(transparent)]
    Pattern(#[from] PatternError),
    /// Loading the runtime failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// Trampoline memory could not be had.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// Target memory access failed.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// A library could not be loaded into the target.
    #[error(transparent)]
    Library(#[from] LibraryError),
    /// A call trace could not be set up or written.
    #[error(transparent)]
    CallTrace(#[from] crate::trace::CallTraceError),
}

fn suggest(names: &[String]) -> String {
    match names {
        [] => String::new(),
        names => format!(
            "; did you mean {}?",
            names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn refused_message(refused: &[Refused]) -> String {
    let parts: Vec<String> = refused
        .iter()
        .map(|r| {
            format!(
                "`{}` ({}, {:#x}): {}",
                r.function.name, r.function.module, r.function.address, r.reason
            )
        })
        .collect();
    format!(
        "cannot instrument {} safely, so nothing was changed: {}",
        if refused.len() == 1 {
            "a function".to_string()
        } else {
            format!("{} functions", refused.len())
        },
        parts.join("; ")
    )
}

/// The target's fixed-size tables a request can fill
/// ([`Error::OutOfRoom`]); their sizes are in `weft_rt::layout`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Room {
    /// Metric words per thread row (`MAX_METRIC_WORDS`): 1 per counted
    /// function, 11 per timed one (51 with a histogram).
    MetricWords,
    /// Call records (`CALL_RECORDS`): one per timed function.
    CallRecords,
    /// Entries of the probe directory (`DIRECTORY`): one per probe.
    Probes,
}

impl Room {
    fn what(&self) -> &'static str {
        match self {
            Room::MetricWords => "the runtime's per-thread metric words are",
            Room::CallRecords => "the runtime's call records (one per timed function) are",
            Room::Probes => "the process's probe directory is",
        }
    }

    fn advice(&self) -> &'static str {
        match self {
            Room::MetricWords => {
                "a counted function takes 1 word, a timed one 11 (51 with a latency \
                 histogram): instrument fewer functions, or count some instead of timing them"
            }
            Room::CallRecords => "time fewer functions at once, and count the others",
            Room::Probes => "instrument fewer functions, or remove probes first",
        }
    }
}
