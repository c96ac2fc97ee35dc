//! Call traces (`-m trace`): draining the threads' trace rings while the
//! target runs, rebuilding each thread's calls, and writing them as a
//! Chrome/Perfetto trace or a flame graph.
//!
//! Generated code writes an event at each traced entry and at each close of
//! a traced activation into its thread's ring in the shared region
//! (`weft_rt::layout::trace`); the injector copies the new events
//! out and hands the space back. Each event names its activation's depth
//! (its cell), so the calls are rebuilt exactly even when events were
//! dropped around them: a call whose entry was dropped is left out, one
//! whose exit was dropped ends when its thread's next event at the same or
//! a lower depth shows it had ended ([`CallEnd::Lost`]).
//!
//! The rebuilt calls are kept compactly (`store`: a few bytes per event,
//! in a temporary file past a chunk per thread) and the writers stream
//! them (`output`), so weft's memory does not grow with the trace. Past
//! the budget ([`BUDGET_ENV`]) the events are counted, not kept, and the
//! gap is marked on the thread's timeline, as are the events the threads
//! dropped themselves (a full ring).

pub(crate) mod chrome;
mod drain;
mod output;
mod store;

pub use drain::Drainer;

use crate::region::Region;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use store::{Spill, Stream};
use weft_rt::layout::{trace as ring, Geometry, ROW_ACTIVITY, ROW_CELLS};

/// Environment variable that sets the events per thread ring (a power of
/// two from 16 to 262,144) when a process's ring is first made.
pub const RING_ENV: &str = "WEFT_TRACE_RING";

/// Environment variable that sets the most bytes of trace weft keeps
/// (`512M`, `4G`, or bytes; default [`DEFAULT_BUDGET`]); past it events
/// are counted as discarded and the gap is marked.
pub const BUDGET_ENV: &str = "WEFT_TRACE_BUDGET";

/// Ring events copied out at a time (and the staging a thread keeps).
const BATCH: usize = 4096;

/// Most events copied out of the rings and not rebuilt yet (16 bytes
/// each: 64 MiB): what weft absorbs of a burst faster than it rebuilds.
const STAGE_LIMIT: usize = 1 << 22;

/// Events rebuilt per drain between two copies while more wait.
pub(crate) const REBUILD_SLICE: u64 = 4096;

/// Bytes of trace weft keeps unless told ([`BUDGET_ENV`]): about a
/// hundred million calls.
pub const DEFAULT_BUDGET: u64 = 1 << 30;

/// The events per ring to make: [`RING_ENV`] if set (rounded up to a
/// power of two, clamped), else the default.
pub fn ring_capacity() -> Result<u32, CallTraceError> {
    let Ok(text) = std::env::var(RING_ENV) else {
        return Ok(ring::DEFAULT_CAPACITY);
    };
    let n: u32 = text
        .trim()
        .parse()
        .map_err(|_| CallTraceError::RingSize(text.clone()))?;
    if !(ring::MIN_CAPACITY..=ring::MAX_CAPACITY).contains(&n) {
        return Err(CallTraceError::RingSize(text));
    }
    Ok(n.next_power_of_two().min(ring::MAX_CAPACITY))
}

/// The events per ring and its first metric word in rows of
/// `metric_words` words of which `used` are taken: [`ring_capacity`], or
/// for the default the largest that fits, down to 16,384; None when it
/// does not fit.
pub(crate) fn ring_place(
    metric_words: u32,
    used: u32,
) -> Result<Option<(u32, u32)>, CallTraceError> {
    let asked = ring_capacity()?;
    let explicit = std::env::var_os(RING_ENV).is_some();
    let mut capacity = asked;
    loop {
        let words = (ring::ring_bytes(capacity) / 8) as u32;
        // 64-byte aligned: whole cache lines, the consumer's its own.
        let first = metric_words.saturating_sub(words) & !7;
        if first > used && first != 0 {
            return Ok(Some((capacity, first)));
        }
        if explicit || capacity <= 16_384 {
            return Ok(None);
        }
        capacity /= 2;
    }
}

