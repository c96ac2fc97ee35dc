//! The threads' CPU clocks: fed from a CPU-time table where the kernel
//! permits, and let go when the last session ends.
//!
//! A CPU timer needs each thread to notice its context switches. Where
//! weft may load BPF, a `sched_switch` program writes a table the target
//! maps (`kernel::CpuTableFeed`, `weft_rt::clock::weft_rt_map_cpu_table`):
//! a few dozen nanoseconds at a switch of the target's, nothing for the
//! thread to do but read. Elsewhere each thread has a perf event:
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

use crate::ptrace::RemoteArg;
use weft_rt::layout::{CPU_SOURCE_NONE, ROW_LIVE};

/// What a thread's CPU clock reads, as [`Process::cpu_clocks`] finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuClock {
    /// A perf event of its own: no system call to read, a cost to the
    /// thread at every context switch (2.4 µs measured on a KVM guest).
    Event,
    /// A slot of the CPU-time table (`WEFT_CPU_CLOCK=table`).
    Table,
    /// A system call at every reading (about 0.5 µs on a KVM guest), no
    /// cost at a switch: never given an event, or let go of it.
    SystemCall,
    /// Asked for an event, or to let its event go: its thread acts on it at
    /// its next reading.
    Asked,
    /// Paused ([`Process::pause_cpu_clock`]): the thread's timers read no
    /// CPU time, and its clock costs nothing.
    Paused,
}

