//! The driver: runs a [`Search`] on a live process — instruments each test
//! when it starts, reads it with a [`Sampler`], removes what a concluded
//! test no longer needs.
//!
//! A test is one hypothesis, one thread and one call path. Its value is a
//! share of the thread's elapsed time inside the path's last function: on
//! the CPU (its inclusive CPU timer) for the CPU-bound hypothesis, off the
//! CPU (wall minus CPU) for synchronization and I/O, whose refinement only
//! follows callees that reach a wait primitive of their class
//! (`graph::SYNC_FUNCTIONS`, `graph::IO_FUNCTIONS`), down to the primitive
//! itself. Roots are `main` and each thread's start routine. A function's
//! probe (wall and CPU timers) is shared by every test of it, so the
//! instrumentation is bounded by functions, not by tests.

use super::cost::Cost;
use super::decision::{Hypothesis, HypothesisName, Reading, Thresholds, Verdict, MAX_CUSTOM};
use super::graph::StaticCallGraph;
use super::roots::{
    add_thread_paths, count_module, stack_edges, thread_paths, OpenFrame, Stops, SNAPSHOTS,
};
use super::search::{Change, NodeId, Search, Setback, State};
use super::waits::{self, WaitSampler};
use crate::inspect::{procfs, Pattern};
use crate::sample::Sampler;
use crate::{Error, Function, Metrics, PointSpec, ProbeId, ProbeSpec, Process};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

mod arming;
mod clocks;
mod probes;
use probes::{LiveProbe, ProbeKey};

/// How a diagnosis runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// The decision parameters.
    pub thresholds: Thresholds,
    /// Most functions instrumented at once.
    pub max_probes: usize,
    /// Time between two readings.
    pub interval: Duration,
    /// The hypotheses tested.
    pub hypotheses: Vec<Hypothesis>,
    /// Most the instrumentation may cost, as a share of the target's CPU
    /// time (0.05): a probe whose calls alone would cost more is taken
    /// out and its tests skipped; no test starts while the total is over.
    pub max_overhead: f64,
    /// Report waits at the top of a thread's loop as bottlenecks too.
    pub report_idle: bool,
    /// A tool's own hypotheses, tested next to `hypotheses` (at most
    /// [`MAX_CUSTOM`]).
    pub custom: Vec<CustomHypothesis>,
}

/// A tool's own hypothesis: "the threads spend too much of their time in
/// these functions" — an allocator, a logging layer, a client library's
/// calls. Tested and refined like the built-in ones: from the roots down
/// through the callees that reach one of the functions, to the function
/// itself; a bottleneck ends at one of them.
#[derive(Clone, Debug, PartialEq)]
pub struct CustomHypothesis {
    /// Its name in reports (`alloc`).
    pub name: String,
    /// The functions whose time it counts (names as `weft list` shows
    /// them; library functions too).
    pub functions: Vec<String>,
    /// Which time.
    pub measure: Measure,
    /// Share of a thread's time above which it holds.
    pub threshold: f64,
}

/// Which of a thread's time a custom hypothesis counts in a function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measure {
    /// All of it (on and off the CPU).
    Wall,
    /// On the CPU.
    Cpu,
    /// Off the CPU (blocked, sleeping).
    OffCpu,
}

impl Measure {
    /// The part of (wall, CPU) this counts.
    fn part(self, wall: u64, cpu: u64) -> u64 {
        match self {
            Measure::Wall => wall,
            Measure::Cpu => cpu,
            Measure::OffCpu => wall.saturating_sub(cpu),
        }
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            thresholds: Thresholds::default(),
            max_probes: 64,
            interval: Duration::from_millis(200),
            hypotheses: vec![
                Hypothesis::CpuBound,
                Hypothesis::SyncWaiting,
                Hypothesis::IoBlocking,
            ],
            max_overhead: 0.05,
            report_idle: false,
            custom: Vec::new(),
        }
    }
}

/// What the driver tells its caller as it goes.
#[derive(Clone, Debug, PartialEq)]
pub enum Progress {
    /// Tests started (hypothesis name, path, thread).
    Testing(Vec<(HypothesisName, Vec<String>, u32)>),
    /// A test concluded: (hypothesis, path, thread, true?, value).
    Concluded(HypothesisName, Vec<String>, u32, bool, f64),
    /// A function's probe was taken out because it costs too much: (its
    /// name, its share of the target's CPU).
    TooCostly(String, f64),
    /// The CPU clocks alone cost more than the bound: (their share of the
    /// target's CPU, the switches a second of the threads that have one).
    /// Said once; no test starts while it lasts.
    ClocksCostly(f64, f64),
}

/// One bottleneck: a deepest true test, the threads it holds for.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Bottleneck {
    /// `cpu`, `sync`, `io` or a custom hypothesis's name.
    pub hypothesis: HypothesisName,
    /// The call path from a root.
    pub path: Vec<String>,
    /// The path's last function.
    pub function: String,
    /// The threads it holds for.
    pub threads: Vec<u32>,
    /// The largest of those threads' values (share of their time).
    pub value: f64,
    /// What the threads wait on, for a wait: the futex word (a mutex's or
    /// condition variable's address, `0x…`) or the file descriptor with
    /// its path or TCP peer (`fd 7 /var/cache/x`) they were most often
    /// sampled blocked on; null for CPU.
    pub object: Option<String>,
    /// For I/O: the bytes a sampled transfer asked for, on average (a
    /// small figure with a high call rate is Paradyn's "too many small
    /// I/O operations").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_per_call: Option<u64>,
    /// Calls of the function per second, all its threads, while tested.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calls_per_s: Option<f64>,
    /// When `value` was measured: from and to, in seconds of the
    /// machine's `CLOCK_MONOTONIC` (what `clock_gettime(CLOCK_MONOTONIC)`
    /// reads in the target too), so that it can be set beside the
    /// program's own figures. From the test's start while it was testing,
    /// the last observation window once true.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured: Option<[f64; 2]>,
    /// Paradyn's refinement of I/O blocking: "too many small I/O
    /// operations" — under [`SMALL_IO_BYTES`] a transfer on average, more
    /// than [`SMALL_IO_RATE`] calls a second.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub small_io: bool,
    /// The threads' names (`/proc/PID/task/TID/comm`), in `threads`'
    /// order.
    pub thread_names: Vec<String>,
    /// Other call paths to the same function that hold for the same
    /// threads and object (an interpreter recursing through its eval
    /// loop reaches one wait by several): `path` is the shortest.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub also_via: Vec<Vec<String>>,
}

/// Bytes under which a transfer is small.
pub const SMALL_IO_BYTES: u64 = 4096;
/// Calls a second over which small transfers are too many.
pub const SMALL_IO_RATE: f64 = 100.0;

/// Where a reported test stands (JSON: its name in lower case).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TestState {
    /// Concluded true (and still true at the end).
    True,
    /// Concluded false, or fell.
    False,
    /// Measured, not concluded yet.
    Testing,
    /// Waiting for its turn.
    Queued,
    /// Put off (the overhead bound, or a probe that cannot go in yet).
    Deferred,
    /// Not to be tested (see its reason).
    Skipped,
}

