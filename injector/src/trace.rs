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

use crate::region::Region;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use weft_rt::layout::{trace as ring, Geometry, ROW_ACTIVITY, ROW_CELLS};

/// Environment variable that sets the events per thread ring (a power of
/// two from 16 to 262,144) when a process's ring is first made.
pub const RING_ENV: &str = "WEFT_TRACE_RING";

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

/// Failure to set up or write a trace.
#[derive(Debug, thiserror::Error)]
pub enum CallTraceError {
    /// [`RING_ENV`] is not a number of events in range.
    #[error("{RING_ENV}={0}: give the events per thread ring, a number from 16 to 262144 (rounded up to a power of two)")]
    RingSize(String),
    /// The flame graph could not be drawn.
    #[error("cannot draw the flame graph: {0}")]
    Flamegraph(String),
    /// Another live weft traces calls in the process (one consumer per
    /// ring).
    #[error("another weft (pid {0}) is tracing calls in this process, and the threads' trace rings have one reader: stop that weft first, or leave trace out of -m")]
    OtherWeft(u32),
    /// No trace was recorded.
    #[error("no call trace was recorded: add `trace` to the metrics (-m calls,trace)")]
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
    /// Its exit event was dropped (full ring): it ends at the thread's
    /// next event that shows it had ended.
    Lost,
    /// It had not ended when the trace was last drained (it ends there).
    Open,
}

/// One call of one thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TracedCall {
    /// The function: its metric base (see [`TraceLog::function_name`]).
    pub function: u32,
    /// Raw wall reading at the entry.
    pub start: u64,
    /// Raw wall reading at the end.
    pub end: u64,
    /// Depth on the thread's activation stack (0: outermost traced or
    /// timed activation).
    pub depth: u32,
    /// How it ended.
    pub ended: CallEnd,
}

/// An entry whose close has not been seen yet.
#[derive(Clone, Copy, Debug)]
struct Open {
    function: u32,
    start: u64,
    depth: u32,
}

/// One thread's trace (one owner of a row: a row reused by a later thread
/// starts another).
#[derive(Clone, Debug)]
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
    /// Exit events whose entry was dropped (left out).
    pub orphan_exits: u64,
    /// Calls, in the order they ended.
    pub calls: Vec<TracedCall>,
    open: Vec<Open>,
    last_time: u64,
}

impl ThreadTrace {
    fn event(&mut self, time: u64, function: u32, kind: u32, depth: u32) {
        let time = time.max(self.last_time);
        self.last_time = time;
        match kind {
            ring::KIND_ENTRY => {
                // Anything open at this depth or deeper has ended: its exit
                // was dropped.
                self.close_above(depth, time, true);
                self.open.push(Open {
                    function,
                    start: time,
                    depth,
                });
            }
            ring::KIND_EXIT | ring::KIND_UNWOUND => {
                self.close_above(depth, time, false);
                match self.open.last() {
                    Some(o) if o.depth == depth && o.function == function => {
                        let o = self.open.pop().expect("just seen");
                        self.calls.push(TracedCall {
                            function,
                            start: o.start,
                            end: time,
                            depth,
                            ended: if kind == ring::KIND_EXIT {
                                CallEnd::Returned
                            } else {
                                CallEnd::Unwound
                            },
                        });
                    }
                    _ => self.orphan_exits += 1,
                }
            }
            _ => self.orphan_exits += 1,
        }
    }

    /// Ends the open calls deeper than `depth` (and at `depth` when
    /// `inclusive`) as lost, at `time`.
    fn close_above(&mut self, depth: u32, time: u64, inclusive: bool) {
        while let Some(o) = self.open.last() {
            if o.depth < depth || (o.depth == depth && !inclusive) {
                break;
            }
            let o = self.open.pop().expect("just seen");
            self.calls.push(TracedCall {
                function: o.function,
                start: o.start,
                end: time,
                depth: o.depth,
                ended: CallEnd::Lost,
            });
        }
    }