impl CpuClock {
    /// The clock of a row whose snapshot says `(1 + mode, why)`; None for a
    /// row whose thread has no clock yet.
    fn of(source: (u32, i32)) -> Option<CpuClock> {
        use weft_rt::clock::{
            CPU_SYSCALL, WHY_CPU_ARM_ASKED, WHY_CPU_DROP_ASKED, WHY_CPU_ON_TABLE,
            WHY_CPU_RELEASE_ASKED,
        };
        let (source, why) = source;
        if source == CPU_SOURCE_NONE {
            return None;
        }
        Some(match why {
            weft_rt::clock::WHY_CPU_PAUSED => CpuClock::Paused,
            WHY_CPU_ARM_ASKED | WHY_CPU_DROP_ASKED | WHY_CPU_RELEASE_ASKED => CpuClock::Asked,
            _ if source == 1 + CPU_SYSCALL => CpuClock::SystemCall,
            WHY_CPU_ON_TABLE => CpuClock::Table,
            _ => CpuClock::Event,
        })
    }
}

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
        // (row, thread, on the CPU-time table), in one read of the rows.
        let rows: Vec<(u32, u32, bool)> = rt
            .region
            .snapshot(0)
            .into_iter()
            .filter(|r| r.state == ROW_LIVE && with_event(r.cpu_source.0))
            .map(|r| {
                (
                    r.index,
                    r.tid,
                    r.cpu_source.1 == weft_rt::clock::WHY_CPU_ON_TABLE,
                )
            })
            .collect();
        // A table in the target goes even when no clock is on it.
        let feeding = matches!(self.cpu_table, Some(CpuTable::Feeding { .. }));
        if rows.is_empty() && !feeding {
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
        // Clocks on the CPU-time table are all let go by the call (and the
        // table with them); perf events only where asked.
        let on_table = rows.iter().filter(|r| r.2).count();
        let mut asked = 0;
        for (index, tid, _) in rows {
            let page = rt.region.clock_page(index);
            if page != 0 && perf_pages.contains(&page) && threads.contains(&(tid as Tid)) {
                rt.region
                    .ask_clock(index, weft_rt::clock::WHY_CPU_RELEASE_ASKED)
                    .map_err(|e| Error::Internal(format!("marking a CPU clock: {e}")))?;
                asked += 1;
            }
        }
        if asked == 0 && on_table == 0 && !feeding {
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
        // No clock reads the table any more: the program can go.
        self.cpu_table = None;
        Ok(released as u32)
    }

    /// Makes the CPU-time table, loads its program and attaches it, ahead
    /// of the stop of the world that installs the first CPU timer, which
    /// then only maps the table into the target: the verifier takes
    /// milliseconds, and attaching to a tracepoint 15 ms on this guest
    /// (the kernel patches its code on every CPU). Touches nothing of the
    /// target's: the program finds no slot of its threads until then.
    /// Where BPF is not permitted, the reason is kept and CPU timers use
    /// perf events.
    pub fn prepare_cpu_clocks(&mut self) {
        if self.cpu_table.is_some() {
            return;
        }
        if perf_chosen() {
            self.cpu_table = Some(CpuTable::Refused(PERF_CHOSEN.to_string()));
            return;
        }
        let made = crate::kernel::CpuTableFeed::new(self.target.pid as u32).and_then(|mut feed| {
            feed.attach()?;
            Ok(feed)
        });
        self.cpu_table = Some(match made {
            Ok(feed) => CpuTable::Made(feed),
            Err(e) => CpuTable::Refused(e.to_string()),
        });
    }

    /// Makes sure the threads' CPU clocks can use a CPU-time table fed by
    /// this weft's own `sched_switch` program: a new one (made here unless
    /// [`Process::prepare_cpu_clocks`] made it), mapped into the target,
    /// or the one another session made (its program may go with that
    /// session). Where BPF is not permitted, or the target cannot take the
    /// table, or a remote call fails, the clocks keep using perf events
    /// and the reason is kept ([`Process::cpu_table_refused`]): called at
    /// the end of an insertion, in its stop, it cannot fail it. Once per
    /// session. Only with `WEFT_CPU_CLOCK=table` in weft's environment
    /// (perf events otherwise, see [`perf_chosen`]).
    pub(super) fn ensure_cpu_table(&mut self, tracer: &mut Tracer) {
        let made = match self.cpu_table.take() {
            Some(CpuTable::Made(feed)) => Some(feed),
            None if perf_chosen() => {
                self.cpu_table = Some(CpuTable::Refused(PERF_CHOSEN.to_string()));
                return;
            }
            None => None,
            settled => {
                self.cpu_table = settled;
                return;
            }
        };
        let table = self.take_cpu_table(tracer, made).and_then(|mut feed| {
            feed.attach().map_err(|e| e.to_string())?;
            Ok(feed)
        });
        self.cpu_table = Some(match table {
            Ok(feed) => CpuTable::Feeding { _feed: feed },
            Err(why) => CpuTable::Refused(why),
        });
    }

    /// [`Process::ensure_cpu_table`]'s work: the table in the target and a
    /// program of this weft's for it, or why not.
    fn take_cpu_table(
        &mut self,
        tracer: &mut Tracer,
        made: Option<crate::kernel::CpuTableFeed>,
    ) -> Result<crate::kernel::CpuTableFeed, String> {
        let base = self.rt().map_err(|e| e.to_string())?.base;
        let (Ok(fd_fn), Ok(map_fn)) = (
            runtime::export_address(base, "weft_rt_cpu_table_fd"),
            runtime::export_address(base, "weft_rt_map_cpu_table"),
        ) else {
            return Err("the loaded runtime predates the CPU-time table".to_string());
        };
        let pid = self.target.pid;
        let tid = self.syscall_thread(tracer).map_err(|e| e.to_string())?;
        // System calls only: no lock.
        let call = RemoteCall::new("weft_rt_cpu_table_fd", fd_fn, vec![]);
        let theirs = tracer.call(tid, &call, false).map_err(|e| e.to_string())? as i64;
        if theirs >= 0 {
            let fd = take_descriptor(pid, theirs as i32)
                .map_err(|e| format!("taking the table's descriptor from the target: {e}"))?;
            return crate::kernel::CpuTableFeed::joining(pid as u32, fd).map_err(|e| e.to_string());
        }
        let feed = match made {
            Some(feed) => feed,
            None => crate::kernel::CpuTableFeed::new(pid as u32).map_err(|e| e.to_string())?,
        };
        map_into(tracer, tid, map_fn, pid, &feed)?;
        Ok(feed)
    }

    /// Whether the threads' CPU clocks read a CPU-time table this weft
    /// feeds (once a CPU timer was installed).
    pub fn cpu_clocks_on_table(&self) -> bool {
        matches!(self.cpu_table, Some(CpuTable::Feeding { .. }))
    }

    /// Why the threads' CPU clocks use perf events rather than a CPU-time
    /// table fed by a BPF program, once a CPU timer was installed (or
    /// [`Process::prepare_cpu_clocks`] tried); `None` while they use the
    /// table (or before).
    pub fn cpu_table_refused(&self) -> Option<&str> {
        match &self.cpu_table {
            Some(CpuTable::Refused(why)) => Some(why),
            _ => None,
        }
    }
}

/// Where a process's CPU-time table stands.
#[derive(Debug)]
pub(super) enum CpuTable {
    /// Made and its program attached, not yet in the target.
    Made(crate::kernel::CpuTableFeed),
    /// Mapped in the target, the program attached (held: it detaches
    /// when dropped).
    Feeding { _feed: crate::kernel::CpuTableFeed },
    /// Not to be had: why (the clocks use perf events).
    Refused(String),
}

