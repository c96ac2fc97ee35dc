//! weft's JSON report: its model, parsing, the fields each metric
//! selection adds and their consistency (exits balance, totals are the
//! threads' sums), and numbers as weft's tables print them.

use super::process::Ctx;
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Deserialize, Debug, Clone)]
pub struct Report {
    pub pid: i64,
    pub duration_ns: u64,
    /// The metrics measured (`calls`, `wall`, `cpu`); absent in reports
    /// that only count calls.
    #[serde(default)]
    pub metrics: Option<Vec<String>>,
    /// How each clock was read (free text per clock), when timed.
    #[serde(default)]
    pub clocks: Option<serde_json::Value>,
    pub functions: Vec<ReportFunction>,
    pub threads: Vec<ReportThread>,
    #[serde(default)]
    pub overflow_threads: u64,
    #[serde(default)]
    pub runtime: Option<RuntimeStats>,
}

#[derive(Deserialize, Debug, Clone)]
pub struct RuntimeStats {
    pub rows_used: u64,
    pub rows_reused: u64,
}

#[derive(Deserialize, Debug, Clone)]
pub struct ReportFunction {
    pub name: String,
    /// The linkage name (`weigh.isra.0`, `_ZNK3app5Cache3getEi`).
    #[serde(default)]
    pub mangled: Option<String>,
    pub module: String,
    pub address: String,
    pub calls: u64,
    /// Present only when the `wall` metric is selected.
    #[serde(default)]
    pub wall_ns: Option<u64>,
    /// Present only when the `cpu` metric is selected.
    #[serde(default)]
    pub cpu_ns: Option<u64>,
    /// Self (exclusive) wall time, with `wall`.
    #[serde(default)]
    pub self_ns: Option<u64>,
}

#[derive(Deserialize, Debug, Clone)]
pub struct ReportThread {
    pub tid: i64,
    pub name: String,
    pub exited: bool,
    pub functions: BTreeMap<String, CallCount>,
}

/// One function's figures in one thread.
#[derive(Deserialize, Debug, Clone, Default)]
pub struct CallCount {
    pub calls: u64,
    /// Inclusive wall time of the outermost activations (`wall` selected).
    #[serde(default)]
    pub wall_ns: Option<u64>,
    /// Inclusive thread CPU time of the outermost activations (`cpu` selected).
    #[serde(default)]
    pub cpu_ns: Option<u64>,
    /// Activations that returned through the exit hook (exit hooked).
    #[serde(default)]
    pub exits: Option<u64>,
    /// Activations closed because their frame vanished (exit hooked).
    #[serde(default)]
    pub unwound: Option<u64>,
    /// Entries whose exit could not be hooked (exit hooked).
    #[serde(default)]
    pub unhooked: Option<u64>,
}

impl Report {
    /// The report's row for `tid`, if any.
    pub fn thread(&self, tid: i64) -> Option<&ReportThread> {
        self.threads.iter().find(|t| t.tid == tid)
    }

    /// `tid`'s figures for function `f` (all zero/absent when it made no call).
    pub fn counts(&self, tid: i64, f: &str) -> CallCount {
        self.thread(tid)
            .and_then(|t| t.functions.get(f))
            .cloned()
            .unwrap_or_default()
    }

    /// The `functions[]` entry named `f`, if any.
    pub fn function(&self, f: &str) -> Option<&ReportFunction> {
        self.functions.iter().find(|x| x.name == f)
    }
}

/// Checks the `metrics` field: the same set as `want`.
#[track_caller]
pub fn check_metrics(ctx: &Ctx, report: &Report, want: &[&str]) {
    let mut got: Vec<String> = report.metrics.clone().unwrap_or_default();
    got.sort();
    let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    want.sort();
    ctx.check(got == want, || {
        format!(
            "report metrics {:?}, expected {want:?} (clocks: {:?}, functions: {:?})",
            report.metrics, report.clocks, report.functions
        )
    });
}

