//! The kernel_calls target (tests/targets/kernel_calls.c) and reading its
//! ground truth next to weft's report of kernel probes.

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The target, `gcc -O1 -fno-inline`.
pub fn kernel_calls() -> PathBuf {
    super::build_c_target("kernel_calls", &["-O1", "-fno-inline"])
}

/// A 7,600,000-byte file to read: ~0.4 ms in one read here (a preemption
/// at the return to user space, which the target's clock sees and weft's
/// does not, is then a small part of the call); 116 reads of 64 KiB chunks
/// to its end. In /dev/shm (tmpfs): the scratch files the target rewrites
/// next to it then cost CPU only, no writeback. Removed on drop.
pub fn data_file(test: &str) -> DataFile {
    let dir = PathBuf::from(format!(
        "/dev/shm/weft-kernel-{}-{test}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cache.data");
    let bytes: Vec<u8> = (0..7_600_000u32)
        .map(|i| i.wrapping_mul(2_654_435_761) as u8)
        .collect();
    std::fs::write(&path, bytes).unwrap();
    DataFile(path)
}

/// The data file of [`data_file`]; its directory goes with it.
pub struct DataFile(PathBuf);

impl std::ops::Deref for DataFile {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for DataFile {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// (tid, function, syscall) → (calls, wall ns, cpu ns), from the target.
pub type Truth = BTreeMap<(u64, String, String), (u64, u64, u64)>;

/// The target's `T` lines.
pub fn truth(stdout: &str) -> Truth {
    stdout
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 7 && f[0] == "T").then(|| {
                (
                    (f[1].parse().unwrap(), f[2].to_string(), f[3].to_string()),
                    (
                        f[4].parse().unwrap(),
                        f[5].parse().unwrap(),
                        f[6].parse().unwrap(),
                    ),
                )
            })
        })
        .collect()
}

/// The target's `P` lines: involuntary switches per thread in its first
/// phase.
pub fn preempted(stdout: &str) -> BTreeMap<u64, u64> {
    stdout
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[0] == "P").then(|| (f[1].parse().unwrap(), f[2].parse().unwrap()))
        })
        .collect()
}

/// The report's (calls, wall ns, cpu ns) of function `key` (`syscall:read`,
/// `kernel:vfs_read`) in thread `tid` while it was in user function `user`.
pub fn measured(report: &Value, tid: u64, key: &str, user: &str) -> (u64, u64, u64) {
    let threads = report["threads"].as_array().unwrap();
    let Some(t) = threads.iter().find(|t| t["tid"].as_u64() == Some(tid)) else {
        return (0, 0, 0);
    };
    let c = &t["functions"][key]["by_user_function"][user];
    (
        c["calls"].as_u64().unwrap_or(0),
        c["wall_ns"].as_u64().unwrap_or(0),
        c["cpu_ns"].as_u64().unwrap_or(0),
    )
}

/// A call long enough that what the target's clock sees around it and
/// weft's does not (the system call's entry and exit, the probe's own
/// cost: ≲1 µs here, 1.2 µs on a slow day) is within 5% of it; the
/// checks allow a tenth of it a call for that.
pub const LONG_CALL_NS: u64 = 20_000;
/// The same under QEMU's TCG, where a system call's entry and exit and the
/// probes take ~100 µs.
pub const LONG_CALL_NS_TCG: u64 = 2_000_000;

