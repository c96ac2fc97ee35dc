//! `weft top`'s full-screen view (ratatui): the functions and threads
//! tables between two live readings of one process or several (merged,
//! or one process or one thread alone), the keys, and the terminal, restored
//! whatever ends the view: `q`, SIGINT/SIGTERM, the target's exit, an
//! error, or a panic (the [`Screen`] guard).

use crate::session::Attached;
use crate::wait;
use anyhow::{Context, Result};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::crossterm::execute;
use ratatui::crossterm::terminal::{
    disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen,
};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use weft::Report;

/// How often to read, and for how long.
pub struct Pace {
    pub interval: Duration,
    pub duration: Option<Duration>,
}

/// One process's part of a reading.
pub struct Part {
    pub pid: i32,
    pub command: String,
    pub report: Report,
}

/// What a view shows: every process's threads, one process's, or one
/// thread's (a thread filter always names its process: tids of two
/// processes may be equal).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Focus {
    pid: Option<i32>,
    tid: Option<u32>,
}

impl Focus {
    fn takes(&self, pid: i32) -> bool {
        self.pid.map_or(true, |p| p == pid)
    }

    fn takes_thread(&self, pid: i32, tid: u32) -> bool {
        self.takes(pid) && self.tid.map_or(true, |t| t == tid)
    }
}

/// The parts of `reading` the focus takes.
fn parts(reading: &[Part], focus: Focus) -> impl Iterator<Item = &Part> {
    reading.iter().filter(move |p| focus.takes(p.pid))
}

/// Row order of the functions view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sort {
    Rate,
    Calls,
    Wall,
    Cpu,
    SelfTime,
    Name,
}

impl Sort {
    const ALL: [Sort; 6] = [
        Sort::Rate,
        Sort::Calls,
        Sort::Wall,
        Sort::Cpu,
        Sort::SelfTime,
        Sort::Name,
    ];

    fn name(self) -> &'static str {
        match self {
            Sort::Rate => "calls/s",
            Sort::Calls => "calls",
            Sort::Wall => "wall%",
            Sort::Cpu => "cpu%",
            Sort::SelfTime => "self",
            Sort::Name => "name",
        }
    }

    fn next(self) -> Sort {
        let i = Sort::ALL.iter().position(|&s| s == self).unwrap_or(0);
        Sort::ALL[(i + 1) % Sort::ALL.len()]
    }
}

/// Row order of the threads view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ThreadSort {
    Rate,
    Calls,
    Tid,
    Name,
}

impl ThreadSort {
    const ALL: [ThreadSort; 4] = [
        ThreadSort::Rate,
        ThreadSort::Calls,
        ThreadSort::Tid,
        ThreadSort::Name,
    ];

    fn name(self) -> &'static str {
        match self {
            ThreadSort::Rate => "calls/s",
            ThreadSort::Calls => "calls",
            ThreadSort::Tid => "tid",
            ThreadSort::Name => "name",
        }
    }

    fn next(self) -> ThreadSort {
        let i = ThreadSort::ALL.iter().position(|&s| s == self).unwrap_or(0);
        ThreadSort::ALL[(i + 1) % ThreadSort::ALL.len()]
    }
}

/// One function's row: totals and the rates since the previous reading.
#[derive(Clone, Debug, Default, PartialEq)]
struct FunctionRow {
    name: String,
    module: String,
    calls: u64,
    /// Calls per second since the previous reading.
    rate: f64,
    /// Share of the threads' time spent inside it since the previous
    /// reading, % (see [`threads_seconds`]): 100 = every thread in it all
    /// the time.
    wall_share: Option<f64>,
    /// Share of the threads' time spent running on a CPU inside it, %.
    cpu_share: Option<f64>,
    wall_ns: Option<u64>,
    self_ns: Option<u64>,
}

/// One thread's row.
#[derive(Clone, Debug, Default, PartialEq)]
struct ThreadRow {
    pid: i32,
    tid: u32,
    name: String,
    exited: bool,
    calls: u64,
    rate: f64,
    /// Its busiest function since the previous reading (most calls).
    busiest: String,
}

/// (calls, wall, cpu, self) of one function, in all or in one thread.
type Figures = (u64, Option<u64>, Option<u64>, Option<u64>);