/// Checks which optional fields are present, for every function of every
/// thread and in `functions[]`: `wall_ns` iff `wall`, `cpu_ns` iff `cpu`,
/// and `exits`/`unwound`/`unhooked` iff either timer (the exit is hooked).
#[track_caller]
pub fn check_metric_fields(ctx: &Ctx, report: &Report, wall: bool, cpu: bool) {
    check_fields_of(ctx, report, wall, cpu, wall || cpu);
}

/// [`check_metric_fields`] where the exits are hooked whenever `hooked`
/// (call traces hook them too).
#[track_caller]
pub fn check_fields_of(ctx: &Ctx, report: &Report, wall: bool, cpu: bool, hooked: bool) {
    for f in &report.functions {
        ctx.check(f.wall_ns.is_some() == wall, || {
            format!(
                "functions[] {}: wall_ns is {:?}, wall selected: {wall}: {f:?}",
                f.name, f.wall_ns
            )
        });
        ctx.check(f.cpu_ns.is_some() == cpu, || {
            format!(
                "functions[] {}: cpu_ns is {:?}, cpu selected: {cpu}: {f:?}",
                f.name, f.cpu_ns
            )
        });
    }
    for t in &report.threads {
        for (name, c) in &t.functions {
            let fields = [
                ("wall_ns", c.wall_ns.is_some(), wall),
                ("cpu_ns", c.cpu_ns.is_some(), cpu),
                ("exits", c.exits.is_some(), hooked),
                ("unwound", c.unwound.is_some(), hooked),
                ("unhooked", c.unhooked.is_some(), hooked),
            ];
            for (field, present, want) in fields {
                ctx.check(present == want, || {
                    format!(
                        "tid {} {name}: field {field} present: {present}, expected {want} \
                         (wall: {wall}, cpu: {cpu})\nthread: {t:#?}",
                        t.tid
                    )
                });
            }
        }
    }
}

/// For every exited thread and every function whose exit is hooked:
/// `calls == exits + unwound + unhooked` (nothing left open).
#[track_caller]
pub fn check_exit_balance(ctx: &Ctx, report: &Report) {
    for t in report.threads.iter().filter(|t| t.exited) {
        for (name, c) in &t.functions {
            let (Some(e), Some(u), Some(h)) = (c.exits, c.unwound, c.unhooked) else {
                continue;
            };
            ctx.check(c.calls == e + u + h, || {
                format!(
                    "exited tid {} {name}: calls {} != exits {e} + unwound {u} + unhooked {h}\n\
                     thread: {t:#?}",
                    t.tid, c.calls
                )
            });
        }
    }
}

/// Checks `functions[]`'s `wall_ns`/`cpu_ns` are the sums over the threads.
#[track_caller]
pub fn check_timer_totals(ctx: &Ctx, report: &Report) {
    for f in &report.functions {
        let rows = || {
            report
                .threads
                .iter()
                .filter_map(|t| t.functions.get(&f.name))
        };
        let timers = [
            (
                "wall_ns",
                f.wall_ns,
                rows().filter_map(|c| c.wall_ns).sum::<u64>(),
            ),
            (
                "cpu_ns",
                f.cpu_ns,
                rows().filter_map(|c| c.cpu_ns).sum::<u64>(),
            ),
        ];
        for (field, total, sum) in timers {
            if let Some(total) = total {
                ctx.check(total == sum, || {
                    format!(
                        "functions[] {}: {field} {total}, the threads' sum is {sum}",
                        f.name
                    )
                });
            }
        }
    }
}

#[track_caller]
pub fn parse_report(ctx: &Ctx, text: &str) -> Report {
    serde_json::from_str(text.trim())
        .unwrap_or_else(|e| ctx.fail(format!("weft's JSON report does not parse ({e}):\n{text}")))
}

/// Parses `0x...` hex.
#[track_caller]
pub fn parse_hex(ctx: &Ctx, s: &str) -> u64 {
    s.strip_prefix("0x")
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .unwrap_or_else(|| ctx.fail(format!("{s:?} is not a 0x-hex address")))
}

/// `n` as weft's tables print it: 3,074.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}
