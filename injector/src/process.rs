//! A target process and the probes weft has spliced into it: the library's
//! main entry point.
//!
//! ```no_run
//! # fn main() -> Result<(), weft::Error> {
//! use weft::{Pattern, Process};
//! let mut process = Process::open(1234)?;            // inspect; nothing stopped
//! let functions = process.find_functions(&[Pattern::parse("work_*")?])?;
//! let mut held = process.hold()?;                    // every thread stopped
//! held.insert_counters(&functions)?;
//! held.release()?;                                   // runs, counting, weft detached
//! std::thread::sleep(std::time::Duration::from_secs(1));
//! let report = process.report();                     // read live, target not stopped
//! let mut held = process.hold()?;                    // stop it again
//! held.remove_all()?;                                // original code back
//! held.release()?;
//! # drop(report); Ok(()) }
//! ```
//!
//! A [`Process`] is weft's view of the target; while a [`Held`] borrowed
//! from it ([`Process::hold`]) lives, weft is attached with ptrace and
//! every thread is stopped. Everything that changes code or needs stopped
//! threads is a method of [`Held`], so "not held" is a compile error, not a
//! run-time one. Between holds weft is not attached at all; probes keep
//! counting into the shared region, and what only reads (reports,
//! snapshots, memory) stays on [`Process`], reachable from a [`Held`] too.
//!
//! Several processes may be held at once, from one thread or several: each
//! tracer takes only its own threads' ptrace events (never `waitpid(-1)`),
//! and the program's own children are left for it to wait for.

pub use crate::error::Refused;
use crate::error::Room;
use crate::exits::Metrics;
use crate::inspect::maps::Mapping;
use crate::inspect::pattern::Pattern;
use crate::inspect::{FoundFunction, FunctionKind, ProcessImage};
use crate::ptrace::{ProcessExit, RealtimeGuard, RemoteCall, StopTime, Tid, TraceError, Tracer};
use crate::region::RowSnapshot;
use crate::report::{ProbeInfo, Report};
use crate::runtime::{self, Runtime, RuntimeOptions};
use crate::trampolines::Pool;
use crate::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_codegen::{
    analyze_entry, build_trampoline, jmp_rel32, FunctionCode, PatchSite, Snippet, ThreadRow,
    TrampolineSpec,
};

mod held;
mod points;

mod undo;
pub use crate::refusal::{Refusal, SharedCode};
pub use clocks::CpuClock;
pub use held::{Applied, Held};
pub use points::{CallTargetCounts, PointSpec, MAX_CALL_TARGET_SLOTS};
#[cfg(debug_assertions)]
#[doc(hidden)]
pub use undo::Fault;

/// A step of a change a test may make fail (debug builds; nothing in
/// release builds): see [`undo`].
macro_rules! checkpoint {
    ($process:expr, $step:ident) => {
        #[cfg(debug_assertions)]
        $process.checkpoint(undo::Fault::$step)?;
    };
}

mod alloc;
mod check;
mod clocks;
mod insert;
mod load;
mod plan;
mod remove;
mod replace;
mod sample;
mod sessions;
mod stage;
mod threads;
use check::must_refuse;
use plan::{counter_room, plan_key};

/// Longest prefix of a function decoded to look for jumps into the patch.
const MAX_ANALYZED: u64 = 64 * 1024;
/// How often weft lets the world run and looks again when a thread is
/// stopped inside bytes it must change.
const MOVE_ON_ATTEMPTS: u32 = 50;
/// From this many planned functions on, [`Process::hold`] builds their
/// counters' trampolines before it stops the world: ~5 µs each, which
/// would otherwise all be pause.
const STAGE_AT_LEAST: usize = 64;
/// How long [`Process::hold`] waits for another weft that holds the
/// process to let go.
const WAIT_FOR_OTHER_WEFT: Duration = Duration::from_secs(3);
/// Page size, for grouping patch writes (one `pwrite` within one page is
/// done whole or not at all, even if weft is killed).
const PAGE: u64 = 4096;
/// Sites this close share a planned area for their trampolines (a module's
/// code, usually).
const NEIGHBOURS: u64 = 64 << 20;

/// A function of the target (see [`crate::inspect::FoundFunction`]).
pub type Function = FoundFunction;

/// Identifies one probe of a [`Process`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProbeId(pub u32);

/// A probe spliced into a function's entry.
#[derive(Clone, Debug)]
pub struct Probe {
    /// Its handle.
    pub id: ProbeId,
    /// The function as found (for IFUNCs, `address` is the implementation).
    pub function: Function,
    /// Where the `jmp` was written (after an `endbr64`, if any).
    pub patch_address: u64,
    /// The bytes the `jmp` replaced: the function's own, or another
    /// session's `jmp` for a probe chained over that one's (several tools
    /// on one function: docs/design.md, "Sessions").
    pub original: [u8; 5],
    /// The `jmp` itself (to check it is still ours before restoring).
    pub patch: [u8; 5],
    /// The function's own bytes at `patch_address`, as compiled (`original`
    /// unless the probe is chained over another).
    pub(crate) compiled: [u8; 5],
    /// Offset in the trampoline of its copy of the displaced instructions
    /// (0: none), where a bypassed probe's trampoline jumps.
    pub(crate) relocated: u16,
    /// The trampoline's address range.
    pub trampoline: std::ops::Range<u64>,
    /// Still spliced in.
    pub active: bool,
    /// The bytes from `patch_address` whose instructions run in the
    /// trampoline instead: no other probe may be patched inside them.
    pub displaced: std::ops::Range<u64>,
    /// What it does, with what only that kind of probe has.
    pub kind: ProbeKind,
    /// Its entry in the target's probe directory (see `weft_rt::layout`).
    pub(crate) entry: Option<usize>,
    /// Another weft's probe this session shares (the same function and
    /// metrics asked while that one was live): its code, words and record
    /// are not this session's to reuse, and its figures are reported from
    /// this session's start on ([`Process::snapshot`]).
    pub(crate) borrowed: bool,
    /// The probes it counts inside ([`ProbeSpec::inside`]); empty: every
    /// call.
    pub inside: Vec<ProbeId>,
}

/// A function redirected to another ([`Held::replace_function`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replacement {
    /// Its handle: [`Held::remove`] puts the original back.
    pub id: ProbeId,
    /// The original function, still callable (its first instructions,
    /// relocated, then the rest of its body): a replacement that wants the
    /// original behaviour calls this address.
    pub original: u64,
}