/// A test as reported.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct NodeReport {
    /// `cpu`, `sync`, `io` or a custom hypothesis's name.
    pub hypothesis: HypothesisName,
    /// The call path.
    pub path: Vec<String>,
    /// The thread.
    pub thread: u32,
    /// Where the test stands.
    pub state: TestState,
    /// The latest value, when measured.
    pub value: Option<f64>,
    /// The threshold it was compared with.
    pub threshold: f64,
    /// Why it was deferred or skipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<Setback>,
    /// For a test that was true and fell: when it was true, in seconds
    /// from the test's start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub was_true: Option<(f64, f64)>,
    /// When it was first read, in seconds from the search's start (a
    /// thread's root: when it was taken as true); none if never measured.
    pub began: Option<f64>,
    /// When it concluded true, in seconds from the search's start.
    pub true_at: Option<f64>,
    /// When it concluded false, fell, or was taken out, in seconds from
    /// the search's start; none if it was still testing or true at the end.
    pub ended: Option<f64>,
}

/// What the search did, in numbers.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Summary {
    /// Tests started.
    pub tests: usize,
    /// Most functions instrumented at once.
    pub peak_probes: usize,
    /// Functions instrumented at some point.
    pub functions_probed: usize,
    /// Functions of the modules the search entered (the executable, and the
    /// libraries a probed function or an open frame is in): what full
    /// instrumentation of those modules would probe.
    pub functions_reachable: usize,
    /// Functions of the executable (what `-f 'exe:*'` would probe).
    pub executable_functions: usize,
    /// Times the search stopped the target's threads (to walk stacks, put
    /// probes in, take them out).
    pub stops: usize,
    /// The longest of those stops, ms.
    pub longest_stop_ms: f64,
    /// What it was for (`inserting probes`, `walking stacks`…).
    pub longest_stop_for: String,
    /// Of the longest stop: ms until every thread had stopped (the
    /// kernel scheduling each interrupted thread to its stop).
    pub longest_stop_stopping_ms: f64,
    /// Of the longest stop: ms resuming the threads.
    pub longest_stop_resuming_ms: f64,
    /// Of the longest stop: CPU ms weft's own work took (what neither the
    /// kernel's scheduling nor a hypervisor lengthens).
    pub longest_stop_weft_cpu_ms: f64,
    /// Of the longest stop: ms in calls weft made in the target with the
    /// other threads stopped (the calling thread must get a CPU to run
    /// them).
    pub longest_stop_remote_calls_ms: f64,
    /// Stops given up and tried again because a thread was late to stop
    /// (see `Process::stops_given_up`): the others ran on meanwhile.
    pub stops_given_up: u64,
    /// Stack walks made to learn where indirect calls go that weft cannot
    /// arm (under a wait the tests below do not account for).
    pub stack_walks: usize,
    /// For a program the search started (`weft diagnose -- PROGRAM`): ms
    /// it was held at its entry before it first ran, while weft read its
    /// symbols and loaded the runtime. Not one of the stops above: none
    /// of the program's code had run, so none of its work waited. `null`
    /// for a process that was already running.
    pub start_held_ms: Option<f64>,
    /// Whether the search ran out of tests (else it was cut short).
    pub exhausted: bool,
    /// How long the search has run, s.
    pub seconds: f64,
    /// What the instrumentation cost, as a share of the target's CPU time
    /// while the search ran: calls counted × the measured cost of a timed
    /// call, and the threads' CPU clocks (a system call at each reading of
    /// a clock without a perf event; at each switch of a thread with one,
    /// the event's cost and the first reading's re-anchoring). What
    /// `--max-overhead` bounds.
    pub overhead: f64,
    /// Of `overhead`, what the clocks' perf events cost at the switches of
    /// the threads that had one (every switch × `cost_per_switch_event_ns`;
    /// on the CPU-time table, its `sched_switch` program at every switch of
    /// the target's threads, which no probe taken out lowers).
    pub clock_overhead: f64,
    /// The measured cost of a CPU clock reading by system call, ns: what a
    /// thread whose clock has no perf event pays twice a timed call.
    pub cost_per_clock_syscall_ns: f64,
    /// The threads whose CPU clocks were paused at some point of the
    /// search, their clocks costing too much either way: their values
    /// were sampled meanwhile (docs/diagnose.md).
    pub clocks_paused: Vec<u32>,
    /// The measured cost of one timed call, ns.
    pub cost_per_call_ns: f64,
    /// The measured cost of a timer's first CPU clock reading after its
    /// thread was switched in, ns (a system call, a vDSO read on the
    /// CPU-time table, 0 where the perf page gives the time).
    pub cost_per_switch_ns: f64,
    /// The measured cost to a thread at every context switch of its CPU
    /// clock's perf event, or of the CPU-time table's program, ns (0
    /// where the clock has neither).
    pub cost_per_switch_event_ns: f64,
    /// Functions weft refused to time (so their tests were given up), by
    /// the kind of reason (`Refusal::kind`): all of a Go program's code,
    /// a `.cold` part, code another jump enters.
    pub refused: BTreeMap<String, usize>,
    /// One of those refusals in full (`function: reason`), for the user.
    pub refused_example: Option<String>,
    /// What of the program weft cannot time at all, known before the
    /// search (a Go executable), said whatever the search reached.
    pub cannot_time: Option<String>,
}

/// A bottleneck's identity: its hypothesis and call path.
type PathKey = (HypothesisName, Vec<String>);

/// The diagnosis.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Diagnosis {
    /// The deepest true tests, grouped by path.
    pub bottlenecks: Vec<Bottleneck>,
    /// Waits at the top of a thread's loop (a wait primitive called by the
    /// thread's start routine itself: a pool thread waiting for work):
    /// idle time, not a bottleneck, unless [`Options::report_idle`].
    pub idle: Vec<Bottleneck>,
    /// Counts.
    pub summary: Summary,
    /// Every test made.
    pub nodes: Vec<NodeReport>,
    /// The tested threads' names (as they were at their first test).
    pub threads: BTreeMap<u32, String>,
}

/// Start of one test's reading: when its probe's values were first seen.
#[derive(Clone, Copy, Debug)]
struct Baseline {
    at: Instant,
    part_ns: u64,
    /// The thread's time waiting for a CPU so far (schedstat).
    run_delay_ns: u64,
    /// The function's calls by the thread so far.
    calls: u64,
    /// The thread's CPU time so far (schedstat), ns.
    thread_cpu_ns: u64,
    /// The thread's wait samples so far: (all, sync, I/O).
    waits: (u64, u64, u64),
    /// The function's CPU time on the thread so far, ns.
    cpu_ns: u64,
}