/// Why the clocks use perf events when [`perf_chosen`].
const PERF_CHOSEN: &str = "perf events unless WEFT_CPU_CLOCK=table";

/// Perf events, no table, unless `WEFT_CPU_CLOCK=table` in weft's
/// environment. The table is not the default while its readings can part
/// from the kernel's: two fresh-clone CI runs read an idle event loop's
/// `epoll_wait` as 100 % CPU in a diagnosis, and one read a thread's CPU
/// time 7.5 % under its own clock (docs/exits-and-timers.md).
fn perf_chosen() -> bool {
    std::env::var_os("WEFT_CPU_CLOCK").map_or(true, |v| v != "table")
}

/// Has the target map `feed`'s table (`weft_rt_map_cpu_table`, which
/// takes the descriptor from weft with `pidfd_getfd`), or says why not.
fn map_into(
    tracer: &mut Tracer,
    tid: Tid,
    map_fn: u64,
    pid: i32,
    feed: &crate::kernel::CpuTableFeed,
) -> Result<(), String> {
    // Yama's ptrace scope 1 lets the target take weft's descriptor only
    // if weft names it, for the length of the call.
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_PTRACER, pid as libc::c_ulong, 0, 0, 0) };
    let args = vec![
        RemoteArg::Value(u64::from(std::process::id())),
        RemoteArg::Value(feed.map_fd() as u64),
    ];
    let at = tracer.call(
        tid,
        &RemoteCall::new("weft_rt_map_cpu_table", map_fn, args),
        false,
    );
    // SAFETY: as above; 0 takes the exception back.
    unsafe { libc::prctl(libc::PR_SET_PTRACER, 0, 0, 0, 0) };
    match at.map_err(|e| e.to_string())? as i64 {
        at if at < 0 => Err(format!(
            "the target could not map the table: {}",
            std::io::Error::from_raw_os_error((-at) as i32)
        )),
        _ => Ok(()),
    }
}

/// A copy of descriptor `fd` of process `pid` (`pidfd_getfd`: weft may,
/// it traces the process).
fn take_descriptor(pid: i32, fd: i32) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: plain system calls; the descriptors returned are ours.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid, 0);
        if pidfd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let pidfd = std::os::fd::OwnedFd::from_raw_fd(pidfd as i32);
        let got = libc::syscall(
            libc::SYS_pidfd_getfd,
            std::os::fd::AsRawFd::as_raw_fd(&pidfd),
            fd,
            0,
        );
        if got < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(std::os::fd::OwnedFd::from_raw_fd(got as i32))
    }
}

impl Process {
    /// Lets the caller choose each thread's CPU clock
    /// ([`Process::set_cpu_clock`]): installing a CPU timer no longer asks
    /// every thread without an event for one (a thread the caller let go
    /// of its event keeps reading the system call). Threads that register
    /// under a CPU timer still make one: what an event costs a thread is
    /// bounded by its switches, while a system call at every reading
    /// costs by its calls (a leaf called ten million times a second).
    /// For a tool that knows what each costs where (the diagnosis: an
    /// event costs a thread at every switch, a system call at every
    /// reading; CPython's workers at a lock switch tens of thousands of
    /// times a second, memcached's at every request).
    pub fn choose_cpu_clocks(&mut self, on: bool) {
        self.target.clocks_chosen = on;
    }

    /// Each live thread's CPU clock, for those that have one.
    pub fn cpu_clocks(&self) -> Vec<(Tid, CpuClock)> {
        let Some(rt) = self.runtime.as_ref() else {
            return Vec::new();
        };
        rt.region
            .snapshot(0)
            .into_iter()
            .filter(|r| r.state == ROW_LIVE)
            .filter_map(|r| Some((r.tid as Tid, CpuClock::of(r.cpu_source)?)))
            .collect()
    }