/// The figures per function of the focus: merged over its processes'
/// threads, or one thread's.
fn figures(reading: &[Part], focus: Focus) -> BTreeMap<String, (String, Figures)> {
    let add = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    };
    let mut all: BTreeMap<String, (String, Figures)> = BTreeMap::new();
    let mut merge = |name: &str, module: &str, f: Figures| {
        let (_, was) = all
            .entry(name.to_string())
            .or_insert_with(|| (module.to_string(), (0, None, None, None)));
        *was = (
            was.0 + f.0,
            add(was.1, f.1),
            add(was.2, f.2),
            add(was.3, f.3),
        );
    };
    for part in parts(reading, focus) {
        let report = &part.report;
        match focus.tid {
            // Kernel probes nothing called (`syscall:*` asks for hundreds)
            // are left out, as in the report's tables.
            None => {
                for f in report
                    .functions
                    .iter()
                    .filter(|f| f.mechanism.is_none() || f.calls > 0)
                {
                    merge(
                        &f.name,
                        &f.module,
                        (f.calls, f.wall_ns, f.cpu_ns, f.self_ns),
                    );
                }
            }
            Some(tid) => {
                let module_of = |name: &str| {
                    report
                        .functions
                        .iter()
                        .find(|f| f.name == name)
                        .map_or("", |f| f.module.as_str())
                };
                for t in report.threads.iter().filter(|t| t.tid == tid) {
                    for (name, c) in &t.functions {
                        merge(
                            name,
                            module_of(name),
                            (c.calls, c.wall_ns, c.cpu_ns, c.self_ns),
                        );
                    }
                }
            }
        }
    }
    all
}

/// The threads' time between two readings `seconds` apart, in seconds:
/// `seconds` for each thread of the focus (those that called an
/// instrumented function) that was not already gone at the previous
/// reading. A thread that started or ended in between counts the whole
/// interval, so a share is never overstated.
fn threads_seconds(now: &[Part], before: Option<&[Part]>, seconds: f64, focus: Focus) -> f64 {
    let gone_before = |pid: i32, tid: u32| {
        before.is_some_and(|b| {
            b.iter()
                .filter(|p| p.pid == pid)
                .flat_map(|p| &p.report.threads)
                .any(|o| o.tid == tid && o.exited)
        })
    };
    let threads = parts(now, focus)
        .flat_map(|p| p.report.threads.iter().map(move |t| (p.pid, t.tid)))
        .filter(|&(pid, tid)| focus.takes_thread(pid, tid) && !gone_before(pid, tid))
        .count();
    threads as f64 * seconds
}

/// `ns` of the threads' `threads_seconds` in %, at most 100 (the two
/// readings' instants and the timers' own are microseconds apart).
fn share(ns: u64, threads_seconds: f64) -> f64 {
    (ns as f64 / 1e9 / threads_seconds.max(1e-9) * 100.0).min(100.0)
}

/// The functions view's rows between two readings `seconds` apart (the
/// shares need both readings).
fn function_rows(
    now: &[Part],
    before: Option<&[Part]>,
    seconds: f64,
    focus: Focus,
    sort: Sort,
) -> Vec<FunctionRow> {
    let was = before.map(|b| figures(b, focus)).unwrap_or_default();
    let per_s = |a: u64, b: u64| {
        if before.is_none() {
            return 0.0; // one reading: no rate yet
        }
        a.saturating_sub(b) as f64 / seconds.max(1e-9)
    };
    let threads_time = threads_seconds(now, before, seconds, focus);
    let of_threads = |v: Option<u64>, v0: Option<u64>| {
        v.filter(|_| before.is_some() && threads_time > 0.0)
            .map(|v| share(v.saturating_sub(v0.unwrap_or(0)), threads_time))
    };
    let mut rows: Vec<FunctionRow> = figures(now, focus)
        .into_iter()
        .map(|(name, (module, (calls, wall, cpu, own)))| {
            let (c0, w0, u0, _) = was.get(&name).map_or((0, None, None, None), |(_, f)| *f);
            FunctionRow {
                rate: per_s(calls, c0),
                wall_share: of_threads(wall, w0),
                cpu_share: of_threads(cpu, u0),
                name,
                module,
                calls,
                wall_ns: wall,
                self_ns: own,
            }
        })
        .collect();
    let key = |r: &FunctionRow| -> f64 {
        match sort {
            Sort::Rate => r.rate,
            Sort::Calls => r.calls as f64,
            Sort::Wall => r.wall_share.unwrap_or(0.0),
            Sort::Cpu => r.cpu_share.unwrap_or(0.0),
            Sort::SelfTime => r.self_ns.unwrap_or(0) as f64,
            Sort::Name => 0.0,
        }
    };
    if sort == Sort::Name {
        rows.sort_by(|a, b| a.name.cmp(&b.name));
    } else {
        rows.sort_by(|a, b| key(b).total_cmp(&key(a)).then_with(|| a.name.cmp(&b.name)));
    }
    rows
}

