//! The report as a table for people (see `docs/report-format.md`).

use super::text::{render, render_aligned};
use super::*;

impl Report {
    /// The report as a table for people, with the default
    /// [`TableOptions`].
    pub fn to_table(&self) -> String {
        self.to_table_with(&TableOptions::default())
    }

    /// The report as a table for people: with at most
    /// [`COMPACT_MAX_FUNCTIONS`] functions (and no option that asks for
    /// the long form) one row per thread and columns per function, when
    /// that fits [`TABLE_WIDTH`] columns; otherwise the long form, one row
    /// per function (see `docs/report-format.md`). Latency histograms of
    /// the first few functions that keep one follow.
    pub fn to_table_with(&self, options: &TableOptions) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "weft: pid {}  {:.2} s  {} function(s)  {} thread(s)",
            self.pid,
            self.duration_ns as f64 / 1e9,
            self.functions.len(),
            self.threads.len()
        );
        let wants_long = options.by_thread || options.top.is_some() || options.sort.is_some();
        let compact = (self.tabled().count() <= COMPACT_MAX_FUNCTIONS && !wants_long)
            .then(|| self.compact_table())
            .filter(|t| t.lines().all(|l| l.chars().count() <= TABLE_WIDTH));
        let shown = match compact {
            Some(table) => {
                out.push_str(&table);
                self.sorted(&self.tabled().collect::<Vec<_>>(), options.sort_key(self))
            }
            None => self.long_table(options, &mut out),
        };
        let uncalled = self.functions.len() - self.tabled().count();
        if uncalled > 0 {
            let _ = writeln!(
                out,
                "… {uncalled} kernel probe(s) with no calls not shown (the JSON report lists them)"
            );
        }
        self.histograms(options, &shown, &mut out);
        self.kernel_attribution(&mut out);
        if let Some(clocks) = &self.clocks {
            // Only the clocks of the metrics asked (`-m wall` has no CPU
            // clock to speak of), each on its line: a clock's description
            // is long.
            let mut line = "times: inclusive, outermost activation per thread".to_string();
            if self.metrics.contains(&"wall") {
                line.push_str("; self: less the timed functions it called");
            }
            let _ = writeln!(out, "{line}");
            if let Some(wall) = &clocks.wall {
                let line = format!("wall clock: {wall}");
                let _ = writeln!(out, "{}", ellipsize(&line, TABLE_WIDTH));
            }
            if let Some(cpu) = &clocks.cpu {
                let line = format!("cpu clock: {cpu}");
                let _ = writeln!(out, "{}", ellipsize(&line, TABLE_WIDTH));
            }
        }
        if let Some(t) = &self.trace {
            let _ = writeln!(
                out,
                "trace: {} calls recorded on {} thread(s), {} events dropped, {} not kept{}",
                t.calls,
                t.threads.len(),
                t.dropped_events,
                t.discarded_events,
                hint(options.hints.write_trace)
            );
        }
        if self.overflow_threads > 0 {
            let _ = writeln!(
                out,
                "note: {} thread(s) found the runtime's thread table full; their calls are summed in tid 0 (overflow)",
                self.overflow_threads
            );
        }
        out
    }

    /// Kernel probes split by the user function their threads were in.
    fn kernel_attribution(&self, out: &mut String) {
        for f in self
            .functions
            .iter()
            .filter(|f| !f.by_user_function.is_empty())
        {
            let _ = writeln!(
                out,
                "{} ({}) by user function:",
                f.name,
                f.mechanism.unwrap_or("-")
            );
            let mut table = vec![vec![
                "  FUNCTION".to_string(),
                "calls".to_string(),
                "wall".to_string(),
                "cpu".to_string(),
            ]];
            let mut split: Vec<_> = f.by_user_function.iter().collect();
            split.sort_by(|a, b| {
                b.1.wall_ns
                    .cmp(&a.1.wall_ns)
                    .then(b.1.calls.cmp(&a.1.calls))
            });
            for (user, c) in split {
                let time = |v: Option<u64>| v.map_or("-".to_string(), human_ns);
                table.push(vec![
                    format!("  {user}"),
                    group_digits(c.calls),
                    time(c.wall_ns),
                    time(c.cpu_ns),
                ]);
            }
            render(&table, 2, out);
        }
        if let Some(k) = &self.kernel {
            if k.lost_calls > 0 {
                let _ = writeln!(
                    out,
                    "note: {} kernel call(s) not counted: the totals map was full",
                    k.lost_calls
                );
            }
        }
    }

    /// The functions the tables show: all but the kernel probes nothing
    /// called (`syscall:*` asks for hundreds, a thread makes a few).
    /// User functions stay, called or not: that one was not is news.
    fn tabled(&self) -> impl Iterator<Item = &FunctionReport> {
        self.functions
            .iter()
            .filter(|f| f.mechanism.is_none() || f.calls > 0)
    }

    /// One row per thread, columns per function (the form for a few
    /// functions).
    fn compact_table(&self) -> String {
        let mut out = String::new();
        let mut table: Vec<Vec<String>> = Vec::new();
        let mut header = vec!["TID".to_string(), "THREAD".to_string()];
        for f in self.tabled() {
            header.push(f.label());
            if f.wall_ns.is_some() {
                header.push("wall".into());
            }
            if f.self_ns.is_some() {
                header.push("self".into());
            }
            if f.cpu_ns.is_some() {
                header.push("cpu".into());
            }
        }
        table.push(header);
        for t in &self.threads {
            let mut row = vec![t.tid.to_string(), thread_label(t)];
            for f in self.tabled() {
                let c = t.functions.get(&f.name);
                row.push(c.map_or("-".to_string(), |c| group_digits(c.calls)));
                let time = |v: Option<u64>| v.map_or("-".to_string(), human_ns);
                if f.wall_ns.is_some() {
                    row.push(time(c.and_then(|c| c.wall_ns)));
                }
                if f.self_ns.is_some() {
                    row.push(time(c.and_then(|c| c.self_ns)));
                }
                if f.cpu_ns.is_some() {
                    row.push(time(c.and_then(|c| c.cpu_ns)));
                }
            }
            table.push(row);
        }
        let mut total = vec!["total".to_string(), String::new()];
        for f in self.tabled() {
            total.push(group_digits(f.calls));
            total.extend(f.wall_ns.map(human_ns));
            total.extend(f.self_ns.map(human_ns));
            total.extend(f.cpu_ns.map(human_ns));
        }
        table.push(total);
        render(&table, 2, &mut out);
        out
    }

    /// `functions` in the order of `key`: times and calls descending,
    /// names ascending; ties by name.
    fn sorted<'a>(
        &self,
        functions: &[&'a FunctionReport],
        key: SortKey,
    ) -> Vec<&'a FunctionReport> {
        let mut v = functions.to_vec();
        let value = |f: &FunctionReport| match key {
            SortKey::Calls => f.calls,
            SortKey::Wall => f.wall_ns.unwrap_or(0),
            SortKey::Cpu => f.cpu_ns.unwrap_or(0),
            SortKey::SelfTime => f.self_ns.unwrap_or(0),
            SortKey::Name => 0,
        };
        v.sort_by(|a, b| value(b).cmp(&value(a)).then_with(|| a.name.cmp(&b.name)));
        v
    }

    /// The long form: one row per function, the threads after (a summary
    /// line each, or with `by_thread` each thread's own function rows).
    /// Returns the function rows shown, in order.
    fn long_table<'a>(
        &'a self,
        options: &TableOptions,
        out: &mut String,
    ) -> Vec<&'a FunctionReport> {
        let key = options.sort_key(self);
        let top = options.top.unwrap_or(DEFAULT_TOP);
        let all = self.sorted(&self.tabled().collect::<Vec<_>>(), key);
        let shown: Vec<&FunctionReport> = limit(&all, top).to_vec();
        let columns = Columns::of(self);
        let rows: Vec<Row> = shown
            .iter()
            .map(|f| {
                Row::of(
                    &columns,
                    f,
                    f.calls,
                    f.wall_ns,
                    f.self_ns,
                    f.cpu_ns,
                    Some(f.threads),
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "functions by {}{}:",
            key.name(),
            if shown.len() < all.len() {
                format!(", top {} of {}", shown.len(), all.len())
            } else {
                String::new()
            }
        );
        columns.render(&rows, true, out);
        left_out(&all[shown.len()..], &options.hints, out);
        if options.by_thread {
            for t in &self.threads {
                let _ = writeln!(out);
                let _ = writeln!(out, "thread {} {}:", t.tid, thread_label(t));
                let mine: Vec<&FunctionReport> = self
                    .functions
                    .iter()
                    .filter(|f| t.functions.contains_key(&f.name))
                    .collect();
                let value = |f: &FunctionReport| {
                    let c = &t.functions[&f.name];
                    match key {
                        SortKey::Calls => c.calls,
                        SortKey::Wall => c.wall_ns.unwrap_or(0),
                        SortKey::Cpu => c.cpu_ns.unwrap_or(0),
                        SortKey::SelfTime => c.self_ns.unwrap_or(0),
                        SortKey::Name => 0,
                    }
                };
                let mut mine = mine;
                mine.sort_by(|a, b| value(b).cmp(&value(a)).then_with(|| a.name.cmp(&b.name)));
                let kept = limit(&mine, top);
                let rows: Vec<Row> = kept
                    .iter()
                    .map(|f| {
                        let c = &t.functions[&f.name];
                        Row::of(&columns, f, c.calls, c.wall_ns, c.self_ns, c.cpu_ns, None)
                    })
                    .collect();
                columns.render(&rows, false, out);
                if kept.len() < mine.len() {
                    let _ = writeln!(
                        out,
                        "… {} more function(s) of this thread not shown{}",
                        mine.len() - kept.len(),
                        hint(options.hints.show_all)
                    );
                }
            }
        } else {
            self.thread_summary(key, top, &options.hints, out);
        }
        shown
    }

    /// One line per thread: its calls, the functions it called and its
    /// first function by `key`.
    fn thread_summary(&self, key: SortKey, top: usize, hints: &TableHints, out: &mut String) {
        let mut threads: Vec<&ThreadReport> = self.threads.iter().collect();
        let calls = |t: &ThreadReport| t.functions.values().map(|c| c.calls).sum::<u64>();
        threads.sort_by(|a, b| calls(b).cmp(&calls(a)).then(a.tid.cmp(&b.tid)));
        let kept = limit(&threads, top);
        let _ = writeln!(
            out,
            "\nthreads by calls{}{}:",
            if kept.len() < threads.len() {
                format!(", top {} of {}", kept.len(), threads.len())
            } else {
                String::new()
            },
            hint(hints.by_thread)
        );
        let mut table = vec![vec![
            "TID".to_string(),
            "THREAD".to_string(),
            "CALLS".to_string(),
            "FUNCTIONS".to_string(),
            format!("FIRST BY {}", key.name().to_uppercase()),
        ]];
        for t in kept {
            let first = self
                .sorted(
                    &self
                        .functions
                        .iter()
                        .filter(|f| t.functions.contains_key(&f.name))
                        .collect::<Vec<_>>(),
                    key,
                )
                .first()
                .map(|f| f.name.clone())
                .unwrap_or_default();
            table.push(vec![
                t.tid.to_string(),
                thread_label(t),
                group_digits(calls(t)),
                t.functions.len().to_string(),
                first,
            ]);
        }
        // Fit the width: the thread name and the function name give way.
        let fixed: usize = [0usize, 2, 3]
            .iter()
            .map(|&c| {
                table
                    .iter()
                    .map(|r| r[c].chars().count())
                    .max()
                    .unwrap_or(0)
                    + 2
            })
            .sum();
        let room = TABLE_WIDTH.saturating_sub(fixed);
        let name_w = (room / 3).clamp(8, 24);
        let first_w = room.saturating_sub(name_w + 2).max(12);
        for row in table.iter_mut().skip(1) {
            row[1] = ellipsize(&row[1], name_w);
            row[4] = ellipsize(&row[4], first_w);
        }
        let mut text = String::new();
        render_aligned(&table, &[false, false, true, true, false], &mut text);
        out.push_str(&text);
        if kept.len() < threads.len() {
            let _ = writeln!(
                out,
                "… {} more thread(s) not shown{}",
                threads.len() - kept.len(),
                hint(hints.show_all)
            );
        }
    }

    /// The latency histograms: of the functions `options` names, else of
    /// the first [`HISTOGRAMS_SHOWN`] of `shown` that keep one.
    fn histograms(&self, options: &TableOptions, shown: &[&FunctionReport], out: &mut String) {
        let chosen: Vec<&FunctionReport> = if options.histograms.is_empty() {
            shown
                .iter()
                .copied()
                .filter(|f| f.histogram.as_ref().is_some_and(|h| h.total() > 0))
                .take(HISTOGRAMS_SHOWN)
                .collect()
        } else {
            self.functions
                .iter()
                .filter(|f| options.histograms.iter().any(|n| n == &f.name))
                .collect()
        };
        for f in chosen {
            let _ = writeln!(out);
            match &f.histogram {
                Some(h) => histogram_text(&f.name, h, out),
                None => {
                    let _ = writeln!(
                        out,
                        "no latency histogram of {}{}",
                        f.name,
                        hint(options.hints.keep_histogram)
                    );
                }
            }
        }
    }
}