    /// The calls with those still open ended at the thread's last event.
    pub fn all_calls(&self) -> Vec<TracedCall> {
        let mut calls = self.calls.clone();
        for o in self.open.iter().rev() {
            calls.push(TracedCall {
                function: o.function,
                start: o.start,
                end: self.last_time,
                depth: o.depth,
                ended: CallEnd::Open,
            });
        }
        calls
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
    /// Each row's activity word at its last drain.
    activity: HashMap<u32, u64>,
    /// Each row's ring drop counter at its last drain.
    last_dropped: HashMap<u32, u64>,
}

impl TraceLog {
    /// A log for the rings at metric word `first_word` of `capacity`
    /// events, whose times are in ticks of `ns_per_tick_q32`.
    pub fn new(pid: i32, first_word: u32, capacity: u32, ns_per_tick_q32: u64) -> TraceLog {
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

    /// Events dropped by every thread.
    pub fn dropped(&self) -> u64 {
        self.threads.iter().map(|t| t.dropped).sum()
    }

    /// Copies row `index`'s new events out of its ring and hands their
    /// space back to the thread. Unless `force`, a row whose activity word
    /// has not moved since its last drain is skipped with one load.
    pub(crate) fn drain_row(&mut self, region: &Region, index: u32, force: bool) {
        let activity = region.load_word(index, ROW_ACTIVITY);
        if !force && self.activity.get(&index) == Some(&activity) {
            return;
        }
        let at = Geometry::metric_offset(self.first_word) as usize;
        // The ring's first page may never have been written (a thread that
        // traced nothing): reading it would allocate it in the target.
        let written = region.written_words(index, self.first_word + 1);
        if !written.iter().any(|r| r.contains(&self.first_word)) {
            return;
        }
        self.activity.insert(index, activity);
        let (_, tid, generation, name) = region.row_identity(index);
        let current = self
            .by_row
            .get(&index)
            .copied()
            .filter(|&t| self.threads[t].row == (index, generation));
        let t = match current {
            Some(t) => t,
            None => {
                let name = crate::report::live_thread_name(self.pid, tid).unwrap_or(name);
                self.threads.push(ThreadTrace {
                    tid,
                    name,
                    row: (index, generation),
                    dropped: 0,
                    dropped_base: self.last_dropped.get(&index).copied().unwrap_or(0),
                    orphan_exits: 0,
                    calls: Vec::new(),
                    open: Vec::new(),
                    last_time: 0,
                });
                self.by_row.insert(index, self.threads.len() - 1);
                self.threads.len() - 1
            }
        };
        let Some(tail_word) = region.trace_tail(index, at + ring::TAIL) else {
            return;
        };
        let head = region.load_word(index, at + ring::HEAD);
        let mut tail = tail_word.load(std::sync::atomic::Ordering::Acquire);
        let capacity = u64::from(self.capacity);
        if head.wrapping_sub(tail) > capacity {
            // Never happens with a well-behaved writer: read what the ring
            // can still hold.
            tail = head.saturating_sub(capacity);
        }
        let cells = region.load_word(index, ROW_CELLS) as u32;
        let thread = &mut self.threads[t];
        for i in tail..head {
            let slot = at + ring::EVENTS + ring::EVENT_SIZE * (i & (capacity - 1)) as usize;
            let time = region.load_word(index, slot + ring::EV_TIME);
            let meta = region.load_word(index, slot + ring::EV_FUNCTION);
            let function = meta as u32;
            let cell = (meta >> 32) as u32;
            let depth = cell.wrapping_sub(cells) / weft_rt::layout::metric::CELL_SIZE as u32;
            thread.event(
                time,
                function & !ring::KIND_MASK,
                function & ring::KIND_MASK,
                depth,
            );
        }
        // Loads above, then the store: the thread reuses the slots only
        // once it sees the new tail (x86-64 does not reorder a load with a
        // later store).
        tail_word.store(head, std::sync::atomic::Ordering::Release);
        let dropped = region.load_word(index, at + ring::DROPPED);
        thread.dropped = dropped.saturating_sub(thread.dropped_base);
        self.last_dropped.insert(index, dropped);
    }

    /// Drains every row handed out so far.
    pub(crate) fn drain_all(&mut self, region: &Region, force: bool) {
        let used = region
            .header()
            .rows_used
            .load(std::sync::atomic::Ordering::Acquire)
            .min(region.geometry().max_rows);
        for index in 0..used {
            self.drain_row(region, index, force);
        }
    }

    /// Nanoseconds of `raw` after `origin`.
    fn ns(&self, raw: u64, origin: u64) -> u64 {
        weft_codegen::q32_mul(raw.saturating_sub(origin), self.ns_per_tick_q32)
    }

    /// The earliest time in the trace.
    fn origin(&self) -> u64 {
        self.threads
            .iter()
            .flat_map(|t| {
                t.calls
                    .iter()
                    .map(|c| c.start)
                    .chain(t.open.iter().map(|o| o.start))
            })
            .min()
            .unwrap_or(0)
    }

    /// What a report says of the trace.
    pub fn summary(&self) -> TraceSummary {
        TraceSummary {
            ring_events: self.capacity,
            calls: self
                .threads
                .iter()
                .map(|t| (t.calls.len() + t.open.len()) as u64)
                .sum(),
            dropped_events: self.dropped(),
            threads: self
                .threads
                .iter()
                .map(|t| ThreadTraceSummary {
                    tid: t.tid,
                    name: t.name.clone(),
                    calls: (t.calls.len() + t.open.len()) as u64,
                    dropped_events: t.dropped,
                    lost_exits: t.calls.iter().filter(|c| c.ended == CallEnd::Lost).count() as u64,
                    orphan_exits: t.orphan_exits,
                })
                .collect(),
        }
    }

    /// The trace in the Trace Event Format (the JSON object form): per
    /// call a `ph: "B"` event at its entry and a `ph: "E"` event at its
    /// end, `ts` in microseconds from the first call, `pid` the target,
    /// `tid` the thread, written in each thread's nesting order; `ph: "M"`
    /// metadata events name the process and the threads. Readable by the
    /// Perfetto UI, chrome://tracing and speedscope.
    ///
    /// Begin/end pairs rather than `X` slices because the nesting then
    /// comes from their order, not from timestamps: a TSC that advances
    /// in coarse steps (10 ns on an AMD guest here) gives a call and its
    /// only callee the same start and end, and viewers nest such `X`
    /// slices either way round.
    pub fn to_chrome_trace(&self) -> String {
        use serde_json::json;
        let origin = self.origin();
        let us = |ns: u64| -> serde_json::Value {
            // Exact decimal microseconds (ns / 1000 with three digits).
            serde_json::Value::Number(
                serde_json::Number::from_f64(ns as f64 / 1000.0)
                    .unwrap_or_else(|| serde_json::Number::from(0)),
            )
        };
        let mut events = vec![json!({
            "name": "process_name", "ph": "M", "pid": self.pid, "tid": self.pid,
            "args": {"name": self.process}
        })];
        for t in &self.threads {
            events.push(json!({
                "name": "thread_name", "ph": "M", "pid": self.pid, "tid": t.tid,
                "args": {"name": t.name}
            }));
            let event = |phase: Phase, c: &TracedCall, ns: u64| {
                let mut e = json!({
                    "name": self.function_name(c.function),
                    "cat": "weft",
                    "ph": phase.code(),
                    "ts": us(ns),
                    "pid": self.pid,
                    "tid": t.tid,
                });
                // On both halves: viewers match an end to its begin by
                // name and arguments.
                if c.ended != CallEnd::Returned {
                    e["args"] = json!({ "ended": c.ended });
                }
                e
            };
            for (phase, c, ns) in nested_order(t.all_calls(), |raw| self.ns(raw, origin)) {
                events.push(event(phase, &c, ns));
            }
        }
        let summary = self.summary();
        let out = json!({
            "traceEvents": events,
            "displayTimeUnit": "ns",
            "otherData": {
                "tool": "weft",
                "ring_events": summary.ring_events,
                "dropped_events": summary.dropped_events,
                "threads": summary.threads,
            }
        });
        out.to_string()
    }

    /// Folded stacks (`a;b;c N`): the self wall time in ns of every call
    /// path, merged over the threads (or under a root frame per thread
    /// when `per_thread`), the input of a flame graph.
    pub fn folded(&self, per_thread: bool) -> Vec<String> {
        let mut totals: std::collections::BTreeMap<String, u64> = Default::default();
        let origin = self.origin();
        for t in &self.threads {
            let root = per_thread.then(|| format!("{} ({})", t.name, t.tid));
            // The open calls: (call path, start, time in their callees).
            let mut open: Vec<(String, u64, u64)> = Vec::new();
            for (phase, c, ns) in nested_order(t.all_calls(), |raw| self.ns(raw, origin)) {
                if phase == Phase::Begin {
                    let name = self.function_name(c.function).replace(';', ":");
                    let path = match (open.last(), &root) {
                        (Some((parent, _, _)), _) => format!("{parent};{name}"),
                        (None, Some(root)) => format!("{root};{name}"),
                        (None, None) => name,
                    };
                    open.push((path, ns, 0));
                } else if let Some((path, start, callees)) = open.pop() {
                    let dur = ns.saturating_sub(start);
                    *totals.entry(path).or_default() += dur.saturating_sub(callees);
                    if let Some(parent) = open.last_mut() {
                        parent.2 += dur;
                    }
                }
            }
        }
        totals
            .into_iter()
            .filter(|(_, ns)| *ns > 0)
            .map(|(stack, ns)| format!("{stack} {ns}"))
            .collect()
    }

    /// An SVG flame graph of inclusive wall time by call path (see
    /// [`TraceLog::folded`]), drawn by `inferno`.
    pub fn to_flamegraph(&self, per_thread: bool) -> Result<String, CallTraceError> {
        let lines = self.folded(per_thread);
        let mut options = inferno::flamegraph::Options::default();
        options.title = format!("weft: wall time by call path, pid {}", self.pid);
        options.count_name = "ns".to_string();
        let mut out = Vec::new();
        inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut out)
            .map_err(|e| CallTraceError::Flamegraph(e.to_string()))?;
        String::from_utf8(out).map_err(|e| CallTraceError::Flamegraph(e.to_string()))
    }
}

/// Which end of a call an event of [`nested_order`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Begin,
    End,
}

