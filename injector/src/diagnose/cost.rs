//! What the instrumentation costs the target, as it goes: the calls the
//! probes count, times the measured cost of one timed call, and the
//! context switches of the threads that made them, times the cost of
//! the CPU clock's first reading after a switch; against the target's CPU
//! time over the same span.

use crate::inspect::procfs::{schedstat_fields, thread_ids};
use crate::ProbeId;
use std::collections::HashMap;

/// The least saving, ns over an interval, a change of a thread's clock is
/// made for.
const CLOCK_CHANGE_MIN_NS: f64 = 100_000.0;

/// The least share of the target's CPU a thread's clock event must cost
/// over an interval to be let go (see `ThreadClock::change`).
const CLOCK_EVENT_MATERIAL: f64 = 0.01;

/// The most the threads' clocks may cost the target, as a share of its
/// CPU, before the costliest are paused (see [`pauses`]).
const CLOCKS_ALLOWED: f64 = 0.01;

/// The shortest interval, s, over which a paused clock is found quiet
/// enough to be given back.
const MIN_PAUSE_INTERVAL_S: f64 = 0.1;

/// The least target CPU time a cost share is computed over, ns.
const MIN_CPU_SPAN_NS: u64 = 10_000_000;

/// What the instrumentation costs the target: calls counted by the
/// probes, times the measured cost of one timed call, and the switches
/// of the threads that made them, times what a timer's CPU clock pays
/// after one; against the target's CPU time over the same span.
#[derive(Debug)]
pub(super) struct Cost {
    pid: i32,
    pub(super) per_call_ns: f64,
    /// What the first CPU clock reading after a context switch costs a
    /// thread, ns: the runtime's clock re-anchors with a system call
    /// (`CLOCK_THREAD_CPUTIME_ID`) where the perf page gives no time of
    /// its own (a virtual machine's), 0 where it does.
    pub(super) per_switch_ns: f64,
    /// What the perf event behind a thread's CPU clock costs it at every
    /// context switch, ns, timed code or not: a fixed cost of every
    /// thread that has run instrumented code (it keeps its clock).
    pub(super) per_switch_event_ns: f64,
    /// The same two where the clocks read the CPU-time table: the
    /// re-anchor from the slot (a vDSO clock read), and the `sched_switch`
    /// program at every switch of the target's threads.
    table_costs: (f64, f64),
    /// Whether the target's clocks read the CPU-time table
    /// ([`Cost::use_table`]).
    table: bool,
    /// What a CPU clock reading costs by system call, ns
    /// (`CLOCK_THREAD_CPUTIME_ID`): a thread whose clock has no event pays
    /// it twice a timed call.
    syscall_ns: f64,
    /// Whether each thread's clock is chosen by what it costs there
    /// ([`Cost::choose_clocks`]), and which threads' have an event.
    chosen: bool,
    events: HashMap<u32, bool>,
    /// The threads whose clocks are paused (their CPU time sampled).
    paused: std::collections::BTreeSet<u32>,
    /// The threads whose clocks were found worth pausing while they had an
    /// event: asked to let it go first, and paused as soon as they have
    /// (judged again without the event, the thread's switches alone cost
    /// about the material share, and a CPython worker went from event to
    /// system call and back every half second).
    pausing: std::collections::BTreeSet<u32>,
    /// The clocks the last interval's figures call for: (thread, event).
    advice: Vec<(u32, bool)>,
    /// The pauses they call for: (thread, paused).
    pause_advice: Vec<(u32, bool)>,
    /// Calls of each probe on each thread at the last reading.
    calls: HashMap<(u32, ProbeId), u64>,
    /// Calls of each probe per second of the target's CPU, last interval.
    rates: HashMap<ProbeId, f64>,
    /// Each thread's CPU time when last seen, ns: a thread that exited
    /// keeps what it ran (its schedstat is gone with it, and the target's
    /// CPU summed over live threads alone shrank to nothing when a
    /// script's workers ended: an "overhead" of 195,000%).
    threads: ThreadCpu,
    /// The target's CPU time at the start and at the last reading, ns.
    cpu_start: u64,
    cpu_last: u64,
    /// Instrumentation cost, ns: in all, and over the last interval.
    spent_ns: f64,
    recent: f64,
    /// What the clocks' events cost over the last interval (no probe's to
    /// take out: apart from `recent`), and the switches per second of the
    /// threads that have one.
    clocks: (f64, f64),
    /// What the clocks' events cost in all, ns.
    clock_spent_ns: f64,
    /// When the counts were last taken.
    last_at: std::time::Instant,
}

