//! Reports: what weft measured, per function and per thread, as JSON (the
//! format documented in `docs/report-format.md`) or as a table for people.

use crate::region::RowSnapshot;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use weft_rt::layout;

mod build;
mod processes;
mod table;
mod text;

pub use processes::{FunctionTotal, ProcessReport, ProcessesReport};

pub use table::{
    SortKey, TableHints, TableOptions, COMPACT_MAX_FUNCTIONS, DEFAULT_TOP, HISTOGRAMS_SHOWN,
    TABLE_WIDTH,
};
pub use text::{ellipsize, group_digits, human_ns};

/// One instrumented function, as reported.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct FunctionReport {
    /// Function name as people write it: demangled (`Cache::get(int)
    /// const`), a compiler clone under its source name (`parse_field` for
    /// `parse_field.isra.0`); qualified `module:name` only when two share
    /// a name.
    pub name: String,
    /// The linkage (symbol) name, mangled, with any clone suffix: that of
    /// the first clone when the entry holds several. None for kernel
    /// probes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mangled: Option<String>,
    /// The linkage names of the compiler clones counted in this entry
    /// (`scale`, `scale.constprop.0`), when it holds more than one; their
    /// figures add up.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub clones: Vec<String>,
    /// The other names of the same function (same address) that the
    /// patterns matched; counted once, under `name`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
    /// File name of the module that holds it.
    pub module: String,
    /// Runtime address of the patched function, `0x`-hex.
    pub address: String,
    /// Calls summed over all threads.
    pub calls: u64,
    /// Wall time summed over all threads (each thread's outermost
    /// activations), ns; when measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wall_ns: Option<u64>,
    /// CPU time summed over all threads, ns; when measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_ns: Option<u64>,
    /// Self (exclusive) wall time summed over all threads, ns: time in the
    /// function less time in the timed functions it called (at any depth);
    /// every activation counts, recursive ones included. When wall time
    /// is measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub self_ns: Option<u64>,
    /// `wall_ns / calls`, rounded (when wall time is measured and there
    /// were calls).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wall_ns_per_call: Option<u64>,
    /// `self_ns / calls`, rounded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub self_ns_per_call: Option<u64>,
    /// `cpu_ns / calls`, rounded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_ns_per_call: Option<u64>,
    /// Threads that called it.
    pub threads: u32,
    /// Latency histogram of the outermost activations' wall time, summed
    /// over all threads; when kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub histogram: Option<Histogram>,
    /// How a kernel probe is attached (`fentry/fexit`, `kprobe/kretprobe`,
    /// `kprobe at offset`, `raw_syscalls tracepoints`); kernel probes only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mechanism: Option<&'static str>,
    /// A kernel probe's figures split by the instrumented user function
    /// each thread was innermost in when it entered the kernel (`(none)`:
    /// in none).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub by_user_function: BTreeMap<String, Counts>,
}

impl FunctionReport {
    /// A function with nothing counted yet.
    pub fn empty(name: String, module: String, address: String) -> FunctionReport {
        FunctionReport {
            name,
            mangled: None,
            clones: Vec::new(),
            aliases: Vec::new(),
            module,
            address,
            calls: 0,
            wall_ns: None,
            cpu_ns: None,
            self_ns: None,
            wall_ns_per_call: None,
            self_ns_per_call: None,
            cpu_ns_per_call: None,
            threads: 0,
            histogram: None,
            mechanism: None,
            by_user_function: BTreeMap::new(),
        }
    }

    /// The name as tables print it: with its aliases (`malloc (= __libc_malloc)`)
    /// and the clones it sums (`scale [scale, scale.constprop.0]`).
    pub fn label(&self) -> String {
        let mut label = self.name.clone();
        if !self.aliases.is_empty() {
            let _ = write!(label, " (= {})", self.aliases.join(", "));
        }
        if !self.clones.is_empty() {
            let _ = write!(label, " [{}]", self.clones.join(", "));
        }
        label
    }

    /// The `*_per_call` fields from the totals, rounded to the nearest ns.
    fn set_per_call(&mut self) {
        let calls = self.calls;
        let per_call = |total: Option<u64>| {
            total
                .filter(|_| calls > 0)
                .map(|t| ((u128::from(t) + u128::from(calls) / 2) / u128::from(calls)) as u64)
        };
        self.wall_ns_per_call = per_call(self.wall_ns);
        self.self_ns_per_call = per_call(self.self_ns);
        self.cpu_ns_per_call = per_call(self.cpu_ns);
    }
}

/// Counts of activations per log2 bucket of their inclusive wall time:
/// `counts[b]` activations took `ns` with `floor(log2(ns)) == b` (bucket 0
/// holds 0 and 1 ns, the last bucket everything longer). Serialised as
/// the non-empty buckets, `[{"from_ns": 8192, "to_ns": 16384, "count":
/// 20}, …]` (no `to_ns` for the last bucket).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Histogram {
    /// One count per bucket ([`weft_codegen::HIST_BUCKETS`]).
    pub counts: Vec<u64>,
}

impl Histogram {
    /// No activation counted.
    pub fn empty() -> Histogram {
        Histogram {
            counts: vec![0; weft_codegen::HIST_BUCKETS],
        }
    }

