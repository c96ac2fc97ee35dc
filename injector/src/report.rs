//! Reports: what weft measured, per function and per thread, as JSON (the
//! format documented in `docs/report-format.md`) or as a table for people.

use crate::region::RowSnapshot;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use weft_rt::layout;

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
    /// A report of kernel probes alone (no user function instrumented,
    /// no runtime in the target), live for `duration_ns`.
    pub fn of_kernel(pid: i32, duration_ns: u64, kernel: &crate::kernel::KernelSnapshot) -> Report {
        let mut report = Report::build(pid, duration_ns, &[], &[], 0, |_| None);
        report.add_kernel(kernel, |_| None, |tid| live_thread_name(pid, tid));
        report
    }

    /// Builds a report from the probes and a snapshot of the region's rows.
    /// `live_name` gives a live thread's current name, when known.
    pub(crate) fn build(
        pid: i32,
        duration_ns: u64,
        probes: &[ProbeInfo],
        rows: &[RowSnapshot],
        overflow_threads: u64,
        live_name: impl Fn(u32) -> Option<String>,
    ) -> Report {
        Report::build_hooked(
            pid,
            duration_ns,
            probes,
            rows,
            overflow_threads,
            live_name,
            &[],
        )
    }

    /// [`Report::build`], where the probes whose first word is in
    /// `hooked` have their exits hooked without timers (traced calls):
    /// their exits are reported too.
    pub(crate) fn build_hooked(
        pid: i32,
        duration_ns: u64,
        probes: &[ProbeInfo],
        rows: &[RowSnapshot],
        overflow_threads: u64,
        live_name: impl Fn(u32) -> Option<String>,
        hooked: &[u32],
    ) -> Report {
        // A function instrumented several times in a session (probes
        // inserted and removed again, maybe under another of its names) is
        // one entry: its probes' figures add up.
        let mut entry_of = Vec::with_capacity(probes.len());
        let mut firsts: Vec<&ProbeInfo> = Vec::new();
        let mut aliases: Vec<Vec<String>> = Vec::new();
        // Names as people write them, per entry, and the linkage names of
        // the clones an entry sums.
        let mut shown: Vec<String> = Vec::new();
        let mut clones: Vec<Vec<String>> = Vec::new();
        // Entries by address: a libc-wide glob has thousands of functions.
        let mut at: std::collections::HashMap<(&str, u64), Vec<usize>> =
            std::collections::HashMap::new();
        // The first entry of each source name, by module, and whether an
        // entry holds a compiler clone: a function's clones are one entry.
        let mut by_source: std::collections::HashMap<(&str, String), usize> =
            std::collections::HashMap::new();
        let mut has_clone: Vec<bool> = Vec::new();
        for p in probes {
            let same = |q: &ProbeInfo| {
                q.name == p.name || q.aliases.contains(&p.name) || p.aliases.contains(&q.name)
            };
            let display = display_name_cached(&p.name);
            let is_clone = crate::inspect::names::split_clone(&p.name).1.is_some();
            let candidates = at.entry((p.module.as_str(), p.address)).or_default();
            let found = candidates.iter().copied().find(|&e| same(firsts[e]));
            let group_key = (p.module.as_str(), display.clone());
            // Joins the entry of the same source name when one of the two
            // is a clone: two static functions of one name in two files
            // are no clones of each other.
            let found = found.or_else(|| {
                let &e = by_source.get(&group_key)?;
                (is_clone || has_clone[e]).then_some(e)
            });
            let e = found.unwrap_or_else(|| {
                firsts.push(p);
                aliases.push(Vec::new());
                shown.push(display);
                clones.push(Vec::new());
                has_clone.push(false);
                candidates.push(firsts.len() - 1);
                firsts.len() - 1
            });
            by_source.entry(group_key).or_insert(e);
            has_clone[e] |= is_clone;
            let linkage_names = [&firsts[e].name, &p.name];
            if firsts[e].address != p.address && linkage_names[0] != linkage_names[1] {
                for name in linkage_names {
                    if !clones[e].contains(name) {
                        clones[e].push(name.clone());
                    }
                }
            }
            // Clones (other addresses) are listed as clones, not aliases.
            let same_address = firsts[e].address == p.address;
            for name in std::iter::once(&p.name).chain(&p.aliases) {
                if same_address && *name != firsts[e].name && !aliases[e].contains(name) {
                    aliases[e].push(name.clone());
                }
            }
            entry_of.push(e);
        }
        let names = display_names(&firsts, &shown);
        let mut functions: Vec<FunctionReport> = firsts
            .iter()
            .zip(&names)
            .zip(aliases.into_iter().zip(clones))
            .map(|((p, name), (aliases, clones))| FunctionReport {
                mangled: Some(p.name.clone()),
                clones,
                aliases,
                ..FunctionReport::empty(name.clone(), p.module.clone(), format!("{:#x}", p.address))
            })
            .collect();
        for (p, &e) in probes.iter().zip(&entry_of) {
            let f = &mut functions[e];
            if p.metrics.wall {
                f.wall_ns.get_or_insert(0);
                f.self_ns.get_or_insert(0);
            }
            if p.metrics.keeps_histogram() {
                f.histogram.get_or_insert_with(Histogram::empty);
            }
            if p.metrics.cpu {
                f.cpu_ns.get_or_insert(0);
            }
        }
        let mut threads = Vec::new();
        let mut called = vec![false; functions.len()];
        for row in rows {
            called.iter_mut().for_each(|c| *c = false);
            let mut counts: BTreeMap<String, Counts> = BTreeMap::new();
            for (probe, &i) in probes.iter().zip(&entry_of) {
                let word = |k: usize| {
                    row.words
                        .get(probe.calls_word as usize + k)
                        .copied()
                        .unwrap_or(0)
                };
                let calls = word(0);
                if calls == 0 {
                    continue;
                }
                if !called[i] {
                    called[i] = true;
                    functions[i].threads += 1;
                }
                let mut c = Counts {
                    calls,
                    ..Counts::default()
                };
                functions[i].calls += calls;
                if probe.metrics.hooks_exit() || hooked.contains(&probe.calls_word) {
                    c.exits = Some(word(timer_word(weft_codegen::METRIC_EXITS)));
                    c.unwound = Some(word(timer_word(weft_codegen::METRIC_UNWOUND)));
                    c.unhooked = Some(word(timer_word(weft_codegen::METRIC_UNHOOKED)));
                }
                if probe.metrics.wall {
                    let w = word(timer_word(weft_codegen::METRIC_WALL_TOTAL));
                    c.wall_ns = Some(w);
                    *functions[i].wall_ns.get_or_insert(0) += w;
                    let own = word(timer_word(weft_codegen::METRIC_SELF_TOTAL));
                    c.self_ns = Some(own);
                    *functions[i].self_ns.get_or_insert(0) += own;
                }
                if probe.metrics.keeps_histogram() {
                    let first = timer_word(weft_codegen::METRIC_HIST);
                    let h = Histogram {
                        counts: (0..weft_codegen::HIST_BUCKETS)
                            .map(|b| word(first + b))
                            .collect(),
                    };
                    functions[i]
                        .histogram
                        .get_or_insert_with(Histogram::empty)
                        .add(&h);
                    c.histogram = Some(h);
                }
                if probe.metrics.cpu {
                    let w = word(timer_word(weft_codegen::METRIC_CPU_TOTAL));
                    c.cpu_ns = Some(w);
                    *functions[i].cpu_ns.get_or_insert(0) += w;
                }
                let add = |a: Option<u64>, b: Option<u64>| match (a, b) {
                    (None, None) => None,
                    (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
                };
                let merged = counts.entry(names[i].clone()).or_default();
                merged.calls += c.calls;
                merged.exits = add(merged.exits, c.exits);
                merged.unwound = add(merged.unwound, c.unwound);
                merged.unhooked = add(merged.unhooked, c.unhooked);
                merged.wall_ns = add(merged.wall_ns, c.wall_ns);
                merged.cpu_ns = add(merged.cpu_ns, c.cpu_ns);
                merged.self_ns = add(merged.self_ns, c.self_ns);
                if let Some(h) = &c.histogram {
                    merged.histogram.get_or_insert_with(Histogram::empty).add(h);
                }
            }

            if counts.is_empty() {
                continue;
            }
            let exited = row.state != layout::ROW_LIVE;
            let overflow = row.state == layout::ROW_OVERFLOW;
            let name = if overflow {
                "(overflow)".to_string()
            } else if exited {
                row.name.clone()
            } else {
                live_name(row.tid).unwrap_or_else(|| row.name.clone())
            };
            threads.push(ThreadReport {
                tid: if overflow { 0 } else { row.tid },
                name,
                exited: exited && !overflow,
                functions: counts,
            });
        }
        functions.iter_mut().for_each(FunctionReport::set_per_call);
        let metrics = probes
            .iter()
            .fold(crate::exits::Metrics::CALLS, |m, p| m.union(p.metrics))
            .names();
        Report {
            pid,
            duration_ns,
            metrics,
            clocks: None,
            functions,
            threads,
            overflow_threads,
            runtime: None,
            kernel: None,
            trace: None,
            trace_log: None,
        }
    }

    /// Adds a kernel session's figures: each kernel probe becomes a
    /// function named `kernel:NAME` or `syscall:NAME` (module `kernel` or
    /// `syscall`), in the totals and in each thread, split by user
    /// function. `user_function` names an attribution (the row offset of
    /// an instrumented function's metric words); `live_name` a thread.
    pub fn add_kernel(
        &mut self,
        kernel: &crate::kernel::KernelSnapshot,
        user_function: impl Fn(u32) -> Option<String>,
        live_name: impl Fn(u32) -> Option<String>,
    ) {
        let attributed = |a: u32| match a {
            0 => "(none)".to_string(),
            a => user_function(a).unwrap_or_else(|| "(other)".to_string()),
        };
        let first = self.functions.len();
        for p in &kernel.probes {
            self.functions.push(FunctionReport {
                wall_ns: p.timed.then_some(0),
                cpu_ns: (p.timed && kernel.cpu).then_some(0),
                mechanism: Some(p.mechanism.name()),
                ..FunctionReport::empty(
                    format!("{}:{}", p.module, p.name),
                    p.module.to_string(),
                    "-".to_string(),
                )
            });
        }
        let add_to = |c: &mut Counts, row: &crate::kernel::KernelRow, timed: bool| {
            c.calls += row.calls;
            if timed {
                *c.wall_ns.get_or_insert(0) += row.wall_ns;
                if kernel.cpu {
                    *c.cpu_ns.get_or_insert(0) += row.cpu_ns;
                }
            }
        };
        let mut seen: std::collections::HashSet<(u32, u32)> = Default::default();
        for row in &kernel.rows {
            let Some(p) = kernel.probes.get(row.probe as usize) else {
                continue;
            };
            let i = first + row.probe as usize;
            let name = self.functions[i].name.clone();
            let user = attributed(row.attribution);
            {
                let f = &mut self.functions[i];
                f.calls += row.calls;
                if p.timed {
                    *f.wall_ns.get_or_insert(0) += row.wall_ns;
                    if kernel.cpu {
                        *f.cpu_ns.get_or_insert(0) += row.cpu_ns;
                    }
                }
                let mut split = f.by_user_function.remove(&user).unwrap_or_default();
                add_to(&mut split, row, p.timed);
                f.by_user_function.insert(user.clone(), split);
                if seen.insert((row.probe, row.tid)) {
                    f.threads += 1;
                }
            }
            let t = match self.threads.iter().position(|t| t.tid == row.tid) {
                Some(t) => t,
                None => {
                    self.threads.push(ThreadReport {
                        tid: row.tid,
                        name: live_name(row.tid).unwrap_or_default(),
                        exited: live_name(row.tid).is_none(),
                        functions: BTreeMap::new(),
                    });
                    self.threads.len() - 1
                }
            };
            let c = self.threads[t].functions.entry(name).or_default();
            add_to(c, row, p.timed);
            let mut split = c.by_user_function.remove(&user).unwrap_or_default();
            add_to(&mut split, row, p.timed);
            c.by_user_function.insert(user, split);
        }
        self.functions[first..]
            .iter_mut()
            .for_each(FunctionReport::set_per_call);
        for m in ["wall", "cpu"] {
            let measured = self.functions[first..].iter().any(|f| match m {
                "wall" => f.wall_ns.is_some(),
                _ => f.cpu_ns.is_some(),
            });
            if measured && !self.metrics.contains(&m) {
                self.metrics.push(m);
            }
        }
        self.kernel = Some(KernelStats {
            cpu_time: kernel.cpu,
            lost_calls: kernel.lost,
        });
    }

    /// The report as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a report always serialises")
    }

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
                "trace: {} calls recorded on {} thread(s), {} events dropped, {} not kept (--format chrome-trace or flamegraph writes them)",
                t.calls,
                t.threads.len(),
                t.dropped_events,
                t.discarded_events
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
        left_out(&all[shown.len()..], out);
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
                        "… {} more function(s) of this thread not shown (--top 0 shows all)",
                        mine.len() - kept.len()
                    );
                }
            }
        } else {
            self.thread_summary(key, top, out);
        }
        shown
    }

    /// One line per thread: its calls, the functions it called and its
    /// first function by `key`.
    fn thread_summary(&self, key: SortKey, top: usize, out: &mut String) {
        let mut threads: Vec<&ThreadReport> = self.threads.iter().collect();
        let calls = |t: &ThreadReport| t.functions.values().map(|c| c.calls).sum::<u64>();
        threads.sort_by(|a, b| calls(b).cmp(&calls(a)).then(a.tid.cmp(&b.tid)));
        let kept = limit(&threads, top);
        let _ = writeln!(
            out,
            "\nthreads by calls{} (--by-thread: each thread's functions):",
            if kept.len() < threads.len() {
                format!(", top {} of {}", kept.len(), threads.len())
            } else {
                String::new()
            }
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
                "… {} more thread(s) not shown (--top 0 shows all)",
                threads.len() - kept.len()
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
                        "no latency histogram of {} (kept with -m wall and --histogram)",
                        f.name
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
fn left_out(rest: &[&FunctionReport], out: &mut String) {
    if rest.is_empty() {
        return;
    }
    let calls: u64 = rest.iter().map(|f| f.calls).sum();
    let wall: Option<u64> = rest.iter().map(|f| f.wall_ns).sum();
    let _ = writeln!(
        out,
        "… {} more function(s) not shown: {} calls{} (--top N, --top 0 shows all)",
        rest.len(),
        group_digits(calls),
        wall.map_or(String::new(), |w| format!(", {} wall", human_ns(w)))
    );
}

/// A histogram as text: one line per bucket from the first to the last
/// non-empty one, with a bar.
fn histogram_text(name: &str, h: &Histogram, out: &mut String) {
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

/// Index, relative to a probe's first word, of the word at byte offset
/// `offset` from its metric base.
fn timer_word(offset: i32) -> usize {
    (offset / 8) as usize
}

/// Nanoseconds for people: `950 ns`, `12.3 µs`, `4.56 ms`, `1.23 s`.
pub fn human_ns(ns: u64) -> String {
    let v = ns as f64;
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.1} µs", v / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2} ms", v / 1e6)
    } else {
        format!("{:.2} s", v / 1e9)
    }
}

