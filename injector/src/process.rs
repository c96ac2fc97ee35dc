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
mod refusal;
mod undo;
pub use held::{Applied, Held};
pub use points::{CallTargetCounts, PointSpec, MAX_CALL_TARGET_SLOTS};
pub use refusal::{Refusal, SharedCode};
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
}

impl ProbeSpec {
    /// Counting (and timing, per `metrics`) only.
    pub fn measure(function: Function, metrics: Metrics) -> ProbeSpec {
        ProbeSpec {
            function,
            metrics,
            on_entry: None,
            on_exit: None,
        }
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

/// A function that could not be instrumented, and why.
#[derive(Debug, Clone)]
pub struct Refused {
    /// The function.
    pub function: Function,
    /// Why, in words for the user.
    pub reason: String,
}

/// A target process.
#[derive(Debug)]
pub struct Process {
    pid: i32,
    /// A launched program's ptrace stop at its entry: its first
    /// [`Process::hold`] takes it instead of attaching (the program has not
    /// run yet). Otherwise the tracer lives only in a [`Held`].
    entry_stop: Option<Tracer>,
    /// Real-time priority from `open` or `hold` until `release` (see
    /// [`Process::open`]).
    boost: Option<RealtimeGuard>,
    image: ProcessImage,
    runtime: Option<Runtime>,
    pool: Pool,
    probes: Vec<Probe>,
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
    /// Threads moved out of patch sites so far ([`Process::move_threads_out`]).
    threads_moved: u64,
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
    /// What the other threads do while the runtime is loaded.
    load_world: crate::ptrace::World,
    /// See [`Process::launched_through`].
    launched_through: Vec<String>,
    launched: bool,
    /// Set once the process has run on its own (weft released it).
    ever_released: bool,
    exit: Option<ProcessExit>,
    live_since: Option<Instant>,
    live_for: Duration,
    threads_at_attach: usize,
    /// Final figures of exited threads whose rows were handed back.
    harvested: Vec<RowSnapshot>,
    /// Direct branches of each module patched so far, by module path.
    branch_indexes: std::collections::HashMap<std::path::PathBuf, crate::branches::BranchIndex>,
    /// The exit code installed this session: its metrics and layout.
    exits: Option<(Metrics, weft_codegen::ExitHooks)>,
    /// The call trace drained from the threads' rings (`-m trace`).
    trace: Option<std::sync::Arc<std::sync::Mutex<crate::trace::TraceLog>>>,
    /// Drains the trace rings every half millisecond while this session
    /// lives.
    trace_drainer: Option<crate::trace::Drainer>,
    /// Functions inserted from now on are traced ([`Process::set_trace_calls`]).
    pub(crate) trace_calls: bool,
    /// Stops of the world by tracers released before the current one.
    stops_before: u64,
    /// Rounds of stops given up for a late thread, over every hold so far.
    stops_given_up: u64,
    /// Call records given back by removed probes (new ones come from the
    /// target's cursor: `ledger::allocate_record`).
    free_records: Vec<u32>,
    /// Trampolines of removed probes, reused once no thread can be in them.
    retired: Vec<std::ops::Range<u64>>,
    /// Probes (indices) whose trampolines were reused: nothing writes their
    /// words any more, which may be given to new probes when the row is
    /// full.
    quiet: Vec<usize>,
    /// Where the remote-call return stub is in the target, once known.
    stub_address: Option<u64>,
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
    /// `/proc/PID/mem`, read-only, for planning while not held.
    memory: Option<crate::memory::ProcessMemory>,
    /// The longest stop of the world of the last hold, once released.
    longest_stop: StopTime,
    /// Open activations pointed at the sink words, by cell address: the
    /// metric base they had (their self time so far stays their
    /// function's, `open_self`).
    retired_cells: crate::open_self::Retired,
    /// Functions already searched for points an earlier weft left
    /// (`remove_leftover_points`: once per function and `Process`).
    leftovers_checked: AddressSet<u64>,
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
pub(crate) fn jumped_into(branch: &weft_codegen::Branch, module: &str, site: &PatchSite) -> String {
    format!(
        "code at {:#x} elsewhere in {module} jumps to {:#x}, inside the {} bytes the patch at \
         {:#x} would overwrite",
        branch.source,
        branch.target,
        site.original.len(),
        site.patch_address
    )
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
        process.boost = boost;
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
            pid,
            threads_at_attach: tracer.as_ref().map_or(0, Tracer::thread_count),
            entry_stop: tracer,
            boost: None,
            image,
            runtime: None,
            pool: Pool::default(),
            probes: Vec::new(),
            identity: crate::ledger::Identity::own(),
            slot: None,
            baselines: AddressMap::default(),
            foreign: Vec::new(),
            threads_moved: 0,
            pending: undo::Undo::default(),
            request_size: RequestSize::default(),
            free_words: Vec::new(),
            #[cfg(debug_assertions)]
            fault: None,
            options,
            launched,
            // A launched program has not run yet; an attached one has.
            ever_released: !launched,
            exit: None,
            live_since: None,
            live_for: Duration::ZERO,
            branch_indexes: Default::default(),
            harvested: Vec::new(),
            exits: None,
            trace: None,
            trace_drainer: None,
            trace_calls: false,
            spare_probes: Vec::new(),
            ties: Vec::new(),
            unreported: Vec::new(),
            leftovers_checked: AddressSet::default(),
            retired: Vec::new(),
            quiet: Vec::new(),
            free_records: Vec::new(),
            stops_before: 0,
            stops_given_up: 0,
            stub_address: None,
            plans: Default::default(),
            point_plans: Default::default(),
            staged: Default::default(),
            memory: None,
            longest_stop: StopTime::default(),
            retired_cells: Default::default(),
            load_world: crate::ptrace::World::WhenWaiting,
            launched_through: Vec::new(),
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
        process.launched_through = through;
        Ok(process)
    }

    /// For a program [`Process::launch`] started through a script or an
    /// exec wrapper (`env`, a shell, `nice`…): the executables it went
    /// through before the program it stopped at, in order; empty
    /// otherwise.
    pub fn launched_through(&self) -> &[String] {
        &self.launched_through
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Threads found when weft attached.
    pub fn threads_at_attach(&self) -> usize {
        self.threads_at_attach
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

    /// The thread that runs remote calls (see [`Process::pick_call_thread`]).
    fn call_thread(&mut self, tracer: &mut Tracer) -> Result<Tid, Error> {
        let tid = self.pick_call_thread(tracer)?;
        self.with_return_stub(tracer, tid)
    }

    /// The thread that runs remote calls that are bare system calls
    /// (`mmap` of trampoline areas): any thread will do, since a system call
    /// takes no lock another thread could hold (as in a signal handler), so
    /// the world never runs again to find a better placed one (an
    /// insertion stays one stop of the world on a loaded machine, where
    /// threads are often preempted inside the C library). One that
    /// [`Process::pick_call_thread`] would take is still preferred.
    fn syscall_thread(&mut self, tracer: &mut Tracer) -> Result<Tid, Error> {
        let tid = match self.safe_call_thread(tracer)? {
            Some(tid) => tid,
            None => tracer
                .threads()
                .next()
                .ok_or(Error::Trace(TraceError::NoSuchProcess(self.pid)))?,
        };
        self.with_return_stub(tracer, tid)
    }

    /// `tid`, once its remote calls return through the return stub.
    fn with_return_stub(&mut self, tracer: &mut Tracer, tid: Tid) -> Result<Tid, Error> {
        // Every remote call after the first returns through a stub that puts
        // the thread back by itself should weft die meanwhile.
        let mmap_fn = self
            .image
            .symbol_address("libc.so", "mmap")
            .ok_or(Error::MissingLibc("mmap"))?;
        let cave = self.code_cave(weft_codegen::BOOTSTRAP_LEN);
        let known = self.stub_address;
        let stub = tracer.install_return_stub(tid, mmap_fn, cave, known)?;
        self.stub_address = Some(stub);
        Ok(tid)
    }

    /// `len` unused bytes (16-aligned) in an executable mapping: after the
    /// end of a module's executable segment, up to the end of its last page,
    /// which the mapping covers but no code or data of the module occupies.
    /// libc first (always there), then the other modules.
    fn code_cave(&self, len: u64) -> Option<u64> {
        let mut modules: Vec<&crate::inspect::Module> = self.image.modules().iter().collect();
        modules.sort_by_key(|m| !m.name().starts_with("libc.so"));
        for module in modules {
            for seg in module.header().segments.iter() {
                if !seg.is_load() || !seg.is_executable() || seg.memsz == 0 {
                    continue;
                }
                let end = module.runtime_address(seg.vaddr.saturating_add(seg.memsz));
                let cave = end.div_ceil(16) * 16;
                let page_end = end.div_ceil(4096) * 4096;
                let mapped = module
                    .mappings()
                    .iter()
                    .any(|m| m.perms.exec && m.start < end && page_end <= m.end);
                if mapped && cave + len <= page_end {
                    return Some(cave);
                }
            }
        }
        None
    }

    /// A thread at a point where it holds no lock a remote `dlopen` (or
    /// `malloc` inside the runtime) could need; when none is, the world runs
    /// a little and weft looks again.
    fn pick_call_thread(&self, tracer: &mut Tracer) -> Result<Tid, Error> {
        const SAMPLES: u32 = 10;
        for attempt in 0..SAMPLES {
            if let Some(tid) = self.safe_call_thread(tracer)? {
                return Ok(tid);
            }
            if attempt + 1 == SAMPLES {
                break;
            }
            tracer.resume_all()?;
            std::thread::sleep(Duration::from_millis(1 + u64::from(attempt)));
            tracer.stop_all()?;
        }
        // Every thread keeps being inside the C library (a program that
        // lives in malloc): run one until it returns to its own code.
        let threads: Vec<Tid> = tracer.threads().collect();
        for tid in threads {
            let Some(back) = self.return_into_user_code(tracer, tid) else {
                continue;
            };
            if tracer.run_thread_to(tid, back, Duration::from_secs(2))? {
                return Ok(tid);
            }
        }
        Err(Error::NoSafeThread(self.pid))
    }

    /// The innermost return address on `tid`'s stack that leads back into
    /// code outside libc, the dynamic loader and weft's runtime: a word in
    /// such a module's executable mapping right after a `call`. The thread
    /// is there once it has returned from the C library.
    fn return_into_user_code(&self, tracer: &Tracer, tid: Tid) -> Option<u64> {
        const SCAN: u64 = 64 * 1024;
        let rsp = tracer.registers(tid).ok()?.rsp & !7;
        let maps = crate::inspect::read_maps(self.pid).ok()?;
        let stack = maps.iter().find(|m| m.start <= rsp && rsp < m.end)?;
        let words = tracer
            .memory()
            .read_vec(rsp, (stack.end - rsp).min(SCAN) as usize)
            .ok()?;
        words.chunks_exact(8).find_map(|w| {
            let at = u64::from_le_bytes(w.try_into().ok()?);
            let module = self.image.module_of(at)?;
            let name = module.name();
            if name.starts_with("libc.so")
                || name.starts_with("ld-linux")
                || name.contains(runtime::MEMFD_NAME)
                || !module.is_executable_address(at)
            {
                return None;
            }
            let before = tracer.memory().read_vec(at.checked_sub(7)?, 7).ok()?;
            // call rel32 (e8), or call r/m64 (ff /2) of 2 to 7 bytes.
            let is_call = before[2] == 0xe8
                || (2..=7).any(|k| before[7 - k] == 0xff && (before[8 - k] >> 3) & 7 == 2);
            is_call.then_some(at)
        })
    }

    /// Safe: a thread blocked in a system call made outside the dynamic
    /// loader, other than those the allocator or `fork` make while holding
    /// their locks; else a thread running code outside libc and the loader.
    fn safe_call_thread(&self, tracer: &Tracer) -> Result<Option<Tid>, Error> {
        // mmap, mprotect, munmap, brk, mremap, madvise (malloc holds an arena
        // lock around them), clone, clone3 (fork holds every arena lock and
        // the loader's).
        const LOCKED_SYSCALLS: [i64; 8] = [
            libc::SYS_mmap,
            libc::SYS_mprotect,
            libc::SYS_munmap,
            libc::SYS_brk,
            libc::SYS_mremap,
            libc::SYS_madvise,
            libc::SYS_clone,
            libc::SYS_clone3,
        ];
        let mut outside = None;
        let mut alive = false;
        for tid in tracer.threads() {
            let Ok(regs) = tracer.registers(tid) else {
                continue;
            };
            alive = true;
            let module = self.image.module_of(regs.rip);
            let in_loader = module.is_some_and(|m| m.name().starts_with("ld-linux"));
            let in_libc = module.is_some_and(|m| m.name().starts_with("libc.so"));
            let syscall = regs.orig_rax as i64;
            if syscall >= 0 {
                if !in_loader && !LOCKED_SYSCALLS.contains(&syscall) {
                    return Ok(Some(tid));
                }
            } else if !in_libc && !in_loader {
                outside.get_or_insert(tid);
            }
        }
        if !alive {
            return Err(Error::Trace(TraceError::NoSuchProcess(self.pid)));
        }
        Ok(outside)
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

    fn ensure_runtime(&mut self, tracer: &mut Tracer) -> Result<(), Error> {
        self.load_runtime_alone(tracer)?;
        // Exit hooks are enabled in every session, even one that only
        // counts calls, so that every thread gets its return-slot block at
        // registration and a later session can time it (a quick check of
        // the region's flags once they are).
        self.ensure_exits(tracer, Metrics::CALLS, false)?;
        Ok(())
    }

    /// Loads the runtime and joins its session, if not done yet; nothing
    /// may be inserted before the exit code is in ([`Self::ensure_runtime`]).
    pub(crate) fn load_runtime_alone(&mut self, tracer: &mut Tracer) -> Result<(), Error> {
        if self.runtime.is_some() {
            return Ok(());
        }
        let tid = self.call_thread(tracer)?;
        // Nothing is reset: the words of probes other sessions still have
        // in place keep counting, and fresh words were never written.
        let rt = runtime::load(
            tracer,
            &mut self.image,
            tid,
            self.options,
            0,
            self.load_world,
        )?;
        self.runtime = Some(rt);
        self.join_session(tracer)?;
        Ok(())
    }

    /// Makes sure the installed exit code serves `metrics` (installing one
    /// for the union of what it serves and `metrics` when not: whichever
    /// weft installed it, never less than it served), and returns the
    /// layout entry snippets must use.
    pub(crate) fn ensure_exits(
        &mut self,
        tracer: &mut Tracer,
        metrics: Metrics,
        trace: bool,
    ) -> Result<weft_codegen::ExitHooks, Error> {
        use weft_rt::layout::{EXITS_CPU, EXITS_INSTALLED, EXITS_TRACE, EXITS_WALL};
        if trace {
            self.ensure_trace_ring()?;
        }
        let rt = self.rt()?;
        let control = rt.region.control();
        let flags = control
            .exit_flags
            .load(std::sync::atomic::Ordering::Acquire);
        // The exit code serves histograms whenever it times wall time.
        let metrics = metrics.with_histogram(false);
        let installed = (flags & EXITS_INSTALLED != 0).then_some(Metrics {
            wall: flags & EXITS_WALL != 0,
            cpu: flags & EXITS_CPU != 0,
            histogram: false,
        });
        let traces = flags & EXITS_TRACE != 0;
        let serves = |have: &Metrics| have.union(metrics) == *have && (traces || !trace);
        if let Some(have) = installed.filter(serves) {
            let code = control.exit_code.load(std::sync::atomic::Ordering::Acquire);
            let hooks = crate::exits::hooks(rt.region.header(), code, have.timers(), traces)?;
            self.exits = Some((have, hooks));
            return Ok(hooks);
        }
        let wanted = installed.unwrap_or(Metrics::CALLS).union(metrics);
        let wanted_trace = traces || trace;
        let tid = self.call_thread(tracer)?;
        let mmap_fn = self
            .image
            .symbol_address("libc.so", "mmap")
            .ok_or(Error::MissingLibc("mmap"))?;
        let rt = self.rt()?;
        let enable_fn = runtime::export_address(rt.base, "weft_rt_enable_exits")?;
        let rt_base = rt.base;
        let rt = self.runtime.as_ref().expect("checked above");
        let hooks = crate::exits::Installer {
            tracer,
            tid,
            pool: &mut self.pool,
            mmap_fn,
            rt_base,
            enable_fn,
        }
        .install(rt.region.header(), wanted.timers(), wanted_trace)?;
        let control = rt.region.control();
        control.exit_code.store(
            hooks.exit_code_address(),
            std::sync::atomic::Ordering::Release,
        );
        let flags = EXITS_INSTALLED
            | if wanted.wall { EXITS_WALL } else { 0 }
            | if wanted.cpu { EXITS_CPU } else { 0 }
            | if wanted_trace { EXITS_TRACE } else { 0 };
        control
            .exit_flags
            .store(flags, std::sync::atomic::Ordering::Release);
        self.exits = Some((wanted, hooks));
        Ok(hooks)
    }

    /// Makes the threads' trace rings if no weft did yet (the top
    /// [`weft_rt::layout::trace::ring_bytes`] of every row, one place for
    /// the process, kept for good: installed exit code writes there), and
    /// starts this session's log of them.
    fn ensure_trace_ring(&mut self) -> Result<(), Error> {
        use std::sync::atomic::Ordering;
        let pid = self.pid;
        let mine = self.owner_bit();
        let rt = self.rt()?;
        // One reader per ring: no other live weft may trace too (the
        // directory's live probes are those of live sessions).
        let other = crate::ledger::live_entries(&rt.region)
            .into_iter()
            .map(|(_, e)| e)
            .find(|e| e.metrics & weft_rt::layout::METRIC_TRACE != 0 && e.owners & !mine != 0);
        if let Some(e) = other {
            let header = rt.region.header();
            let other = (0..weft_rt::layout::SESSIONS)
                .find(|&i| e.owners & !mine & (1 << i) != 0)
                .map_or(0, |i| header.sessions[i].pid.load(Ordering::Acquire));
            return Err(crate::trace::CallTraceError::OtherWeft(other).into());
        }
        let control = rt.region.control();
        if control.trace_ring.load(Ordering::Acquire) == 0 {
            let metric_words = rt.region.geometry().metric_words;
            let used = crate::ledger::words_used(&rt.region);
            let Some((capacity, first)) = crate::trace::ring_place(metric_words, used)? else {
                return Err(self.out_of_room(Room::MetricWords));
            };
            control.trace_capacity.store(capacity, Ordering::Release);
            control.trace_ring.store(first + 1, Ordering::Release);
        }
        if self.trace.is_none() {
            let header = rt.region.header();
            let first = header.trace_ring.load(Ordering::Acquire) - 1;
            let capacity = header.trace_capacity.load(Ordering::Acquire);
            let budget = crate::trace::budget()?;
            let log = crate::trace::TraceLog::new(
                pid,
                first,
                capacity,
                header.timer_ns_per_tick_q32,
                budget,
            );
            let log = std::sync::Arc::new(std::sync::Mutex::new(log));
            self.trace_drainer = rt
                .region
                .reopen(pid)
                .ok()
                .and_then(|region| crate::trace::Drainer::start(&log, region));
            self.trace = Some(log);
        }
        Ok(())
    }

    /// Copies the threads' new trace events out of their rings (`force`:
    /// every row, not only those whose activity moved), naming the
    /// functions this session traces.
    fn drain_trace(&self, force: bool) {
        let (Some(trace), Some(rt)) = (&self.trace, &self.runtime) else {
            return;
        };
        let mut log = trace.lock().unwrap_or_else(|p| p.into_inner());
        for p in &self.probes {
            if let Some(words) = p.words() {
                log.name_function(words.first, &points::probe_name(p));
            }
        }
        log.drain_all(&rt.region, force);
    }

    /// Whether the functions this session instruments from now on have
    /// their calls traced (`-m …,trace`, see `docs/trace.md`): their exits
    /// are hooked (even without timers) and every entry and exit goes into
    /// the thread's trace ring, which [`Process::harvest`] drains.
    /// [`Held::set_trace_calls`] sets it while held.
    pub fn set_trace_calls(&mut self, on: bool) {
        self.trace_calls = on;
    }

    /// The call trace recorded so far (`-m trace`), drained first; None
    /// when nothing was traced.
    pub fn trace(&self) -> Option<crate::trace::Trace> {
        self.drain_trace(true);
        self.trace.clone().map(crate::trace::Trace)
    }

    /// The first of the words open activations of removed probes are
    /// pointed at: one set for the process, whichever weft took it.
    fn sink_word(&self) -> Result<u32, Error> {
        use std::sync::atomic::Ordering;
        let rt = self.rt()?;
        let control = rt.region.control();
        if let Some(word) = control.sink_word.load(Ordering::Acquire).checked_sub(1) {
            return Ok(word);
        }
        let len = (weft_codegen::TIMER_METRIC_LEN / 8) as u32;
        let Some(word) = crate::ledger::allocate_words(&rt.region, len) else {
            return Err(self.out_of_room(Room::MetricWords));
        };
        control.sink_word.store(word + 1, Ordering::Release);
        Ok(word)
    }

    /// Points the still-open activations of the given (removed) probes at
    /// the sink words. A thread blocked inside a timed function when weft
    /// detaches returns later through whatever exit handler is installed
    /// then, and would count its exit and stop its timer in the words its
    /// cell names, which a later session may have given to another
    /// function. Needs the world stopped (`tracer`), no thread inside a
    /// trampoline.
    fn retire_open_activations(&mut self, tracer: &mut Tracer, bases: &[i32]) -> Result<(), Error> {
        use weft_rt::layout::{ROW_CELLS, ROW_CELLS_END, ROW_TOP};
        if bases.is_empty() {
            return Ok(());
        }
        let sink = self.sink_word()?;
        let Some(rt) = self.runtime.as_ref() else {
            return Ok(());
        };
        let sink = weft_rt::layout::Geometry::metric_offset(sink) as i32;
        let region = &rt.region;
        let rows = region
            .header()
            .rows_used
            .load(std::sync::atomic::Ordering::Acquire)
            .min(region.geometry().max_rows);
        let size = u64::from(weft_codegen::CELL_SIZE);
        for index in 0..rows {
            let cells = region.load_word(index, ROW_CELLS);
            let top = region.load_word(index, ROW_TOP);
            let end = region.load_word(index, ROW_CELLS_END);
            if cells == 0 || top <= cells || top > end {
                continue;
            }
            let mut cell = cells;
            while cell < top {
                // The metric base and the flags, next to each other.
                let at = cell + weft_codegen::CELL_METRIC as u64;
                let mut fields = [0u8; 8];
                if tracer.memory().read(at, &mut fields).is_err() {
                    break; // the thread and its cells are gone
                }
                let metric = i32::from_le_bytes(fields[..4].try_into().expect("4 bytes"));
                if bases.contains(&metric) {
                    // Its words go to the sink, and its exit calls no user
                    // probe (the record may serve another function by then)
                    // and counts no histogram (the sink has none).
                    let flags = u32::from_le_bytes(fields[4..].try_into().expect("4 bytes"))
                        & !(weft_codegen::CELL_PROBE | weft_codegen::CELL_HISTOGRAM);
                    fields[..4].copy_from_slice(&sink.to_le_bytes());
                    fields[4..].copy_from_slice(&flags.to_le_bytes());
                    tracer.memory().write(at, &fields)?;
                    self.retired_cells.insert(cell, metric);
                }
                cell += size;
            }
        }
        Ok(())
    }

    /// Resolves an IFUNC to the implementation the process uses: from a GOT
    /// slot the dynamic loader filled, else by calling the resolver.
    fn resolve_ifunc(
        &mut self,
        tracer: &mut Tracer,
        f: &Function,
        resolver: u64,
    ) -> Result<Function, Error> {
        let mut implementation = None;
        for slot in self.image.ifunc_slots(f)? {
            if let Ok(value) = tracer.memory().read_u64(slot) {
                if value != resolver
                    && self
                        .image
                        .module_of(value)
                        .is_some_and(|m| m.name() == f.module)
                {
                    implementation = Some(value);
                    break;
                }
            }
        }
        let implementation = match implementation {
            Some(v) => v,
            None => {
                let tid = self.call_thread(tracer)?;
                let call =
                    RemoteCall::new(&format!("{} (IFUNC resolver)", f.name), resolver, vec![]);
                tracer.call(tid, &call, false)?
            }
        };
        self.implementation(f, implementation)
    }

    /// The IFUNC `f` as its implementation at `implementation`, under the
    /// names the user's patterns matched.
    fn implementation(&mut self, f: &Function, implementation: u64) -> Result<Function, Error> {
        let mut resolved = self
            .image
            .function_at(implementation)?
            .unwrap_or_else(|| Function {
                address: implementation,
                size: 0,
                padding: 0,
                ..f.clone()
            });
        // Report under the names the user's patterns matched.
        resolved.name = f.name.clone();
        resolved.aliases = f.aliases.clone();
        resolved.kind = FunctionKind::Plain;
        Ok(resolved)
    }

    /// Runs `change` as a transaction: what it took from the target (and
    /// logged in `pending`) is given back if it fails.
    fn transaction<T>(
        &mut self,
        tracer: &mut Tracer,
        change: impl FnOnce(&mut Process, &mut Tracer) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.pending = undo::Undo::default();
        // Only the change that loads the runtime takes it back out.
        let had_runtime = self.runtime.is_some();
        let result = change(self, tracer);
        let taken = std::mem::take(&mut self.pending);
        if result.is_err() {
            self.roll_back(tracer, taken);
            if !had_runtime {
                self.unload_untouched_runtime(tracer);
            }
        }
        result
    }

    /// After a failed change that loaded the runtime: it goes back out
    /// when nothing ever ran it (no thread took a row) and no probe of any
    /// session is in, so that a failed first attach leaves nothing of
    /// weft's in the target: its trampoline areas (the exit code's among
    /// them), the region and the library ([`runtime::unload`]). Best
    /// effort: what cannot go stays, as after a detach.
    fn unload_untouched_runtime(&mut self, tracer: &mut Tracer) {
        let Some(rt) = &self.runtime else { return };
        let Some(loaded) = rt.loaded else { return };
        let untouched = rt
            .region
            .header()
            .rows_used
            .load(std::sync::atomic::Ordering::Acquire)
            == 0
            && crate::ledger::linked_entries(&rt.region).is_empty()
            && !self.probes.iter().any(|p| p.active);
        let munmap = self.image.symbol_address("libc.so", "munmap");
        let (true, Some(munmap)) = (untouched, munmap) else {
            return;
        };
        let Ok(tid) = self.call_thread(tracer) else {
            return;
        };
        match runtime::unload(tracer, &mut self.image, tid, loaded, self.load_world) {
            Ok(true) => {}
            _ => return,
        }
        // Nothing runs in the areas: no patch ever led there.
        for (start, size) in self.pool.areas() {
            let call = RemoteCall::new(
                "munmap",
                munmap,
                vec![
                    crate::ptrace::RemoteArg::Value(start),
                    crate::ptrace::RemoteArg::Value(size),
                ],
            );
            let _ = tracer.call(tid, &call, false);
        }
        // The remote calls' return stub last.
        let cave = self.code_cave(weft_codegen::BOOTSTRAP_LEN);
        if tracer.remove_return_stub(tid, munmap, cave).is_ok() {
            self.stub_address = None;
        }
        self.runtime = None;
        self.slot = None;
        self.exits = None;
        self.pool = Pool::default();
        self.staged = AddressMap::default();
        self.free_words.clear();
        self.free_records.clear();
        self.retired.clear();
        self.quiet.clear();
        self.foreign.clear();
        self.baselines = AddressMap::default();
    }

    /// Inserts `specs` (one stop of the world, one transaction). Functions
    /// refused while planning — before anything is written — are left
    /// alone and returned, unless `required` holds for one of them: then
    /// nothing is changed and the error names every required one refused.
    fn insert_probes_now(
        &mut self,
        tracer: &mut Tracer,
        specs: &[ProbeSpec],
        required: &dyn Fn(&Function) -> bool,
    ) -> Result<Applied, Error> {
        self.request_size = RequestSize {
            words: specs
                .iter()
                .map(|s| u64::from(s.words(self.trace_calls)))
                .sum(),
            records: specs
                .iter()
                .filter(|s| s.hooks_exit(self.trace_calls))
                .count() as u64,
            probes: specs.len() as u64,
        };
        // More than the process can ever have: say so before planning.
        if self.request_size.records > weft_rt::layout::CALL_RECORDS as u64 {
            return Err(self.out_of_room(Room::CallRecords));
        }
        if self.request_size.probes > weft_rt::layout::DIRECTORY as u64 {
            return Err(self.out_of_room(Room::Probes));
        }
        for spec in specs {
            let exit_predicate = spec.on_exit.and_then(|p| p.predicate);
            if matches!(
                exit_predicate,
                Some(weft_codegen::Predicate::ArgEquals { .. })
            ) {
                return Err(Error::Refused(vec![Refused {
                    function: spec.function.clone(),
                    reason: "an exit probe's predicate can only name a thread: the arguments \
                             are gone at an exit (test them in an entry probe, or the return \
                             value in the exit probe itself)"
                        .into(),
                }]));
            }
        }
        // Resolve IFUNCs first: the resolver may need the runtime-free world.
        let mut requests: Vec<std::borrow::Cow<ProbeSpec>> = Vec::with_capacity(specs.len());
        for spec in specs {
            requests.push(match spec.function.kind {
                FunctionKind::Ifunc { resolver } => std::borrow::Cow::Owned(ProbeSpec {
                    function: self.resolve_ifunc(tracer, &spec.function, resolver)?,
                    ..spec.clone()
                }),
                _ => std::borrow::Cow::Borrowed(spec),
            });
        }
        // A target without weft's runtime has no other session's probes to
        // share or take out: what must be refused is known before the
        // runtime goes in, and a refused request leaves nothing behind.
        if self.runtime.is_none() && !runtime::is_loaded(self.pid) {
            let must = must_refuse(&requests, self.plan_request(&requests)?.refused, required);
            if !must.is_empty() {
                return Err(Error::Refused(must));
            }
        }
        // What other sessions have in place, and what killed ones left.
        self.begin_change(tracer)?;
        // Functions planned by `prepare` were checked for leftover probes
        // then (and their code is checked again before patching).
        let unplanned: Vec<Function> = requests
            .iter()
            .filter(|r| !self.plans.contains_key(&plan_key(&r.function)))
            .map(|r| r.function.clone())
            .collect();
        if !unplanned.is_empty() {
            self.remove_leftover_probes(tracer, &unplanned)?;
        }
        let Planned {
            plans,
            shares,
            companions,
            retargets,
            refused,
        } = self.plan_request(&requests)?;
        let must = must_refuse(&requests, refused.clone(), required);
        if !must.is_empty() {
            return Err(Error::Refused(must));
        }
        let refused: Vec<Refused> = refused
            .into_iter()
            .map(|(k, why)| Refused {
                function: requests[k].function.clone(),
                reason: why.to_string(),
            })
            .collect();
        if plans.is_empty() && shares.is_empty() {
            return Ok(Applied {
                ids: Vec::new(),
                refused,
            });
        }
        let requests: Vec<&ProbeSpec> = plans.iter().map(|(r, _)| *r).collect();
        self.ensure_runtime(tracer)?;
        // Call records are taken only here: a request that cannot get them
        // all fails before anything is built.
        let trace = self.trace_calls;
        let records = requests.iter().filter(|r| r.hooks_exit(trace)).count();
        let in_use = crate::ledger::records_used(&self.rt()?.region) as usize;
        let free = weft_rt::layout::CALL_RECORDS.saturating_sub(in_use) + self.free_records.len();
        if records > free {
            return Err(self.out_of_room(Room::CallRecords));
        }
        let wanted = requests
            .iter()
            .fold(Metrics::CALLS, |m, r| m.union(r.metrics));
        let hooks = if requests.iter().any(|r| r.hooks_exit(trace)) {
            Some(self.ensure_exits(tracer, wanted, trace)?)
        } else {
            None
        };
        let save = crate::trampolines::vector_save();
        let rt = self.runtime.as_ref().expect("loaded above");
        let header = rt.region.header();
        let (tls_offset, register_fn) = (header.tls_offset, header.register_fn);
        let (call_targets, exit_probes) = (header.call_targets, header.exit_probes);
        let mmap_fn = self
            .image
            .symbol_address("libc.so", "mmap")
            .ok_or(Error::MissingLibc("mmap"))?;
        let tls_offset = i32::try_from(tls_offset)
            .map_err(|_| Error::Internal("TLS offset beyond ±2 GiB".into()))?;

        // Build and write every trampoline (unreachable until patched):
        // counters built ahead by `hold` first, in one write per run of
        // neighbours, then the others. Their areas are mapped by bare
        // `mmap` calls.
        let call_tid = self.syscall_thread(tracer)?;
        let (mut new_probes, mut originals, mut plans, mut moves) =
            self.write_staged(tracer, plans, call_tid, mmap_fn, register_fn)?;
        // Where the trampolines companions and tied siblings lead into
        // are, and their copies of the displaced instructions: by patch
        // address. A sibling's is built after the one it leads into.
        let mut built: AddressMap<u64, Built> = AddressMap::default();
        let retarget_of =
            |site: &PatchSite| retargets.iter().find(|r| r.plan == site.patch_address);
        plans.sort_by_key(|(_, site)| retarget_of(site).is_some());
        let mut ties = Vec::new();
        for (request, site) in plans {
            originals.push(site.clone());
            let site = match retarget_of(&site) {
                Some(r) => {
                    let Some((of, main, offsets)) = built.get(&r.of) else {
                        return Err(Error::Internal(
                            "a sibling's probe was built before the one it leads into".into(),
                        ));
                    };
                    let copy = main + u64::from(offsets[r.target].1);
                    ties.push((
                        ProbeId(self.probes.len() as u32 + new_probes.len() as u32),
                        *of,
                    ));
                    Arc::new(site.with_jump_to(r.jump, copy).ok_or_else(|| {
                        Error::Internal(format!("no jump to send around at {:#x}", r.jump))
                    })?)
                }
                None => site,
            };
            let f = request.function.clone();
            let words = request.words(trace);
            let word = self.allocate_words(words)?;
            checkpoint!(self, Words);
            let offset = weft_rt::layout::Geometry::metric_offset(word) as i32;
            let record = match (hooks, request.hooks_exit(trace)) {
                (Some(_), true) => Some(self.allocate_record()?),
                _ => None,
            };
            if record.is_some() {
                checkpoint!(self, Record);
            }
            // Over another session's probe of this function (its `jmp` is
            // what this one displaces): the function's own bytes are that
            // probe's.
            let below = self.link_below(site.patch_address, &site.original);
            let chained = below.is_some();
            let compiled_below = below.map(|p| p.compiled);
            let mut snippets = Vec::with_capacity(2);
            if let Some(entry) = request.on_entry {
                snippets.push(Snippet::CallProbe(weft_codegen::ProbeCall {
                    function: entry.function,
                    user: entry.user,
                    predicate: entry.predicate,
                    save,
                    row_index: weft_rt::layout::ROW_INDEX as i32,
                    instrumented: f.address,
                }));
            }
            snippets.push(match (hooks, record) {
                (Some(hooks), Some(record)) => Snippet::CountCallHookExit {
                    metric: offset,
                    record,
                    // Without timers when only a user probe hooks the exit
                    // (4 words, not 10); marked for the exit probe.
                    hooks: match request.on_exit {
                        Some(_) => hooks
                            .with_histogram(request.metrics.keeps_histogram())
                            .probing_exits(request.metrics.hooks_exit()),
                        None => hooks.with_histogram(request.metrics.keeps_histogram()),
                    }
                    .tracing(trace)
                    .chained(chained),
                },
                _ => Snippet::CountCall { offset },
            });
            let site = &*site;
            let len = weft_codegen::max_trampoline_len(site, &snippets) as u64;
            let (at, stub) = self.reserve_logged(
                tracer,
                call_tid,
                (mmap_fn, register_fn),
                site.patch_address,
                len,
            )?;
            checkpoint!(self, Space);
            let spec = TrampolineSpec {
                address: at,
                site,
                row: ThreadRow {
                    tls_offset,
                    register_stub: stub,
                    activity: Some(weft_rt::layout::ROW_ACTIVITY as i32),
                },
                snippets: &snippets,
            };
            let trampoline = build_trampoline(&spec).map_err(|e| {
                Error::Refused(vec![Refused {
                    function: f.clone(),
                    reason: e.to_string(),
                }])
            })?;
            let (patch, original) = patch_for(site, at)?;
            moves.extend(resumes(site, at, &trampoline.instruction_offsets));
            let id = ProbeId(self.probes.len() as u32 + new_probes.len() as u32);
            if companions.iter().any(|c| c.of == site.patch_address)
                || retargets.iter().any(|r| r.of == site.patch_address)
            {
                built.insert(
                    site.patch_address,
                    (id, at, trampoline.instruction_offsets.clone()),
                );
            }
            // The record lets a later weft take this probe out if this
            // weft dies while it is live; it goes out with the trampoline,
            // in one write.
            crate::trampolines::write_with_record(
                tracer.memory(),
                at,
                site.patch_address,
                original,
                &trampoline.bytes,
            )?;
            if let Some(record) = record {
                // The call record calls the trampoline's copy of the
                // displaced instructions, which continue into the body.
                let body = at + trampoline.relocated_offset as u64;
                let slot = call_targets + 8 * u64::from(record);
                let before = tracer.memory().read_vec(slot, 8)?;
                self.pending.writes.push((slot, before));
                tracer.memory().write(slot, &body.to_le_bytes())?;
                if let Some(exit) = request.on_exit {
                    // The exit code calls this record's probe.
                    // Its thread predicate: 0 for every thread, else 1 +
                    // the thread's index.
                    let thread = match exit.predicate {
                        Some(weft_codegen::Predicate::Thread(t)) => u64::from(t) + 1,
                        _ => 0,
                    };
                    let entry: Vec<u8> = [exit.function, exit.user, f.address, thread]
                        .iter()
                        .flat_map(|v| v.to_le_bytes())
                        .collect();
                    let at = exit_probes + weft_codegen::EXIT_PROBE_SIZE * u64::from(record);
                    let before = tracer.memory().read_vec(at, entry.len())?;
                    self.pending.writes.push((at, before));
                    tracer.memory().write(at, &entry)?;
                }
            }
            checkpoint!(self, Trampoline);
            new_probes.push(Probe {
                id,
                function: f,
                patch_address: site.patch_address,
                original,
                patch,
                compiled: compiled_below.unwrap_or(original),
                relocated: relocated_offset(&trampoline),
                trampoline: at..at + trampoline.bytes.len() as u64,
                active: false,
                displaced: site.patch_address..site.end(),
                kind: request.kind(Words::fresh(word, words), record),
                entry: None,
                borrowed: false,
            });
        }

        // Companions, once the trampolines they lead into are written.
        for c in companions {
            let Some((of, main, offsets)) = built.get(&c.of) else {
                return Err(Error::Internal("a companion's probe was not built".into()));
            };
            let copy = main + u64::from(offsets[c.target].1);
            let site = c.site.with_jump_to(c.jump, copy).ok_or_else(|| {
                Error::Internal(format!("no jump to send around at {:#x}", c.jump))
            })?;
            let len = weft_codegen::max_relocated_len(&site) as u64;
            let (at, _) = self.reserve_logged(
                tracer,
                call_tid,
                (mmap_fn, register_fn),
                site.patch_address,
                len,
            )?;
            let relocated = weft_codegen::relocate(&site, at).map_err(|e| {
                Error::Refused(vec![Refused {
                    function: c.function.clone(),
                    reason: e.to_string(),
                }])
            })?;
            let (patch, original) = patch_for(&site, at)?;
            let offsets: Vec<(u32, u32)> = relocated
                .instruction_offsets
                .iter()
                .map(|&o| (o, o))
                .collect();
            moves.extend(resumes(&site, at, &offsets));
            crate::trampolines::write_with_record(
                tracer.memory(),
                at,
                site.patch_address,
                original,
                &relocated.bytes,
            )?;
            originals.push(c.site.clone());
            new_probes.push(Probe {
                id: ProbeId(self.probes.len() as u32 + new_probes.len() as u32),
                function: c.function,
                patch_address: site.patch_address,
                original,
                patch,
                compiled: original,
                relocated: 0,
                trampoline: at..at + relocated.bytes.len() as u64,
                active: false,
                displaced: site.patch_address..site.end(),
                kind: ProbeKind::Companion { of: *of },
                entry: None,
                borrowed: false,
            });
        }

        // In the target's directory before any patch is: a weft killed in
        // between leaves entries whose patches are not there, which the
        // next one frees.
        self.enter_in_directory(&mut new_probes, &ties)?;
        checkpoint!(self, Directory);
        // Threads stopped inside the bytes about to be overwritten go on at
        // the same instruction's copy in the trampoline (moved back if the
        // patches cannot be written).
        self.move_threads_out(tracer, &moves)?;
        checkpoint!(self, Moved);
        let originals: Vec<&[u8]> = originals.iter().map(|s| &s.original[..]).collect();
        self.splice_logged(tracer, &new_probes, &originals)?;
        for probe in &mut new_probes {
            probe.active = true;
        }
        for (request, index) in shares {
            let mut probe = self.borrow(&request.function, index, request.metrics)?;
            probe.id = ProbeId((self.probes.len() + new_probes.len()) as u32);
            new_probes.push(probe);
        }
        let ids = new_probes
            .iter()
            .filter(|p| p.companion_of().is_none())
            .map(|p| p.id)
            .collect();
        self.probes.append(&mut new_probes);
        self.spare_probes = new_probes;
        self.ties.extend(ties);
        if self.live_since.is_none() {
            self.live_since = Some(Instant::now());
        }
        Ok(Applied { ids, refused })
    }

    /// Plans an insertion of `requests` (IFUNCs resolved) without changing
    /// anything: the sites to patch, the other sessions' probes to share,
    /// the companions of sites other code jumps into, and the requests
    /// refused (by index) with the reason. The same for an insertion and
    /// for a dry run ([`Process::check`]), so that a check cannot promise
    /// what an insertion would refuse.
    fn plan_request<'a>(
        &mut self,
        requests: &'a [std::borrow::Cow<'a, ProbeSpec>],
    ) -> Result<Planned<'a>, Error> {
        let active: AddressSet<u64> = self
            .probes
            .iter()
            .filter(|p| p.active && p.is_entry())
            .map(|p| p.function.address)
            .collect();
        let mut sites = AddressSet::default();
        // Built once: the stop of the world may plan a thousand functions.
        let occupied = Occupied::of(&self.probes, &self.foreign);
        let mut planned = Planned {
            plans: Vec::with_capacity(requests.len()),
            shares: Vec::new(),
            companions: Vec::new(),
            retargets: Vec::new(),
            refused: Vec::new(),
        };
        // Request index of each plan.
        let mut planned_from = Vec::with_capacity(requests.len());
        // The target's maps, read when a site has no trampoline area near.
        let mut maps = None;
        for (k, request) in requests.iter().enumerate() {
            let request: &'a ProbeSpec = request;
            let f = &request.function;
            if active.contains(&f.address) {
                continue; // already instrumented: one probe per address
            }
            // Another session's probe there: shared when it measures what
            // is asked, else this session's own probe goes over it.
            let mut over = None;
            if let Some(at) = self
                .foreign
                .iter()
                .find(|p| p.is_entry() && p.function.address == f.address)
                .map(|p| p.patch_address)
            {
                let mut current = [0u8; 5];
                let readable = self.reader()?.read(at, &mut current).is_ok();
                match self.share_or_chain(request, f, readable.then_some(current)) {
                    Ok(AtOtherProbe::Share(index)) => {
                        planned.shares.push((request, index));
                        continue;
                    }
                    Ok(AtOtherProbe::Chain(site)) => over = Some(Arc::new(site)),
                    Err(reason) => {
                        planned.refused.push((k, Refusal::OtherWeft(reason)));
                        continue;
                    }
                }
            }
            if request.hooks_exit(self.trace_calls) {
                let reason = std::iter::once(&f.name)
                    .chain(&f.aliases)
                    .find_map(|n| crate::exits::never_hook_exit(n))
                    .map(str::to_string)
                    .or_else(|| crate::exits::never_hook_exit_in(&self.image, f));
                let reason = match reason {
                    Some(reason) => Some(Refusal::NotTimeable(reason)),
                    None => {
                        self.branch_index(f.address)?;
                        crate::exits::not_called(&mut self.image, &self.branch_indexes, f).map(
                            |reason| {
                                // `not_called` says "cannot time it" itself.
                                let reason = reason
                                    .strip_prefix("cannot time it: ")
                                    .map_or(reason.clone(), str::to_string);
                                Refusal::NotTimeable(reason)
                            },
                        )
                    }
                };
                if let Some(reason) = reason {
                    planned.refused.push((k, reason));
                    continue;
                }
            }
            let cached = over
                .clone()
                .or_else(|| self.plans.get(&plan_key(f)).cloned());
            let (site, entered) = match cached {
                Some(site) => (site, Vec::new()),
                None => match self.plan_shared(f, &occupied) {
                    Ok((site, entered)) => (Arc::new(site), entered),
                    Err(reason) => {
                        planned.refused.push((k, reason));
                        continue;
                    }
                },
            };
            // One probe per site, even if two names lead to it.
            if !sites.insert(site.patch_address) {
                continue;
            }
            if !self.trampoline_room(&mut maps, site.patch_address) {
                sites.remove(&site.patch_address);
                planned.refused.push((
                    k,
                    Refusal::NoRoomNearby {
                        patch_address: site.patch_address,
                    },
                ));
                continue;
            }
            // A probe over another's patch overlaps exactly that one.
            if let Some(other) = occupied
                .overlapping(&self.probes, &self.foreign, site.patch_address..site.end())
                .filter(|_| over.is_none())
            {
                planned.refused.push((
                    k,
                    Refusal::Overlaps(format!(
                        "its entry's patch overlaps the probe at {:#x} ({}): remove that first",
                        other.patch_address,
                        self.probe_label(other)
                    )),
                ));
                continue;
            }
            let mut companions = Vec::with_capacity(entered.len());
            let mut failed = None;
            for branch in entered {
                match self.plan_companion(f, &site, branch, &occupied) {
                    Ok(c) => companions.push(c),
                    Err(reason) => {
                        failed = Some(reason);
                        break;
                    }
                }
            }
            if let Some(reason) = failed {
                sites.remove(&site.patch_address);
                planned.refused.push((k, reason));
                continue;
            }
            planned.companions.extend(companions);
            planned.plans.push((request, site));
            planned_from.push(k);
        }
        // A sibling asked for too whose own entry patch displaces the jump
        // takes the companion's part: its trampoline's copy of the jump
        // goes to the target's copy. Not in a chain (a site both leading
        // into another and led into), whose trampolines would need an
        // order of their own.
        let companions = std::mem::take(&mut planned.companions);
        for c in companions {
            let sibling = planned.plans.iter().position(|(_, s)| {
                s.patch_address != c.of && s.instructions.iter().any(|i| i.ip() == c.jump)
            });
            let chained = |at: u64| planned.retargets.iter().any(|r| r.plan == at || r.of == at);
            match sibling {
                Some(i)
                    if !chained(planned.plans[i].1.patch_address)
                        && !planned.retargets.iter().any(|r| r.plan == c.of) =>
                {
                    let site = &mut planned.plans[i].1;
                    // A plan of its own: one built ahead (`stage_prepared`)
                    // has the jump going into the patch.
                    *site = Arc::new((**site).clone());
                    planned.retargets.push(Retarget {
                        plan: site.patch_address,
                        jump: c.jump,
                        of: c.of,
                        target: c.target,
                    });
                }
                _ => planned.companions.push(c),
            }
        }
        // A companion goes into a sibling's code: it must not overlap
        // another patch of this insertion (the sibling's own entry, asked
        // for too, or another companion). The function whose companion it
        // is gives way.
        let mut ranges: Vec<(u64, u64, u64, String)> = planned
            .plans
            .iter()
            .map(|(r, s)| {
                (
                    s.patch_address,
                    s.end(),
                    s.patch_address,
                    r.function.name.clone(),
                )
            })
            .chain(planned.companions.iter().map(|c| {
                (
                    c.site.patch_address,
                    c.site.end(),
                    c.of,
                    c.function.name.clone(),
                )
            }))
            .collect();
        ranges.sort_unstable_by_key(|r| r.0);
        let mut giving_way: Vec<(u64, String)> = Vec::new();
        for pair in ranges.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            if b.0 < a.1 {
                // The one of the two that is a companion (or both).
                let companion_of = |r: &(u64, u64, u64, String)| r.0 != r.2;
                if companion_of(b) {
                    giving_way.push((b.2, a.3.clone()));
                }
                if companion_of(a) {
                    giving_way.push((a.2, b.3.clone()));
                }
            }
        }
        if !giving_way.is_empty() {
            let mut kept = Vec::with_capacity(planned.plans.len());
            for (plan, k) in std::mem::take(&mut planned.plans)
                .into_iter()
                .zip(planned_from)
            {
                match giving_way
                    .iter()
                    .find(|(of, _)| *of == plan.1.patch_address)
                {
                    Some((_, other)) => {
                        let c = planned
                            .companions
                            .iter()
                            .find(|c| c.of == plan.1.patch_address)
                            .expect("a companion gives way");
                        planned.refused.push((
                            k,
                            Refusal::SharedCode {
                                from: c.jump,
                                target: plan.1.instructions[c.target].ip(),
                                module: plan.0.function.module.clone(),
                                len: plan.1.original.len(),
                                patch_address: plan.1.patch_address,
                                why: SharedCode::OverlapsRequest {
                                    other: other.clone(),
                                },
                            },
                        ));
                    }
                    None => kept.push(plan),
                }
            }
            planned.plans = kept;
            planned
                .companions
                .retain(|c| !giving_way.iter().any(|(of, _)| *of == c.of));
            planned.refused.sort_by_key(|r| r.0);
        }
        Ok(planned)
    }

    /// Writes the trampolines [`Process::hold`] built ahead for the plain
    /// counters among `plans` (mapping their planned areas first: a remote
    /// `mmap` each, where they were planned), one `pwrite` per run of
    /// neighbours, and returns their probes (not active yet) with their
    /// sites, and the plans left to build. A staged trampoline whose area
    /// could not be mapped where planned is built again with the others.
    fn write_staged<'a>(
        &mut self,
        tracer: &mut Tracer,
        plans: Vec<(&'a ProbeSpec, Arc<PatchSite>)>,
        call_tid: Tid,
        mmap_fn: u64,
        register_fn: u64,
    ) -> Result<StagedWrite<'a>, Error> {
        let plain = |r: &ProbeSpec| {
            r.metrics == Metrics::CALLS && r.on_entry.is_none() && r.on_exit.is_none()
        };
        let (mut use_staged, mut rest) = (Vec::new(), Vec::new());
        for (request, site) in plans {
            let key = plan_key(&request.function);
            match self.staged.get(&key) {
                Some(s) if plain(request) && Arc::ptr_eq(&s.site, &site) => {
                    use_staged.push((request, self.staged.remove(&key).expect("found above")))
                }
                _ => rest.push((request, site)),
            }
        }
        if use_staged.is_empty() {
            return Ok((Vec::new(), Vec::new(), rest, Vec::new()));
        }
        let mut areas: Vec<u64> = use_staged.iter().map(|(_, s)| s.area).collect();
        areas.sort_unstable();
        areas.dedup();
        let mut lost = Vec::new();
        for area in areas {
            if !self
                .pool
                .map_planned(tracer, call_tid, mmap_fn, register_fn, area)?
            {
                lost.push(area);
            }
        }
        // Into memory touched ahead (stage_prepared): on a KVM guest a first
        // touch costs microseconds a page, and a thousand probes' records
        // take 80 pages, more than writing their trampolines.
        let mut probes = std::mem::take(&mut self.spare_probes);
        probes.clear();
        probes.reserve(use_staged.len());
        let mut sites = Vec::with_capacity(use_staged.len());
        let mut moves = Vec::new();
        // Those not written ahead (stage_prepared), to write.
        let mut unwritten = Vec::new();
        for (request, s) in use_staged {
            if lost.contains(&s.area) {
                rest.push((request, s.site));
                continue;
            }
            if !s.written {
                unwritten.push((s.at - crate::trampolines::RECORD_LEN, s.bytes));
            }
            moves.extend_from_slice(&s.resumes);
            // Given back with the rest if the insertion fails.
            self.pending.words.push((s.word, 1, false));
            self.pending.space.push(s.at..s.at + s.trampoline_len);
            probes.push(Probe {
                id: ProbeId((self.probes.len() + probes.len()) as u32),
                function: request.function.clone(),
                patch_address: s.site.patch_address,
                original: s.original,
                patch: s.patch,
                compiled: s.original,
                relocated: s.relocated,
                trampoline: s.at..s.at + s.trampoline_len,
                active: false,
                displaced: s.site.patch_address..s.site.end(),
                kind: ProbeKind::Measure {
                    metrics: Metrics::CALLS,
                    words: Words::fresh(s.word, 1),
                    record: None,
                },
                entry: None,
                borrowed: false,
            });
            sites.push(s.site);
        }
        for (at, bytes, _) in adjacent_runs(unwritten) {
            tracer.memory().write(at, &bytes)?;
        }
        Ok((probes, sites, rest, moves))
    }

