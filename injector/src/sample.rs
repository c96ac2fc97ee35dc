//! Sampling: every live thread's current value of every probe, read in
//! place from the shared region, cheaply enough to repeat many times a
//! second (a live display, a Performance Consultant's tests, an OpenMetrics
//! scrape) without stopping the target.
//!
//! A [`Sampler`] keeps the values it read last time. A row whose *activity*
//! word (bumped by the thread's generated code after every entry and every
//! timed exit has updated the row, `weft_rt::layout::RowHeader::activity`),
//! state, generation and thread are unchanged since then has unchanged
//! words: the sampler reuses its values after one load, and only brings
//! the timers that were running then up to now. A changed row is read
//! whole: every probe's counter and, for timed probes, a consistent
//! (seqlock) copy of its timer words.
//!
//! Why that is exact: the thread writes its words, then bumps the activity
//! word; the sampler loads the activity word, then the words (x86-64 keeps
//! stores in order and loads in order). A sampler that sees the same
//! activity value twice saw every update that was complete before the
//! first reading; an update in progress then is seen at the next change.
//!
//! A thread's values never decrease from one sample to the next. A stop
//! reads the clock before its seqlock write is visible to other cores (the
//! `rdtsc` is not ordered with the stores before it; ordering it would add
//! ~20 ns to every timed call), by up to a microsecond or two measured
//! here, so a running timer counted up to one sample can exceed what its
//! stop then records: the sampler keeps the larger value for as long as the
//! row serves the same thread and the probe list is unchanged.
//!
//! [`Process::report`](crate::Process::report) is the full, slower reading
//! for people (names, exited threads whose rows were reused, totals).

use crate::region::Region;
pub use crate::region::RowSnapshot;
use crate::{Metrics, ProbeId, Process};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use weft_codegen::{read_timer_words, timer_value, TimerWords};
use weft_rt::layout::ROW_FREE;

/// One probe's value on one thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Value {
    /// Calls (entries).
    pub calls: u64,
    /// Inclusive wall time of the outermost activations, ns (0 without a
    /// wall timer); a running one counted up to the sample.
    pub wall_ns: u64,
    /// Inclusive CPU time, ns (0 without a CPU timer); a running one counted
    /// up to the sample.
    pub cpu_ns: u64,
    /// Self (exclusive) wall time, ns (0 without a wall timer): time in
    /// the function less time in the timed functions it called; open
    /// activations counted up to the sample, as in reports (at most
    /// `wall_ns`).
    pub self_ns: u64,
}

/// One thread's values, in the order of [`Sampler::probes`].
#[derive(Clone, Copy, Debug)]
pub struct ThreadValues<'a> {
    /// The thread's row (its small index).
    pub row: u32,
    /// Its kernel thread id (0 for the shared overflow row).
    pub tid: u32,
    /// Whether it has exited (its values are final).
    pub exited: bool,
    /// One value per probe.
    pub values: &'a [Value],
}

/// A probe as the sampler reads it.
#[derive(Clone, Copy, Debug)]
struct Sampled {
    id: ProbeId,
    /// Index of its first metric word.
    word: usize,
    metrics: Metrics,
    /// Shared with another weft: its words held values before this session
    /// (`Process::baseline`), subtracted.
    borrowed: bool,
}

/// What the sampler knows of one row.
#[derive(Clone, Debug, Default)]
struct RowState {
    /// Read at least once (the fields below are meaningful).
    known: bool,
    state: u32,
    generation: u32,
    tid: u32,
    activity: u64,
    values: Vec<Value>,
    /// The metric words that lay in written pages at the last read, and
    /// how many words were asked (`Region::written_words`). Pages of a
    /// row only become holes again when the row is claimed anew (a new
    /// generation), so while the thread is the same, a range once written
    /// stays written: once every word asked is written, no more `lseek`s.
    written: Vec<std::ops::Range<u32>>,
    written_of: u32,
    /// Timers that were running when the row was last read: (probe index,
    /// their words then, the wall and CPU ns to subtract).
    running: Vec<(usize, TimerWords, (u64, u64))>,
}

