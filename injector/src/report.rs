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
    /// Function name (qualified `module:name` only when two share a name).
    pub name: String,
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
        // A function instrumented several times in a session (probes
        // inserted and removed again, maybe under another of its names) is
        // one entry: its probes' figures add up.
        let mut entry_of = Vec::with_capacity(probes.len());
        let mut firsts: Vec<&ProbeInfo> = Vec::new();
        let mut aliases: Vec<Vec<String>> = Vec::new();
        // Entries by address: a libc-wide glob has thousands of functions.
        let mut at: std::collections::HashMap<(&str, u64), Vec<usize>> =
            std::collections::HashMap::new();
        for p in probes {
            let same = |q: &ProbeInfo| {
                q.name == p.name || q.aliases.contains(&p.name) || p.aliases.contains(&q.name)
            };
            let candidates = at.entry((p.module.as_str(), p.address)).or_default();
            let found = candidates.iter().copied().find(|&e| same(firsts[e]));
            let e = found.unwrap_or_else(|| {
                firsts.push(p);
                aliases.push(Vec::new());
                candidates.push(firsts.len() - 1);
                firsts.len() - 1
            });
            for name in std::iter::once(&p.name).chain(&p.aliases) {
                if *name != firsts[e].name && !aliases[e].contains(name) {
                    aliases[e].push(name.clone());
                }
            }
            entry_of.push(e);
        }
        let names = display_names(&firsts);
        let mut functions: Vec<FunctionReport> = firsts
            .iter()
            .zip(&names)
            .zip(aliases)
            .map(|((p, name), aliases)| FunctionReport {
                name: name.clone(),
                aliases,
                module: p.module.clone(),
                address: format!("{:#x}", p.address),
                calls: 0,
                wall_ns: None,
                cpu_ns: None,
            })
            .collect();
        for (p, &e) in probes.iter().zip(&entry_of) {
            let f = &mut functions[e];
            if p.metrics.wall {
                f.wall_ns.get_or_insert(0);
            }
            if p.metrics.cpu {
                f.cpu_ns.get_or_insert(0);
            }
        }
        let mut threads = Vec::new();
        for row in rows {
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
                let mut c = Counts {
                    calls,
                    ..Counts::default()
                };
                functions[i].calls += calls;
                if probe.metrics.hooks_exit() {
                    c.exits = Some(word(timer_word(weft_codegen::METRIC_EXITS)));
                    c.unwound = Some(word(timer_word(weft_codegen::METRIC_UNWOUND)));
                    c.unhooked = Some(word(timer_word(weft_codegen::METRIC_UNHOOKED)));
                }
                if probe.metrics.wall {
                    let w = word(timer_word(weft_codegen::METRIC_WALL_TOTAL));
                    c.wall_ns = Some(w);
                    *functions[i].wall_ns.get_or_insert(0) += w;
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
        }
    }

    /// The report as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a report always serialises")
    }

    /// The report as a table for people.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "weft: pid {}  {:.2} s  {} function(s)  {} thread(s)",
            self.pid,
            self.duration_ns as f64 / 1e9,
            self.functions.len(),
            self.threads.len()
        );
        let mut table: Vec<Vec<String>> = Vec::new();
        let mut header = vec!["TID".to_string(), "THREAD".to_string()];
        for f in &self.functions {
            header.push(if f.aliases.is_empty() {
                f.name.clone()
            } else {
                format!("{} (= {})", f.name, f.aliases.join(", "))
            });
            if f.wall_ns.is_some() {
                header.push("wall".into());
            }
            if f.cpu_ns.is_some() {
                header.push("cpu".into());
            }
        }
        table.push(header);
        for t in &self.threads {
            let mut row = vec![
                t.tid.to_string(),
                if t.exited {
                    format!("{} (exited)", t.name)
                } else {
                    t.name.clone()
                },
            ];
            for f in &self.functions {
                let c = t.functions.get(&f.name);
                row.push(c.map_or("-".to_string(), |c| group_digits(c.calls)));
                let time = |v: Option<u64>| v.map_or("-".to_string(), human_ns);
                if f.wall_ns.is_some() {
                    row.push(time(c.and_then(|c| c.wall_ns)));
                }
                if f.cpu_ns.is_some() {
                    row.push(time(c.and_then(|c| c.cpu_ns)));
                }
            }
            table.push(row);
        }
        let mut total = vec!["total".to_string(), String::new()];
        for f in &self.functions {
            total.push(group_digits(f.calls));
            total.extend(f.wall_ns.map(human_ns));
            total.extend(f.cpu_ns.map(human_ns));
        }
        table.push(total);
        render(&table, &mut out);
        if let Some(clocks) = &self.clocks {
            // Only the clocks of the metrics asked (`-m wall` has no CPU
            // clock to speak of).
            let mut line = "times: inclusive, outermost activation per thread".to_string();
            if let Some(wall) = &clocks.wall {
                let _ = write!(line, "; wall clock: {wall}");
            }
            if let Some(cpu) = &clocks.cpu {
                let _ = write!(line, "; cpu clock: {cpu}");
            }
            let _ = writeln!(out, "{line}");
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

/// Names as reported: plain, or `module:name` where two probes share one.
fn display_names(probes: &[&ProbeInfo]) -> Vec<String> {
    let mut uses: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for p in probes {
        *uses.entry(p.name.as_str()).or_default() += 1;
    }
    probes
        .iter()
        .map(|p| {
            let clash = uses[p.name.as_str()] > 1;
            if clash {
                format!("{}:{}", p.module, p.name)
            } else {
                p.name.clone()
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

fn render(table: &[Vec<String>], out: &mut String) {
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
            // Numbers right-aligned, the first two (tid, name) left-aligned.
            if c < 2 {
                let _ = write!(line, "{cell:<w$}  ", w = widths[c]);
            } else {
                let _ = write!(line, "{cell:>w$}  ", w = widths[c]);
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
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

    #[test]
    fn digits_are_grouped() {
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1000), "1,000");
        assert_eq!(group_digits(1234567), "1,234,567");
    }
}
