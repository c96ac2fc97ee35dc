//! Tracing every thread of a process with ptrace, rr-style: every stop is
//! accounted for, every signal the target receives while weft holds it is
//! delivered exactly once, and threads created while attached are followed.
//!
//! A [`Tracer`] holds a process from [`Tracer::attach`] (or
//! [`Tracer::adopt`] for a child weft launched itself) until
//! [`Tracer::detach`]. In between the world is either *stopped* (every known
//! thread in a ptrace-stop: [`Tracer::stop_all`]) or *running*
//! ([`Tracer::resume_all`]). Events that arrive while weft waits for
//! something else (a remote call, the world to stop) are dispatched here:
//!
//! | event | while stopping | while running |
//! |---|---|---|
//! | interrupt / new-thread stop | thread stopped | resumed |
//! | signal-delivery-stop | kept, delivered on resume | delivered at once |
//! | group-stop (`SIGSTOP` &c.) | kept, `PTRACE_LISTEN` on resume | `PTRACE_LISTEN` |
//! | `PTRACE_EVENT_CLONE` | child added | child added |
//! | thread exit | removed | removed |
//! | `exec` | error: the image weft inspected is gone | same |
//!
//! Waiting uses `waitpid(tid, __WALL | WNOHANG)`, thread by thread, never
//! `waitpid(-1)`: several tracers may hold processes at once in one
//! program, and the program's own children are left to it. Between
//! polls it sleeps in `sigtimedwait` for the `SIGCHLD` the kernel sends at
//! every tracee stop (blocked in the tracing thread while a [`Tracer`]
//! exists), never longer than a millisecond: weft may run at real-time
//! priority and must never spin.

mod remote;
mod sys;

pub use remote::{RemoteArg, RemoteCall, RemoteError, World};
pub use sys::Registers;

use crate::memory::{MemoryError, ProcessMemory};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// A kernel thread id.
pub type Tid = i32;

/// Why a thread is in a ptrace-stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// `PTRACE_INTERRUPT`, a new thread's first stop, or a ptrace event.
    Trap,
    /// A signal waits to be delivered when the thread resumes.
    Signal(i32),
    /// The whole process is stopped by this job-control signal; resuming
    /// the thread with `PTRACE_LISTEN` keeps it that way.
    Group(i32),
    /// A system-call entry or exit stop (only while weft follows a remote
    /// call with `PTRACE_SYSCALL`).
    Syscall,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ThreadState {
    Running,
    Stopped(Stop),
}

#[derive(Debug)]
struct Thread {
    state: ThreadState,
    /// Signals that arrived while the thread ran a remote call for weft;
    /// delivered when it resumes.
    withheld: Vec<i32>,
}

/// How the process ended while traced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessExit {
    /// Exited with this status.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
}

impl ProcessExit {
    /// The shell convention: the code, or 128 + the signal.
    pub fn shell_code(self) -> i32 {
        match self {
            ProcessExit::Code(c) => c,
            ProcessExit::Signal(s) => 128 + s,
        }
    }
}

/// What went wrong while tracing.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The process does not exist.
    #[error("no such process: {0}")]
    NoSuchProcess(i32),
    /// The kernel refused ptrace.
    #[error("permission denied: cannot trace process {pid}: ptrace needs CAP_SYS_PTRACE or the same user as the target (and /proc/sys/kernel/yama/ptrace_scope may forbid attaching to non-children)")]
    PermissionDenied {
        /// The process.
        pid: i32,
    },
    /// Another tracer (a debugger, strace, another weft) holds the process.
    #[error("process {pid} is already traced by process {tracer} (a debugger, strace or another weft?): detach it first")]
    AlreadyTraced {
        /// The process.
        pid: i32,
        /// Its tracer.
        tracer: i32,
    },
    /// The process exited while weft worked on it.
    #[error("process {pid} exited ({exit:?}) while weft was working on it")]
    Exited {
        /// The process.
        pid: i32,
        /// How it ended.
        exit: ProcessExit,
    },
    /// The process called `exec` while weft worked on it.
    #[error(
        "process {0} called exec while weft was working on it: the program weft inspected is gone"
    )]
    Execed(i32),
    /// A ptrace request failed unexpectedly.
    #[error("ptrace({op}) on thread {tid} failed: {source}")]
    Ptrace {
        /// The request.
        op: &'static str,
        /// The thread.
        tid: Tid,
        /// The error.
        source: std::io::Error,
    },
    /// Threads did not stop in time.
    #[error("{0} thread(s) of process {1} did not stop within {2:?}")]
    StopTimeout(usize, i32, Duration),
    /// Memory access failed.
    #[error(transparent)]
    Memory(#[from] MemoryError),
}