/// A thread's name for the table, `(exited)` when it has.
fn thread_label(t: &ThreadReport) -> String {
    if t.exited {
        format!("{} (exited)", t.name)
    } else {
        t.name.clone()
    }
}

/// The first `top` (0: all).
fn limit<T>(v: &[T], top: usize) -> &[T] {
    if top == 0 {
        v
    } else {
        &v[..top.min(v.len())]
    }
}

/// The line saying what the long table left out.
fn left_out(rest: &[&FunctionReport], hints: &TableHints, out: &mut String) {
    if rest.is_empty() {
        return;
    }
    let calls: u64 = rest.iter().map(|f| f.calls).sum();
    let wall: Option<u64> = rest.iter().map(|f| f.wall_ns).sum();
    let _ = writeln!(
        out,
        "… {} more function(s) not shown: {} calls{}{}",
        rest.len(),
        group_digits(calls),
        wall.map_or(String::new(), |w| format!(", {} wall", human_ns(w))),
        hint(hints.show_all)
    );
}

/// A histogram as text: one line per bucket from the first to the last
/// non-empty one, with a bar.
pub(super) fn histogram_text(name: &str, h: &Histogram, out: &mut String) {
    let total = h.total();
    let head = format!(
        "latency of {}: {} call(s) (outermost, wall time, all threads)",
        ellipsize(name, 48),
        group_digits(total)
    );
    let _ = writeln!(out, "{}", ellipsize(&head, TABLE_WIDTH));
    let used: Vec<usize> = (0..h.counts.len()).filter(|&b| h.counts[b] > 0).collect();
    let (Some(&lo), Some(&hi)) = (used.first(), used.last()) else {
        return;
    };
    let max = h.counts.iter().copied().max().unwrap_or(1).max(1);
    for b in lo..=hi {
        let (from, to) = Histogram::bounds(b);
        let range = match to {
            Some(to) => format!("[{:>9}, {:>9})", human_ns(from), human_ns(to)),
            None => format!("[{:>9},       ...)", human_ns(from)),
        };
        let count = h.counts[b];
        let bar = "#".repeat(((count * HISTOGRAM_BAR as u64).div_ceil(max)) as usize);
        let line = format!("  {range}  {:>13}  {bar}", group_digits(count));
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

/// Width the long table (and the compact one, to be chosen) fits in.
pub const TABLE_WIDTH: usize = 120;
/// The compact table (columns per function) is used up to this many
/// functions, when it fits [`TABLE_WIDTH`].
pub const COMPACT_MAX_FUNCTIONS: usize = 4;
/// Function rows (and thread rows) the long table shows without `--top`.
pub const DEFAULT_TOP: usize = 50;
/// Histograms the table shows without `--histogram-of`.
pub const HISTOGRAMS_SHOWN: usize = 3;
/// Characters of the longest histogram bar.
const HISTOGRAM_BAR: usize = 40;

/// How the table is laid out (the JSON report is always complete).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableOptions {
    /// Rows of the long table (functions, and threads); `Some(0)`: all;
    /// None: [`DEFAULT_TOP`]. Asks for the long form.
    pub top: Option<usize>,
    /// Row order; None: wall time, else CPU time, else calls. Asks for the
    /// long form.
    pub sort: Option<SortKey>,
    /// Each thread's own function rows after the functions.
    pub by_thread: bool,
    /// Functions whose latency histogram to show (empty: the first
    /// [`HISTOGRAMS_SHOWN`] rows that have one).
    pub histograms: Vec<String>,
    /// How the caller's user asks for what the table leaves out.
    pub hints: TableHints,
}

/// How the caller's user asks for what a table leaves out, added in
/// parentheses to each line that leaves something out. A command line
/// puts its own flags here (the library knows none); None adds nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableHints {
    /// How to show every row (what `top: Some(0)` does).
    pub show_all: Option<&'static str>,
    /// How to show each thread's functions (what `by_thread` does).
    pub by_thread: Option<&'static str>,
    /// How to write out a call trace the report only counts.
    pub write_trace: Option<&'static str>,
    /// How to keep a latency histogram.
    pub keep_histogram: Option<&'static str>,
}