/// The trace budget in bytes: [`BUDGET_ENV`] if set, else
/// [`DEFAULT_BUDGET`].
pub fn budget() -> Result<u64, CallTraceError> {
    match std::env::var(BUDGET_ENV) {
        Ok(text) => parse_size(&text).ok_or(CallTraceError::Budget(text)),
        Err(_) => Ok(DEFAULT_BUDGET),
    }
}

/// `N`, `NK`, `NM` or `NG` (binary units, case-insensitive, an optional
/// `iB`/`B`) as bytes; at least 1 MiB.
fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim().to_ascii_uppercase();
    let t = t
        .strip_suffix("IB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(&t);
    let (digits, shift) = match t.chars().last()? {
        'K' => (&t[..t.len() - 1], 10),
        'M' => (&t[..t.len() - 1], 20),
        'G' => (&t[..t.len() - 1], 30),
        'T' => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: u64 = digits.trim().parse().ok()?;
    let bytes = n.checked_mul(1 << shift)?;
    (bytes >= 1 << 20).then_some(bytes)
}

/// Failure to set up or write a trace.
#[derive(Debug, thiserror::Error)]
pub enum CallTraceError {
    /// [`RING_ENV`] is not a number of events in range.
    #[error("{RING_ENV}={0}: give the events per thread ring, a number from 16 to 262144 (rounded up to a power of two)")]
    RingSize(String),
    /// [`BUDGET_ENV`] is not a size.
    #[error(
        "{BUDGET_ENV}={0}: give the most bytes of trace weft may keep, at least 1M (e.g. 512M, 4G)"
    )]
    Budget(String),
    /// The flame graph could not be drawn.
    #[error("cannot draw the flame graph: {0}")]
    Flamegraph(String),
    /// The kept trace could not be read back or the output written.
    #[error("cannot write the call trace: {0} (is the disk of the output, or of TMPDIR where weft keeps the trace, full?)")]
    Io(#[from] std::io::Error),
    /// Another live weft traces calls in the process (one consumer per
    /// ring).
    #[error("another weft (pid {0}) is tracing calls in this process, and the threads' trace rings have one reader: stop that weft first, or leave trace out of -m")]
    OtherWeft(u32),
    /// No trace was recorded.
    #[error("no call trace was recorded: add `trace` to the metrics (`calls,trace`)")]
    NotTraced,
}

/// How a traced call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CallEnd {
    /// It returned (through any `ret`, or a function it tail-called).
    Returned,
    /// Its frame was discarded (longjmp, an exception, thread exit): it
    /// ends when weft noticed.
    Unwound,
    /// Its exit event was lost (a full ring, or past the budget): it ends
    /// at the thread's next event that shows it had ended, or at its last.
    Lost,
    /// It had not ended when the trace was last drained (it ends there).
    Open,
}

impl CallEnd {
    /// Its code in a stored BEGIN record.
    fn code(self) -> u8 {
        self as u8
    }

    fn from_code(code: u8) -> CallEnd {
        match code {
            1 => CallEnd::Unwound,
            2 => CallEnd::Lost,
            3 => CallEnd::Open,
            _ => CallEnd::Returned,
        }
    }

    /// The Trace Event Format's `args` of its events (none for a return).
    fn args(self) -> &'static str {
        match self {
            CallEnd::Returned => "",
            CallEnd::Unwound => r#","args":{"ended":"unwound"}"#,
            CallEnd::Lost => r#","args":{"ended":"lost"}"#,
            CallEnd::Open => r#","args":{"ended":"open"}"#,
        }
    }
}

/// An entry whose close has not been seen yet.
#[derive(Clone, Copy, Debug)]
struct Open {
    function: u32,
    depth: u32,
    /// Its BEGIN record in the thread's stream.
    at: u64,
}