/// One run: weft's report, the target's truth, its preemptions, and what
/// counts as a long call where it ran.
pub struct Observed<'a> {
    /// weft's JSON report.
    pub report: &'a Value,
    /// The target's `T` lines.
    pub truth: &'a Truth,
    /// The target's `P` lines.
    pub preempted: &'a BTreeMap<u64, u64>,
    /// [`LONG_CALL_NS`] or [`LONG_CALL_NS_TCG`].
    pub long_call_ns: u64,
    /// How far weft's CPU time may be from the thread's own clock for a
    /// call that never left its CPU: 5% (the guest boots with
    /// `tsc=reliable`, see tests/qemu/guest.sh: otherwise its scheduler
    /// clock and `ktime` come from different emulated clocks).
    pub cpu_tolerance: f64,
    /// A read of the empty pipe sleeps (most of its wall time off CPU):
    /// true where the target runs alone; under TCG the reads often find
    /// their byte there already and are slowed by the other thread.
    pub pipe_sleeps: bool,
    /// The share of the machine's time a hypervisor stole during the run
    /// ([`super::machine_steal_share`]; 0 in the guest). The thread's own
    /// CPU clock leaves stolen time out (the kernel's paravirtual steal
    /// accounting) and weft's kernel CPU time, measured between
    /// scheduler switches, counts it: beyond [`STEAL_QUIET`] the thread's
    /// clock is no reference for CPU time.
    pub steal: f64,
    /// How long, in ns, the host kept the machine running the target from
    /// running during the run (a QEMU guest's vCPU threads waiting for a
    /// host CPU: [`super::qemu::GuestOutput::host_delay_ns`]; 0 on the
    /// host). The guest's clocks run on through it, so any of the target's
    /// spans may hold up to this much time in which nothing ran, at its
    /// edges as well as inside the function weft measures: the target's
    /// figure, less this, is the floor weft's must reach.
    pub host_delay_ns: u64,
}

/// The stolen share under which the thread's CPU clock is compared
/// (within the 5% tolerance with room to spare).
pub const STEAL_QUIET: f64 = 0.01;

/// How many (thread, function) figures [`check_against_truth`] compared
/// with the target's own clocks.
#[derive(Clone, Copy, Debug, Default)]
pub struct Compared {
    /// Long calls whose wall times were compared.
    pub wall: usize,
    /// Long calls of a thread never preempted (nor stolen from) whose CPU
    /// times were compared within the tolerance.
    pub cpu: usize,
}