    /// Builds, while the target runs, the trampolines of counters for the
    /// functions [`Process::prepare`] planned and no probe serves: with
    /// the world stopped, inserting them is then writing bytes already
    /// made. Needs the runtime loaded by an earlier hold of this process
    /// (its thread-pointer offset) and at least [`STAGE_AT_LEAST`] such
    /// functions; their areas are planned in gaps of the target's address
    /// space and mapped only when they are written. Best effort: anything
    /// that fails leaves the functions to be built when inserted.
    fn stage_prepared(&mut self) {
        let Some(rt) = &self.runtime else { return };
        let Ok(tls_offset) = i32::try_from(rt.region.header().tls_offset) else {
            return;
        };
        let active: AddressSet<u64> = self
            .probes
            .iter()
            .filter(|p| p.active)
            .map(|p| p.patch_address)
            .collect();
        let mut todo: Vec<((u64, u64, u64), Arc<PatchSite>)> = self
            .plans
            .iter()
            .filter(|(key, site)| {
                !self.staged.contains_key(key) && !active.contains(&site.patch_address)
            })
            .map(|(key, site)| (*key, site.clone()))
            .collect();
        if todo.len() < STAGE_AT_LEAST {
            return;
        }
        todo.sort_by_key(|(_, site)| site.patch_address);
        let Ok(maps) = crate::inspect::read_maps(self.pid) else {
            return;
        };
        // One planned area per neighbourhood, for all of its trampolines.
        let mut areas: Vec<(u64, u64, Option<u64>)> = Vec::new();
        for (_, site) in &todo {
            let room = counter_room(site);
            match areas
                .iter_mut()
                .find(|(near, _, _)| near.abs_diff(site.patch_address) < NEIGHBOURS)
            {
                Some((_, total, _)) => *total += room,
                None => areas.push((site.patch_address, room, None)),
            }
        }
        for (near, total, at) in &mut areas {
            *at = self
                .pool
                .mapped_room(*near, *total)
                .or_else(|| self.pool.plan_area(&maps, *near, *total));
        }
        for (key, site) in todo {
            let Some(area) = areas
                .iter()
                .find(|(near, _, _)| near.abs_diff(site.patch_address) < NEIGHBOURS)
                .and_then(|(_, _, at)| *at)
            else {
                continue;
            };
            let Ok(staged) = self.stage(&site, area, tls_offset) else {
                return;
            };
            self.staged.insert(key, staged);
        }
        // The probes' records of an insertion of them, and their directory
        // entries, in memory touched now rather than in the stop of the
        // world.
        let staged = self.staged.len();
        if let Some(rt) = &self.runtime {
            let used = rt
                .region
                .header()
                .directory_used
                .load(std::sync::atomic::Ordering::Acquire) as usize;
            rt.region.prefault_entries(used, staged);
        }
        prefault(&mut self.probes, staged);
        prefault(&mut self.spare_probes, staged);
        // Those in areas already mapped go in now, while the target runs:
        // unreachable until patched, they leave only the patches for the
        // stop of the world. One write per run of neighbours.
        let Ok(memory) = crate::memory::ProcessMemory::open(self.pid) else {
            return;
        };
        let mut ready: Vec<&mut Staged> = self
            .staged
            .values_mut()
            .filter(|s| !s.written && self.pool.is_mapped(s.area))
            .collect();
        ready.sort_by_key(|s| s.at);
        let items = ready
            .iter()
            .map(|s| (s.at - crate::trampolines::RECORD_LEN, s.bytes.clone()))
            .collect();
        for (at, bytes, members) in adjacent_runs(items) {
            if memory.write(at, &bytes).is_ok() {
                for s in &mut ready[members] {
                    s.written = true;
                }
            }
        }
    }