/// One thread's trace (one owner of a row: a row reused by a later thread
/// starts another).
#[derive(Debug)]
pub struct ThreadTrace {
    /// Kernel thread id.
    pub tid: u32,
    /// Thread name (`comm`).
    pub name: String,
    /// Row index and generation.
    row: (u32, u32),
    /// Events the thread could not write (its ring was full).
    pub dropped: u64,
    /// The ring's drop counter when the thread took the row (rings are not
    /// cleared when a row passes to a new thread).
    dropped_base: u64,
    /// Events weft read but did not keep: the trace had reached its
    /// budget (or its file could not be written).
    pub discarded: u64,
    /// Exit events whose entry was dropped (left out).
    pub orphan_exits: u64,
    /// Calls whose exit event was lost.
    pub lost_exits: u64,
    /// Calls recorded (begun).
    pub calls: u64,
    open: Vec<Open>,
    /// Time of the first and the last event kept.
    first_time: Option<u64>,
    last_time: u64,
    /// When weft began discarding the thread's events.
    discarding_since: Option<u64>,
    /// Drops not marked yet: the ring index of the first event after them,
    /// and how many.
    pending_gap: Option<(u64, u64)>,
    /// Events copied out of the ring, two words each as in the ring (the
    /// time; the function, kind and cell), not rebuilt yet from word
    /// `staged_at` on (the words before it are dropped once they are half
    /// the vector), and the ring index of the event at `staged_at`.
    staged: Vec<u64>,
    staged_at: usize,
    staged_index: u64,
    /// The low half of the thread's cell array address (depth 0).
    cells: u32,
    stream: Stream,
}

impl ThreadTrace {
    fn new(tid: u32, name: String, row: (u32, u32), dropped_base: u64) -> ThreadTrace {
        ThreadTrace {
            tid,
            name,
            row,
            dropped: 0,
            dropped_base,
            discarded: 0,
            orphan_exits: 0,
            lost_exits: 0,
            calls: 0,
            open: Vec::new(),
            first_time: None,
            last_time: 0,
            discarding_since: None,
            pending_gap: None,
            staged: Vec::new(),
            staged_at: 0,
            staged_index: 0,
            cells: 0,
            stream: Stream::default(),
        }
    }

    /// Rebuilds from one ring event: records the call it begins, or ends
    /// the calls it shows ended.
    fn event(
        &mut self,
        spill: &Spill,
        time: u64,
        function: u32,
        kind: u32,
        depth: u32,
    ) -> std::io::Result<()> {
        let time = time.max(self.last_time);
        self.last_time = time;
        self.first_time.get_or_insert(time);
        match kind {
            ring::KIND_ENTRY => {
                // Anything open at this depth or deeper has ended: its exit
                // was dropped.
                self.close_above(spill, depth, time, true)?;
                let at = self.stream.begin(time, function);
                self.calls += 1;
                self.open.push(Open {
                    function,
                    depth,
                    at,
                });
            }
            ring::KIND_EXIT | ring::KIND_UNWOUND => {
                self.close_above(spill, depth, time, false)?;
                match self.open.last() {
                    Some(o) if o.depth == depth && o.function == function => {
                        let o = self.open.pop().expect("just seen");
                        if kind == ring::KIND_UNWOUND {
                            self.stream
                                .set_ended(spill, o.at, CallEnd::Unwound.code())?;
                        }
                        self.stream.end(time);
                    }
                    _ => self.orphan_exits += 1,
                }
            }
            _ => self.orphan_exits += 1,
        }
        Ok(())
    }

    /// Ends the open calls deeper than `depth` (and at `depth` when
    /// `inclusive`) as lost, at `time`.
    fn close_above(
        &mut self,
        spill: &Spill,
        depth: u32,
        time: u64,
        inclusive: bool,
    ) -> std::io::Result<()> {
        while let Some(o) = self.open.last() {
            if o.depth < depth || (o.depth == depth && !inclusive) {
                break;
            }
            let o = self.open.pop().expect("just seen");
            self.stream.set_ended(spill, o.at, CallEnd::Lost.code())?;
            self.stream.end(time);
            self.lost_exits += 1;
        }
        Ok(())
    }

    /// Marks `count` lost events between the last event kept and `time`.
    fn gap(&mut self, count: u64, time: u64) {
        let time = time.max(self.last_time);
        self.stream.gap(count, time);
        self.last_time = time;
    }

