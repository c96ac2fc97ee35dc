//! Building a report: from the runtime's rows, the probes and the kernel's
//! counts to functions and threads.

use super::*;

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
        let Entries {
            entry_of,
            firsts,
            aliases,
            shown,
            clones,
        } = Entries::of(probes);
        let names = display_names(&firsts, &shown);
        let mut functions = empty_functions(probes, &entry_of, &firsts, &names, aliases, clones);
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
                let hooks_exit = probe.metrics.hooks_exit() || hooked.contains(&probe.calls_word);
                let c = probe_counts(probe.metrics, hooks_exit, calls, word, &mut functions[i]);
                add_counts(counts.entry(names[i].clone()).or_default(), &c);
            }

            if counts.is_empty() {
                continue;
            }
            threads.push(thread_report(row, counts, &live_name));
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
}

/// Index, relative to a probe's first word, of the word at byte offset
/// `offset` from its metric base.
pub(super) fn timer_word(offset: i32) -> usize {
    (offset / 8) as usize
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

/// The probes grouped into report entries: a function instrumented
/// several times in a session (probes inserted and removed again, maybe
/// under another of its names) is one entry, its probes' figures add up;
/// so are a function's compiler clones.
struct Entries<'p> {
    /// The entry of each probe.
    entry_of: Vec<usize>,
    /// Each entry's first probe.
    firsts: Vec<&'p ProbeInfo>,
    aliases: Vec<Vec<String>>,
    /// Names as people write them, per entry.
    shown: Vec<String>,
    /// The linkage names of the clones an entry sums.
    clones: Vec<Vec<String>>,
}

impl<'p> Entries<'p> {
    fn of(probes: &'p [ProbeInfo]) -> Entries<'p> {
        let mut entry_of = Vec::with_capacity(probes.len());
        let mut firsts: Vec<&ProbeInfo> = Vec::new();
        let mut aliases: Vec<Vec<String>> = Vec::new();
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
        Entries {
            entry_of,
            firsts,
            aliases,
            shown,
            clones,
        }
    }
}

/// The report's functions, one per entry, with no call counted yet: the
/// figures their probes keep are there (zero), the others absent.
fn empty_functions(
    probes: &[ProbeInfo],
    entry_of: &[usize],
    firsts: &[&ProbeInfo],
    names: &[String],
    aliases: Vec<Vec<String>>,
    clones: Vec<Vec<String>>,
) -> Vec<FunctionReport> {
    let mut functions: Vec<FunctionReport> = firsts
        .iter()
        .zip(names)
        .zip(aliases.into_iter().zip(clones))
        .map(|((p, name), (aliases, clones))| FunctionReport {
            mangled: Some(p.name.clone()),
            clones,
            aliases,
            ..FunctionReport::empty(name.clone(), p.module.clone(), format!("{:#x}", p.address))
        })
        .collect();
    for (p, &e) in probes.iter().zip(entry_of) {
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
    functions
}

/// One probe's figures in one thread (its row's words, read by `word`,
/// `calls` the first), added to its entry's totals `f` as they are read.
/// `hooks_exit`: its exits are counted.
fn probe_counts(
    metrics: crate::exits::Metrics,
    hooks_exit: bool,
    calls: u64,
    word: impl Fn(usize) -> u64,
    f: &mut FunctionReport,
) -> Counts {
    let mut c = Counts {
        calls,
        ..Counts::default()
    };
    f.calls += calls;
    if hooks_exit {
        c.exits = Some(word(timer_word(weft_codegen::METRIC_EXITS)));
        c.unwound = Some(word(timer_word(weft_codegen::METRIC_UNWOUND)));
        c.unhooked = Some(word(timer_word(weft_codegen::METRIC_UNHOOKED)));
    }
    if metrics.wall {
        let w = word(timer_word(weft_codegen::METRIC_WALL_TOTAL));
        c.wall_ns = Some(w);
        *f.wall_ns.get_or_insert(0) += w;
        let own = word(timer_word(weft_codegen::METRIC_SELF_TOTAL));
        c.self_ns = Some(own);
        *f.self_ns.get_or_insert(0) += own;
    }
    if metrics.keeps_histogram() {
        let first = timer_word(weft_codegen::METRIC_HIST);
        let h = Histogram {
            counts: (0..weft_codegen::HIST_BUCKETS)
                .map(|b| word(first + b))
                .collect(),
        };
        f.histogram.get_or_insert_with(Histogram::empty).add(&h);
        c.histogram = Some(h);
    }
    if metrics.cpu {
        let w = word(timer_word(weft_codegen::METRIC_CPU_TOTAL));
        c.cpu_ns = Some(w);
        *f.cpu_ns.get_or_insert(0) += w;
    }
    c
}

/// Adds `c` to `merged` (a thread's figures of one reported name, which
/// several probes may share); a figure absent from both stays absent.
fn add_counts(merged: &mut Counts, c: &Counts) {
    let add = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    };
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

/// A thread's report from its row and `counts`; a live thread is named
/// by `live_name` when it can be, the runtime's overflow row is
/// `(overflow)`.
fn thread_report(
    row: &RowSnapshot,
    counts: BTreeMap<String, Counts>,
    live_name: impl Fn(u32) -> Option<String>,
) -> ThreadReport {
    let exited = row.state != layout::ROW_LIVE;
    let overflow = row.state == layout::ROW_OVERFLOW;
    let name = if overflow {
        "(overflow)".to_string()
    } else if exited {
        row.name.clone()
    } else {
        live_name(row.tid).unwrap_or_else(|| row.name.clone())
    };
    ThreadReport {
        tid: if overflow { 0 } else { row.tid },
        name,
        exited: exited && !overflow,
        functions: counts,
    }
}