/// [`crate::inspect::names::display_name`], remembered: a live report
/// (`--interval`, `top`, `/metrics`) names the same thousands of
/// functions each time, and demangling is not free.
fn display_name_cached(name: &str) -> String {
    use std::sync::{Mutex, OnceLock};
    static SHOWN: OnceLock<Mutex<std::collections::HashMap<String, String>>> = OnceLock::new();
    let memo = SHOWN.get_or_init(Default::default);
    if let Some(shown) = memo.lock().ok().and_then(|m| m.get(name).cloned()) {
        return shown;
    }
    let shown = crate::inspect::names::display_name(name);
    if let Ok(mut m) = memo.lock() {
        m.insert(name.to_owned(), shown.clone());
    }
    shown
}

/// Names as reported: `shown` (each entry's name as people write it), or
/// `module:name` where two entries share one.
fn display_names(probes: &[&ProbeInfo], shown: &[String]) -> Vec<String> {
    let mut uses: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for name in shown {
        *uses.entry(name.as_str()).or_default() += 1;
    }
    probes
        .iter()
        .zip(shown)
        .map(|(p, name)| {
            let clash = uses[name.as_str()] > 1;
            if clash {
                format!("{}:{}", p.module, name)
            } else {
                name.clone()
            }
        })
        .collect()
}

