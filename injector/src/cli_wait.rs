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
/// `tick` runs about every 10 ms meanwhile.
pub fn wait(pid: i32, duration: Option<Duration>, tick: &mut dyn FnMut()) -> End {
    let deadline = duration.map(|d| Instant::now() + d);
    // SAFETY: pidfd_open has no memory arguments.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    loop {
        if STOP_REQUESTED.load(Ordering::Relaxed) {
            close(pidfd);
            return End::Signal;
        }
        tick();
        let mut timeout = Duration::from_millis(10);
        if let Some(deadline) = deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                close(pidfd);
                return End::Duration;
            }
            timeout = timeout.min(left);
        }
        if pidfd >= 0 {
            let mut fds = libc::pollfd {
                fd: pidfd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut fds, 1, timeout.as_millis().max(1) as i32) };
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

fn close(fd: i32) {
    if fd >= 0 {
        // SAFETY: closes our own pidfd.
        unsafe { libc::close(fd) };
    }
}
