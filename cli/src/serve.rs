//! `weft attach … --serve ADDR:PORT`: the live figures at `/metrics` in the
//! Prometheus text format (OpenMetrics when the scraper asks for it), for
//! an existing Prometheus to scrape: one weft per process, many processes.
//!
//! The HTTP thread never touches the target: it hands each scrape to the
//! attach loop (which owns the [`weft::Process`] and reads the shared
//! region about every 10 ms anyway) and waits for the text. A scrape costs
//! the target nothing but the reading of its counters.

use anyhow::{bail, Context, Result};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::time::{Duration, Instant};
use weft::Report;

/// How long the HTTP thread waits for the attach loop's answer.
const ANSWER_WAIT: Duration = Duration::from_secs(5);

/// One scrape waiting for its text.
struct Scrape {
    openmetrics: bool,
    reply: SyncSender<Result<String, String>>,
}

/// The HTTP endpoint; dropping it stops serving.
pub struct Server {
    http: std::sync::Arc<tiny_http::Server>,
    scrapes: Receiver<Scrape>,
    thread: Option<std::thread::JoinHandle<()>>,
    addr: SocketAddr,
}

/// `ADDR:PORT`, `:PORT` or `PORT` (loopback); a non-loopback address only
/// with `public`.
pub fn parse_address(text: &str, public: bool) -> Result<SocketAddr> {
    let t = text.trim();
    let loopback = |port: &str| -> Result<SocketAddr> {
        let port: u16 = port.parse().with_context(|| {
            format!("--serve {text}: give ADDR:PORT, :PORT or PORT (0-65535), like --serve 127.0.0.1:9464")
        })?;
        Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port))
    };
    let addr = if let Some(port) = t.strip_prefix(':') {
        loopback(port)?
    } else if t.chars().all(|c| c.is_ascii_digit()) && !t.is_empty() {
        loopback(t)?
    } else {
        let mut found = std::net::ToSocketAddrs::to_socket_addrs(t).with_context(|| {
            format!("--serve {text}: give ADDR:PORT, :PORT or PORT, like --serve 127.0.0.1:9464")
        })?;
        found
            .next()
            .with_context(|| format!("--serve {text}: the name resolves to no address"))?
    };
    if !addr.ip().is_loopback() && !public {
        bail!(
            "--serve {text} is reachable from other machines, and the metrics name the target's \
             functions and threads: add --serve-public if that is meant, or serve on loopback \
             (--serve 127.0.0.1:{})",
            addr.port()
        );
    }
    Ok(addr)
}