/// A search running on a process.
pub struct Consultant {
    options: Options,
    search: Search,
    graph: StaticCallGraph,
    /// Functions of each module the search entered (the executable, and
    /// the libraries a probed function or an open frame is in): what full
    /// instrumentation of those modules would probe.
    module_functions: BTreeMap<std::path::PathBuf, usize>,
    executable_functions: usize,
    cannot_time: Option<String>,
    /// The stops of the world the search made.
    stops: Stops,
    /// The executable's functions by entry address (to recognize a
    /// thread's start routine).
    entries: HashMap<u64, String>,
    /// Threads whose roots were looked for.
    known_threads: BTreeSet<u32>,
    /// The bookkeeping of what the instrumentation costs.
    cost: Cost,
    /// Live probes, with the tests that read them.
    probes: HashMap<ProbeKey, LiveProbe>,
    /// The probe each test reads (a test's constraint is its parent's
    /// probe).
    node_probe: HashMap<NodeId, ProbeKey>,
    probed_ever: BTreeSet<String>,
    /// Functions tests named that are nowhere in the process.
    not_found: BTreeSet<String>,
    /// Functions whose probe was taken out as too costly, with the share
    /// their calls cost: a later test of one (another thread, another
    /// path) is skipped at once, not probed again (on CPython the same
    /// allocator function went in and out 285 times in a minute, and each
    /// trial cost the target its calls' time until it was read).
    too_costly: HashMap<String, f64>,
    /// Whether [`Progress::ClocksCostly`] was said.
    said_clocks: bool,
    /// Functions weft refused to time: (kind of reason, reason).
    refused: BTreeMap<String, (&'static str, String)>,
    peak_probes: usize,
    baselines: HashMap<NodeId, Baseline>,
    sampler: Sampler,
    tests: usize,
    /// Callers whose indirect call sites record their targets: the points
    /// (until disarmed: `consultant/arming.rs`).
    armed: HashMap<String, Vec<ProbeId>>,
    /// Callers turned true since the last step, to arm.
    to_arm: BTreeSet<String>,
    /// When each caller was armed: its targets count as known once it has
    /// been watched for the minimum observation time.
    armed_at: HashMap<String, Instant>,
    /// Functions with an indirect call site weft cannot arm, and how many
    /// stack walks were spent learning where it goes
    /// ([`Consultant::learn_from_stacks`]).
    unarmable: HashMap<String, usize>,
    /// A true wait there is still unexplained and walks are left.
    walks_pending: bool,
    /// Tests of frames seen open on their thread's stack.
    open: HashMap<NodeId, OpenFrame>,
    /// Each test's calls per second of its function, latest reading.
    call_rates: HashMap<NodeId, f64>,
    /// Each test's function's share of its thread's time on the CPU,
    /// latest reading.
    cpu_shares: HashMap<NodeId, f64>,
    /// What the threads are blocked in, sampled.
    waits: WaitSampler,
    /// The threads whose CPU clocks were paused at some point.
    paused_ever: BTreeSet<u32>,
    pid: i32,
    /// When the search began: the timeline's origin.
    started: Instant,
    /// The same moment in `CLOCK_MONOTONIC` seconds (for
    /// [`Bottleneck::measured`]).
    started_monotonic: f64,
    /// When each node was created, measured, concluded, by [`NodeId`].
    history: Vec<NodeTimes>,
    /// The tested threads' names, read when their first test appeared.
    thread_names: BTreeMap<u32, String>,
}

/// A test's moments, from the search's start.
#[derive(Clone, Copy, Debug, Default)]
struct NodeTimes {
    /// Its first reading: the probe's values were first seen.
    began: Option<Duration>,
    /// It concluded true (a thread's root: when it was taken as true).
    true_at: Option<Duration>,
    /// It concluded false, fell, or was taken out.
    ended: Option<Duration>,
}

/// How often the threads' waits are sampled.
const WAIT_SAMPLE_PERIOD: Duration = Duration::from_millis(5);

/// How long after its insertion a probe's cost is first looked at.
const FIRST_LOOK: Duration = Duration::from_millis(20);

/// Most functions instrumented in one stop of the world (call sites armed:
/// twice as many). A stop that inserts costs ~1.5 ms however small, and
/// ~0.5 ms a function more on this machine: three keep it near 3 ms, under
/// the 5 ms a search promises.
const FUNCTIONS_PER_STOP: usize = 3;

/// Targets one armed indirect call site records per thread.
const TARGET_SLOTS: u32 = 8;

/// Stack walks spent at most on one function's unarmable indirect calls
/// (see [`Consultant::learn_from_stacks`]): a thread waiting there a third
/// of its time is caught by one of eight walks with odds of 96%, one of
/// two such threads 99.8%.
const STACK_WALKS: usize = 8;

/// What every test's probe measures: CPU time for the CPU-bound
/// hypothesis, wall minus CPU (time off the CPU, waiting) for the others;
/// one probe per function serves every hypothesis.
const TIMERS: Metrics = Metrics {
    wall: true,
    cpu: true,
    histogram: false,
};

impl Consultant {
    /// Prepares a CPU-bound search of `process`'s executable, for the
    /// threads it has now.
    pub fn new(process: &mut Process, mut options: Options) -> Result<Consultant, Error> {
        if options.custom.len() > MAX_CUSTOM {
            return Err(Error::Internal(format!(
                "{} custom hypotheses: at most {MAX_CUSTOM} can be tested at once",
                options.custom.len()
            )));
        }
        for (i, c) in options.custom.iter().enumerate() {
            options.thresholds.custom[i] = c.threshold;
            let h = Hypothesis::Custom(i as u8);
            if !options.hypotheses.contains(&h) {
                options.hypotheses.push(h);
            }
        }
        // A search stops the target many times, each stop short: the
        // runtime's load too.
        process.prefer_short_stops();
        // Its phases take every probe out and put new ones in: the threads'
        // clocks keep their perf events until `finish`.
        process.keep_cpu_clocks(true);
        // Its tests time CPU: the CPU-time table is made now, not in the
        // stop that installs the first timer.
        process.prepare_cpu_clocks();
        let functions = process.find_functions(&[Pattern::parse("exe:*")
            .map_err(|e| Error::Internal(format!("the executable's pattern: {e}")))?])?;
        let mut graph = StaticCallGraph::new();
        graph.set_custom_classes(
            options
                .custom
                .iter()
                .map(|c| c.functions.iter().cloned().collect())
                .collect(),
        );
        for f in &functions {
            graph.explore(process.image(), f);
        }
        let entries: HashMap<u64, String> = functions
            .iter()
            .map(|f| (f.address, f.name.clone()))
            .collect();
        let mut known_threads = BTreeSet::new();
        let mut stops = Stops::default();
        // The runtime, then the exit code the timers need, each in a stop
        // of its own: the first test's insertion is then as short as any.
        if process.has_run() {
            for metrics in [Metrics::CALLS, TIMERS] {
                let mut held = process.hold()?;
                held.load_runtime(metrics)?;
                held.release()?;
                stops.note(process, "loading the runtime");
            }
        } else {
            // A program weft started, still at its entry: none of its
            // code has run, so nothing waits here; both steps go in this
            // one hold, which delays the program's start but pauses none
            // of its work (reported apart from the stops).
            let mut held = process.hold()?;
            held.load_runtime(Metrics::CALLS)?;
            held.load_runtime(TIMERS)?;
            held.release()?;
            stops.start_held = Some(process.longest_stop());
        }
        let found = thread_paths(process, &entries, &mut known_threads, SNAPSHOTS, &mut stops)?;
        let mut search = Search::new(options.thresholds, &options.hypotheses, &[]);
        let mut module_functions = BTreeMap::new();
        if let Some(exe) = functions.first() {
            module_functions.insert(exe.module_path.clone(), functions.len());
        }
        let open = add_thread_paths(&mut search, &mut graph, process, found, &options.hypotheses);
        // Said up front, whatever the search reaches before it ends.
        let cannot_time = process
            .image()
            .executable()
            .filter(|m| m.image().is_ok_and(|elf| elf.is_go()))
            .map(|m| {
                format!(
                    "{} is Go code, which weft cannot time (Go's runtime aborts on the return \
                     address a timer replaces): its functions' tests are given up, and only \
                     waits in C libraries are measured",
                    m.name()
                )
            });
        for id in open.keys() {
            if let Some(f) = graph.function(search.node(*id).focus.function()) {
                count_module(process, &mut module_functions, f);
            }
        }
        Ok(Consultant {
            options,
            search,
            graph,
            module_functions,
            executable_functions: functions.len(),
            cannot_time,
            stops,
            entries,
            known_threads,
            cost: Self::clock_costs(process),
            probes: HashMap::new(),
            node_probe: HashMap::new(),
            probed_ever: BTreeSet::new(),
            not_found: BTreeSet::new(),
            too_costly: HashMap::new(),
            said_clocks: false,
            refused: BTreeMap::new(),
            peak_probes: 0,
            baselines: HashMap::new(),
            sampler: Sampler::new(),
            tests: 0,
            armed: HashMap::new(),
            to_arm: BTreeSet::new(),
            armed_at: HashMap::new(),
            unarmable: HashMap::new(),
            walks_pending: false,
            open,
            call_rates: HashMap::new(),
            cpu_shares: HashMap::new(),
            waits: WaitSampler::start(process.pid(), WAIT_SAMPLE_PERIOD),
            paused_ever: BTreeSet::new(),
            pid: process.pid(),
            started: Instant::now(),
            started_monotonic: crate::events::monotonic_ns() as f64 * 1e-9,
            history: Vec::new(),
            thread_names: BTreeMap::new(),
        }
        .noting_new_nodes())
    }

