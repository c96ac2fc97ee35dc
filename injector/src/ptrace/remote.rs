//! Calling a function inside the target on one of its threads.
//!
//! The thread's registers and its whole XSAVE state are saved, a frame is
//! built below its stack pointer (past the 128-byte red zone) whose return
//! address is 0, the arguments go in the System V registers, and the thread
//! runs until the return to address 0 faults. Then everything is restored
//! exactly, including `orig_rax`: a thread that was interrupted inside a
//! system call has it restarted by the kernel when it resumes, so the target
//! never sees `EINTR` or a shortened sleep.
//!
//! While the call runs, `orig_rax` is -1 so that the kernel's restart logic
//! does not rewind the instruction pointer of the *call*.

use super::{sys, Stop, ThreadState, Tid, TraceError, Tracer};
use std::time::{Duration, Instant};

/// Where the remote function "returns": an address that faults.
const RETURN_ADDRESS: u64 = 0;
/// Below the red zone, with room to spare for a signal frame's alignment.
const STACK_GAP: u64 = 1024;

/// An argument of a remote call.
#[derive(Clone, Debug)]
pub enum RemoteArg {
    /// Passed as is.
    Value(u64),
    /// Copied onto the target thread's stack; its address is passed.
    Bytes(Vec<u8>),
}

/// Signals blocked in the calling thread during a remote call: all but
/// those a fault raises synchronously (SIGSEGV, SIGBUS, SIGILL, SIGFPE,
/// SIGTRAP, which weft must see), the unblockable ones, and glibc's two
/// internal signals (32: thread cancellation, 33: `setxid`, whose sender
/// waits for every thread to answer while holding locks `dlopen` needs).
const ASYNC_SIGNALS: u64 = {
    let mut mask = u64::MAX;
    let keep = [
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGILL,
        libc::SIGFPE,
        libc::SIGTRAP,
        libc::SIGKILL,
        libc::SIGSTOP,
        32,
        33,
    ];
    let mut i = 0;
    while i < keep.len() {
        mask &= !(1u64 << (keep[i] - 1));
        i += 1;
    }
    mask
};

/// What the target's other threads do while a remote call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum World {
    /// They stay stopped: for calls that can take no lock another thread
    /// could hold (bare system calls, the runtime's own code).
    Stopped,
    /// They run, so that a lock one of them holds is released eventually.
    Running,
    /// They stay stopped while the call computes and run while it waits:
    /// weft follows the calling thread's system calls and lets the others
    /// run during any that may wait for another thread (a futex wait, a
    /// sleep, a read of a pipe: anything not on a short list of calls that
    /// cannot), and for the rest of a call that computes for longer than
    /// [`STOPPED_RUN_LIMIT`] (a spin on a lock held by a stopped thread). A
    /// call that meets no held lock then runs alone at full speed instead
    /// of competing for the CPUs with every other thread, and one that
    /// does cannot deadlock.
    WhenWaiting,
}

/// How long a [`World::WhenWaiting`] call may run with the others stopped
/// before they are let run for the rest of it: more than loading weft's
/// runtime takes (the loader ~2 ms; the runtime's constructor sleeps 10 ms
/// to calibrate its clock, and its first perf event costs the kernel up to
/// 12 ms), little next to a spin that waits for a stopped thread forever.
/// Once the others run, the call competes with them for the CPUs: on 2
/// cores with 200 busy threads, it then takes 150-250 ms more.
pub const STOPPED_RUN_LIMIT: Duration = Duration::from_millis(50);