/// The metric words a counting probe owns in every thread's row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Words {
    /// The first: the call (or execution) counter; with timers, see
    /// `weft_codegen::timer` for the rest.
    pub first: u32,
    /// How many, from `first` on.
    pub len: u32,
    /// Given to a later probe (only when the runtime's row ran out of
    /// words): the figures are gone and the probe leaves reports.
    pub recycled: bool,
}

impl Words {
    fn fresh(first: u32, len: u32) -> Words {
        Words {
            first,
            len,
            recycled: false,
        }
    }
}

/// What a [`Probe`] does. Each kind has only what it needs: a replaced
/// function has no counters, a point no exit hooks, only a point records
/// call targets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeKind {
    /// Counts a function's calls; with timers, times them too (the function
    /// is then called through a call record).
    Measure {
        /// What it measures.
        metrics: Metrics,
        /// Its counters (and timers).
        words: Words,
        /// The runtime call record a probe with exit hooks calls the
        /// function through (freed with its trampoline).
        record: Option<u32>,
    },
    /// Calls user probes at a function's entry or exits (at least one),
    /// and measures it like [`ProbeKind::Measure`].
    UserProbes {
        /// What it measures.
        metrics: Metrics,
        /// Its counters (and timers).
        words: Words,
        /// The call record (with an exit probe or timers).
        record: Option<u32>,
        /// Called at the function's entry.
        on_entry: Option<UserProbe>,
        /// Called at the function's exits.
        on_exit: Option<UserProbe>,
    },
    /// An instruction point ([`Held::insert_points`]): counts executions.
    Point {
        /// The instruction's address (the patch may start at an earlier
        /// instruction of its block).
        at: u64,
        /// The execution counter, then the call-target table, if any.
        words: Words,
        /// A user probe called there.
        probe: Option<UserProbe>,
        /// Slots of the table recording where the indirect call there goes
        /// ([`Process::call_targets`]); it starts at the word after the
        /// counter.
        call_targets: Option<u32>,
    },
    /// A function redirected to another ([`Held::replace_function`]).
    Replacement {
        /// The function it is redirected to.
        with: u64,
    },
    /// A `call` made to call another function ([`Held::redirect_call`]).
    CallRedirect {
        /// The new callee.
        to: u64,
    },
    /// A `call` taken out ([`Held::remove_call`]).
    CallRemoved,
    /// Part of another probe: code of a sibling entry point that jumps
    /// into the bytes that probe's patch overwrites (glibc's
    /// `__mempcpy_*` into `__memmove_*`), relocated with the jump sent to
    /// the same instruction's copy in that probe's trampoline. Inserted,
    /// removed and undone with that probe; it counts nothing.
    Companion {
        /// The probe whose patch it goes around.
        of: ProbeId,
    },
    /// Another live weft's probe that only it may own (user probes, a
    /// point, a replacement: the target's directory does not say which).
    /// Planned around, never shared.
    Private {
        /// Where it is a point (the directory's function is not where it
        /// patched), as far as the directory tells.
        point: Option<u64>,
    },
}

impl Probe {
    /// Whether this is a live probe at the entry of `f` (not a point inside
    /// it, not a removed probe).
    pub fn is_live_entry_of(&self, f: &Function) -> bool {
        self.active && self.is_entry() && self.function.address == f.address
    }

    /// Whether it is at a function's entry (not a point inside it, not a
    /// companion of another probe in a sibling's code).
    fn is_entry(&self) -> bool {
        self.point().is_none() && !matches!(self.kind, ProbeKind::Companion { .. })
    }

    /// For a companion, the probe it belongs to.
    pub fn companion_of(&self) -> Option<ProbeId> {
        match self.kind {
            ProbeKind::Companion { of } => Some(of),
            _ => None,
        }
    }

    /// Whether the probe hooks the function's exit (timers, or a user
    /// probe at exits).
    pub fn hooks_exit(&self) -> bool {
        match &self.kind {
            // A traced probe has a call record without timers.
            ProbeKind::Measure {
                metrics, record, ..
            } => metrics.hooks_exit() || record.is_some(),
            ProbeKind::UserProbes {
                metrics, on_exit, ..
            } => metrics.hooks_exit() || on_exit.is_some(),
            _ => false,
        }
    }

    /// What it measures: calls (executions, for a point), and the timers
    /// of a timed function.
    pub fn metrics(&self) -> Metrics {
        match &self.kind {
            ProbeKind::Measure { metrics, .. } | ProbeKind::UserProbes { metrics, .. } => *metrics,
            _ => Metrics::CALLS,
        }
    }

    /// Its metric words, for a probe that counts.
    pub fn words(&self) -> Option<&Words> {
        match &self.kind {
            ProbeKind::Measure { words, .. }
            | ProbeKind::UserProbes { words, .. }
            | ProbeKind::Point { words, .. } => Some(words),
            _ => None,
        }
    }

    fn words_mut(&mut self) -> Option<&mut Words> {
        match &mut self.kind {
            ProbeKind::Measure { words, .. }
            | ProbeKind::UserProbes { words, .. }
            | ProbeKind::Point { words, .. } => Some(words),
            _ => None,
        }
    }

    /// The metric word of its call (or execution) counter, for a probe
    /// that counts: where its row values start.
    pub fn calls_word(&self) -> Option<u32> {
        self.words().map(|w| w.first)
    }

    /// Its words, unless they were given to a later probe.
    fn own_words(&self) -> Option<&Words> {
        self.words().filter(|w| !w.recycled && w.len > 0)
    }

    /// The runtime call record the function is called through (exit hooks).
    pub fn record(&self) -> Option<u32> {
        match &self.kind {
            ProbeKind::Measure { record, .. } | ProbeKind::UserProbes { record, .. } => *record,
            _ => None,
        }
    }

    fn take_record(&mut self) -> Option<u32> {
        match &mut self.kind {
            ProbeKind::Measure { record, .. } | ProbeKind::UserProbes { record, .. } => {
                record.take()
            }
            _ => None,
        }
    }

    /// For an instruction point: the instruction's address.
    pub fn point(&self) -> Option<u64> {
        match &self.kind {
            ProbeKind::Point { at, .. } => Some(*at),
            ProbeKind::Private { point } => *point,
            _ => None,
        }
    }
}

