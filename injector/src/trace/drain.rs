//! A thread of weft's own that drains the trace rings every millisecond
//! while anything is being traced, at real-time priority where permitted,
//! so that a ring holds a millisecond of its thread's events rather than
//! the ten between two polls of weft's main loop, however busy the target
//! keeps the CPUs.

use super::TraceLog;
use crate::region::Region;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// Between two drains while events come, and for [`QUIET`] after.
const BUSY: Duration = Duration::from_micros(500);
/// How long without events before the drains slow down (a thread between
/// two bursts fills a ring in a millisecond).
const QUIET: Duration = Duration::from_millis(200);
/// Between two drains while copied events wait to be rebuilt.
const BREATH: Duration = Duration::from_micros(50);
/// The longest pause between two drains when no events came.
const IDLE: Duration = Duration::from_millis(8);

/// The draining thread; stopped (and joined) when dropped.
#[derive(Debug)]
pub struct Drainer {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drainer {
    /// Starts draining `log` from `region` (the target's, mapped anew for
    /// the thread). None when the thread cannot be made: weft's main loop
    /// still drains about every 10 ms.
    pub(crate) fn start(log: &Arc<Mutex<TraceLog>>, region: Region) -> Option<Drainer> {
        let stop = Arc::new(AtomicBool::new(false));
        let log: Weak<Mutex<TraceLog>> = Arc::downgrade(log);
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("weft-trace".into())
            .spawn(move || drain(&log, &region, &stopped))
            .ok()?;
        Some(Drainer {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Drainer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn drain(log: &Weak<Mutex<TraceLog>>, region: &Region, stop: &AtomicBool) {
    // It sleeps between drains and never spins: at real-time priority it
    // takes the CPU from the target only for the copying and the
    // rebuilding themselves.
    let boost = crate::RealtimeGuard::raise();
    // SAFETY: sched_getscheduler(0) only reads the calling thread's policy.
    let policy = unsafe { libc::sched_getscheduler(0) };
    // Raised, or already real-time (inherited, or a user's `chrt`).
    let realtime = boost.is_some()
        || matches!(
            policy & !libc::SCHED_RESET_ON_FORK,
            libc::SCHED_FIFO | libc::SCHED_RR
        );
    if let Some(log) = log.upgrade() {
        log.lock().unwrap_or_else(|p| p.into_inner()).drain_realtime = realtime;
    }
    let mut pause = BUSY;
    let mut last_events = std::time::Instant::now();
    // When the last copy that found events began: the gap to the next
    // is what the rings had to hold.
    let mut last_copy: Option<std::time::Instant> = None;
    while !stop.load(Ordering::Acquire) {
        let Some(log) = log.upgrade() else {
            return;
        };
        let ((events, left), capacity) = {
            let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
            let now = std::time::Instant::now();
            if let Some(gap) = last_copy.map(|at| now.saturating_duration_since(at)) {
                log.longest_drain_gap = log.longest_drain_gap.max(gap);
            }
            let drained = log.drain_all(region, false);
            last_copy = (drained.0 > 0).then_some(now);
            (drained, u64::from(log.capacity()))
        };
        drop(log);
        if events > 0 {
            last_events = std::time::Instant::now();
        }
        if events >= capacity / 4 {
            // The threads fill their rings about as fast as they are read:
            // again at once.
            pause = BUSY;
            continue;
        }
        if left > 0 {
            // Events wait to be rebuilt: a short breath between two
            // slices, so that the target's threads (and anything else)
            // run even on one CPU.
            pause = BUSY;
            std::thread::sleep(BREATH);
            continue;
        }
        pause = if last_events.elapsed() < QUIET {
            BUSY
        } else {
            (pause * 2).min(IDLE)
        };
        std::thread::sleep(pause);
    }
}