/// System calls that cannot wait for another thread of the process (the
/// calls `dlopen` makes on its way, and ones like them): while the calling
/// thread makes them, the others may stay stopped. A `read` of a pipe
/// could wait for a writer, but the loader only reads regular files; the
/// time limit covers what this list gets wrong.
fn cannot_wait_for_others(nr: u64, args: &[u64; 6]) -> bool {
    const FUTEX_WAKE: u64 = 1;
    const FUTEX_REQUEUE: u64 = 3;
    const FUTEX_CMP_REQUEUE: u64 = 4;
    const FUTEX_WAKE_OP: u64 = 5;
    const FUTEX_UNLOCK_PI: u64 = 7;
    const FUTEX_TRYLOCK_PI: u64 = 8;
    const FUTEX_WAKE_BITSET: u64 = 10;
    const FUTEX_CMD_MASK: u64 = 0x7f; // without PRIVATE and CLOCK_REALTIME
    match nr as i64 {
        libc::SYS_futex => matches!(
            args[1] & FUTEX_CMD_MASK,
            FUTEX_WAKE
                | FUTEX_REQUEUE
                | FUTEX_CMP_REQUEUE
                | FUTEX_WAKE_OP
                | FUTEX_UNLOCK_PI
                | FUTEX_TRYLOCK_PI
                | FUTEX_WAKE_BITSET
        ),
        libc::SYS_read
        | libc::SYS_pread64
        | libc::SYS_open
        | libc::SYS_openat
        | libc::SYS_close
        | libc::SYS_stat
        | libc::SYS_fstat
        | libc::SYS_lstat
        | libc::SYS_newfstatat
        | libc::SYS_statx
        | libc::SYS_lseek
        | libc::SYS_access
        | libc::SYS_faccessat
        | libc::SYS_faccessat2
        | libc::SYS_readlink
        | libc::SYS_readlinkat
        | libc::SYS_getcwd
        | libc::SYS_getdents64
        | libc::SYS_fcntl
        | libc::SYS_mmap
        | libc::SYS_mprotect
        | libc::SYS_munmap
        | libc::SYS_mremap
        | libc::SYS_madvise
        | libc::SYS_mincore
        | libc::SYS_brk
        | libc::SYS_memfd_create
        | libc::SYS_rt_sigaction
        | libc::SYS_rt_sigprocmask
        | libc::SYS_sigaltstack
        | libc::SYS_getpid
        | libc::SYS_gettid
        | libc::SYS_getuid
        | libc::SYS_geteuid
        | libc::SYS_getgid
        | libc::SYS_getegid
        | libc::SYS_uname
        | libc::SYS_sysinfo
        | libc::SYS_getrlimit
        | libc::SYS_prlimit64
        | libc::SYS_prctl
        | libc::SYS_arch_prctl
        | libc::SYS_set_robust_list
        | libc::SYS_rseq
        | libc::SYS_sched_getaffinity
        | libc::SYS_clock_gettime
        | libc::SYS_clock_getres
        | libc::SYS_gettimeofday
        | libc::SYS_getrandom
        | libc::SYS_perf_event_open => true,
        _ => false,
    }
}

/// A function to call in the target.
#[derive(Clone, Debug)]
pub struct RemoteCall {
    /// Address of the function in the target.
    pub function: u64,
    /// Up to six integer or pointer arguments.
    pub args: Vec<RemoteArg>,
    /// Name for messages, e.g. "dlopen".
    pub name: String,
    /// How long to wait before declaring the call hung.
    pub timeout: Duration,
}

impl RemoteCall {
    /// A call of `name` at `function` with a default 10-second timeout.
    pub fn new(name: &str, function: u64, args: Vec<RemoteArg>) -> Self {
        RemoteCall {
            function,
            args,
            name: name.to_string(),
            timeout: Duration::from_secs(10),
        }
    }
}

/// A remote call failed.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// Tracing failed underneath.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// The function crashed (a synchronous signal at a non-return address).
    #[error("remote call of {name} crashed in the target with signal {signal} at {rip:#x}; the thread's registers were restored")]
    Crashed {
        /// The function.
        name: String,
        /// The signal.
        signal: i32,
        /// Where.
        rip: u64,
    },
    /// The function did not return in time (a lock held by a stopped thread?).
    #[error("remote call of {name} did not return within {timeout:?} (the target may hold a lock it needs); it was abandoned and the thread's registers restored")]
    Hung {
        /// The function.
        name: String,
        /// The limit.
        timeout: Duration,
    },
    /// More than six arguments.
    #[error("remote call of {0} has more than six arguments")]
    TooManyArgs(String),
    /// The return stub could not be installed.
    #[error("cannot install weft's remote-call return stub in the target: {0}")]
    Stub(String),
}

/// What the other threads do during a remote call.
struct Others {
    /// They run now.
    run: bool,
    /// They were let run for the system call the calling thread is in, and
    /// are stopped again when it returns.
    for_syscall: bool,
    /// They are left as they are until the call is over ([`World::Stopped`]
    /// and [`World::Running`]; or a [`World::WhenWaiting`] call that ran
    /// too long with them stopped).
    for_good: bool,
    /// When they were last stopped.
    stopped_since: Instant,
}