/// A call to a function of a library loaded into the target
/// ([`Held::load_library`]) at a function's entry or exits: the probe
/// function gets a `const struct weft_probe *` (see `include/weft_probe.h`
/// and [`weft_codegen::ProbeContext`]) with the arguments or return
/// values, the thread's index and `user`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserProbe {
    /// Address of the probe function in the target
    /// ([`Library::symbol`](crate::library::Library::symbol)).
    pub function: u64,
    /// A constant passed to every call.
    pub user: u64,
    /// Call it only when this holds (None: always). At an entry or an
    /// instruction point any [`Predicate`](weft_codegen::Predicate); at
    /// exits only `Predicate::Thread` (the arguments are gone there).
    pub predicate: Option<weft_codegen::Predicate>,
}

/// One function to instrument and what to do there ([`Held::insert_probes`]).
#[derive(Clone, Debug)]
pub struct ProbeSpec {
    /// The function.
    pub function: Function,
    /// Its calls are always counted; wall and CPU time hook its exit.
    pub metrics: Metrics,
    /// A user probe at its entry.
    pub on_entry: Option<UserProbe>,
    /// A user probe at its exits (every `ret`, tail call and the like:
    /// the function is called through a record, see
    /// `docs/exits-and-timers.md`); the probe sees the return values.
    pub on_exit: Option<UserProbe>,
    /// Count and time only the calls made while the thread is inside the
    /// functions of these probes (this session's timed probes; empty:
    /// every call), Paradyn's constrained metrics. Each constraining probe
    /// counts what its own constraint lets in, so constraining each probe
    /// of a call path `A > B > F` to the one before measures F under that
    /// path only. A constrained probe times (wall or CPU): its exits are
    /// hooked. See `docs/exits-and-timers.md`, "Constraints".
    pub inside: Vec<ProbeId>,
}

impl ProbeSpec {
    /// Counting (and timing, per `metrics`) only.
    pub fn measure(function: Function, metrics: Metrics) -> ProbeSpec {
        ProbeSpec {
            function,
            metrics,
            on_entry: None,
            on_exit: None,
            inside: Vec::new(),
        }
    }

    /// The same, counting only inside the functions of `probes` (see
    /// [`ProbeSpec::inside`]).
    pub fn inside(mut self, probes: &[ProbeId]) -> ProbeSpec {
        self.inside = probes.to_vec();
        self
    }

    /// Whether its exit is hooked, in a session that traces calls when
    /// `trace`.
    fn hooks_exit(&self, trace: bool) -> bool {
        self.metrics.hooks_exit() || self.on_exit.is_some() || trace
    }

    /// The kind of probe it makes, with its words and call record.
    fn kind(&self, words: Words, record: Option<u32>) -> ProbeKind {
        if self.on_entry.is_none() && self.on_exit.is_none() {
            return ProbeKind::Measure {
                metrics: self.metrics,
                words,
                record,
            };
        }
        ProbeKind::UserProbes {
            metrics: self.metrics,
            words,
            record,
            on_entry: self.on_entry,
            on_exit: self.on_exit,
        }
    }

    /// Metric words: 1 (a counter), 4 (exit counters, no timers) or 10
    /// (timers).
    fn words(&self, trace: bool) -> u32 {
        if self.metrics.keeps_histogram() {
            (weft_codegen::TIMER_HIST_METRIC_LEN / 8) as u32
        } else if self.metrics.hooks_exit() || trace {
            (weft_codegen::TIMER_METRIC_LEN / 8) as u32
        } else if self.on_exit.is_some() {
            (weft_codegen::METRIC_LEN / 8) as u32
        } else {
            1
        }
    }
}

/// A target process.
#[derive(Debug)]
pub struct Process {
    /// The target: its threads, its memory, its exit; how weft stops it.
    target: Target,
    /// The target's modules and functions, read from its files.
    image: ProcessImage,
    /// What was worked out about the target's code while it ran.
    planning: Planning,
    /// This weft as one session among those the target has: its slot,
    /// what it shares, how long it has been live.
    session: Session,
    // The instrumentation: the runtime, the probes and what they use.
    runtime: Option<Runtime>,
    pool: Pool,
    probes: Vec<Probe>,
    /// What the insertion in progress took, given back if it fails.
    pending: undo::Undo,
    /// What the insertion under way needs in all, for a full table's error.
    request_size: RequestSize,
    /// Metric words given back by failed insertions (zero: nothing wrote
    /// them), when the target's cursor had moved on meanwhile.
    free_words: Vec<(u32, u32)>,
    /// The step a test asked the next insertion to fail at.
    #[cfg(debug_assertions)]
    fault: Option<undo::Fault>,
    options: RuntimeOptions,
    /// The exit code installed this session: its metrics and layout.
    exits: Option<(Metrics, weft_codegen::ExitHooks)>,
    /// The CPU-time table's feed (see `process/clocks.rs`).
    cpu_table: Option<clocks::CpuTable>,
    /// The call trace drained from the threads' rings (`-m trace`).
    trace: Option<std::sync::Arc<std::sync::Mutex<crate::trace::TraceLog>>>,
    /// Drains the trace rings every half millisecond while this session
    /// lives.
    trace_drainer: Option<crate::trace::Drainer>,
    /// Functions inserted from now on are traced ([`Process::set_trace_calls`]).
    pub(crate) trace_calls: bool,
    /// Call records given back by removed probes (new ones come from the
    /// target's cursor: `ledger::allocate_record`).
    free_records: Vec<u32>,
    /// Trampolines of removed probes, reused once no thread can be in them.
    retired: Vec<std::ops::Range<u64>>,
    /// Probes (indices) whose trampolines were reused: nothing writes their
    /// words any more, which may be given to new probes when the row is
    /// full.
    quiet: Vec<usize>,
    /// Open activations pointed at the sink words, by cell address: the
    /// metric base they had (their self time so far stays their
    /// function's, `open_self`).
    retired_cells: crate::open_self::Retired,
    /// Probes weft put in for its own use (the loader hook of
    /// `Watcher::defer_at_load`): not in reports.
    unreported: Vec<ProbeId>,
    /// Spare room for the probes of the next insertion (its capacity
    /// touched ahead: see `prefault`).
    spare_probes: Vec<Probe>,
    /// Probes whose trampolines jump into another's (a sibling entry
    /// point's probe whose displaced jump goes to the copy of its target
    /// in that probe's trampoline): (the sibling's, the other). They go
    /// in and out together: the sibling's original jump lands inside the
    /// other's patch, and the sibling's trampoline needs the other's.
    ties: Vec<(ProbeId, ProbeId)>,
}