/// The threads view's rows (the focus's) in `sort`'s order: numbers most
/// first, names A to Z; ties by process, then tid.
fn thread_rows(
    now: &[Part],
    before: Option<&[Part]>,
    seconds: f64,
    focus: Focus,
    sort: ThreadSort,
) -> Vec<ThreadRow> {
    let had_reading = before.is_some();
    let mut rows: Vec<ThreadRow> = parts(now, focus)
        .flat_map(|p| p.report.threads.iter().map(move |t| (p.pid, t)))
        .filter(|(pid, t)| focus.takes_thread(*pid, t.tid))
        .map(|(pid, t)| {
            let was = before.and_then(|b| {
                b.iter()
                    .filter(|p| p.pid == pid)
                    .flat_map(|p| &p.report.threads)
                    .find(|o| o.tid == t.tid)
            });
            let calls_of = |name: &str| {
                was.and_then(|w| w.functions.get(name))
                    .map_or(0, |c| c.calls)
            };
            let calls: u64 = t.functions.values().map(|c| c.calls).sum();
            let before: u64 = t.functions.keys().map(|n| calls_of(n)).sum();
            let busiest = t
                .functions
                .iter()
                .map(|(n, c)| (c.calls.saturating_sub(calls_of(n)), n))
                .filter(|(d, _)| *d > 0)
                .max()
                .map_or(String::new(), |(_, n)| n.clone());
            ThreadRow {
                pid,
                tid: t.tid,
                name: t.name.clone(),
                exited: t.exited,
                calls,
                rate: if had_reading {
                    calls.saturating_sub(before) as f64 / seconds.max(1e-9)
                } else {
                    0.0 // one reading: no rate yet
                },
                busiest,
            }
        })
        .collect();
    rows.sort_by(|a, b| {
        match sort {
            ThreadSort::Rate => b.rate.total_cmp(&a.rate),
            ThreadSort::Calls => b.calls.cmp(&a.calls),
            ThreadSort::Tid => a.tid.cmp(&b.tid),
            ThreadSort::Name => a.name.cmp(&b.name),
        }
        .then(a.pid.cmp(&b.pid))
        .then(a.tid.cmp(&b.tid))
    });
    rows
}

/// A duration for people: `12.3 s`, `45.6 ms`, `789 µs`, `12 ns`.
fn human_ns(ns: u64) -> String {
    let n = ns as f64;
    if n >= 1e9 {
        format!("{:.1} s", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.1} ms", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.0} µs", n / 1e3)
    } else {
        format!("{ns} ns")
    }
}

/// The view's state between readings.
pub struct View {
    /// The processes watched, in the order given.
    pids: Vec<i32>,
    sort: Sort,
    thread_sort: ThreadSort,
    paused: bool,
    threads: bool,
    /// Index into the reading's processes (None: all of them).
    process: Option<usize>,
    /// Index into the threads of the processes shown (None: all).
    filter: Option<usize>,
    now: Option<Vec<Part>>,
    before: Option<Vec<Part>>,
    seconds: f64,
    started: Instant,
    functions: usize,
    note: String,
}

impl View {
    /// The view of `pids` with `functions` instrumented in all, before its
    /// first reading.
    pub fn new(pids: Vec<i32>, functions: usize) -> View {
        View {
            pids,
            sort: Sort::Rate,
            thread_sort: ThreadSort::Rate,
            paused: false,
            threads: false,
            process: None,
            filter: None,
            now: None,
            before: None,
            seconds: 0.0,
            started: Instant::now(),
            functions,
            note: String::new(),
        }
    }