/// `1234567` as `1,234,567`.
pub fn group_digits(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Renders `table` with the first `left` columns left-aligned, the others
/// (numbers) right-aligned.
fn render(table: &[Vec<String>], left: usize, out: &mut String) {
    let columns = table.iter().map(Vec::len).max().unwrap_or(0);
    let align: Vec<bool> = (0..columns).map(|c| c >= left).collect();
    render_aligned(table, &align, out);
}

/// Renders `table`, column `c` right-aligned when `right[c]`.
fn render_aligned(table: &[Vec<String>], right: &[bool], out: &mut String) {
    let columns = table.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            table
                .iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in table {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if right.get(c).copied().unwrap_or(true) {
                let _ = write!(line, "{cell:>w$}  ", w = widths[c]);
            } else {
                let _ = write!(line, "{cell:<w$}  ", w = widths[c]);
            }
        }
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

/// `s` in at most `width` characters: cut in the middle with `…` (the
/// start and the end of a long C++ or Rust name say the most).
pub fn ellipsize(s: &str, width: usize) -> String {
    let n = s.chars().count();
    if n <= width {
        return s.to_string();
    }
    if width <= 1 {
        return "…".chars().take(width).collect();
    }
    let keep = width - 1;
    let tail = keep / 3;
    let head = keep - tail;
    let mut out: String = s.chars().take(head).collect();
    out.push('…');
    out.extend(s.chars().skip(n - tail));
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(index: u32, tid: u32, state: u32, words: Vec<u64>) -> RowSnapshot {
        RowSnapshot {
            index,
            state,
            tid,
            generation: 0,
            name: format!("t{index}"),
            words,
            cpu_source: (0, 0),
        }
    }

    #[test]
    fn timed_probes_report_times_and_exit_counts() {
        let probes = vec![
            ProbeInfo {
                name: "timed".into(),
                aliases: Vec::new(),
                module: "exe".into(),
                address: 0x1000,
                calls_word: 0,
                metrics: crate::exits::Metrics {
                    wall: true,
                    cpu: false,
                    histogram: false,
                },
            },
            ProbeInfo {
                name: "counted".into(),
                aliases: Vec::new(),
                module: "exe".into(),
                address: 0x2000,
                calls_word: 10,
                metrics: crate::exits::Metrics::CALLS,
            },
        ];
        // entries, exits, unwound, unhooked, nesting, seq, wall, -, cpu, -
        let mut words = vec![7, 5, 1, 1, 0, 2, 3_500_000, 0, 900, 0, 4];
        let rows = vec![row(0, 10, layout::ROW_LIVE, words.clone())];
        let r = Report::build(1, 5, &probes, &rows, 0, |_| None);
        assert_eq!(r.metrics, ["calls", "wall"]);
        let c = &r.threads[0].functions["timed"];
        assert_eq!(
            (c.calls, c.exits, c.unwound, c.unhooked, c.wall_ns, c.cpu_ns),
            (7, Some(5), Some(1), Some(1), Some(3_500_000), None)
        );
        assert_eq!(r.functions[0].wall_ns, Some(3_500_000));
        assert_eq!(r.functions[1].wall_ns, None);
        let plain = &r.threads[0].functions["counted"];
        assert_eq!((plain.calls, plain.exits), (4, None));
        let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(
            json["threads"][0]["functions"]["timed"]["wall_ns"],
            3_500_000
        );
        assert!(json["threads"][0]["functions"]["counted"]
            .get("wall_ns")
            .is_none());
        let table = r.to_table();
        assert!(table.contains("3.50 ms"), "{table}");
        words[6] = 999;
        assert_eq!(human_ns(words[6]), "999 ns");
        assert_eq!(human_ns(12_345), "12.3 µs");
        assert_eq!(human_ns(2_500_000_000), "2.50 s");
    }

    #[test]
    fn a_function_probed_twice_is_one_entry() {
        // Inserted, removed, inserted again (new words): one function, one
        // name, the calls of both.
        let probe = |calls_word| ProbeInfo {
            name: "f".into(),
            aliases: Vec::new(),
            module: "exe".into(),
            address: 0x1000,
            calls_word,
            metrics: crate::exits::Metrics::CALLS,
        };
        let probes = vec![probe(0), probe(1)];
        let rows = vec![
            row(0, 10, layout::ROW_LIVE, vec![3, 4]),
            row(1, 11, layout::ROW_LIVE, vec![0, 5]),
        ];
        let r = Report::build(1, 5, &probes, &rows, 0, |_| None);
        assert_eq!(r.functions.len(), 1);
        assert_eq!(
            (r.functions[0].name.as_str(), r.functions[0].calls),
            ("f", 12)
        );
        assert_eq!(r.threads[0].functions["f"].calls, 7);
        assert_eq!(r.threads[1].functions["f"].calls, 5);
    }

    #[test]
    fn clones_are_one_entry_under_the_source_name() {
        // `scale` and its clone `scale.constprop.0` (another address) are
        // one entry named `scale`, their calls summed; a C++ name is
        // demangled, its linkage name kept beside it; a static function of
        // the same name in another module stays apart.
        let probe = |name: &str, module: &str, address, calls_word| ProbeInfo {
            name: name.into(),
            aliases: Vec::new(),
            module: module.into(),
            address,
            calls_word,
            metrics: crate::exits::Metrics::CALLS,
        };
        let probes = vec![
            probe("scale", "exe", 0x1000, 0),
            probe("scale.constprop.0", "exe", 0x2000, 1),
            probe("_ZNK3app5Cache3getEi", "exe", 0x3000, 2),
            probe("scale.isra.0", "lib.so", 0x9000, 3),
        ];
        let rows = vec![
            row(0, 10, layout::ROW_LIVE, vec![3, 4, 1, 2]),
            row(1, 11, layout::ROW_LIVE, vec![0, 5, 0, 0]),
        ];
        let r = Report::build(1, 5, &probes, &rows, 0, |_| None);
        assert_eq!(r.functions.len(), 3, "{:?}", r.functions);
        let scale = r.functions.iter().find(|f| f.name == "exe:scale").unwrap();
        assert_eq!(scale.calls, 12);
        assert_eq!(scale.clones, ["scale", "scale.constprop.0"]);
        assert_eq!(scale.mangled.as_deref(), Some("scale"));
        assert_eq!(scale.label(), "exe:scale [scale, scale.constprop.0]");
        assert_eq!(r.threads[0].functions["exe:scale"].calls, 7);
        assert_eq!(r.threads[1].functions["exe:scale"].calls, 5);
        let lib = r
            .functions
            .iter()
            .find(|f| f.name == "lib.so:scale")
            .unwrap();
        assert_eq!((lib.calls, lib.clones.len()), (2, 0));
        assert_eq!(lib.mangled.as_deref(), Some("scale.isra.0"));
        let get = r
            .functions
            .iter()
            .find(|f| f.name == "app::Cache::get(int) const")
            .unwrap();
        assert_eq!(get.mangled.as_deref(), Some("_ZNK3app5Cache3getEi"));
        let json = r.to_json();
        assert!(
            json.contains(
                r#""name":"app::Cache::get(int) const","mangled":"_ZNK3app5Cache3getEi""#
            ),
            "{json}"
        );
    }

    #[test]
    fn aliases_of_one_address_are_one_entry() {
        // Probed as `malloc` (also matched as `__libc_malloc`), removed,
        // probed again as `__libc_malloc`: one entry with both names.
        let probe = |name: &str, alias: &str, calls_word| ProbeInfo {
            name: name.into(),
            aliases: vec![alias.into()],
            module: "libc.so.6".into(),
            address: 0x1000,
            calls_word,
            metrics: crate::exits::Metrics::CALLS,
        };
        let probes = vec![
            probe("malloc", "__libc_malloc", 0),
            probe("__libc_malloc", "malloc", 1),
        ];
        let rows = vec![row(0, 10, layout::ROW_LIVE, vec![3, 4])];
        let r = Report::build(1, 5, &probes, &rows, 0, |_| None);
        assert_eq!(r.functions.len(), 1);
        assert_eq!(r.functions[0].name, "malloc");
        assert_eq!(r.functions[0].aliases, ["__libc_malloc"]);
        assert_eq!(r.functions[0].calls, 7);
        assert_eq!(r.threads[0].functions["malloc"].calls, 7);
        assert!(r.to_json().contains(r#""aliases":["__libc_malloc"]"#));
        assert!(r.to_table().contains("malloc (= __libc_malloc)"));
    }

    #[test]
    fn threads_without_calls_are_left_out_and_totals_add_up() {
        let probes = vec![
            ProbeInfo {
                name: "a".into(),
                aliases: Vec::new(),
                module: "exe".into(),
                address: 0x1000,
                calls_word: 0,
                metrics: crate::exits::Metrics::CALLS,
            },
            ProbeInfo {
                name: "b".into(),
                aliases: Vec::new(),
                module: "exe".into(),
                address: 0x2000,
                calls_word: 1,
                metrics: crate::exits::Metrics::CALLS,
            },
        ];
        let rows = vec![
            row(0, 10, layout::ROW_LIVE, vec![3, 0]),
            row(1, 11, layout::ROW_EXITED, vec![0, 0]),
            row(2, 12, layout::ROW_EXITED, vec![4, 5]),
        ];
        let r = Report::build(1, 5, &probes, &rows, 0, |_| Some("live".into()));
        assert_eq!(r.threads.len(), 2);
        assert_eq!(r.functions[0].calls, 7);
        assert_eq!(r.functions[1].calls, 5);
        assert_eq!(r.threads[0].name, "live");
        assert!(!r.threads[0].exited);
        assert!(r.threads[1].exited);
        assert_eq!(r.threads[1].name, "t2");
        assert!(!r.threads[0].functions.contains_key("b"));
        let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(json["threads"][1]["functions"]["b"]["calls"], 5);
        assert_eq!(json["functions"][0]["address"], "0x1000");
        let table = r.to_table();
        assert!(table.contains("t2 (exited)"), "{table}");
    }

    #[test]
    fn clashing_names_are_qualified() {
        let probes = vec![
            ProbeInfo {
                name: "f".into(),
                aliases: Vec::new(),
                module: "exe".into(),
                address: 1,
                calls_word: 0,
                metrics: crate::exits::Metrics::CALLS,
            },
            ProbeInfo {
                name: "f".into(),
                aliases: Vec::new(),
                module: "lib.so".into(),
                address: 2,
                calls_word: 1,
                metrics: crate::exits::Metrics::CALLS,
            },
        ];
        let r = Report::build(1, 0, &probes, &[], 0, |_| None);
        assert_eq!(r.functions[0].name, "exe:f");
        assert_eq!(r.functions[1].name, "lib.so:f");
    }

    /// A report of `n` timed functions (wall, CPU, histograms) with long
    /// names on `threads` threads, figures up to hours and billions of
    /// calls.
    fn big_report(n: usize, threads: u32) -> Report {
        let words = (weft_codegen::TIMER_HIST_METRIC_LEN / 8) as usize;
        let probes: Vec<ProbeInfo> = (0..n)
            .map(|i| ProbeInfo {
                name: match i % 3 {
                    0 => format!("f{i}"),
                    1 => format!(
                        "std::__detail::_Hashtable<std::basic_string<char>, std::pair<const \
                         std::basic_string<char>, int>>::_M_insert_unique_node{i}"
                    ),
                    _ => format!("very_long_c_function_name_that_goes_on_and_on_{i}"),
                },
                aliases: if i == 7 {
                    vec!["an_alias_of_f7".into()]
                } else {
                    Vec::new()
                },
                module: if i % 2 == 0 {
                    "libc.so.6".into()
                } else {
                    "libsomething-really-long-name.so.1.2.3".into()
                },
                address: 0x1000 + i as u64 * 16,
                calls_word: (i * words) as u32,
                metrics: crate::exits::Metrics::ALL.with_histogram(true),
            })
            .collect();
        let rows: Vec<RowSnapshot> = (0..threads)
            .map(|t| {
                let mut w = vec![0u64; n * words];
                for i in 0..n {
                    let at = |off: i32| i * words + timer_word(off);
                    let scale = (i as u64 + 1) * (u64::from(t) + 1);
                    w[at(weft_codegen::METRIC_ENTRIES)] = 1_234_567_890 * scale % 9_999_999_999;
                    w[at(weft_codegen::METRIC_WALL_TOTAL)] = 3_600_000_000_000 / scale;
                    w[at(weft_codegen::METRIC_SELF_TOTAL)] = 1_800_000_000_000 / scale;
                    w[at(weft_codegen::METRIC_CPU_TOTAL)] = 1_000_000_000_000 / scale;
                    w[at(weft_codegen::METRIC_HIST) + i % 30] = 17;
                }
                row(t, 100 + t, layout::ROW_LIVE, w)
            })
            .collect();
        Report::build(1, 5, &probes, &rows, 0, |tid| {
            Some(format!("worker-thread-with-a-long-name-{tid}"))
        })
    }

    fn widest(text: &str) -> usize {
        text.lines().map(|l| l.chars().count()).max().unwrap_or(0)
    }

    #[test]
    fn two_thousand_functions_fit_120_columns() {
        let r = big_report(2_000, 3);
        for options in [
            TableOptions::default(),
            TableOptions {
                top: Some(0),
                ..TableOptions::default()
            },
            TableOptions {
                by_thread: true,
                sort: Some(SortKey::SelfTime),
                top: Some(0),
                histograms: vec!["f3".into(), "nope".into()],
            },
        ] {
            let table = r.to_table_with(&options);
            let wide: Vec<&str> = table
                .lines()
                .filter(|l| l.chars().count() > TABLE_WIDTH)
                .collect();
            assert!(wide.is_empty(), "{options:?}: {wide:#?}");
            assert!(widest(&table) <= TABLE_WIDTH);
            // The long form: a header and one row per function shown.
            assert!(
                table.contains("FUNCTION") && table.contains("SELF/CALL"),
                "{table}"
            );
        }
        // Default: the first 50, and a line saying what was left out.
        let table = r.to_table();
        let rows = table
            .lines()
            .filter(|l| l.contains("libc.so.6") || l.contains('…') && l.contains("lib"))
            .count();
        assert!(rows >= 50, "{rows}\n{table}");
        assert!(
            table.contains("… 1950 more function(s) not shown"),
            "{table}"
        );
        assert!(table.contains("top 50 of 2000"), "{table}");
        // --top 0: every function, each once.
        let all = r.to_table_with(&TableOptions {
            top: Some(0),
            ..TableOptions::default()
        });
        assert!(!all.contains("more function(s) not shown"));
        let f_rows = all
            .lines()
            .filter(|l| l.starts_with('f') && (l.contains("libc.so.6") || l.contains("libsomethi")))
            .count();
        assert_eq!(f_rows, 667, "{all}");
        // Long names are cut in the middle, keeping both ends.
        assert!(all.contains("std::__detail:…e_node1 "), "{all}");
        assert!(all.contains(" libsomethi…1.2.3 "), "{all}");
        // The histograms asked for, and a word for the one without.
        let with = r.to_table_with(&TableOptions {
            histograms: vec!["f3".into()],
            top: Some(5),
            ..TableOptions::default()
        });
        assert!(
            with.contains("latency of f3: 51 call(s) (outermost, wall time, all threads)"),
            "{with}"
        );
        assert!(
            with.contains("[     8 ns,     16 ns)             51  ####"),
            "{with}"
        );
    }

    /// The long table's function rows as (name, header → cell), the
    /// cells cut at the headers' right edges (numbers are right-aligned).
    fn long_rows(table: &str) -> Vec<(String, BTreeMap<String, String>)> {
        let mut lines = table.lines().skip_while(|l| !l.starts_with("FUNCTION"));
        let header = lines.next().expect("a header");
        let mut edges = Vec::new();
        let mut at = 0;
        for name in header.split_whitespace() {
            let start = at + header[at..].find(name).unwrap();
            at = start + name.len();
            edges.push((name.to_string(), start, at));
        }
        lines
            .take_while(|l| !l.is_empty() && !l.starts_with('…') && !l.starts_with("threads"))
            .map(|l| {
                let chars: Vec<char> = l.chars().collect();
                let cut = |a: usize, b: usize| -> String {
                    chars[a.min(chars.len())..b.min(chars.len())]
                        .iter()
                        .collect::<String>()
                        .trim()
                        .to_string()
                };
                let mut cells = BTreeMap::new();
                for (i, (name, start, end)) in edges.iter().enumerate() {
                    let cell = match i {
                        // Left-aligned: to the next header's start.
                        0 | 1 => cut(*start, edges[i + 1].1),
                        // After the module: one word (digits and commas).
                        2 => cut(0, *end)
                            .rsplit(' ')
                            .next()
                            .unwrap_or_default()
                            .to_string(),
                        _ => cut(edges[i - 1].2, *end),
                    };
                    cells.insert(name.clone(), cell);
                }
                (cells["FUNCTION"].clone(), cells)
            })
            .collect()
    }

    #[test]
    fn mixed_user_and_kernel_rows_keep_their_columns_and_hide_uncalled_probes() {
        let user = FunctionReport {
            calls: 4,
            wall_ns: Some(8_000_000),
            self_ns: Some(2_000_000),
            cpu_ns: Some(6_000_000),
            threads: 1,
            ..FunctionReport::empty("handler".into(), "exe".into(), "0x1".into())
        };
        let kernel = |name: &str, calls, wall, cpu| FunctionReport {
            calls,
            wall_ns: Some(wall),
            cpu_ns: Some(cpu),
            threads: u32::from(calls > 0),
            mechanism: Some("raw_syscalls tracepoints"),
            ..FunctionReport::empty(format!("syscall:{name}"), "syscall".into(), "-".into())
        };
        let r = Report {
            pid: 1,
            duration_ns: 1,
            metrics: vec!["calls", "wall", "cpu"],
            clocks: None,
            functions: vec![
                user,
                kernel("read", 2, 3_000_000, 1_000_000),
                kernel("openat", 0, 0, 0),
                kernel("close", 0, 0, 0),
            ],
            threads: Vec::new(),
            overflow_threads: 0,
            runtime: None,
            kernel: None,
            trace: None,
            trace_log: None,
        };
        let table = r.to_table_with(&TableOptions {
            top: Some(0),
            ..TableOptions::default()
        });
        let rows = long_rows(&table);
        let names: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
        assert_eq!(names, ["handler", "syscall:read"], "{table}");
        let cell = |row: usize, column: &str| rows[row].1[column].as_str();
        assert_eq!(
            [
                "CALLS",
                "WALL",
                "SELF",
                "CPU",
                "WALL/CALL",
                "SELF/CALL",
                "THREADS"
            ]
            .map(|c| cell(1, c)),
            ["2", "3.00 ms", "-", "1.00 ms", "1.50 ms", "-", "1"],
            "{table}"
        );
        assert_eq!(
            ["CALLS", "WALL", "SELF", "CPU", "WALL/CALL", "SELF/CALL"].map(|c| cell(0, c)),
            ["4", "8.00 ms", "2.00 ms", "6.00 ms", "2.00 ms", "500.0 µs"],
            "{table}"
        );
        assert!(
            table.contains("… 2 kernel probe(s) with no calls not shown"),
            "{table}"
        );
        // The JSON report keeps them.
        assert!(r.to_json().contains("syscall:openat"));
    }

    #[test]
    fn long_table_sorts_and_reports_self_time_and_averages() {
        // entries, exits, unwound, unhooked, nesting, seq, wall, -, cpu, -, self
        let timed = |calls, wall, cpu, own| {
            let mut w = vec![0u64; (weft_codegen::TIMER_METRIC_LEN / 8) as usize];
            w[0] = calls;
            w[timer_word(weft_codegen::METRIC_WALL_TOTAL)] = wall;
            w[timer_word(weft_codegen::METRIC_CPU_TOTAL)] = cpu;
            w[timer_word(weft_codegen::METRIC_SELF_TOTAL)] = own;
            w
        };
        let names = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"];
        let figures = [
            (10, 5_000, 4_000, 1_000),
            (1_000, 3_000, 2_000, 3_000),
            (3, 9_000, 100, 9_000),
            (7, 1_000, 900, 500),
            (2, 0, 0, 0),
            (5, 2_000, 8_000, 2_000),
        ];
        let len = (weft_codegen::TIMER_METRIC_LEN / 8) as u32;
        let probes: Vec<ProbeInfo> = names
            .iter()
            .enumerate()
            .map(|(i, n)| ProbeInfo {
                name: (*n).into(),
                aliases: Vec::new(),
                module: "exe".into(),
                address: i as u64,
                calls_word: i as u32 * len,
                metrics: crate::exits::Metrics::ALL,
            })
            .collect();
        let words: Vec<u64> = figures
            .iter()
            .flat_map(|&(c, w, u, s)| timed(c, w, u, s))
            .collect();
        let r = Report::build(
            1,
            5,
            &probes,
            &[row(0, 10, layout::ROW_LIVE, words)],
            0,
            |_| None,
        );
        let order = |sort: Option<SortKey>| -> Vec<String> {
            let t = r.to_table_with(&TableOptions {
                sort,
                top: Some(3),
                ..TableOptions::default()
            });
            t.lines()
                .filter(|l| l.contains(" exe "))
                .take(3)
                .map(|l| l.split_whitespace().next().unwrap().to_string())
                .collect()
        };
        assert_eq!(order(None), ["gamma", "alpha", "beta"]);
        assert_eq!(order(Some(SortKey::Calls)), ["beta", "alpha", "delta"]);
        assert_eq!(order(Some(SortKey::Cpu)), ["zeta", "alpha", "beta"]);
        assert_eq!(order(Some(SortKey::SelfTime)), ["gamma", "beta", "zeta"]);
        assert_eq!(order(Some(SortKey::Name)), ["alpha", "beta", "delta"]);
        // Six functions: the long table by default, a line for the rest.
        let t = r.to_table_with(&TableOptions {
            top: Some(4),
            ..TableOptions::default()
        });
        assert!(
            t.contains("… 2 more function(s) not shown: 9 calls, 1.0 µs wall"),
            "{t}"
        );
        // Per-call averages: alpha 5 µs / 10 calls.
        let alpha = t.lines().find(|l| l.starts_with("alpha")).unwrap();
        let cells: Vec<&str> = alpha
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        assert_eq!(
            cells,
            ["alpha", "exe", "10", "5.0 µs", "1.0 µs", "4.0 µs", "500 ns", "100 ns", "1"],
            "{t}"
        );
        let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        let f = &json["functions"][0];
        assert_eq!(
            (f["self_ns"].as_u64(), f["wall_ns_per_call"].as_u64()),
            (Some(1_000), Some(500))
        );
        assert_eq!(
            (
                f["self_ns_per_call"].as_u64(),
                f["cpu_ns_per_call"].as_u64()
            ),
            (Some(100), Some(400))
        );
        assert_eq!(f["threads"], 1);
        assert!(f.get("histogram").is_none());
        assert_eq!(json["threads"][0]["functions"]["alpha"]["self_ns"], 1_000);
        // No histogram without one; the compact table for few functions.
        let few = Report::build(
            1,
            5,
            &probes[..2],
            &[row(
                0,
                10,
                layout::ROW_LIVE,
                timed(4, 8, 4, 2)
                    .into_iter()
                    .chain(timed(1, 1, 1, 1))
                    .collect(),
            )],
            0,
            |_| None,
        );
        let t = few.to_table();
        assert!(t.lines().nth(1).unwrap().starts_with("TID"), "{t}");
        assert!(t.contains("self"), "{t}");
    }

    #[test]
    fn histograms_serialise_their_non_empty_buckets() {
        let mut h = Histogram::empty();
        h.counts[0] = 1;
        h.counts[13] = 20;
        h.counts[weft_codegen::HIST_BUCKETS - 1] = 2;
        let json = serde_json::to_string(&h).unwrap();
        assert_eq!(
            json,
            r#"[{"from_ns":0,"to_ns":2,"count":1},{"from_ns":8192,"to_ns":16384,"count":20},{"from_ns":549755813888,"count":2}]"#
        );
        let mut out = String::new();
        histogram_text("f", &h, &mut out);
        assert_eq!(out.lines().count(), 1 + weft_codegen::HIST_BUCKETS);
        assert!(out.contains("23 call(s)"), "{out}");
        assert_eq!(ellipsize("abcdefghij", 7), "abcd…ij");
        assert_eq!(ellipsize("abc", 7), "abc");
    }

    #[test]
    fn digits_are_grouped() {
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1000), "1,000");
        assert_eq!(group_digits(1234567), "1,234,567");
    }
}