    /// Counts an event read but not kept.
    fn discard(&mut self, time: u64) {
        self.discarding_since.get_or_insert(self.last_time);
        self.discarded += 1;
        self.last_time = time.max(self.last_time);
    }

    /// How a call still open at the end of the trace ended: lost when the
    /// thread's later events were not kept, else still open.
    fn open_end(&self) -> CallEnd {
        if self.discarded > 0 || self.pending_gap.is_some() {
            CallEnd::Lost
        } else {
            CallEnd::Open
        }
    }
}

/// The calls traced in one process so far.
#[derive(Debug)]
pub struct TraceLog {
    pid: i32,
    /// The process's name when the log was made (it may be gone when the
    /// trace is written).
    process: String,
    /// First metric word of every row's ring.
    first_word: u32,
    capacity: u32,
    ns_per_tick_q32: u64,
    names: HashMap<u32, String>,
    threads: Vec<ThreadTrace>,
    /// The thread trace of each row's current owner.
    by_row: HashMap<u32, usize>,
    /// Each row's activity word at its last look, while its ring is
    /// unwritten.
    activity: HashMap<u32, u64>,
    /// Each row's ring drop counter at its last drain.
    last_dropped: HashMap<u32, u64>,
    /// The tail each row's ring was last given (rows whose ring was
    /// written).
    ring_tail: HashMap<u32, u64>,
    spill: Spill,
    /// Bytes of trace kept (in memory and in the file).
    kept: u64,
    /// Events copied out of the rings, not rebuilt yet.
    staged: u64,
    /// The thread the last rebuild started with.
    rebuild_from: usize,
    /// Whether weft's drain thread runs at real-time priority.
    pub(crate) drain_realtime: bool,
    /// The longest time between two of the drain thread's copies while
    /// the threads made events: what a ring had to hold.
    pub(crate) longest_drain_gap: std::time::Duration,
    budget: u64,
    /// Why events are no longer kept, once they are not.
    full: Option<String>,
}

impl TraceLog {
    /// A log for the rings at metric word `first_word` of `capacity`
    /// events, whose times are in ticks of `ns_per_tick_q32`, keeping at
    /// most `budget` bytes of trace (see [`budget`]).
    pub fn new(
        pid: i32,
        first_word: u32,
        capacity: u32,
        ns_per_tick_q32: u64,
        budget: u64,
    ) -> TraceLog {
        TraceLog {
            pid,
            process: process_name(pid),
            first_word,
            capacity,
            ns_per_tick_q32,
            names: HashMap::new(),
            threads: Vec::new(),
            by_row: HashMap::new(),
            activity: HashMap::new(),
            last_dropped: HashMap::new(),
            ring_tail: HashMap::new(),
            spill: Spill::default(),
            kept: 0,
            staged: 0,
            rebuild_from: 0,
            drain_realtime: false,
            longest_drain_gap: std::time::Duration::ZERO,
            budget,
            full: None,
        }
    }

    /// Names the function whose metric words start at `first_word`.
    pub fn name_function(&mut self, first_word: u32, name: &str) {
        let base = Geometry::metric_offset(first_word) as u32;
        self.names.entry(base).or_insert_with(|| name.to_string());
    }

    /// The name of the function with metric base `base` (`?` and the base
    /// for one weft does not know: another weft's probe, or a removed one's
    /// open activation).
    pub fn function_name(&self, base: u32) -> String {
        self.names
            .get(&base)
            .cloned()
            .unwrap_or_else(|| format!("?{base:#x}"))
    }

    /// The threads' traces so far.
    pub fn threads(&self) -> &[ThreadTrace] {
        &self.threads
    }

    /// Events per ring.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Events dropped by every thread (full rings).
    pub fn dropped(&self) -> u64 {
        self.threads.iter().map(|t| t.dropped).sum()
    }

    /// Events read but not kept, by every thread (past the budget).
    pub fn discarded(&self) -> u64 {
        self.threads.iter().map(|t| t.discarded).sum()
    }