    /// A counter's trampoline for `site`, built for a place in the planned
    /// `area`, and its metric word.
    fn stage(
        &mut self,
        site: &Arc<PatchSite>,
        area: u64,
        tls_offset: i32,
    ) -> Result<Staged, Error> {
        let word = self.allocate_words(1)?;
        let offset = weft_rt::layout::Geometry::metric_offset(word) as i32;
        let snippets = [Snippet::CountCall { offset }];
        let len = weft_codegen::max_trampoline_len(site, &snippets) as u64;
        let (at, stub) = self
            .pool
            .reserve_planned(area, len)
            .ok_or_else(|| Error::Internal("the planned area is full".into()))?;
        let spec = TrampolineSpec {
            address: at,
            site,
            row: ThreadRow {
                tls_offset,
                register_stub: stub,
                activity: Some(weft_rt::layout::ROW_ACTIVITY as i32),
            },
            snippets: &snippets,
        };
        let trampoline = build_trampoline(&spec).map_err(|e| Error::Internal(e.to_string()))?;
        let (patch, original) = patch_for(site, at)?;
        let mut bytes =
            crate::trampolines::record(site.patch_address, original, trampoline.bytes.len() as u64)
                .to_vec();
        bytes.extend_from_slice(&trampoline.bytes);
        // int3 up to the end of its space: neighbours go out in one write.
        let room = crate::trampolines::RECORD_LEN + len.div_ceil(16) * 16;
        if bytes.len() as u64 <= room {
            bytes.resize(room as usize, 0xcc);
        }
        let resumes = resumes(site, at, &trampoline.instruction_offsets).collect();
        Ok(Staged {
            resumes,
            site: site.clone(),
            word,
            area,
            at,
            trampoline_len: trampoline.bytes.len() as u64,
            bytes,
            original,
            patch,
            relocated: relocated_offset(&trampoline),
            written: false,
        })
    }