/// ` (how)`, or nothing.
fn hint(how: Option<&str>) -> String {
    how.map_or(String::new(), |h| format!(" ({h})"))
}

impl TableOptions {
    fn sort_key(&self, report: &Report) -> SortKey {
        self.sort.unwrap_or(if report.metrics.contains(&"wall") {
            SortKey::Wall
        } else if report.metrics.contains(&"cpu") {
            SortKey::Cpu
        } else {
            SortKey::Calls
        })
    }
}

/// The order of the long table's rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    /// Calls, most first.
    Calls,
    /// Inclusive wall time, most first.
    Wall,
    /// Inclusive CPU time, most first.
    Cpu,
    /// Self wall time, most first.
    SelfTime,
    /// Function name, A to Z.
    Name,
}

impl SortKey {
    /// Parses `calls`, `wall`, `cpu`, `self` or `name`.
    pub fn parse(text: &str) -> Result<SortKey, String> {
        Ok(match text {
            "calls" => SortKey::Calls,
            "wall" => SortKey::Wall,
            "cpu" => SortKey::Cpu,
            "self" => SortKey::SelfTime,
            "name" => SortKey::Name,
            other => {
                return Err(format!(
                    "unknown sort key `{other}`: choose from calls, wall, cpu, self, name"
                ))
            }
        })
    }