/// A step of a change used the runtime before the change loaded it: a bug
/// in weft, not something a caller can cause.
/// The 5-byte jump that patches `site` toward code at `at`, and the 5
/// bytes it replaces (what the record in front of the trampoline keeps).
pub(crate) fn patch_for(site: &PatchSite, at: u64) -> Result<([u8; 5], [u8; 5]), Error> {
    let patch = jmp_rel32(site.patch_address, at).map_err(|e| Error::Internal(e.to_string()))?;
    let mut original = [0u8; 5];
    original.copy_from_slice(&site.original[..5]);
    Ok((patch, original))
}

/// Why a patch is refused when other code jumps into the bytes it would
/// overwrite (entries and instruction points say it the same way).
pub(crate) fn jumped_into(
    branch: &weft_codegen::Branch,
    module: &str,
    site: &PatchSite,
) -> Refusal {
    Refusal::JumpedInto {
        from: branch.source,
        target: branch.target,
        module: module.to_string(),
        len: site.original.len(),
        patch_address: site.patch_address,
    }
}

/// Table entries an insertion needs ([`Error::OutOfRoom`]).
#[derive(Clone, Copy, Debug, Default)]
struct RequestSize {
    words: u64,
    records: u64,
    probes: u64,
}

fn no_runtime() -> Error {
    Error::Internal("the runtime was used before it was loaded".into())
}

/// Checks that make attach errors clear before ptrace is tried.
fn preflight(pid: i32) -> Result<(), Error> {
    if pid <= 0 {
        return Err(Error::NoSuchProcess(pid));
    }
    match crate::inspect::process_state(pid) {
        Err(crate::inspect::InspectError::NoSuchProcess(_)) => {
            return Err(Error::NoSuchProcess(pid))
        }
        Err(e) => return Err(e.into()),
        Ok(state) if state.is_zombie() => return Err(Error::Zombie(pid)),
        Ok(_) => {}
    }
    if pid as u32 == std::process::id() {
        return Err(Error::SelfAttach);
    }
    Ok(())
}

/// The target as weft stops and reads it: its pid, its threads' state
/// across holds, its memory for reading while it runs, and its end.
#[derive(Debug)]
struct Target {
    pid: i32,
    /// A launched program's ptrace stop at its entry: its first
    /// [`Process::hold`] takes it instead of attaching (the program has not
    /// run yet). Otherwise the tracer lives only in a [`Held`].
    entry_stop: Option<Tracer>,
    /// Real-time priority from `open` or `hold` until `release` (see
    /// [`Process::open`]).
    boost: Option<RealtimeGuard>,
    /// What the other threads do while the runtime is loaded.
    load_world: crate::ptrace::World,
    /// See [`Process::launched_through`].
    launched_through: Vec<String>,
    launched: bool,
    /// Set once the process has run on its own (weft released it).
    ever_released: bool,
    exit: Option<ProcessExit>,
    threads_at_attach: usize,
    /// Threads moved out of patch sites so far ([`Process::move_threads_out`]).
    threads_moved: u64,
    /// Stops of the world by tracers released before the current one.
    stops_before: u64,
    /// Rounds of stops given up for a late thread, over every hold so far.
    stops_given_up: u64,
    /// Threads whose CPU clock's perf event the last session let go of
    /// ([`Process::clocks_released`]).
    clocks_released: u32,
    /// [`Process::keep_cpu_clocks`].
    keep_cpu_clocks: bool,
    /// Whether the caller chooses each thread's CPU clock
    /// ([`Process::choose_cpu_clocks`]).
    clocks_chosen: bool,
    /// The CPU clocks this session paused ([`Process::pause_cpu_clock`]):
    /// row index → (thread, the clock pointer to give back).
    paused_clocks: std::sync::Mutex<std::collections::HashMap<u32, (Tid, u64)>>,
    /// The longest stop of the world of the last hold, once released.
    longest_stop: StopTime,
    /// `/proc/PID/mem`, read-only, for planning while not held.
    memory: Option<crate::memory::ProcessMemory>,
    /// Where the remote-call return stub is in the target, once known.
    stub_address: Option<u64>,
}

/// This weft as one of the target's sessions: its identity and slot in the session table, the baselines of the probes it shares, the other sessions' probes as last read, and how long its probes have been live.
#[derive(Debug)]
struct Session {
    /// This weft as the target's session table records it, and its slot
    /// there once the runtime is loaded.
    identity: crate::ledger::Identity,
    slot: Option<usize>,
    /// Values of borrowed probes' words when this session started sharing
    /// them, by row (index, generation): subtracted from what it reads.
    baselines: AddressMap<(u32, u32), Vec<(u32, u64)>>,
    /// Other sessions' live probes, from the target's directory as of this
    /// session's last look (refreshed at every insertion): planned around
    /// like this session's own, and shared where asked for again.
    foreign: Vec<Probe>,
    live_since: Option<Instant>,
    live_for: Duration,
    /// Final figures of exited threads whose rows were handed back.
    harvested: Vec<RowSnapshot>,
    /// Functions already searched for points an earlier weft left
    /// (`remove_leftover_points`: once per function and `Process`).
    leftovers_checked: AddressSet<u64>,
    /// [`Process::adopt_forked_probes`], until the first insertion.
    adopt_forked: bool,
}

/// What weft worked out about the target's code while it ran (`prepare`, `check_points`, `hold`): branch indexes, planned sites and points, trampolines staged ahead.
#[derive(Debug)]
struct Planning {
    /// Direct branches of each module patched so far, by module path.
    branch_indexes: std::collections::HashMap<std::path::PathBuf, crate::branches::BranchIndex>,
    /// Sites planned ahead (by [`Process::prepare`], while the target runs),
    /// by function address, size and padding; checked against the code
    /// again, with the world stopped, before they are patched.
    plans: AddressMap<(u64, u64, u64), Arc<PatchSite>>,
    /// Points planned by [`Process::check_points`] while the target ran,
    /// by (function, point address, call-target slots): an insertion reuses a plan whose
    /// bytes are still those it was made from, instead of decoding the
    /// function again in the stop (64 KiB for an interpreter's loop).
    point_plans: std::collections::HashMap<(u64, u64, Option<u32>), PatchSite>,
    /// Counters built ahead for planned sites (by [`Process::hold`], before
    /// it stops the world), by the same key.
    staged: AddressMap<(u64, u64, u64), Staged>,
}