/// Counts of the last [`Sampler::sample`], for callers that watch its cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleStats {
    /// Rows sampled.
    pub rows: u32,
    /// Rows read whole (new or changed since the sample before).
    pub rows_read: u32,
    /// Thread CPU times read from `/proc` (threads with a running CPU
    /// timer).
    pub cpu_reads: u32,
    /// Changed rows whose written pages were looked up (`lseek`s): new
    /// threads, and rows with pages the thread had not written yet.
    pub holes_looked_up: u32,
    /// Timers found mid-update by a thread switched out between its two
    /// seqlock stores (given up on after
    /// [`TIMER_READ_ATTEMPTS`](weft_codegen::TIMER_READ_ATTEMPTS) tries:
    /// their closed totals stand for this sample).
    pub timers_mid_update: u32,
}

/// A reusable sampler of a process's probes; see the module docs.
#[derive(Debug)]
pub struct Sampler {
    probes: Vec<Sampled>,
    rows: Vec<RowState>,
    order: Vec<u32>,
    stats: SampleStats,
    /// The process's probe count when `probes` was built: a sampler follows
    /// probes inserted later.
    seen_probes: usize,
    /// Metric words a row read needs (past the last probe's).
    words: u32,
    /// The target's memory, for the open activations' cells (opened at
    /// the first row with a running timer).
    memory: Option<crate::memory::ProcessMemory>,
}

impl Default for Sampler {
    fn default() -> Self {
        Self::new()
    }
}

impl Sampler {
    /// A sampler with nothing read yet.
    pub fn new() -> Sampler {
        Sampler {
            probes: Vec::new(),
            rows: Vec::new(),
            order: Vec::new(),
            stats: SampleStats::default(),
            seen_probes: usize::MAX,
            words: 0,
            memory: None,
        }
    }