/// An installed return stub (see `weft_codegen::remote_stub`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct StubInfo {
    entry: u64,
    after_syscall: u64,
    /// Where the stub reads the saved registers (`SAVED_REGISTERS`, rsp,
    /// rip, rflags, signal mask).
    regs_at: u64,
    /// Where it reads the saved XSAVE image and how large one may be; None
    /// for the bootstrap stub, which restores no vector state.
    xsave: Option<(u64, usize)>,
}

/// The registers a thread must resume with when it is put back by user
/// code rather than by the kernel's return from a ptrace-stop: a system call
/// it was interrupted in becomes its restart, as the kernel would have done
/// (`rip` back over the 2-byte `syscall`, `rax` = the call again, or
/// `restart_syscall` for the calls that resume with their remaining time).
pub(crate) fn restart_registers(saved: &sys::Registers) -> sys::Registers {
    const ERESTARTSYS: i64 = 512;
    const ERESTARTNOINTR: i64 = 513;
    const ERESTARTNOHAND: i64 = 514;
    const ERESTART_RESTARTBLOCK: i64 = 516;
    let mut regs = *saved;
    if (saved.orig_rax as i64) >= 0 {
        match -(saved.rax as i64) {
            ERESTARTSYS | ERESTARTNOINTR | ERESTARTNOHAND => {
                regs.rax = saved.orig_rax;
                regs.rip = saved.rip.wrapping_sub(2);
            }
            ERESTART_RESTARTBLOCK => {
                regs.rax = libc::SYS_restart_syscall as u64;
                regs.rip = saved.rip.wrapping_sub(2);
            }
            _ => {}
        }
    }
    regs.orig_rax = u64::MAX;
    regs
}

impl Tracer {
    /// Installs the return stub remote calls come back through (or finds the
    /// one an earlier attach left: at `known`, when the caller remembers
    /// where, else by its magic in the target's mappings), using `mmap` at
    /// `mmap_fn` in the target, called on `tid` under a bootstrap stub in
    /// `cave` (or the classic way, returning to a faulting address, without
    /// one). From then on, a weft killed in the middle of a remote call
    /// leaves the thread to put itself back. Returns the stub's address.
    pub fn install_return_stub(
        &mut self,
        tid: Tid,
        mmap_fn: u64,
        cave: Option<u64>,
        known: Option<u64>,
    ) -> Result<u64, RemoteError> {
        if let Some(stub) = &self.return_stub {
            return Ok(stub.regs_at - weft_codegen::STUB_REGS);
        }
        let save = crate::cpu::vector_save();
        // The stub must hold the thread's whole XSAVE image (11,008 bytes
        // with AVX-512 and AMX tiles): a stub too small for it would leave
        // calls unprotected.
        let image_len = sys::get_xstate(tid)
            .map_err(|source| TraceError::Ptrace {
                op: "GETREGSET",
                tid,
                source,
            })?
            .0
            .len() as u64;
        let size = weft_codegen::stub_size(save, image_len);
        // A stub is a page-aligned mapping of its own size that starts with
        // the magic and records that size.
        let is_stub = |start: u64, len: u64| {
            len >= size
                && self.memory.read_u64(start).ok() == Some(weft_codegen::STUB_MAGIC)
                && self
                    .memory
                    .read_u64(start + weft_codegen::STUB_SIZE_FIELD)
                    .ok()
                    == Some(len)
        };
        let remembered = known.filter(|&at| {
            self.memory
                .read_u64(at + weft_codegen::STUB_SIZE_FIELD)
                .is_ok_and(|len| is_stub(at, len))
        });
        let existing = match remembered {
            Some(at) => Some(at),
            None => crate::inspect::read_maps(self.pid)
                .map_err(|e| RemoteError::Stub(e.to_string()))?
                .into_iter()
                .filter(|m| m.perms.exec && !m.perms.write && m.inode == 0)
                .find(|m| is_stub(m.start, m.len()))
                .map(|m| m.start),
        };
        let address = match existing {
            Some(address) => address,
            None => {
                let prot = (libc::PROT_READ | libc::PROT_EXEC) as u64;
                let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
                let args = [0, size, prot, flags, u64::MAX, 0];
                let call = RemoteCall::new(
                    "mmap",
                    mmap_fn,
                    args.into_iter().map(RemoteArg::Value).collect(),
                );
                let got = self.call_under_bootstrap(tid, &call, cave)?;
                if (got as i64) <= 0 || got % 4096 != 0 {
                    return Err(RemoteError::Stub(format!("mmap returned {got:#x}")));
                }
                got
            }
        };
        let stub = weft_codegen::remote_stub(address, save, size)
            .map_err(|e| RemoteError::Stub(e.to_string()))?;
        self.memory
            .write(address, &stub.bytes)
            .map_err(TraceError::from)?;
        self.return_stub = Some(StubInfo {
            entry: stub.entry,
            after_syscall: stub.after_syscall,
            regs_at: address + weft_codegen::STUB_REGS,
            xsave: Some((
                address + weft_codegen::STUB_XSAVE,
                (size - weft_codegen::STUB_XSAVE) as usize,
            )),
        });
        Ok(address)
    }