impl Process {
    /// Opens a running process for inspection without stopping it: find
    /// functions and [`Process::prepare`] them first, then [`Process::hold`]
    /// it only for the splice, so the target's pause holds no file parsing.
    /// (There is no `attach` that returns a process already stopped: the
    /// stop is the [`Held`] that `hold` returns, and ends with it.)
    ///
    /// From `open` (or [`Process::hold`]) until [`Held::release`] the
    /// calling thread runs at real-time priority (`SCHED_FIFO` 1) when the
    /// system permits: a target with many busy threads on few cores would
    /// otherwise keep weft waiting 100-400 ms for the CPU every time it is
    /// preempted, before and after the pause as much as during it. Do no
    /// long computation of your own in between.
    pub fn open(pid: i32) -> Result<Process, Error> {
        Process::open_with(pid, RuntimeOptions::default())
    }

    /// [`Process::open`] with a runtime geometry.
    pub fn open_with(pid: i32, options: RuntimeOptions) -> Result<Process, Error> {
        let boost = RealtimeGuard::raise();
        preflight(pid)?;
        runtime::warm_up(!runtime::is_loaded(pid));
        let image = ProcessImage::open(pid)?;
        if image.is_statically_linked() {
            return Err(Error::StaticallyLinked(pid));
        }
        let mut process = Process::new(pid, None, image, options, false);
        process.target.boost = boost;
        Ok(process)
    }

    fn new(
        pid: i32,
        tracer: Option<Tracer>,
        image: ProcessImage,
        options: RuntimeOptions,
        launched: bool,
    ) -> Process {
        Process {
            planning: Planning {
                branch_indexes: Default::default(),
                plans: Default::default(),
                point_plans: Default::default(),
                staged: Default::default(),
            },
            session: Session {
                identity: crate::ledger::Identity::own(),
                slot: None,
                baselines: AddressMap::default(),
                foreign: Vec::new(),
                live_since: None,
                live_for: Duration::ZERO,
                harvested: Vec::new(),
                leftovers_checked: AddressSet::default(),
                adopt_forked: false,
            },
            target: Target {
                pid,
                threads_at_attach: tracer.as_ref().map_or(0, Tracer::thread_count),
                entry_stop: tracer,
                boost: None,
                load_world: crate::ptrace::World::WhenWaiting,
                launched_through: Vec::new(),
                launched,
                // A launched program has not run yet; an attached one has.
                ever_released: !launched,
                exit: None,
                threads_moved: 0,
                stops_before: 0,
                stops_given_up: 0,
                clocks_released: 0,
                keep_cpu_clocks: false,
                clocks_chosen: false,
                paused_clocks: Default::default(),
                longest_stop: StopTime::default(),
                memory: None,
                stub_address: None,
            },
            image,
            runtime: None,
            pool: Pool::default(),
            probes: Vec::new(),
            pending: undo::Undo::default(),
            request_size: RequestSize::default(),
            free_words: Vec::new(),
            #[cfg(debug_assertions)]
            fault: None,
            options,
            exits: None,
            cpu_table: None,
            trace: None,
            trace_drainer: None,
            trace_calls: false,
            spare_probes: Vec::new(),
            ties: Vec::new(),
            unreported: Vec::new(),
            retired: Vec::new(),
            quiet: Vec::new(),
            free_records: Vec::new(),
            retired_cells: Default::default(),
        }
    }

    /// Starts `program` with `args` and stops it at its entry point, after
    /// the dynamic loader has run and before `main` (and before the
    /// executable's own constructors). It stays there until the first
    /// [`Held`] of it is released: probes inserted in that hold count every
    /// call from `main` on. Dropped before that (the `Process`, or a `Held`
    /// without [`Held::release`]), the program is killed and reaped: it
    /// must not run uninstrumented. A script or an exec wrapper (`env`,
    /// `nice`…) is followed to the program it `exec`s
    /// ([`Process::launched_through`]).
    pub fn launch(program: &str, args: &[String]) -> Result<Process, Error> {
        let (pid, tracer, through) = crate::launch::spawn_stopped_at_entry(program, args)?;
        let image = match ProcessImage::open(pid) {
            Ok(image) => image,
            Err(e) => {
                crate::launch::kill_stopped(pid, tracer);
                return Err(e.into());
            }
        };
        if image.is_statically_linked() {
            // Stopped at its entry: it must not go on to main unmeasured.
            crate::launch::kill_stopped(pid, tracer);
            return Err(Error::StaticallyLinked(pid));
        }
        let mut process = Process::new(pid, Some(tracer), image, RuntimeOptions::default(), true);
        process.target.launched_through = through;
        Ok(process)
    }

    /// For a program [`Process::launch`] started through a script or an
    /// exec wrapper (`env`, a shell, `nice`…): the executables it went
    /// through before the program it stopped at, in order; empty
    /// otherwise.
    pub fn launched_through(&self) -> &[String] {
        &self.target.launched_through
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.target.pid
    }

    /// Threads found when weft attached.
    pub fn threads_at_attach(&self) -> usize {
        self.target.threads_at_attach
    }

    /// The probes inserted so far (removed ones included, inactive).
    pub fn probes(&self) -> &[Probe] {
        &self.probes
    }

    /// The process's modules and symbols.
    pub fn image(&mut self) -> &mut ProcessImage {
        &mut self.image
    }

    /// Functions matching any of `patterns`; an error naming near matches
    /// when a pattern matches nothing.
    pub fn find_functions(&mut self, patterns: &[Pattern]) -> Result<Vec<Function>, Error> {
        let mut all: Vec<Function> = Vec::new();
        let mut index: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
        for pattern in patterns {
            let found = self.image.find_functions(std::slice::from_ref(pattern))?;
            if found.is_empty() {
                let suggestions = self.image.suggest(pattern)?;
                return Err(Error::NoMatch {
                    pattern: pattern.to_string(),
                    suggestions,
                    still_loading: self.image.still_loading(),
                });
            }
            for f in found {
                // One function per address; the names other patterns
                // matched at it become aliases.
                match index.get(&f.address).map(|&i| &mut all[i]) {
                    Some(g) => {
                        for name in std::iter::once(f.name).chain(f.aliases) {
                            if name != g.name && !g.aliases.contains(&name) {
                                g.aliases.push(name);
                            }
                        }
                    }
                    None => {
                        index.insert(f.address, all.len());
                        all.push(f);
                    }
                }
            }
        }
        Ok(all)
    }

    /// The runtime, loaded by an earlier step of the change in progress.
    fn rt(&self) -> Result<&Runtime, Error> {
        self.runtime.as_ref().ok_or_else(no_runtime)
    }

