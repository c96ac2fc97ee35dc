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
    /// Each thread's CPU time when last seen, ns: a thread that exited
    /// keeps what it ran (its schedstat is gone with it, and the target's
    /// CPU summed over live threads alone shrank to nothing when a
    /// script's workers ended: an "overhead" of 195,000%).
    threads: ThreadCpu,
    /// The target's CPU time at the start and at the last reading, ns.
    cpu_start: u64,
    cpu_last: u64,
    /// Instrumentation cost, ns: in all, and over the last interval.
    spent_ns: f64,
    recent: f64,
}

impl Cost {
    pub(super) fn new(pid: i32) -> Cost {
        let mut threads = ThreadCpu::default();
        let cpu = threads.read(pid);
        Cost {
            pid,
            per_call_ns: crate::Metrics::ALL.call_cost_ns(),
            calls: HashMap::new(),
            rates: HashMap::new(),
            threads,
            cpu_start: cpu,
            cpu_last: cpu,
            spent_ns: 0.0,
            recent: 0.0,
        }
    }

    /// Takes the probes' call counts now.
    pub(super) fn observe(&mut self, calls: &HashMap<ProbeId, u64>) {
        let cpu = self.threads.read(self.pid);
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

/// A process's CPU time over its threads' lives, exited threads included.
#[derive(Debug, Default)]
struct ThreadCpu {
    /// Each thread's CPU time when last seen, ns.
    last: HashMap<u32, u64>,
    /// What threads whose IDs were reused had run, ns.
    reused: u64,
}

impl ThreadCpu {
    /// The target's CPU time so far, ns: its live threads' schedstat, and
    /// the last reading of each that exited.
    fn read(&mut self, pid: i32) -> u64 {
        for tid in thread_ids(pid) {
            let cpu = schedstat(pid, tid).1;
            // 0: the file vanished between the listing and the read (the
            // thread exited) and its last reading stands.
            if cpu == 0 {
                continue;
            }
            let seen = self.last.entry(tid).or_insert(0);
            if cpu < *seen {
                // Another thread with the same ID: the first one's time
                // stays counted.
                self.reused += *seen;
            }
            *seen = cpu;
        }
        self.reused + self.last.values().sum::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread that ran and exited still counts in the process's CPU
    /// time (its schedstat file is gone with it).
    #[test]
    fn an_exited_threads_cpu_time_stays_counted() {
        let pid = std::process::id() as i32;
        let mut cpu = ThreadCpu::default();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (ran_tx, ran) = std::sync::mpsc::channel::<()>();
        let worker = std::thread::spawn(move || {
            // 50 ms on the CPU, however long a loaded machine takes to
            // give them.
            let own = || {
                std::fs::read_to_string("/proc/thread-self/schedstat")
                    .ok()
                    .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                    .unwrap_or(u64::MAX)
            };
            let mut x = 0u64;
            while own() < 50_000_000 {
                for _ in 0..10_000 {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
            }
            ran_tx.send(()).ok();
            rx.recv().ok();
            x
        });
        ran.recv().expect("the worker ran");
        let with_worker = cpu.read(pid);
        tx.send(()).expect("the worker waits");
        worker.join().expect("the worker ends");
        let after = cpu.read(pid);
        assert!(
            with_worker >= 40_000_000,
            "{with_worker} ns with the worker"
        );
        assert!(
            after >= with_worker,
            "{after} ns after it exited, {with_worker} before"
        );
    }
}