    /// Unmaps the return stub ([`Tracer::install_return_stub`]) with a
    /// `munmap` (at `munmap_fn`) made under a bootstrap stub in `cave` (the
    /// stub cannot serve the call that unmaps it), and forgets it: what a
    /// failed first attach takes out with the runtime.
    pub fn remove_return_stub(
        &mut self,
        tid: Tid,
        munmap_fn: u64,
        cave: Option<u64>,
    ) -> Result<(), RemoteError> {
        let Some(stub) = self.return_stub.take() else {
            return Ok(());
        };
        let start = stub.regs_at - weft_codegen::STUB_REGS;
        let size = self
            .memory
            .read_u64(start + weft_codegen::STUB_SIZE_FIELD)
            .map_err(TraceError::from)?;
        let call = RemoteCall::new(
            "munmap",
            munmap_fn,
            vec![RemoteArg::Value(start), RemoteArg::Value(size)],
        );
        let got = self.call_under_bootstrap(tid, &call, cave)?;
        if got != 0 {
            return Err(RemoteError::Stub(format!(
                "munmap of the return stub returned {got:#x}"
            )));
        }
        Ok(())
    }

    /// Makes the call that maps the stub page protected by a bootstrap
    /// stub written into `cave` (unused bytes at the end of an executable
    /// mapping, [`weft_codegen::BOOTSTRAP_LEN`] of them), whose original
    /// bytes are put back afterwards. Without a cave the call returns to a
    /// faulting address, as weft's classic remote calls do, and a weft
    /// killed during it would leave the thread to crash.
    fn call_under_bootstrap(
        &mut self,
        tid: Tid,
        call: &RemoteCall,
        cave: Option<u64>,
    ) -> Result<u64, RemoteError> {
        let Some(cave) = cave else {
            return self.call(tid, call, false);
        };
        let stub =
            weft_codegen::bootstrap_stub(cave).map_err(|e| RemoteError::Stub(e.to_string()))?;
        let original = self
            .memory
            .read_vec(cave, stub.bytes.len())
            .map_err(TraceError::from)?;
        self.memory
            .write(cave, &stub.bytes)
            .map_err(TraceError::from)?;
        self.return_stub = Some(StubInfo {
            entry: stub.entry,
            after_syscall: stub.after_syscall,
            regs_at: cave + weft_codegen::BOOTSTRAP_REGS,
            xsave: None,
        });
        let result = self.call(tid, call, false);
        self.return_stub = None;
        // The bytes were unused, but leave nothing behind.
        self.memory
            .write(cave, &original)
            .map_err(TraceError::from)?;
        result
    }

    /// Fills the stub's data area so that, run without weft, it puts `tid`
    /// back exactly as it was.
    fn fill_stub(
        &self,
        stub: &StubInfo,
        saved: &sys::Registers,
        saved_x: &sys::XState,
        saved_mask: u64,
    ) -> Result<(), TraceError> {
        let r = restart_registers(saved);
        let gprs = [
            r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rdi, r.rbp, r.r8, r.r9, r.r10, r.r11, r.r12,
            r.r13, r.r14, r.r15,
        ];
        let mut data: Vec<u8> = gprs.iter().flat_map(|v| v.to_le_bytes()).collect();
        for v in [r.rsp, r.rip, r.eflags, saved_mask] {
            data.extend_from_slice(&v.to_le_bytes());
        }
        self.memory.write(stub.regs_at, &data)?;
        if let Some((at, _)) = stub.xsave {
            self.memory.write(at, &saved_x.0)?;
        }
        Ok(())
    }

    /// Calls `call` on thread `tid`, which must be stopped, and returns its
    /// `rax`. When `others_run`, every other thread runs meanwhile (so a
    /// lock one of them holds cannot deadlock the call); either way every
    /// thread is stopped again when this returns, and `tid` is exactly as
    /// it was (registers, vector state, pending signal).
    pub fn call(
        &mut self,
        tid: Tid,
        call: &RemoteCall,
        others_run: bool,
    ) -> Result<u64, RemoteError> {
        let world = if others_run {
            World::Running
        } else {
            World::Stopped
        };
        self.call_in(tid, call, world)
    }