    fn replace_function_now(
        &mut self,
        tracer: &mut Tracer,
        f: &Function,
        with: u64,
    ) -> Result<Replacement, Error> {
        let f = match f.kind {
            FunctionKind::Ifunc { resolver } => self.resolve_ifunc(tracer, f, resolver)?,
            _ => f.clone(),
        };
        self.begin_change(tracer)?;
        self.remove_leftover_probes(tracer, std::slice::from_ref(&f))?;
        let refuse = |reason: String| {
            Error::Refused(vec![Refused {
                function: f.clone(),
                reason,
            }])
        };
        if self.probes.iter().any(|p| p.is_live_entry_of(&f)) {
            return Err(refuse(
                "it is already instrumented: remove its probe first".into(),
            ));
        }
        let occupied = Occupied::of(&self.probes, &self.foreign);
        let site = self.plan(&f, &occupied).map_err(refuse)?;
        if let Some(other) =
            occupied.overlapping(&self.probes, &self.foreign, site.patch_address..site.end())
        {
            return Err(refuse(format!(
                "its entry's patch overlaps the probe at {:#x} ({}): remove that first",
                other.patch_address,
                self.probe_label(other)
            )));
        }
        let len = weft_codegen::max_redirect_len(&site) as u64;
        let at = self.reserve_near(tracer, site.patch_address, len)?;
        let redirect =
            weft_codegen::build_redirect(at, &site, with).map_err(|e| refuse(e.to_string()))?;
        let (patch, original) = patch_for(&site, at)?;
        let record =
            crate::trampolines::record(site.patch_address, original, redirect.bytes.len() as u64);
        tracer
            .memory()
            .write(at - crate::trampolines::RECORD_LEN, &record)?;
        tracer.memory().write(at, &redirect.bytes)?;
        let id = self.splice_wordless(
            tracer,
            f,
            site.patch_address,
            original,
            patch,
            at..at + redirect.bytes.len() as u64,
            ProbeKind::Replacement { with },
        )?;
        if let Some(p) = self.probes.iter_mut().find(|p| p.id == id) {
            p.displaced = site.patch_address..site.end();
        }
        Ok(Replacement {
            id,
            original: redirect.original,
        })
    }

    /// Whether a trampoline for a patch at `at` can be placed: an area is
    /// mapped within reach, or `maps` (read on first need) has a free
    /// range there for one.
    fn trampoline_room(&self, maps: &mut Option<Vec<Mapping>>, at: u64) -> bool {
        if self.pool.has_area_near(at) {
            return true;
        }
        if maps.is_none() {
            *maps = Some(crate::inspect::read_maps(self.pid).unwrap_or_default());
        }
        let maps = maps.as_deref().unwrap_or_default();
        // Unreadable maps say nothing: the reservation will tell.
        maps.is_empty() || self.pool.gap_near(maps, at).is_some()
    }

    /// Reserves `len` bytes of trampoline space within `rel32` reach of
    /// `near` (loading the runtime first: new areas register with it), with
    /// a leftover record's room in front.
    fn reserve_near(&mut self, tracer: &mut Tracer, near: u64, len: u64) -> Result<u64, Error> {
        self.ensure_runtime(tracer)?;
        let register_fn = self
            .runtime
            .as_ref()
            .expect("loaded above")
            .region
            .header()
            .register_fn;
        let mmap_fn = self
            .image
            .symbol_address("libc.so", "mmap")
            .ok_or(Error::MissingLibc("mmap"))?;
        let tid = self.syscall_thread(tracer)?;
        let (at, _) = self
            .pool
            .reserve(tracer, tid, mmap_fn, register_fn, near, len)?;
        self.pending.space.push(at..at + len);
        Ok(at)
    }

    fn redirect_call_now(
        &mut self,
        tracer: &mut Tracer,
        site: u64,
        to: u64,
    ) -> Result<ProbeId, Error> {
        let (f, original) = self.call_site(tracer, site)?;
        let direct = weft_codegen::jmp_rel32(site, to).ok().map(|mut call| {
            call[0] = 0xe8; // the same displacement, as a call
            call
        });
        let (patch, trampoline) = match direct {
            Some(call) => (call, site..site),
            None => {
                // Out of rel32 reach: call a `jmp [rip]` next to the site.
                let at = self.reserve_near(tracer, site, 14)?;
                let mut code = vec![0xff, 0x25, 0, 0, 0, 0];
                code.extend_from_slice(&to.to_le_bytes());
                tracer.memory().write(at, &code)?;
                let mut call = weft_codegen::jmp_rel32(site, at)
                    .map_err(|e| Error::Internal(e.to_string()))?;
                call[0] = 0xe8;
                (call, at..at + code.len() as u64)
            }
        };
        self.splice_wordless(
            tracer,
            f,
            site,
            original,
            patch,
            trampoline,
            ProbeKind::CallRedirect { to },
        )
    }

    fn remove_call_now(&mut self, tracer: &mut Tracer, site: u64) -> Result<ProbeId, Error> {
        let (f, original) = self.call_site(tracer, site)?;
        const NOP5: [u8; 5] = [0x0f, 0x1f, 0x44, 0x00, 0x00];
        self.splice_wordless(
            tracer,
            f,
            site,
            original,
            NOP5,
            site..site,
            ProbeKind::CallRemoved,
        )
    }

    /// The function holding the `call rel32` at `site`, and its 5 bytes;
    /// refused when it is not one, or already changed.
    fn call_site(&mut self, tracer: &mut Tracer, site: u64) -> Result<(Function, [u8; 5]), Error> {
        self.begin_change(tracer)?;
        let f = self.image.function_at(site)?.unwrap_or_else(|| Function {
            name: format!("{site:#x}"),
            module: String::new(),
            module_path: Default::default(),
            address: site,
            vaddr: site,
            size: 0,
            kind: FunctionKind::Plain,
            source: crate::inspect::SymbolSource::Symtab,
            padding: 0,
            aliases: Vec::new(),
        });
        let refuse = |reason: String| {
            Error::Refused(vec![Refused {
                function: f.clone(),
                reason,
            }])
        };
        let mut bytes = [0u8; 5];
        tracer.memory().read(site, &mut bytes)?;
        if bytes[0] != 0xe8 {
            return Err(refuse(format!(
                "{site:#x} is not a direct call (`call rel32`, e8): only those can be redirected or removed"
            )));
        }
        if let Some(other) = Occupied::of(&self.probes, &self.foreign).overlapping(
            &self.probes,
            &self.foreign,
            site..site + 5,
        ) {
            return Err(refuse(format!(
                "the call at {site:#x} is already changed, or inside the patch of the probe at \
                 {:#x} ({}): remove that first",
                other.patch_address,
                self.probe_label(other)
            )));
        }
        Ok((f, bytes))
    }

    /// Writes `patch` over the 5 bytes at `at` with no thread inside them,
    /// and records it as an active word-less probe of `kind` (a
    /// replacement, a call redirected or removed), removable like any
    /// other.
    #[allow(clippy::too_many_arguments)]
    fn splice_wordless(
        &mut self,
        tracer: &mut Tracer,
        function: Function,
        at: u64,
        original: [u8; 5],
        patch: [u8; 5],
        trampoline: std::ops::Range<u64>,
        kind: ProbeKind,
    ) -> Result<ProbeId, Error> {
        self.wait_until_outside(tracer, |pc| at < pc && pc < at + 5, "a patch site")?;
        let id = ProbeId(self.probes.len() as u32);
        let mut probe = [Probe {
            id,
            function,
            patch_address: at,
            original,
            patch,
            compiled: original,
            relocated: 0,
            trampoline,
            active: true,
            displaced: at..at + 5,
            kind,
            entry: None,
            borrowed: false,
        }];
        self.enter_in_directory(&mut probe, &[])?;
        tracer.memory().write(at, &patch)?;
        let [probe] = probe;
        self.probes.push(probe);
        Ok(id)
    }

    /// `len` consecutive metric words for a new probe: fresh ones, or, when
    /// the row is full, the zeroed words of a removed probe nothing writes
    /// any more (that probe then leaves reports).
    fn allocate_words(&mut self, len: u32) -> Result<u32, Error> {
        let (word, fresh) = self.take_words(len)?;
        self.pending.words.push((word, len, fresh));
        Ok(word)
    }

    /// Words for a probe, and whether they are fresh from the target's
    /// cursor.
    fn take_words(&mut self, len: u32) -> Result<(u32, bool), Error> {
        if let Some(i) = self.free_words.iter().position(|&(_, l)| l == len) {
            return Ok((self.free_words.swap_remove(i).0, false));
        }
        let rt = self.rt()?;
        if let Some(word) = crate::ledger::allocate_words(&rt.region, len) {
            return Ok((word, true));
        }
        let width = |p: &Probe| p.words().map_or(0, |w| w.len);
        let Some(at) = self
            .quiet
            .iter()
            .position(|&i| width(&self.probes[i]) == len)
        else {
            return Err(self.out_of_room(Room::MetricWords));
        };
        let index = self.quiet.swap_remove(at);
        let Some(words) = self.probes[index].words_mut() else {
            return Err(Error::Internal("a quiet probe without words".into()));
        };
        words.recycled = true;
        let word = words.first;
        let rt = self.rt()?;
        rt.region
            .zero_words(word, len)
            .map_err(|e| Error::Internal(format!("cannot reset recycled counters: {e}")))?;
        for row in &mut self.harvested {
            for w in row.words.iter_mut().skip(word as usize).take(len as usize) {
                *w = 0;
            }
        }
        Ok((word, false))
    }

    /// Trampoline space for `len` bytes near `near` (`(at, stub)`, see
    /// `Pool::reserve`), logged so that a failed change gives it back.
    fn reserve_logged(
        &mut self,
        tracer: &mut Tracer,
        call_tid: Tid,
        (mmap_fn, register_fn): (u64, u64),
        near: u64,
        len: u64,
    ) -> Result<(u64, u64), Error> {
        let (at, stub) = self
            .pool
            .reserve(tracer, call_tid, mmap_fn, register_fn, near, len)?;
        self.pending.space.push(at..at + len);
        Ok((at, stub))
    }