impl Cost {
    /// The costs for `pid`'s clocks; the CPU-time table's are measured
    /// only when `may_use_table` (measuring them attaches a `sched_switch`
    /// program of weft's own for a moment).
    pub(super) fn new(pid: i32, may_use_table: bool) -> Cost {
        let mut threads = ThreadCpu::default();
        let cpu = threads.read(pid);
        let (per_call_ns, per_switch_ns) = timer_costs();
        Cost {
            pid,
            per_call_ns,
            per_switch_ns,
            per_switch_event_ns: perf_event_switch_ns(),
            table_costs: if may_use_table {
                table_costs()
            } else {
                (0.0, 0.0)
            },
            table: false,
            syscall_ns: fastest_read_ns(weft_rt::clock::thread_cputime_ns),
            chosen: false,
            events: HashMap::new(),
            paused: Default::default(),
            pausing: Default::default(),
            advice: Vec::new(),
            pause_advice: Vec::new(),
            calls: HashMap::new(),
            rates: HashMap::new(),
            threads,
            cpu_start: cpu,
            cpu_last: cpu,
            spent_ns: 0.0,
            recent: 0.0,
            clocks: (0.0, 0.0),
            clock_spent_ns: 0.0,
            last_at: std::time::Instant::now(),
        }
    }

    /// Whether the target's clocks read the CPU-time table (they do from
    /// the first CPU timer on, where weft may load BPF).
    pub(super) fn use_table(&mut self, on: bool) {
        self.table = on;
    }

    /// What the first CPU clock reading after a switch costs a thread, and
    /// what each switch costs it whether it reads or not, ns, for the
    /// clock the target uses.
    pub(super) fn switch_costs(&self) -> (f64, f64) {
        if self.table {
            self.table_costs
        } else {
            (self.per_switch_ns, self.per_switch_event_ns)
        }
    }

    /// Each thread's CPU clock is chosen by what it costs there (the
    /// process's threads get no event unless asked: see
    /// `Process::choose_cpu_clocks`): [`Cost::advice`] says which to change.
    pub(super) fn choose_clocks(&mut self) {
        self.chosen = true;
    }

    /// Whether each thread's clock is chosen ([`Cost::choose_clocks`]).
    pub(super) fn chosen(&self) -> bool {
        self.chosen
    }

    /// What the threads' clocks are now: `true` for those with an event
    /// (asked for one counts as having it, asked to let it go as not).
    pub(super) fn clocks_now(&mut self, events: impl IntoIterator<Item = (u32, bool)>) {
        self.events.extend(events);
    }

    /// Whether thread `tid`'s clock is paused (as last told).
    pub(super) fn is_paused(&self, tid: u32) -> bool {
        self.paused.contains(&tid)
    }

    /// Which threads' clocks are paused now.
    pub(super) fn paused_now(&mut self, paused: std::collections::BTreeSet<u32>) {
        self.paused = paused;
    }

    /// The clock changes the last interval's figures call for: (thread,
    /// whether it should have an event). The caller asks for them and says
    /// so with [`Cost::clocks_now`].
    pub(super) fn advice(&self) -> &[(u32, bool)] {
        &self.advice
    }

    /// The pauses the last interval's figures call for: (thread, whether
    /// its clock should be paused). A clock with an event is let go of it
    /// first, and paused at a later interval.
    pub(super) fn pause_advice(&self) -> &[(u32, bool)] {
        &self.pause_advice
    }

    /// What a CPU clock reading by system call costs, ns.
    pub(super) fn syscall_ns(&self) -> f64 {
        self.syscall_ns
    }

