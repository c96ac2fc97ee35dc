//! Writing a kept trace: the Chrome/Perfetto Trace Event Format, streamed
//! event by event, and the folded stacks of a flame graph, aggregated by
//! call path as the records are read. Neither holds more than a thread's
//! open calls and the distinct call paths.

use super::chrome::{json_string, ChromeTrace};
use super::store::Record;
use super::{CallEnd, CallTraceError, ThreadTrace, TraceLog};
use std::collections::HashMap;
use std::io::Write;

/// Name of a gap's slice: `count` events lost there.
fn gap_name(count: u64) -> String {
    format!("weft: {count} events lost")
}

/// One thread's trace as it is written, in nesting order, times in ns
/// from the trace's origin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// A call of `function` began.
    Begin {
        function: u32,
        ended: CallEnd,
        ns: u64,
    },
    /// The innermost open call (this one) ended.
    End {
        function: u32,
        ended: CallEnd,
        ns: u64,
    },
    /// `count` events were lost from `from` to `to` (a slice inside the
    /// calls open then).
    Gap { count: u64, from: u64, to: u64 },
}

impl TraceLog {
    /// Nanoseconds of `raw` after `origin`.
    fn ns(&self, raw: u64, origin: u64) -> u64 {
        weft_codegen::q32_mul(raw.saturating_sub(origin), self.ns_per_tick_q32)
    }

    /// The earliest time in the trace.
    fn origin(&self) -> u64 {
        self.threads
            .iter()
            .filter_map(|t| t.first_time)
            .min()
            .unwrap_or(0)
    }

    /// Replays thread `t`'s calls as [`Step`]s: its records, then the
    /// drops not marked yet and the events not kept (gaps at its end), then
    /// the ends of the calls still open, at its last event.
    pub(super) fn replay(
        &self,
        t: &ThreadTrace,
        origin: u64,
        mut step: impl FnMut(Step) -> std::io::Result<()>,
    ) -> Result<(), CallTraceError> {
        let still_open: Vec<u64> = t.open.iter().map(|o| o.at).collect();
        let open_end = t.open_end();
        let mut stack: Vec<(u32, CallEnd)> = Vec::new();
        let mut last = origin;
        let mut failed = None;
        t.stream.for_each(&self.spill, |record| {
            if failed.is_some() {
                return;
            }
            let s = match record {
                Record::Begin {
                    time,
                    function,
                    ended,
                    at,
                } => {
                    last = time;
                    let ended = if still_open.contains(&at) {
                        open_end
                    } else {
                        CallEnd::from_code(ended)
                    };
                    stack.push((function, ended));
                    Step::Begin {
                        function,
                        ended,
                        ns: self.ns(time, origin),
                    }
                }
                Record::End { time } => {
                    last = time;
                    let Some((function, ended)) = stack.pop() else {
                        return;
                    };
                    Step::End {
                        function,
                        ended,
                        ns: self.ns(time, origin),
                    }
                }
                Record::Gap { count, from, to } => {
                    last = to;
                    Step::Gap {
                        count,
                        from: self.ns(from, origin),
                        to: self.ns(to, origin),
                    }
                }
            };
            failed = step(s).err();
        })?;
        if let Some(e) = failed {
            return Err(e.into());
        }
        let at_last = self.ns(last, origin);
        if let Some((_, count)) = t.pending_gap {
            step(Step::Gap {
                count,
                from: at_last,
                to: at_last,
            })?;
        }
        let end = self.ns(t.last_time.max(last), origin);
        if let Some(since) = t.discarding_since {
            step(Step::Gap {
                count: t.discarded,
                from: self.ns(since.max(last), origin).min(end),
                to: end,
            })?;
        }
        while let Some((function, ended)) = stack.pop() {
            step(Step::End {
                function,
                ended,
                ns: end,
            })?;
        }
        Ok(())
    }