    /// Leaves probe `id` (weft's own, not the user's) out of reports.
    pub(crate) fn leave_out_of_reports(&mut self, id: ProbeId) {
        if !self.unreported.contains(&id) {
            self.unreported.push(id);
        }
    }

    /// The runtime's region header, writable (for the words weft sets
    /// there), once the runtime is loaded ([`Held`] loads it).
    pub(crate) fn region_header(&self) -> Option<&weft_rt::layout::RegionHeader> {
        self.runtime.as_ref().map(|rt| rt.region.control())
    }

    /// Whether the process is still alive (not exited, not a zombie).
    pub fn is_alive(&self) -> bool {
        if self.target.exit.is_some() {
            return false;
        }
        match crate::inspect::process_state(self.target.pid) {
            Ok(state) => !state.is_zombie(),
            Err(_) => false,
        }
    }

    /// For a launched process: waits until it exits (forwarding SIGTERM,
    /// SIGHUP and SIGINT weft receives meanwhile) and returns how it ended.
    pub fn wait_exit(&mut self) -> Result<ProcessExit, Error> {
        self.wait_exit_with(&mut || {})
    }

    /// [`Process::wait_exit`], calling `tick` every few milliseconds
    /// meanwhile, on the calling thread (a tool following the process's
    /// children attaches to them there).
    pub fn wait_exit_with(&mut self, tick: &mut dyn FnMut()) -> Result<ProcessExit, Error> {
        if let Some(exit) = self.target.exit {
            return Ok(exit);
        }
        if !self.target.launched {
            return Err(Error::NotOurChild(self.target.pid));
        }
        if let Some(mut tracer) = self.target.entry_stop.take() {
            // Never held: it runs from its entry uninstrumented, as asked.
            self.let_go(&mut tracer)?;
        }
        // Harvest exited threads' rows while waiting, so that a program that
        // creates many short-lived threads reuses rows instead of running
        // out of them.
        let exit = crate::launch::wait_child(self.target.pid, &mut || {
            self.harvest();
            tick();
        })?;
        // The last threads ended with the process.
        self.harvest();
        self.target.exit = Some(exit);
        if let Some(since) = self.session.live_since.take() {
            self.session.live_for += since.elapsed();
        }
        Ok(exit)
    }

    /// How many times weft has stopped the whole process so far (each
    /// [`Process::hold`], and each time a remote call let the other threads
    /// run and stopped them again): what a tool checks to know its batch of
    /// changes was applied in one stop. ([`Held::stops`] counts the current
    /// hold's too.)
    pub fn stops(&self) -> u64 {
        self.target.stops_before
    }

    /// Whether the program has run: false for one [`Process::launch`]
    /// started until its first hold (the stop at its entry) is released.
    pub fn has_run(&self) -> bool {
        self.target.ever_released
    }

    /// Follows a forked child: the probes it inherited from the process it
    /// was forked from (the runtime marks that process's sessions forked
    /// away in the child's own region, and zeroes what they counted there)
    /// are taken over where this session's first insertion asks for the
    /// same functions, with what they counted since the fork, and the
    /// others are taken out. Without it, they are taken out as a dead
    /// session's and the figures start at the insertion. Call before the
    /// first insertion.
    pub fn adopt_forked_probes(&mut self) {
        self.session.adopt_forked = true;
    }

    /// Keeps the threads' CPU clocks' perf events when a release finds no
    /// probe in the process (else they go then, see `process/clocks.rs`):
    /// for a tool that takes every probe out between two phases and puts
    /// new ones in (the diagnosis), which would otherwise pay for a perf
    /// event per thread again at each phase (its making is CPU time of the
    /// thread, charged to whatever activation is open). Set it back to
    /// false before the last release.
    pub fn keep_cpu_clocks(&mut self, keep: bool) {
        self.target.keep_cpu_clocks = keep;
    }

    /// Threads whose CPU clock's perf event was let go of when this weft,
    /// the last session with probes in the process, released it (see
    /// `process/clocks.rs`): the kernel switches such an event with its
    /// thread at every context switch, a cost that would outlive weft.
    pub fn clocks_released(&self) -> u32 {
        self.target.clocks_released
    }

    /// How many times a stop of the world (of the holds ended so far) was
    /// given up because a thread was late to stop, and tried again: the
    /// threads that had stopped ran on instead of waiting for it.
    pub fn stops_given_up(&self) -> u64 {
        self.target.stops_given_up
    }

    /// How many threads weft found stopped inside the bytes of a patch it
    /// wrote, and moved to the same instruction's copy in the trampoline.
    pub fn threads_moved(&self) -> u64 {
        self.target.threads_moved
    }

    /// Keeps every stop of the world short, the first one too: the
    /// runtime (loaded by the first insertion) is then loaded with the
    /// other threads running all along, instead of stopped while the
    /// loader computes. The load then competes with them for the CPUs (on
    /// a saturated machine it takes longer), but no thread waits for it:
    /// for a tool that stops the target many times and promises each stop
    /// is short (`weft diagnose`).
    pub fn prefer_short_stops(&mut self) {
        self.target.load_world = crate::ptrace::World::Running;
    }

    /// The longest time the target's threads were all stopped at once
    /// during the last hold, from the first interrupt to the last thread
    /// resumed ([`Held::longest_stop`]: during the current one).
    pub fn longest_stop(&self) -> Duration {
        self.target.longest_stop.total
    }

    /// [`Process::longest_stop`], and where its time went: the threads
    /// stopping, weft's work, resuming them.
    pub fn longest_stop_time(&self) -> StopTime {
        self.target.longest_stop
    }

    /// Reads `len` bytes of the target's memory at `address` (through
    /// `/proc/PID/mem`: the process need not be held, but a running
    /// thread may be changing what is read).
    pub fn read_memory(&self, address: u64, len: usize) -> Result<Vec<u8>, Error> {
        let memory = crate::memory::ProcessMemory::open(self.target.pid)?;
        Ok(memory.read_vec(address, len)?)
    }

    /// Open activations pointed at the sink words (see `open_self`).
    pub(crate) fn retired_cells(&self) -> &crate::open_self::Retired {
        &self.retired_cells
    }

    /// The shared region, once the runtime is loaded.
    pub(crate) fn region(&self) -> Option<&crate::region::Region> {
        self.runtime.as_ref().map(|rt| &rt.region)
    }

    /// Rows the runtime has handed out, and how many threads reused a row.
    pub fn row_usage(&self) -> (u32, u64) {
        self.runtime.as_ref().map_or((0, 0), |rt| {
            let h = rt.region.header();
            (
                h.rows_used.load(std::sync::atomic::Ordering::Relaxed),
                h.rows_reused.load(std::sync::atomic::Ordering::Relaxed),
            )
        })
    }