    /// The error for a full table: its limit, what every session uses, and
    /// what the whole request under way needs.
    fn out_of_room(&self, room: Room) -> Error {
        use std::sync::atomic::Ordering;
        let header = self.runtime.as_ref().map(|rt| rt.region.header());
        let load = |f: fn(&weft_rt::layout::RegionHeader) -> u64| header.map_or(0, f);
        let (limit, in_use, asked) = match room {
            Room::MetricWords => (
                u64::from(
                    self.runtime
                        .as_ref()
                        .map_or(self.options.metric_words, |rt| {
                            rt.region.geometry().metric_words
                        }),
                ),
                load(|h| u64::from(h.words_next.load(Ordering::Acquire))),
                self.request_size.words,
            ),
            Room::CallRecords => (
                weft_rt::layout::CALL_RECORDS as u64,
                load(|h| u64::from(h.records_next.load(Ordering::Acquire))),
                self.request_size.records,
            ),
            Room::Probes => (
                weft_rt::layout::DIRECTORY as u64,
                load(|h| u64::from(h.directory_used.load(Ordering::Acquire))),
                self.request_size.probes,
            ),
        };
        Error::OutOfRoom {
            room,
            limit,
            in_use,
            asked,
        }
    }

    /// A free call record for a probe with exit hooks.
    fn allocate_record(&mut self) -> Result<u32, Error> {
        let (record, fresh) = match self.free_records.pop() {
            Some(r) => (r, false),
            None => {
                let rt = self.rt()?;
                let Some(r) = crate::ledger::allocate_record(&rt.region) else {
                    return Err(self.out_of_room(Room::CallRecords));
                };
                (r, true)
            }
        };
        self.pending.records.push((record, fresh));
        Ok(record)
    }

    /// Gives the space of retired trampolines back to the pool once no
    /// thread executes in one or has an address inside one on its stack
    /// (a return address of a timer subroutine, a signal frame's saved
    /// PC); the others stay retired and are checked again next time.
    /// Scans each thread's stack from its `rsp` to the end of that mapping
    /// (the stack it is on now: frames on another stack, below a
    /// `sigaltstack` handler, are not seen).
    fn recycle_trampolines(&mut self, tracer: &mut Tracer) -> Result<(), Error> {
        if self.retired.is_empty() {
            return Ok(());
        }
        const MAX_SCAN: u64 = 16 << 20;
        let maps = crate::inspect::read_maps(self.pid)?;
        let mut busy = vec![false; self.retired.len()];
        let retired = &self.retired;
        // A thread about to execute a retired probe's call record (its PC
        // on the record's `call`, or that PC in a signal frame) would call
        // whatever the record calls next: the record is busy with the
        // trampoline. (Return points are not: returning through any record
        // leads to the exit handler, whatever the record is used for.)
        let records: Vec<Option<std::ops::Range<u64>>> = {
            let first = self
                .runtime
                .as_ref()
                .map_or(0, |rt| rt.region.header().call_records);
            retired
                .iter()
                .map(|r| {
                    let probe = self.probes.iter().find(|p| &p.trampoline == r)?;
                    let at = first + u64::from(probe.record()?) * weft_codegen::RECORD_SIZE;
                    Some(at..at + weft_codegen::RECORD_RETURN)
                })
                .collect()
        };
        // Every range that pins a retired trampoline, sorted, for a binary
        // search per stack word: 200 threads' stacks are a million words,
        // and a linear pass over the retired list per word made removal's
        // stop grow with it (25 to 60 ms over 40 cycles under 200 threads).
        let mut pins: Vec<(u64, u64, usize)> = retired
            .iter()
            .enumerate()
            .map(|(i, r)| (r.start, r.end, i))
            .chain(
                records
                    .iter()
                    .enumerate()
                    .filter_map(|(i, c)| c.as_ref().map(|c| (c.start, c.end, i))),
            )
            .collect();
        pins.sort_unstable();
        // Ranges may nest only in the records (several probes can share
        // none), so the candidates are the few starting at or before value.
        let mark = |busy: &mut Vec<bool>, value: u64| {
            let k = pins.partition_point(|&(start, _, _)| start <= value);
            for &(_, end, i) in pins[..k].iter().rev().take(2) {
                if value < end {
                    busy[i] = true;
                }
            }
        };
        for tid in tracer.threads().collect::<Vec<_>>() {
            let Ok(regs) = tracer.registers(tid) else {
                continue;
            };
            mark(&mut busy, regs.rip);
            let rsp = regs.rsp & !7;
            let Some(stack) = maps.iter().find(|m| m.start <= rsp && rsp < m.end) else {
                continue;
            };
            let len = (stack.end - rsp).min(MAX_SCAN) as usize;
            match tracer.memory().read_vec(rsp, len) {
                Ok(bytes) => {
                    for chunk in bytes.chunks_exact(8) {
                        mark(
                            &mut busy,
                            u64::from_le_bytes(chunk.try_into().expect("8 bytes")),
                        );
                    }
                }
                // Unreadable: assume the worst.
                Err(_) => busy.iter_mut().for_each(|b| *b = true),
            }
        }
        // A thread in a companion (or a tied sibling's trampoline) goes on
        // into its probe's trampoline: that one is busy as long as the
        // other is.
        for (i, range) in retired.iter().enumerate() {
            if !busy[i] {
                continue;
            }
            let of = self
                .probes
                .iter()
                .find(|p| &p.trampoline == range)
                .and_then(|p| {
                    p.companion_of().or_else(|| {
                        self.ties
                            .iter()
                            .find(|&&(sibling, _)| sibling == p.id)
                            .map(|&(_, of)| of)
                    })
                });
            let main = of
                .and_then(|of| self.probes.get(of.0 as usize))
                .and_then(|p| retired.iter().position(|r| *r == p.trampoline));
            if let Some(j) = main {
                busy[j] = true;
            }
        }
        let mut still = Vec::new();
        for (range, busy) in std::mem::take(&mut self.retired).into_iter().zip(busy) {
            if busy {
                still.push(range);
                continue;
            }
            self.pool.release(range.clone());
            if let Some(i) = self.probes.iter().position(|p| p.trampoline == range) {
                self.quiet.push(i);
                if let Some(record) = self.probes[i].take_record() {
                    self.free_records.push(record);
                }
            }
        }
        self.retired = still;
        Ok(())
    }

    /// Before any change: loads the runtime (or joins the one loaded), takes
    /// out what killed wefts left, and reads what other sessions have in
    /// place.
    fn begin_change(&mut self, tracer: &mut Tracer) -> Result<(), Error> {
        if self.runtime.is_none() {
            return self.ensure_runtime(tracer); // joins the session too
        }
        self.join_session(tracer)
    }

    /// Whether `request` can share `other`, another session's live probe at
    /// its function (its directory entry's index), or why not.
    fn share_or_refuse(&self, request: &ProbeSpec, other: &Probe) -> Result<usize, String> {
        let rt = self.runtime.as_ref().ok_or("the runtime is not loaded")?;
        let index = other.entry.ok_or("no directory entry")?;
        let entry = rt.region.entry(index);
        let header = rt.region.header();
        let owner = (0..weft_rt::layout::SESSIONS)
            .find(|&i| entry.owners & 1 << i != 0)
            .map_or(0, |i| {
                header.sessions[i]
                    .pid
                    .load(std::sync::atomic::Ordering::Acquire)
            });
        let measures_only = request.on_entry.is_none() && request.on_exit.is_none();
        let theirs = other.metrics();
        // A histogram is not a reason to refuse: the share has one when
        // theirs does (`borrow`).
        let covered = theirs.union(request.metrics.with_histogram(false)) == theirs;
        let traced = !self.trace_calls || entry.metrics & weft_rt::layout::METRIC_TRACE != 0;
        if entry.kind == weft_rt::layout::KIND_MEASURE && measures_only && covered && traced {
            return Ok(index);
        }
        let how = if entry.kind != weft_rt::layout::KIND_MEASURE {
            "with its own probe or replacement: stop that weft first".to_string()
        } else if !measures_only {
            "(it measures it): a user probe cannot share it; stop that weft first".to_string()
        } else if !traced {
            "without tracing its calls: its probe cannot be shared by one that traces; stop \
             that weft first"
                .to_string()
        } else {
            format!(
                "measuring only {}: ask for those metrics (-m {}) to share its probe, or stop \
                 that weft first",
                theirs.names().join(","),
                theirs.names().join(",")
            )
        };
        Err(format!(
            "it is already instrumented by another weft (pid {owner}) {how}"
        ))
    }

    /// What to do about `request` at `f`, where other sessions have
    /// probes and the patch site's bytes are `current`: share one that
    /// measures what is asked (its directory index), or put this session's
    /// own probe over the one in place (the site: [`crate::chain`]), or
    /// why neither can be done.
    fn share_or_chain(
        &self,
        request: &ProbeSpec,
        f: &Function,
        current: Option<[u8; 5]>,
    ) -> Result<AtOtherProbe, String> {
        let here: Vec<&Probe> = self
            .foreign
            .iter()
            .filter(|p| p.is_entry() && p.function.address == f.address)
            .collect();
        let mut why = None;
        for other in &here {
            match self.share_or_refuse(request, other) {
                Ok(index) => return Ok(AtOtherProbe::Share(index)),
                Err(reason) => why = why.or(Some(reason)),
            }
        }
        let why = why.unwrap_or_else(|| "it is already instrumented by another weft".into());
        // The link in place: a probe that only measures (its directory
        // kind, which `foreign_probe` reads: one that others go around, a
        // user probe or a replacement stays alone), whose trampoline can
        // pass calls on if its session leaves first.
        let front = here
            .iter()
            .find(|p| current.is_some_and(|c| c == p.patch))
            .filter(|p| matches!(p.kind, ProbeKind::Measure { .. }) && p.relocated != 0);
        let Some(front) = front else {
            return Err(why);
        };
        PatchSite::over_jump(
            front.patch_address,
            front.patch,
            front.patch_address != f.address,
        )
        .map(AtOtherProbe::Chain)
        .ok_or(why)
    }

    /// The other session's probe a patch that replaced `original` at `at`
    /// is chained over: the one whose trampoline that `jmp` enters.
    fn link_below(&self, at: u64, original: &[u8]) -> Option<&Probe> {
        let target = crate::chain::jump_target(at, original)?;
        self.foreign
            .iter()
            .find(|p| p.patch_address == at && p.trampoline.start == target)
    }

    /// Takes this session's slot in the target's session table (again,
    /// after a release that left it), takes out every probe no live session
    /// owns any more (wefts that were killed: all their probes, not only
    /// those on functions asked for now), and reads the other sessions'
    /// live probes. The runtime must be loaded.
    fn join_session(&mut self, tracer: &mut Tracer) -> Result<(), Error> {
        let rt = self.rt()?;
        let orphans = crate::ledger::sweep(&rt.region);
        if self.slot.is_none() {
            self.slot = Some(
                crate::ledger::join(&rt.region, self.identity)
                    .ok_or(Error::TooManySessions(weft_rt::layout::SESSIONS))?,
            );
        }
        self.remove_orphans(tracer, &orphans)?;
        self.read_foreign();
        Ok(())
    }

    /// This session's bit in directory entries' owners.
    fn owner_bit(&self) -> u32 {
        self.slot.map_or(0, |s| 1 << s)
    }

    /// Refreshes [`Process::foreign`] from the directory.
    fn read_foreign(&mut self) {
        let Some(rt) = self.runtime.as_ref() else {
            return;
        };
        let mine = self.owner_bit();
        let own: AddressSet<usize> = self.probes.iter().filter_map(|p| p.entry).collect();
        self.foreign = crate::ledger::live_entries(&rt.region)
            .into_iter()
            .filter(|(i, e)| e.owners & mine == 0 && !own.contains(i))
            .map(|(i, e)| foreign_probe(i, &e))
            .collect();
    }

    /// Takes out the patches of `orphans` (probes whose every owner is
    /// gone) where they are still in place, points their open activations
    /// at the sink and frees their entries. Their trampolines, words and
    /// records are never reused: a thread may still be inside one.
    fn remove_orphans(
        &mut self,
        tracer: &mut Tracer,
        orphans: &[crate::ledger::Orphan],
    ) -> Result<(), Error> {
        if orphans.is_empty() {
            return Ok(());
        }
        let mut ranges = Vec::new();
        let mut hooked = Vec::new();
        let leaving: Vec<usize> = orphans.iter().map(|o| o.index).collect();
        self.unlink(tracer, &leaving)?;
        for orphan in orphans {
            let e = &orphan.entry;
            if e.trampoline != 0 {
                ranges.push(e.trampoline..e.trampoline + e.trampoline_len);
            }
            if crate::ledger::record_of(e).is_some() {
                hooked.push(weft_rt::layout::Geometry::metric_offset(e.first_word) as i32);
            }
        }
        // Threads inside finish them normally (the memory stays).
        self.prefer_outside(tracer, |pc| ranges.iter().any(|r| r.contains(&pc)))?;
        self.retire_open_activations(tracer, &hooked)?;
        Ok(())
    }

    /// Takes the probes of directory entries `leaving` out of their sites
    /// ([`crate::chain::unlink`]): a link in front comes off (the site gets
    /// back the bytes it replaced: the function's, or the `jmp` of the link
    /// below), and so do the bypassed links it uncovers; a link under
    /// another session's is bypassed instead. Frees the entries that came
    /// off and returns those bypassed, whose trampolines, words and records
    /// must never be reused (a link over them jumps in). A patch is only
    /// ever restored while it is still in place (the library may have been
    /// unloaded and the address reused).
    fn unlink(&mut self, tracer: &mut Tracer, leaving: &[usize]) -> Result<Vec<usize>, Error> {
        if leaving.is_empty() {
            return Ok(Vec::new());
        }
        let rt = self.rt()?;
        let region = &rt.region;
        let sites: AddressSet<u64> = leaving
            .iter()
            .map(|&i| region.entry(i).patch_address)
            .collect();
        let mut at: AddressMap<u64, Vec<(usize, weft_rt::layout::ProbeEntry)>> =
            AddressMap::default();
        for (i, e) in crate::ledger::linked_entries(region) {
            if sites.contains(&e.patch_address) {
                at.entry(e.patch_address).or_default().push((i, e));
            }
        }
        let mut bypass = Vec::new();
        let mut free = Vec::new();
        for (site, links) in at {
            let here: Vec<usize> = leaving
                .iter()
                .copied()
                .filter(|i| links.iter().any(|(j, _)| j == i))
                .collect();
            let mut current = [0u8; 5];
            let plan = if tracer.memory().read(site, &mut current).is_ok() {
                crate::chain::unlink(&current, &links, &here)
            } else {
                crate::chain::Unlink {
                    free: here,
                    ..Default::default()
                }
            };
            if let Some(bytes) = plan.site {
                tracer.memory().write(site, &bytes)?;
            }
            free.extend(plan.free);
            bypass.extend(
                plan.bypass
                    .into_iter()
                    .filter_map(|i| links.iter().find(|(j, _)| *j == i).copied()),
            );
        }
        // A bypassed trampoline starts with a jump to its copy of the
        // displaced instructions: no thread may be inside the bytes that
        // jump overwrites (one at its first byte runs the jump).
        let heads: Vec<u64> = bypass.iter().map(|(_, e)| e.trampoline).collect();
        if !heads.is_empty() {
            self.wait_until_outside(
                tracer,
                |pc| heads.iter().any(|&t| t < pc && pc < t + 5),
                "a bypassed trampoline's head",
            )?;
        }
        let region = &self.rt()?.region;
        for (index, mut e) in bypass.iter().copied() {
            tracer
                .memory()
                .write(e.trampoline, &crate::chain::pass_through(e.relocated))?;
            e.state = weft_rt::layout::PROBE_BYPASSED;
            e.owners = 0;
            region.set_entry(index, &e);
        }
        for index in free {
            crate::ledger::free(region, index);
        }
        Ok(bypass.into_iter().map(|(i, _)| i).collect())
    }

    /// Enters `probes` (about to be patched) in the target's directory,
    /// owned by this session.
    fn enter_in_directory(
        &mut self,
        probes: &mut [Probe],
        tied: &[(ProbeId, ProbeId)],
    ) -> Result<(), Error> {
        let owners = self.owner_bit();
        let rt = self.runtime.as_ref().ok_or_else(no_runtime)?;
        // A probe other code goes around (companions, a tied sibling) is
        // private, and so is the tied sibling: a session sharing one would
        // not know to take the others out with it.
        let private: Vec<ProbeId> = probes
            .iter()
            .filter_map(Probe::companion_of)
            .chain(tied.iter().flat_map(|&(a, b)| [a, b]))
            .collect();
        let entries: Vec<weft_rt::layout::ProbeEntry> = probes
            .iter()
            .map(|p| {
                let traced = self.trace_calls && p.hooks_exit();
                directory_entry(p, owners, private.contains(&p.id), traced)
            })
            .collect();
        let Some(indices) = crate::ledger::add_all(&rt.region, &entries) else {
            return Err(self.out_of_room(Room::Probes));
        };
        for (probe, index) in probes.iter_mut().zip(indices) {
            // Freed again if the change fails (`roll_back`).
            self.pending.entries.push(index);
            probe.entry = Some(index);
        }
        Ok(())
    }