    fn name(self) -> &'static str {
        match self {
            SortKey::Calls => "calls",
            SortKey::Wall => "wall time",
            SortKey::Cpu => "cpu time",
            SortKey::SelfTime => "self time",
            SortKey::Name => "name",
        }
    }
}

/// The long table's columns: which are shown and how wide the names are.
struct Columns {
    wall: bool,
    self_time: bool,
    cpu: bool,
}

/// One row of the long table, as text.
struct Row {
    name: String,
    module: String,
    numbers: Vec<String>,
}

impl Row {
    /// The row of `f` under `columns`: a column the table shows and this
    /// row has no figure for (a kernel probe's self time, say) reads `-`,
    /// so every figure stays under its header.
    fn of(
        columns: &Columns,
        f: &FunctionReport,
        calls: u64,
        wall: Option<u64>,
        own: Option<u64>,
        cpu: Option<u64>,
        threads: Option<u32>,
    ) -> Row {
        let dash = || "-".to_string();
        let time = |v: Option<u64>| v.map_or_else(dash, human_ns);
        let per_call = |v: Option<u64>| match v {
            Some(t) if calls > 0 => {
                human_ns(((u128::from(t) + u128::from(calls) / 2) / u128::from(calls)) as u64)
            }
            _ => dash(),
        };
        let mut numbers = vec![group_digits(calls)];
        for (shown, value) in [
            (columns.wall, wall),
            (columns.self_time, own),
            (columns.cpu, cpu),
        ] {
            if shown {
                numbers.push(time(value));
            }
        }
        if columns.wall {
            numbers.push(per_call(wall));
        }
        if columns.self_time {
            numbers.push(per_call(own));
        }
        if columns.cpu && !columns.wall {
            numbers.push(per_call(cpu));
        }
        numbers.extend(threads.map(|t| t.to_string()));
        Row {
            name: f.label(),
            module: f.module.clone(),
            numbers,
        }
    }
}