    /// [`Tracer::call`], the other threads doing what `world` says
    /// meanwhile.
    pub fn call_in(
        &mut self,
        tid: Tid,
        call: &RemoteCall,
        world: World,
    ) -> Result<u64, RemoteError> {
        // A call made and finished inside one stop of the world is part of
        // that stop's time (`StopTime::remote_calls`).
        let (began, stop) = (Instant::now(), self.stopped_since);
        let result = self.call_in_world(tid, call, world);
        if stop.is_some() && self.stopped_since == stop {
            self.remote_in_stop += began.elapsed();
        }
        result
    }

    fn call_in_world(
        &mut self,
        tid: Tid,
        call: &RemoteCall,
        world: World,
    ) -> Result<u64, RemoteError> {
        if call.args.len() > 6 {
            return Err(RemoteError::TooManyArgs(call.name.clone()));
        }
        let original_state = match self.threads.get(&tid) {
            Some(thread) => thread.state,
            None => return Err(TraceError::NoSuchProcess(tid).into()),
        };
        // Reading changes nothing: an error here needs no restore.
        let regs = self.registers(tid)?;
        let xstate = sys::get_xstate(tid).map_err(|source| TraceError::Ptrace {
            op: "GETREGSET",
            tid,
            source,
        })?;
        let mask = sys::get_sigmask(tid).map_err(|source| TraceError::Ptrace {
            op: "GETSIGMASK",
            tid,
            source,
        })?;
        // From here on every way out, `?` and panics included, goes through
        // the guard, which puts the world and the thread back.
        let guard = CallGuard {
            tracer: self,
            saved: Some(SavedThread {
                tid,
                state: original_state,
                regs,
                xstate,
                mask,
            }),
        };
        let saved_x = &guard.saved.as_ref().expect("set above").xstate;

        // The stub needs the XSAVE image to fit its area; a thread in a
        // group-stop is put back with PTRACE_LISTEN, which only works from
        // the stop the classic way ends in.
        let stub = guard.tracer.return_stub.filter(|s| {
            s.xsave.map_or(true, |(_, room)| saved_x.0.len() <= room)
                && !matches!(original_state, ThreadState::Stopped(Stop::Group(_)))
        });
        if let Some(stub) = &stub {
            guard.tracer.fill_stub(stub, &regs, saved_x, mask)?;
        }
        // Signals for the process go first to its main thread, often the
        // one weft calls on (and with the world stopped, to the only one
        // running): a storm of them keeps it in signal-delivery stops and
        // the call never progresses. Block the asynchronous ones for the
        // call; they stay pending and are delivered once the mask is back.
        // The stub restores the mask itself if weft dies meanwhile. (The
        // very first call, which maps the stub, has no such net: a weft
        // killed then leaves the thread to fault on its return address
        // anyway.)
        sys::set_sigmask(tid, mask | ASYNC_SIGNALS).map_err(|source| TraceError::Ptrace {
            op: "SETSIGMASK",
            tid,
            source,
        })?;
        let result = guard
            .tracer
            .run_call(tid, call, &regs, world, stub.as_ref());
        // A failure to put things back outweighs the call's own result.
        guard.finish()?;
        result
    }