    /// Takes the probes' call counts on each thread now.
    /// `points` are the probes that count hits and read no clock (armed
    /// call sites): they cost their hits, not clock readings.
    pub(super) fn observe(
        &mut self,
        calls: &HashMap<(u32, ProbeId), u64>,
        probes: &[ProbeId],
        points: &std::collections::HashSet<ProbeId>,
    ) {
        let before_switches = self.threads.switches.clone();
        let cpu = self.threads.read(self.pid);
        // The kernel brings a running thread's total up to date only at
        // its ticks: a share over less than a few ms of CPU is noise.
        let cpu_delta = cpu.saturating_sub(self.cpu_last).max(MIN_CPU_SPAN_NS) as f64;
        // Every probe is judged, even before any thread called it.
        let mut cost: HashMap<ProbeId, f64> = probes.iter().map(|&id| (id, 0.0)).collect();
        let mut by_thread: HashMap<u32, Vec<(ProbeId, u64)>> = HashMap::new();
        let mut calls_ns = 0.0;
        for (&(tid, id), &n) in calls {
            // A probe seen for the first time counted from zero: its words
            // were fresh (the sampler subtracts what a shared one had).
            let before = self.calls.insert((tid, id), n).unwrap_or(0);
            let new = n.saturating_sub(before);
            calls_ns += new as f64 * self.per_call_ns;
            *cost.entry(id).or_default() += new as f64 * self.per_call_ns;
            // A CPython search's armed call sites counted millions of hits
            // a second: read as timed calls, the clocks of the threads
            // letting their events go cost 200-350 % of the target's CPU
            // over those intervals.
            if new > 0 && !points.contains(&id) {
                by_thread.entry(tid).or_default().push((id, new));
            }
        }
        let since: HashMap<u32, u64> = self
            .threads
            .switches
            .iter()
            .map(|(&tid, &n)| {
                let before = before_switches.get(&tid).copied().unwrap_or(0);
                (tid, n.saturating_sub(before))
            })
            .collect();
        let switched = |tid: u32| since.get(&tid).copied().unwrap_or(0);
        let secs = self.last_at.elapsed().as_secs_f64().max(1e-3);
        self.last_at = std::time::Instant::now();
        let clocks = if self.chosen {
            let long_enough = secs >= MIN_PAUSE_INTERVAL_S;
            self.chosen_clocks(&by_thread, switched, &mut cost, (cpu_delta, long_enough))
        } else {
            self.given_clocks(&by_thread, switched, &mut cost, calls)
        };
        let Clocks {
            actual,
            judged,
            switches,
        } = clocks;
        // The clocks' part no probe answers for: the events' cost at
        // switches (given clocks), or beyond the cheaper reading (chosen).
        let unjudged = (actual - judged).max(0.0);
        self.clocks = (unjudged / cpu_delta, switches as f64 / secs);
        self.clock_spent_ns += unjudged;
        self.rates = cost
            .into_iter()
            .map(|(id, ns)| (id, ns / cpu_delta))
            .collect();
        self.spent_ns += calls_ns + actual;
        self.recent = (calls_ns + judged) / cpu_delta;
        self.cpu_last = cpu;
    }

    /// The clocks' costs where every thread that ran timed code keeps an
    /// event (or the CPU-time table's slot): returns what the events cost
    /// at switches, which no probe's removal lowers, and the switches they
    /// cost at; the re-anchoring after a switch goes to the probes.
    fn given_clocks(
        &mut self,
        by_thread: &HashMap<u32, Vec<(ProbeId, u64)>>,
        switched: impl Fn(u32) -> u64,
        cost: &mut HashMap<ProbeId, f64>,
        calls: &HashMap<(u32, ProbeId), u64>,
    ) -> Clocks {
        let (per_switch_ns, per_switch_fixed_ns) = self.switch_costs();
        // A thread that ran timed code pays the clock's re-anchoring after
        // each switch, at most once per timer reading (two per call): on
        // CPython's 4 threads around a lock (130,000 switches a second)
        // this, not the calls, was most of the slowdown. Shared among the
        // thread's probes by their calls.
        // Every thread with a row has its clock's event: its switches cost
        // it whatever the probes do, and no probe taken out lowers it. The
        // table's program runs at every switch of every thread.
        let rows: std::collections::BTreeSet<u32> = if self.table {
            self.threads.switches.keys().copied().collect()
        } else {
            calls.keys().map(|&(tid, _)| tid).collect()
        };
        let switches: u64 = rows.iter().map(|&tid| switched(tid)).sum();
        let mut paid_all = 0.0;
        for (&tid, made) in by_thread {
            let switches = switched(tid);
            let total: u64 = made.iter().map(|&(_, n)| n).sum();
            let paid = switches.min(2 * total) as f64 * per_switch_ns;
            paid_all += paid;
            for &(id, n) in made {
                *cost.entry(id).or_default() += paid * n as f64 / total as f64;
            }
        }
        self.advice.clear();
        Clocks {
            actual: paid_all + switches as f64 * per_switch_fixed_ns,
            judged: paid_all,
            switches,
        }
    }