    /// The probes the values are of, in order: every probe of the process
    /// whose words are still its own (active or removed), as of the last
    /// sample.
    pub fn probes(&self) -> impl Iterator<Item = ProbeId> + '_ {
        self.probes.iter().map(|p| p.id)
    }

    /// What the last sample cost.
    pub fn stats(&self) -> SampleStats {
        self.stats
    }

    /// Takes a sample of `process` and returns every live (or exited, not
    /// yet reused) thread's values. Never stops the target; allocates only
    /// when the number of rows or probes grew.
    pub fn sample<'a>(&'a mut self, process: &Process) -> impl Iterator<Item = ThreadValues<'a>> {
        self.stats = SampleStats::default();
        self.order.clear();
        if let Some(region) = process.region() {
            self.follow_probes(process);
            self.read(process, region);
        }
        let rows = &self.rows;
        self.order.iter().map(move |&index| {
            let r = &rows[index as usize];
            ThreadValues {
                row: index,
                tid: r.tid,
                exited: r.state == weft_rt::layout::ROW_EXITED,
                values: &r.values,
            }
        })
    }

    fn follow_probes(&mut self, process: &Process) {
        if process.probes().len() == self.seen_probes {
            return;
        }
        self.seen_probes = process.probes().len();
        self.probes = sampled_probes(process);
        self.words = words_needed(&self.probes);
        // Every row is read afresh with the new probe list.
        self.rows.iter_mut().for_each(|r| r.known = false);
    }

    fn read(&mut self, process: &Process, region: &Region) {
        let pid = process.pid();
        let geometry = region.geometry();
        let header = region.header();
        let q32 = header.timer_ns_per_tick_q32;
        let used = header.rows_used.load(Ordering::Acquire);
        let overflow = (used > geometry.max_rows).then_some(geometry.overflow_row());
        let needed = overflow.unwrap_or(used) as usize + usize::from(overflow.is_some());
        if self.rows.len() < needed {
            self.rows.resize_with(needed, RowState::default);
        }
        // One wall reading serves the sample, taken before any word.
        let wall_now = weft_rt::clock::WallClock::in_region(header).raw();
        for index in (0..used.min(geometry.max_rows)).chain(overflow) {
            let row = region.row_header(index);
            // The activity word first (see the module docs).
            let activity = row.activity.load(Ordering::Acquire);
            let (state, generation, tid) = (
                row.state.load(Ordering::Acquire),
                row.generation.load(Ordering::Acquire),
                row.tid.load(Ordering::Acquire),
            );
            if state == ROW_FREE || state == weft_rt::layout::ROW_CLAIMED {
                continue;
            }
            self.stats.rows += 1;
            self.order.push(index);
            let r = &mut self.rows[index as usize];
            let same = r.known
                && r.activity == activity
                && r.state == state
                && r.generation == generation
                && r.tid == tid;
            if same {
                refresh_running(r, pid, wall_now, q32, &mut self.stats);
                add_open_self(
                    r,
                    &self.probes,
                    (region, index, process),
                    &mut self.memory,
                    wall_now,
                    q32,
                );
                continue;
            }
            self.stats.rows_read += 1;
            let words = region.row_words(index, self.words);
            let same_thread = r.known && r.generation == generation && r.tid == tid;
            let asked = self.words.min(geometry.metric_words);
            let all_written = same_thread
                && r.written_of == self.words
                && r.written.len() == 1
                && r.written[0] == (0..asked);
            if !all_written {
                r.written = region.written_words(index, self.words);
                r.written_of = self.words;
                self.stats.holes_looked_up += 1;
            }
            let baseline = |word: usize| process.baseline(index, generation, word as u32);
            read_row(
                r,
                same_thread,
                &self.probes,
                words,
                &baseline,
                (tid, pid),
                wall_now,
                q32,
                &mut self.stats,
            );
            add_open_self(
                r,
                &self.probes,
                (region, index, process),
                &mut self.memory,
                wall_now,
                q32,
            );
            (r.known, r.activity, r.state, r.generation, r.tid) =
                (true, activity, state, generation, tid);
        }
    }
}

/// The probes a sampler reads: every probe of the process whose words are
/// still its own (active or removed).
fn sampled_probes(process: &Process) -> Vec<Sampled> {
    process
        .probes()
        .iter()
        .filter_map(|p| {
            let words = p.words().filter(|w| !w.recycled && w.len > 0)?;
            Some(Sampled {
                id: p.id,
                word: words.first as usize,
                metrics: p.metrics(),
                borrowed: p.borrowed,
            })
        })
        .collect()
}

/// Metric words a row read of `probes` needs (past the last one's).
fn words_needed(probes: &[Sampled]) -> u32 {
    probes
        .iter()
        .map(|p| (p.word + TIMED_WORDS) as u32)
        .max()
        .unwrap_or(0)
}

/// The memory floor of sampling, for the benchmark harness: each call
/// loads what a [`Sampler::sample`] must bring into the cache and nothing
/// more — every row's activity word, and one word of every cache line of
/// the probes' words of each row whose activity moved since the call
/// before — with none of the work of turning words into values. A
/// sample's cost over this floor, measured in the same run, is the
/// sampler's own work; the floor itself is what the lines cost on the
/// machine (written by the target's threads on other cores).
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct LineFloor {
    /// Per row: the activity seen last, the written ranges of its words.
    rows: Vec<(u64, Vec<std::ops::Range<u32>>)>,
}