    fn several(&self) -> bool {
        self.pids.len() > 1
    }

    /// The process shown alone, if one is.
    fn process_part(&self) -> Option<&Part> {
        self.process
            .and_then(|i| self.now.as_ref().and_then(|now| now.get(i)))
    }

    /// The (pid, tid) of every thread of the processes shown.
    fn visible_threads(&self) -> Vec<(i32, u32)> {
        let Some(now) = &self.now else {
            return Vec::new();
        };
        let pid = self.process_part().map(|p| p.pid);
        now.iter()
            .filter(|p| pid.map_or(true, |pid| pid == p.pid))
            .flat_map(|p| p.report.threads.iter().map(move |t| (p.pid, t.tid)))
            .collect()
    }

    fn focus(&self) -> Focus {
        let pid = self.process_part().map(|p| p.pid);
        match self
            .filter
            .and_then(|i| self.visible_threads().get(i).copied())
        {
            Some((pid, tid)) => Focus {
                pid: Some(pid),
                tid: Some(tid),
            },
            None => Focus { pid, tid: None },
        }
    }

    fn take(&mut self, reading: Vec<Part>, seconds: f64) {
        if self.paused {
            return;
        }
        self.before = self.now.take();
        self.now = Some(reading);
        self.seconds = seconds;
    }

    /// Handles one key; false to quit.
    fn key(&mut self, code: KeyCode, modifiers: KeyModifiers) -> bool {
        match code {
            KeyCode::Char('q') | KeyCode::Esc => return false,
            KeyCode::Char('c') if modifiers.contains(KeyModifiers::CONTROL) => return false,
            KeyCode::Char('s') if self.threads => self.thread_sort = self.thread_sort.next(),
            KeyCode::Char('s') => self.sort = self.sort.next(),
            KeyCode::Char('p') | KeyCode::Char(' ') => self.paused = !self.paused,
            KeyCode::Char('t') => self.threads = !self.threads,
            KeyCode::Char(']') | KeyCode::Right => {
                self.filter = step(self.filter, self.visible_threads().len(), true);
            }
            KeyCode::Char('[') | KeyCode::Left => {
                self.filter = step(self.filter, self.visible_threads().len(), false);
            }
            KeyCode::Char('}') | KeyCode::Down if self.several() => {
                let n = self.now.as_ref().map_or(0, Vec::len);
                self.process = step(self.process, n, true);
                self.filter = None;
            }
            KeyCode::Char('{') | KeyCode::Up if self.several() => {
                let n = self.now.as_ref().map_or(0, Vec::len);
                self.process = step(self.process, n, false);
                self.filter = None;
            }
            _ => {}
        }
        true
    }