    /// Writes the patches of `probes` ([`splice`]); on failure, forgets the
    /// plans whose code changed, and when a patch may have stayed in place
    /// (putting a page back failed too), keeps what the change took: its
    /// trampolines may be reached, and its directory entries let a later
    /// weft take the patch out.
    fn splice_logged(
        &mut self,
        tracer: &mut Tracer,
        probes: &[Probe],
        originals: &[&[u8]],
    ) -> Result<(), Error> {
        #[cfg(debug_assertions)]
        let fail_after = match self.checkpoint(undo::Fault::Splice) {
            Ok(()) => usize::MAX,
            Err(_) => 1,
        };
        #[cfg(not(debug_assertions))]
        let fail_after = usize::MAX;
        match splice(tracer.memory(), probes, originals, fail_after) {
            Ok(()) => Ok(()),
            Err((e, patched)) => {
                if let Error::Refused(refused) = &e {
                    // Planned from code that has changed since: plan again.
                    for r in refused {
                        self.plans.remove(&plan_key(&r.function));
                    }
                }
                if patched {
                    self.pending = undo::Undo::default();
                }
                Err(e)
            }
        }
    }

    /// Shares another session's live probe at `f` (`entry` of the
    /// directory): this session becomes an owner and reads its words from
    /// now on, the values they hold now (the world is stopped) subtracted.
    fn borrow(&mut self, f: &Function, index: usize, metrics: Metrics) -> Result<Probe, Error> {
        let rt = self.rt()?;
        let mut entry = rt.region.entry(index);
        entry.owners |= self.owner_bit();
        rt.region.set_entry(index, &entry);
        let mut probe = foreign_probe(index, &entry);
        probe.id = ProbeId(self.probes.len() as u32);
        probe.function = f.clone();
        // Its words have a histogram only if its owner asked for one.
        let metrics = metrics.with_histogram(
            metrics.histogram && entry.metrics & weft_rt::layout::METRIC_HISTOGRAM != 0,
        );
        // Measured as asked: a share covers at most what its owner measures.
        probe.kind = ProbeKind::Measure {
            metrics,
            words: Words::fresh(entry.first_word, entry.words),
            record: crate::ledger::record_of(&entry),
        };
        // The words that add up (calls, exits, closed time), not a running
        // timer's start or a nesting depth.
        let offsets: &[i32] = if entry.words > 1 {
            &[
                weft_codegen::METRIC_ENTRIES,
                weft_codegen::METRIC_EXITS,
                weft_codegen::METRIC_UNWOUND,
                weft_codegen::METRIC_UNHOOKED,
                weft_codegen::METRIC_WALL_TOTAL,
                weft_codegen::METRIC_CPU_TOTAL,
                weft_codegen::METRIC_SELF_TOTAL,
            ]
        } else {
            &[0]
        };
        // The histogram's buckets add up too.
        let buckets = (0..weft_codegen::HIST_BUCKETS as i32)
            .map(|b| weft_codegen::METRIC_HIST + 8 * b)
            .filter(|_| entry.words > 1);
        let words: Vec<u32> = offsets
            .iter()
            .copied()
            .chain(buckets)
            .map(|o| entry.first_word + (o / 8) as u32)
            .filter(|&w| w < entry.first_word + entry.words)
            .collect();
        let used = crate::ledger::words_used(&rt.region);
        for row in rt.region.snapshot(used) {
            let base = self
                .baselines
                .entry((row.index, row.generation))
                .or_default();
            for &w in &words {
                let value = row.words.get(w as usize).copied().unwrap_or(0);
                if value != 0 {
                    base.push((w, value));
                }
            }
        }
        Ok(probe)
    }

    /// Takes out probes an earlier weft left in these functions (it was
    /// killed while they were live): their trampolines count into words
    /// this session reuses, and a new probe would stack on top of them.
    /// The original bytes come from the record in front of each trampoline.
    fn remove_leftover_probes(
        &mut self,
        tracer: &mut Tracer,
        functions: &[Function],
    ) -> Result<(), Error> {
        let maps = crate::inspect::read_maps(self.pid)?;
        let mut leftovers = Vec::new();
        for f in functions {
            // This session's own probes are not leftovers.
            if self.probes.iter().any(|p| p.is_live_entry_of(f)) {
                continue;
            }
            // After an endbr64, where weft patches, or at the entry; not
            // another live session's probe (the directory names those).
            for at in [f.address, f.address + 4] {
                if self.foreign.iter().any(|p| p.patch_address == at) {
                    continue;
                }
                if let Some(probe) = crate::trampolines::leftover_probe(tracer.memory(), &maps, at)
                {
                    tracer
                        .memory()
                        .write(probe.patch_address, &probe.original)?;
                    leftovers.push(probe.trampoline);
                }
            }
        }
        if !leftovers.is_empty() {
            // Threads inside finish them normally (the memory stays).
            self.prefer_outside(tracer, |pc| leftovers.iter().any(|r| r.contains(&pc)))?;
        }
        Ok(())
    }

    /// Decides how to patch `f`, or says why it cannot be done safely:
    /// refused when any code jumps into the bytes the patch overwrites
    /// (see [`Process::plan_shared`] for what an insertion does instead).
    fn plan(
        &mut self,
        f: &Function,
        occupied: &Occupied,
    ) -> Result<weft_codegen::PatchSite, String> {
        let (site, entered) = self.plan_shared(f, occupied).map_err(|e| e.to_string())?;
        match entered.first() {
            Some(branch) => Err(jumped_into(branch, &f.module, &site)),
            None => Ok(site),
        }
    }

    /// The site of `f`'s patch, with every direct branch from other code of
    /// the module (a sibling entry point, in hand-written assembly) that
    /// lands strictly inside the bytes it overwrites.
    fn plan_shared(
        &mut self,
        f: &Function,
        occupied: &Occupied,
    ) -> Result<(PatchSite, Vec<weft_codegen::Branch>), Refusal> {
        // Code elsewhere in the module may jump into the patch too.
        self.branch_index(f.address)
            .map_err(|e| Refusal::Unreadable(e.to_string()))?;
        let (code, padding) = self.read_code(f, occupied)?;
        let site = analyze_entry(&FunctionCode {
            address: f.address,
            bytes: &code,
            padding: &padding,
        })?;
        let entered = self
            .image
            .module_of(f.address)
            .and_then(|m| self.branch_indexes.get(m.path()))
            .map(|i| i.all_into_range(site.patch_address, site.end()).collect())
            .unwrap_or_default();
        Ok((site, entered))
    }

    /// `f`'s bytes (its size, at most [`MAX_ANALYZED`]; 16 when unknown)
    /// as compiled (probes' patches undone in the copy), and the padding
    /// after it.
    fn read_code(
        &mut self,
        f: &Function,
        occupied: &Occupied,
    ) -> Result<(Vec<u8>, Vec<u8>), Refusal> {
        let memory = self
            .reader()
            .map_err(|e| Refusal::Unreadable(e.to_string()))?;
        let size = if f.size == 0 {
            16
        } else {
            f.size.min(MAX_ANALYZED)
        };
        let mut code = memory
            .read_vec(f.address, size as usize)
            .map_err(|e| Refusal::Unreadable(e.to_string()))?;
        let padding = if f.padding > 0 {
            memory
                .read_vec(f.address + f.size, f.padding.min(64) as usize)
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        // Instruction points in the body: decode the code as compiled.
        occupied.restore_originals(&self.probes, &self.foreign, f.address, &mut code);
        Ok((code, padding))
    }

    /// How the jump `branch` into the bytes `site` (of `f`) overwrites goes
    /// around the patch: the instructions of its own function around it
    /// (from itself when it can, else from up to 5 bytes before it in its
    /// block), relocated by the insertion into a companion whose copy of
    /// the jump goes to the same instruction's copy in `f`'s trampoline.
    /// So a call of the sibling never runs `f`'s snippets (it is not a
    /// call of `f`), and never lands inside the patch.
    fn plan_companion(
        &mut self,
        f: &Function,
        site: &PatchSite,
        branch: weft_codegen::Branch,
        occupied: &Occupied,
    ) -> Result<CompanionPlan, Refusal> {
        let refuse = |why: SharedCode| Refusal::SharedCode {
            from: branch.source,
            target: branch.target,
            module: f.module.clone(),
            len: site.original.len(),
            patch_address: site.patch_address,
            why,
        };
        if !branch.kind.is_jump() {
            return Err(refuse(SharedCode::NotAJump));
        }
        let Some(target) = site
            .instructions
            .iter()
            .position(|i| i.ip() == branch.target)
        else {
            return Err(refuse(SharedCode::InsideInstruction));
        };
        let sibling = match self.image.function_at(branch.source) {
            Ok(Some(g)) if g.size > 0 => g,
            _ => return Err(refuse(SharedCode::NoFunction)),
        };
        let (code, padding) = self.read_code(&sibling, occupied)?;
        let companion = weft_codegen::analyze_at(
            &FunctionCode {
                address: sibling.address,
                bytes: &code,
                padding: &padding,
            },
            branch.source,
        )
        .map_err(|e| refuse(SharedCode::Unpatchable(e)))?;
        let range = companion.patch_address..companion.end();
        let index = self
            .image
            .module_of(branch.source)
            .and_then(|m| self.branch_indexes.get(m.path()));
        if let Some(other) = index.and_then(|i| i.into_range(range.start, range.end)) {
            return Err(refuse(SharedCode::Entered {
                from: other.source,
                patch_address: range.start,
            }));
        }
        if let Some(other) = occupied.overlapping(&self.probes, &self.foreign, range) {
            return Err(refuse(SharedCode::InsideProbe {
                at: other.patch_address,
                name: self.probe_label(other),
            }));
        }
        Ok(CompanionPlan {
            of: site.patch_address,
            function: sibling,
            jump: branch.source,
            target,
            site: Arc::new(companion),
        })
    }

    /// The target's memory for reading: a read-only handle of our own,
    /// held or not (reading needs no attach, only the right to trace).
    fn reader(&mut self) -> Result<&crate::memory::ProcessMemory, Error> {
        let memory = match self.memory.take() {
            Some(memory) => memory,
            None => crate::memory::ProcessMemory::open_read_only(self.pid)?,
        };
        Ok(self.memory.insert(memory))
    }

    /// Moves every thread stopped inside the bytes of a patch just written
    /// to the equivalent place of its trampoline (as Dyninst and Frida do),
    /// instead of letting the world run until none is there, which a hot
    /// function under many threads may never give. A thread at an
    /// instruction boundary goes on at that instruction's copy; one stopped
    /// in a system call whose restart steps back over a displaced `syscall`
    /// goes on after its copy, so that the restart lands on the copy.
    /// Returns how many threads moved.
    fn move_threads_out(&mut self, tracer: &mut Tracer, moves: &[Resume]) -> Result<usize, Error> {
        if moves.is_empty() {
            return Ok(0);
        }
        let mut sorted = moves.to_vec();
        sorted.sort_unstable_by_key(|m| m.at);
        let find = |pc: u64| {
            let k = sorted.partition_point(|m| m.at <= pc);
            sorted[..k].last().filter(|m| m.at == pc).copied()
        };
        let mut moved = 0;
        for tid in tracer.threads().collect::<Vec<_>>() {
            let Ok(mut regs) = tracer.registers(tid) else {
                continue; // gone
            };
            // Stopped in a system call made by a displaced 2-byte
            // `syscall`: after its copy (a restart steps back onto it).
            let in_syscall = regs.orig_rax as i64 >= 0;
            let target = in_syscall
                .then(|| find(regs.rip.wrapping_sub(2)))
                .flatten()
                .filter(|m| m.len == 2)
                .map(|m| m.copy + 2)
                .or_else(|| find(regs.rip).filter(|m| !m.first).map(|m| m.resume));
            if let Some(rip) = target {
                self.pending.moved.push((tid, regs.rip));
                regs.rip = rip;
                tracer.set_registers(tid, &regs)?;
                moved += 1;
            }
        }
        self.threads_moved += moved as u64;
        Ok(moved)
    }

    /// Stops the world with no thread at a PC for which `inside` holds,
    /// letting it run a little between attempts.
    fn wait_until_outside(
        &mut self,
        tracer: &mut Tracer,
        inside: impl Fn(u64) -> bool,
        what: &str,
    ) -> Result<(), Error> {
        self.try_to_get_outside(tracer, inside, what, MOVE_ON_ATTEMPTS, true)
    }

    /// [`Process::wait_until_outside`] for code that only *prefers* no
    /// thread inside (a trampoline whose patch is gone: threads in it finish
    /// it normally): a few attempts, then on regardless. Many threads
    /// spinning through a hot function may never all be out at once.
    fn prefer_outside(
        &mut self,
        tracer: &mut Tracer,
        inside: impl Fn(u64) -> bool,
    ) -> Result<(), Error> {
        self.try_to_get_outside(tracer, inside, "", 5, false)
    }

    fn try_to_get_outside(
        &self,
        tracer: &mut Tracer,
        inside: impl Fn(u64) -> bool,
        what: &str,
        attempts: u32,
        required: bool,
    ) -> Result<(), Error> {
        for attempt in 0..=attempts {
            let mut blocked = None;
            for tid in tracer.threads().collect::<Vec<_>>() {
                let Ok(regs) = tracer.registers(tid) else {
                    continue;
                };
                // A thread stopped in a system call restarts it by moving
                // back over the 2-byte `syscall` instruction.
                let restart = (regs.orig_rax as i64 >= 0).then(|| regs.rip.wrapping_sub(2));
                if inside(regs.rip) || restart.is_some_and(&inside) {
                    blocked = Some(tid);
                    break;
                }
            }
            let Some(tid) = blocked else { return Ok(()) };
            if attempt == attempts {
                if !required {
                    return Ok(());
                }
                return Err(Error::ThreadStuck {
                    tid,
                    what: what.to_string(),
                });
            }
            tracer.resume_all()?;
            std::thread::sleep(Duration::from_millis(1 + attempt as u64));
            tracer.stop_all()?;
        }
        Ok(())
    }

    /// [`Held::remove`].
    fn remove_now(&mut self, tracer: &mut Tracer, ids: &[ProbeId]) -> Result<(), Error> {
        // Only the probes still in: removing one twice is a no-op. A
        // probe's companions go with it, and tied probes go together.
        let mut ids = ids.to_vec();
        loop {
            let more: Vec<ProbeId> = self
                .ties
                .iter()
                .flat_map(|&(a, b)| [(a, b), (b, a)])
                .filter(|(a, b)| ids.contains(a) && !ids.contains(b))
                .map(|(_, b)| b)
                .collect();
            if more.is_empty() {
                break;
            }
            ids.extend(more);
        }
        let ids: Vec<ProbeId> = self
            .probes
            .iter()
            .filter(|p| {
                p.active
                    && (ids.contains(&p.id) || p.companion_of().is_some_and(|of| ids.contains(&of)))
            })
            .map(|p| p.id)
            .collect();
        let mine = self.slot.map_or(0, |s| 1u32 << s);
        let region = self.runtime.as_ref().map(|rt| &rt.region);
        let mut handed_over = Vec::new();
        let mut leaving = Vec::new();
        for probe in self
            .probes
            .iter_mut()
            .filter(|p| p.active && ids.contains(&p.id))
        {
            // A probe another live session shares stays in place, theirs
            // now: this session only stops reading it.
            if let (Some(index), Some(region)) = (probe.entry, region) {
                let mut entry = region.entry(index);
                if entry.state == weft_rt::layout::PROBE_LIVE && entry.owners & !mine != 0 {
                    entry.owners &= !mine;
                    region.set_entry(index, &entry);
                    probe.active = false;
                    probe.borrowed = true;
                    handed_over.push(probe.id);
                    continue;
                }
                if entry.state == weft_rt::layout::PROBE_LIVE {
                    // Out of its site's chain of probes, below.
                    leaving.push(index);
                    probe.active = false;
                    continue;
                }
                crate::ledger::free(region, index);
            }
            // Restore only if our jmp is still there: the library may have
            // been unloaded and the address reused.
            let mut current = [0u8; 5];
            if tracer
                .memory()
                .read(probe.patch_address, &mut current)
                .is_ok()
                && current == probe.patch
            {
                tracer
                    .memory()
                    .write(probe.patch_address, &probe.original)?;
            }
            probe.active = false;
        }
        let bypassed = self.unlink(tracer, &leaving)?;
        let ids: Vec<ProbeId> = ids
            .into_iter()
            .filter(|id| !handed_over.contains(id))
            .collect();
        let ranges: Vec<std::ops::Range<u64>> = self
            .probes
            .iter()
            .filter(|p| ids.contains(&p.id))
            .map(|p| p.trampoline.clone())
            .collect();
        // A thread still inside a trampoline finishes it normally (the code
        // stays; its space is reused only once no thread is in it, see
        // recycle_trampolines), but would count once more: let threads leave
        // first when they do so quickly.
        self.prefer_outside(tracer, |pc| ranges.iter().any(|r| r.contains(&pc)))?;
        let hooked: Vec<i32> = self
            .probes
            .iter()
            .filter(|p| ids.contains(&p.id) && p.hooks_exit())
            .filter_map(Probe::calls_word)
            .map(|word| weft_rt::layout::Geometry::metric_offset(word) as i32)
            .collect();
        self.retire_open_activations(tracer, &hooked)?;
        // Only this session's own trampolines come back to its pool (a
        // borrowed one lies in another weft's area), and not those bypassed
        // under another session's probe (it jumps into them).
        let own: Vec<std::ops::Range<u64>> = self
            .probes
            .iter()
            .filter(|p| ids.contains(&p.id) && !p.borrowed)
            .filter(|p| !p.entry.is_some_and(|e| bypassed.contains(&e)))
            .map(|p| p.trampoline.clone())
            .collect();
        self.retired.extend(own);
        self.recycle_trampolines(tracer)?;
        if !self.probes.iter().any(|p| p.active) {
            if let Some(since) = self.live_since.take() {
                self.live_for += since.elapsed();
            }
        }
        Ok(())
    }

    /// Detaches `tracer` ([`Held::release`]): the process runs on, probes
    /// keep counting, weft is no longer attached (its signals, clones and
    /// exits never wait for weft).
    fn let_go(&mut self, tracer: &mut Tracer) -> Result<(), Error> {
        self.stops_before += tracer.stop_count();
        self.stops_given_up += tracer.stops_given_up();
        let detached = tracer.detach();
        self.longest_stop = self.longest_stop.max(tracer.longest_stop_time());
        // Normal priority again, whatever happened.
        self.boost = None;
        // A session with nothing in place gives its slot back: its acks
        // then hold no row, and the slot is free for another weft.
        if !self.probes.iter().any(|p| p.active) {
            if let (Some(slot), Some(rt)) = (self.slot.take(), &self.runtime) {
                crate::ledger::leave(&rt.region, slot);
            }
        }
        detached?;
        self.ever_released = true;
        Ok(())
    }

    /// Attaches (again) and stops every thread, for as long as the
    /// returned [`Held`] lives: everything that changes the target's code
    /// or needs its threads stopped is a method of [`Held`]. It ends with
    /// [`Held::release`], or when the `Held` is dropped (which releases,
    /// errors ignored): weft never leaves the target stopped.
    ///
    /// A launched program's first hold is the stop at its entry
    /// ([`Process::launch`]). When another weft holds the process, waits up
    /// to 3 s for it to let go ([`Error::HeldByOtherWeft`]).
    pub fn hold(&mut self) -> Result<Held<'_>, Error> {
        if let Some(tracer) = self.entry_stop.take() {
            return Ok(Held::new(self, tracer));
        }
        if self.boost.is_none() {
            self.boost = RealtimeGuard::raise();
        }
        self.longest_stop = StopTime::default();
        // While the target still runs: what an insertion of the functions
        // `prepare` planned would otherwise build in the pause, and the
        // wall clock a first load of the runtime hands over.
        self.stage_prepared();
        if self.runtime.is_none() {
            runtime::settle_wall_clock();
            runtime::look_up_symbols(&mut self.image);
        }
        let attached = preflight(self.pid).and_then(|()| self.attach_waiting_for_weft());
        let tracer = match attached {
            Ok(tracer) => tracer,
            Err(e) => {
                self.boost = None;
                return Err(e);
            }
        };
        if self.threads_at_attach == 0 {
            self.threads_at_attach = tracer.thread_count();
        }
        Ok(Held::new(self, tracer))
    }