    /// Target memory for trampolines: (bytes mapped, bytes handed out).
    /// Both are bounded by the probes in at once — a removed probe's space
    /// is reused once no thread can be in it — not by probes ever inserted.
    pub fn trampoline_memory(&self) -> (u64, u64) {
        (self.pool.mapped_bytes(), self.pool.used_bytes())
    }

    /// Time probes have been live.
    pub fn live_duration(&self) -> Duration {
        self.session.live_for
            + self
                .session
                .live_since
                .map_or(Duration::ZERO, |s| s.elapsed())
    }

    /// The offset from the thread pointer of the runtime's thread-local
    /// row pointer, once the runtime is loaded: what kernel probes read to
    /// attribute a call to the user function its thread is in.
    pub fn runtime_tls_offset(&self) -> Option<i64> {
        self.runtime
            .as_ref()
            .map(|rt| rt.region.header().tls_offset)
    }

    /// The name of the function whose metric words start at row offset
    /// `base` (what an activation cell records): how a kernel probe's
    /// attribution reads in a report.
    pub fn function_at_metric_offset(&self, base: u32) -> Option<String> {
        self.probes.iter().find_map(|p| {
            let first = p.own_words()?.first;
            (weft_rt::layout::Geometry::metric_offset(first) == u64::from(base))
                .then(|| points::probe_name(p))
        })
    }
}

/// A hasher for keys made of addresses: a multiply and a rotate per word
/// (SipHash, the default, costs more than the rest of planning a probe;
/// these keys come from weft's own view of the target, not from input
/// crafted to collide).
#[derive(Default)]
struct AddressHasher(u64);

impl std::hash::Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(29);
    }
}

type AddressMap<K, V> =
    std::collections::HashMap<K, V, std::hash::BuildHasherDefault<AddressHasher>>;
type AddressSet<K> = std::collections::HashSet<K, std::hash::BuildHasherDefault<AddressHasher>>;

/// What a cached plan is keyed by: the function's address and extent.
/// The bytes active probes displace, sorted, for overlap queries in
/// O(log n) (active probes' ranges never overlap one another).
struct Occupied(Vec<(u64, u64, usize)>);

impl Occupied {
    /// Built from this session's probes and other sessions' live ones
    /// (`foreign`), indexed as if `foreign` followed `own`.
    fn of(own: &[Probe], foreign: &[Probe]) -> Occupied {
        let mut v: Vec<(u64, u64, usize)> = own
            .iter()
            .chain(foreign)
            .enumerate()
            .filter(|(_, p)| p.active)
            .map(|(i, p)| (p.displaced.start, p.displaced.end, i))
            .collect();
        v.sort_unstable();
        Occupied(v)
    }

    fn probe<'a>(own: &'a [Probe], foreign: &'a [Probe], i: usize) -> &'a Probe {
        own.get(i).unwrap_or_else(|| &foreign[i - own.len()])
    }

    /// The active probe (of those `self` was built from) whose displaced
    /// bytes overlap `range`. Only the last range starting before
    /// `range.end` can: an earlier one overlapping `range` would make the
    /// later start inside `range` too.
    fn overlapping<'a>(
        &self,
        own: &'a [Probe],
        foreign: &'a [Probe],
        range: std::ops::Range<u64>,
    ) -> Option<&'a Probe> {
        let k = self.0.partition_point(|&(start, _, _)| start < range.end);
        let &(_, end, i) = self.0.get(k.checked_sub(1)?)?;
        (end > range.start).then(|| Occupied::probe(own, foreign, i))
    }

    /// Puts back, in `code` (read from the target at `address`), the bytes
    /// the active probes (of those `self` was built from) replaced: the
    /// code as it was compiled. Only the probes displacing bytes of the
    /// range are looked at: the one starting before it, and those starting
    /// inside it.
    fn restore_originals(&self, own: &[Probe], foreign: &[Probe], address: u64, code: &mut [u8]) {
        let end = address + code.len() as u64;
        let first = self
            .0
            .partition_point(|&(start, _, _)| start < address)
            .saturating_sub(1);
        for &(start, _, i) in self.0[first..].iter().take_while(|e| e.0 < end) {
            // A chain's links all give the function's own bytes.
            for (k, &byte) in Occupied::probe(own, foreign, i).compiled.iter().enumerate() {
                let at = start + k as u64;
                if (address..end).contains(&at) {
                    code[(at - address) as usize] = byte;
                }
            }
        }
    }
}

/// A trampoline companions lead into: its probe, its address and its
/// copies of the displaced instructions (`Trampoline::instruction_offsets`).
type Built = (ProbeId, u64, Vec<(u32, u32)>);