impl Phase {
    /// The Trace Event Format's `ph`.
    fn code(self) -> &'static str {
        match self {
            Phase::Begin => "B",
            Phase::End => "E",
        }
    }
}

/// One thread's calls as begin and end events in nesting
/// order, each with its time in ns (`ns` converts a raw reading). Calls are
/// ordered by start, parents first at the same start (their depth); an
/// end never comes after its parent's end nor after the start of the next
/// call at its depth or above, so the events nest even where an unwound
/// call's end (when weft noticed it) is later than what followed it.
fn nested_order(
    mut calls: Vec<TracedCall>,
    ns: impl Fn(u64) -> u64,
) -> Vec<(Phase, TracedCall, u64)> {
    calls.sort_by_key(|c| (c.start, c.depth));
    let mut out = Vec::with_capacity(2 * calls.len());
    // The open calls and their end times.
    let mut stack: Vec<(TracedCall, u64)> = Vec::new();
    for c in calls {
        let start = ns(c.start);
        while let Some(&(top, end)) = stack.last() {
            if top.depth < c.depth {
                break;
            }
            stack.pop();
            out.push((Phase::End, top, end.min(start)));
        }
        let parent_end = stack.last().map_or(u64::MAX, |&(_, end)| end);
        let end = ns(c.end).max(start).min(parent_end);
        out.push((Phase::Begin, c, start.min(end)));
        stack.push((c, end));
    }
    while let Some((top, end)) = stack.pop() {
        out.push((Phase::End, top, end));
    }
    out
}

