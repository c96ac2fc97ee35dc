//! Waiting while probes are live: until a duration passes, the target
//! exits, or weft gets SIGINT/SIGTERM. weft is not attached meanwhile, so it
//! watches the target through a pidfd.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

static STOP_REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn request_stop(_: libc::c_int) {
    STOP_REQUESTED.store(true, Ordering::Relaxed);
}

/// SIGINT and SIGTERM end the wait (and then weft cleans up) instead of
/// killing weft with probes still in the target.
pub fn install_stop_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(sig, request_stop as *const () as libc::sighandler_t) };
    }
}

/// SIGINT, SIGTERM or SIGHUP arrived (or [`stop_now`] was called).
pub fn stop_requested() -> bool {
    STOP_REQUESTED.load(Ordering::Relaxed)
}

/// Ends the wait as SIGINT would (weft's own reason to stop).
pub fn stop_now() {
    STOP_REQUESTED.store(true, Ordering::Relaxed);
}

/// Why waiting ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    Duration,
    Signal,
    TargetExited,
}

/// Waits as described in the module docs.
/// `tick` runs about every 10 ms meanwhile, and returns when it next has
/// work due (a live report), if sooner: the wait wakes then, not at the
/// next 10 ms step (which made reports up to 10 ms late).
pub fn wait(
    pid: i32,
    duration: Option<Duration>,
    tick: &mut dyn FnMut() -> Option<Instant>,
) -> End {
    let deadline = duration.map(|d| Instant::now() + d);
    // SAFETY: pidfd_open has no memory arguments.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    loop {
        let timeout = match next_timeout(deadline, tick) {
            Ok(timeout) => timeout,
            Err(end) => {
                close(pidfd);
                return end;
            }
        };
        if pidfd >= 0 {
            let mut fds = libc::pollfd {
                fd: pidfd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut fds, 1, whole_ms(timeout)) };
            if n > 0 {
                close(pidfd);
                return End::TargetExited;
            }
        } else {
            std::thread::sleep(timeout);
            if std::fs::metadata(format!("/proc/{pid}")).is_err() {
                return End::TargetExited;
            }
        }
    }
}

/// [`wait`] for several processes, a list `tick` may add to (children
/// followed as they are forked): the targets have exited when all of them
/// have.
pub fn wait_all_of(
    pids: &std::cell::RefCell<Vec<i32>>,
    duration: Option<Duration>,
    tick: &mut dyn FnMut() -> Option<Instant>,
) -> End {
    let deadline = duration.map(|d| Instant::now() + d);
    let mut gone: std::collections::HashSet<i32> = std::collections::HashSet::new();
    loop {
        let timeout = match next_timeout(deadline, tick) {
            Ok(timeout) => timeout,
            Err(end) => return end,
        };
        std::thread::sleep(timeout);
        // A process weft is not attached to: gone when /proc says so or it
        // is a zombie (its parent has not reaped it yet).
        for &pid in pids.borrow().iter() {
            if !gone.contains(&pid)
                && matches!(
                    weft::internals::process_state(pid),
                    Err(_) | Ok(weft::internals::ProcState::Zombie)
                )
            {
                gone.insert(pid);
            }
        }
        if pids.borrow().iter().all(|pid| gone.contains(pid)) {
            return End::TargetExited;
        }
    }
}

/// One step of a wait: the end when a stop was asked for or `deadline`
/// passed, else `tick`'s turn and how long to sleep before the next step
/// (10 ms at most, less when `tick` has work due sooner).
fn next_timeout(
    deadline: Option<Instant>,
    tick: &mut dyn FnMut() -> Option<Instant>,
) -> Result<Duration, End> {
    if STOP_REQUESTED.load(Ordering::Relaxed) {
        return Err(End::Signal);
    }
    let due = tick();
    let mut timeout = Duration::from_millis(10);
    if let Some(due) = due {
        timeout = timeout.min(due.saturating_duration_since(Instant::now()));
    }
    if let Some(deadline) = deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(End::Duration);
        }
        timeout = timeout.min(left);
    }
    Ok(timeout)
}

/// `timeout` in whole milliseconds for `poll`, rounded up (rounded down, a
/// wait for a due time 0.6 ms away would wake early and spin once more).
fn whole_ms(timeout: Duration) -> i32 {
    timeout
        .as_micros()
        .div_ceil(1000)
        .clamp(1, i32::MAX as u128) as i32
}

fn close(fd: i32) {
    if fd >= 0 {
        // SAFETY: closes our own pidfd.
        unsafe { libc::close(fd) };
    }
}