    /// The costs of the target's clocks, and its threads' CPU clocks
    /// chosen one by one where they are perf events: an event costs its
    /// thread at every context switch (2.4 µs on a KVM guest), a system
    /// call at every reading (0.5 µs). A thread starts with an event (its
    /// cost is bounded by the thread's switches, a system call's by its
    /// timed calls); one whose switches cost more than its readings would
    /// (memcached's workers, woken at every request) lets it go, and gets
    /// one again if its calls come to cost more.
    fn clock_costs(process: &mut Process) -> Cost {
        let perf = process.cpu_table_refused().is_some();
        let mut cost = Cost::new(process.pid(), !perf);
        // `WEFT_CPU_CLOCK=perf`: an event for every thread, as `attach`.
        let every_thread = std::env::var_os("WEFT_CPU_CLOCK").is_some_and(|v| v == "perf");
        if perf && !every_thread {
            process.choose_cpu_clocks(true);
            cost.choose_clocks();
        }
        cost
    }

    /// A hypothesis's name in reports (a custom one's own name).
    fn name_of(&self, h: Hypothesis) -> HypothesisName {
        match h {
            Hypothesis::CpuBound => HypothesisName::Cpu,
            Hypothesis::SyncWaiting => HypothesisName::Sync,
            Hypothesis::IoBlocking => HypothesisName::Io,
            Hypothesis::Custom(i) => HypothesisName::from_name(
                self.options
                    .custom
                    .get(usize::from(i))
                    .map_or(h.name(), |c| &c.name),
            ),
        }
    }

    /// A test's part of its function's time under `hypothesis`: from its
    /// timers' (wall, CPU) ns, or from the samples `inside` it on a thread
    /// whose clock is paused.
    fn part_of(
        &self,
        hypothesis: Hypothesis,
        (wall, cpu): (u64, u64),
        inside: Option<waits::Inside>,
    ) -> u64 {
        match (hypothesis, inside) {
            (Hypothesis::CpuBound, Some(i)) => i.cpu_ns,
            (Hypothesis::SyncWaiting, Some(i)) => i.sync_ns,
            (Hypothesis::IoBlocking, Some(i)) => i.io_ns,
            (Hypothesis::Custom(k), Some(i)) => self.measure_of(k).part(i.wall_ns, i.cpu_ns),
            (Hypothesis::CpuBound, None) => cpu,
            // Off the CPU inside the function: waiting (refinement
            // narrows it to the primitive that waits).
            (Hypothesis::SyncWaiting | Hypothesis::IoBlocking, None) => wall.saturating_sub(cpu),
            (Hypothesis::Custom(k), None) => self.measure_of(k).part(wall, cpu),
        }
    }

    /// What custom hypothesis `i` measures.
    fn measure_of(&self, i: u8) -> Measure {
        self.options
            .custom
            .get(usize::from(i))
            .map_or(Measure::Wall, |c| c.measure)
    }

    /// Whether the search has nothing left to test.
    pub fn exhausted(&self) -> bool {
        let settled = self
            .armed_at
            .values()
            .all(|at| at.elapsed() >= self.options.thresholds.min_observation);
        self.search.exhausted() && self.to_arm.is_empty() && settled && !self.walks_pending
    }

    /// One round: starts what the budget allows (one stop for the batch),
    /// reads every running test, removes the probes concluded tests no
    /// longer need (one stop). Returns what happened.
    pub fn step(&mut self, process: &mut Process) -> Result<Vec<Progress>, Error> {
        let mut progress = Vec::new();
        self.adopt_new_threads(process)?;
        self.note_nodes();
        let inserted = self.start_tests(process, &mut progress)?;
        if inserted > 0 {
            // A new probe's cost is known only once it counts: look after
            // a moment, so that one called millions of times a second costs
            // the target milliseconds, not a whole interval.
            std::thread::sleep(FIRST_LOOK);
            self.sample_and_count(process);
            self.drop_costly(&mut progress);
            self.retire_probes(process)?;
        }
        self.read_tests(process, &mut progress);
        self.drop_costly(&mut progress);
        let (clocks, switches) = self.cost.clock_share();
        // (Chosen clocks answer to the bound like probes: see `Cost`.)
        if clocks > self.options.max_overhead && !self.said_clocks && !self.cost.chosen() {
            self.said_clocks = true;
            progress.push(Progress::ClocksCostly(clocks, switches));
        }
        self.learn_targets(process);
        self.disarm_callers(process)?;
        self.learn_from_stacks(process)?;
        self.arm_callers(process)?;
        self.retire_probes(process)?;
        self.note_nodes();
        Ok(progress)
    }

    fn noting_new_nodes(mut self) -> Self {
        self.note_nodes();
        self
    }

    /// The timeline's bookkeeping: nodes new since the last call (a root
    /// taken as true is true from now), and tests taken out (deferred,
    /// skipped) after they began.
    fn note_nodes(&mut self) {
        let now = self.started.elapsed();
        let nodes = self.search.nodes();
        while self.history.len() < nodes.len() {
            let node = &nodes[self.history.len()];
            for &tid in &node.focus.threads {
                if !self.thread_names.contains_key(&tid) {
                    if let Some(name) = procfs::thread_name(self.pid, tid) {
                        self.thread_names.insert(tid, name);
                    }
                }
            }
            let assumed = node.is_true();
            self.history.push(NodeTimes {
                began: assumed.then_some(now),
                true_at: assumed.then_some(now),
                ended: None,
            });
        }
        for (node, times) in nodes.iter().zip(self.history.iter_mut()) {
            if times.began.is_some()
                && times.ended.is_none()
                && matches!(node.state, State::Deferred(_) | State::Skipped(_))
            {
                times.ended = Some(now);
            }
        }
    }