    /// Puts the world and `saved.tid` back as they were before a remote
    /// call: stops every thread, stops the calling thread if the call was
    /// abandoned while it ran, and restores its registers, vector state,
    /// signal mask and stop. Every step is tried even when an earlier one
    /// fails; the first error is returned.
    fn restore_after_call(&mut self, saved: &SavedThread) -> Result<(), TraceError> {
        let tid = saved.tid;
        let mut first = Ok(());
        let mut keep = |r: Result<(), TraceError>| {
            if first.is_ok() {
                first = r;
            }
        };
        if self.any_running() {
            keep(self.stop_all());
        }
        if !self.threads.contains_key(&tid) {
            return first;
        }
        // Stop the thread itself if the call was abandoned while running.
        if self
            .threads
            .get(&tid)
            .is_some_and(|t| t.state == ThreadState::Running)
        {
            let _ = sys::interrupt(tid);
            let deadline = Instant::now() + Duration::from_secs(2);
            while self
                .threads
                .get(&tid)
                .is_some_and(|t| t.state == ThreadState::Running)
                && Instant::now() < deadline
            {
                if let Err(e) = self.wait_and_dispatch(true, Some(tid), deadline) {
                    keep(Err(e));
                    break;
                }
            }
        }
        // From a signal or interrupt stop the kernel's own restart logic
        // runs when the thread resumes; from a system-call stop (the stub's
        // `getpid`, or one inside an abandoned call) it does not, so the
        // restart is done here and that system call skipped.
        let at_syscall = matches!(self.stop_of(tid), Some(Stop::Syscall));
        let regs = if at_syscall {
            restart_registers(&saved.regs)
        } else {
            saved.regs
        };
        keep(self.set_registers(tid, &regs));
        keep(
            sys::set_xstate(tid, &saved.xstate).map_err(|source| TraceError::Ptrace {
                op: "SETREGSET",
                tid,
                source,
            }),
        );
        keep(
            sys::set_sigmask(tid, saved.mask).map_err(|source| TraceError::Ptrace {
                op: "SETSIGMASK",
                tid,
                source,
            }),
        );
        if let Some(thread) = self.threads.get_mut(&tid) {
            thread.state = saved.state;
        }
        first
    }

    /// Calls `call` on thread `tid` (its registers `saved`), the other
    /// threads as `world` says, returning through `stub` if there is one
    /// (else to a fault at [`RETURN_ADDRESS`]); the call's result.
    fn run_call(
        &mut self,
        tid: Tid,
        call: &RemoteCall,
        saved: &sys::Registers,
        world: World,
        stub: Option<&StubInfo>,
    ) -> Result<u64, RemoteError> {
        let return_address = stub.map_or(RETURN_ADDRESS, |s| s.entry);
        self.set_up_call(tid, call, saved, return_address)?;
        let (others, follow_syscalls) = self.start_call(tid, world, stub)?;
        self.wait_for_return(tid, call, stub, others, follow_syscalls)
    }

    /// Puts `call`'s arguments (bytes below the red zone) and
    /// `return_address` on thread `tid`'s stack and its registers at the
    /// call's first instruction, per the System V ABI.
    fn set_up_call(
        &mut self,
        tid: Tid,
        call: &RemoteCall,
        saved: &sys::Registers,
        return_address: u64,
    ) -> Result<(), RemoteError> {
        let mut sp = (saved.rsp - STACK_GAP) & !15;
        let mut values = Vec::with_capacity(call.args.len());
        for arg in &call.args {
            match arg {
                RemoteArg::Value(v) => values.push(*v),
                RemoteArg::Bytes(bytes) => {
                    sp = (sp - bytes.len() as u64) & !15;
                    self.memory.write(sp, bytes).map_err(TraceError::from)?;
                    values.push(sp);
                }
            }
        }
        // At a function's first instruction (rsp + 8) is 16-byte aligned.
        sp -= 8;
        self.memory
            .write(sp, &return_address.to_le_bytes())
            .map_err(TraceError::from)?;

        let mut regs = *saved;
        regs.rip = call.function;
        regs.rsp = sp;
        regs.rax = 0; // no vector registers for a variadic callee
        regs.orig_rax = u64::MAX; // not in a system call: no restart games
        regs.eflags &= !0x400; // the ABI requires DF clear
        let slots = [
            &mut regs.rdi,
            &mut regs.rsi,
            &mut regs.rdx,
            &mut regs.rcx,
            &mut regs.r8,
            &mut regs.r9,
        ];
        for (slot, value) in slots.into_iter().zip(values) {
            *slot = value;
        }
        self.set_registers(tid, &regs)?;
        Ok(())
    }

    /// Lets thread `tid` run the call set up, the others running or not
    /// as `world` says; the others' state and whether system-call stops
    /// are followed.
    fn start_call(
        &mut self,
        tid: Tid,
        world: World,
        stub: Option<&StubInfo>,
    ) -> Result<(Others, bool), RemoteError> {
        // A signal the thread was stopped for waits until the call is over:
        // `call` puts the thread back in that very stop afterwards, and it is
        // delivered when the thread resumes (not also withheld: that
        // delivered it twice).
        if let Some(thread) = self.threads.get_mut(&tid) {
            if let ThreadState::Stopped(Stop::Signal(_)) = thread.state {
                thread.state = ThreadState::Stopped(Stop::Trap);
            }
        }
        let others = Others {
            run: world == World::Running,
            for_syscall: false,
            for_good: world != World::WhenWaiting,
            stopped_since: Instant::now(),
        };
        if others.run {
            self.resume_others(tid)?;
        }
        let follow_syscalls = stub.is_some() || world == World::WhenWaiting;
        self.cont_held(tid, follow_syscalls)?;
        // Fault injection for tests: hold weft here while the call runs, so
        // a test can kill weft in the middle of a remote call. Debug builds
        // only (what `cargo test` runs): a release weft takes no
        // instructions from its environment.
        #[cfg(debug_assertions)]
        if let Some(ms) = std::env::var_os("WEFT_TEST_REMOTE_CALL_DELAY_MS") {
            let ms = ms.to_str().and_then(|s| s.parse().ok()).unwrap_or(0);
            std::thread::sleep(Duration::from_millis(ms));
        }
        Ok((others, follow_syscalls))
    }

