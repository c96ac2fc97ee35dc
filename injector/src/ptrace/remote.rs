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
}

impl Tracer {
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
        if call.args.len() > 6 {
            return Err(RemoteError::TooManyArgs(call.name.clone()));
        }
        let original_state = match self.threads.get(&tid) {
            Some(thread) => thread.state,
            None => return Err(TraceError::NoSuchProcess(tid).into()),
        };
        let saved = self.registers(tid)?;
        let saved_x = sys::get_xstate(tid).map_err(|source| TraceError::Ptrace {
            op: "GETREGSET",
            tid,
            source,
        })?;

        let result = self.run_call(tid, call, &saved, others_run);

        // Whatever happened, put the world and the thread back as they were.
        let stopped = if others_run { self.stop_all() } else { Ok(()) };
        if self.threads.contains_key(&tid) {
            // Stop the thread itself if the call was abandoned while running.
            if let Some(thread) = self.threads.get(&tid) {
                if thread.state == ThreadState::Running {
                    let _ = sys::interrupt(tid);
                    let deadline = Instant::now() + Duration::from_secs(2);
                    while self
                        .threads
                        .get(&tid)
                        .is_some_and(|t| t.state == ThreadState::Running)
                        && Instant::now() < deadline
                    {
                        self.wait_and_dispatch(true, Some(tid), deadline)?;
                    }
                }
            }
            self.set_registers(tid, &saved)?;
            sys::set_xstate(tid, &saved_x).map_err(|source| TraceError::Ptrace {
                op: "SETREGSET",
                tid,
                source,
            })?;
            if let Some(thread) = self.threads.get_mut(&tid) {
                thread.state = original_state;
            }
        }
        stopped?;
        result
    }

    fn run_call(
        &mut self,
        tid: Tid,
        call: &RemoteCall,
        saved: &sys::Registers,
        others_run: bool,
    ) -> Result<u64, RemoteError> {
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
            .write(sp, &RETURN_ADDRESS.to_le_bytes())
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

        // A signal pending for this thread waits until the call is over.
        if let Some(thread) = self.threads.get_mut(&tid) {
            if let ThreadState::Stopped(Stop::Signal(sig)) = thread.state {
                thread.withheld.push(sig);
                thread.state = ThreadState::Stopped(Stop::Trap);
            }
        }
        if others_run {
            let others: Vec<Tid> = self.threads.keys().copied().filter(|&t| t != tid).collect();
            for other in others {
                self.resume(other)?;
            }
        }
        self.cont_held(tid)?;

        let deadline = Instant::now() + call.timeout;
        loop {
            let event = self.wait_and_dispatch(!others_run, Some(tid), deadline)?;
            if !self.threads.contains_key(&tid) {
                return Err(self.exited_error().into());
            }
            match event {
                Some((t, stop)) if t == tid => {
                    let regs = self.registers(tid)?;
                    match stop {
                        Stop::Signal(libc::SIGSEGV) if regs.rip == RETURN_ADDRESS => {
                            return Ok(regs.rax)
                        }
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
                            self.cont_held(tid)?;
                        }
                        Stop::Trap => self.cont_held(tid)?,
                        Stop::Group(_) => {
                            // The process was stopped by job control in the
                            // middle of our call: let the call finish anyway;
                            // the group-stop is re-established by LISTEN
                            // when the original state is restored.
                            self.cont_held(tid)?;
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
                None => {}
            }
        }
    }

    /// Continues the held thread without delivering anything.
    fn cont_held(&mut self, tid: Tid) -> Result<(), TraceError> {
        sys::cont(tid, 0).map_err(|source| TraceError::Ptrace {
            op: "CONT",
            tid,
            source,
        })?;
        if let Some(thread) = self.threads.get_mut(&tid) {
            thread.state = ThreadState::Running;
        }
        Ok(())
    }
}