    /// Seizes the process; when another weft holds it (only one tracer
    /// can), waits for that one's change to end — a weft holds a process
    /// for milliseconds at a time — rather than proceed blind, and says so
    /// if it does not let go within [`WAIT_FOR_OTHER_WEFT`]. Any other
    /// tracer (a debugger, strace) is an error at once.
    fn attach_waiting_for_weft(&self) -> Result<Tracer, Error> {
        let since = Instant::now();
        loop {
            match Tracer::attach(self.pid) {
                Err(TraceError::AlreadyTraced { pid, tracer })
                    if self.is_weft_session(tracer as u32) =>
                {
                    if since.elapsed() >= WAIT_FOR_OTHER_WEFT {
                        return Err(Error::HeldByOtherWeft {
                            pid,
                            weft: tracer,
                            waited: since.elapsed(),
                        });
                    }
                    // (Sleeping: weft may run at real-time priority here.)
                    std::thread::sleep(Duration::from_millis(2));
                }
                other => return Ok(other?),
            }
        }
    }

    /// Whether `pid` is a weft: named so, or in the target's session table.
    fn is_weft_session(&self, pid: u32) -> bool {
        let named = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|comm| comm.trim_end() == "weft");
        let registered = self.runtime.as_ref().is_some_and(|rt| {
            rt.region
                .header()
                .sessions
                .iter()
                .any(|s| s.pid.load(std::sync::atomic::Ordering::Acquire) == pid)
        });
        named || registered
    }

    /// Does the work of planning that needs no stopped target — sweeping
    /// the direct branches of the modules holding `functions`, reading each
    /// function's first bytes and deciding how to patch it — so that it
    /// happens before [`Process::hold`] rather than inside the pause.
    /// Optional: [`Held::insert_counters`] does what is left itself.
    /// Sites planned here are checked against the code again, with the
    /// world stopped, right before they are patched. Once the runtime is
    /// loaded (after a first insertion), `hold` also builds the counters'
    /// trampolines of 64 or more planned functions before it stops the
    /// world, for an insertion to find them made.
    pub fn prepare(&mut self, functions: &[Function]) -> Result<(), Error> {
        for f in functions {
            self.branch_index(f.address)?;
            // What the check that a timed function is called (not jumped
            // into) reads: its module's FDEs, parsed on first use — 11 ms
            // for libc, which would otherwise go into the stop.
            if let Some(elf) = self.image.module_of(f.address).and_then(|m| m.image().ok()) {
                let _ = elf.frame_at_entry(f.vaddr);
            }
        }
        // Planning ahead is optional: on any trouble, `insert` plans.
        let Ok(maps) = crate::inspect::read_maps(self.pid) else {
            return Ok(());
        };
        let occupied = Occupied::of(&self.probes, &self.foreign);
        for f in functions {
            if f.kind != FunctionKind::Plain || self.plans.contains_key(&plan_key(f)) {
                continue;
            }
            let Ok(memory) = self.reader() else {
                break; // not readable without attaching: planned when held
            };
            // A probe an earlier weft left here is taken out first, when
            // held: plan this one then.
            let leftover = [f.address, f.address + 4]
                .into_iter()
                .any(|at| crate::trampolines::leftover_probe(memory, &maps, at).is_some());
            if leftover {
                continue;
            }
            // Refusals are not kept: the code may change (a debugger's
            // breakpoint removed) before the insertion.
            if let Ok(site) = self.plan(f, &occupied) {
                self.plans.insert(plan_key(f), Arc::new(site));
            }
        }
        Ok(())
    }

    /// A probe's name for messages: a companion is named after the probe
    /// it belongs to, not the sibling whose code it holds.
    fn probe_label(&self, p: &Probe) -> String {
        match p
            .companion_of()
            .and_then(|of| self.probes.get(of.0 as usize))
        {
            Some(main) => format!(
                "the companion of {}'s probe, over a jump in {} into its patch",
                points::probe_name(main),
                p.function.name
            ),
            None => points::probe_name(p),
        }
    }

    /// Whether each of `functions` can be instrumented measuring `metrics`,
    /// without changing anything (no attach needed): the planning an
    /// insertion of them all at once does — the code at each entry, every
    /// jump into the bytes its patch would overwrite and the companion
    /// that would go around it, whether its exit may be hooked, the probes
    /// already in place — answered per function. An IFUNC is checked at
    /// the implementation the process uses, when it has chosen one yet
    /// ([`Refusal::UnresolvedIfunc`] otherwise). Functions already
    /// instrumented count as possible.
    pub fn check(&mut self, functions: &[Function], metrics: Metrics) -> Vec<Result<(), Refusal>> {
        let mut out: Vec<Result<(), Refusal>> = vec![Ok(()); functions.len()];
        let mut requests = Vec::with_capacity(functions.len());
        let mut asked = Vec::with_capacity(functions.len());
        for (i, f) in functions.iter().enumerate() {
            let f = match f.kind {
                FunctionKind::Ifunc { .. } => match self.image.resolved_address(f) {
                    Some(at) => match self.implementation(f, at) {
                        Ok(g) => g,
                        Err(e) => {
                            out[i] = Err(Refusal::Unreadable(e.to_string()));
                            continue;
                        }
                    },
                    None => {
                        out[i] = Err(Refusal::UnresolvedIfunc);
                        continue;
                    }
                },
                _ => f.clone(),
            };
            requests.push(std::borrow::Cow::Owned(ProbeSpec::measure(f, metrics)));
            asked.push(i);
        }
        match self.plan_request(&requests) {
            Ok(planned) => {
                for (k, why) in planned.refused {
                    out[asked[k]] = Err(why);
                }
            }
            Err(e) => {
                for &i in &asked {
                    out[i] = Err(Refusal::Unreadable(e.to_string()));
                }
            }
        }
        out
    }

    /// The branch index of the module holding `address`, built on first use.
    fn branch_index(
        &mut self,
        address: u64,
    ) -> Result<Option<&crate::branches::BranchIndex>, Error> {
        let Some(module) = self.image.module_of(address) else {
            return Ok(None);
        };
        let path = module.path().to_path_buf();
        if !self.branch_indexes.contains_key(&path) {
            let index = crate::branches::BranchIndex::build(module)?;
            self.branch_indexes.insert(path.clone(), index);
        }
        Ok(self.branch_indexes.get(&path))
    }

    /// Whether the process is still alive (not exited, not a zombie).
    pub fn is_alive(&self) -> bool {
        if self.exit.is_some() {
            return false;
        }
        match crate::inspect::process_state(self.pid) {
            Ok(state) => !state.is_zombie(),
            Err(_) => false,
        }
    }

    /// For a launched process: waits until it exits (forwarding SIGTERM,
    /// SIGHUP and SIGINT weft receives meanwhile) and returns how it ended.
    pub fn wait_exit(&mut self) -> Result<ProcessExit, Error> {
        if let Some(exit) = self.exit {
            return Ok(exit);
        }
        if !self.launched {
            return Err(Error::NotOurChild(self.pid));
        }
        if let Some(mut tracer) = self.entry_stop.take() {
            // Never held: it runs from its entry uninstrumented, as asked.
            self.let_go(&mut tracer)?;
        }
        // Harvest exited threads' rows while waiting, so that a program that
        // creates many short-lived threads reuses rows instead of running
        // out of them.
        let exit = crate::launch::wait_child(self.pid, &mut || {
            self.harvest();
        })?;
        // The last threads ended with the process.
        self.harvest();
        self.exit = Some(exit);
        if let Some(since) = self.live_since.take() {
            self.live_for += since.elapsed();
        }
        Ok(exit)
    }

    /// Copies every thread's row out of the shared region (no stop):
    /// the rows of threads already harvested, then the region's current
    /// rows (except those harvested copies' own, now stale, generations).
    ///
    /// For timed probes the copy's total words (wall and CPU) hold the
    /// timers' values at this moment: a live thread's running timer is read
    /// consistently (seqlock) and counted up to now, its CPU time from
    /// `/proc/PID/task/TID/schedstat`.
    pub fn snapshot(&self) -> Vec<RowSnapshot> {
        let Some(rt) = &self.runtime else {
            return Vec::new();
        };
        let mut rows = self.harvested.clone();
        let wall = *weft_rt::clock::WallClock::in_region(rt.region.header());
        let words = crate::ledger::words_used(&rt.region);
        let live = rt.region.snapshot(words).into_iter().filter(|r| {
            !self
                .harvested
                .iter()
                .any(|h| h.index == r.index && h.generation == r.generation)
        });
        let mut memory = None;
        for mut row in live {
            if row.state == weft_rt::layout::ROW_LIVE {
                self.sample_running_timers(&rt.region, &wall, &mut row, &mut memory);
            }
            self.subtract_baseline(&mut row);
            rows.push(row);
        }
        rows
    }

    /// What borrowed probes' word `word` of row `index` (of `generation`)
    /// held when this session started sharing it (0 for others).
    pub(crate) fn baseline(&self, index: u32, generation: u32, word: u32) -> u64 {
        self.baselines
            .get(&(index, generation))
            .and_then(|b| b.iter().find(|&&(w, _)| w == word))
            .map_or(0, |&(_, v)| v)
    }

    /// Takes out of `row` what borrowed probes had counted before this
    /// session started sharing them.
    fn subtract_baseline(&self, row: &mut RowSnapshot) {
        if let Some(base) = self.baselines.get(&(row.index, row.generation)) {
            for &(word, value) in base {
                if let Some(w) = row.words.get_mut(word as usize) {
                    *w = w.saturating_sub(value);
                }
            }
        }
    }

    /// Replaces the timer totals of a live row's timed probes with their
    /// values now (total + time since a running timer's start; self time
    /// with the open activations' self time so far, see `open_self`).
    /// `memory`: the target's memory, opened at the first row that needs
    /// it.
    fn sample_running_timers(
        &self,
        region: &crate::region::Region,
        wall: &weft_rt::clock::WallClock,
        row: &mut RowSnapshot,
        memory: &mut Option<crate::memory::ProcessMemory>,
    ) {
        use weft_codegen::{read_timer_words, timer_value};
        let mut cpu_now = None;
        let index = row.index;
        let read = |base: usize| {
            read_timer_words(
                |off| region.load_word(index, base + off),
                weft_codegen::TIMER_READ_ATTEMPTS,
            )
        };
        // Clocks before the words: a running timer's value then never
        // exceeds what its stop will record. One reading serves the row.
        let wall_now = wall.raw();
        let q32 = region.header().timer_ns_per_tick_q32;
        // The open activations' self ticks, read once the row has a
        // running timer.
        let mut open: Option<std::collections::HashMap<i32, u64>> = None;
        let mut open_self = |base: usize| -> u64 {
            let open = open.get_or_insert_with(|| {
                crate::open_self::row_open_self_ticks(
                    region,
                    (index, self.pid, &self.retired_cells),
                    memory,
                    wall_now,
                )
            });
            let ticks = i32::try_from(base)
                .ok()
                .and_then(|b| open.get(&b))
                .copied()
                .unwrap_or(0);
            weft_rt::clock::q32_mul(ticks, q32)
        };
        for probe in self.probes.iter().filter(|p| p.metrics().hooks_exit()) {
            let Some(word) = probe.calls_word() else {
                continue;
            };
            let first = word as usize;
            let base = weft_rt::layout::Geometry::metric_offset(word) as usize;
            let at = |off: i32| first + (off / 8) as usize;
            let (wall_at, self_at) = (
                at(weft_codegen::METRIC_WALL_TOTAL),
                at(weft_codegen::METRIC_SELF_TOTAL),
            );
            // A writer stuck mid-update (switched out between its seqlock
            // stores): the copy's closed totals stand, self time capped
            // by wall time (a stop adds to self time first).
            let stuck = |row: &mut RowSnapshot| {
                if let (Some(&wall), Some(own)) = (row.words.get(wall_at), row.words.get(self_at)) {
                    let capped = (*own).min(wall);
                    row.words[self_at] = capped;
                }
            };
            let Some(mut words) = read(base) else {
                stuck(row);
                continue;
            };
            // The thread's CPU time only for a running CPU timer (one
            // /proc read per thread and report at most), then the words
            // again, after it.
            if probe.metrics().cpu && words.cpu_start != 0 && cpu_now.is_none() {
                cpu_now = weft_rt::clock::thread_cpu_ns_from_outside(self.pid as u32, row.tid).ok();
                match read(base) {
                    Some(again) => words = again,
                    None => {
                        stuck(row);
                        continue;
                    }
                }
            }
            let value = timer_value(&words, wall_now, cpu_now, q32);
            // A running call's self time so far counts as its wall time
            // does; self time never exceeds wall time.
            let own = if words.wall_start != 0 {
                words
                    .self_total
                    .saturating_add(open_self(base))
                    .min(value.wall_ns)
            } else {
                words.self_total
            };
            // All three from the one consistent reading.
            for (index, ns) in [
                (wall_at, value.wall_ns),
                (at(weft_codegen::METRIC_CPU_TOTAL), value.cpu_ns),
                (self_at, own),
            ] {
                if let Some(w) = row.words.get_mut(index) {
                    *w = ns;
                }
            }
        }
    }

    /// Takes the final figures of threads that have exited and lets the
    /// runtime give their rows to new threads. Call it periodically while a
    /// program that creates many short-lived threads runs (the `weft`
    /// command does, every few milliseconds); without it rows are not
    /// reused. Returns how many rows were harvested.
    pub fn harvest(&mut self) -> usize {
        let (Some(rt), Some(slot)) = (&self.runtime, self.slot) else {
            return 0;
        };
        let pid = self.pid;
        let exited = self.exit.is_some();
        let words = crate::ledger::words_used(&rt.region);
        // Trace rings first, then the rows of threads gone, each drained a
        // last time right before its ack lets a new thread take it.
        self.drain_trace(false);
        let mut trace = self
            .trace
            .as_ref()
            .map(|t| t.lock().unwrap_or_else(|p| p.into_inner()));
        let mut rows = rt.region.harvest(
            slot,
            words,
            |tid| exited || std::fs::metadata(format!("/proc/{pid}/task/{tid}")).is_err(),
            |index| {
                if let Some(log) = trace.as_mut() {
                    log.drain_row(&rt.region, index, true);
                }
            },
        );
        drop(trace);
        let n = rows.len();
        for row in &mut rows {
            self.subtract_baseline(row);
        }
        self.harvested
            .extend(rows.into_iter().filter(|r| r.words.iter().any(|&w| w != 0)));
        n
    }

    /// [`Held::load_library`].
    fn load_library_now(
        &mut self,
        tracer: &mut Tracer,
        path: &std::path::Path,
    ) -> Result<crate::library::Library, Error> {
        let path =
            std::fs::canonicalize(path).map_err(|source| crate::library::LibraryError::Path {
                path: path.to_path_buf(),
                source,
            })?;
        let tid = self.call_thread(tracer)?;
        let handle = crate::library::dlopen(tracer, &mut self.image, tid, &path)?;
        self.image.refresh()?;
        let base = self
            .image
            .modules()
            .iter()
            .find(|m| m.path() == path)
            .map(|m| m.base())
            .ok_or_else(|| crate::library::LibraryError::Dlopen {
                path: path.clone(),
                message: "dlopen returned a handle but the library is not mapped".into(),
            })?;
        Ok(crate::library::Library { path, handle, base })
    }

    /// How many times weft has stopped the whole process so far (each
    /// [`Process::hold`], and each time a remote call let the other threads
    /// run and stopped them again): what a tool checks to know its batch of
    /// changes was applied in one stop. ([`Held::stops`] counts the current
    /// hold's too.)
    pub fn stops(&self) -> u64 {
        self.stops_before
    }

    /// Whether the program has run: false for one [`Process::launch`]
    /// started until its first hold (the stop at its entry) is released.
    pub fn has_run(&self) -> bool {
        self.ever_released
    }

    /// How many times a stop of the world (of the holds ended so far) was
    /// given up because a thread was late to stop, and tried again: the
    /// threads that had stopped ran on instead of waiting for it.
    pub fn stops_given_up(&self) -> u64 {
        self.stops_given_up
    }

    /// How many threads weft found stopped inside the bytes of a patch it
    /// wrote, and moved to the same instruction's copy in the trampoline.
    pub fn threads_moved(&self) -> u64 {
        self.threads_moved
    }

    /// Keeps every stop of the world short, the first one too: the
    /// runtime (loaded by the first insertion) is then loaded with the
    /// other threads running all along, instead of stopped while the
    /// loader computes. The load then competes with them for the CPUs (on
    /// a saturated machine it takes longer), but no thread waits for it:
    /// for a tool that stops the target many times and promises each stop
    /// is short (`weft diagnose`).
    pub fn prefer_short_stops(&mut self) {
        self.load_world = crate::ptrace::World::Running;
    }

    /// The longest time the target's threads were all stopped at once
    /// during the last hold, from the first interrupt to the last thread
    /// resumed ([`Held::longest_stop`]: during the current one).
    pub fn longest_stop(&self) -> Duration {
        self.longest_stop.total
    }

    /// [`Process::longest_stop`], and where its time went: the threads
    /// stopping, weft's work, resuming them.
    pub fn longest_stop_time(&self) -> StopTime {
        self.longest_stop
    }

    /// Reads `len` bytes of the target's memory at `address` (through
    /// `/proc/PID/mem`: the process need not be held, but a running
    /// thread may be changing what is read).
    pub fn read_memory(&self, address: u64, len: usize) -> Result<Vec<u8>, Error> {
        let memory = crate::memory::ProcessMemory::open(self.pid)?;
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
        self.live_for + self.live_since.map_or(Duration::ZERO, |s| s.elapsed())
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

    /// [`Process::report`] with a kernel session's figures added: its
    /// kernel functions and system calls per thread, split by the user
    /// functions of this process the threads were in.
    pub fn report_with_kernel(
        &self,
        kernel: &crate::kernel::Session,
    ) -> Result<Report, crate::kernel::KernelError> {
        let mut report = self.report();
        self.add_kernel_to(&mut report, kernel)?;
        Ok(report)
    }

    /// Adds a kernel session's figures to a report of this process (see
    /// [`Process::report_with_kernel`]).
    pub fn add_kernel_to(
        &self,
        report: &mut Report,
        kernel: &crate::kernel::Session,
    ) -> Result<(), crate::kernel::KernelError> {
        let snapshot = kernel.snapshot()?;
        let pid = self.pid;
        report.add_kernel(
            &snapshot,
            |base| self.function_at_metric_offset(base),
            |tid| crate::report::live_thread_name(pid, tid),
        );
        Ok(())
    }

    /// A report of every probe (active or removed) from a fresh snapshot.
    pub fn report(&self) -> Report {
        let probes: Vec<ProbeInfo> = self
            .probes
            .iter()
            .filter(|p| !self.unreported.contains(&p.id))
            .filter_map(|p| {
                Some(ProbeInfo {
                    name: points::probe_name(p),
                    aliases: match p.point() {
                        Some(_) => Vec::new(),
                        None => p.function.aliases.clone(),
                    },
                    module: p.function.module.clone(),
                    address: p.patch_address,
                    calls_word: p.own_words()?.first,
                    metrics: p.metrics(),
                })
            })
            .collect();
        let overflow = self.runtime.as_ref().map_or(0, |rt| {
            rt.region
                .header()
                .overflow_threads
                .load(std::sync::atomic::Ordering::Relaxed)
        });
        let pid = self.pid;
        let rows = self.snapshot();
        // Traced probes hook their exits without timers. Only in a session
        // that traces: a counting probe that borrows another session's timed
        // one also has a call record, and its report has no exits.
        let hooked: Vec<u32> = self
            .probes
            .iter()
            .filter(|p| self.trace_calls && p.hooks_exit() && !p.metrics().hooks_exit())
            .filter_map(|p| Some(p.own_words()?.first))
            .collect();
        let mut report = Report::build_hooked(
            pid,
            self.live_duration().as_nanos() as u64,
            &probes,
            &rows,
            overflow,
            |tid| crate::report::live_thread_name(pid, tid),
            &hooked,
        );
        let asked = self
            .probes
            .iter()
            .fold(Metrics::CALLS, |m, p| m.union(p.metrics()));
        if let (true, Some(rt)) = (asked.wall || asked.cpu, &self.runtime) {
            let wall = weft_rt::clock::WallClock::in_region(rt.region.header());
            report.clocks = Some(clocks(wall, &rows, asked));
        }
        let (rows_used, rows_reused) = self.row_usage();
        report.runtime = Some(crate::report::RuntimeStats {
            rows_used,
            rows_reused,
        });
        if let Some(trace) = self.trace() {
            report.metrics.push("trace");
            report.trace = Some(trace.with(|log| log.summary()));
            report.trace_log = Some(trace);
        }
        report
    }
}

