//! Thin, typed wrappers over the raw ptrace and wait system calls. Raw
//! signal numbers are used throughout: real-time signals must be forwarded
//! too, and they have no `nix::Signal` variant.

use std::io;

/// General-purpose registers of a stopped thread (`struct user_regs_struct`).
pub type Registers = libc::user_regs_struct;

/// The full extended (XSAVE) state of a thread, as `PTRACE_GETREGSET
/// NT_X86_XSTATE` returns it: enough to restore vector registers exactly.
#[derive(Clone)]
pub struct XState(pub Vec<u8>);

impl std::fmt::Debug for XState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "XState({} bytes)", self.0.len())
    }
}

const NT_X86_XSTATE: libc::c_int = 0x202;
/// Larger than any XSAVE area short of AMX tiles (about 2.7 KiB with AVX-512).
const XSTATE_MAX: usize = 16 * 1024;

fn check(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn request(req: libc::c_uint, tid: i32, addr: usize, data: usize) -> io::Result<libc::c_long> {
    // SAFETY: `request` is private to this module, and each caller here
    // passes for `req` either plain integers or a pointer to a live buffer
    // of the size the kernel reads or writes for it: GETREGS/SETREGS a
    // `user_regs_struct`, GETREGSET/SETREGSET an iovec over the XSAVE
    // buffer, GET/SETSIGMASK 8 bytes (the size passed as `addr`),
    // GET_SYSCALL_INFO the 96-byte array whose size is passed,
    // GETEVENTMSG an unsigned long.
    check(unsafe {
        libc::ptrace(
            req,
            tid,
            addr as *mut libc::c_void,
            data as *mut libc::c_void,
        )
    })
}

pub(super) fn seize(tid: i32, options: i64) -> io::Result<()> {
    request(libc::PTRACE_SEIZE, tid, 0, options as usize).map(drop)
}

pub(super) fn interrupt(tid: i32) -> io::Result<()> {
    request(libc::PTRACE_INTERRUPT, tid, 0, 0).map(drop)
}

pub(super) fn cont(tid: i32, sig: i32) -> io::Result<()> {
    request(libc::PTRACE_CONT, tid, 0, sig as usize).map(drop)
}

pub(super) fn cont_syscall(tid: i32, sig: i32) -> io::Result<()> {
    request(libc::PTRACE_SYSCALL, tid, 0, sig as usize).map(drop)
}

pub(super) fn listen(tid: i32) -> io::Result<()> {
    request(libc::PTRACE_LISTEN, tid, 0, 0).map(drop)
}

pub(super) fn detach(tid: i32, sig: i32) -> io::Result<()> {
    request(libc::PTRACE_DETACH, tid, 0, sig as usize).map(drop)
}

pub(super) fn get_event_msg(tid: i32) -> io::Result<u64> {
    let mut msg: libc::c_ulong = 0;
    request(
        libc::PTRACE_GETEVENTMSG,
        tid,
        0,
        &mut msg as *mut _ as usize,
    )?;
    Ok(msg)
}

pub(super) fn get_regs(tid: i32) -> io::Result<Registers> {
    // SAFETY: user_regs_struct is plain integers; all-zero is valid.
    let mut regs: Registers = unsafe { std::mem::zeroed() };
    request(libc::PTRACE_GETREGS, tid, 0, &mut regs as *mut _ as usize)?;
    Ok(regs)
}

pub(super) fn set_regs(tid: i32, regs: &Registers) -> io::Result<()> {
    request(libc::PTRACE_SETREGS, tid, 0, regs as *const _ as usize).map(drop)
}

pub(super) fn get_xstate(tid: i32) -> io::Result<XState> {
    let mut buf = vec![0u8; XSTATE_MAX];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    request(
        libc::PTRACE_GETREGSET,
        tid,
        NT_X86_XSTATE as usize,
        &mut iov as *mut _ as usize,
    )?;
    buf.truncate(iov.iov_len);
    Ok(XState(buf))
}

pub(super) fn set_xstate(tid: i32, state: &XState) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: state.0.as_ptr() as *mut _,
        iov_len: state.0.len(),
    };
    request(
        libc::PTRACE_SETREGSET,
        tid,
        NT_X86_XSTATE as usize,
        &mut iov as *mut _ as usize,
    )
    .map(drop)
}

/// `offsetof(struct user, u_debugreg)` on x86-64.
const DEBUGREG_OFFSET: usize = 848;

/// Sets (Some) or clears (None) an execute breakpoint in the thread's debug
/// register DR0: only that thread traps there, with SIGTRAP.
pub(super) fn set_hw_breakpoint(tid: i32, address: Option<u64>) -> io::Result<()> {
    let dr7 = DEBUGREG_OFFSET + 7 * 8;
    match address {
        Some(at) => {
            request(libc::PTRACE_POKEUSER, tid, DEBUGREG_OFFSET, at as usize)?;
            // L0 enable, RW0 = 00 (execute), LEN0 = 00.
            request(libc::PTRACE_POKEUSER, tid, dr7, 1).map(drop)
        }
        None => request(libc::PTRACE_POKEUSER, tid, dr7, 0).map(drop),
    }
}

/// The thread's blocked-signal mask (`PTRACE_GETSIGMASK`, bit `n - 1` for
/// signal `n`).
pub(super) fn get_sigmask(tid: i32) -> io::Result<u64> {
    let mut mask = 0u64;
    request(
        libc::PTRACE_GETSIGMASK,
        tid,
        std::mem::size_of::<u64>(),
        &mut mask as *mut u64 as usize,
    )?;
    Ok(mask)
}