    /// Waits for the call on thread `tid` to return (its result), crash,
    /// or outlast its timeout, dispatching the stops on the way; lets the
    /// others run if it seems to wait for one of them.
    fn wait_for_return(
        &mut self,
        tid: Tid,
        call: &RemoteCall,
        stub: Option<&StubInfo>,
        mut others: Others,
        follow_syscalls: bool,
    ) -> Result<u64, RemoteError> {
        let deadline = Instant::now() + call.timeout;
        loop {
            let watch_progress = !others.run && !others.for_good;
            let until = if watch_progress {
                deadline.min(others.stopped_since + STOPPED_RUN_LIMIT)
            } else {
                deadline
            };
            let event = self.wait_and_dispatch(!others.run, Some(tid), until)?;
            if !self.threads.contains_key(&tid) {
                return Err(self.exited_error().into());
            }
            match event {
                Some((t, stop)) if t == tid => {
                    let regs = self.registers(tid)?;
                    match stop {
                        Stop::Signal(libc::SIGSEGV)
                            if stub.is_none() && regs.rip == RETURN_ADDRESS =>
                        {
                            return Ok(regs.rax)
                        }
                        Stop::Syscall => match stub {
                            // The stub's `getpid` entry: the call's result is
                            // in rdi; weft puts the thread back itself.
                            Some(s)
                                if regs.rip == s.after_syscall
                                    && regs.orig_rax == weft_codegen::STUB_SYSCALL =>
                            {
                                return Ok(regs.rdi)
                            }
                            _ => {
                                if !others.for_good {
                                    self.others_at_syscall(tid, &mut others)?;
                                }
                                self.cont_held(tid, follow_syscalls)?
                            }
                        },
                        Stop::Signal(
                            sig @ (libc::SIGSEGV
                            | libc::SIGBUS
                            | libc::SIGILL
                            | libc::SIGFPE
                            | libc::SIGTRAP),
                        ) => {
                            return Err(RemoteError::Crashed {
                                name: call.name.clone(),
                                signal: sig,
                                rip: regs.rip,
                            });
                        }
                        Stop::Signal(sig) => {
                            // Asynchronous: deliver after the call.
                            if let Some(thread) = self.threads.get_mut(&tid) {
                                thread.withheld.push(sig);
                                thread.state = ThreadState::Stopped(Stop::Trap);
                            }
                            self.cont_held(tid, follow_syscalls)?;
                        }
                        Stop::Trap => self.cont_held(tid, follow_syscalls)?,
                        Stop::Group(_) => {
                            // The process was stopped by job control in the
                            // middle of our call: let the call finish anyway;
                            // the group-stop is re-established by LISTEN
                            // when the original state is restored.
                            self.cont_held(tid, follow_syscalls)?;
                        }
                    }
                }
                Some(_) => {}
                None if Instant::now() > deadline => {
                    return Err(RemoteError::Hung {
                        name: call.name.clone(),
                        timeout: call.timeout,
                    });
                }
                None if watch_progress && others.stopped_since.elapsed() >= STOPPED_RUN_LIMIT => {
                    // Still running after the limit: perhaps spinning on a
                    // lock a stopped thread holds. Let them all run.
                    self.resume_others(tid)?;
                    others.run = true;
                    others.for_good = true;
                }
                None => {}
            }
        }
    }