    /// Threads started since the last step get their roots (one short
    /// stop to read their thread pointers), taken as true at once.
    fn adopt_new_threads(&mut self, process: &mut Process) -> Result<(), Error> {
        if procfs::thread_ids(process.pid()).is_subset(&self.known_threads) {
            return Ok(());
        }
        // One walk: a new thread's frames are not watched long enough to
        // call them open, only its root is taken as true.
        let found = thread_paths(
            process,
            &self.entries,
            &mut self.known_threads,
            1,
            &mut self.stops,
        )?;
        let open = add_thread_paths(
            &mut self.search,
            &mut self.graph,
            process,
            found,
            &self.options.hypotheses,
        );
        self.open.extend(open);
        Ok(())
    }

    fn read_tests(&mut self, process: &mut Process, progress: &mut Vec<Progress>) {
        let now = Instant::now();
        let values = self.sample_and_count(process);
        let waits = self.waits.snapshot();
        let mut schedstats: HashMap<u32, (u64, u64)> = HashMap::new();
        for id in self.search.testing() {
            let node = self.search.node(id);
            let key = self.node_probe.get(&id);
            let Some(probe) = key.and_then(|k| self.probes.get(k)).map(|p| p.id) else {
                continue;
            };
            let tid = node.focus.threads.first().copied().unwrap_or(0);
            let (wall, cpu, calls) = values.get(&(tid, probe)).copied().unwrap_or((0, 0, 0));
            // A thread whose CPU clock is paused: its timers read no CPU
            // time, and the samples tell what it did inside the function.
            let inside = self
                .cost
                .is_paused(tid)
                .then(|| waits.get(&tid).and_then(|w| w.inside.get(&probe)).copied())
                .map(Option::unwrap_or_default);
            let part = self.part_of(node.hypothesis, (wall, cpu), inside);
            let cpu = inside.map_or(cpu, |i| i.cpu_ns);
            let (run_delay, thread_cpu) = *schedstats
                .entry(tid)
                .or_insert_with(|| procfs::schedstat(process.pid(), tid));
            let sampled = waits
                .get(&tid)
                .map_or((0, 0, 0), |w| (w.samples, w.sync, w.io));
            if let Some(t) = self.history.get_mut(id.0) {
                t.began
                    .get_or_insert(now.saturating_duration_since(self.started));
            }
            let base = *self.baselines.entry(id).or_insert(Baseline {
                at: now,
                part_ns: part,
                run_delay_ns: run_delay,
                calls,
                thread_cpu_ns: thread_cpu,
                waits: sampled,
                cpu_ns: cpu,
            });
            // A share of CPU time is of the time the thread could have had
            // on a machine of its own: time spent runnable but waiting for
            // a CPU (other programs' load) is left out, so CPU shares do
            // not shrink when the machine is busy. A share of wall time is
            // of the wall time: the part (a function's wall time) holds
            // the waits for a CPU inside it, and leaving them out of the
            // whole only made it read high (0.49-0.60 for a function the
            // thread's own clock put at 0.32-0.45 on a loaded machine).
            let elapsed = now.saturating_duration_since(base.at).as_nanos() as u64;
            let on_cpu = match node.hypothesis {
                Hypothesis::CpuBound => true,
                Hypothesis::Custom(i) => self.measure_of(i) == Measure::Cpu,
                Hypothesis::SyncWaiting | Hypothesis::IoBlocking => false,
            };
            let whole = if on_cpu {
                elapsed.saturating_sub(run_delay.saturating_sub(base.run_delay_ns))
            } else {
                elapsed
            };
            let mut part = part.saturating_sub(base.part_ns);
            if let Some(state) = self.open.get_mut(&id) {
                // Entered on this thread since its probe went in: its
                // frames come and go (told at the first reading, so that
                // the tests below it, which wait for this, start a step
                // sooner); not entered over a whole interval: open.
                if *state == OpenFrame::Unknown {
                    if calls > 0 {
                        *state = OpenFrame::Timed;
                    } else if now > base.at {
                        *state = OpenFrame::Open;
                    }
                }
                if *state == OpenFrame::Open {
                    let samples = sampled.0.saturating_sub(base.waits.0);
                    let share = |n: u64, b: u64| {
                        if samples == 0 {
                            0.0
                        } else {
                            n.saturating_sub(b) as f64 / samples as f64
                        }
                    };
                    part = match node.hypothesis {
                        Hypothesis::CpuBound => thread_cpu.saturating_sub(base.thread_cpu_ns),
                        Hypothesis::SyncWaiting => {
                            (whole as f64 * share(sampled.1, base.waits.1)) as u64
                        }
                        Hypothesis::IoBlocking => {
                            (whole as f64 * share(sampled.2, base.waits.2)) as u64
                        }
                        Hypothesis::Custom(i) => self
                            .measure_of(i)
                            .part(whole, thread_cpu.saturating_sub(base.thread_cpu_ns)),
                    };
                }
            }
            if now > base.at {
                let secs = now.duration_since(base.at).as_secs_f64();
                self.call_rates
                    .insert(id, calls.saturating_sub(base.calls) as f64 / secs);
                // The function's own CPU share of the thread's time (a
                // wait test's function may also compute).
                if elapsed > 0 {
                    self.cpu_shares
                        .insert(id, cpu.saturating_sub(base.cpu_ns) as f64 / elapsed as f64);
                }
            }
            let reading = Reading {
                at: now.saturating_duration_since(base.at),
                part_ns: part,
                whole_ns: whole,
            };
            let (h, path) = (self.name_of(node.hypothesis), node.focus.path.clone());
            let change = self.search.observe(id, reading, &self.graph);
            let node = self.search.node(id);
            let value = node.value().unwrap_or(0.0);
            let at = now.saturating_duration_since(self.started);
            if let (Some(t), Some(c)) = (self.history.get_mut(id.0), &change) {
                match c {
                    Change::Refined(..) => t.true_at = Some(at),
                    Change::Retire(_) | Change::Fell(_) => t.ended = Some(at),
                }
            }
            match change {
                Some(Change::Refined(_, children)) => {
                    progress.push(Progress::Concluded(h, path, tid, true, value));
                    let f = self.search.node(id).focus.function().to_string();
                    // Armed once: a caller disarmed stays known.
                    if !self.armed_at.contains_key(&f) {
                        self.to_arm.insert(f);
                    }
                    // Decode the children's functions so they can be probed.
                    for c in children {
                        let name = self.search.node(c).focus.function().to_string();
                        if let Some(f) = self.graph.function(&name).cloned() {
                            let _ = self.graph.explore(process.image(), &f);
                        }
                    }
                }
                Some(Change::Retire(_)) | Some(Change::Fell(_)) => {
                    progress.push(Progress::Concluded(h, path, tid, false, value));
                }
                None => {}
            }
        }
    }