impl Columns {
    fn of(report: &Report) -> Columns {
        let any = |p: fn(&FunctionReport) -> bool| report.functions.iter().any(p);
        Columns {
            wall: any(|f| f.wall_ns.is_some()),
            self_time: any(|f| f.self_ns.is_some()),
            cpu: any(|f| f.cpu_ns.is_some()),
        }
    }

    /// Headers of the number columns, in [`Row::of`]'s order.
    fn headers(&self, threads: bool) -> Vec<&'static str> {
        let mut h = vec!["CALLS"];
        for (on, name) in [
            (self.wall, "WALL"),
            (self.self_time, "SELF"),
            (self.cpu, "CPU"),
        ] {
            if on {
                h.push(name);
            }
        }
        if self.wall {
            h.push("WALL/CALL");
        }
        if self.self_time {
            h.push("SELF/CALL");
        }
        if self.cpu && !self.wall {
            h.push("CPU/CALL");
        }
        if threads {
            h.push("THREADS");
        }
        h
    }

    /// Renders `rows` in [`TABLE_WIDTH`] columns: the numbers as wide as
    /// they are, the module up to 16 characters, the function name the
    /// rest (at least 16), names cut in the middle with `…`.
    fn render(&self, rows: &[Row], threads: bool, out: &mut String) {
        let headers = self.headers(threads);
        let number_w: Vec<usize> = (0..headers.len())
            .map(|c| {
                rows.iter()
                    .filter_map(|r| r.numbers.get(c))
                    .map(|s| s.chars().count())
                    .chain([headers[c].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let numbers: usize = number_w.iter().map(|w| w + 2).sum();
        let longest = |f: fn(&Row) -> &String, head: usize| {
            rows.iter()
                .map(|r| f(r).chars().count())
                .max()
                .unwrap_or(0)
                .max(head)
        };
        let module_w = longest(|r| &r.module, 6).min(16);
        let name_w = longest(|r| &r.name, 8)
            .min(TABLE_WIDTH.saturating_sub(numbers + module_w + 2))
            .max(16);
        let mut table = vec![{
            let mut h = vec!["FUNCTION".to_string(), "MODULE".to_string()];
            h.extend(headers.iter().map(|s| s.to_string()));
            h
        }];
        for r in rows {
            let mut line = vec![ellipsize(&r.name, name_w), ellipsize(&r.module, module_w)];
            line.extend(r.numbers.iter().cloned());
            table.push(line);
        }
        let mut text = String::new();
        render(&table, 2, &mut text);
        // Numbers wider than any real figure (a total past 10^15 ns) are
        // the only way past the width: cut such a line rather than wrap.
        for line in text.lines() {
            let _ = writeln!(out, "{}", ellipsize(line, TABLE_WIDTH));
        }
    }
}