impl LineFloor {
    /// One pass; returns (rows whose activity moved, lines loaded).
    pub fn touch(&mut self, process: &Process) -> (u32, u64) {
        let Some(region) = process.region() else {
            return (0, 0);
        };
        let words = words_needed(&sampled_probes(process));
        let geometry = region.geometry();
        let used = region.header().rows_used.load(Ordering::Acquire);
        let live = used.min(geometry.max_rows);
        if self.rows.len() < live as usize {
            self.rows
                .resize_with(live as usize, || (u64::MAX, Vec::new()));
        }
        let (mut moved, mut lines, mut sum) = (0u32, 0u64, 0u64);
        for index in 0..live {
            let activity = region.row_header(index).activity.load(Ordering::Acquire);
            let (seen, written) = &mut self.rows[index as usize];
            if *seen == activity {
                continue;
            }
            if *seen == u64::MAX {
                // Looked up once, as the sampler does for a thread.
                *written = region.written_words(index, words);
            }
            *seen = activity;
            moved += 1;
            let row = region.row_words(index, words);
            for range in written.iter() {
                // A word at each 64-byte line start (row words start
                // 64-byte aligned), and the range's first word.
                let first = range.start as usize;
                let mut at = first;
                while at < range.end as usize {
                    sum = sum.wrapping_add(row[at].load(Ordering::Relaxed));
                    lines += 1;
                    at = (at / 8 + 1) * 8;
                }
            }
        }
        std::hint::black_box(sum);
        (moved, lines)
    }
}

/// Words per timed probe.
const TIMED_WORDS: usize = (weft_codegen::TIMER_METRIC_LEN / 8) as usize;

/// Offsets (in words) of the timer words the sampler reads.
const W_ENTRIES: usize = (weft_codegen::METRIC_ENTRIES / 8) as usize;
const W_WALL_TOTAL: usize = (weft_codegen::METRIC_WALL_TOTAL / 8) as usize;
const W_CPU_TOTAL: usize = (weft_codegen::METRIC_CPU_TOTAL / 8) as usize;
const W_SELF_TOTAL: usize = (weft_codegen::METRIC_SELF_TOTAL / 8) as usize;

/// A consistent copy of a timed probe's words `w`, read in place with the
/// seqlock reader of the layout's definition, or None after `tries`
/// attempts (a writer stuck mid-update: descheduled, or killed).
#[inline(always)]
fn timer_words(w: &[AtomicU64], tries: u32) -> Option<TimerWords> {
    // Relaxed: the reader orders its loads itself (compiler fences, and
    // x86-64 does not reorder loads with loads).
    read_timer_words(|off| w[off / 8].load(Ordering::Relaxed), tries)
}

/// Reads a row whole, from its metric words `words`.
#[allow(clippy::too_many_arguments)]
fn read_row(
    r: &mut RowState,
    same_thread: bool,
    probes: &[Sampled],
    words: &[AtomicU64],
    baseline: &dyn Fn(usize) -> u64,
    (tid, pid): (u32, i32),
    wall_now: u64,
    q32: u64,
    stats: &mut SampleStats,
) {
    // The last sample's values of the same thread stay in place as the
    // floor of the new ones (module docs): each is raised where it is, so
    // a sample touches one array of the sampler's, not two (with 1,000
    // rows of 100 timers, the sampler's own values are 3 MB).
    if !same_thread {
        r.values.clear();
    }
    r.values.resize(probes.len(), Value::default());
    r.running.clear();
    let written = std::mem::take(&mut r.written);
    let mut cpu_now: Option<u64> = None;
    for (i, p) in probes.iter().enumerate() {
        // (The row is long enough unless the geometry is smaller than the
        // probes: then the probe reads 0.)
        let end = (p.word + TIMED_WORDS).min(words.len());
        let Some(w) = words.get(p.word..end) else {
            continue;
        };
        // Words in pages the thread never wrote are zero: reading them
        // would allocate the pages (`Region::written_words`).
        let touched = written
            .iter()
            .any(|r| (r.start as usize) < end && p.word < r.end as usize);
        if !touched {
            continue;
        }
        let read = ProbeRead {
            probe: p,
            words: w,
            baseline,
            thread: (tid, pid),
            wall_now,
            q32,
        };
        let v = read.value(&mut cpu_now, stats, |t, base| {
            r.running.push((i, t, base));
        });
        let slot = &mut r.values[i];
        *slot = Value {
            calls: v.calls.max(slot.calls),
            wall_ns: v.wall_ns.max(slot.wall_ns),
            cpu_ns: v.cpu_ns.max(slot.cpu_ns),
            self_ns: v.self_ns.max(slot.self_ns),
        };
    }
    r.written = written;
}