    /// Counts every probe's calls (all threads) into the cost bookkeeping.
    /// One sample of every probe on every thread: each (thread, probe)'s
    /// (wall, CPU) ns; the calls, summed over threads, go to the cost
    /// bookkeeping on the way.
    fn sample_and_count(&mut self, process: &Process) -> HashMap<(u32, ProbeId), (u64, u64, u64)> {
        let rows: Vec<(u32, Vec<crate::sample::Value>)> = self
            .sampler
            .sample(process)
            .map(|t| (t.tid, t.values.to_vec()))
            .collect();
        let mut values = HashMap::new();
        let mut calls: HashMap<(u32, ProbeId), u64> = HashMap::new();
        for (tid, row) in rows {
            for (id, v) in self.sampler.probes().zip(row) {
                values.insert((tid, id), (v.wall_ns, v.cpu_ns, v.calls));
                calls.insert((tid, id), v.calls);
            }
        }
        // Armed call sites cost their hits too (a point on each indirect
        // call of CPython's interpreter loop slowed a script by 40 %).
        calls.extend(self.point_hits(process));
        // Every probe is judged, even before any thread has a row.
        let probes: Vec<ProbeId> = self
            .sampler
            .probes()
            .chain(self.armed.values().flatten().copied())
            .collect();
        self.cost.use_table(process.cpu_clocks_on_table());
        let points: std::collections::HashSet<ProbeId> =
            self.armed.values().flatten().copied().collect();
        self.cost.observe(&calls, &probes, &points);
        self.change_clocks(process);
        values
    }

    /// Where a true wait is not accounted for by the true tests below it
    /// (by at least the threshold) in a function with an indirect call
    /// weft cannot arm (CPython's `cfunction_call` calls a lock's acquire
    /// through `call *%r8`, followed by an instruction a patch would cover,
    /// and its interpreter loop has many such calls), the threads' stacks
    /// show what it calls: one walk a step, up to [`STACK_WALKS`] per
    /// function, the search not exhausted meanwhile. The walks at the start
    /// see the same only when a thread happened to wait there then.
    fn learn_from_stacks(&mut self, process: &mut Process) -> Result<(), Error> {
        let nodes = self.search.nodes();
        // What the true children of each node account for.
        let mut below: HashMap<usize, f64> = HashMap::new();
        for n in nodes.iter().filter(|n| n.is_true()) {
            if let Some(p) = n.parent {
                *below.entry(p.0).or_default() += n.value().unwrap_or(0.0);
            }
        }
        let mut tids = BTreeSet::new();
        let mut callers = BTreeSet::new();
        for (i, n) in nodes.iter().enumerate() {
            let f = n.focus.function();
            let unexplained = n.value().unwrap_or(0.0) - below.get(&i).copied().unwrap_or(0.0);
            if n.hypothesis == Hypothesis::CpuBound
                || !n.is_true()
                || unexplained < self.options.thresholds.of(n.hypothesis)
                || !self.unarmable.get(f).is_some_and(|&w| w < STACK_WALKS)
            {
                continue;
            }
            tids.extend(n.focus.threads.iter().copied());
            callers.insert(f.to_string());
        }
        self.walks_pending = !callers.is_empty();
        if callers.is_empty() || tids.is_empty() {
            return Ok(());
        }
        for c in &callers {
            *self.unarmable.entry(c.clone()).or_insert(0) += 1;
        }
        // Every call the walk shows is learnt, not only the unarmable
        // callers' own: one walk that catches the wait teaches the whole
        // path down to it (the callee of an unarmable call is often
        // unarmable too: a dispatcher calling a dispatcher).
        let calls: Vec<(String, Function)> = stack_edges(process, &tids, &mut self.stops)?
            .into_iter()
            .filter(|(caller, callee)| caller.address != callee.address)
            .map(|(caller, callee)| (caller.name, callee))
            .collect();
        self.learn_calls(process, calls);
        Ok(())
    }

    /// Teaches the graph calls seen at run time and refines the true
    /// tests of each caller that had not been seen making them.
    fn learn_calls(&mut self, process: &mut Process, calls: Vec<(String, Function)>) {
        let mut refine = BTreeSet::new();
        for (caller, f) in calls {
            let known = self
                .graph
                .calls(&caller)
                .is_some_and(|c| c.learnt.contains(&f.name) || c.direct.contains(&f.name));
            if !known {
                // Decoded first: whether it can reach a wait is judged
                // from its callees.
                self.graph.explore(process.image(), &f);
                self.graph.learn(&caller, f);
                refine.insert(caller);
            }
        }
        for caller in refine {
            let ids: Vec<NodeId> = (0..self.search.nodes().len())
                .map(NodeId)
                .filter(|&i| self.search.node(i).focus.function() == caller)
                .collect();
            for id in ids {
                self.search.refine_more(id, &self.graph);
            }
        }
    }

    /// Takes every probe out (the end of a diagnosis).
    pub fn finish(&mut self, process: &mut Process) -> Result<(), Error> {
        // The threads' clocks' perf events go with the last probe; threads
        // that register later get one again where CPU timers are.
        process.keep_cpu_clocks(false);
        process.choose_cpu_clocks(false);
        if !process.is_alive() {
            self.probes.clear();
            self.node_probe.clear();
            self.armed.clear();
            return Ok(());
        }
        let ids: Vec<ProbeId> = self
            .probes
            .values()
            .map(|p| p.id)
            .chain(self.armed.values().flatten().copied())
            .collect();
        // A stop even with no probe left: its release lets the events go.
        let mut held = process.hold()?;
        if !ids.is_empty() {
            held.remove(&ids)?;
        }
        held.release()?;
        self.stops.note(process, "removing every probe");
        self.probes.clear();
        self.node_probe.clear();
        self.armed.clear();
        Ok(())
    }

    /// The diagnosis so far.
    pub fn diagnosis(&self) -> Diagnosis {
        let (mut by_path, never_left) = self.bottlenecks_by_path();
        self.add_wait_objects(&mut by_path);
        self.add_thread_names(&mut by_path);
        let (mut idle, mut bottlenecks): (Vec<Bottleneck>, Vec<Bottleneck>) =
            merge_paths(by_path.into_values().collect())
                .into_iter()
                .partition(|b| {
                    !self.options.report_idle
                        && (is_idle_wait(b)
                            || never_left.contains(&(b.hypothesis.clone(), b.path.clone())))
                });
        bottlenecks.sort_by(|a, b| b.value.total_cmp(&a.value));
        idle.sort_by(|a, b| b.value.total_cmp(&a.value));
        // Functions as reports name them: C++ demangled, a clone by its
        // source name.
        let shown = |p: &mut Vec<String>| {
            for f in p.iter_mut() {
                *f = crate::inspect::names::display_name(f);
            }
        };
        for b in bottlenecks.iter_mut().chain(idle.iter_mut()) {
            shown(&mut b.path);
            b.also_via.iter_mut().for_each(shown);
            b.function = crate::inspect::names::display_name(&b.function);
        }
        let mut nodes = self.node_reports();
        for n in &mut nodes {
            shown(&mut n.path);
        }
        Diagnosis {
            bottlenecks,
            idle,
            summary: self.summary(),
            nodes,
            threads: self.thread_names.clone(),
        }
    }