impl Server {
    /// Listens on `text` (see [`parse_address`]) and starts the HTTP thread.
    pub fn start(text: &str, public: bool) -> Result<Server> {
        let wanted = parse_address(text, public)?;
        let http = tiny_http::Server::http(wanted)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| {
                format!("listening on {wanted} for --serve (a port in use? give another, or 0 for any free one)")
            })?;
        let addr = http
            .server_addr()
            .to_ip()
            .context("the --serve listener has no IP address")?;
        let http = std::sync::Arc::new(http);
        let (tx, scrapes) = mpsc::sync_channel::<Scrape>(16);
        let serving = http.clone();
        let thread = std::thread::Builder::new()
            .name("weft-serve".into())
            .spawn(move || serve(&serving, &tx))
            .context("starting the --serve thread")?;
        Ok(Server {
            http,
            scrapes,
            thread: Some(thread),
            addr,
        })
    }

    /// Where it listens (the port chosen when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Answers the scrapes waiting, each with `build(openmetrics)`; called
    /// by the attach loop (the only place that reads the target).
    pub fn answer(&mut self, mut build: impl FnMut(bool) -> Result<String>) {
        loop {
            match self.scrapes.try_recv() {
                Ok(scrape) => {
                    let text = build(scrape.openmetrics).map_err(|e| format!("{e:#}"));
                    // The HTTP thread may have given up waiting: nothing to do.
                    let _ = scrape.reply.try_send(text);
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return,
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.http.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The HTTP thread: `/metrics` from the attach loop, `/` a pointer to it.
fn serve(http: &tiny_http::Server, scrapes: &SyncSender<Scrape>) {
    for request in http.incoming_requests() {
        let path = request.url().split('?').next().unwrap_or("").to_string();
        let method = request.method().clone();
        let response = if !matches!(method, tiny_http::Method::Get | tiny_http::Method::Head) {
            text_response(405, "text/plain; charset=utf-8", "GET /metrics\n".into())
        } else if path == "/metrics" {
            let openmetrics = request.headers().iter().any(|h| {
                h.field.equiv("Accept") && h.value.as_str().contains("application/openmetrics-text")
            });
            let (reply, answer) = mpsc::sync_channel(1);
            let asked = scrapes.try_send(Scrape { openmetrics, reply }).is_ok();
            match asked.then(|| answer.recv_timeout(ANSWER_WAIT)) {
                Some(Ok(Ok(body))) => text_response(
                    200,
                    if openmetrics {
                        "application/openmetrics-text; version=1.0.0; charset=utf-8"
                    } else {
                        "text/plain; version=0.0.4; charset=utf-8"
                    },
                    body,
                ),
                Some(Ok(Err(e))) => text_response(
                    500,
                    "text/plain; charset=utf-8",
                    format!("weft: reading the target: {e}\n"),
                ),
                _ => text_response(
                    503,
                    "text/plain; charset=utf-8",
                    "weft: busy or detaching; try again\n".into(),
                ),
            }
        } else if path == "/" {
            text_response(
                200,
                "text/html; charset=utf-8",
                "<html><body><p>weft: <a href=\"/metrics\">/metrics</a></p></body></html>\n".into(),
            )
        } else {
            text_response(
                404,
                "text/plain; charset=utf-8",
                "not found: try /metrics\n".into(),
            )
        };
        // A scraper that hung up is its own business.
        let _ = request.respond(response);
    }
}

fn text_response(
    code: u16,
    kind: &str,
    body: String,
) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    let header = tiny_http::Header::from_bytes(&b"Content-Type"[..], kind.as_bytes())
        .expect("a constant, valid header");
    tiny_http::Response::from_string(body)
        .with_status_code(code)
        .with_header(header)
}

/// Label value of the series exited threads fold into.
pub const FOLDED: &str = "exited";

/// Turns reports into expositions, remembering across scrapes when each
/// thread (and each process) was first seen exited, to fold it after
/// `fold_after`.
pub struct Exporter {
    fold_after: Duration,
    exited_since: HashMap<(i32, u32), Instant>,
    processes_exited_since: HashMap<i32, Instant>,
    scrapes: u64,
    /// What one instrumented call costs the target, ns (an estimate).
    per_call_ns: f64,
    /// Each process's CPU time when weft attached, and the last read, ns.
    cpu: BTreeMap<i32, (u64, u64)>,
    functions: usize,
}

/// One process's part of a scrape.
pub struct Part<'a> {
    pub pid: i32,
    /// The process has exited (its figures are final).
    pub exited: bool,
    pub report: &'a Report,
}

/// A series' labels: function, module, tid, thread, pid.
type SeriesKey = (String, String, String, String, String);

impl Exporter {
    /// An exporter for the processes `pids` (their threads' series carry
    /// a `pid` label).
    pub fn new(
        pids: &[i32],
        fold_after: Duration,
        metrics: weft::Metrics,
        functions: usize,
    ) -> Self {
        Exporter {
            fold_after,
            exited_since: HashMap::new(),
            processes_exited_since: HashMap::new(),
            scrapes: 0,
            per_call_ns: metrics.call_cost_ns(),
            cpu: pids
                .iter()
                .map(|&pid| {
                    let now = process_cpu_ns(pid);
                    (pid, (now, now))
                })
                .collect(),
            functions,
        }
    }

    /// Takes in a process that joined the session after the exporter was
    /// made (a child followed as it was forked).
    pub fn track(&mut self, pid: i32) {
        let now = process_cpu_ns(pid);
        self.cpu.entry(pid).or_insert((now, now));
    }

    /// The exposition of one process's `report`.
    pub fn exposition(&mut self, report: &Report, openmetrics: bool) -> Result<String> {
        let part = Part {
            pid: report.pid,
            exited: false,
            report,
        };
        self.exposition_of(&[part], openmetrics)
    }

    /// The exposition of several processes' reports: Prometheus text, or
    /// OpenMetrics. A process that exited keeps its own `pid` series for
    /// `fold_after`, then folds into `pid="exited"`, as its threads fold
    /// into `tid="exited"`.
    pub fn exposition_of(&mut self, parts: &[Part], openmetrics: bool) -> Result<String> {
        self.scrapes += 1;
        let now = Instant::now();
        let mut live = 0;
        let mut exited = 0;
        let mut folded_threads = 0;
        let mut series: BTreeMap<SeriesKey, Figures> = BTreeMap::new();
        let mut histograms = Vec::new();
        let mut calls = 0u64;
        let mut duration_ns = 0;
        for part in parts {
            let report = part.report;
            duration_ns = duration_ns.max(report.duration_ns);
            let pid_label = if part.exited {
                let since = *self.processes_exited_since.entry(part.pid).or_insert(now);
                if now.duration_since(since) >= self.fold_after {
                    FOLDED.to_string()
                } else {
                    part.pid.to_string()
                }
            } else {
                part.pid.to_string()
            };
            let module_of: HashMap<&str, &str> = report
                .functions
                .iter()
                .map(|f| (f.name.as_str(), f.module.as_str()))
                .collect();
            for t in &report.threads {
                let (tid, name) = if t.exited || part.exited {
                    let since = *self.exited_since.entry((part.pid, t.tid)).or_insert(now);
                    if now.duration_since(since) >= self.fold_after {
                        folded_threads += 1;
                        (FOLDED.to_string(), FOLDED.to_string())
                    } else {
                        exited += 1;
                        (t.tid.to_string(), t.name.clone())
                    }
                } else {
                    live += 1;
                    (t.tid.to_string(), t.name.clone())
                };
                for (function, c) in &t.functions {
                    if c.calls == 0 && c.wall_ns.unwrap_or(0) == 0 {
                        continue;
                    }
                    let module = module_of.get(function.as_str()).copied().unwrap_or("");
                    let f = series
                        .entry((
                            function.clone(),
                            module.to_string(),
                            tid.clone(),
                            name.clone(),
                            pid_label.clone(),
                        ))
                        .or_default();
                    f.calls += c.calls;
                    if let Some(w) = c.wall_ns {
                        *f.wall_ns.get_or_insert(0) += w;
                    }
                    if let Some(cpu) = c.cpu_ns {
                        *f.cpu_ns.get_or_insert(0) += cpu;
                    }
                }
            }
            for f in &report.functions {
                calls += f.calls;
                let Some(series) = HistogramSeries::of(f, &pid_label) else {
                    continue;
                };
                // Processes folded into one label add up.
                match histograms.iter_mut().find(|o: &&mut HistogramSeries| {
                    (&o.function, &o.module, &o.pid)
                        == (&series.function, &series.module, &series.pid)
                }) {
                    Some(o) => o.add(&series),
                    None => histograms.push(series),
                }
            }
        }
        // Threads and processes gone from the reports are gone from the
        // bookkeeping.
        let in_reports: std::collections::HashSet<(i32, u32)> = parts
            .iter()
            .flat_map(|p| p.report.threads.iter().map(move |t| (p.pid, t.tid)))
            .collect();
        self.exited_since.retain(|key, _| in_reports.contains(key));
        let mut untracked = 0;
        for part in parts {
            untracked += part.report.overflow_threads;
            if let Some((_, last)) = self.cpu.get_mut(&part.pid) {
                // An exited process's CPU time stays what was last read.
                let now = process_cpu_ns(part.pid);
                if now > *last {
                    *last = now;
                }
            }
        }
        let target_cpu: u64 = self
            .cpu
            .values()
            .map(|(at_attach, last)| last.saturating_sub(*at_attach))
            .sum();
        let snapshot = Snapshot {
            series,
            histograms,
            health: Health {
                scrapes: self.scrapes,
                live,
                exited,
                folded: folded_threads,
                untracked,
                functions: self.functions as u64,
                target_cpu_s: target_cpu as f64 / 1e9,
                overhead: if target_cpu == 0 {
                    0.0
                } else {
                    calls as f64 * self.per_call_ns / target_cpu as f64
                },
                seconds: duration_ns as f64 / 1e9,
            },
        };
        let mut registry = Registry::default();
        registry.register_collector(Box::new(snapshot));
        let mut text = String::new();
        if openmetrics {
            prometheus_client::encoding::text::encode(&mut text, &registry)?;
        } else {
            prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)?;
        }
        Ok(text)
    }
}

/// The target's CPU time so far (its threads' and its dead threads'),
/// ns, from `/proc/PID/stat` (clock ticks).
fn process_cpu_ns(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let field = |i: usize| -> u64 {
        after
            .split_whitespace()
            .nth(i)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15; `after` starts at field 3.
    let ticks = field(11) + field(12);
    // SAFETY: sysconf has no memory arguments.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    ticks * 1_000_000_000 / hz
}

#[derive(Default, Debug)]
struct Figures {
    calls: u64,
    wall_ns: Option<u64>,
    cpu_ns: Option<u64>,
}

#[derive(Debug)]
struct HistogramSeries {
    function: String,
    module: String,
    pid: String,
    sum: f64,
    count: u64,
    buckets: Vec<(f64, u64)>,
}

impl HistogramSeries {
    /// `f`'s histogram, if it keeps one, as the series of process label
    /// `pid`: buckets up to the last one used (each bounded above by the
    /// next power of two), then +Inf.
    fn of(f: &weft::report::FunctionReport, pid: &str) -> Option<HistogramSeries> {
        let h = f.histogram.as_ref()?;
        let used = h.counts.iter().rposition(|&n| n > 0).map_or(0, |b| b + 1);
        let mut buckets: Vec<(f64, u64)> = h.counts[..used]
            .iter()
            .enumerate()
            .map(|(b, &n)| {
                let to = weft::report::Histogram::bounds(b).1;
                (to.map_or(f64::INFINITY, |ns| ns as f64 / 1e9), n)
            })
            .collect();
        if buckets.last().map_or(true, |b| b.0 != f64::INFINITY) {
            buckets.push((f64::INFINITY, 0));
        }
        Some(HistogramSeries {
            function: f.name.clone(),
            module: f.module.clone(),
            pid: pid.to_string(),
            sum: f.wall_ns.unwrap_or(0) as f64 / 1e9,
            count: h.total(),
            buckets,
        })
    }

    /// Adds `other`'s counts (the same function in another process folded
    /// into the same `pid` label): bucket by bucket, +Inf last.
    fn add(&mut self, other: &HistogramSeries) {
        self.sum += other.sum;
        self.count += other.count;
        let mut counts: BTreeMap<u64, (f64, u64)> = BTreeMap::new();
        for &(le, n) in self.buckets.iter().chain(&other.buckets) {
            counts.entry(le.to_bits()).or_insert((le, 0)).1 += n;
        }
        let mut buckets: Vec<(f64, u64)> = counts.into_values().collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        self.buckets = buckets;
    }
}

#[derive(Debug)]
struct Health {
    scrapes: u64,
    live: u64,
    exited: u64,
    folded: u64,
    untracked: u64,
    functions: u64,
    target_cpu_s: f64,
    overhead: f64,
    seconds: f64,
}

/// One scrape's figures, encoded by `prometheus-client`.
#[derive(Debug)]
struct Snapshot {
    /// (function, module, tid, thread, pid) → figures.
    series: BTreeMap<SeriesKey, Figures>,
    histograms: Vec<HistogramSeries>,
    health: Health,
}

type Labels = [(&'static str, String); 5];

impl Snapshot {
    fn counter_family<V: prometheus_client::encoding::EncodeCounterValue + std::fmt::Debug>(
        &self,
        encoder: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        value: impl Fn(&Figures) -> Option<V>,
    ) -> Result<(), std::fmt::Error> {
        if !self.series.values().any(|f| value(f).is_some()) {
            return Ok(());
        }
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
        for ((function, module, tid, thread, pid), f) in &self.series {
            let Some(v) = value(f) else { continue };
            let labels: Labels = [
                ("function", function.clone()),
                ("module", module.clone()),
                ("tid", tid.clone()),
                ("thread", thread.clone()),
                ("pid", pid.clone()),
            ];
            ConstCounter::new(v).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: f64,
) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(value);
    g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.counter_family(
            &mut encoder,
            "weft_calls",
            "Calls of an instrumented function by a thread (outermost and nested).",
            |f| Some(f.calls),
        )?;
        self.counter_family(
            &mut encoder,
            "weft_wall_seconds",
            "Inclusive wall time of a function's outermost activations in a thread.",
            |f| f.wall_ns.map(|ns| ns as f64 / 1e9),
        )?;
        self.counter_family(
            &mut encoder,
            "weft_cpu_seconds",
            "Inclusive CPU time of a function's outermost activations in a thread.",
            |f| f.cpu_ns.map(|ns| ns as f64 / 1e9),
        )?;
        if !self.histograms.is_empty() {
            let mut family = encoder.encode_descriptor(
                "weft_call_duration_seconds",
                "Wall time of a function's outermost calls, all threads (log2 buckets).",
                None,
                MetricType::Histogram,
            )?;
            for h in &self.histograms {
                let labels = [
                    ("function", h.function.clone()),
                    ("module", h.module.clone()),
                    ("pid", h.pid.clone()),
                ];
                family
                    .encode_family(&labels)?
                    .encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None)?;
            }
        }
        let h = &self.health;
        gauge(
            &mut encoder,
            "weft_up",
            "1 while weft is attached and reading the target.",
            1.0,
        )?;
        let c = ConstCounter::new(h.scrapes);
        c.encode(encoder.encode_descriptor(
            "weft_scrapes",
            "Scrapes answered (this one included).",
            None,
            MetricType::Counter,
        )?)?;
        {
            let mut family = encoder.encode_descriptor(
                "weft_threads",
                "The target's threads weft has figures for: live, exited (own series still), \
                 folded (into tid=\"exited\").",
                None,
                MetricType::Gauge,
            )?;
            for (state, n) in [("live", h.live), ("exited", h.exited), ("folded", h.folded)] {
                ConstGauge::new(n as f64).encode(family.encode_family(&[("state", state)])?)?;
            }
        }
        let c = ConstCounter::new(h.untracked);
        c.encode(encoder.encode_descriptor(
            "weft_untracked_threads",
            "Threads that found no free row in weft's region (not counted).",
            None,
            MetricType::Counter,
        )?)?;
        gauge(
            &mut encoder,
            "weft_functions",
            "Functions instrumented.",
            h.functions as f64,
        )?;
        let c = ConstCounter::new(h.target_cpu_s);
        c.encode(encoder.encode_descriptor(
            "weft_target_cpu_seconds",
            "The target's CPU time since weft attached.",
            None,
            MetricType::Counter,
        )?)?;
        gauge(
            &mut encoder,
            "weft_overhead_ratio",
            "Estimated share of the target's CPU time spent in weft's probes since attach \
             (calls times the measured cost of one call).",
            h.overhead,
        )?;
        gauge(
            &mut encoder,
            "weft_attached_seconds",
            "Seconds since weft attached.",
            h.seconds,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft::report::{Counts, FunctionReport, Histogram, ThreadReport};

    fn thread(tid: u32, exited: bool, calls: u64) -> ThreadReport {
        ThreadReport {
            tid,
            name: format!("w{tid}"),
            exited,
            functions: [(
                "f".to_string(),
                Counts {
                    calls,
                    wall_ns: Some(calls * 1000),
                    ..Counts::default()
                },
            )]
            .into_iter()
            .collect(),
        }
    }

    fn report(threads: Vec<ThreadReport>) -> Report {
        let mut f = FunctionReport::empty("f".into(), "exe".into(), "0x1000".into());
        f.calls = threads.iter().map(|t| t.functions["f"].calls).sum();
        f.wall_ns = Some(f.calls * 1000);
        let mut h = Histogram::empty();
        h.counts[9] = f.calls; // 512..1024 ns
        f.histogram = Some(h);
        Report {
            pid: std::process::id() as i32,
            duration_ns: 1_000_000_000,
            metrics: vec!["calls", "wall"],
            clocks: None,
            functions: vec![f],
            threads,
            overflow_threads: 0,
            runtime: None,
            kernel: None,
            trace: None,
            trace_log: None,
        }
    }

    /// The value of the sample `line` starts with.
    fn sample(text: &str, line: &str) -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(line))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    #[test]
    fn exited_threads_fold_into_one_series_after_a_while() {
        let r = report(vec![thread(1, false, 3), thread(2, true, 5)]);
        let pid = std::process::id() as i32;
        let mut keep = Exporter::new(&[pid], Duration::from_secs(3600), weft::Metrics::CALLS, 1);
        let text = keep.exposition(&r, false).unwrap();
        let one = format!(
            r#"weft_calls_total{{function="f",module="exe",tid="1",thread="w1",pid="{pid}"}}"#
        );
        let two = format!(
            r#"weft_calls_total{{function="f",module="exe",tid="2",thread="w2",pid="{pid}"}}"#
        );
        let folded = format!(
            r#"weft_calls_total{{function="f",module="exe",tid="exited",thread="exited",pid="{pid}"}}"#
        );
        assert_eq!(sample(&text, &one), Some(3.0), "{text}");
        assert_eq!(sample(&text, &two), Some(5.0), "{text}");
        assert_eq!(sample(&text, &folded), None, "{text}");
        let mut fold = Exporter::new(&[pid], Duration::ZERO, weft::Metrics::CALLS, 1);
        let text = fold.exposition(&r, false).unwrap();
        assert_eq!(sample(&text, &one), Some(3.0), "{text}");
        assert_eq!(sample(&text, &two), None, "{text}");
        assert_eq!(sample(&text, &folded), Some(5.0), "{text}");
        assert_eq!(
            sample(&text, r#"weft_threads{state="folded"}"#),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            sample(&text, r#"weft_threads{state="live"}"#),
            Some(1.0),
            "{text}"
        );
        assert_eq!(sample(&text, "weft_up"), Some(1.0), "{text}");
    }

    #[test]
    fn histograms_are_cumulative_up_to_inf_and_openmetrics_ends_with_eof() {
        let r = report(vec![thread(1, false, 4)]);
        let mut e = Exporter::new(
            &[std::process::id() as i32],
            Duration::ZERO,
            weft::Metrics::ALL,
            1,
        );
        let text = e.exposition(&r, true).unwrap();
        let pid = r.pid;
        assert!(text.ends_with("# EOF\n"), "{text}");
        let at = |le: &str| {
            sample(
                &text,
                &format!(
                    r#"weft_call_duration_seconds_bucket{{le="{le}",function="f",module="exe",pid="{pid}"}}"#
                ),
            )
        };
        // 512..1024 ns: not yet at 512 ns, all by 1024 ns and at +Inf.
        assert_eq!(at("5.12e-7"), Some(0.0), "{text}");
        assert_eq!(at("0.000001024"), Some(4.0), "{text}");
        assert_eq!(at("+Inf"), Some(4.0), "{text}");
        assert!(
            text.contains(&format!(
                r#"weft_call_duration_seconds_count{{function="f",module="exe",pid="{pid}"}} 4"#
            )),
            "{text}"
        );
    }

    #[test]
    fn addresses_are_loopback_unless_asked() {
        assert_eq!(
            parse_address("9464", false).unwrap(),
            "127.0.0.1:9464".parse().unwrap()
        );
        assert_eq!(
            parse_address(":0", false).unwrap(),
            "127.0.0.1:0".parse().unwrap()
        );
        assert!(parse_address("[::1]:80", false).unwrap().ip().is_loopback());
        let e = parse_address("0.0.0.0:9464", false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--serve-public"), "{e}");
        assert!(parse_address("0.0.0.0:9464", true).is_ok());
        assert!(parse_address("99999", false).is_err());
        assert!(parse_address("nonsense:port", false).is_err());
    }
}
