//! What the instrumentation costs the target, as it goes: the calls the
//! probes count, times the measured cost of one timed call, against the
//! target's CPU time over the same span.

use crate::inspect::procfs::{schedstat, thread_ids};
use crate::ProbeId;
use std::collections::HashMap;

/// The least target CPU time a cost share is computed over, ns.
const MIN_CPU_SPAN_NS: u64 = 10_000_000;

/// What the instrumentation costs the target: calls counted by the
/// probes, times the measured cost of one timed call, against the
/// target's CPU time over the same span.
#[derive(Debug)]
pub(super) struct Cost {
    pid: i32,
    pub(super) per_call_ns: f64,
    /// Calls of each probe at the last reading.
    calls: HashMap<ProbeId, u64>,
    /// Calls of each probe per second of the target's CPU, last interval.
    rates: HashMap<ProbeId, f64>,
    /// The target's CPU time at the start and at the last reading, ns.
    cpu_start: u64,
    cpu_last: u64,
    /// Instrumentation cost, ns: in all, and over the last interval.
    spent_ns: f64,
    recent: f64,
}

impl Cost {
    pub(super) fn new(pid: i32) -> Cost {
        let cpu = process_cpu_ns(pid);
        Cost {
            pid,
            per_call_ns: crate::Metrics::ALL.call_cost_ns(),
            calls: HashMap::new(),
            rates: HashMap::new(),
            cpu_start: cpu,
            cpu_last: cpu,
            spent_ns: 0.0,
            recent: 0.0,
        }
    }

    /// Takes the probes' call counts now.
    pub(super) fn observe(&mut self, calls: &HashMap<ProbeId, u64>) {
        let cpu = process_cpu_ns(self.pid);
        // The kernel brings a running thread's total up to date only at
        // its ticks: a share over less than a few ms of CPU is noise.
        let cpu_delta = cpu.saturating_sub(self.cpu_last).max(MIN_CPU_SPAN_NS) as f64;
        let mut spent = 0.0;
        self.rates.clear();
        for (&id, &n) in calls {
            // A probe seen for the first time counted from zero: its words
            // were fresh (the sampler subtracts what a shared one had).
            let before = self.calls.insert(id, n).unwrap_or(0);
            let cost = n.saturating_sub(before) as f64 * self.per_call_ns;
            spent += cost;
            self.rates.insert(id, cost / cpu_delta);
        }
        self.spent_ns += spent;
        self.recent = spent / cpu_delta;
        self.cpu_last = cpu;
    }

    /// The share of the target's CPU probe `id` cost over the last
    /// interval, once measured.
    pub(super) fn probe_share(&self, id: ProbeId) -> Option<f64> {
        self.rates.get(&id).copied()
    }

    pub(super) fn recent_share(&self) -> f64 {
        self.recent
    }

    pub(super) fn total_share(&self) -> f64 {
        let cpu = self.cpu_last.saturating_sub(self.cpu_start);
        if cpu == 0 {
            0.0
        } else {
            self.spent_ns / cpu as f64
        }
    }
}

/// The target's CPU time so far, ns: the sum of its threads' schedstat.
fn process_cpu_ns(pid: i32) -> u64 {
    thread_ids(pid)
        .into_iter()
        .map(|tid| schedstat(pid, tid).1)
        .sum()
}