    /// The clocks' costs where each thread's is chosen: a thread with an
    /// event pays at every switch (and its first reading after one
    /// re-anchors), one without pays a system call at every reading, and
    /// each gets the cheaper ([`Cost::advice`]). The probes answer, as with
    /// given clocks, for the re-anchoring after switches, or for the
    /// system calls where those cost less: the event's own cost at a switch
    /// is the thread's, whichever probes it runs (charged to the probes by
    /// their calls, it took out a CPython search's every busy probe, the
    /// lock's path with them, for costs the events alone made).
    fn chosen_clocks(
        &mut self,
        by_thread: &HashMap<u32, Vec<(ProbeId, u64)>>,
        switched: impl Fn(u32) -> u64,
        cost: &mut HashMap<ProbeId, f64>,
        (cpu_delta, long_enough): (f64, bool),
    ) -> Clocks {
        let (per_switch_ns, per_switch_fixed_ns) = (self.per_switch_ns, self.per_switch_event_ns);
        let mut threads: std::collections::BTreeSet<u32> = by_thread.keys().copied().collect();
        threads.extend(self.events.iter().filter(|e| *e.1).map(|e| *e.0));
        let mut all = Clocks::default();
        self.advice.clear();
        self.pause_advice.clear();
        threads.extend(self.paused.iter().copied());
        let mut judged_threads = Vec::new();
        for tid in threads {
            let made = by_thread.get(&tid).map_or(&[][..], |m| &m[..]);
            let total: u64 = made.iter().map(|&(_, n)| n).sum();
            let sw = switched(tid);
            let clock = ThreadClock::new(
                sw,
                total,
                (per_switch_fixed_ns, per_switch_ns),
                self.syscall_ns,
            );
            let has_event = self.events.get(&tid).copied().unwrap_or(false);
            let paused = self.paused.contains(&tid);
            if paused {
                // Not read: nothing to pay.
            } else if has_event {
                all.switches += sw;
                all.actual += clock.event;
            } else {
                all.actual += clock.syscall;
            }
            let judged = if paused { 0.0 } else { clock.judged() };
            all.judged += judged;
            for &(id, n) in made {
                *cost.entry(id).or_default() += judged * n as f64 / total as f64;
            }
            judged_threads.push((tid, clock, has_event, paused));
        }
        let costs: Vec<(u32, f64, bool)> = judged_threads
            .iter()
            .map(|(tid, clock, _, paused)| (*tid, clock.event.min(clock.syscall), *paused))
            .collect();
        let mut pauses = pauses(&costs, CLOCKS_ALLOWED * cpu_delta, long_enough);
        let material = CLOCK_EVENT_MATERIAL * cpu_delta;
        for (tid, clock, has_event, paused) in judged_threads {
            // A thread that let its event go to be paused is paused now,
            // not judged again.
            if !paused && !has_event && self.pausing.remove(&tid) {
                pauses.insert(tid, true);
            }
            if let Some(&pause) = pauses.get(&tid) {
                self.pause_advice.push((tid, pause));
                if pause && has_event {
                    self.advice.push((tid, false));
                    self.pausing.insert(tid);
                }
            } else if !paused {
                if let Some(event) = clock.change(has_event, material) {
                    self.advice.push((tid, event));
                }
            }
        }
        all
    }

    /// The share of the target's CPU probe `id` cost over the last
    /// interval, once measured.
    pub(super) fn probe_share(&self, id: ProbeId) -> Option<f64> {
        self.rates.get(&id).copied()
    }

    pub(super) fn recent_share(&self) -> f64 {
        self.recent
    }

    /// The share of the target's CPU the clocks' perf events took over the
    /// last interval, and the switches a second they took it at: no probe
    /// taken out lowers it.
    pub(super) fn clock_share(&self) -> (f64, f64) {
        self.clocks
    }

    /// What the clocks' perf events cost over the whole search, as a share
    /// of the target's CPU.
    pub(super) fn clock_total_share(&self) -> f64 {
        let cpu = self.cpu_last.saturating_sub(self.cpu_start);
        if cpu == 0 {
            0.0
        } else {
            self.clock_spent_ns / cpu as f64
        }
    }