    /// Bytes of trace kept so far.
    pub fn kept_bytes(&self) -> u64 {
        self.kept
    }

    /// The most bytes of trace kept.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Why events stopped being kept (the budget, or the file), if they
    /// did.
    pub fn full(&self) -> Option<&str> {
        self.full.as_deref()
    }

    /// Copies row `index`'s new events out of its ring and hands their
    /// space back to the thread; returns how many. Unless `force`, a row
    /// whose activity word has not moved since its last drain is skipped
    /// with one load.
    pub(crate) fn drain_row(&mut self, region: &Region, index: u32, force: bool) -> u64 {
        let at = Geometry::metric_offset(self.first_word) as usize;
        if let Some(&tail) = self.ring_tail.get(&index) {
            // One load: nothing new since the last drain (a full ring has
            // head = tail + capacity).
            if !force && region.load_word(index, at + ring::HEAD) == tail {
                return 0;
            }
        } else {
            let activity = region.load_word(index, ROW_ACTIVITY);
            if !force && self.activity.get(&index) == Some(&activity) {
                return 0;
            }
            self.activity.insert(index, activity);
            // The ring's first page may never have been written (a thread
            // that traced nothing): reading it would allocate it in the
            // target. Once written, it stays.
            let written = region.written_words(index, self.first_word + 1);
            if !written.iter().any(|r| r.contains(&self.first_word)) {
                return 0;
            }
        }
        let (_, tid, generation, name) = region.row_identity(index);
        let current = self
            .by_row
            .get(&index)
            .copied()
            .filter(|&t| self.threads[t].row == (index, generation));
        let t = match current {
            Some(t) => t,
            None => {
                // The row's previous owner is gone: its records go to the
                // file, and its memory back.
                if let Some(&old) = self.by_row.get(&index) {
                    if let Err(e) = self.threads[old].stream.spill(&mut self.spill, true) {
                        self.full
                            .get_or_insert(format!("writing the trace in {}: {e}", spill_dir()));
                    }
                }
                let name = crate::inspect::procfs::thread_name(self.pid, tid).unwrap_or(name);
                let base = self.last_dropped.get(&index).copied().unwrap_or(0);
                self.threads
                    .push(ThreadTrace::new(tid, name, (index, generation), base));
                self.by_row.insert(index, self.threads.len() - 1);
                self.threads.len() - 1
            }
        };
        let Some(tail_word) = region.trace_tail(index, at + ring::TAIL) else {
            return 0;
        };
        let head = region.load_word(index, at + ring::HEAD);
        let mut tail = tail_word.load(std::sync::atomic::Ordering::Acquire);
        let capacity = u64::from(self.capacity);
        if head.wrapping_sub(tail) > capacity {
            // Never happens with a well-behaved writer: read what the ring
            // can still hold.
            tail = head.saturating_sub(capacity);
        }
        let thread = &mut self.threads[t];
        thread.cells = region.load_word(index, ROW_CELLS) as u32;
        if thread.staged_at == thread.staged.len() {
            thread.staged_index = tail;
        }
        // Past the staging limit the ring is left to fill (and its thread
        // to drop, marked) until the rebuild catches up.
        let room = (STAGE_LIMIT as u64).saturating_sub(self.staged);
        let mut i = tail;
        while i < head.min(tail + room) {
            // The events up to the ring's end or the batch's, copied at
            // once: the thread does not touch slots below `head`.
            let slot = i & (capacity - 1);
            let n = (head - i).min(capacity - slot).min(BATCH as u64) as usize;
            let from = thread.staged.len();
            thread.staged.resize(from + 2 * n, 0);
            let offset = at + ring::EVENTS + ring::EVENT_SIZE * slot as usize;
            if !region.copy_words(index, offset, &mut thread.staged[from..]) {
                thread.staged.truncate(from);
                break;
            }
            const _: () = assert!(ring::EV_TIME == 0 && ring::EV_FUNCTION == 8);
            i += n as u64;
        }
        // Read before the tail is handed back: while the ring stays full
        // (head - tail = capacity) the thread can only drop, so every drop
        // counted here came after event tail + capacity - 1, before the
        // ones to come.
        let dropped = region.load_word(index, at + ring::DROPPED);
        // Loads above, then the store: the thread reuses the slots only
        // once it sees the new tail (x86-64 does not reorder a load with a
        // later store).
        tail_word.store(i, std::sync::atomic::Ordering::Release);
        self.ring_tail.insert(index, i);
        let total = dropped.saturating_sub(thread.dropped_base);
        if total > thread.dropped {
            let new = total - thread.dropped;
            let gap = thread.pending_gap.get_or_insert((tail + capacity, 0));
            gap.1 += new;
            thread.dropped = total;
        }
        self.last_dropped.insert(index, dropped);
        self.staged += i - tail;
        i - tail
    }

