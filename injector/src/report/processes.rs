//! Several processes measured in one session (`weft attach -p A,B`,
//! `--pid-of NAME`): each process's own report, and the totals of each
//! function over all of them, as the user of a service reads it (every
//! worker of a server).

use super::text::render;
use super::{group_digits, human_ns, Report, TableOptions};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One process's part of a [`ProcessesReport`].
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ProcessReport {
    /// The process's command (`/proc/PID/comm` when weft attached).
    pub command: String,
    /// The process had exited when its report was taken (its figures are
    /// those read when it exited).
    pub exited: bool,
    /// Its report, as for one process.
    #[serde(flatten)]
    pub report: Report,
}

/// A function's figures summed over every process that has it (by module
/// file name and function name: each process maps the module at its own
/// address).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct FunctionTotal {
    /// The function's name, as in each process's report.
    pub name: String,
    /// File name of the module that holds it.
    pub module: String,
    /// Calls over every process.
    pub calls: u64,
    /// Wall time over every process, ns; when measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wall_ns: Option<u64>,
    /// CPU time over every process, ns; when measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_ns: Option<u64>,
    /// Self wall time over every process, ns; when measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub self_ns: Option<u64>,
    /// Processes whose report lists it.
    pub processes: u32,
    /// Threads that called it, over every process.
    pub threads: u32,
}

/// Reports of several processes measured together, and their totals.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ProcessesReport {
    /// The longest time instrumentation was live in any of them, ns.
    pub duration_ns: u64,
    /// Each process's report, in the order they were given.
    pub processes: Vec<ProcessReport>,
    /// Each function over every process, busiest first (wall time, else
    /// CPU time, else calls).
    pub totals: Vec<FunctionTotal>,
}

impl ProcessesReport {
    /// The reports `processes` and their totals.
    pub fn new(processes: Vec<ProcessReport>) -> ProcessesReport {
        let mut totals: BTreeMap<(String, String), FunctionTotal> = BTreeMap::new();
        for p in &processes {
            for f in &p.report.functions {
                let t = totals
                    .entry((f.module.clone(), f.name.clone()))
                    .or_insert_with(|| FunctionTotal {
                        name: f.name.clone(),
                        module: f.module.clone(),
                        calls: 0,
                        wall_ns: None,
                        cpu_ns: None,
                        self_ns: None,
                        processes: 0,
                        threads: 0,
                    });
                let add = |sum: &mut Option<u64>, v: Option<u64>| {
                    if let Some(v) = v {
                        *sum = Some(sum.unwrap_or(0).saturating_add(v));
                    }
                };
                t.calls = t.calls.saturating_add(f.calls);
                add(&mut t.wall_ns, f.wall_ns);
                add(&mut t.cpu_ns, f.cpu_ns);
                add(&mut t.self_ns, f.self_ns);
                t.processes += 1;
                t.threads += f.threads;
            }
        }
        let mut totals: Vec<FunctionTotal> = totals.into_values().collect();
        totals.sort_by(|a, b| {
            (b.wall_ns, b.cpu_ns, b.calls)
                .cmp(&(a.wall_ns, a.cpu_ns, a.calls))
                .then_with(|| a.name.cmp(&b.name))
        });
        ProcessesReport {
            duration_ns: processes
                .iter()
                .map(|p| p.report.duration_ns)
                .max()
                .unwrap_or(0),
            processes,
            totals,
        }
    }

    /// As JSON (docs/report-format.md, "Several processes").
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a report always serialises")
    }

    /// As tables: each process's, then the totals.
    pub fn to_table_with(&self, options: &TableOptions) -> String {
        let mut out = String::new();
        for p in &self.processes {
            let _ = writeln!(
                out,
                "== pid {} ({}){}",
                p.report.pid,
                p.command,
                if p.exited { ", exited" } else { "" }
            );
            out.push_str(&p.report.to_table_with(options));
            out.push('\n');
        }
        let _ = writeln!(
            out,
            "== total over {} processes  {:.2} s",
            self.processes.len(),
            self.duration_ns as f64 / 1e9
        );
        let time = |v: Option<u64>| v.map_or("-".to_string(), human_ns);
        let mut table = vec![vec![
            "FUNCTION".to_string(),
            "MODULE".to_string(),
            "calls".to_string(),
            "wall".to_string(),
            "cpu".to_string(),
            "processes".to_string(),
            "threads".to_string(),
        ]];
        for t in &self.totals {
            table.push(vec![
                t.name.clone(),
                t.module.clone(),
                group_digits(t.calls),
                time(t.wall_ns),
                time(t.cpu_ns),
                t.processes.to_string(),
                t.threads.to_string(),
            ]);
        }
        render(&table, 2, &mut out);
        out
    }
}