/// Checks weft's figures for `key` against the target's for `syscall`
/// (every (thread, function) the target reports): calls and attribution
/// exact; wall time never above the target's and within 5% of it (less the
/// calls' edges) for long
/// calls (long by both clocks); CPU time never above wall; for long calls that run (not sleep),
/// within the tolerance of the target's own CPU clock for a thread never
/// preempted (a preempting wakeup makes the kernel charge the rest of a
/// call to the next thread, see kernel_calls.c: that clock is then no
/// reference);
/// a sleeping read's CPU far below its wall. Returns how many long calls' times it compared.
pub fn check_against_truth(
    ctx: &super::Ctx,
    run: &Observed,
    key: &str,
    syscall: &str,
    timed: bool,
) -> Compared {
    let Observed {
        report,
        truth,
        preempted,
        long_call_ns,
        cpu_tolerance,
        pipe_sleeps,
        steal,
        host_delay_ns,
    } = run;
    let host_delay_ns = *host_delay_ns;
    let cpu_range = 1.0 - cpu_tolerance..=1.0 + cpu_tolerance;
    let (report, long_call_ns) = (*report, *long_call_ns);
    let mut compared = Compared::default();
    for ((tid, function, call), &(calls, wall, cpu)) in truth.iter() {
        if call != syscall {
            continue;
        }
        let (m_calls, m_wall, m_cpu) = measured(report, *tid, key, function);
        let what = format!("thread {tid} {function} → {key}");
        eprintln!(
            "{what}: calls {m_calls}/{calls} wall {m_wall}/{wall} cpu {m_cpu}/{cpu} (weft/target)"
        );
        ctx.check(m_calls == calls, || {
            format!("{what}: {m_calls} calls counted, the target made {calls}")
        });
        if !timed {
            continue;
        }
        ctx.check(m_wall <= wall, || {
            format!("{what}: weft's wall time {m_wall} ns exceeds the target's own {wall} ns")
        });
        ctx.check(m_cpu <= m_wall, || {
            format!("{what}: CPU {m_cpu} ns above wall {m_wall} ns")
        });
        // Long by both clocks: a short call whose thread was preempted
        // between the target's clock read and the system call (four busy
        // threads on the guest's two CPUs) is long by the target's clock
        // alone (CI: 0.7 ms a call inside do_sys_openat2, 4.5 ms around
        // it), and that time is outside the function weft measures.
        // What the target's window holds besides the call (the libc
        // wrapper, the system call's entry and exit outside the
        // tracepoints, the probes' own cost) is allowed for at twice what
        // the long-call bound assumes: 1.2 us a call was measured on a
        // slow day, 0.947 of a read of 23 us a call.
        if wall / calls >= long_call_ns && m_wall / calls >= long_call_ns {
            compared.wall += 1;
            let edges = calls * (long_call_ns / 10);
            let floor = wall.saturating_sub(edges + host_delay_ns).max(1);
            let ratio = m_wall as f64 / floor as f64;
            ctx.check(ratio >= 0.95, || {
                format!(
                    "{what}: wall {m_wall} ns vs the target's {wall} ns less {edges} ns for the \
                     calls' edges and {host_delay_ns} ns the host delayed the guest ({ratio:.3})"
                )
            });
        }
        // The thread left its CPU inside the call (by its own clock, or
        // by the scheduler's switches weft saw): its own clock is then no
        // reference, the kernel charging the time between a run-queue
        // clock update and the switch to one side or the other (a woken
        // thread for time before it ran; see kernel_calls.c). Only
        // CPU <= wall is checked, and a sleeping read's CPU far below it.
        let sleeps = cpu * 10 < wall * 9 || m_cpu * 100 < m_wall * 99;
        if cpu / calls >= long_call_ns && !sleeps {
            let ratio = m_cpu as f64 / cpu as f64;
            if preempted.get(tid) == Some(&0) && *steal <= STEAL_QUIET {
                compared.cpu += 1;
                // The host's delays count on the thread's clock as they do
                // on weft's when they fall inside the function, and on the
                // thread's alone when they fall at the call's edges.
                let floor = cpu.saturating_sub(host_delay_ns).max(1);
                let low = m_cpu as f64 / floor as f64;
                // Off its CPU by its own clock while weft saw no switch:
                // the hypervisor took the vCPU in this window (steal comes
                // in bursts: a CI run had 4.2 ms of a 47 ms window stolen
                // while under 1% of the whole run was), which the
                // thread's clock leaves out and weft's counts where it
                // cannot read the steal counter (docs/kernel.md): weft's
                // then lies between the thread's CPU and wall clocks.
                let stolen = m_cpu * 100 >= m_wall * 99
                    && cpu < wall
                    && m_cpu <= wall
                    && ratio >= *cpu_range.start();
                ctx.check(
                    cpu_range.contains(&ratio)
                        || (low >= *cpu_range.start() && ratio <= 1.0)
                        || stolen,
                    || {
                        format!(
                            "{what}: CPU {m_cpu} ns vs the target's {cpu} ns ({ratio:.3}; \
                             {low:.3} of it less {host_delay_ns} ns the host delayed the guest)"
                        )
                    },
                );
            } else {
                // Preempted: the kernel charged part of some call to the
                // thread switched in (or this thread for another's), so
                // its clock is no reference; nor is it when the
                // hypervisor stole (see `Observed::steal`). weft's cannot
                // exceed the call's wall time.
                ctx.check(m_cpu <= wall, || {
                    format!("{what}: CPU {m_cpu} ns above the call's wall time {wall} ns ({ratio:.3} of the thread's clock)")
                });
            }
        }
        if function == "wait_pipe" {
            let below = if *pipe_sleeps {
                m_cpu * 10 < m_wall
            } else {
                m_cpu < m_wall
            };
            ctx.check(below, || {
                format!("{what}: CPU {m_cpu} ns should be far below wall {m_wall} ns")
            });
        }
    }
    compared
}