/// Runs the calling thread at `SCHED_FIFO` while it exists, when the
/// system permits (root or `CAP_SYS_NICE`), and restores the old policy.
///
/// On 2 cores, a target's resumed (or not yet stopped) threads otherwise
/// preempt weft one after the other: once preempted by 200 busy threads,
/// weft waits 100-400 ms for its next turn, in any phase of its work, and
/// while it holds the target every millisecond is a pause. At real-time
/// priority nothing of the target's preempts it. Whoever holds a guard must
/// never spin: weft sleeps in `sigtimedwait` or `nanosleep` whenever it
/// waits. `SCHED_RESET_ON_FORK` keeps a child forked meanwhile (`weft run`'s
/// program) from inheriting the priority.
#[derive(Debug)]
pub struct RealtimeGuard {
    policy: i32,
    param: libc::sched_param,
}

impl RealtimeGuard {
    /// Raises the calling thread to `SCHED_FIFO` priority 1, or `None` when
    /// not permitted (weft then works at normal priority, only slower).
    pub fn raise() -> Option<RealtimeGuard> {
        // SAFETY: querying and setting our own thread's policy; the param
        // structs are valid for the calls.
        unsafe {
            let policy = libc::sched_getscheduler(0);
            let mut param: libc::sched_param = std::mem::zeroed();
            if policy < 0
                || libc::sched_getparam(0, &mut param) != 0
                || matches!(
                    policy & !libc::SCHED_RESET_ON_FORK,
                    libc::SCHED_FIFO | libc::SCHED_RR
                )
            {
                // Already real-time (an outer guard, or the user's choice).
                return None;
            }
            let fifo = libc::sched_param { sched_priority: 1 };
            let raised =
                libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &fifo)
                    == 0;
            raised.then_some(RealtimeGuard { policy, param })
        }
    }
}

impl Drop for RealtimeGuard {
    fn drop(&mut self) {
        // SAFETY: restores our own thread's saved policy.
        unsafe {
            libc::sched_setscheduler(0, self.policy, &self.param);
        }
    }
}

/// Where one stop of the world's time went. Ordered by `total` first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct StopTime {
    /// From the first thread interrupted to the last one resumed.
    pub total: Duration,
    /// Until every thread had stopped: the kernel's part (each interrupted
    /// thread must be scheduled to enter its stop; a sleeping one waits
    /// for a CPU, a vCPU can be descheduled by its host).
    pub stopping: Duration,
    /// Resuming them all.
    pub resuming: Duration,
    /// CPU time weft's tracing thread spent during the stop: its own work,
    /// which neither the kernel's scheduling nor a hypervisor's stealing
    /// of the vCPU lengthens.
    pub weft_cpu: Duration,
    /// Time in calls weft made in the target (loading the runtime,
    /// mapping trampoline memory) while the others stayed stopped: the
    /// calling thread must be scheduled to run them, which on a busy
    /// machine can take milliseconds.
    pub remote_calls: Duration,
}

/// The calling thread's CPU time.
fn own_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

/// A process held with ptrace.
#[derive(Debug)]
pub struct Tracer {
    /// Dropped (priority restored) after the threads are detached.
    _realtime: Option<RealtimeGuard>,
    /// SIGCHLD blocked in the tracing thread, to sleep on it.
    _sigchld: sys::SigchldBlocked,
    pid: i32,
    threads: BTreeMap<Tid, Thread>,
    memory: ProcessMemory,
    exit: Option<ProcessExit>,
    stop_events: u64,
    /// When the current stop of the world began (its first interrupt),
    /// and the tracing thread's CPU time then.
    stopped_since: Option<Instant>,
    cpu_since: Duration,
    /// Time in remote calls made inside the current stop.
    remote_in_stop: Duration,
    /// How long its threads took to stop, once they all had.
    stopping: Option<Duration>,
    /// The longest stop of the world so far.
    longest_stop: StopTime,
    /// Rounds of a stop of the world given up so far (see `stop_all`).
    stops_given_up: u64,
    /// Where remote calls return (see `weft_codegen::remote_stub`), once
    /// installed.
    return_stub: Option<remote::StubInfo>,
    /// Where [`Tracer::poll_any`] starts its next round (so that a thread
    /// with a stream of events cannot hide the others').
    poll_cursor: Tid,
}

/// `TRACESYSGOOD` marks system-call stops (`SIGTRAP | 0x80`); weft only
/// asks for them on the thread running a remote call.
pub(crate) const OPTIONS: i64 =
    (libc::PTRACE_O_TRACECLONE | libc::PTRACE_O_TRACEEXEC | libc::PTRACE_O_TRACESYSGOOD) as i64;
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Rounds a stop of the world may take (see [`Tracer::stop_all`]); the last
/// waits for every thread, up to [`STOP_TIMEOUT`].
const STOP_ROUNDS: u32 = 3;

/// How long a round of [`Tracer::stop_all`] waits for `threads` threads to
/// stop before it is given up: 2 ms, and 10 µs more per thread (200 busy
/// threads on 2 cores legitimately take 0.5–2.5 ms, each scheduled in turn
/// to enter its stop; giving up on them would only repeat that).
fn stop_patience(threads: usize) -> Duration {
    Duration::from_micros(2_000 + 10 * threads as u64)
}
/// Longest sleep between two polls for tracee events.
const MAX_SLEEP: Duration = Duration::from_millis(1);