/// One probe's words in one row, and what reading them needs.
struct ProbeRead<'a> {
    probe: &'a Sampled,
    words: &'a [AtomicU64],
    baseline: &'a dyn Fn(usize) -> u64,
    thread: (u32, i32),
    wall_now: u64,
    q32: u64,
}

impl ProbeRead<'_> {
    /// The probe's value; a timer found running is handed to `running`
    /// with its words and the borrowed base. `cpu_now`: the thread's CPU
    /// time, read once a row when a CPU timer runs.
    #[inline(always)]
    fn value(
        &self,
        cpu_now: &mut Option<u64>,
        stats: &mut SampleStats,
        running: impl FnOnce(TimerWords, (u64, u64)),
    ) -> Value {
        let (p, w) = (self.probe, self.words);
        // What a borrowed probe had counted before this session.
        let base = |offset: usize| {
            if p.borrowed {
                (self.baseline)(p.word + offset)
            } else {
                0
            }
        };
        let calls = w
            .get(W_ENTRIES)
            .map_or(0, |c| c.load(Ordering::Relaxed))
            .saturating_sub(base(W_ENTRIES));
        if !p.metrics.hooks_exit() || w.len() < TIMED_WORDS {
            return Value {
                calls,
                ..Value::default()
            };
        }
        let (base_wall, base_cpu) = (base(W_WALL_TOTAL), base(W_CPU_TOTAL));
        let base_self = base(W_SELF_TOTAL);
        let Some(mut t) = timer_words(w, weft_codegen::TIMER_READ_ATTEMPTS) else {
            stats.timers_mid_update += 1;
            // The closed totals, not counting the open interval; self
            // time capped by wall time (a stop adds to self time first).
            let wall = w[W_WALL_TOTAL].load(Ordering::Relaxed);
            return Value {
                calls,
                wall_ns: wall.saturating_sub(base_wall),
                cpu_ns: w[W_CPU_TOTAL]
                    .load(Ordering::Relaxed)
                    .saturating_sub(base_cpu),
                self_ns: self_value(
                    p.metrics,
                    w[W_SELF_TOTAL].load(Ordering::Relaxed).min(wall),
                    base_self,
                ),
            };
        };
        if t.wall_start == 0 && t.cpu_start == 0 {
            // Not running: the totals are the values.
            return Value {
                self_ns: self_value(p.metrics, t.self_total, base_self),
                ..timed_value(
                    calls,
                    p.metrics,
                    (t.wall_total, t.cpu_total),
                    (base_wall, base_cpu),
                )
            };
        }
        if p.metrics.cpu && t.cpu_start != 0 && cpu_now.is_none() {
            // The thread's CPU time, then the words again (see
            // `timer_value`).
            let (tid, pid) = self.thread;
            *cpu_now = weft_rt::clock::thread_cpu_ns_from_outside(pid as u32, tid).ok();
            stats.cpu_reads += 1;
            if let Some(again) = timer_words(w, weft_codegen::TIMER_READ_ATTEMPTS) {
                t = again;
            }
        }
        let v = timer_value(&t, self.wall_now, *cpu_now, self.q32);
        if v.running {
            running(t, (base_wall, base_cpu));
        }
        Value {
            self_ns: self_value(p.metrics, t.self_total, base_self),
            ..timed_value(
                calls,
                p.metrics,
                (v.wall_ns, v.cpu_ns),
                (base_wall, base_cpu),
            )
        }
    }
}