    /// What the instrumentation cost over the whole search, clocks
    /// included, as a share of the target's CPU.
    pub(super) fn total_share(&self) -> f64 {
        let cpu = self.cpu_last.saturating_sub(self.cpu_start);
        if cpu == 0 {
            0.0
        } else {
            self.spent_ns / cpu as f64
        }
    }
}

/// What one thread's CPU clock cost over an interval, ns, either way.
#[derive(Debug)]
struct ThreadClock {
    /// With a perf event: the event at every switch, and the first
    /// reading after one re-anchoring (at most one a reading).
    event: f64,
    /// Without: a system call at every reading (two a timed call).
    syscall: f64,
    /// Of `event`, the re-anchoring.
    anchor: f64,
}

impl ThreadClock {
    /// The costs for `switches` and `calls` timed calls, given (the
    /// event's cost at a switch, the re-anchoring's) and a system call's,
    /// ns.
    fn new(switches: u64, calls: u64, (event_ns, anchor_ns): (f64, f64), syscall_ns: f64) -> Self {
        let anchor = switches.min(2 * calls) as f64 * anchor_ns;
        ThreadClock {
            event: switches as f64 * event_ns + anchor,
            syscall: 2.0 * calls as f64 * syscall_ns,
            anchor,
        }
    }

    /// What the thread's probes answer for: the re-anchoring after its
    /// switches, or the system calls where those cost less; not the
    /// event's own cost at a switch.
    fn judged(&self) -> f64 {
        self.anchor.min(self.syscall)
    }

    /// Whether a thread that has an event (`has_event`) or not should
    /// change: `Some(whether it should have one)`. Only for a clear gain:
    /// both costs swing with the load, and a change costs the thread a
    /// system call or two. An event goes only when it costs at least
    /// `material` ns: a reading by system call costs its thread 0.45 µs
    /// inside the activations it measures (a compute thread preempted
    /// 2,000 times a second, its event let go while it made few timed
    /// calls, read its leaf's CPU share 0.05 high once more of them came),
    /// where an event's reading costs nothing there.
    fn change(&self, has_event: bool, material: f64) -> Option<bool> {
        if has_event
            && self.event > 2.0 * self.syscall + CLOCK_CHANGE_MIN_NS
            && self.event > material
        {
            Some(false)
        } else if !has_event && self.syscall > 2.0 * self.event + CLOCK_CHANGE_MIN_NS {
            Some(true)
        } else {
            None
        }
    }
}

/// Which threads' clocks to pause and which to give back, from each
/// one's (thread, cheaper cost over the interval, ns, paused now): the
/// costliest are paused until what the others cost is within `allowance`
/// (their CPU time is then sampled: see `waits::Inside`); a paused one is
/// given back, cheapest first, while everything read stays within half
/// of it, and only over an interval `long_enough` to tell that the thread
/// has gone quiet (readings a few ms apart, right after an insertion,
/// count few calls and switches: CPython's workers got their clocks back
/// for the next 200 ms at every such pair, 9 % of the target's CPU over
/// those intervals). The bound is on all of them: four CPython workers
/// whose clocks each cost just under 1 % of the target's CPU cost 3.7 %
/// between them.
fn pauses(threads: &[(u32, f64, bool)], allowance: f64, long_enough: bool) -> HashMap<u32, bool> {
    let mut read: Vec<(u32, f64)> = threads
        .iter()
        .filter(|t| !t.2)
        .map(|t| (t.0, t.1))
        .collect();
    let mut kept: f64 = read.iter().map(|t| t.1).sum();
    read.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut changes = HashMap::new();
    for (tid, cost) in read {
        if kept <= allowance || cost <= CLOCK_CHANGE_MIN_NS {
            break;
        }
        changes.insert(tid, true);
        kept -= cost;
    }
    if long_enough {
        let mut paused: Vec<(u32, f64)> =
            threads.iter().filter(|t| t.2).map(|t| (t.0, t.1)).collect();
        paused.sort_by(|a, b| a.1.total_cmp(&b.1));
        for (tid, cost) in paused {
            if kept + cost >= allowance / 2.0 {
                break;
            }
            changes.insert(tid, false);
            kept += cost;
        }
    }
    changes
}

/// What the clocks cost over an interval, ns.
#[derive(Default)]
struct Clocks {
    /// All of it.
    actual: f64,
    /// What the probes answer for (see [`Cost::observe`]).
    judged: f64,
    /// The switches of the threads with an event.
    switches: u64,
}