    /// Writes the trace in the Trace Event Format (the JSON object form):
    /// per call a `ph: "B"` event at its entry and a `ph: "E"` event at its
    /// end, `ts` in microseconds from the first call, `pid` the target,
    /// `tid` the thread, written in each thread's nesting order; lost
    /// events as a slice `weft: N events lost` where they were lost;
    /// `ph: "M"` metadata events name the process and the threads.
    /// Readable by the Perfetto UI, chrome://tracing and speedscope.
    ///
    /// Begin/end pairs rather than `X` slices because the nesting then
    /// comes from their order, not from timestamps: a TSC that advances
    /// in coarse steps (10 ns on an AMD guest here) gives a call and its
    /// only callee the same start and end, and viewers nest such `X`
    /// slices either way round.
    pub fn write_chrome_trace(&self, out: &mut dyn Write) -> Result<(), CallTraceError> {
        let out = std::io::BufWriter::with_capacity(64 * 1024, out);
        let pid = self.pid;
        let origin = self.origin();
        let mut out = ChromeTrace::begin(out, pid, &self.process)?;
        // Each function's name, escaped once.
        let mut names: HashMap<u32, String> = HashMap::new();
        for t in &self.threads {
            let tid = t.tid;
            out.thread_name(pid, u64::from(tid), &t.name)?;
            self.replay(t, origin, |s| {
                let (name, ph, ns, args) = match s {
                    Step::Begin {
                        function,
                        ended,
                        ns,
                    } => (function, "B", ns, ended.args()),
                    Step::End {
                        function,
                        ended,
                        ns,
                    } => (function, "E", ns, ended.args()),
                    Step::Gap { count, from, to } => {
                        let name = json_string(&gap_name(count));
                        let args = format!(",\"args\":{{\"lost_events\":{count}}}");
                        for (ph, ns) in [("B", from), ("E", to)] {
                            out.raw(format_args!(
                                "{{\"name\":{name},\"cat\":\"weft-gap\",\"ph\":\"{ph}\",\"ts\":{},\"pid\":{pid},\"tid\":{tid}{args}}}",
                                Micros(ns)
                            ))?;
                        }
                        return Ok(());
                    }
                };
                let name = names
                    .entry(name)
                    .or_insert_with(|| json_string(&self.function_name(name)));
                out.raw(format_args!(
                    "{{\"name\":{name},\"cat\":\"weft\",\"ph\":\"{ph}\",\"ts\":{},\"pid\":{pid},\"tid\":{tid}{args}}}",
                    Micros(ns)
                ))
            })?;
        }
        let summary = self.summary();
        let other = serde_json::json!({
            "tool": "weft",
            "ring_events": summary.ring_events,
            "dropped_events": summary.dropped_events,
            "discarded_events": summary.discarded_events,
            "kept_bytes": summary.kept_bytes,
            "budget_bytes": summary.budget_bytes,
            "not_kept": summary.not_kept,
            "drain_realtime": summary.drain_realtime,
            "longest_drain_gap_us": summary.longest_drain_gap_us,
            "threads": summary.threads,
        });
        out.finish("ns", &other)?;
        Ok(())
    }

    /// The trace in the Trace Event Format, whole in memory (see
    /// [`TraceLog::write_chrome_trace`], which streams it).
    pub fn to_chrome_trace(&self) -> Result<String, CallTraceError> {
        let mut out = Vec::new();
        self.write_chrome_trace(&mut out)?;
        String::from_utf8(out).map_err(|e| CallTraceError::Io(std::io::Error::other(e)))
    }

    /// Folded stacks (`a;b;c N`): the self wall time in ns of every call
    /// path, merged over the threads (or under a root frame per thread
    /// when `per_thread`), the input of a flame graph. Lost events are a
    /// frame `weft: events lost` where they were lost.
    pub fn folded(&self, per_thread: bool) -> Result<Vec<String>, CallTraceError> {
        let origin = self.origin();
        let mut paths = Paths::default();
        for t in &self.threads {
            let root = if per_thread {
                paths.child(ROOT, Frame::Thread(t.tid, t.name.clone()))
            } else {
                ROOT
            };
            // The open calls: (path node, start, time in their callees).
            let mut open: Vec<(usize, u64, u64)> = Vec::new();
            let close = |paths: &mut Paths, open: &mut Vec<(usize, u64, u64)>, ns: u64| {
                if let Some((node, start, callees)) = open.pop() {
                    let dur = ns.saturating_sub(start);
                    paths.self_ns[node] += dur.saturating_sub(callees);
                    if let Some(parent) = open.last_mut() {
                        parent.2 += dur;
                    }
                }
            };
            self.replay(t, origin, |s| {
                let parent = open.last().map_or(root, |o| o.0);
                match s {
                    Step::Begin { function, ns, .. } => {
                        open.push((paths.child(parent, Frame::Function(function)), ns, 0));
                    }
                    Step::End { ns, .. } => close(&mut paths, &mut open, ns),
                    Step::Gap { from, to, .. } => {
                        open.push((paths.child(parent, Frame::Gap), from, 0));
                        close(&mut paths, &mut open, to);
                    }
                }
                Ok(())
            })?;
        }
        Ok(paths.lines(|f| match f {
            Frame::Function(base) => self.function_name(*base).replace(';', ":"),
            Frame::Thread(tid, name) => format!("{} ({tid})", name.replace(';', ":")),
            Frame::Gap => "weft: events lost".to_string(),
        }))
    }