/// A timed probe's self time less what a borrowed probe had counted
/// before this session; reported with wall time only (it is wall time).
fn self_value(metrics: Metrics, total: u64, base: u64) -> u64 {
    if metrics.wall {
        total.saturating_sub(base)
    } else {
        0
    }
}

/// A timed probe's value: the `(wall, cpu)` timers its metrics measure
/// (0 for the others), less `base`, what a borrowed probe had counted
/// before this session.
fn timed_value(calls: u64, metrics: Metrics, (wall, cpu): (u64, u64), base: (u64, u64)) -> Value {
    let measured = |on: bool, ns: u64, base: u64| if on { ns.saturating_sub(base) } else { 0 };
    Value {
        calls,
        wall_ns: measured(metrics.wall, wall, base.0),
        cpu_ns: measured(metrics.cpu, cpu, base.1),
        self_ns: 0,
    }
}

/// Raises the self time of the row's running wall timers by their open
/// activations' self time so far (`open_self`), capped at their wall
/// time: the same definition as reports'. Borrowed probes keep their
/// closed self time (what another session's activations did is not
/// theirs to split).
fn add_open_self(
    r: &mut RowState,
    probes: &[Sampled],
    (region, index, process): (&crate::region::Region, u32, &Process),
    memory: &mut Option<crate::memory::ProcessMemory>,
    wall_now: u64,
    q32: u64,
) {
    let mut open = None;
    for &(i, words, _) in &r.running {
        let Some(p) = probes.get(i).filter(|p| p.metrics.wall && !p.borrowed) else {
            continue;
        };
        if words.wall_start == 0 {
            continue;
        }
        let open = open.get_or_insert_with(|| {
            crate::open_self::row_open_self_ticks(
                region,
                (index, process.pid(), process.retired_cells()),
                memory,
                wall_now,
            )
        });
        let base = weft_rt::layout::Geometry::metric_offset(p.word as u32);
        let ticks = i32::try_from(base)
            .ok()
            .and_then(|b| open.get(&b))
            .copied()
            .unwrap_or(0);
        let value = &mut r.values[i];
        let own = words
            .self_total
            .saturating_add(weft_rt::clock::q32_mul(ticks, q32))
            .min(value.wall_ns);
        value.self_ns = value.self_ns.max(own);
    }
}