/// The cost of one timed call and of a timer's first CPU clock reading
/// after a context switch, ns, measured here (weft runs on the target's
/// machine and kernel): the fastest of several short batches, since one
/// batch timed by the wall clock counts any preemption or stolen vCPU
/// time inside it.
fn timer_costs() -> (f64, f64) {
    use weft_rt::clock::{CpuPreference, CpuSource, ThreadCpuClock, WallClock, WallPreference};
    let per_call = crate::Metrics::ALL.call_cost_ns();
    let wall = WallClock::new(WallPreference::Auto);
    let syscall = || fastest_read_ns(weft_rt::clock::thread_cputime_ns);
    match ThreadCpuClock::new(&wall, CpuPreference::Auto).source() {
        // The page's own formula: no system call, ever.
        CpuSource::PerfTime => (per_call, 0.0),
        CpuSource::Anchor => (per_call, syscall()),
        // A system call at every reading.
        _ => (per_call + 2.0 * syscall(), 0.0),
    }
}

/// What the perf event behind a thread's CPU clock costs the thread at
/// each context switch, ns: the kernel switches the event's context out
/// and in with the thread, whether or not it runs timed code (a thread
/// keeps its clock from the first instrumented call it makes). Measured
/// here as two threads of weft's own, on one CPU, passing a turn back and
/// forth with and without a clock each; 0 where the clocks need no event.
fn perf_event_switch_ns() -> f64 {
    use weft_rt::clock::{CpuPreference, CpuSource, ThreadCpuClock, WallClock, WallPreference};
    let wall = WallClock::new(WallPreference::Auto);
    if matches!(
        ThreadCpuClock::new(&wall, CpuPreference::Auto).source(),
        CpuSource::SyscallForced | CpuSource::SyscallNoPerf(_) | CpuSource::SyscallNoTsc
    ) {
        return 0.0;
    }
    let plain = fastest_ping_pong(false);
    per_switch_ns(plain, fastest_ping_pong(true))
}

/// Turns of [`ping_pong`] a measurement passes.
const ROUNDS: u32 = 2_000;

/// The fastest of three [`ping_pong`]s, ns (infinite if none ran).
fn fastest_ping_pong(clocks: bool) -> f64 {
    (0..3)
        .filter_map(|_| ping_pong(ROUNDS, clocks))
        .fold(f64::INFINITY, f64::min)
}

/// What each switch cost more `with` than in `plain` (ping-pongs of
/// [`ROUNDS`] turns, two switches each), ns; 0 if either did not run.
fn per_switch_ns(plain: f64, with: f64) -> f64 {
    if !plain.is_finite() || !with.is_finite() {
        return 0.0;
    }
    ((with - plain) / (2.0 * f64::from(ROUNDS))).max(0.0)
}

/// ns a call of `read` takes: the fastest of ten batches of 200, timed by
/// this thread's CPU clock (a diagnosis calibrates beside its busy
/// target: timed by the wall clock, a batch counted the other threads'
/// turns on the CPU, and a system call read 0.83 µs for 0.44).
fn fastest_read_ns(read: fn() -> u64) -> f64 {
    const READS: u32 = 200;
    (0..10)
        .map(|_| {
            let start = weft_rt::clock::thread_cputime_ns();
            for _ in 0..READS {
                std::hint::black_box(read());
            }
            weft_rt::clock::thread_cputime_ns().saturating_sub(start) as f64 / f64::from(READS)
        })
        .fold(f64::INFINITY, f64::min)
}

/// What a thread's CPU clock costs on the CPU-time table, ns: its
/// re-anchor after a switch (the slot and a vDSO `CLOCK_MONOTONIC` read),
/// and the `sched_switch` program at each switch, measured with a table
/// and program of weft's own and two of its threads passing a turn (as
/// [`perf_event_switch_ns`]). (0, 0) where weft may not load BPF: the
/// target's clocks cannot use a table either.
fn table_costs() -> (f64, f64) {
    let plain = fastest_ping_pong(false);
    let Ok(mut feed) = crate::kernel::CpuTableFeed::new(std::process::id()) else {
        return (0.0, 0.0);
    };
    if feed.attach().is_err() {
        return (0.0, 0.0);
    }
    let Ok(mapping) = feed.map_here() else {
        return (0.0, 0.0);
    };
    // SAFETY: the mapping outlives every clock made on it (the players
    // are joined inside it); no table is live in weft otherwise.
    unsafe { weft_rt::clock::use_table(mapping.base()) };
    let with = fastest_ping_pong(true);
    // SAFETY: as above.
    unsafe { weft_rt::clock::use_table(0) };
    drop(mapping);
    drop(feed);
    (
        fastest_read_ns(weft_rt::clock::monotonic_ns),
        per_switch_ns(plain, with),
    )
}