    /// Writes an SVG flame graph of inclusive wall time by call path (see
    /// [`TraceLog::folded`]), drawn by `inferno`; a trace without calls
    /// is an SVG that says so.
    pub fn write_flamegraph(
        &self,
        per_thread: bool,
        out: &mut dyn Write,
    ) -> Result<(), CallTraceError> {
        let title = format!("weft: wall time by call path, pid {}", self.pid);
        let lines = self.folded(per_thread)?;
        if lines.is_empty() {
            let text = xml_escape(&format!("{title}: no calls were traced"));
            write!(
                out,
                concat!(
                    "<?xml version=\"1.0\" standalone=\"no\"?>\n",
                    "<svg version=\"1.1\" width=\"1200\" height=\"66\" viewBox=\"0 0 1200 66\" xmlns=\"http://www.w3.org/2000/svg\">\n",
                    "<title>{text}</title>\n",
                    "<text x=\"600\" y=\"38\" text-anchor=\"middle\" font-family=\"Verdana\" font-size=\"14\">{text}</text>\n",
                    "</svg>\n"
                ),
                text = text
            )?;
            return Ok(());
        }
        let mut options = inferno::flamegraph::Options::default();
        options.title = title;
        options.count_name = "ns".to_string();
        inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out)
            .map_err(|e| CallTraceError::Flamegraph(e.to_string()))
    }

    /// The SVG flame graph as a string (see [`TraceLog::write_flamegraph`]).
    pub fn to_flamegraph(&self, per_thread: bool) -> Result<String, CallTraceError> {
        let mut out = Vec::new();
        self.write_flamegraph(per_thread, &mut out)?;
        String::from_utf8(out).map_err(|e| CallTraceError::Flamegraph(e.to_string()))
    }
}

/// A frame of a call path.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Frame {
    Function(u32),
    Thread(u32, String),
    Gap,
}

/// The root of every path (no frame).
const ROOT: usize = 0;

/// The distinct call paths as a tree, each with its self time.
struct Paths {
    children: HashMap<(usize, Frame), usize>,
    /// Per node: its parent and frame (none for the root).
    nodes: Vec<Option<(usize, Frame)>>,
    self_ns: Vec<u64>,
}

impl Default for Paths {
    fn default() -> Paths {
        Paths {
            children: HashMap::new(),
            nodes: vec![None],
            self_ns: vec![0],
        }
    }
}

impl Paths {
    fn child(&mut self, parent: usize, frame: Frame) -> usize {
        let next = self.nodes.len();
        let node = *self.children.entry((parent, frame.clone())).or_insert(next);
        if node == next {
            self.nodes.push(Some((parent, frame)));
            self.self_ns.push(0);
        }
        node
    }

    /// `a;b;c N` for every path with self time, sorted.
    fn lines(&self, name: impl Fn(&Frame) -> String) -> Vec<String> {
        let mut lines: Vec<String> = (1..self.nodes.len())
            .filter(|&n| self.self_ns[n] > 0)
            .map(|n| {
                let mut frames = Vec::new();
                let mut at = n;
                while let Some((parent, frame)) = &self.nodes[at] {
                    frames.push(name(frame));
                    at = *parent;
                }
                frames.reverse();
                format!("{} {}", frames.join(";"), self.self_ns[n])
            })
            .collect();
        lines.sort();
        lines
    }
}

/// Nanoseconds written as exact decimal microseconds.
struct Micros(u64);

impl std::fmt::Display for Micros {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{:03}", self.0 / 1000, self.0 % 1000)
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