    fn header(&self) -> String {
        let threads = self.visible_threads().len();
        let focus = self.focus();
        let filter = match (focus.pid, focus.tid) {
            (Some(pid), Some(tid)) if self.several() => format!("pid {pid} thread {tid}"),
            (_, Some(tid)) => format!("thread {tid}"),
            (Some(pid), None) => format!(
                "pid {pid} ({})",
                self.process_part().map_or("", |p| p.command.as_str())
            ),
            (None, None) if self.several() => "all processes".to_string(),
            (None, None) => "all threads".to_string(),
        };
        let watched = match self.pids.as_slice() {
            [pid] => format!("pid {pid}"),
            pids => format!(
                "{} processes ({})",
                pids.len(),
                pids.iter()
                    .map(i32::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        };
        format!(
            "weft top  {watched}  {} functions  {threads} threads  {:.0} s  sort: {}  {filter}{}",
            self.functions,
            self.started.elapsed().as_secs_f64(),
            if self.threads {
                self.thread_sort.name()
            } else {
                self.sort.name()
            },
            if self.paused { "  [paused]" } else { "" },
        )
    }

    fn threads_table(&self, now: &[Part]) -> Table<'static> {
        let rows = thread_rows(
            now,
            self.before.as_deref(),
            self.seconds,
            self.focus(),
            self.thread_sort,
        );
        // A process column with several processes (tids alone may repeat).
        let several = self.several();
        let mut widths = vec![
            Constraint::Length(9),
            Constraint::Length(16),
            Constraint::Length(7),
            Constraint::Length(14),
            Constraint::Length(12),
            Constraint::Min(10),
        ];
        let mut header = vec![
            "TID",
            "THREAD",
            "STATE",
            "CALLS",
            "CALLS/S",
            "BUSIEST FUNCTION",
        ];
        if several {
            widths.insert(0, Constraint::Length(9));
            header.insert(0, "PID");
        }
        Table::new(
            rows.iter().map(move |r| {
                let mut cells = vec![
                    Cell::from(r.tid.to_string()),
                    Cell::from(r.name.clone()),
                    Cell::from(if r.exited { "exited" } else { "live" }),
                    Cell::from(r.calls.to_string()),
                    Cell::from(format!("{:.0}", r.rate)),
                    Cell::from(r.busiest.clone()),
                ];
                if several {
                    cells.insert(0, Cell::from(r.pid.to_string()));
                }
                Row::new(cells)
            }),
            widths,
        )
        .header(Row::new(header).style(Style::new().add_modifier(Modifier::REVERSED)))
        .block(Block::default().borders(Borders::TOP).title("threads"))
    }

    fn functions_table(&self, now: &[Part]) -> Table<'static> {
        let rows = function_rows(
            now,
            self.before.as_deref(),
            self.seconds,
            self.focus(),
            self.sort,
        );
        let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        let ns = |v: Option<u64>| v.map_or("-".to_string(), human_ns);
        Table::new(
            rows.iter().map(|r| {
                Row::new(vec![
                    Cell::from(r.name.clone()),
                    Cell::from(r.module.clone()),
                    Cell::from(r.calls.to_string()),
                    Cell::from(format!("{:.0}", r.rate)),
                    Cell::from(pct(r.wall_share)),
                    Cell::from(pct(r.cpu_share)),
                    Cell::from(ns(r.wall_ns)),
                    Cell::from(ns(r.self_ns)),
                ])
            }),
            [
                Constraint::Min(16),
                Constraint::Length(14),
                Constraint::Length(14),
                Constraint::Length(12),
                Constraint::Length(7),
                Constraint::Length(7),
                Constraint::Length(10),
                Constraint::Length(10),
            ],
        )
        .header(
            Row::new([
                "FUNCTION", "MODULE", "CALLS", "CALLS/S", "WALL%", "CPU%", "INCL", "SELF",
            ])
            .style(Style::new().add_modifier(Modifier::REVERSED)),
        )
        .block(Block::default().borders(Borders::TOP).title("functions"))
    }

    fn draw(&self, frame: &mut ratatui::Frame) {
        let [top, body, help] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Min(3),
            Constraint::Length(1),
        ])
        .areas(frame.area());
        frame.render_widget(
            Paragraph::new(Line::from(self.header()))
                .style(Style::new().add_modifier(Modifier::BOLD)),
            top,
        );
        match &self.now {
            None => frame.render_widget(Paragraph::new("reading…"), body),
            Some(now) if self.threads => frame.render_widget(self.threads_table(now), body),
            Some(now) => frame.render_widget(self.functions_table(now), body),
        }
        let help_text = if !self.note.is_empty() {
            self.note.clone()
        } else if self.several() {
            "q quit  s sort  t threads/functions  { } process filter  [ ] thread filter  p pause"
                .to_string()
        } else {
            "q quit  s sort  t threads/functions  [ ] thread filter  p pause".to_string()
        };
        frame.render_widget(Paragraph::new(help_text), help);
    }
}

/// The next (`forward`) or previous filter of `n` choices: None (all),
/// then each in turn, then None again.
fn step(at: Option<usize>, n: usize, forward: bool) -> Option<usize> {
    match (at, forward) {
        (None, true) if n > 0 => Some(0),
        (Some(i), true) if i + 1 < n => Some(i + 1),
        (None, false) if n > 0 => Some(n - 1),
        (Some(i), false) if i > 0 && i < n => Some(i - 1),
        _ => None,
    }
}

/// Each process's live report now (an exited process's last figures).
pub fn reading(attached: &[(String, Attached)]) -> Result<Vec<Part>> {
    attached
        .iter()
        .map(|(command, a)| {
            Ok(Part {
                pid: a.process.pid(),
                command: command.clone(),
                report: a.live_report()?,
            })
        })
        .collect()
}

