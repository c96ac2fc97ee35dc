//! Starting a program under weft, stopped at its entry point.
//!
//! The child blocks on a pipe until weft has seized it, then `exec`s; weft
//! sees the `exec` stop, puts a one-byte `int3` on the entry point (read
//! from the auxiliary vector), lets the dynamic loader run, and takes the
//! breakpoint: all shared libraries are loaded and initialised, `main` and
//! the executable's constructors have not run. The `int3` is removed and the
//! instruction pointer moved back before anything else happens.

use crate::ptrace::{ProcessExit, Tracer};
use crate::Error;
use std::ffi::CString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::time::{Duration, Instant};

const AT_ENTRY: u64 = 9;

fn launch_error(program: &str, source: std::io::Error) -> Error {
    Error::Launch {
        program: program.to_string(),
        source,
    }
}

/// Where `execvp` would find `program`: itself if it has a `/`, else the
/// first executable file of that name in `PATH` (`/bin:/usr/bin` when
/// unset, as glibc's). Resolved before the fork, so that the child needs
/// nothing but `execve`.
fn resolve_program(program: &str) -> Result<std::path::PathBuf, Error> {
    use std::os::unix::fs::PermissionsExt;
    if program.is_empty() {
        return Err(launch_error(program, std::io::ErrorKind::NotFound.into()));
    }
    if program.contains('/') {
        return Ok(program.into());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/bin:/usr/bin".into());
    std::env::split_paths(&path)
        .map(|dir| {
            if dir.as_os_str().is_empty() {
                // An empty PATH entry is the current directory.
                std::path::Path::new(".").join(program)
            } else {
                dir.join(program)
            }
        })
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .ok_or_else(|| {
            launch_error(
                program,
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "not found in PATH (give a path, e.g. ./prog)",
                ),
            )
        })
}

/// Refuses a statically linked executable before it is started: weft loads
/// its runtime with the program's dynamic loader, which such a program
/// does not have, and started anyway it would run before weft could stop
/// it. An ELF file without `PT_INTERP` (static, or static-pie) is static;
/// anything else (a script) is left to the check at the entry point.
fn refuse_static(program: &str, path: &std::path::Path) -> Result<(), Error> {
    match crate::inspect::ElfImage::open(path) {
        Ok(elf) if !elf.header().has_interp() => Err(Error::StaticProgram {
            program: program.to_string(),
        }),
        _ => Ok(()),
    }
}

/// Kills the program `spawn_stopped_at_entry` started (before any of its
/// own code ran) and reaps it, so that nothing is left running when weft
/// gives up on it.
pub fn kill_stopped(pid: i32, mut tracer: Tracer) {
    kill_traced(pid, &mut tracer);
}

/// [`kill_stopped`] for a tracer that is not ours to drop (a `Held`'s).
pub(crate) fn kill_traced(pid: i32, tracer: &mut Tracer) {
    // SAFETY: kill has no memory effects; `pid` is our own child, stopped
    // and not yet reaped, so the PID cannot have been reused.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let _ = tracer.detach();
    reap(pid);
}

