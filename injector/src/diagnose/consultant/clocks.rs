//! The threads' CPU clocks through a search: each one chosen by what it
//! costs there (a perf event, a system call at each reading, or paused
//! and its values sampled), as the costs (`super::super::cost`) advise.

use super::*;

impl Consultant {
    /// Asks the threads' clocks for what the last interval's costs call
    /// for, and tells the costs what they are now (best effort: a clock
    /// not changed still reads right).
    pub(super) fn change_clocks(&mut self, process: &Process) {
        use crate::CpuClock;
        let clocks = process.cpu_clocks();
        let now = clocks.iter().filter_map(|&(tid, c)| {
            let event = match c {
                CpuClock::Event | CpuClock::Table => true,
                CpuClock::SystemCall | CpuClock::Paused => false,
                // As asked, told below when it was.
                CpuClock::Asked => return None,
            };
            Some((tid as u32, event))
        });
        self.cost.clocks_now(now.collect::<Vec<_>>());
        let mut paused: BTreeSet<u32> = clocks
            .iter()
            .filter(|c| c.1 == CpuClock::Paused)
            .map(|c| c.0 as u32)
            .collect();
        let asked: Vec<(u32, bool)> = self
            .cost
            .advice()
            .iter()
            .copied()
            .filter(|&(tid, event)| {
                process
                    .set_cpu_clock(tid as crate::Tid, event)
                    .unwrap_or(false)
            })
            .collect();
        self.cost.clocks_now(asked);
        // A clock with an event was asked to let it go above: paused at a
        // later interval, once it has (pausing refuses it before).
        let changed: Vec<u32> = self
            .cost
            .pause_advice()
            .iter()
            .filter(|&&(tid, pause)| {
                process
                    .pause_cpu_clock(tid as crate::Tid, pause)
                    .unwrap_or(false)
            })
            .map(|&(tid, pause)| {
                if pause {
                    paused.insert(tid);
                } else {
                    paused.remove(&tid);
                }
                tid
            })
            .collect();
        self.watch_paused(process, &paused);
        self.paused_ever.extend(paused.iter().copied());
        self.cost.paused_now(paused);
        // The tests on a thread whose clock changed measure afresh: their
        // values came from its timers and now come from the samples, or
        // the other way.
        for tid in changed {
            let on_thread: Vec<NodeId> = self
                .baselines
                .keys()
                .copied()
                .filter(|&id| self.search.node(id).focus.threads.first() == Some(&tid))
                .collect();
            for id in on_thread {
                self.baselines.remove(&id);
            }
        }
    }

    /// Tells the wait sampler which threads' clocks are paused (their
    /// rows) and which probes' functions to look inside of on them.
    fn watch_paused(&mut self, process: &Process, paused: &BTreeSet<u32>) {
        let region = process.region().filter(|_| !paused.is_empty());
        let threads: HashMap<u32, u32> = region.map_or_else(HashMap::new, |region| {
            region
                .snapshot(0)
                .into_iter()
                .filter(|r| r.state == weft_rt::layout::ROW_LIVE && paused.contains(&r.tid))
                .map(|r| (r.tid, r.index))
                .collect()
        });
        let probes: Vec<(ProbeId, usize)> = process
            .probes()
            .iter()
            .filter(|p| p.active && (p.metrics().wall || p.metrics().cpu))
            .filter_map(|p| {
                let first = p.words()?.first;
                let base = weft_rt::layout::Geometry::metric_offset(first) as usize;
                Some((p.id, base + weft_rt::layout::metric::NESTING))
            })
            .collect();
        self.waits.watch(|w| {
            if w.region.is_none() {
                w.region = region.and_then(|r| r.reopen(process.pid()).ok());
            }
            w.threads = threads;
            w.probes = probes;
        });
    }
}