/// CPU ns the two threads took for `rounds` turns passed between them on
/// the calling thread's CPU, each with its own CPU clock when `clocks`;
/// None when the threads cannot be made or pinned, or a turn waits a
/// second (a player that never came). Their CPU time, not the wall
/// clock's: the kernel charges a switch's work to the threads switched,
/// while the wall time counts every other program's turn on that CPU (a
/// diagnosis calibrates beside its busy target: the wall clock put an
/// event's switch at 4.5-9 µs beside CPython's threads, their CPU time
/// at 2.2 µs, as on an idle machine).
fn ping_pong(rounds: u32, clocks: bool) -> Option<f64> {
    use std::sync::{Arc, Condvar, Mutex};
    use std::time::Duration;
    use weft_rt::clock::{CpuPreference, ThreadCpuClock, WallClock, WallPreference};
    // SAFETY: sched_getcpu has no preconditions.
    let cpu = unsafe { libc::sched_getcpu() };
    if cpu < 0 {
        return None;
    }
    // (whose turn, both ready): a turn is passed only once both are.
    let turn = Arc::new((Mutex::new((0u32, 0u32)), Condvar::new()));
    let player = |me: u32| {
        let turn = turn.clone();
        std::thread::Builder::new()
            .name("weft-calibrate".into())
            .spawn(move || -> Option<f64> {
                // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and
                // sched_setaffinity act on this thread's own set.
                let pinned = unsafe {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(cpu as usize, &mut set);
                    libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) == 0
                };
                let _clock = clocks.then(|| {
                    ThreadCpuClock::new(&WallClock::new(WallPreference::Auto), CpuPreference::Auto)
                });
                let (lock, cv) = &*turn;
                let mut t = lock.lock().unwrap_or_else(|p| p.into_inner());
                t.1 += 1;
                cv.notify_all();
                let began = weft_rt::clock::thread_cputime_ns();
                for _ in 0..rounds {
                    let (next, waited) = cv
                        .wait_timeout_while(t, Duration::from_secs(1), |t| t.0 != me || t.1 < 2)
                        .unwrap_or_else(|p| p.into_inner());
                    t = next;
                    if waited.timed_out() {
                        // Hand the turn on, so the other one ends too.
                        t.0 = 1 - me;
                        cv.notify_all();
                        return None;
                    }
                    t.0 = 1 - me;
                    cv.notify_all();
                }
                pinned.then(|| weft_rt::clock::thread_cputime_ns().saturating_sub(began) as f64)
            })
            .ok()
    };
    let players = [player(0), player(1)];
    let mut took = Some(0.0f64);
    for p in players {
        let own = p.and_then(|h| h.join().ok().flatten());
        took = took.zip(own).map(|(a, b)| a + b);
    }
    took
}

/// A process's CPU time over its threads' lives, exited threads included.
#[derive(Debug, Default)]
struct ThreadCpu {
    /// Each thread's CPU time when last seen, ns.
    last: HashMap<u32, u64>,
    /// Each live thread's times scheduled in so far (schedstat's third
    /// field).
    switches: HashMap<u32, u64>,
    /// What threads whose IDs were reused had run, ns.
    reused: u64,
}