    /// [`World::WhenWaiting`]: the calling thread `tid` is at a system-call
    /// stop. Lets the others run for a system call that may wait for one of
    /// them, and stops them again when it returns.
    fn others_at_syscall(&mut self, tid: Tid, others: &mut Others) -> Result<(), TraceError> {
        match sys::syscall_stop(tid) {
            Ok(sys::SyscallStop::Entry { nr, args }) if !others.run => {
                let budget = (others.stopped_since + STOPPED_RUN_LIMIT)
                    .saturating_duration_since(Instant::now());
                if !cannot_wait_for_others(nr, &args) && !self.sleeps_within(nr, &args, budget) {
                    self.resume_others(tid)?;
                    others.run = true;
                    others.for_syscall = true;
                }
            }
            Ok(sys::SyscallStop::Exit) if others.for_syscall => {
                // Back from its wait: the call computes again, alone.
                self.stop_all()?;
                others.run = false;
                others.for_syscall = false;
                others.stopped_since = Instant::now();
            }
            Ok(_) => {}
            // Cannot tell: let the others run for the rest of the call.
            Err(_) => {
                if !others.run {
                    self.resume_others(tid)?;
                    others.run = true;
                }
                others.for_good = true;
            }
        }
        Ok(())
    }

    /// Whether system call `nr` is a sleep for a set time of at most
    /// `budget`: it waits for no other thread, so the others may stay
    /// stopped meanwhile (the runtime's constructor sleeps 10 ms to
    /// calibrate its clock; the whole load would otherwise wait for the
    /// CPU behind every thread let run, hundreds of milliseconds on a busy
    /// target).
    fn sleeps_within(&self, nr: u64, args: &[u64; 6], budget: Duration) -> bool {
        const TIMER_ABSTIME: u64 = 1;
        let request = match nr as i64 {
            libc::SYS_nanosleep => args[0],
            // Wall-clock time only: a CPU-time clock would not advance
            // with the process stopped.
            libc::SYS_clock_nanosleep
                if args[1] & TIMER_ABSTIME == 0
                    && matches!(
                        args[0] as i32,
                        libc::CLOCK_REALTIME | libc::CLOCK_MONOTONIC | libc::CLOCK_BOOTTIME
                    ) =>
            {
                args[2]
            }
            _ => return false,
        };
        let mut ts = [0u8; 16];
        if self.memory.read(request, &mut ts).is_err() {
            return false;
        }
        let secs = i64::from_le_bytes(ts[..8].try_into().expect("8 bytes"));
        let nanos = i64::from_le_bytes(ts[8..].try_into().expect("8 bytes"));
        (0..1_000_000_000).contains(&nanos)
            && u64::try_from(secs).is_ok_and(|s| Duration::new(s, nanos as u32) <= budget)
    }

    /// Resumes every thread but `tid`.
    fn resume_others(&mut self, tid: Tid) -> Result<(), TraceError> {
        let began = std::time::Instant::now();
        let others: Vec<Tid> = self.threads.keys().copied().filter(|&t| t != tid).collect();
        let resumed = others.into_iter().try_for_each(|other| self.resume(other));
        self.stop_ended(began.elapsed());
        resumed
    }

    /// Continues the held thread without delivering anything, stopping at
    /// its system calls when `follow_syscalls`.
    fn cont_held(&mut self, tid: Tid, follow_syscalls: bool) -> Result<(), TraceError> {
        let resumed = if follow_syscalls {
            sys::cont_syscall(tid, 0)
        } else {
            sys::cont(tid, 0)
        };
        resumed.map_err(|source| TraceError::Ptrace {
            op: if follow_syscalls { "SYSCALL" } else { "CONT" },
            tid,
            source,
        })?;
        if let Some(thread) = self.threads.get_mut(&tid) {
            thread.state = ThreadState::Running;
        }
        Ok(())
    }
}
/// What a remote call changes in its thread, saved before the call.
struct SavedThread {
    tid: Tid,
    state: ThreadState,
    regs: sys::Registers,
    xstate: sys::XState,
    mask: u64,
}

/// Puts the world and the calling thread back as they were when the call
/// is finished or, on any early return or panic, when dropped (as rr's
/// `AutoRemoteSyscalls` does): a `?` between changing the thread and
/// restoring it must not leave it running weft's call frame.
struct CallGuard<'a> {
    tracer: &'a mut Tracer,
    /// `None` once restored.
    saved: Option<SavedThread>,
}

impl CallGuard<'_> {
    /// Restores now and says whether that worked.
    fn finish(mut self) -> Result<(), TraceError> {
        match self.saved.take() {
            Some(saved) => self.tracer.restore_after_call(&saved),
            None => Ok(()),
        }
    }
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        if let Some(saved) = self.saved.take() {
            // Already on an error path: that error is the one reported.
            let _ = self.tracer.restore_after_call(&saved);
        }
    }
}