    fn add(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
    }

    /// Activations counted.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// `[from, to)` of bucket `b` in ns (`to` None for the last bucket).
    pub fn bounds(b: usize) -> (u64, Option<u64>) {
        let to = (b + 1 < weft_codegen::HIST_BUCKETS).then(|| 1u64 << (b + 1));
        (weft_codegen::histogram_floor(b), to)
    }
}

impl Serialize for Histogram {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        #[derive(Serialize)]
        struct Bucket {
            from_ns: u64,
            #[serde(skip_serializing_if = "Option::is_none")]
            to_ns: Option<u64>,
            count: u64,
        }
        let mut seq = s.serialize_seq(None)?;
        for (b, &count) in self.counts.iter().enumerate().filter(|(_, &c)| c > 0) {
            let (from_ns, to_ns) = Histogram::bounds(b);
            seq.serialize_element(&Bucket {
                from_ns,
                to_ns,
                count,
            })?;
        }
        seq.end()
    }
}

/// Per-function figures of one thread.
#[derive(Clone, Debug, Serialize, PartialEq, Eq, Default)]
pub struct Counts {
    /// Calls this thread made (every activation, recursive ones included).
    pub calls: u64,
    /// Inclusive wall time of the outermost activations, ns (a running one
    /// counts up to the moment of the report); when measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wall_ns: Option<u64>,
    /// Inclusive CPU time of the thread in the outermost activations, ns;
    /// when measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_ns: Option<u64>,
    /// Self wall time of its closed activations, ns; when wall time is
    /// measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub self_ns: Option<u64>,
    /// Latency histogram of its closed outermost activations; when kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub histogram: Option<Histogram>,
    /// Activations that returned through the exit hook; when hooked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exits: Option<u64>,
    /// Activations closed because their frame vanished (longjmp, an
    /// exception, `pthread_exit`, thread exit); when hooked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unwound: Option<u64>,
    /// Entries whose exit could not be hooked (more than the runtime's
    /// nesting capacity open at once); when hooked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unhooked: Option<u64>,
    /// A kernel probe's figures in this thread by user function (see
    /// [`FunctionReport::by_user_function`]).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub by_user_function: BTreeMap<String, Counts>,
}

/// One thread that ran at least one instrumented function.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ThreadReport {
    /// Kernel thread id.
    pub tid: u32,
    /// Thread name (`comm`).
    pub name: String,
    /// The thread had exited when the report was taken.
    pub exited: bool,
    /// Figures per function name (only functions it called).
    pub functions: BTreeMap<String, Counts>,
}

/// A whole report.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Report {
    /// The target.
    pub pid: i32,
    /// Time instrumentation was live, in nanoseconds.
    pub duration_ns: u64,
    /// The metrics measured by at least one probe (`calls`, `wall`, `cpu`).
    pub metrics: Vec<&'static str>,
    /// The clocks behind `wall_ns` and `cpu_ns`, when measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clocks: Option<Clocks>,
    /// Every instrumented function.
    pub functions: Vec<FunctionReport>,
    /// Every thread that ran an instrumented function, once each.
    pub threads: Vec<ThreadReport>,
    /// Threads that found the runtime's table full and share one row;
    /// their calls are in the overflow pseudo-thread (tid 0).
    #[serde(skip_serializing_if = "is_zero")]
    pub overflow_threads: u64,
    /// How the runtime's thread table was used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeStats>,
    /// About the kernel probes, when there are any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelStats>,
    /// About the call trace, with `-m trace`: calls recorded, events
    /// dropped, per thread.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<crate::trace::TraceSummary>,
    /// The call trace itself, for `--format chrome-trace` and
    /// `--format flamegraph` (not in the JSON report).
    #[serde(skip)]
    pub trace_log: Option<crate::trace::Trace>,
}

/// About a report's kernel probes.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct KernelStats {
    /// CPU times inside kernel code are measured (`sched_switch` attached).
    pub cpu_time: bool,
    /// Calls not counted because the totals map was full.
    pub lost_calls: u64,
}

/// Where the times come from, in words.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Clocks {
    /// The wall clock's source; when wall time was measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wall: Option<String>,
    /// The threads' CPU clock sources (distinct ones, `; `-separated);
    /// when CPU time was measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
}

/// The runtime's thread-table usage, for people sizing it.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct RuntimeStats {
    /// Rows handed out (the table's high-water mark).
    pub rows_used: u32,
    /// Threads that took over the row of a thread that had exited.
    pub rows_reused: u64,
}

pub(crate) use crate::inspect::procfs::thread_name as live_thread_name;

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// What the report needs to know about a probe.
#[derive(Clone, Debug)]
pub(crate) struct ProbeInfo {
    /// Function name.
    pub name: String,
    /// Other names of the same address the patterns matched.
    pub aliases: Vec<String>,
    /// Module file name.
    pub module: String,
    /// Patched address.
    pub address: u64,
    /// Metric word of its call counter (the first of its words).
    pub calls_word: u32,
    /// What it measures.
    pub metrics: crate::exits::Metrics,
}

impl Report {
    /// The report as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a report always serialises")
    }
}

#[cfg(test)]
mod tests;