    /// Whether the wait tested at node `id` is where its thread waits for
    /// work: every frame between the thread's root and the wait was open
    /// when the search began and was never left while it ran (a loop the
    /// thread never leaves, at any depth: MariaDB's `handle_manager`
    /// under its start routine, an event loop's dispatcher), so the
    /// thread only ever comes back to this wait. A worker's wait under a
    /// function it keeps calling (`step > update_shared > lock`) is not.
    fn in_a_loop_never_left(&self, id: NodeId) -> bool {
        let n = self.search.node(id);
        if n.hypothesis == Hypothesis::CpuBound || n.focus.path.len() < 3 {
            return false;
        }
        let path = &n.focus.path;
        (2..path.len()).all(|k| {
            self.search.nodes().iter().enumerate().any(|(i, m)| {
                m.hypothesis == n.hypothesis
                    && m.focus.threads == n.focus.threads
                    && m.focus.path[..] == path[..k]
                    && self.open.get(&NodeId(i)) == Some(&OpenFrame::Open)
            })
        })
    }

    /// Whether the wait at node `id` is a pool thread waiting for a task:
    /// a condition variable waited on under the call its thread's loop
    /// (a frame never left) makes to get work, a call that does no work
    /// itself (under 2 % of the thread's time on the CPU) — MariaDB's
    /// InnoDB workers in `worker_main > get_task > wait_for_tasks >
    /// pthread_cond_clockwait`. A wait on a condition variable inside the
    /// work (`worker > handle_request > … > pthread_cond_wait`, the
    /// handler computing too) is not.
    fn waits_for_work(&self, id: NodeId) -> bool {
        let n = self.search.node(id);
        if n.hypothesis != Hypothesis::SyncWaiting
            || !super::graph::is_condition_wait(n.focus.function())
        {
            return false;
        }
        let path = &n.focus.path;
        let nodes = self.search.nodes();
        let node_of = |k: usize| {
            (0..nodes.len()).map(NodeId).find(|&i| {
                let m = &nodes[i.0];
                m.hypothesis == n.hypothesis
                    && m.focus.threads == n.focus.threads
                    && m.focus.path[..] == path[..k]
            })
        };
        // The first frame below the root the thread keeps entering.
        let Some(k) = (2..path.len())
            .find(|&k| node_of(k).map_or(true, |i| self.open.get(&i) != Some(&OpenFrame::Open)))
        else {
            return false;
        };
        let fetch = node_of(k).and_then(|i| self.cpu_shares.get(&i));
        fetch.is_some_and(|&share| share < 0.02)
    }

    /// The bottlenecks found, one per (hypothesis, path): the true nodes
    /// with a value, their threads and call rates added up, at their
    /// largest value.
    /// Also returns those whose wait is in a loop its threads never leave
    /// ([`Consultant::in_a_loop_never_left`]).
    fn bottlenecks_by_path(&self) -> (BTreeMap<PathKey, Bottleneck>, BTreeSet<PathKey>) {
        let mut by_path: BTreeMap<PathKey, Bottleneck> = BTreeMap::new();
        let mut never_left = BTreeSet::new();
        for id in self.search.bottlenecks() {
            let n = self.search.node(id);
            if n.value().is_none() {
                continue; // a root taken as true, nothing below it measured
            }
            // A wait is a bottleneck where a primitive of its class waits:
            // off-CPU time that no such primitive below accounts for is
            // sleep, paging or a wait of the other class.
            if n.hypothesis != Hypothesis::CpuBound
                && !self.graph.in_class(n.hypothesis, n.focus.function())
            {
                continue;
            }
            let key = (self.name_of(n.hypothesis), n.focus.path.clone());
            if self.in_a_loop_never_left(id) || self.waits_for_work(id) {
                never_left.insert(key.clone());
            }
            let b = by_path.entry(key).or_insert_with(|| Bottleneck {
                hypothesis: self.name_of(n.hypothesis),
                path: n.focus.path.clone(),
                function: n.focus.function().to_string(),
                threads: Vec::new(),
                value: 0.0,
                object: None,
                bytes_per_call: None,
                calls_per_s: None,
                measured: None,
                small_io: false,
                thread_names: Vec::new(),
                also_via: Vec::new(),
            });
            b.threads.extend(n.focus.threads.iter().copied());
            if let Some(&rate) = self.call_rates.get(&id) {
                *b.calls_per_s.get_or_insert(0.0) += rate;
            }
            let value = n.value().unwrap_or(0.0);
            if value >= b.value {
                b.value = value;
                // Test time counts from the test's first reading.
                let began = self.history.get(id.0).and_then(|t| t.began);
                b.measured = n.value_window().zip(began).map(|((from, to), began)| {
                    let at = |d: Duration| self.started_monotonic + (began + d).as_secs_f64();
                    [at(from), at(to)]
                });
            }
        }
        (by_path, never_left)
    }

    /// What each wait bottleneck waits on (the lock or the file its threads
    /// waited on most), its bytes per call and whether it is small I/O.
    fn add_wait_objects(&self, by_path: &mut BTreeMap<(HypothesisName, Vec<String>), Bottleneck>) {
        let waits = self.waits.snapshot();
        for b in by_path.values_mut() {
            let sync = b.hypothesis == HypothesisName::Sync;
            if !sync && b.hypothesis != HypothesisName::Io {
                continue;
            }
            let mut objects: HashMap<u64, (u64, u64, u64)> = HashMap::new();
            for t in &b.threads {
                for (&(is_sync, what), &(n, bytes, transfers)) in
                    waits.get(t).map(|w| &w.objects).into_iter().flatten()
                {
                    if is_sync == sync {
                        let o = objects.entry(what).or_default();
                        *o = (o.0 + n, o.1 + bytes, o.2 + transfers);
                    }
                }
            }
            if let Some((&what, &(_, bytes, transfers))) = objects
                .iter()
                .max_by_key(|(&what, &(n, ..))| (n, std::cmp::Reverse(what)))
            {
                b.object = if sync {
                    Some(format!("{what:#x}"))
                } else {
                    waits::describe_fd(self.pid, what as i32)
                };
                b.bytes_per_call = (transfers > 0).then(|| bytes / transfers);
            }
            b.small_io = !sync
                && b.bytes_per_call.is_some_and(|n| n < SMALL_IO_BYTES)
                && b.calls_per_s.is_some_and(|r| r > SMALL_IO_RATE);
        }
    }

    /// Each bottleneck's threads, sorted, and their names.
    fn add_thread_names(&self, by_path: &mut BTreeMap<(HypothesisName, Vec<String>), Bottleneck>) {
        for b in by_path.values_mut() {
            b.threads.sort_unstable();
            b.thread_names = b
                .threads
                .iter()
                .map(|&t| {
                    procfs::thread_name(self.pid, t)
                        .map(|n| n.trim().to_string())
                        .unwrap_or_default()
                })
                .collect();
        }
    }