    /// Rebuilds calls from at most `limit` of the events copied out so
    /// far; returns how many.
    fn rebuild(&mut self, limit: u64) -> u64 {
        let mut done = 0;
        // Round the threads, from one further each time: no thread's
        // events wait behind another's.
        let threads = self.threads.len();
        self.rebuild_from = (self.rebuild_from + 1) % threads.max(1);
        let first = self.rebuild_from;
        for t in (0..threads).map(|k| (first + k) % threads) {
            if done >= limit || self.staged == 0 {
                break;
            }
            if self.threads[t].staged_at == self.threads[t].staged.len() {
                continue;
            }
            let keep = self.full.is_none() && self.kept < self.budget;
            if !keep && self.full.is_none() {
                self.full = Some(format!(
                    "the trace reached its budget of {} MiB ({BUDGET_ENV})",
                    self.budget >> 20
                ));
            }
            let thread = &mut self.threads[t];
            let before = thread.stream.len();
            let n = (((thread.staged.len() - thread.staged_at) / 2) as u64).min(limit - done);
            let mut failed = None;
            let staged = std::mem::take(&mut thread.staged);
            let from = thread.staged_at;
            thread.staged_at += 2 * n as usize;
            for e in staged[from..thread.staged_at].chunks_exact(2) {
                let (time, meta) = (e[0], e[1]);
                let i = thread.staged_index;
                thread.staged_index += 1;
                if !keep || failed.is_some() {
                    thread.discard(time);
                    continue;
                }
                if let Some((before_event, count)) = thread.pending_gap {
                    if i >= before_event {
                        thread.gap(count, time);
                        thread.pending_gap = None;
                    }
                }
                let function = meta as u32;
                let cell = (meta >> 32) as u32;
                let depth =
                    cell.wrapping_sub(thread.cells) / weft_rt::layout::metric::CELL_SIZE as u32;
                if let Err(e) = thread.event(
                    &self.spill,
                    time,
                    function & !ring::KIND_MASK,
                    function & ring::KIND_MASK,
                    depth,
                ) {
                    failed = Some(e);
                }
            }
            thread.staged = staged;
            if thread.staged_at == thread.staged.len() {
                thread.staged.clear();
                thread.staged_at = 0;
                // A burst's worth of staging is not kept for the next one.
                thread.staged.shrink_to(2 * BATCH);
            } else if thread.staged_at > thread.staged.len() / 2 {
                thread.staged.drain(..thread.staged_at);
                thread.staged_at = 0;
            }
            if failed.is_none() {
                // A thread whose row has a new owner makes no more events:
                // its records go to the file, and its memory back.
                let gone = self.by_row.get(&thread.row.0) != Some(&t);
                let all = gone && thread.staged_at == thread.staged.len();
                failed = thread.stream.spill(&mut self.spill, all).err();
            }
            self.kept += thread.stream.len() - before;
            self.staged -= n;
            done += n;
            if let Some(e) = failed {
                self.full
                    .get_or_insert(format!("writing the trace in {}: {e}", spill_dir()));
            }
        }
        done
    }