/// Forks and execs `program` (searched in `PATH`) with `args`, seized by
/// ptrace and stopped at its entry point. A statically linked program is
/// refused before it starts ([`Error::StaticProgram`]).
///
/// A script (`#!`) and a program named through an exec wrapper (`env`,
/// `nice`, `taskset`…) are followed through the interpreters and wrappers
/// that `exec` the program the user means ([`follow_launchers`]); the
/// executables passed through are returned, in order (empty when the
/// program itself was stopped).
pub fn spawn_stopped_at_entry(
    program: &str,
    args: &[String],
) -> Result<(i32, Tracer, Vec<String>), Error> {
    let invalid = || launch_error(program, std::io::ErrorKind::InvalidInput.into());
    let path = resolve_program(program)?;
    refuse_static(program, &path)?;
    // Everything the child needs is allocated here: between fork and exec
    // the child may only make async-signal-safe calls (another thread may
    // have held the allocator's lock at the fork).
    let c_path = CString::new(path.into_os_string().into_vec()).map_err(|_| invalid())?;
    let mut c_args = vec![CString::new(program).map_err(|_| invalid())?];
    for a in args {
        c_args.push(CString::new(a.as_str()).map_err(|_| invalid())?);
    }
    let mut argv: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let c_env: Vec<CString> = std::env::vars_os()
        .filter_map(|(k, v)| {
            let mut kv = k.into_vec();
            kv.push(b'=');
            kv.extend(v.into_vec());
            CString::new(kv).ok()
        })
        .collect();
    let mut envp: Vec<*const libc::c_char> = c_env.iter().map(|a| a.as_ptr()).collect();
    envp.push(std::ptr::null());

    let mut go = [0i32; 2];
    let mut report = [0i32; 2];
    // SAFETY: pipe2 writes two descriptors into each array.
    unsafe {
        if libc::pipe2(go.as_mut_ptr(), libc::O_CLOEXEC) != 0
            || libc::pipe2(report.as_mut_ptr(), libc::O_CLOEXEC) != 0
        {
            return Err(launch_error(program, std::io::Error::last_os_error()));
        }
    }
    // SAFETY: the child only makes async-signal-safe calls (read, execve,
    // write, _exit; `__errno_location` only reads the thread pointer) on
    // memory prepared before the fork, and never returns.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(launch_error(program, std::io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: see above; `c_path`, `argv` and `envp` are NUL-terminated
        // arrays of pointers to C strings that outlive the call.
        unsafe {
            let mut byte = 0u8;
            libc::read(go[0], (&mut byte as *mut u8).cast(), 1);
            if byte == b'g' {
                libc::execve(c_path.as_ptr(), argv.as_ptr(), envp.as_ptr());
            }
            let errno = *libc::__errno_location();
            libc::write(report[1], (&errno as *const i32).cast(), 4);
            libc::_exit(127);
        }
    }
    // SAFETY: closing our copies of the child's ends.
    unsafe {
        libc::close(go[0]);
        libc::close(report[1]);
    }
    let options = (crate::ptrace::OPTIONS | libc::PTRACE_O_EXITKILL as i64) as usize;
    // SAFETY: PTRACE_SEIZE takes the options as `data`, no pointers.
    let seized = unsafe {
        libc::ptrace(
            libc::PTRACE_SEIZE,
            pid,
            std::ptr::null_mut::<libc::c_void>(),
            options as *mut libc::c_void,
        )
    };
    let byte: u8 = if seized == 0 { b'g' } else { b'x' };
    // SAFETY: writes one byte from a local, then closes our end.
    unsafe {
        libc::write(go[1], (&byte as *const u8).cast(), 1);
        libc::close(go[1]);
    }
    if seized != 0 {
        let e = std::io::Error::last_os_error();
        reap(pid);
        return Err(launch_error(program, e));
    }
    // Wait for the exec stop (or the child's death if exec failed).
    let mut status = 0;
    // SAFETY: valid out-pointer.
    let waited = unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
    if waited != pid || !libc::WIFSTOPPED(status) || (status >> 16) != libc::PTRACE_EVENT_EXEC {
        let mut errno = 0i32;
        // SAFETY: reads at most 4 bytes into a local.
        let n = unsafe { libc::read(report[0], (&mut errno as *mut i32).cast(), 4) };
        // SAFETY: closing our descriptor.
        unsafe { libc::close(report[0]) };
        if libc::WIFSTOPPED(status) {
            // SAFETY: killing the child we forked.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        reap(pid);
        let source = if n == 4 {
            std::io::Error::from_raw_os_error(errno)
        } else {
            std::io::Error::other("the program did not start")
        };
        return Err(launch_error(program, source));
    }
    // SAFETY: closing our descriptor.
    unsafe { libc::close(report[0]) };

    let through = match follow_launchers(program, &c_path, pid) {
        Ok(through) => through,
        // Ended and reaped already: nothing to kill (its PID may be
        // someone else's by now).
        Err(Followed::Ended(e)) => return Err(e),
        Err(Followed::Failed(e)) => {
            // SAFETY: our own child, not reaped: the PID cannot have been
            // reused.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            reap(pid);
            return Err(e);
        }
    };
    let mut tracer = Tracer::adopt(pid)?;
    match run_to_entry(&mut tracer, pid) {
        Ok(()) => Ok((pid, tracer, through)),
        Err(e) => {
            // It has not run any of the program's own code yet.
            kill_stopped(pid, tracer);
            Err(e)
        }
    }
}

