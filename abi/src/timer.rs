//! Reading a function's timer words from outside the thread that writes
//! them.
//!
//! Generated code (`weft_codegen`'s `timer` module) keeps each timed
//! function's words at its metric base
//! ([`metric`](crate::layout::metric)): a seqlock `SEQ`, odd
//! while a start or stop is being written, around the totals and the raw
//! clock readings at the running activation's start. x86-64 (TSO) makes
//! stores visible in program order and does not reorder loads with loads,
//! so the writer's plain stores `seq` (odd), fields, `seq` (even) and a
//! reader's plain loads `seq`, fields, `seq` form a correct seqlock with
//! compiler barriers only. Readers use [`read_timer_words`] (which retries
//! on an odd or changed `seq`) and [`timer_value`].

use crate::layout::metric::{
    CPU_START, CPU_TOTAL, NESTING, SELF_TOTAL, SEQ, WALL_START, WALL_TOTAL,
};

/// `(a * q) >> 32`, saturating at `u64::MAX`: how generated code and the
/// runtime convert between ticks and ns with a 32.32 fixed-point factor.
#[inline]
pub fn q32_mul(a: u64, q: u64) -> u64 {
    u64::try_from((u128::from(a) * u128::from(q)) >> 32).unwrap_or(u64::MAX)
}

/// The latency-histogram bucket
/// ([`HIST_BUCKETS`](crate::layout::metric::HIST_BUCKETS)) of an activation
/// of `ns` nanoseconds, as the generated stop computes it: `floor(log2(ns))`
/// (`bsr`), 0 for 0 ns, clamped to the last bucket.
pub fn histogram_bucket(ns: u64) -> usize {
    (ns.max(1).ilog2() as usize).min(crate::layout::metric::HIST_BUCKETS - 1)
}

/// The lower bound in ns of histogram bucket `b` (0 for bucket 0).
pub fn histogram_floor(b: usize) -> u64 {
    if b == 0 {
        0
    } else {
        1u64 << b.min(63)
    }
}

/// A consistent copy of one function's timer words (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TimerWords {
    /// Open hooked activations (informational: not covered by the seqlock).
    pub nesting: u64,
    /// The (even) seqlock value the copy was taken at.
    pub seq: u64,
    /// Closed wall time, ns.
    pub wall_total: u64,
    /// Wall clock at the running activation's start, or 0.
    pub wall_start: u64,
    /// Closed CPU time, ns.
    pub cpu_total: u64,
    /// CPU clock at the running activation's start, or 0.
    pub cpu_start: u64,
    /// Closed self (exclusive) wall time, ns.
    pub self_total: u64,
}

/// Tries a reader gives a timer's seqlock before taking the writer for
/// descheduled ([`read_timer_words`]'s `max_attempts`). A writer that runs
/// finishes its start or stop in tens of nanoseconds, and an interrupt
/// delays it by microseconds, so a `seq` still odd after this many tries
/// (tens of microseconds with `pause` between them) belongs to a thread
/// switched out mid-update, which may not run again for a scheduler slice
/// or more. Under hundreds of busy threads many are, and 10,000 tries each
/// (as before) made one live report take ~50 ms.
pub const READ_ATTEMPTS: u32 = 1_000;

/// Takes a consistent copy of a function's timer words, seqlock-style:
/// `seq`, the fields, `seq` again, retrying while `seq` is odd (a start or
/// stop is being written) or changed. `load(offset)` must return the live
/// word at `metric base + offset` with one aligned 8-byte load that the
/// compiler neither elides nor reorders with the others (`read_volatile`,
/// or an atomic load). Gives up with `None` after `max_attempts` tries (a
/// writer can be descheduled, or killed, between its two `seq` stores).
///
/// Correct as is on x86-64, where loads are not reordered with loads.
#[inline(always)]
pub fn read_timer_words(
    mut load: impl FnMut(usize) -> u64,
    max_attempts: u32,
) -> Option<TimerWords> {
    use core::sync::atomic::{compiler_fence, Ordering};
    for _ in 0..max_attempts {
        let seq = load(SEQ);
        if seq & 1 != 0 {
            core::hint::spin_loop();
            continue;
        }
        compiler_fence(Ordering::SeqCst);
        let words = TimerWords {
            nesting: load(NESTING),
            seq,
            wall_total: load(WALL_TOTAL),
            wall_start: load(WALL_START),
            cpu_total: load(CPU_TOTAL),
            cpu_start: load(CPU_START),
            self_total: load(SELF_TOTAL),
        };
        compiler_fence(Ordering::SeqCst);
        if load(SEQ) == seq {
            return Some(words);
        }
        core::hint::spin_loop();
    }
    None
}