    /// Asks thread `tid`'s CPU clock for a perf event (`event`) or to let
    /// its event go: the thread does it at its next reading, outside any
    /// stop of the world. Returns whether the clock was asked: not when it
    /// is already so, asked already, on the CPU-time table, or its page is
    /// not an event the process has mapped (a forked child's copy of its
    /// parent's row).
    pub fn set_cpu_clock(&self, tid: Tid, event: bool) -> Result<bool, Error> {
        use weft_rt::clock::{WHY_CPU_ARM_ASKED, WHY_CPU_RELEASED, WHY_CPU_UNASKED};
        let rt = self.rt()?;
        let Some(row) = live_row(rt, tid) else {
            return Ok(false);
        };
        let why = row.cpu_source.1;
        let asked = match (CpuClock::of(row.cpu_source), event) {
            (Some(CpuClock::SystemCall), true)
                if why == WHY_CPU_UNASKED || why == WHY_CPU_RELEASED =>
            {
                rt.region.ask_clock(row.index, WHY_CPU_ARM_ASKED)
            }
            (Some(CpuClock::Event), false) if why == 0 => {
                let page = rt.region.clock_page(row.index);
                let mapped = crate::inspect::maps::read_maps(self.target.pid)?
                    .iter()
                    .any(|m| m.start == page && matches!(&m.path, crate::inspect::maps::MappingPath::Pseudo(p) if p.ends_with("[perf_event]")));
                if !mapped {
                    return Ok(false);
                }
                rt.region.ask_clock_to_drop(row.index)
            }
            _ => return Ok(false),
        };
        asked.map_err(|e| Error::Internal(format!("asking a CPU clock: {e}")))?;
        Ok(true)
    }

    /// Pauses thread `tid`'s CPU clock (`paused`), or gives it back. A
    /// paused clock is not read: the thread's CPU timers count no CPU time
    /// from their next activation, and cost it nothing, neither a system
    /// call at each reading nor an event at each switch; activations open
    /// at the pause count none. For a tool that can do without the
    /// thread's CPU time for a while (the diagnosis samples it instead,
    /// where reading it would cost the target more than its budget). Only
    /// a clock with no perf event is paused ([`CpuClock::SystemCall`]: let
    /// it go first, [`Process::set_cpu_clock`]). Every paused clock is
    /// given back when the session ends (a hold released with none of its
    /// probes left in place); a thread that
    /// exits paused drops its clock as it would. Returns whether the clock
    /// changed.
    pub fn pause_cpu_clock(&self, tid: Tid, paused: bool) -> Result<bool, Error> {
        let rt = self.rt()?;
        let Some(row) = live_row(rt, tid) else {
            return Ok(false);
        };
        let failed = |e: std::io::Error| Error::Internal(format!("pausing a CPU clock: {e}"));
        let mut saved = self
            .target
            .paused_clocks
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if paused {
            if CpuClock::of(row.cpu_source) != Some(CpuClock::SystemCall) {
                return Ok(false);
            }
            let Some(pointer) = rt.region.pause_clock(row.index).map_err(failed)? else {
                return Ok(false);
            };
            saved.insert(row.index, (tid, pointer));
            return Ok(true);
        }
        match saved.remove(&row.index) {
            Some((owner, pointer)) if owner == tid && rt.region.clock_paused(row.index) => {
                rt.region.resume_clock(row.index, pointer).map_err(failed)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Gives every clock this session paused back (its thread still alive
    /// and the row still its own), and, when no session has a probe in
    /// the process any more, every other paused clock too (left by a weft
    /// that was killed): its pointer is where the runtime keeps every
    /// row's clock, the same place in each row.
    pub(super) fn resume_cpu_clocks(&self) {
        let Some(rt) = self.runtime.as_ref() else {
            return;
        };
        let saved = std::mem::take(
            &mut *self
                .target
                .paused_clocks
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        let last = !self.probes.iter().any(|p| p.active)
            && crate::ledger::live_entries(&rt.region).is_empty();
        if saved.is_empty() && !last {
            return;
        }
        let rows: Vec<crate::sample::RowSnapshot> = rt
            .region
            .snapshot(0)
            .into_iter()
            .filter(|r| r.state == ROW_LIVE)
            .collect();
        let geometry = rt.region.geometry();
        // The target's address of row 0's clock, from any row that has one.
        let row0 = rows.iter().find_map(|r| {
            let pointer = rt.region.clock_pointer(r.index);
            (pointer != 0).then(|| pointer.wrapping_sub(geometry.row_offset(r.index)))
        });
        for r in rows.iter().filter(|r| rt.region.clock_paused(r.index)) {
            let pointer = match saved.get(&r.index) {
                Some(&(tid, pointer)) if tid as u32 == r.tid => Some(pointer),
                _ if last => row0.map(|p| p.wrapping_add(geometry.row_offset(r.index))),
                _ => None,
            };
            if let Some(pointer) = pointer {
                let _ = rt.region.resume_clock(r.index, pointer);
            }
        }
    }

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

/// Thread `tid`'s row, while it is live.
fn live_row(rt: &Runtime, tid: Tid) -> Option<crate::sample::RowSnapshot> {
    rt.region
        .snapshot(0)
        .into_iter()
        .find(|r| r.state == ROW_LIVE && r.tid as Tid == tid)
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