/// An insertion planned ([`Process::plan_request`]), nothing changed yet.
struct Planned<'a> {
    /// Sites to patch.
    plans: Vec<(&'a ProbeSpec, Arc<PatchSite>)>,
    /// Other sessions' probes to share: (request, directory entry).
    shares: Vec<(&'a ProbeSpec, usize)>,
    /// Companions of the planned sites other code jumps into.
    companions: Vec<CompanionPlan>,
    /// Planned sites (siblings) that displace a jump into another planned
    /// site, sent to its copy instead of a companion.
    retargets: Vec<Retarget>,
    /// Requests refused (index), and why.
    refused: Vec<(usize, Refusal)>,
}

/// A planned sibling's entry site that displaces a jump into another
/// planned site: its trampoline's copy of the jump goes to the copy of
/// the target in that site's trampoline (the two probes are then tied).
#[derive(Debug)]
struct Retarget {
    /// The sibling's patch address.
    plan: u64,
    /// The jump's address.
    jump: u64,
    /// The patch address of the site it jumps into.
    of: u64,
    /// Which of that site's displaced instructions it lands on.
    target: usize,
}

/// A jump from a sibling entry point into the bytes a planned site
/// overwrites, and the code around it to relocate into a companion
/// ([`ProbeKind::Companion`]).
#[derive(Debug)]
struct CompanionPlan {
    /// The patch address of the site it jumps into.
    of: u64,
    /// The sibling holding the jump.
    function: Function,
    /// The jump's address.
    jump: u64,
    /// Which of the site's displaced instructions it lands on.
    target: usize,
    /// The sibling's code to relocate, the jump among it.
    site: Arc<PatchSite>,
}

/// A counter's trampoline built ahead ([`Process::stage_prepared`]).
#[derive(Debug)]
struct Staged {
    /// The plan it was built from.
    site: Arc<PatchSite>,
    /// Its metric word.
    word: u32,
    /// The planned area it lies in.
    area: u64,
    /// The trampoline's address (its record is in front of it).
    at: u64,
    trampoline_len: u64,
    /// The record, the trampoline, and int3 to the end of its space.
    bytes: Vec<u8>,
    /// Where threads stopped inside the patch go on (see [`Resume`]).
    resumes: Vec<Resume>,
    original: [u8; 5],
    patch: [u8; 5],
    /// [`Probe::relocated`].
    relocated: u16,
    /// Already in the target: its area was mapped, so it was written while
    /// the target ran (nothing jumps there until the patch).
    written: bool,
}

/// [`Process::write_staged`]: probes written, their sites, plans left.
type StagedWrite<'a> = (
    Vec<Probe>,
    Vec<Arc<PatchSite>>,
    Vec<(&'a ProbeSpec, Arc<PatchSite>)>,
    Vec<Resume>,
);

/// Where `trampoline`'s copy of the displaced instructions starts, for
/// [`Probe::relocated`] (0: beyond what the directory keeps, so never
/// bypassed).
pub(crate) fn relocated_offset(trampoline: &weft_codegen::Trampoline) -> u16 {
    u16::try_from(trampoline.relocated_offset).unwrap_or(0)
}

/// [`Process::share_or_chain`]'s answer.
enum AtOtherProbe {
    /// Share this directory entry's probe.
    Share(usize),
    /// Put a probe of this session's own over the one in place, at this site.
    Chain(PatchSite),
}

/// A displaced instruction of a patch, and where a thread stopped at it
/// goes on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Resume {
    /// The instruction's address in the original code.
    at: u64,
    /// It is the first (where the patch starts): a thread there takes the
    /// patch and need not move, unless its system call restarts into it.
    first: bool,
    /// Its length.
    len: u8,
    /// Where a thread that has not run it yet goes on.
    resume: u64,
    /// Its relocated copy (for a thread whose system call restarts by
    /// stepping back over it).
    copy: u64,
}

/// The [`Resume`]s of a trampoline at `at` built for `site`, from
/// `Trampoline::instruction_offsets`.
pub(crate) fn resumes<'a>(
    site: &'a PatchSite,
    at: u64,
    offsets: &'a [(u32, u32)],
) -> impl Iterator<Item = Resume> + 'a {
    site.instructions
        .iter()
        .zip(offsets)
        .map(move |(i, &(resume, copy))| Resume {
            at: i.ip(),
            first: i.ip() == site.patch_address,
            len: i.len() as u8,
            resume: at + u64::from(resume),
            copy: at + u64::from(copy),
        })
}

impl Drop for Process {
    fn drop(&mut self) {
        // A program weft launched that is still stopped at its entry
        // (never released): instrumenting it failed or was never done, so
        // it must not run at all (the user asked for it to run
        // instrumented). It is our child, not reaped yet.
        if let Some(tracer) = self.target.entry_stop.take() {
            crate::launch::kill_stopped(self.target.pid, tracer);
        }
        // Otherwise there is nothing to let go of: the tracer lived in a
        // `Held`, which released the process when it ended.
    }
}

#[cfg(test)]
mod tests {
    use super::stage::adjacent_runs;
    use super::*;

    fn probe(id: u32, patch: u64, displaced_end: u64, original: [u8; 5], active: bool) -> Probe {
        Probe {
            id: ProbeId(id),
            function: Function {
                name: format!("f{id}"),
                module: "exe".into(),
                module_path: "/exe".into(),
                address: patch,
                vaddr: patch,
                size: 64,
                kind: FunctionKind::Plain,
                source: crate::inspect::SymbolSource::Symtab,
                padding: 0,
                aliases: Vec::new(),
            },
            patch_address: patch,
            original,
            patch: [0xe9, 0, 0, 0, 0],
            compiled: original,
            relocated: 0,
            trampoline: 0..0,
            active,
            displaced: patch..displaced_end,
            kind: ProbeKind::Measure {
                metrics: Metrics::CALLS,
                words: Words::fresh(0, 1),
                record: None,
            },
            entry: None,
            borrowed: false,
            inside: Vec::new(),
        }
    }

    #[test]
    fn occupied_finds_overlaps_and_restores_only_active_probes() {
        let probes = vec![
            probe(0, 0x100, 0x106, [1, 2, 3, 4, 5], true),
            probe(1, 0x110, 0x115, [6, 7, 8, 9, 10], true),
            probe(2, 0x120, 0x125, [11, 12, 13, 14, 15], false),
        ];
        let occ = Occupied::of(&probes, &[]);
        let hit = |r: std::ops::Range<u64>| occ.overlapping(&probes, &[], r).map(|p| p.id.0);
        assert_eq!(hit(0x105..0x10a), Some(0)); // the displaced tail counts
        assert_eq!(hit(0x106..0x110), None); // between them
        assert_eq!(hit(0x0fb..0x100), None); // ends where one starts
        assert_eq!(hit(0x0f0..0x120), Some(1)); // covers both: one is named
        assert_eq!(hit(0x120..0x125), None); // removed probes do not count
                                             // Code read from 0x103..0x113: the tail of probe 0, the head of 1.
        let mut code = vec![0xe9u8; 16];
        occ.restore_originals(&probes, &[], 0x103, &mut code);
        assert_eq!(&code[..2], &[4, 5]);
        assert_eq!(&code[2..13], &[0xe9; 11]);
        assert_eq!(&code[13..], &[6, 7, 8]);
        // A range holding none of them, and removed probe 2's bytes.
        let mut code = vec![0u8; 8];
        occ.restore_originals(&probes, &[], 0x120, &mut code);
        assert_eq!(code, vec![0u8; 8]);
    }

    #[test]
    fn adjacent_runs_join_only_neighbours() {
        let runs = adjacent_runs(vec![
            (0x10, vec![1, 2]),
            (0x12, vec![3]),
            (0x20, vec![4]),
            (0x21, vec![5, 6]),
            (0x30, vec![7]),
        ]);
        assert_eq!(
            runs,
            vec![
                (0x10, vec![1, 2, 3], 0..2),
                (0x20, vec![4, 5, 6], 2..4),
                (0x30, vec![7], 4..5),
            ]
        );
        assert!(adjacent_runs(Vec::new()).is_empty());
    }
}