/// Sets the thread's blocked-signal mask (`PTRACE_SETSIGMASK`).
pub(super) fn set_sigmask(tid: i32, mask: u64) -> io::Result<()> {
    request(
        libc::PTRACE_SETSIGMASK,
        tid,
        std::mem::size_of::<u64>(),
        &mask as *const u64 as usize,
    )
    .map(drop)
}

/// What a thread in a system-call stop is doing (`PTRACE_GET_SYSCALL_INFO`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SyscallStop {
    /// Entering system call `nr` with these arguments.
    Entry { nr: u64, args: [u64; 6] },
    /// Leaving a system call.
    Exit,
    /// Neither (or the kernel cannot tell).
    Other,
}

/// Which side of a system call a thread in a system-call stop is on.
pub(super) fn syscall_stop(tid: i32) -> io::Result<SyscallStop> {
    // struct ptrace_syscall_info: op (u8) at 0, then arch, instruction and
    // stack pointer; for an entry, nr at byte 24 and six arguments after it.
    let mut info = [0u64; 12];
    request(
        libc::PTRACE_GET_SYSCALL_INFO,
        tid,
        std::mem::size_of_val(&info),
        info.as_mut_ptr() as usize,
    )?;
    Ok(match (info[0] & 0xff) as u8 {
        libc::PTRACE_SYSCALL_INFO_ENTRY => {
            let mut args = [0u64; 6];
            args.copy_from_slice(&info[4..10]);
            SyscallStop::Entry { nr: info[3], args }
        }
        libc::PTRACE_SYSCALL_INFO_EXIT => SyscallStop::Exit,
        _ => SyscallStop::Other,
    })
}

/// `waitpid(pid, __WALL | WNOHANG)` (`pid` -1 for any tracee): `Ok(None)`
/// when nothing is pending. For one thread the kernel looks it up directly
/// instead of scanning every tracee, as `-1` does.
pub(super) fn wait_nohang(pid: i32) -> io::Result<Option<(i32, i32)>> {
    let mut status = 0;
    // SAFETY: `status` is a valid out-pointer.
    let pid = unsafe { libc::waitpid(pid, &mut status, libc::__WALL | libc::WNOHANG) };
    match pid {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(None),
        pid => Ok(Some((pid, status))),
    }
}

/// `waitid(P_ALL, __WALL | WEXITED | WSTOPPED | WNOHANG | WNOWAIT)`: the
/// id of some child or tracee of this process with an event pending,
/// without taking the event (`Ok(None)`: none pending). One call, however
/// many tracees: the kernel scans them itself.
pub(super) fn peek_any() -> io::Result<Option<i32>> {
    // SAFETY: an all-zero siginfo_t is a valid value (si_pid 0: nothing).
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::__WALL | libc::WEXITED | libc::WSTOPPED | libc::WNOHANG | libc::WNOWAIT;
    // SAFETY: `info` is a valid out-pointer; P_ALL ignores the id.
    if unsafe { libc::waitid(libc::P_ALL, 0, &mut info, flags) } == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: waitid filled a SIGCHLD siginfo (or left it zeroed).
    let pid = unsafe { info.si_pid() };
    Ok((pid != 0).then_some(pid))
}

fn sigchld_set() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set it is given.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        set
    }
}

/// Blocks `SIGCHLD` in the calling thread while it exists (restoring it
/// afterwards if it was not blocked before), so that [`wait_for_sigchld`]
/// can sleep until a tracee changes state instead of polling.
#[derive(Debug)]
pub(super) struct SigchldBlocked {
    was_blocked: bool,
}

impl SigchldBlocked {
    pub(super) fn new() -> SigchldBlocked {
        let set = sigchld_set();
        // SAFETY: valid sigset pointers; only this thread's mask changes.
        let was_blocked = unsafe {
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            libc::sigismember(&old, libc::SIGCHLD) == 1
        };
        SigchldBlocked { was_blocked }
    }
}

impl Drop for SigchldBlocked {
    fn drop(&mut self) {
        if !self.was_blocked {
            let set = sigchld_set();
            // SAFETY: valid sigset pointer; only this thread's mask changes.
            // A SIGCHLD still pending is delivered as usual.
            unsafe {
                libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            }
        }
    }
}

/// Sleeps until a `SIGCHLD` arrives (the kernel sends one to the tracer at
/// every stop and exit of a tracee) or `timeout` passes, and consumes it.
/// Only a hint that `waitpid` may have news: another thread of this
/// process may take the signal, so callers bound the timeout and poll.
pub(super) fn wait_for_sigchld(timeout: std::time::Duration) {
    let set = sigchld_set();
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: valid set and timespec pointers; a null siginfo is allowed.
    // EAGAIN (timeout) and EINTR are both fine: the caller polls again.
    unsafe {
        libc::sigtimedwait(&set, std::ptr::null_mut(), &ts);
    }
}

/// Queues `sig` for thread `tid` of process `pid` again; errors are
/// ignored because the thread may have exited meanwhile.
pub(super) fn tgkill(pid: i32, tid: i32, sig: i32) {
    // SAFETY: tgkill has no memory arguments.
    unsafe {
        libc::syscall(libc::SYS_tgkill, pid, tid, sig);
    }
}