    /// Every test of the search, as reported.
    fn node_reports(&self) -> Vec<NodeReport> {
        let times = |i: usize| self.history.get(i).copied().unwrap_or_default();
        self.search
            .nodes()
            .iter()
            .enumerate()
            .map(|(i, n)| NodeReport {
                hypothesis: self.name_of(n.hypothesis),
                path: n.focus.path.clone(),
                thread: n.focus.threads.first().copied().unwrap_or(0),
                state: match (&n.state, n.verdict()) {
                    (State::Queued, _) => TestState::Queued,
                    (State::Deferred(_), _) => TestState::Deferred,
                    (State::Skipped(_), _) => TestState::Skipped,
                    (_, Verdict::True { .. }) => TestState::True,
                    (_, Verdict::False { .. }) => TestState::False,
                    (_, Verdict::Testing) => TestState::Testing,
                },
                value: n.value(),
                threshold: self.options.thresholds.of(n.hypothesis),
                reason: match &n.state {
                    State::Deferred(r) | State::Skipped(r) => Some(r.clone()),
                    _ => None,
                },
                was_true: match n.verdict() {
                    Verdict::False {
                        was_true: Some((from, to)),
                    } => Some((from.as_secs_f64(), to.as_secs_f64())),
                    _ => None,
                },
                began: times(i).began.map(|d| d.as_secs_f64()),
                true_at: times(i).true_at.map(|d| d.as_secs_f64()),
                ended: times(i).ended.map(|d| d.as_secs_f64()),
            })
            .collect()
    }

    /// The search's summary: its tests, probes, stops and cost.
    fn summary(&self) -> Summary {
        Summary {
            tests: self.tests,
            peak_probes: self.peak_probes,
            functions_probed: self.probed_ever.len(),
            functions_reachable: self.module_functions.values().sum(),
            executable_functions: self.executable_functions,
            cannot_time: self.cannot_time.clone(),
            stops: self.stops.count,
            longest_stop_ms: self.stops.longest.total.as_secs_f64() * 1e3,
            longest_stop_for: self.stops.longest_for.to_string(),
            longest_stop_stopping_ms: self.stops.longest.stopping.as_secs_f64() * 1e3,
            longest_stop_resuming_ms: self.stops.longest.resuming.as_secs_f64() * 1e3,
            longest_stop_weft_cpu_ms: self.stops.longest.weft_cpu.as_secs_f64() * 1e3,
            longest_stop_remote_calls_ms: self.stops.longest.remote_calls.as_secs_f64() * 1e3,
            stops_given_up: self.stops.given_up,
            start_held_ms: self.stops.start_held.map(|d| d.as_secs_f64() * 1e3),
            stack_walks: self.unarmable.values().sum(),
            exhausted: self.search.exhausted(),
            seconds: self.started.elapsed().as_secs_f64(),
            overhead: self.cost.total_share(),
            clock_overhead: self.cost.clock_total_share(),
            cost_per_clock_syscall_ns: self.cost.syscall_ns(),
            clocks_paused: self.paused_ever.iter().copied().collect(),
            cost_per_call_ns: self.cost.per_call_ns,
            cost_per_switch_ns: self.cost.switch_costs().0,
            cost_per_switch_event_ns: self.cost.switch_costs().1,
            refused: self
                .refused
                .values()
                .fold(BTreeMap::new(), |mut by_kind, (kind, _)| {
                    *by_kind.entry(kind.to_string()).or_insert(0) += 1;
                    by_kind
                }),
            refused_example: self
                .refused
                .iter()
                .next()
                .map(|(function, (_, reason))| format!("{function}: {reason}")),
        }
    }
}

/// One bottleneck per (hypothesis, function, threads, object): several
/// paths to the same wait in the same threads are one finding, reported
/// at its shortest path with the others in `also_via`, at the largest
/// value.
fn merge_paths(all: Vec<Bottleneck>) -> Vec<Bottleneck> {
    let mut merged: Vec<Bottleneck> = Vec::new();
    for b in all {
        let same = merged.iter_mut().find(|m| {
            m.hypothesis == b.hypothesis
                && m.function == b.function
                && m.threads == b.threads
                && m.object == b.object
        });
        match same {
            Some(m) => {
                let (keep, other) = if b.path.len() < m.path.len() {
                    (b.path.clone(), std::mem::replace(&mut m.path, b.path))
                } else {
                    (m.path.clone(), b.path)
                };
                m.path = keep;
                m.also_via.push(other);
                m.value = m.value.max(b.value);
            }
            None => merged.push(b),
        }
    }
    merged
}

/// Waits that only say a thread has nothing to do until something
/// arrives: an event loop's readiness wait, a listener's `accept`.
const READINESS_WAITS: &[&str] = &[
    "epoll_wait",
    "epoll_pwait",
    "epoll_pwait2",
    "poll",
    "ppoll",
    "select",
    "pselect",
    "accept",
    "accept4",
];

/// A wait where a thread waits for work, not in the middle of it: one its
/// root calls itself (the top of a pool thread's loop; the root is the
/// start routine, or `main`), or a readiness wait anywhere (an event
/// loop's `epoll_wait`).
fn is_idle_wait(b: &Bottleneck) -> bool {
    matches!(b.hypothesis, HypothesisName::Sync | HypothesisName::Io)
        && (b.path.len() == 2 || READINESS_WAITS.contains(&b.function.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(hypothesis: &str, path: &[&str], threads: &[u32], value: f64) -> Bottleneck {
        Bottleneck {
            hypothesis: hypothesis.into(),
            path: path.iter().map(|f| f.to_string()).collect(),
            function: path.last().map_or(String::new(), |f| f.to_string()),
            threads: threads.to_vec(),
            value,
            object: Some("0x10".into()),
            bytes_per_call: None,
            calls_per_s: None,
            measured: None,
            small_io: false,
            thread_names: Vec::new(),
            also_via: Vec::new(),
        }
    }

    #[test]
    fn paths_to_one_wait_in_the_same_threads_are_one_finding() {
        let merged = merge_paths(vec![
            found(
                "sync",
                &["root", "eval", "call", "eval", "lock"],
                &[1, 2],
                0.30,
            ),
            found("sync", &["root", "eval", "lock"], &[1, 2], 0.36),
            // Other threads, another hypothesis: findings of their own.
            found("sync", &["root", "eval", "lock"], &[3], 0.50),
            found("io", &["root", "eval", "lock"], &[1, 2], 0.40),
        ]);
        assert_eq!(merged.len(), 3);
        let m = &merged[0];
        assert_eq!(m.path, ["root", "eval", "lock"]);
        assert_eq!(m.also_via, [vec!["root", "eval", "call", "eval", "lock"]]);
        assert!((m.value - 0.36).abs() < 1e-9);
    }

    #[test]
    fn waits_for_work_are_idle_and_cpu_never_is() {
        assert!(is_idle_wait(&found(
            "sync",
            &["worker", "pthread_cond_wait"],
            &[1],
            0.9
        )));
        assert!(is_idle_wait(&found(
            "io",
            &["main", "loop", "dispatch", "epoll_wait"],
            &[1],
            0.9
        )));
        assert!(!is_idle_wait(&found(
            "io",
            &["reader", "read_records", "read"],
            &[1],
            0.5
        )));
        assert!(!is_idle_wait(&found("cpu", &["worker", "spin"], &[1], 0.9)));
        assert!(!is_idle_wait(&found(
            "pool",
            &["worker", "pool_get"],
            &[1],
            0.9
        )));
    }
}