/// A function's timer values on one thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TimerValue {
    /// Wall time, ns: closed total plus, while running, the time since the
    /// start.
    pub wall_ns: u64,
    /// CPU time, ns: closed total plus, while running and when the thread's
    /// CPU time was given, the CPU time since the start.
    pub cpu_ns: u64,
    /// An outermost activation is open and started.
    pub running: bool,
}

/// Computes the timer values from a consistent copy ([`read_timer_words`]).
///
/// `wall_raw_now` is the reader's own raw wall reading (the TSC when the
/// target's timers use it, else CLOCK_MONOTONIC ns: the same source as the
/// target's, see the runtime's `WallClock::raw`); `cpu_ns_now` the thread's
/// current CPU time in ns on the CLOCK_THREAD_CPUTIME_ID timeline
/// (`/proc/PID/task/TID/schedstat`'s first field), `None` to count closed
/// CPU time only; `ns_per_tick_q32` the target's
/// `weft_codegen::TimerSpec::ns_per_tick_q32` (the region's
/// [`RegionHeader::timer_ns_per_tick_q32`](crate::layout::RegionHeader)).
/// Read the clocks *before* the words: a running timer's value then never exceeds what its stop will record,
/// except by how early the stop's `rdtsc` can execute before its seqlock
/// store is visible to the reader (it is not ordered with the instructions
/// before it; an `lfence` to order it cost ~20 ns a timed call here), up
/// to 1-3 µs measured on a loaded 2-vCPU guest, or the small disagreement
/// between the thread's own CPU clock and the kernel's accounting. A
/// reader that needs a non-decreasing series keeps the maximum of its
/// readings, as `weft::Sampler` does.
pub fn timer_value(
    words: &TimerWords,
    wall_raw_now: u64,
    cpu_ns_now: Option<u64>,
    ns_per_tick_q32: u64,
) -> TimerValue {
    let mut v = TimerValue {
        wall_ns: words.wall_total,
        cpu_ns: words.cpu_total,
        running: words.wall_start != 0 || words.cpu_start != 0,
    };
    if words.wall_start != 0 {
        let ticks = wall_raw_now.saturating_sub(words.wall_start);
        v.wall_ns = v.wall_ns.wrapping_add(q32_mul(ticks, ns_per_tick_q32));
    }
    if let (true, Some(now)) = (words.cpu_start != 0, cpu_ns_now) {
        let start = q32_mul(words.cpu_start, ns_per_tick_q32);
        v.cpu_ns = v.cpu_ns.wrapping_add(now.saturating_sub(start));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seqlock_reader_retries_and_values() {
        // Words at metric base 0 in a little row; seq goes odd then even
        // across loads, as a writer racing the reader would make it.
        let mut row = [0u64; 11];
        row[NESTING / 8] = 1;
        row[WALL_TOTAL / 8] = 1000;
        row[WALL_START / 8] = 5000;
        row[CPU_TOTAL / 8] = 300;
        row[CPU_START / 8] = 7000;
        let mut seqs = [1u64, 2, 4, 4, 4].into_iter();
        let mut last_seq = 0;
        let w = read_timer_words(
            |off| {
                if off == SEQ {
                    last_seq = seqs.next().unwrap_or(last_seq);
                    last_seq
                } else {
                    row[off / 8]
                }
            },
            10,
        )
        .unwrap();
        assert_eq!(w.seq, 4);
        // Ticks are half a nanosecond here.
        let half = 1u64 << 31;
        let v = timer_value(&w, 5000 + 1200, Some(3500 + 50), half);
        assert_eq!(
            v,
            TimerValue {
                wall_ns: 1600,
                cpu_ns: 350,
                running: true
            }
        );
        assert_eq!(timer_value(&w, 6200, None, half).cpu_ns, 300);
        // A clock behind the start counts nothing.
        assert_eq!(timer_value(&w, 10, Some(10), half).wall_ns, 1000);
        // Not running: totals only.
        let idle = TimerWords {
            wall_start: 0,
            cpu_start: 0,
            ..w
        };
        let v = timer_value(&idle, u64::MAX, Some(u64::MAX), half);
        assert_eq!((v.wall_ns, v.cpu_ns, v.running), (1000, 300, false));
        // A writer stuck in the middle: give up.
        assert_eq!(read_timer_words(|_| 3, 5), None);
    }
}
