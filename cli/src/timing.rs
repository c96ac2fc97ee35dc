//! Phase timings on standard error when `WEFT_TIMING` is set.

/// Phase timings on stderr when `WEFT_TIMING` is set (for people sizing
/// weft's pauses; the brief asks for progress on long work).
pub struct Timing(
    Option<std::cell::Cell<std::time::Instant>>,
    std::time::Instant,
);

impl Timing {
    pub fn from_env() -> Timing {
        let now = std::time::Instant::now();
        Timing(
            std::env::var_os("WEFT_TIMING").map(|_| std::cell::Cell::new(now)),
            now,
        )
    }

    pub fn note(&self, what: &str) {
        if self.0.is_some() {
            eprintln!("weft: timing: {what}");
        }
    }

    pub fn mark(&self, what: &str) {
        if let Some(last) = &self.0 {
            let now = std::time::Instant::now();
            eprintln!(
                "weft: timing: {what}: {:.2} ms (total {:.2} ms)",
                (now - last.get()).as_secs_f64() * 1e3,
                (now - self.1).as_secs_f64() * 1e3
            );
            last.set(now);
        }
    }
}

/// `CLOCK_MONOTONIC` now, ns.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Milliseconds since this process was created, from its start time in
/// /proc/self/stat (clock ticks: 10 ms resolution).
pub fn since_start_ms() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let start: f64 = after
        .split_whitespace()
        .nth(19)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    let now = ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9;
    // SAFETY: no arguments.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (now - start / hz) * 1e3
}