    /// Drains every row handed out so far (`force`: every one, not only
    /// those with new events) and rebuilds the calls of what was read:
    /// all of it when `force`, else at most [`REBUILD_SLICE`] events (the
    /// rest the next time: copying out comes first, so that the rings
    /// empty quickly). Returns the events drained and those left to
    /// rebuild.
    pub(crate) fn drain_all(&mut self, region: &Region, force: bool) -> (u64, u64) {
        let used = region
            .header()
            .rows_used
            .load(std::sync::atomic::Ordering::Acquire)
            .min(region.geometry().max_rows);
        let drained = (0..used)
            .map(|index| self.drain_row(region, index, force))
            .sum();
        self.rebuild(if force { u64::MAX } else { REBUILD_SLICE });
        (drained, self.staged)
    }

    /// What a report says of the trace.
    pub fn summary(&self) -> TraceSummary {
        TraceSummary {
            ring_events: self.capacity,
            calls: self.threads.iter().map(|t| t.calls).sum(),
            dropped_events: self.dropped(),
            discarded_events: self.discarded(),
            kept_bytes: self.kept,
            budget_bytes: self.budget,
            not_kept: self.full.clone(),
            drain_realtime: self.drain_realtime,
            longest_drain_gap_us: self.longest_drain_gap.as_micros() as u64,
            threads: self
                .threads
                .iter()
                .map(|t| ThreadTraceSummary {
                    tid: t.tid,
                    name: t.name.clone(),
                    calls: t.calls,
                    dropped_events: t.dropped,
                    discarded_events: t.discarded,
                    lost_exits: t.lost_exits,
                    orphan_exits: t.orphan_exits,
                })
                .collect(),
        }
    }
}

/// Where the trace file is kept, for messages.
fn spill_dir() -> String {
    std::env::temp_dir().display().to_string()
}

fn process_name(pid: i32) -> String {
    std::fs::read_to_string(crate::inspect::procfs::pid_file(pid, "comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_else(|_| format!("pid {pid}"))
}

/// What a report says of the call trace (`trace` in the JSON report).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TraceSummary {
    /// Events per thread ring.
    pub ring_events: u32,
    /// Calls recorded.
    pub calls: u64,
    /// Events the threads could not write because their ring was full.
    pub dropped_events: u64,
    /// Events weft read but did not keep: past the budget.
    pub discarded_events: u64,
    /// Bytes of trace weft kept.
    pub kept_bytes: u64,
    /// The most bytes of trace weft keeps ([`BUDGET_ENV`]).
    pub budget_bytes: u64,
    /// Why weft stopped keeping events, if it did: the budget, or the
    /// temporary file could not be written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_kept: Option<String>,
    /// Whether weft's drain thread ran at real-time priority (root or
    /// CAP_SYS_NICE): without, it competes with the target's threads.
    pub drain_realtime: bool,
    /// The longest time, in µs, between two copies out of the rings by
    /// weft's drain thread while the threads made events (its sleep, the
    /// copying, and any time the machine kept it from running): a ring
    /// that fills faster than that drops.
    pub longest_drain_gap_us: u64,
    /// Per thread.
    pub threads: Vec<ThreadTraceSummary>,
}

/// One thread's part of [`TraceSummary`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ThreadTraceSummary {
    /// Kernel thread id.
    pub tid: u32,
    /// Thread name.
    pub name: String,
    /// Calls recorded.
    pub calls: u64,
    /// Events dropped (a full ring).
    pub dropped_events: u64,
    /// Events not kept (past the budget).
    pub discarded_events: u64,
    /// Calls whose exit event was lost.
    pub lost_exits: u64,
    /// Exit events whose entry was dropped.
    pub orphan_exits: u64,
}

/// A shared handle on a process's trace, carried by its reports so that
/// `--format chrome-trace` and `--format flamegraph` can write it.
#[derive(Clone, Debug)]
pub struct Trace(pub Arc<Mutex<TraceLog>>);

impl Trace {
    /// Runs `f` on the log.
    pub fn with<R>(&self, f: impl FnOnce(&TraceLog) -> R) -> R {
        let log = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f(&log)
    }
}

impl PartialEq for Trace {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Trace {}

#[cfg(test)]
mod tests;