/// The terminal in raw mode on the alternate screen; restored on drop
/// (an error or a panic unwinding through `top` included).
struct Screen {
    terminal: ratatui::Terminal<ratatui::backend::CrosstermBackend<std::io::Stdout>>,
}

impl Screen {
    fn enter() -> Result<Screen> {
        enable_raw_mode().context("putting the terminal in raw mode")?;
        let mut out = std::io::stdout();
        if let Err(e) = execute!(out, EnterAlternateScreen) {
            let _ = disable_raw_mode();
            return Err(e).context("switching to the alternate screen");
        }
        let terminal = ratatui::Terminal::new(ratatui::backend::CrosstermBackend::new(out))
            .context("opening the terminal");
        match terminal {
            Ok(mut terminal) => {
                let _ = terminal.hide_cursor();
                Ok(Screen { terminal })
            }
            Err(e) => {
                restore();
                Err(e)
            }
        }
    }
}

fn restore() {
    let _ = execute!(
        std::io::stdout(),
        LeaveAlternateScreen,
        ratatui::crossterm::cursor::Show
    );
    let _ = disable_raw_mode();
}

impl Drop for Screen {
    fn drop(&mut self) {
        restore();
    }
}

/// The full-screen view until quit, a signal, `--duration` or the exit of
/// every process watched; `more` gives the processes followed since the
/// last call (children forked after the start, with `--children`).
pub fn full_screen(
    attached: &mut Vec<(String, Attached)>,
    mut view: View,
    pace: &Pace,
    more: &mut dyn FnMut() -> Vec<(String, Attached)>,
) -> Result<wait::End> {
    let mut screen = Screen::enter()?;
    let started = Instant::now();
    let mut last_read: Option<Instant> = None;
    loop {
        if wait::stop_requested() {
            return Ok(wait::End::Signal);
        }
        if pace.duration.is_some_and(|d| started.elapsed() >= d) {
            return Ok(wait::End::Duration);
        }
        for (command, a) in more() {
            view.pids.push(a.process.pid());
            view.functions += a.functions;
            attached.push((command, a));
        }
        for (_, a) in attached.iter_mut() {
            a.tick();
        }
        if attached.iter().all(|(_, a)| !a.process.is_alive()) {
            return Ok(wait::End::TargetExited);
        }
        let due = last_read.map_or(true, |t| t.elapsed() >= pace.interval);
        if due {
            let at = Instant::now();
            let seconds = last_read.map_or(0.0, |t| at.duration_since(t).as_secs_f64());
            match reading(attached) {
                Ok(parts) => {
                    view.take(parts, seconds);
                    view.note.clear();
                }
                Err(e) => view.note = format!("reading the target: {e:#}"),
            }
            last_read = Some(at);
        }
        screen
            .terminal
            .draw(|frame| view.draw(frame))
            .context("drawing the view")?;
        if event::poll(Duration::from_millis(50)).context("reading the keyboard")? {
            if let Event::Key(k) = event::read().context("reading the keyboard")? {
                if k.kind == KeyEventKind::Press && !view.key(k.code, k.modifiers) {
                    return Ok(wait::End::Signal);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: Focus = Focus {
        pid: None,
        tid: None,
    };
    const ONE_THREAD_4: Focus = Focus {
        pid: Some(1),
        tid: Some(4),
    };

    #[test]
    fn sort_keys_cycle_through_all() {
        let mut s = Sort::Rate;
        let mut seen = Vec::new();
        for _ in 0..Sort::ALL.len() {
            seen.push(s);
            s = s.next();
        }
        assert_eq!(s, Sort::Rate);
        assert_eq!(seen, Sort::ALL);
    }

    /// A reading of process 1: `threads` (tid, exited, wall ns and cpu ns
    /// in `work`).
    fn read_one(threads: &[(u32, bool, u64, u64)]) -> Vec<Part> {
        one(report(threads))
    }

    fn one(report: Report) -> Vec<Part> {
        vec![Part {
            pid: 1,
            command: "t".into(),
            report,
        }]
    }

    fn report(threads: &[(u32, bool, u64, u64)]) -> Report {
        let mut f = weft::report::FunctionReport::empty("work".into(), "exe".into(), "0x1".into());
        f.calls = threads.len() as u64;
        f.wall_ns = Some(threads.iter().map(|t| t.2).sum());
        f.cpu_ns = Some(threads.iter().map(|t| t.3).sum());
        Report {
            pid: 1,
            duration_ns: 0,
            metrics: vec!["calls", "wall", "cpu"],
            clocks: None,
            functions: vec![f],
            threads: threads
                .iter()
                .map(|&(tid, exited, wall, cpu)| weft::report::ThreadReport {
                    tid,
                    name: format!("t{tid}"),
                    exited,
                    functions: [(
                        "work".to_string(),
                        weft::report::Counts {
                            calls: 1,
                            wall_ns: Some(wall),
                            cpu_ns: Some(cpu),
                            ..Default::default()
                        },
                    )]
                    .into(),
                })
                .collect(),
            overflow_threads: 0,
            runtime: None,
            kernel: None,
            trace: None,
            trace_log: None,
        }
    }

    #[test]
    fn shares_are_of_the_threads_time() {
        // Three threads in `work` the whole second, one in it half the
        // second: 3.5 s of 4 threads' 4 s.
        let before = read_one(&[
            (1, false, 0, 0),
            (2, false, 0, 0),
            (3, false, 0, 0),
            (4, false, 0, 0),
        ]);
        let s = 1_000_000_000;
        let now = read_one(&[
            (1, false, s, s),
            (2, false, s, s / 2),
            (3, false, s, s / 4),
            (4, false, s / 2, 0),
        ]);
        let rows = function_rows(&now, Some(&before), 1.0, ALL, Sort::Rate);
        assert_eq!(rows[0].wall_share, Some(87.5));
        assert_eq!(rows[0].cpu_share, Some(43.75));
        // One thread alone: its own time.
        let rows = function_rows(&now, Some(&before), 1.0, ONE_THREAD_4, Sort::Rate);
        assert_eq!(rows[0].wall_share, Some(50.0));
        // A thread gone at the previous reading has no time left.
        let before = read_one(&[(1, false, 0, 0), (2, true, 0, 0)]);
        let now = read_one(&[(1, false, s, s), (2, true, 0, 0)]);
        let rows = function_rows(&now, Some(&before), 1.0, ALL, Sort::Rate);
        assert_eq!(rows[0].wall_share, Some(100.0));
        // Never above 100, and nothing from a single reading.
        let rows = function_rows(&now, Some(&before), 0.999, ALL, Sort::Rate);
        assert_eq!(rows[0].wall_share, Some(100.0));
        let rows = function_rows(&now, None, 1.0, ALL, Sort::Rate);
        assert_eq!((rows[0].wall_share, rows[0].rate), (None, 0.0));
    }

    #[test]
    fn kernel_probes_nothing_called_are_left_out() {
        let mut now = report(&[(1, false, 10, 10)]);
        for (name, calls) in [("syscall:read", 3), ("syscall:openat", 0)] {
            let mut f =
                weft::report::FunctionReport::empty(name.into(), "syscall".into(), "-".into());
            f.calls = calls;
            f.mechanism = Some("raw_syscalls tracepoints");
            now.functions.push(f);
        }
        let names: Vec<String> = function_rows(&one(now), None, 1.0, ALL, Sort::Name)
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(names, ["syscall:read", "work"]);
    }

    #[test]
    fn the_threads_view_sorts_by_its_key_and_filters() {
        let mut before = report(&[(7, false, 0, 0), (3, false, 0, 0), (5, false, 0, 0)]);
        for (t, name) in before.threads.iter_mut().zip(["beta", "gamma", "alpha"]) {
            t.name = name.to_string();
        }
        let mut now = before.clone();
        for (t, (was, calls)) in
            before
                .threads
                .iter_mut()
                .zip(now.threads.iter_mut())
                .zip([(0, 10), (25, 30), (0, 20)])
        {
            t.0.functions.get_mut("work").unwrap().calls = was;
            t.1.functions.get_mut("work").unwrap().calls = calls;
        }
        let (before, now) = (one(before), one(now));
        let tids = |sort| -> Vec<u32> {
            thread_rows(&now, Some(&before), 1.0, ALL, sort)
                .iter()
                .map(|r| r.tid)
                .collect()
        };
        assert_eq!(tids(ThreadSort::Rate), [5, 7, 3]);
        assert_eq!(tids(ThreadSort::Calls), [3, 5, 7]);
        assert_eq!(tids(ThreadSort::Tid), [3, 5, 7]);
        assert_eq!(tids(ThreadSort::Name), [5, 7, 3]);
        let alone = Focus {
            pid: Some(1),
            tid: Some(5),
        };
        let alone = thread_rows(&now, Some(&before), 1.0, alone, ThreadSort::Rate);
        assert_eq!(alone.iter().map(|r| r.tid).collect::<Vec<_>>(), [5]);
        let mut s = ThreadSort::Rate;
        for want in [
            ThreadSort::Calls,
            ThreadSort::Tid,
            ThreadSort::Name,
            ThreadSort::Rate,
        ] {
            s = s.next();
            assert_eq!(s, want);
        }
    }

    /// Two processes whose threads have the same tid: the functions view
    /// merges them (and their threads' time), `}` shows each alone, and
    /// `]` then walks that process's threads only.
    #[test]
    fn several_processes_merge_and_filter_by_process() {
        let s = 1_000_000_000;
        let part = |pid, threads: &[(u32, bool, u64, u64)]| Part {
            pid,
            command: format!("p{pid}"),
            report: report(threads),
        };
        let before = vec![
            part(10, &[(1, false, 0, 0), (2, false, 0, 0)]),
            part(20, &[(1, false, 0, 0)]),
        ];
        let mut now = vec![
            part(10, &[(1, false, s, s), (2, false, s / 2, 0)]),
            part(20, &[(1, false, s / 4, s / 4)]),
        ];
        now[0].report.functions[0].calls = 30;
        now[1].report.functions[0].calls = 5;
        let rows = function_rows(&now, Some(&before), 1.0, ALL, Sort::Rate);
        // 1.75 s of the three threads' 3 s; calls of both (3 before).
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].calls, rows[0].rate), (35, 32.0));
        assert_eq!(rows[0].wall_share, Some(175.0 / 3.0));
        let p20 = Focus {
            pid: Some(20),
            tid: None,
        };
        let rows = function_rows(&now, Some(&before), 1.0, p20, Sort::Rate);
        assert_eq!((rows[0].calls, rows[0].wall_share), (5, Some(25.0)));
        let threads = thread_rows(&now, Some(&before), 1.0, ALL, ThreadSort::Tid);
        let ids: Vec<(i32, u32)> = threads.iter().map(|r| (r.pid, r.tid)).collect();
        assert_eq!(ids, [(10, 1), (20, 1), (10, 2)]);

        let mut view = View::new(vec![10, 20], 1);
        view.take(before, 1.0);
        view.take(now, 1.0);
        assert!(view.header().contains("2 processes (10,20)"));
        assert!(view.header().contains("all processes"));
        view.key(KeyCode::Char('}'), KeyModifiers::NONE);
        view.key(KeyCode::Char('}'), KeyModifiers::NONE);
        assert_eq!(view.focus(), p20);
        assert!(view.header().contains("pid 20 (p20)"), "{}", view.header());
        view.key(KeyCode::Char(']'), KeyModifiers::NONE);
        assert_eq!(
            view.focus(),
            Focus {
                pid: Some(20),
                tid: Some(1)
            }
        );
        assert!(view.header().contains("pid 20 thread 1"));
        // Past its one thread: the whole process again.
        view.key(KeyCode::Char(']'), KeyModifiers::NONE);
        assert_eq!(view.focus(), p20);
        view.key(KeyCode::Char('}'), KeyModifiers::NONE);
        assert_eq!(view.focus(), ALL);
        // One process: the process keys do nothing.
        let mut single = View::new(vec![1], 1);
        single.take(read_one(&[(1, false, 0, 0)]), 1.0);
        single.key(KeyCode::Char('}'), KeyModifiers::NONE);
        assert_eq!(single.focus(), ALL);
        assert!(single.header().contains("pid 1 "));
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(human_ns(12), "12 ns");
        assert_eq!(human_ns(12_345), "12 µs");
        assert_eq!(human_ns(45_600_000), "45.6 ms");
        assert_eq!(human_ns(3_200_000_000), "3.2 s");
    }
}