/// The clock sources behind a report's times, in words.
/// The clocks behind the metrics `asked` (only those: `-m wall` has no CPU
/// clock to speak of).
fn clocks(
    wall: &weft_rt::clock::WallClock,
    rows: &[RowSnapshot],
    asked: Metrics,
) -> crate::report::Clocks {
    let mut cpu: Vec<String> = Vec::new();
    for row in rows {
        let (source, why) = row.cpu_source;
        let text = match source {
            weft_rt::layout::CPU_SOURCE_NONE => continue,
            s => weft_rt::clock::CpuSource::from_mode(s - 1, why).to_string(),
        };
        if !cpu.contains(&text) {
            cpu.push(text);
        }
    }
    crate::report::Clocks {
        wall: asked.wall.then(|| wall.source().to_string()),
        cpu: asked.cpu.then(|| {
            if cpu.is_empty() {
                "none (no thread has a CPU clock)".to_string()
            } else {
                cpu.join("; ")
            }
        }),
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

/// `items` (address, bytes) gathered into runs of neighbours, each the
/// next one's address being where the last one ends: (start, the run's
/// bytes, the items it holds), for one write each.
fn adjacent_runs(items: Vec<(u64, Vec<u8>)>) -> Vec<(u64, Vec<u8>, std::ops::Range<usize>)> {
    let mut runs: Vec<(u64, Vec<u8>, std::ops::Range<usize>)> = Vec::new();
    for (i, (at, bytes)) in items.into_iter().enumerate() {
        match runs.last_mut() {
            Some((start, so_far, members)) if *start + so_far.len() as u64 == at => {
                so_far.extend_from_slice(&bytes);
                members.end = i + 1;
            }
            _ => runs.push((at, bytes, i..i + 1)),
        }
    }
    runs
}

/// Reserves room for `additional` more elements of `v` and touches every
/// page of it, so that filling it later, in a stop of the world, takes no
/// page fault (each costs microseconds on a KVM guest).
fn prefault<T>(v: &mut Vec<T>, additional: usize) {
    v.reserve(additional);
    let spare = v.spare_capacity_mut();
    let len = std::mem::size_of_val(spare);
    let base = spare.as_mut_ptr().cast::<u8>();
    for offset in (0..len).step_by(PAGE as usize) {
        // SAFETY: `offset` is inside the spare capacity just reserved:
        // memory the vector owns and has not initialised; a byte written
        // there is never read as an element.
        unsafe { base.add(offset).write_volatile(0) };
    }
}

fn plan_key(f: &Function) -> (u64, u64, u64) {
    (f.address, f.size, f.padding)
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

/// The most a counter's trampoline for `site` takes of a pool, its record
/// included.
fn counter_room(site: &PatchSite) -> u64 {
    let len = weft_codegen::max_trampoline_len(site, &[Snippet::CountCall { offset: 0 }]) as u64;
    len.div_ceil(16) * 16 + crate::trampolines::RECORD_LEN
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

/// Another session's live probe (directory entry `index`) as this session
/// plans around it: its patch, displaced bytes and words.
fn foreign_probe(index: usize, e: &weft_rt::layout::ProbeEntry) -> Probe {
    let mut original = [0u8; 5];
    original.copy_from_slice(&e.original[..5]);
    let mut patch = [0u8; 5];
    patch.copy_from_slice(&e.patch[..5]);
    let mut compiled = [0u8; 5];
    compiled.copy_from_slice(&e.compiled[..5]);
    let displaced = u64::from(e.displaced.max(5));
    Probe {
        id: ProbeId(u32::MAX),
        function: Function {
            name: format!("{:#x}", e.function),
            module: String::new(),
            module_path: std::path::PathBuf::new(),
            address: e.function,
            vaddr: 0,
            size: 0,
            kind: FunctionKind::Plain,
            source: crate::inspect::SymbolSource::Symtab,
            padding: 0,
            aliases: Vec::new(),
        },
        patch_address: e.patch_address,
        original,
        patch,
        compiled,
        relocated: e.relocated,
        trampoline: e.trampoline..e.trampoline + e.trampoline_len,
        active: true,
        displaced: e.patch_address..e.patch_address + displaced,
        kind: if e.kind == weft_rt::layout::KIND_MEASURE {
            ProbeKind::Measure {
                metrics: Metrics {
                    wall: e.metrics & weft_rt::layout::METRIC_WALL != 0,
                    cpu: e.metrics & weft_rt::layout::METRIC_CPU != 0,
                    histogram: e.metrics & weft_rt::layout::METRIC_HISTOGRAM != 0,
                },
                words: Words::fresh(e.first_word, e.words),
                record: crate::ledger::record_of(e),
            }
        } else {
            ProbeKind::Private {
                point: (e.function != e.patch_address).then_some(e.function),
            }
        },
        entry: Some(index),
        borrowed: true,
    }
}

/// The directory entry of `probe`, owned by `owners`. Only a probe that
/// just measures a function's entry may be shared by another session.
fn directory_entry(
    probe: &Probe,
    owners: u32,
    private: bool,
    traced: bool,
) -> weft_rt::layout::ProbeEntry {
    use weft_rt::layout as l;
    let shareable = matches!(probe.kind, ProbeKind::Measure { .. }) && !private;
    let metrics = probe.metrics();
    let words = probe.words().copied().unwrap_or(Words::fresh(0, 0));
    let mut original = [0u8; 8];
    original[..5].copy_from_slice(&probe.original);
    let mut patch = [0u8; 8];
    patch[..5].copy_from_slice(&probe.patch);
    let mut compiled = [0u8; 8];
    compiled[..5].copy_from_slice(&probe.compiled);
    l::ProbeEntry {
        state: l::PROBE_LIVE,
        owners,
        kind: if shareable {
            l::KIND_MEASURE
        } else {
            l::KIND_PRIVATE
        },
        metrics: if metrics.wall { l::METRIC_WALL } else { 0 }
            | if metrics.cpu { l::METRIC_CPU } else { 0 }
            | if metrics.keeps_histogram() {
                l::METRIC_HISTOGRAM
            } else {
                0
            }
            | if traced { l::METRIC_TRACE } else { 0 },
        first_word: words.first,
        words: words.len,
        record: probe.record().unwrap_or(l::NO_RECORD),
        displaced: u16::try_from(probe.displaced.end - probe.displaced.start).unwrap_or(u16::MAX),
        relocated: probe.relocated,
        function: probe.point().unwrap_or(probe.function.address),
        patch_address: probe.patch_address,
        trampoline: probe.trampoline.start,
        trampoline_len: probe.trampoline.end - probe.trampoline.start,
        original,
        patch,
        compiled,
    }
}

/// Writes every probe's `jmp`, the world stopped: one read and one
/// `pwrite` per page of patches (a write within a page is done whole or
/// not at all, even if weft is killed; a patch across a page boundary gets
/// its own write). First checks that the bytes each patch displaces are
/// still `originals` (they were read when planned, perhaps while the
/// target ran): if any changed, nothing is written. If a write fails, the
/// pages already written are put back. The error says whether a patch may
/// remain (only if putting a page back failed too).
fn splice(
    memory: &crate::memory::ProcessMemory,
    probes: &[Probe],
    originals: &[&[u8]],
    fail_after: usize,
) -> Result<(), (Error, bool)> {
    let mut order: Vec<usize> = (0..probes.len()).collect();
    order.sort_by_key(|&i| probes[i].patch_address);
    // Groups of probes (ranges of `order`) whose patches lie in one page.
    let page_of = |i: usize| {
        let at = probes[i].patch_address;
        (at / PAGE == (at + 4) / PAGE).then_some(at / PAGE)
    };
    let mut groups: Vec<std::ops::Range<usize>> = Vec::new();
    for (k, &i) in order.iter().enumerate() {
        match groups.last_mut() {
            Some(g) if page_of(i).is_some() && page_of(order[g.start]) == page_of(i) => {
                g.end = k + 1
            }
            _ => groups.push(k..k + 1),
        }
    }
    // Read and check every group first: nothing is written unless all the
    // code is as planned.
    let mut pages = Vec::with_capacity(groups.len());
    let mut changed = Vec::new();
    for g in &groups {
        let members = &order[g.clone()];
        let lo = probes[members[0]].patch_address;
        let hi = members
            .iter()
            .map(|&i| probes[i].patch_address + originals[i].len().max(5) as u64)
            .max()
            .expect("groups are not empty");
        let current = memory
            .read_vec(lo, (hi - lo) as usize)
            .map_err(|e| (e.into(), false))?;
        let mut patched = current.clone();
        for &i in members {
            let off = (probes[i].patch_address - lo) as usize;
            if current[off..off + originals[i].len()] != *originals[i] {
                changed.push(Refused {
                    function: probes[i].function.clone(),
                    reason: "its code changed while weft prepared the patch (another tool, or \
                             a library loaded again?): nothing was changed; try again"
                        .into(),
                });
            }
            patched[off..off + 5].copy_from_slice(&probes[i].patch);
        }
        // Only up to the last patched byte: the rest was read to check.
        let end = members
            .iter()
            .map(|&i| probes[i].patch_address + 5)
            .max()
            .expect("groups are not empty");
        let len = (end - lo) as usize;
        pages.push((lo, current[..len].to_vec(), patched[..len].to_vec()));
    }
    if !changed.is_empty() {
        return Err((Error::Refused(changed), false));
    }
    for (k, (lo, _, patched)) in pages.iter().enumerate() {
        // (A test's injected failure: the page write after `fail_after`.)
        let written = if k >= fail_after {
            Err(crate::memory::MemoryError::Access {
                op: "write",
                pid: 0,
                address: *lo,
                len: patched.len(),
                source: std::io::Error::other("a failure a test injected"),
            })
        } else {
            memory.write(*lo, patched)
        };
        if let Err(e) = written {
            // Undo: the target must never keep half an insertion.
            let kept = pages[..k]
                .iter()
                .any(|(lo, original, _)| memory.write(*lo, original).is_err());
            return Err((e.into(), kept));
        }
    }
    Ok(())
}

/// The refusals among `refused` (by request index) that fail the whole
/// request: those of functions `required` says were named exactly.
fn must_refuse(
    requests: &[std::borrow::Cow<ProbeSpec>],
    refused: Vec<(usize, Refusal)>,
    required: &dyn Fn(&Function) -> bool,
) -> Vec<Refused> {
    refused
        .into_iter()
        .filter(|(k, _)| required(&requests[*k].function))
        .map(|(k, why)| Refused {
            function: requests[k].function.clone(),
            reason: why.to_string(),
        })
        .collect()
}

impl Drop for Process {
    fn drop(&mut self) {
        // A program weft launched that is still stopped at its entry
        // (never released): instrumenting it failed or was never done, so
        // it must not run at all (the user asked for it to run
        // instrumented). It is our child, not reaped yet.
        if let Some(tracer) = self.entry_stop.take() {
            crate::launch::kill_stopped(self.pid, tracer);
        }
        // Otherwise there is nothing to let go of: the tracer lived in a
        // `Held`, which released the process when it ended.
    }
}

#[cfg(test)]
mod tests {
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
