//! Letting go of the threads' CPU clocks when the last session ends.
//!
//! A thread's CPU clock is a perf task-clock event (its page mapped in the
//! target), which the kernel switches out and in with the thread at every
//! context switch for as long as the event lives: 2.4 µs a switch measured
//! on a KVM guest. Left in place after weft detaches, it would slow every
//! switch-heavy thread of the program for the rest of its life. So the
//! stop that ends the last session asks the runtime to let the events go.
//! A later session that installs a CPU timer asks for them back (a system
//! call on every read would cost a timed call more than the event costs),
//! and so for the threads that registered before any CPU timer: each
//! thread makes its event at its next read, outside any stop.

use super::*;

use weft_rt::layout::{CPU_SOURCE_NONE, ROW_LIVE};

impl Process {
    /// Releases the perf events of the live threads' CPU clocks when no
    /// session has a probe in the process any more (this one's are out).
    /// Every thread is stopped. Best effort: a clock not released keeps
    /// working and costs what it cost.
    pub(super) fn release_cpu_clocks_if_last(&mut self, tracer: &mut Tracer) -> Result<u32, Error> {
        let Some(rt) = self.runtime.as_ref() else {
            return Ok(0);
        };
        if self.target.keep_cpu_clocks
            || self.probes.iter().any(|p| p.active)
            || !crate::ledger::live_entries(&rt.region).is_empty()
        {
            return Ok(0);
        }
        let with_event =
            |source: u32| source != CPU_SOURCE_NONE && source != 1 + weft_rt::clock::CPU_SYSCALL;
        let rows: Vec<(u32, u32)> = rt
            .region
            .snapshot(0)
            .into_iter()
            .filter(|r| r.state == ROW_LIVE && with_event(r.cpu_source.0))
            .map(|r| (r.index, r.tid))
            .collect();
        if rows.is_empty() {
            return Ok(0);
        }
        // Only pages the process has mapped as perf events, of threads it
        // has: in a forked child, the rows of the parent's other threads
        // hold pages the child does not have.
        let maps = crate::inspect::maps::read_maps(self.target.pid)?;
        let perf_pages: std::collections::HashSet<u64> = maps
            .iter()
            .filter(|m| matches!(&m.path, crate::inspect::maps::MappingPath::Pseudo(p) if p.ends_with("[perf_event]")))
            .map(|m| m.start)
            .collect();
        let threads: std::collections::HashSet<Tid> = tracer.threads().collect();
        let mut asked = 0;
        for (index, tid) in rows {
            let page = rt.region.clock_page(index);
            if page != 0 && perf_pages.contains(&page) && threads.contains(&(tid as Tid)) {
                rt.region
                    .ask_clock(index, weft_rt::clock::WHY_CPU_RELEASE_ASKED)
                    .map_err(|e| Error::Internal(format!("marking a CPU clock: {e}")))?;
                asked += 1;
            }
        }
        if asked == 0 {
            return Ok(0);
        }
        // Threads inside the runtime's code may be reading their clock:
        // let them leave it (best effort; the release is safe anyway, see
        // `ThreadCpuClock::release_event`).
        let rt_code = runtime_code(&maps, rt.base);
        self.try_to_get_outside(
            tracer,
            |pc| rt_code.iter().any(|r| r.contains(&pc)),
            "",
            5,
            false,
        )?;
        let release = runtime::export_address(rt.base, "weft_rt_release_cpu_clocks")?;
        let tid = self.syscall_thread(tracer)?;
        let released = tracer.call(
            tid,
            &RemoteCall::new("weft_rt_release_cpu_clocks", release, vec![]),
            // System calls only (mmap, close): no lock.
            false,
        )?;
        Ok(released as u32)
    }
}

impl Process {
    /// Asks the live threads whose CPU clock reads a system call for want
    /// of a perf event (registered before any CPU timer, or released) to
    /// make one at their next read: a CPU timer is being installed, and a
    /// system call on every read costs a timed call more than the event
    /// costs. A word written into each row, no stop needed: the owner makes
    /// its event itself (`ThreadCpuClock::arm_self`), only if it reads its
    /// clock. Returns how many were asked.
    pub(super) fn ask_for_cpu_events(&self) -> Result<u32, Error> {
        use weft_rt::clock::{CPU_SYSCALL, WHY_CPU_ARM_ASKED, WHY_CPU_RELEASED, WHY_CPU_UNASKED};
        let Some(rt) = self.runtime.as_ref() else {
            return Ok(0);
        };
        let mut asked = 0;
        for row in rt.region.snapshot(0) {
            let (source, why) = row.cpu_source;
            if row.state == ROW_LIVE
                && source == 1 + CPU_SYSCALL
                && (why == WHY_CPU_UNASKED || why == WHY_CPU_RELEASED)
            {
                rt.region
                    .ask_clock(row.index, WHY_CPU_ARM_ASKED)
                    .map_err(|e| Error::Internal(format!("asking for a CPU clock event: {e}")))?;
                asked += 1;
            }
        }
        Ok(asked)
    }
}

/// The executable mappings of the runtime loaded at `base`: those of the
/// file mapped there.
fn runtime_code(maps: &[crate::inspect::maps::Mapping], base: u64) -> Vec<std::ops::Range<u64>> {
    let Some(first) = maps.iter().find(|m| m.start == base) else {
        return Vec::new();
    };
    maps.iter()
        .filter(|m| m.perms.exec && m.inode == first.inode && m.dev == first.dev)
        .map(|m| m.start..m.end)
        .collect()
}