/// Brings the timers that were running at the row's last read up to now
/// (they still run: a stop would have moved the activity word).
fn refresh_running(r: &mut RowState, pid: i32, wall_now: u64, q32: u64, stats: &mut SampleStats) {
    if r.running.is_empty() {
        return;
    }
    let cpu_now = if r.running.iter().any(|(_, w, _)| w.cpu_start != 0) {
        stats.cpu_reads += 1;
        weft_rt::clock::thread_cpu_ns_from_outside(pid as u32, r.tid).ok()
    } else {
        None
    };
    for &(i, words, (base_wall, base_cpu)) in &r.running {
        let v = timer_value(&words, wall_now, cpu_now, q32);
        let value = &mut r.values[i];
        if value.wall_ns != 0 || words.wall_start != 0 {
            value.wall_ns = value.wall_ns.max(v.wall_ns.saturating_sub(base_wall));
        }
        if words.cpu_start != 0 {
            value.cpu_ns = value.cpu_ns.max(v.cpu_ns.saturating_sub(base_cpu));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One timed probe's words, stopped, with these totals (self time:
    /// half the wall time).
    fn stopped_words(calls: u64, wall: u64, cpu: u64) -> Vec<AtomicU64> {
        let w: Vec<AtomicU64> = (0..TIMED_WORDS).map(|_| AtomicU64::new(0)).collect();
        w[W_ENTRIES].store(calls, Ordering::Relaxed);
        w[W_WALL_TOTAL].store(wall, Ordering::Relaxed);
        w[W_CPU_TOTAL].store(cpu, Ordering::Relaxed);
        w[W_SELF_TOTAL].store(wall / 2, Ordering::Relaxed);
        w
    }

    /// The same words with a wall timer running since raw tick `start`.
    fn running_words(calls: u64, wall: u64, cpu: u64, start: u64) -> Vec<AtomicU64> {
        let w = stopped_words(calls, wall, cpu);
        w[(weft_codegen::METRIC_WALL_START / 8) as usize].store(start, Ordering::Relaxed);
        w
    }

    /// Reads a one-probe row at wall tick 0 (1 ns a tick).
    fn read(r: &mut RowState, same_thread: bool, words: &[AtomicU64]) -> Value {
        read_at(r, same_thread, words, 0)
    }

    fn read_at(r: &mut RowState, same_thread: bool, words: &[AtomicU64], now: u64) -> Value {
        let probes = [Sampled {
            id: ProbeId(0),
            word: 0,
            metrics: Metrics::ALL,
            borrowed: false,
        }];
        let mut stats = SampleStats::default();
        let none = |_| 0;
        r.written = std::iter::once(0..words.len() as u32).collect();
        read_row(
            r,
            same_thread,
            &probes,
            words,
            &none,
            (1, 1),
            now,
            1 << 32,
            &mut stats,
        );
        r.values[0]
    }

    /// A stop that recorded less than the last sample counted up to while
    /// the timer ran (its clock read before its seqlock write was visible)
    /// does not make the thread's values go back; later totals above it
    /// are read as they are; a row that now serves another thread
    /// starts from its own words.
    #[test]
    fn a_threads_values_never_go_back() {
        let mut r = RowState::default();
        // Running since tick 500, read at tick 1,500: 1,000 ns so far.
        assert_eq!(
            read_at(&mut r, false, &running_words(5, 0, 900, 500), 1_500),
            Value {
                calls: 5,
                wall_ns: 1_000,
                cpu_ns: 900,
                self_ns: 0,
            }
        );
        // Its stop recorded 990 ns: the 1,000 counted stands.
        let v = read(&mut r, true, &stopped_words(6, 990, 950));
        assert_eq!((v.calls, v.wall_ns, v.cpu_ns), (6, 1_000, 950));
        assert_eq!(v.self_ns, 495);
        // Stopped, past what was counted: the totals as they are.
        let v = read(&mut r, true, &stopped_words(7, 1_400, 960));
        assert_eq!(
            (v.calls, v.wall_ns, v.cpu_ns, v.self_ns),
            (7, 1_400, 960, 700)
        );
        let v = read(&mut r, false, &stopped_words(1, 10, 10));
        assert_eq!((v.calls, v.wall_ns, v.cpu_ns), (1, 10, 10));
    }

    /// A timer whose writer was switched out between its seqlock stores:
    /// the sampler gives up on it, counts it, and reports its closed
    /// totals with self time no larger than wall time (the stop had added
    /// to self time, not yet to wall time).
    #[test]
    fn a_timer_stuck_mid_update_gives_consistent_totals() {
        let words = stopped_words(5, 1_000, 900);
        words[(weft_codegen::METRIC_SEQ / 8) as usize].store(7, Ordering::Relaxed);
        words[W_SELF_TOTAL].store(1_200, Ordering::Relaxed);
        let probes = [Sampled {
            id: ProbeId(0),
            word: 0,
            metrics: Metrics::ALL,
            borrowed: false,
        }];
        let mut r = RowState {
            written: std::iter::once(0..words.len() as u32).collect(),
            ..RowState::default()
        };
        let mut stats = SampleStats::default();
        let none = |_| 0;
        read_row(
            &mut r,
            false,
            &probes,
            &words,
            &none,
            (1, 1),
            0,
            1 << 32,
            &mut stats,
        );
        assert_eq!(stats.timers_mid_update, 1);
        assert_eq!(
            r.values[0],
            Value {
                calls: 5,
                wall_ns: 1_000,
                cpu_ns: 900,
                self_ns: 1_000,
            }
        );
    }
}