/// Kernel thread ids of `pid`, from `/proc/PID/task`.
pub fn list_threads(pid: i32) -> Result<Vec<Tid>, TraceError> {
    let dir = std::fs::read_dir(crate::inspect::procfs::pid_file(pid, "task"))
        .map_err(|_| TraceError::NoSuchProcess(pid))?;
    let mut tids: Vec<Tid> = dir
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
        .collect();
    tids.sort_unstable();
    Ok(tids)
}

/// The tracer of `pid` per `/proc/PID/status`, if any.
pub fn tracer_of(pid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(crate::inspect::procfs::pid_file(pid, "status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))
        .and_then(|v| v.trim().parse().ok())
        .filter(|&t| t != 0)
}

impl Tracer {
    /// Seizes every thread of `pid` (looping over `/proc/PID/task` until no
    /// new thread appears; threads cloned after their parent was seized are
    /// followed by `PTRACE_O_TRACECLONE`) and stops them all.
    pub fn attach(pid: i32) -> Result<Tracer, TraceError> {
        if let Some(tracer) = tracer_of(pid) {
            return Err(TraceError::AlreadyTraced { pid, tracer });
        }
        let memory = ProcessMemory::open(pid).map_err(|e| match &e {
            MemoryError::Open { source, .. }
                if source.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                TraceError::PermissionDenied { pid }
            }
            MemoryError::Open { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                TraceError::NoSuchProcess(pid)
            }
            _ => TraceError::Memory(e),
        })?;
        let mut tracer = Tracer {
            _realtime: RealtimeGuard::raise(),
            _sigchld: sys::SigchldBlocked::new(),
            pid,
            threads: BTreeMap::new(),
            memory,
            exit: None,
            stop_events: 0,
            stopped_since: None,
            cpu_since: Duration::ZERO,
            remote_in_stop: Duration::ZERO,
            stopping: None,
            longest_stop: StopTime::default(),
            stops_given_up: 0,
            return_stub: None,
            poll_cursor: 0,
        };
        let result = tracer.seize_all().and_then(|_| tracer.stop_all());
        if let Err(e) = result {
            // Let go of whatever was seized: the target must not stay held.
            let _ = tracer.detach();
            return Err(e);
        }
        Ok(tracer)
    }

    /// Wraps a single-threaded child that was seized (with the same options)
    /// by the caller and is now in a ptrace-stop, e.g. at its `exec`.
    pub fn adopt(pid: i32) -> Result<Tracer, TraceError> {
        let memory = ProcessMemory::open(pid)?;
        let mut threads = BTreeMap::new();
        threads.insert(
            pid,
            Thread {
                state: ThreadState::Stopped(Stop::Trap),
                withheld: Vec::new(),
            },
        );
        Ok(Tracer {
            _realtime: RealtimeGuard::raise(),
            _sigchld: sys::SigchldBlocked::new(),
            pid,
            threads,
            memory,
            exit: None,
            stop_events: 0,
            stopped_since: None,
            cpu_since: Duration::ZERO,
            remote_in_stop: Duration::ZERO,
            stopping: None,
            longest_stop: StopTime::default(),
            stops_given_up: 0,
            return_stub: None,
            poll_cursor: 0,
        })
    }

    fn seize_all(&mut self) -> Result<(), TraceError> {
        loop {
            let mut seized_any = false;
            for tid in list_threads(self.pid)? {
                if self.threads.contains_key(&tid) {
                    continue;
                }
                match sys::seize(tid, OPTIONS) {
                    Ok(()) => {
                        self.threads.insert(
                            tid,
                            Thread {
                                state: ThreadState::Running,
                                withheld: Vec::new(),
                            },
                        );
                        seized_any = true;
                    }
                    // The thread exited between listing and seizing.
                    Err(e) if e.raw_os_error() == Some(libc::ESRCH) && tid != self.pid => {}
                    Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                        return Err(TraceError::NoSuchProcess(self.pid))
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                        return Err(match tracer_of(self.pid) {
                            Some(tracer) if tracer != std::process::id() as i32 => {
                                TraceError::AlreadyTraced {
                                    pid: self.pid,
                                    tracer,
                                }
                            }
                            _ => TraceError::PermissionDenied { pid: self.pid },
                        });
                    }
                    Err(source) => {
                        return Err(TraceError::Ptrace {
                            op: "SEIZE",
                            tid,
                            source,
                        })
                    }
                }
            }
            if !seized_any {
                return Ok(());
            }
        }
    }

    /// The traced process.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The process's memory.
    pub fn memory(&self) -> &ProcessMemory {
        &self.memory
    }

    /// Threads currently known (live and traced).
    pub fn threads(&self) -> impl Iterator<Item = Tid> + '_ {
        self.threads.keys().copied()
    }

    /// Number of threads currently known.
    pub fn thread_count(&self) -> usize {
        self.threads.len()
    }

    /// How many times the world was stopped (for tests and benchmarks).
    pub fn stop_count(&self) -> u64 {
        self.stop_events
    }

    /// The longest time the world was stopped at once, from the first
    /// interrupt to the last thread resumed (the current stop included).
    pub fn longest_stop(&self) -> Duration {
        self.longest_stop_time().total
    }

    /// [`Tracer::longest_stop`], and where its time went.
    pub fn longest_stop_time(&self) -> StopTime {
        let current = self.stopped_since.map(|since| {
            let total = since.elapsed();
            StopTime {
                total,
                stopping: self.stopping.unwrap_or(total),
                resuming: Duration::ZERO,
                weft_cpu: own_cpu_time().saturating_sub(self.cpu_since),
                remote_calls: self.remote_in_stop.min(total),
            }
        });
        self.longest_stop.max(current.unwrap_or_default())
    }

    /// The current stop of the world (if any) is over; resuming its
    /// threads took `resuming`.
    fn stop_ended(&mut self, resuming: Duration) {
        if let Some(since) = self.stopped_since.take() {
            let total = since.elapsed();
            let this = StopTime {
                total,
                stopping: self.stopping.take().unwrap_or(total).min(total),
                resuming: resuming.min(total),
                weft_cpu: own_cpu_time().saturating_sub(self.cpu_since),
                remote_calls: self.remote_in_stop.min(total),
            };
            self.longest_stop = self.longest_stop.max(this);
        }
    }

    /// Whether any known thread is running.
    pub fn any_running(&self) -> bool {
        self.threads
            .values()
            .any(|t| t.state == ThreadState::Running)
    }

    /// Why `tid` is stopped, or `None` when it is running.
    pub fn stop_of(&self, tid: Tid) -> Option<Stop> {
        match self.threads.get(&tid)?.state {
            ThreadState::Stopped(s) => Some(s),
            ThreadState::Running => None,
        }
    }

    fn exited_error(&self) -> TraceError {
        TraceError::Exited {
            pid: self.pid,
            exit: self.exit.unwrap_or(ProcessExit::Code(0)),
        }
    }

    /// Stops every thread (threads created meanwhile included).
    ///
    /// A stop that has not completed within [`stop_patience`] because its
    /// late threads sleep in a wait the interrupt cannot end (a `vfork`
    /// parent, a read from a slow file system: see [`Tracer::blocked`]) is
    /// given up (at most [`STOP_ROUNDS`]` - 1` times): the threads that did
    /// stop are resumed at once, weft waits for the late ones (their
    /// interrupts stay pending) to stop, keeps those stopped and tries
    /// again. Waiting for such a thread would pause every other thread as
    /// long. A late thread that waits for a CPU is waited for: resuming the
    /// others would only make it wait longer.
    pub fn stop_all(&mut self) -> Result<(), TraceError> {
        self.stop_events += 1;
        let deadline = Instant::now() + STOP_TIMEOUT;
        // Threads already stopped stay as they are whatever happens here;
        // so do late ones once they have stopped (resumed, they could be
        // late again).
        let mut keep: BTreeSet<Tid> = self
            .threads
            .iter()
            .filter(|(_, t)| t.state != ThreadState::Running)
            .map(|(&tid, _)| tid)
            .collect();
        let mut round = 1;
        loop {
            if self.stopped_since.is_none() {
                self.stopped_since = Some(Instant::now());
                self.cpu_since = own_cpu_time();
                self.remote_in_stop = Duration::ZERO;
            }
            self.interrupt_running()?;
            let patient = round < STOP_ROUNDS;
            let until = if patient {
                deadline.min(Instant::now() + stop_patience(self.threads.len()))
            } else {
                deadline
            };
            let mut stopped = self.collect_stops(None, until)?;
            let late: BTreeSet<Tid> = self.running().collect();
            if !stopped && (!patient || !late.iter().all(|&tid| self.blocked(tid))) {
                // A late thread that waits for a CPU gets one sooner with
                // the others stopped than with them resumed (200 busy
                // threads on 2 cores: giving up made each stop ~30 times
                // longer): wait for everyone.
                stopped = self.collect_stops(None, deadline)?;
                if !stopped {
                    let still = self.running().count();
                    return Err(TraceError::StopTimeout(still, self.pid, STOP_TIMEOUT));
                }
            }
            if stopped {
                if let (None, Some(since)) = (self.stopping, self.stopped_since) {
                    self.stopping = Some(since.elapsed());
                }
                return Ok(());
            }
            // Give this round up: resume what it stopped (its pause ends
            // here and is not a stop of the world), then wait for the late
            // threads alone.
            let stopped: Vec<Tid> = self
                .threads
                .keys()
                .filter(|tid| !keep.contains(tid) && !late.contains(tid))
                .copied()
                .collect();
            self.stopped_since = None;
            self.stopping = None;
            self.stops_given_up += 1;
            for tid in stopped {
                self.resume(tid)?;
            }
            if !self.collect_stops(Some(&late), deadline)? {
                let still = self.running().filter(|tid| late.contains(tid)).count();
                return Err(TraceError::StopTimeout(still, self.pid, STOP_TIMEOUT));
            }
            keep.extend(late);
            round += 1;
        }
    }

    /// Whether thread `tid` sleeps in the kernel (state `D` or `S` in
    /// `/proc/PID/task/TID/stat`) rather than waiting for a CPU or being
    /// about to stop: an interrupted thread still asleep after the
    /// patience is in a wait the interrupt cannot end (a `vfork` parent, a
    /// disk or network file system read), and resuming the others does not
    /// delay it.
    fn blocked(&self, tid: Tid) -> bool {
        let stat =
            std::fs::read_to_string(crate::inspect::procfs::task_file(self.pid, tid, "stat"))
                .unwrap_or_default();
        // The state follows the parenthesised name, which may hold spaces
        // and parentheses itself: the last `)`.
        let state = stat
            .rfind(')')
            .and_then(|end| stat[end + 1..].trim_start().chars().next());
        matches!(state, Some('D' | 'S'))
    }

    /// The threads not in a ptrace-stop.
    fn running(&self) -> impl Iterator<Item = Tid> + '_ {
        self.threads
            .iter()
            .filter(|(_, t)| t.state == ThreadState::Running)
            .map(|(&tid, _)| tid)
    }

    /// Sends `PTRACE_INTERRUPT` to every running thread.
    fn interrupt_running(&mut self) -> Result<(), TraceError> {
        let running: Vec<Tid> = self.running().collect();
        for tid in running {
            if let Err(e) = sys::interrupt(tid) {
                // ESRCH: the thread is exiting; its exit event will come.
                if e.raw_os_error() != Some(libc::ESRCH) {
                    return Err(TraceError::Ptrace {
                        op: "INTERRUPT",
                        tid,
                        source: e,
                    });
                }
            }
        }
        Ok(())
    }

    /// Collects the stops of the running threads (of `only`, when given),
    /// keeping each stopped, until none of them runs (true) or `until`
    /// (false).
    fn collect_stops(
        &mut self,
        only: Option<&BTreeSet<Tid>>,
        until: Instant,
    ) -> Result<bool, TraceError> {
        // Rounds in a row that collected nothing: the pause doubles with
        // each (up to MAX_SLEEP), so that a thread late to stop because it
        // waits for a CPU is not kept from it by weft waking every 20 µs
        // at real-time priority.
        let mut idle: u32 = 0;
        loop {
            if self.exit.is_some() {
                return Err(self.exited_error());
            }
            let running: Vec<Tid> = self
                .running()
                .filter(|tid| only.map_or(true, |o| o.contains(tid)))
                .collect();
            if running.is_empty() {
                return Ok(true);
            }
            if Instant::now() > until {
                return Ok(false);
            }
            // Collect each thread's stop by its id. A thread created
            // meanwhile joins the running ones at its parent's clone event
            // and is collected in a later round.
            let still = running.len();
            let mut collected = false;
            for tid in running {
                if let Some((t, status)) = self.poll(tid)? {
                    self.dispatch(t, status, true, None)?;
                    collected = true;
                }
            }
            if self.threads.is_empty() {
                if self.exit.is_none() {
                    self.exit = Some(ProcessExit::Code(0));
                }
                return Err(self.exited_error());
            }
            if collected {
                idle = 0;
            } else {
                // An interrupted thread stops within microseconds of being
                // scheduled, but waking weft (real-time, so it preempts a
                // thread about to stop) for each stop costs more than the
                // stop: 200 busy threads on 2 cores stop in 0.5 ms, and in
                // 3 ms when weft wakes at every SIGCHLD. Sleep a little per
                // thread still running, then collect them together.
                let base = Duration::from_micros(2 * still as u64).max(Duration::from_micros(20));
                let pause = (base * (1 << idle.min(4))).min(MAX_SLEEP);
                idle += 1;
                std::thread::sleep(pause.min(until.saturating_duration_since(Instant::now())));
            }
        }
    }

    /// How many stops of the world were given up and tried again because a
    /// thread was late to stop (see [`Tracer::stop_all`]).
    pub fn stops_given_up(&self) -> u64 {
        self.stops_given_up
    }

    /// Resumes every stopped thread, delivering signals that arrived while it
    /// was stopped.
    pub fn resume_all(&mut self) -> Result<(), TraceError> {
        let began = Instant::now();
        let stopped: Vec<Tid> = self.threads.keys().copied().collect();
        let resumed = stopped.into_iter().try_for_each(|tid| self.resume(tid));
        self.stop_ended(began.elapsed());
        resumed
    }

    /// Resumes one thread if it is stopped.
    pub fn resume(&mut self, tid: Tid) -> Result<(), TraceError> {
        let Some(thread) = self.threads.get_mut(&tid) else {
            return Ok(());
        };
        let ThreadState::Stopped(stop) = thread.state else {
            return Ok(());
        };
        let mut withheld = std::mem::take(&mut thread.withheld);
        if matches!(stop, Stop::Trap) && withheld.is_empty() {
            restart_wait_ended_by_stop(&self.memory, self.pid, tid);
        }
        let result = match stop {
            Stop::Group(_) => sys::listen(tid).map_err(|e| ("LISTEN", e)),
            Stop::Signal(sig) => sys::cont(tid, sig).map_err(|e| ("CONT", e)),
            Stop::Trap | Stop::Syscall => {
                let first = if withheld.is_empty() {
                    0
                } else {
                    withheld.remove(0)
                };
                sys::cont(tid, first).map_err(|e| ("CONT", e))
            }
        };
        // Further withheld signals are queued again with tgkill: each was
        // sent once and must arrive once.
        for sig in withheld {
            sys::tgkill(self.pid, tid, sig);
        }
        thread.state = ThreadState::Running;
        match result {
            Ok(()) => Ok(()),
            // The thread died while stopped (SIGKILL): its exit event follows.
            Err((_, e)) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
            Err((op, source)) => Err(TraceError::Ptrace { op, tid, source }),
        }
    }

    /// Waits for one event (or until `deadline`) and dispatches it. Threads
    /// that stop are kept stopped when `keep_stopped`, else resumed at once,
    /// except `hold`, which always stays stopped. Returns the thread that
    /// stopped and why, if any did.
    fn wait_and_dispatch(
        &mut self,
        keep_stopped: bool,
        hold: Option<Tid>,
        deadline: Instant,
    ) -> Result<Option<(Tid, Stop)>, TraceError> {
        let (tid, status) = loop {
            // The held thread first, looked up directly (the others are
            // stopped, or their events can wait for the next round).
            if let Some(held) = hold {
                if let Some(event) = self.poll(held)? {
                    break event;
                }
            }
            if let Some(event) = self.poll_any()? {
                break event;
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            // Sleep until a tracee changes state (or a little while, should
            // another thread of ours take the SIGCHLD): never spin.
            sys::wait_for_sigchld((deadline - now).min(MAX_SLEEP));
        };
        self.dispatch(tid, status, keep_stopped, hold)
    }

    /// The next event of any of this tracer's threads. Never
    /// `waitpid(-1)`, which would also take the events of another
    /// [`Tracer`] in this program (another process held at the same time)
    /// and reap the program's own children behind its back: a peek
    /// (`waitid(WNOWAIT)`, one call) says whose event is first, and only an
    /// event of this process's is taken. When the first is someone else's,
    /// each known thread is asked in turn instead, from where the last
    /// round stopped (a thread created meanwhile is known from its parent's
    /// clone event). No thread left means the process has gone.
    fn poll_any(&mut self) -> Result<Option<(Tid, i32)>, TraceError> {
        match sys::peek_any() {
            Ok(None) => return Ok(None),
            Ok(Some(tid))
                if self.threads.contains_key(&tid)
                    || std::path::Path::new(&crate::inspect::procfs::pid_file(
                        self.pid,
                        &format!("task/{tid}"),
                    ))
                    .exists() =>
            {
                return self.poll(tid);
            }
            Err(e) if e.raw_os_error() == Some(libc::ECHILD) => {
                // No child and no tracee at all.
                self.threads.clear();
                if self.exit.is_none() {
                    self.exit = Some(ProcessExit::Code(0));
                }
                return Err(self.exited_error());
            }
            // Someone else's event first (or no waitid peek here).
            Ok(Some(_)) | Err(_) => {}
        }
        let order: Vec<Tid> = self
            .threads
            .range(self.poll_cursor..)
            .chain(self.threads.range(..self.poll_cursor))
            .map(|(&tid, _)| tid)
            .collect();
        for tid in order {
            if let Some(event) = self.poll(tid)? {
                self.poll_cursor = tid.saturating_add(1);
                return Ok(Some(event));
            }
        }
        if self.threads.is_empty() {
            if self.exit.is_none() {
                self.exit = Some(ProcessExit::Code(0));
            }
            return Err(self.exited_error());
        }
        Ok(None)
    }

    /// One `waitpid(who, __WALL | WNOHANG)` for thread `who`. A thread the
    /// kernel does not know as a tracee any more has gone.
    fn poll(&mut self, who: Tid) -> Result<Option<(Tid, i32)>, TraceError> {
        match sys::wait_nohang(who) {
            Ok(event) => Ok(event),
            Err(e) if e.raw_os_error() == Some(libc::ECHILD) => {
                self.threads.remove(&who);
                Ok(None)
            }
            Err(source) => Err(TraceError::Ptrace {
                op: "waitpid",
                tid: who,
                source,
            }),
        }
    }

    fn dispatch(
        &mut self,
        tid: Tid,
        status: i32,
        keep_stopped: bool,
        hold: Option<Tid>,
    ) -> Result<Option<(Tid, Stop)>, TraceError> {
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            self.threads.remove(&tid);
            if tid == self.pid {
                self.exit = Some(if libc::WIFEXITED(status) {
                    ProcessExit::Code(libc::WEXITSTATUS(status))
                } else {
                    ProcessExit::Signal(libc::WTERMSIG(status))
                });
                self.threads.clear();
            }
            return Ok(None);
        }
        if !libc::WIFSTOPPED(status) {
            return Ok(None);
        }
        let sig = libc::WSTOPSIG(status);
        let event = (status >> 16) & 0xff;
        // A new thread's first stop may arrive before its parent's clone event.
        let thread = self.threads.entry(tid).or_insert(Thread {
            state: ThreadState::Running,
            withheld: Vec::new(),
        });
        let stop = match event {
            0 if sig == libc::SIGTRAP | 0x80 => Stop::Syscall,
            0 => Stop::Signal(sig),
            libc::PTRACE_EVENT_CLONE => {
                if let Ok(child) = sys::get_event_msg(tid) {
                    self.threads.entry(child as Tid).or_insert(Thread {
                        state: ThreadState::Running,
                        withheld: Vec::new(),
                    });
                }
                Stop::Trap
            }
            libc::PTRACE_EVENT_EXEC => {
                thread.state = ThreadState::Stopped(Stop::Trap);
                return Err(TraceError::Execed(self.pid));
            }
            libc::PTRACE_EVENT_STOP => match sig {
                libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU => Stop::Group(sig),
                _ => Stop::Trap,
            },
            _ => Stop::Trap,
        };
        let thread = self.threads.get_mut(&tid).expect("inserted above");
        thread.state = ThreadState::Stopped(stop);
        // Right away, not only when resuming: if weft dies while holding
        // the process, the kernel lets the thread go as it is now.
        if event == libc::PTRACE_EVENT_STOP && stop == Stop::Trap && thread.withheld.is_empty() {
            restart_wait_ended_by_stop(&self.memory, self.pid, tid);
        }
        if !keep_stopped && hold != Some(tid) {
            self.resume(tid)?;
        }
        Ok(Some((tid, stop)))
    }

    /// Waits until some thread stops (threads that stop stay stopped) and
    /// says which and why; `None` when `deadline` passed first.
    pub fn wait_for_stop(&mut self, deadline: Instant) -> Result<Option<(Tid, Stop)>, TraceError> {
        loop {
            if self.exit.is_some() {
                return Err(self.exited_error());
            }
            match self.wait_and_dispatch(true, None, deadline)? {
                Some(event) => return Ok(Some(event)),
                None if Instant::now() > deadline => return Ok(None),
                None => {}
            }
        }
    }

    /// Lets the world run until thread `tid` executes `address` (a hardware
    /// breakpoint in that thread only), then stops every thread again.
    /// Returns whether it got there within `timeout`; other threads' stops
    /// and signals are handled as usual meanwhile.
    pub fn run_thread_to(
        &mut self,
        tid: Tid,
        address: u64,
        timeout: Duration,
    ) -> Result<bool, TraceError> {
        let ptrace = |op| move |source| TraceError::Ptrace { op, tid, source };
        sys::set_hw_breakpoint(tid, Some(address)).map_err(ptrace("POKEUSER"))?;
        let deadline = Instant::now() + timeout;
        let mut reached = false;
        let run = (|| -> Result<(), TraceError> {
            self.resume_all()?;
            loop {
                match self.wait_and_dispatch(false, Some(tid), deadline)? {
                    Some((t, stop)) if t == tid => {
                        let at = self.registers(tid)?.rip;
                        if stop == Stop::Signal(libc::SIGTRAP) && at == address {
                            // Our own trap: the target never sees it.
                            self.discard_signal(tid);
                            reached = true;
                            return Ok(());
                        }
                        self.resume(tid)?;
                    }
                    Some(_) => {}
                    None if Instant::now() > deadline => return Ok(()),
                    None => {}
                }
            }
        })();
        let stopped = self.stop_all();
        if self.threads.contains_key(&tid) {
            sys::set_hw_breakpoint(tid, None).map_err(ptrace("POKEUSER"))?;
        }
        run?;
        stopped?;
        Ok(reached)
    }

    /// Drops the signal a stopped thread was about to receive (one weft
    /// caused itself, such as its own breakpoint's `SIGTRAP`).
    pub fn discard_signal(&mut self, tid: Tid) {
        if let Some(thread) = self.threads.get_mut(&tid) {
            if let ThreadState::Stopped(Stop::Signal(_)) = thread.state {
                thread.state = ThreadState::Stopped(Stop::Trap);
            }
        }
    }

    /// Registers of a stopped thread.
    pub fn registers(&self, tid: Tid) -> Result<Registers, TraceError> {
        sys::get_regs(tid).map_err(|source| TraceError::Ptrace {
            op: "GETREGS",
            tid,
            source,
        })
    }

    /// Sets the registers of a stopped thread.
    pub fn set_registers(&self, tid: Tid, regs: &Registers) -> Result<(), TraceError> {
        sys::set_regs(tid, regs).map_err(|source| TraceError::Ptrace {
            op: "SETREGS",
            tid,
            source,
        })
    }

    /// Detaches from every thread, delivering pending signals; the process
    /// runs on as if weft had never been there. Stops the world first if
    /// needed (a thread can only be detached from a ptrace-stop).
    pub fn detach(&mut self) -> Result<(), TraceError> {
        if self.any_running() {
            match self.stop_all() {
                Ok(()) => {}
                Err(TraceError::Exited { .. }) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        let began = Instant::now();
        let mut first_error = None;
        for (&tid, thread) in self.threads.iter_mut() {
            let sig = match thread.state {
                ThreadState::Stopped(Stop::Signal(sig)) => sig,
                _ => 0,
            };
            let mut withheld = std::mem::take(&mut thread.withheld);
            if thread.state == ThreadState::Stopped(Stop::Trap) && withheld.is_empty() {
                restart_wait_ended_by_stop(&self.memory, self.pid, tid);
            }
            let sig = if sig == 0 && !withheld.is_empty() {
                withheld.remove(0)
            } else {
                sig
            };
            if let Err(e) = sys::detach(tid, sig) {
                if e.raw_os_error() != Some(libc::ESRCH) && first_error.is_none() {
                    first_error = Some(TraceError::Ptrace {
                        op: "DETACH",
                        tid,
                        source: e,
                    });
                }
            }
            for sig in withheld {
                sys::tgkill(self.pid, tid, sig);
            }
        }
        self.threads.clear();
        self.stop_ended(began.elapsed());
        first_error.map_or(Ok(()), Err)
    }
}

/// Puts a thread whose endless wait was ended by weft's stop back into it.
///
/// `epoll_wait`, `epoll_pwait`, `epoll_pwait2` and `rt_sigtimedwait` are
/// never restarted by the kernel: interrupted by a stop — weft's
/// `PTRACE_INTERRUPT` — they return `EINTR` to the program even though no
/// signal handler ran (signal(7), "Interruption of system calls ... by stop
/// signals"). A program that does not expect it (nothing happened, for
/// it) might treat it as an error. So a thread stopped right after such a
/// call returned `-EINTR`, with no timeout (the program waits for an
/// event, not for a time, so waiting again from now changes nothing it can
/// see), and no signal pending that should end the wait, is set back onto
/// the `syscall` instruction to make the call again. A wait with a timeout
/// is left with its `EINTR` (making it again would wait longer than asked).
fn restart_wait_ended_by_stop(memory: &ProcessMemory, pid: i32, tid: Tid) {
    let Ok(mut regs) = sys::get_regs(tid) else {
        return;
    };
    let eintr = regs.rax as i64 == -i64::from(libc::EINTR);
    let endless = match regs.orig_rax as i64 {
        // The timeout in milliseconds: negative waits forever.
        libc::SYS_epoll_wait | libc::SYS_epoll_pwait => (regs.r10 as i32) < 0,
        // A NULL timeout waits forever.
        libc::SYS_epoll_pwait2 => regs.r10 == 0,
        libc::SYS_rt_sigtimedwait => regs.rdx == 0,
        _ => false,
    };
    if !eintr || !endless || signal_pending(pid, tid) {
        return;
    }
    // Only onto a `syscall` instruction (0f 05) that is really there.
    let at = regs.rip.wrapping_sub(2);
    let mut insn = [0u8; 2];
    if memory.read(at, &mut insn).is_err() || insn != [0x0f, 0x05] {
        return;
    }
    regs.rip = at;
    regs.rax = regs.orig_rax;
    let _ = sys::set_regs(tid, &regs);
}

/// Whether a signal is pending for `tid` or its whole process (it would end
/// the wait again, and with a handler the program must see its `EINTR`).
fn signal_pending(pid: i32, tid: Tid) -> bool {
    // Unreadable or unparsable counts as pending: then nothing is changed.
    let pending = |path: String, field: &str| {
        let mask = std::fs::read_to_string(path).ok().and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        });
        mask != Some(0)
    };
    pending(
        crate::inspect::procfs::task_file(pid, tid, "status"),
        "SigPnd:",
    ) || pending(crate::inspect::procfs::pid_file(pid, "status"), "ShdPnd:")
}

impl Drop for Tracer {
    fn drop(&mut self) {
        // Never leave the target held, whatever path got us here.
        if !self.threads.is_empty() {
            let _ = self.detach();
        }
    }
}