/// Programs that run another by `exec`ing it in the same process: named
/// on the command line, the user means the program they run.
const EXEC_WRAPPERS: &[&str] = &[
    "env", "nice", "ionice", "nohup", "taskset", "chrt", "stdbuf", "setsid", "numactl",
];

/// Shells: a script's interpreter, or one a wrapper script `exec`s (pyenv's
/// shims are bash scripts whose interpreter is found by `env`, and they
/// `exec` the real interpreter in the end). Named on the command line a
/// shell is what the user means, and is not followed.
const SHELLS: &[&str] = &["sh", "bash", "dash", "ash", "zsh", "ksh", "mksh", "busybox"];

/// When `program` (at `path`) is a script or an exec wrapper, lets the
/// process `pid` (at its first exec stop) run on through every exec of a
/// wrapper or shell until it execs something else, and stops it at that
/// exec; returns the executables it went through. Anything else is the
/// program itself: nothing to do. A process that ends before it execs the
/// program (a script that starts it as a child, or fails) is an error: the
/// program was not run under weft.
/// Why [`follow_launchers`] did not reach a program.
enum Followed {
    /// The process ended (and `waitpid` reaped it).
    Ended(Error),
    /// It is still there, stopped or running.
    Failed(Error),
}

fn follow_launchers(program: &str, path: &CString, pid: i32) -> Result<Vec<String>, Followed> {
    let name_of = |p: &std::path::Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let script = std::fs::File::open(std::ffi::OsStr::from_bytes(path.as_bytes()))
        .and_then(|mut f| {
            let mut magic = [0u8; 2];
            std::io::Read::read_exact(&mut f, &mut magic).map(|()| &magic == b"#!")
        })
        .unwrap_or(false);
    let named = name_of(std::path::Path::new(std::ffi::OsStr::from_bytes(
        path.as_bytes(),
    )));
    if !script && !EXEC_WRAPPERS.contains(&named.as_str()) {
        return Ok(Vec::new());
    }
    let mut through = Vec::new();
    loop {
        let exe =
            std::fs::read_link(crate::inspect::procfs::pid_file(pid, "exe")).map_err(|e| {
                Followed::Failed(Error::Internal(format!(
                    "reading process {pid}'s executable: {e}"
                )))
            })?;
        let name = name_of(&exe);
        if !EXEC_WRAPPERS.contains(&name.as_str()) && !SHELLS.contains(&name.as_str()) {
            return Ok(through);
        }
        through.push(exe.to_string_lossy().into_owned());
        // On to its next exec, passing on every signal it gets meanwhile
        // (its children's SIGCHLD, a terminal's).
        let mut signal = 0;
        loop {
            // SAFETY: PTRACE_CONT on our own stopped tracee; `signal` is
            // passed by value.
            unsafe { libc::ptrace(libc::PTRACE_CONT, pid, 0usize, signal as usize) };
            let mut status = 0;
            // SAFETY: valid out-pointer; waits for our own child only.
            let waited = unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
            if waited != pid {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    signal = 0;
                    continue;
                }
                return Err(Followed::Failed(launch_error(program, e)));
            }
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                let ended = if libc::WIFEXITED(status) {
                    format!("exited with code {}", libc::WEXITSTATUS(status))
                } else {
                    format!("was killed by signal {}", libc::WTERMSIG(status))
                };
                return Err(Followed::Ended(launch_error(
                    program,
                    std::io::Error::other(format!(
                        "it is run by {} (a script or wrapper), which {ended} without `exec`ing \
                         a program: weft follows a script into the program it `exec`s, not one it \
                         starts as a child; end the script with `exec PROGRAM ARGS`, or give weft \
                         the program itself",
                        through.join(" then ")
                    )),
                )));
            }
            let event = status >> 16;
            if event == libc::PTRACE_EVENT_EXEC {
                break;
            }
            // A signal to deliver; an event stop (a thread, a group stop)
            // resumes as it is.
            signal = if event == 0 {
                libc::WSTOPSIG(status)
            } else {
                0
            };
        }
    }
}