fn process_name(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
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
    /// Events dropped.
    pub dropped_events: u64,
    /// Calls whose exit event was dropped.
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
mod tests {
    use super::*;

    fn thread() -> ThreadTrace {
        ThreadTrace {
            tid: 1,
            name: "t".into(),
            row: (0, 0),
            dropped: 0,
            dropped_base: 0,
            orphan_exits: 0,
            calls: Vec::new(),
            open: Vec::new(),
            last_time: 0,
        }
    }

    #[test]
    fn nesting_is_rebuilt_from_depths_even_with_lost_events() {
        let mut t = thread();
        // a(0) { b(1) {} b(1) { c(2) <exit lost> } <entry of d lost> d-exit(1) }
        t.event(10, 256, ring::KIND_ENTRY, 0);
        t.event(11, 264, ring::KIND_ENTRY, 1);
        t.event(12, 264, ring::KIND_EXIT, 1);
        t.event(13, 264, ring::KIND_ENTRY, 1);
        t.event(14, 272, ring::KIND_ENTRY, 2);
        t.event(15, 264, ring::KIND_EXIT, 1);
        t.event(16, 280, ring::KIND_EXIT, 1);
        t.event(17, 256, ring::KIND_UNWOUND, 0);
        let c: Vec<_> = t
            .calls
            .iter()
            .map(|c| (c.function, c.start, c.end, c.depth, c.ended))
            .collect();
        assert_eq!(
            c,
            [
                (264, 11, 12, 1, CallEnd::Returned),
                (272, 14, 15, 2, CallEnd::Lost),
                (264, 13, 15, 1, CallEnd::Returned),
                (256, 10, 17, 0, CallEnd::Unwound),
            ]
        );
        assert_eq!(t.orphan_exits, 1);
    }

    #[test]
    fn folded_stacks_are_self_times() {
        let mut log = TraceLog::new(1, 0, 16, 1 << 32);
        log.names.insert(256, "a".into());
        log.names.insert(264, "b".into());
        let mut t = thread();
        t.event(0, 256, ring::KIND_ENTRY, 0);
        t.event(10, 264, ring::KIND_ENTRY, 1);
        t.event(30, 264, ring::KIND_EXIT, 1);
        t.event(100, 256, ring::KIND_EXIT, 0);
        log.threads.push(t);
        assert_eq!(log.folded(false), ["a 80", "a;b 20"]);
        assert_eq!(log.folded(true), ["t (1);a 80", "t (1);a;b 20"]);
    }

    /// `(phase, function, ns)` of [`nested_order`] on `calls`.
    fn order(calls: &[(u32, u64, u64, u32)]) -> Vec<(&'static str, u32, u64)> {
        let calls = calls
            .iter()
            .map(|&(function, start, end, depth)| TracedCall {
                function,
                start,
                end,
                depth,
                ended: CallEnd::Returned,
            })
            .collect();
        nested_order(calls, |raw| raw)
            .into_iter()
            .map(|(phase, c, ns)| (phase.code(), c.function, ns))
            .collect()
    }

    #[test]
    fn calls_with_equal_times_nest_by_depth() {
        // a(0) { b(1) { c(2) } } with b and c on a's timestamps (a coarse
        // TSC), then a sibling d(0) starting where a ended; listed in the
        // order they ended.
        let got = order(&[
            (3, 10, 20, 2),
            (2, 10, 20, 1),
            (1, 10, 20, 0),
            (4, 20, 25, 0),
        ]);
        assert_eq!(
            got,
            [
                ("B", 1, 10),
                ("B", 2, 10),
                ("B", 3, 10),
                ("E", 3, 20),
                ("E", 2, 20),
                ("E", 1, 20),
                ("B", 4, 20),
                ("E", 4, 25),
            ]
        );
    }

    #[test]
    fn ends_are_clamped_so_events_nest() {
        // An unwound b(1) noticed at 40, after its sibling c(1) started at
        // 30 and after its parent a(0) ended at 35.
        let got = order(&[(2, 10, 40, 1), (3, 30, 32, 1), (1, 5, 35, 0)]);
        assert_eq!(
            got,
            [
                ("B", 1, 5),
                ("B", 2, 10),
                ("E", 2, 30),
                ("B", 3, 30),
                ("E", 3, 32),
                ("E", 1, 35),
            ]
        );
    }
}