impl ThreadCpu {
    /// The target's CPU time so far, ns: its live threads' schedstat, and
    /// the last reading of each that exited.
    fn read(&mut self, pid: i32) -> u64 {
        for tid in thread_ids(pid) {
            let [cpu, _, slices] = schedstat_fields(pid, tid);
            if slices > 0 {
                self.switches.insert(tid, slices);
            }
            // 0: the file vanished between the listing and the read (the
            // thread exited) and its last reading stands.
            if cpu == 0 {
                continue;
            }
            let seen = self.last.entry(tid).or_insert(0);
            if cpu < *seen {
                // Another thread with the same ID: the first one's time
                // stays counted.
                self.reused += *seen;
            }
            *seen = cpu;
        }
        self.reused + self.last.values().sum::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread's clock follows what it costs there, with a margin: costs
    /// measured on a KVM guest (an event 2.4 µs a switch, a system call
    /// 0.5 µs).
    #[test]
    fn each_threads_clock_is_the_cheaper_one() {
        let costs = (2_400.0, 500.0);
        // A CPython worker at a lock over a second: 30,000 switches, a
        // timed lock acquire each.
        let worker = ThreadClock::new(30_000, 15_000, costs, 500.0);
        assert_eq!(worker.change(true, 0.0), Some(false), "{worker:?}");
        assert_eq!(worker.change(false, 0.0), None, "{worker:?}");
        // Not when the event costs little of the target's CPU anyway.
        assert_eq!(worker.change(true, 1e9), None, "{worker:?}");
        // A compute thread: a million timed calls, a hundred switches.
        let compute = ThreadClock::new(100, 1_000_000, costs, 500.0);
        assert_eq!(compute.change(false, 0.0), Some(true), "{compute:?}");
        assert_eq!(compute.change(true, 0.0), None, "{compute:?}");
        // Close to even: no change either way.
        let even = ThreadClock::new(1_000, 2_900, costs, 500.0);
        assert_eq!(
            (even.change(true, 0.0), even.change(false, 0.0)),
            (None, None)
        );
        // An idle thread with an event and no timed call loses it once
        // its switches cost more than the least change is worth.
        let idle = ThreadClock::new(1_000, 0, costs, 500.0);
        assert_eq!(idle.change(true, 0.0), Some(false), "{idle:?}");
        let quiet = ThreadClock::new(10, 0, costs, 500.0);
        assert_eq!(quiet.change(true, 0.0), None, "{quiet:?}");
    }

    /// The costliest clocks are paused until the rest cost within the
    /// allowance, and given back, cheapest first, once everything read
    /// stays within half of it over a long enough interval.
    #[test]
    fn the_costliest_clocks_are_paused() {
        let ms = 1e6;
        // Four CPython workers at just under 1 % each of 1.2 s of CPU.
        let workers: Vec<(u32, f64, bool)> = (1..=4).map(|t| (t, 11.0 * ms, false)).collect();
        let p = pauses(&workers, 12.0 * ms, true);
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p.values().all(|&v| v), "{p:?}");
        // A compute thread's cheap clock beside them is kept.
        let mut mixed = workers.clone();
        mixed.push((5, 0.3 * ms, false));
        let p = pauses(&mixed, 12.0 * ms, true);
        assert_eq!(p.get(&5), None, "{p:?}");
        // Quiet again: given back only over a long enough interval.
        let quiet: Vec<(u32, f64, bool)> = (1..=4).map(|t| (t, 0.5 * ms, true)).collect();
        assert!(pauses(&quiet, 12.0 * ms, false).is_empty());
        let p = pauses(&quiet, 12.0 * ms, true);
        assert_eq!(p.len(), 4, "{p:?}");
        assert!(p.values().all(|&v| !v), "{p:?}");
        // Paused and still costly: kept paused.
        let busy: Vec<(u32, f64, bool)> = (1..=4).map(|t| (t, 11.0 * ms, true)).collect();
        assert!(pauses(&busy, 12.0 * ms, true).is_empty());
    }

    /// A thread that ran and exited still counts in the process's CPU
    /// time (its schedstat file is gone with it).
    #[test]
    fn an_exited_threads_cpu_time_stays_counted() {
        let pid = std::process::id() as i32;
        let mut cpu = ThreadCpu::default();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (ran_tx, ran) = std::sync::mpsc::channel::<()>();
        let worker = std::thread::spawn(move || {
            // 50 ms on the CPU, however long a loaded machine takes to
            // give them.
            let own = || {
                std::fs::read_to_string("/proc/thread-self/schedstat")
                    .ok()
                    .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                    .unwrap_or(u64::MAX)
            };
            let mut x = 0u64;
            while own() < 50_000_000 {
                for _ in 0..10_000 {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
            }
            ran_tx.send(()).ok();
            rx.recv().ok();
            x
        });
        ran.recv().expect("the worker ran");
        let with_worker = cpu.read(pid);
        tx.send(()).expect("the worker waits");
        worker.join().expect("the worker ends");
        let after = cpu.read(pid);
        assert!(
            with_worker >= 40_000_000,
            "{with_worker} ns with the worker"
        );
        assert!(
            after >= with_worker,
            "{after} ns after it exited, {with_worker} before"
        );
    }
}