fn run_to_entry(tracer: &mut Tracer, pid: i32) -> Result<(), Error> {
    let auxv = std::fs::read(crate::inspect::procfs::pid_file(pid, "auxv"))
        .map_err(|e| Error::Internal(format!("reading auxv: {e}")))?;
    let entry = auxv
        .chunks_exact(16)
        .map(|c| {
            (
                u64::from_le_bytes(c[..8].try_into().unwrap()),
                u64::from_le_bytes(c[8..].try_into().unwrap()),
            )
        })
        .find(|&(key, _)| key == AT_ENTRY)
        .map(|(_, v)| v)
        .ok_or_else(|| Error::Internal("no AT_ENTRY in the auxiliary vector".into()))?;
    let mut original = [0u8; 1];
    tracer.memory().read(entry, &mut original)?;
    tracer.memory().write(entry, &[0xcc])?;
    tracer.resume(pid)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (tid, stop) = tracer.wait_for_stop(deadline)?.ok_or_else(|| {
            Error::Internal("the program did not reach its entry point within 30 s".into())
        })?;
        let regs = tracer.registers(tid)?;
        if stop == crate::ptrace::Stop::Signal(libc::SIGTRAP) && regs.rip == entry + 1 {
            tracer.memory().write(entry, &original)?;
            let mut regs = regs;
            regs.rip = entry;
            tracer.set_registers(tid, &regs)?;
            tracer.discard_signal(tid);
            return tracer.stop_all().map_err(Into::into);
        }
        // Anything else (a constructor's signal, a thread) goes on as usual.
        tracer.resume(tid)?;
    }
}

fn reap(pid: i32) {
    let mut status = 0;
    // SAFETY: valid out-pointer; reaps only our own child.
    unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
}

static FORWARD_TO: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn forward_signal(sig: libc::c_int) {
    let pid = FORWARD_TO.load(std::sync::atomic::Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe and has no memory effects; the
        // PID is our unreaped child (`wait_child` clears it before it
        // returns from reaping it).
        unsafe { libc::kill(pid, sig) };
    }
}

/// Waits for our child `pid` to exit, passing on SIGTERM and SIGHUP (and
/// SIGINT, which a terminal sends to both anyway) so weft never outlives
/// the program it runs by accident. `tick` runs every few milliseconds
/// meanwhile.
pub fn wait_child(pid: i32, tick: &mut dyn FnMut()) -> Result<ProcessExit, Error> {
    FORWARD_TO.store(pid, std::sync::atomic::Ordering::Relaxed);
    for sig in [libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: installs a handler that only calls kill.
        unsafe { libc::signal(sig, forward_signal as *const () as libc::sighandler_t) };
    }
    // The terminal delivers SIGINT to the program too; weft waits for it
    // to finish and then reports.
    // SAFETY: ignoring a signal has no memory effects.
    unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
    loop {
        let mut status = 0;
        // SAFETY: valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            // Reaped: its PID may be reused, so a late signal must not be
            // passed on to whoever gets it.
            FORWARD_TO.store(0, std::sync::atomic::Ordering::Relaxed);
            if libc::WIFEXITED(status) {
                return Ok(ProcessExit::Code(libc::WEXITSTATUS(status)));
            }
            if libc::WIFSIGNALED(status) {
                return Ok(ProcessExit::Signal(libc::WTERMSIG(status)));
            }
            continue;
        }
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(Error::Internal(format!("waiting for process {pid}: {e}")));
            }
            continue;
        }
        tick();
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
