//! Clock sources for per-thread wall and CPU timers.
//!
//! Two clocks, each with a Rust reader and a hand-written assembly reader
//! that generated code (trampolines) can call or inline:
//!
//! * [`WallClock`]: `rdtsc` converted to CLOCK_MONOTONIC nanoseconds with an
//!   integer mult/shift ([`TscCalibration`]), or CLOCK_MONOTONIC itself when
//!   the TSC is not invariant.
//! * [`ThreadCpuClock`]: the calling thread's CPU time in nanoseconds, on the
//!   same timeline as `CLOCK_THREAD_CPUTIME_ID`, read without a syscall in the
//!   common case through the mmap page of a `PERF_COUNT_SW_TASK_CLOCK` event
//!   (see [`CpuSource`] for the three strategies).
//!
//! Both state structs are `repr(C)` with their field offsets published as
//! constants (checked at compile time), because generated code reads them.
//! Nothing here takes a lock or panics; set-up (`new`) may make syscalls,
//! reads make none except where documented (a re-anchor or a fallback).
//!
//! [`thread_cpu_ns_from_outside`] reads another thread's CPU time from
//! `/proc`, for the injector sampling running timers.

// rdtsc, CPUID and the perf page are x86-64 Linux matters.
#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use core::arch::asm;
use core::mem::{align_of, offset_of, size_of};
use core::ptr;
use core::sync::atomic::{compiler_fence, Ordering};
use std::fmt;
use std::io;

use crate::layout::{ClockStorage, RegionHeader, WallClockStorage};

mod events;
mod readers;
mod table;
pub use readers::{weft_rt_cpu_now, weft_rt_cpu_ticks, weft_rt_wall_now, weft_rt_wall_raw};
pub(crate) use table::{forget_table_after_fork, release_table};
pub use table::{use_table, weft_rt_cpu_table_fd, weft_rt_map_cpu_table};

// ---------------------------------------------------------------------------
// Primitives
// ---------------------------------------------------------------------------

/// Reads the time-stamp counter.
///
/// Not serialising: it may execute a few instructions early or late, which
/// is far below the resolution timers need, and a context switch or
/// interrupt (both serialising) never moves it across.
#[inline(always)]
pub fn rdtsc() -> u64 {
    let lo: u32;
    let hi: u32;
    // SAFETY: rdtsc only writes edx:eax; CR4.TSD is clear on Linux (the
    // kernel only sets it for a process that asked with prctl(PR_SET_TSC),
    // which the runtime's host would have to do deliberately).
    unsafe {
        asm!("rdtsc", out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags));
    }
    (u64::from(hi) << 32) | u64::from(lo)
}

/// `(a * mul) >> shift` without 128-bit arithmetic, like the kernel's
/// `mul_u64_u32_shr`: the high part `a >> shift` is multiplied exactly and
/// the low `shift` bits separately, so the result is exact (no rounding
/// difference) as long as `shift <= 32` (then `rem * mul < 2^64`).
/// Generated code uses the same five instructions (see the assembly below).
#[inline(always)]
pub const fn mul_u64_u32_shr(a: u64, mul: u32, shift: u32) -> u64 {
    let quot = a >> shift;
    let rem = a - (quot << shift);
    // Wrapping: callers keep shift <= 32 so nothing wraps, and a bad shift
    // from a kernel page must not panic in debug builds.
    quot.wrapping_mul(mul as u64)
        .wrapping_add(rem.wrapping_mul(mul as u64) >> shift)
}

const NSEC_PER_SEC: u64 = 1_000_000_000;

fn clock_ns(clock: libc::clockid_t) -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec for the call to write.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return None;
    }
    Some((ts.tv_sec as u64).wrapping_mul(NSEC_PER_SEC) + ts.tv_nsec as u64)
}

/// CLOCK_MONOTONIC in nanoseconds (vDSO, no syscall on most machines).
pub fn monotonic_ns() -> u64 {
    // CLOCK_MONOTONIC cannot fail on Linux; 0 keeps this panic-free anyway.
    clock_ns(libc::CLOCK_MONOTONIC).unwrap_or(0)
}

/// CLOCK_THREAD_CPUTIME_ID in nanoseconds: a real syscall (no vDSO path).
pub fn thread_cputime_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or(0)
}

/// True when CPUID reports an invariant TSC (leaf 0x8000_0007, EDX bit 8):
/// constant rate across P-states and running through C-states, which is
/// what makes TSC deltas usable as wall time (Linux's `nonstop_tsc` +
/// `constant_tsc`). Hypervisors hide the bit when they cannot promise it.
pub fn tsc_is_invariant() -> bool {
    // SAFETY: CPUID exists on every x86-64 processor; leaf 0x8000_0000
    // returns the highest extended leaf, checked before reading 0x8000_0007.
    // (`__cpuid` became a safe fn after the workspace's MSRV.)
    #[allow(unused_unsafe)]
    unsafe {
        let max = core::arch::x86_64::__cpuid(0x8000_0000).eax;
        if max < 0x8000_0007 {
            return false;
        }
        core::arch::x86_64::__cpuid(0x8000_0007).edx & (1 << 8) != 0
    }
}

// ---------------------------------------------------------------------------
// Wall clock
// ---------------------------------------------------------------------------

/// TSC to CLOCK_MONOTONIC conversion: `ns = ns_base + ((tsc - tsc_base) *
/// mult) >> shift`, with `shift <= 32` so [`mul_u64_u32_shr`] is exact.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TscCalibration {
    /// Nanoseconds per TSC tick, scaled by `2^shift`.
    pub mult: u32,
    /// See `mult`; at most 32.
    pub shift: u32,
    /// TSC value at which CLOCK_MONOTONIC read `ns_base`.
    pub tsc_base: u64,
    /// CLOCK_MONOTONIC at `tsc_base`.
    pub ns_base: u64,
}

impl TscCalibration {
    /// Nanoseconds on the CLOCK_MONOTONIC timeline for a TSC value. A TSC
    /// older than the base (impossible with a synchronised invariant TSC)
    /// clamps to `ns_base` rather than wrapping.
    #[inline(always)]
    pub fn wall_ns(&self, tsc: u64) -> u64 {
        let delta = tsc.saturating_sub(self.tsc_base);
        self.ns_base + mul_u64_u32_shr(delta, self.mult, self.shift)
    }

    /// The (mult, shift) with the largest shift <= 32 whose mult fits in
    /// 32 bits for `ns` nanoseconds per `cycles` ticks. `None` for a
    /// degenerate measurement or a clock slower than 1 tick per 4 s.
    pub fn mult_shift(ns: u64, cycles: u64) -> Option<(u32, u32)> {
        if ns == 0 || cycles == 0 {
            return None;
        }
        // 128-bit arithmetic is fine here: calibration is not a hot path.
        for shift in (0..=32u32).rev() {
            let mult = ((u128::from(ns) << shift) + u128::from(cycles) / 2) / u128::from(cycles);
            if mult > 0 && mult <= u128::from(u32::MAX) {
                return Some((mult as u32, shift));
            }
        }
        None
    }

    /// One (TSC, CLOCK_MONOTONIC) pair read as close together as possible:
    /// of a few tries, the one whose two bracketing TSC reads are nearest,
    /// taking the midpoint (vDSO clock_gettime takes ~25 ns; an interrupt
    /// in between would otherwise skew the pair by microseconds).
    fn paired_sample() -> (u64, u64) {
        let mut best = (u64::MAX, 0u64, 0u64);
        for _ in 0..16 {
            let t0 = rdtsc();
            let ns = monotonic_ns();
            let t1 = rdtsc();
            let width = t1.wrapping_sub(t0);
            if width < best.0 {
                best = (width, t0 + width / 2, ns);
            }
        }
        (best.1, best.2)
    }

    /// Measures the TSC rate against CLOCK_MONOTONIC over `interval_ns`
    /// (sleeping). 10 ms with ~50 ns pairing error gives ~10 ppm.
    pub fn calibrate(interval_ns: u64) -> Option<Self> {
        let (tsc0, ns0) = Self::paired_sample();
        let ts = libc::timespec {
            tv_sec: (interval_ns / NSEC_PER_SEC) as libc::time_t,
            tv_nsec: (interval_ns % NSEC_PER_SEC) as libc::c_long,
        };
        // SAFETY: plain nanosleep; an early return (EINTR) only shortens the
        // interval, which the measured ns below accounts for.
        unsafe { libc::nanosleep(&ts, ptr::null_mut()) };
        let (tsc1, ns1) = Self::paired_sample();
        let (mult, shift) = Self::mult_shift(ns1.checked_sub(ns0)?, tsc1.checked_sub(tsc0)?)?;
        Some(Self {
            mult,
            shift,
            tsc_base: tsc1,
            ns_base: ns1,
        })
    }

    /// Takes the rate from a perf mmap page that has `cap_user_time` (the
    /// kernel's own cyc2ns for sched_clock, free and more precise than a
    /// 10 ms measurement) and only pairs one base sample.
    pub fn from_perf_page(page: &PerfEventMmapPage) -> Option<Self> {
        let (caps, mult, shift) = (
            page.capabilities,
            page.time_mult,
            u32::from(page.time_shift),
        );
        if caps & CAP_USER_TIME == 0 || mult == 0 || shift > 32 {
            return None;
        }
        let (tsc_base, ns_base) = Self::paired_sample();
        Some(Self {
            mult,
            shift,
            tsc_base,
            ns_base,
        })
    }
}

/// [`WallClock::kind`]: rdtsc through the calibration.
pub const WALL_TSC: u32 = 0;
/// [`WallClock::kind`]: CLOCK_MONOTONIC (vDSO from Rust, raw syscall from
/// the assembly reader).
pub const WALL_MONOTONIC: u32 = 1;

/// Why the wall clock uses what it uses ([`WallClock::why`]).
const WHY_CALIBRATED: u32 = 0;
const WHY_PERF_PAGE: u32 = 1;
const WHY_NOT_INVARIANT: u32 = 2;
const WHY_FORCED: u32 = 3;
const WHY_CALIBRATION_FAILED: u32 = 4;

/// Which wall source a [`WallClock`] should use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WallPreference {
    /// The TSC when invariant, else CLOCK_MONOTONIC.
    Auto,
    /// CLOCK_MONOTONIC even when the TSC is usable (tests, comparisons).
    Monotonic,
}

/// The source a [`WallClock`] uses, for reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WallSource {
    /// Invariant TSC, rate measured against CLOCK_MONOTONIC.
    TscCalibrated,
    /// Invariant TSC, rate from the perf mmap page (`cap_user_time`).
    TscPerfPage,
    /// CLOCK_MONOTONIC: the TSC is not invariant.
    MonotonicTscNotInvariant,
    /// CLOCK_MONOTONIC: asked for.
    MonotonicForced,
    /// CLOCK_MONOTONIC: TSC calibration gave nonsense.
    MonotonicCalibrationFailed,
}

impl fmt::Display for WallSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::TscCalibrated => "tsc (invariant, calibrated against CLOCK_MONOTONIC)",
            Self::TscPerfPage => "tsc (invariant, rate from the perf mmap page)",
            Self::MonotonicTscNotInvariant => "CLOCK_MONOTONIC (tsc not invariant)",
            Self::MonotonicForced => "CLOCK_MONOTONIC (forced)",
            Self::MonotonicCalibrationFailed => "CLOCK_MONOTONIC (tsc calibration failed)",
        })
    }
}

/// Process-wide wall clock state, read-only after construction (share it
/// between threads freely). Layout read by `weft_rt_wall_now`:
///
/// | offset | field | |
/// |---|---|---|
/// | 0 | `kind: u32` | [`WALL_TSC`] or [`WALL_MONOTONIC`] |
/// | 4 | `why: u32` | reason code behind [`WallClock::source`] |
/// | 8 | `cal.mult: u32` | |
/// | 12 | `cal.shift: u32` | |
/// | 16 | `cal.tsc_base: u64` | |
/// | 24 | `cal.ns_base: u64` | |
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WallClock {
    /// [`WALL_TSC`] or [`WALL_MONOTONIC`].
    pub kind: u32,
    why: u32,
    /// Valid when `kind == WALL_TSC`.
    pub cal: TscCalibration,
}

/// Offsets of [`WallClock`] fields, for generated code.
pub const WALL_OFF_KIND: usize = 0;
/// See [`WALL_OFF_KIND`].
pub const WALL_OFF_MULT: usize = 8;
/// See [`WALL_OFF_KIND`].
pub const WALL_OFF_SHIFT: usize = 12;
/// See [`WALL_OFF_KIND`].
pub const WALL_OFF_TSC_BASE: usize = 16;
/// See [`WALL_OFF_KIND`].
pub const WALL_OFF_NS_BASE: usize = 24;
const _: () = {
    assert!(offset_of!(WallClock, kind) == WALL_OFF_KIND);
    assert!(offset_of!(WallClock, cal) + offset_of!(TscCalibration, mult) == WALL_OFF_MULT);
    assert!(offset_of!(WallClock, cal) + offset_of!(TscCalibration, shift) == WALL_OFF_SHIFT);
    assert!(offset_of!(WallClock, cal) + offset_of!(TscCalibration, tsc_base) == WALL_OFF_TSC_BASE);
    assert!(offset_of!(WallClock, cal) + offset_of!(TscCalibration, ns_base) == WALL_OFF_NS_BASE);
    assert!(size_of::<WallClock>() == 32);
    // The region's header keeps the process's clock (`RegionHeader::wall`).
    assert!(size_of::<WallClock>() == size_of::<WallClockStorage>());
    assert!(align_of::<WallClock>() <= align_of::<WallClockStorage>());
};

impl WallClock {
    /// Picks and calibrates the wall source. With [`WallPreference::Auto`]
    /// and an invariant TSC this takes ~10 ms (one calibration sleep)
    /// unless a perf page with `cap_user_time` supplies the rate.
    pub fn new(preference: WallPreference) -> Self {
        let monotonic = |why| Self {
            kind: WALL_MONOTONIC,
            why,
            cal: TscCalibration {
                mult: 0,
                shift: 0,
                tsc_base: 0,
                ns_base: 0,
            },
        };
        if preference == WallPreference::Monotonic {
            return monotonic(WHY_FORCED);
        }
        if !tsc_is_invariant() {
            return monotonic(WHY_NOT_INVARIANT);
        }
        if let Ok(event) = PerfTaskClock::open() {
            // SAFETY: the page stays mapped while `event` lives.
            if let Some(cal) = TscCalibration::from_perf_page(unsafe { &*event.page }) {
                return Self {
                    kind: WALL_TSC,
                    why: WHY_PERF_PAGE,
                    cal,
                };
            }
        }
        match TscCalibration::calibrate(10_000_000) {
            Some(cal) => Self {
                kind: WALL_TSC,
                why: WHY_CALIBRATED,
                cal,
            },
            None => monotonic(WHY_CALIBRATION_FAILED),
        }
    }

    /// The clock a region's header keeps ([`RegionHeader::wall`]), which
    /// the runtime that created the region wrote before publishing it.
    pub fn in_region(header: &RegionHeader) -> &WallClock {
        // SAFETY: the storage is as large as a WallClock and at least as
        // aligned (asserted at compile time above), and the reference
        // borrows `header`, so it lives no longer than the storage. Every
        // bit pattern is a valid WallClock (integers only), so a region
        // whose clock was never written reads as some clock, not UB.
        unsafe { &*ptr::addr_of!(header.wall).cast::<WallClock>() }
    }

    /// The clock's 32 bytes (the layout above), to hand to another
    /// process on this machine: `weft_rt_init` takes the injector's clock
    /// so that the target never sleeps 10 ms to calibrate its own.
    pub fn to_bytes(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out[0..4].copy_from_slice(&self.kind.to_le_bytes());
        out[4..8].copy_from_slice(&self.why.to_le_bytes());
        out[8..12].copy_from_slice(&self.cal.mult.to_le_bytes());
        out[12..16].copy_from_slice(&self.cal.shift.to_le_bytes());
        out[16..24].copy_from_slice(&self.cal.tsc_base.to_le_bytes());
        out[24..32].copy_from_slice(&self.cal.ns_base.to_le_bytes());
        out
    }

    /// A clock another process on this machine built, made this process's
    /// own: the TSC's rate is the machine's, but CLOCK_MONOTONIC may be
    /// offset here (a time namespace), so a TSC clock is re-based on a
    /// pair read now. `None` when it does not fit this process: an unknown
    /// kind, a rate out of range, or a TSC clock where the TSC is not
    /// invariant.
    pub fn adopt(theirs: &WallClock) -> Option<Self> {
        match theirs.kind {
            WALL_MONOTONIC => Some(Self {
                cal: TscCalibration {
                    mult: 0,
                    shift: 0,
                    tsc_base: 0,
                    ns_base: 0,
                },
                ..*theirs
            }),
            WALL_TSC if theirs.cal.mult != 0 && theirs.cal.shift <= 32 && tsc_is_invariant() => {
                let (tsc_base, ns_base) = TscCalibration::paired_sample();
                Some(Self {
                    cal: TscCalibration {
                        tsc_base,
                        ns_base,
                        ..theirs.cal
                    },
                    ..*theirs
                })
            }
            _ => None,
        }
    }

    /// Which source this clock reads.
    pub fn source(&self) -> WallSource {
        match self.why {
            WHY_CALIBRATED => WallSource::TscCalibrated,
            WHY_PERF_PAGE => WallSource::TscPerfPage,
            WHY_NOT_INVARIANT => WallSource::MonotonicTscNotInvariant,
            WHY_FORCED => WallSource::MonotonicForced,
            _ => WallSource::MonotonicCalibrationFailed,
        }
    }

    /// Nanoseconds on the CLOCK_MONOTONIC timeline (Rust reader).
    #[inline]
    pub fn now(&self) -> u64 {
        if self.kind == WALL_TSC {
            self.cal.wall_ns(rdtsc())
        } else {
            monotonic_ns()
        }
    }

    /// Same as [`WallClock::now`], through the assembly reader.
    #[inline]
    pub fn now_asm(&self) -> u64 {
        // SAFETY: self is a valid WallClock for the duration of the call.
        unsafe { weft_rt_wall_now(self) }
    }

    /// The raw timer reading timers store at a start: the TSC when it is
    /// the wall clock, else CLOCK_MONOTONIC nanoseconds. Differences
    /// convert to ns with [`WallClock::units`].
    #[inline]
    pub fn raw(&self) -> u64 {
        if self.kind == WALL_TSC {
            rdtsc()
        } else {
            monotonic_ns()
        }
    }

    /// How raw readings ([`WallClock::raw`], and the CPU clock's
    /// [`ThreadCpuClock::ticks`]) convert to nanoseconds.
    pub fn units(&self) -> TimerUnits {
        if self.kind != WALL_TSC || self.cal.mult == 0 || self.cal.shift > 32 {
            return TimerUnits::NANOSECONDS;
        }
        let ns_per_tick_q32 = u64::from(self.cal.mult) << (32 - self.cal.shift);
        let ticks_per_ns_q32 =
            u64::try_from((1u128 << (32 + self.cal.shift)) / u128::from(self.cal.mult))
                .unwrap_or(u64::MAX);
        TimerUnits {
            ns_per_tick_q32,
            ticks_per_ns_q32,
        }
    }
}

/// The unit of raw timer readings, as two 32.32 fixed-point factors.
/// Generated code stores raw readings at a timer's start and converts only
/// the difference at its stop (one `mul`), so the hot path never converts a
/// clock reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimerUnits {
    /// Nanoseconds per tick, times 2^32.
    pub ns_per_tick_q32: u64,
    /// Ticks per nanosecond, times 2^32.
    pub ticks_per_ns_q32: u64,
}

impl TimerUnits {
    /// Raw readings that are nanoseconds already (CLOCK_MONOTONIC).
    pub const NANOSECONDS: TimerUnits = TimerUnits {
        ns_per_tick_q32: 1 << 32,
        ticks_per_ns_q32: 1 << 32,
    };

    /// `ticks` in nanoseconds: `(ticks * ns_per_tick_q32) >> 32`, exactly
    /// what generated code computes (saturating instead of wrapping).
    #[inline]
    pub fn to_ns(&self, ticks: u64) -> u64 {
        q32_mul(ticks, self.ns_per_tick_q32)
    }

    /// `ns` nanoseconds in ticks.
    #[inline]
    pub fn to_ticks(&self, ns: u64) -> u64 {
        q32_mul(ns, self.ticks_per_ns_q32)
    }
}

pub use weft_abi::timer::q32_mul;

// ---------------------------------------------------------------------------
// perf_event plumbing
// ---------------------------------------------------------------------------

/// The first page of a perf event mapping, as `linux/perf_event.h` lays it
/// out (only the fields up to `time_mask` are used; the rest of the page is
/// reserved space and the ring-buffer control fields).
#[repr(C)]
#[derive(Debug)]
pub struct PerfEventMmapPage {
    /// Version of this structure.
    pub version: u32,
    /// Lowest version this is compatible with.
    pub compat_version: u32,
    /// Seqlock: incremented twice around every kernel update of the page.
    pub lock: u32,
    /// Hardware counter index + 1 (0 for software events).
    pub index: u32,
    /// Added to the hardware counter value.
    pub offset: i64,
    /// Time the event was enabled, as of the last update.
    pub time_enabled: u64,
    /// Time the event was running, as of the last update.
    pub time_running: u64,
    /// Bitfield: bit 0 cap_bit0 (always 0), 1 cap_bit0_is_deprecated,
    /// 2 cap_user_rdpmc, 3 cap_user_time, 4 cap_user_time_zero,
    /// 5 cap_user_time_short.
    pub capabilities: u64,
    /// Counter width in bits (rdpmc).
    pub pmc_width: u16,
    /// Shift of the TSC-to-ns conversion.
    pub time_shift: u16,
    /// Multiplier of the TSC-to-ns conversion.
    pub time_mult: u32,
    /// Added to the converted TSC to get time since the last update.
    pub time_offset: u64,
    /// Converted TSC + time_zero = perf clock (when cap_user_time_zero).
    pub time_zero: u64,
    /// Size of the header up to the reserved space.
    pub size: u32,
    /// Reserved.
    pub reserved_1: u32,
    /// With cap_user_time_short: the TSC is only `time_mask` wide.
    pub time_cycles: u64,
    /// See `time_cycles`.
    pub time_mask: u64,
}

/// `capabilities` bit: the time_* fields are valid.
pub const CAP_USER_TIME: u64 = 1 << 3;
/// `capabilities` bit: the TSC must be widened with time_cycles/time_mask.
pub const CAP_USER_TIME_SHORT: u64 = 1 << 5;

/// Offsets in [`PerfEventMmapPage`], for the assembly readers. The `lock`'s
/// is `weft-abi`'s because generated code reads it too.
pub use weft_abi::clock::PAGE_OFF_LOCK;
/// See [`PAGE_OFF_LOCK`].
pub const PAGE_OFF_TIME_RUNNING: usize = 32;
/// See [`PAGE_OFF_LOCK`].
pub const PAGE_OFF_CAPABILITIES: usize = 40;
/// See [`PAGE_OFF_LOCK`].
pub const PAGE_OFF_TIME_SHIFT: usize = 50;
/// See [`PAGE_OFF_LOCK`].
pub const PAGE_OFF_TIME_MULT: usize = 52;
/// See [`PAGE_OFF_LOCK`].
pub const PAGE_OFF_TIME_OFFSET: usize = 56;
const _: () = {
    assert!(offset_of!(PerfEventMmapPage, lock) == PAGE_OFF_LOCK);
    assert!(offset_of!(PerfEventMmapPage, time_running) == PAGE_OFF_TIME_RUNNING);
    assert!(offset_of!(PerfEventMmapPage, capabilities) == PAGE_OFF_CAPABILITIES);
    assert!(offset_of!(PerfEventMmapPage, time_shift) == PAGE_OFF_TIME_SHIFT);
    assert!(offset_of!(PerfEventMmapPage, time_mult) == PAGE_OFF_TIME_MULT);
    assert!(offset_of!(PerfEventMmapPage, time_offset) == PAGE_OFF_TIME_OFFSET);
    assert!(offset_of!(PerfEventMmapPage, time_zero) == 64);
    assert!(offset_of!(PerfEventMmapPage, time_mask) == 88);
};

/// `struct perf_event_attr` up to `config1` (PERF_ATTR_SIZE_VER0, 64 bytes,
/// which every kernel since 2.6.31 accepts).
#[repr(C)]
pub(crate) struct PerfEventAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}
const _: () = assert!(size_of::<PerfEventAttr>() == 64);

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_TASK_CLOCK: u64 = 1;
// exclude_kernel (bit 5) and exclude_hv (bit 6): they do not change what
// task-clock counts or the page's times, but they let the event open under
// perf_event_paranoid=2 without privileges. `inherit` stays clear: inherited
// contexts can be swapped between tasks without a sched-out/in, which would
// break the "lock changes on every switch" premise.
const ATTR_FLAGS: u64 = (1 << 5) | (1 << 6);
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;

/// The task-clock event every CPU clock opens (also the assembly reader's,
/// when a clock asked for an event makes one).
pub(crate) static TASK_CLOCK_ATTR: PerfEventAttr = PerfEventAttr {
    type_: PERF_TYPE_SOFTWARE,
    size: size_of::<PerfEventAttr>() as u32,
    config: PERF_COUNT_SW_TASK_CLOCK,
    sample_period: 0,
    sample_type: 0,
    read_format: 0,
    flags: ATTR_FLAGS,
    wakeup_events: 0,
    bp_type: 0,
    config1: 0,
};

/// A task-clock event on the calling thread with its user page mapped.
struct PerfTaskClock {
    fd: i32,
    page: *const PerfEventMmapPage,
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 {
        size as usize
    } else {
        4096
    }
}

impl PerfTaskClock {
    /// Returns the raw errno on failure (EACCES, ENOSYS, EPERM from
    /// seccomp, ENOENT...).
    fn open() -> Result<Self, i32> {
        Self::open_at(None)
    }

    /// An event on the calling thread, its page mapped at `at` when given
    /// (replacing the page there).
    fn open_at(at: Option<*const PerfEventMmapPage>) -> Result<Self, i32> {
        // SAFETY: attr is a valid, fully initialised perf_event_attr of the
        // size it declares; pid 0 / cpu -1 = this thread on any CPU.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                &TASK_CLOCK_ATTR as *const PerfEventAttr,
                0 as libc::pid_t,
                -1 as libc::c_int,
                -1 as libc::c_int,
                PERF_FLAG_FD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(errno());
        }
        let fd = fd as i32;
        let (hint, fixed) = match at {
            Some(at) => (at as *mut libc::c_void, libc::MAP_FIXED),
            None => (ptr::null_mut(), 0),
        };
        // SAFETY: maps only the user page of our own event (no data pages),
        // read-only: we never write to it. With `at`, over a page the
        // caller owns (see ThreadCpuClock::arm_event).
        let page = unsafe {
            libc::mmap(
                hint,
                page_size(),
                libc::PROT_READ,
                libc::MAP_SHARED | fixed,
                fd,
                0,
            )
        };
        if page == libc::MAP_FAILED {
            let e = errno();
            // SAFETY: fd is ours.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        Ok(Self {
            fd,
            page: page as *const PerfEventMmapPage,
        })
    }
}

impl Drop for PerfTaskClock {
    fn drop(&mut self) {
        // SAFETY: page and fd came from open() and are released once.
        unsafe {
            libc::munmap(self.page as *mut libc::c_void, page_size());
            libc::close(self.fd);
        }
    }
}

fn errno() -> i32 {
    // SAFETY: __errno_location always returns this thread's errno.
    unsafe { *libc::__errno_location() }
}

// ---------------------------------------------------------------------------
// Per-thread CPU clock
// ---------------------------------------------------------------------------

/// [`ThreadCpuClock::mode`]: lock/anchor algorithm (works with
/// `cap_user_time = 0`).
pub const CPU_ANCHOR: u32 = 0;
/// [`ThreadCpuClock::mode`]: the kernel's self-monitoring formula
/// (`cap_user_time = 1`).
pub const CPU_PERF_TIME: u32 = 1;
/// [`ThreadCpuClock::mode`]: `clock_gettime(CLOCK_THREAD_CPUTIME_ID)` on
/// every read.
pub const CPU_SYSCALL: u32 = 2;

/// Which CPU source a [`ThreadCpuClock`] should try first; it falls back
/// along PerfTime -> Anchor -> Syscall when the request is not available.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuPreference {
    /// The best available: PerfTime, else Anchor, else Syscall.
    Auto,
    /// The `cap_user_time` formula (needs `cap_user_time = 1`).
    PerfTime,
    /// The lock/anchor algorithm even when `cap_user_time = 1`.
    Anchor,
    /// A syscall on every read.
    Syscall,
}

/// The source a [`ThreadCpuClock`] uses, for reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuSource {
    /// perf task-clock page with `cap_user_time`: no syscall ever.
    PerfTime,
    /// perf task-clock page `lock` + TSC anchor: one syscall per context
    /// switch of the thread.
    Anchor,
    /// `CLOCK_THREAD_CPUTIME_ID` on every read: asked for.
    SyscallForced,
    /// `CLOCK_THREAD_CPUTIME_ID` on every read: perf_event_open or mmap
    /// failed with this errno.
    SyscallNoPerf(i32),
    /// `CLOCK_THREAD_CPUTIME_ID` on every read: the page lacks
    /// `cap_user_time` and the TSC is not usable for anchoring.
    SyscallNoTsc,
    /// `CLOCK_THREAD_CPUTIME_ID` on every read: the thread registered
    /// while no CPU timer was installed, so it got no perf event (which
    /// would have cost it at every context switch for its whole life).
    SyscallUnasked,
    /// `CLOCK_THREAD_CPUTIME_ID` on every read: its perf event was
    /// released when the last weft session ended, so that the thread's
    /// context switches cost what they cost before weft came.
    SyscallReleased,
    /// The CPU-time table a `sched_switch` program writes
    /// (`weft_abi::clock::table`) + TSC anchor: no perf event, no system
    /// call at a switch.
    Table,
}

impl CpuSource {
    /// The source of a clock with this [`ThreadCpuClock::mode`] and
    /// [`ThreadCpuClock::why`] (as a runtime records them in a thread's row).
    pub fn from_mode(mode: u32, why: i32) -> CpuSource {
        match mode {
            CPU_PERF_TIME => CpuSource::PerfTime,
            CPU_ANCHOR if why == WHY_CPU_ON_TABLE => CpuSource::Table,
            CPU_ANCHOR => CpuSource::Anchor,
            _ => match why {
                WHY_CPU_FORCED => CpuSource::SyscallForced,
                WHY_CPU_NO_TSC => CpuSource::SyscallNoTsc,
                WHY_CPU_UNASKED => CpuSource::SyscallUnasked,
                WHY_CPU_RELEASED => CpuSource::SyscallReleased,
                // Asked for an event, not made yet: none so far.
                WHY_CPU_ARM_ASKED => CpuSource::SyscallUnasked,
                e => CpuSource::SyscallNoPerf(e),
            },
        }
    }
}

impl fmt::Display for CpuSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::PerfTime => f.write_str(
                "perf task-clock mmap page, cap_user_time formula (no syscall)",
            ),
            Self::Anchor => f.write_str(
                "perf task-clock page lock + tsc anchor (one syscall per context switch)",
            ),
            Self::Table => f.write_str(
                "sched_switch table + tsc anchor (no perf event, no syscall at a switch)",
            ),
            Self::SyscallForced => {
                f.write_str("clock_gettime(CLOCK_THREAD_CPUTIME_ID) every read (forced)")
            }
            Self::SyscallNoPerf(e) => write!(
                f,
                "clock_gettime(CLOCK_THREAD_CPUTIME_ID) every read (perf_event_open failed: {})",
                io::Error::from_raw_os_error(*e)
            ),
            Self::SyscallNoTsc => f.write_str(
                "clock_gettime(CLOCK_THREAD_CPUTIME_ID) every read (no cap_user_time, tsc unusable)",
            ),
            Self::SyscallUnasked => f.write_str(
                "clock_gettime(CLOCK_THREAD_CPUTIME_ID) every read (the thread first ran \
                 instrumented code before any CPU timer: no perf event)",
            ),
            Self::SyscallReleased => f.write_str(
                "clock_gettime(CLOCK_THREAD_CPUTIME_ID) every read (the thread's perf event was \
                 released when the last weft session ended)",
            ),
        }
    }
}

/// Per-thread CPU clock state. Only the thread that created it may read it
/// (the event and CLOCK_THREAD_CPUTIME_ID are both about the calling
/// thread), so it is neither `Send` nor `Sync`. Layout read and written by
/// `weft_rt_cpu_now` (all offsets also exported as `CPU_OFF_*`):
///
/// | offset | field | |
/// |---|---|---|
/// | 0 | `page: *const PerfEventMmapPage` | null in syscall mode |
/// | 8 | `mode: u32` | [`CPU_ANCHOR`], [`CPU_PERF_TIME`], [`CPU_SYSCALL`] |
/// | 12 | `anchor_lock: u32` | page `lock` when the anchor was taken |
/// | 16 | `anchor_cpu_ns: u64` | thread CPU time at the anchor |
/// | 24 | `anchor_tsc: u64` | TSC right after `anchor_cpu_ns` was read |
/// | 32 | `mult: u32` | TSC-to-ns (copy of the wall calibration) |
/// | 36 | `shift: u32` | |
/// | 40 | `base_ns: u64` | perf-time mode: CPU time before the event |
/// | 48 | `last_ns: u64` | last value returned (reads never go back) |
/// | 56 | `reads: u64` | reads so far |
/// | 64 | `syscalls: u64` | re-anchors / fallback syscalls so far |
/// | 72 | `scratch: [u64; 2]` | timespec written by the raw syscall |
/// | 88 | `fd: i32` | the perf event, -1 if none owned |
/// | 92 | `why: i32` | errno / reason behind [`ThreadCpuClock::source`] |
/// | 96 | `max_age_tsc: u64` | anchor mode: re-anchor once the anchor is this many TSC ticks old; 0 in the other modes |
/// | 104 | `owns_page: u32` | 1: the page mapping is the clock's to unmap |
/// | 108 | `table_tid: u32` | on the CPU-time table: the thread whose slot `page` is |
/// | 112 | `ticks_offset: u64` | anchor mode: the CPU time in ticks is `tsc + ticks_offset` while the anchor holds |
/// | 120 | `to_ticks_q32: u64` | ticks per ns, 32.32 fixed point ([`TimerUnits::ticks_per_ns_q32`]) |
///
/// Generated timer code reads the CPU clock in *ticks* (the wall clock's
/// raw unit, see [`TimerUnits`]) inline: while the page's `lock` equals
/// `anchor_lock` and the anchor is younger than `max_age_tsc`, it is `tsc +
/// ticks_offset`, one `add`; otherwise it calls `weft_rt_cpu_ticks`. Every
/// re-anchor stores `anchor_lock` = 1 first (odd: a settled page lock is
/// always even, so no reader, not even a signal handler on this thread,
/// takes the fast path on a half-written anchor) and the new lock last.
///
/// Why an anchor ages out: between two context switches the TSC also counts
/// time the hypervisor steals from the vCPU (and interrupt time), which the
/// kernel does not charge to the thread. Re-anchoring every
/// [`MAX_ANCHOR_AGE_NS`] of running bounds that error to one such window —
/// one ~1 µs syscall per millisecond of a thread that reads its clock.
#[repr(C, align(64))]
pub struct ThreadCpuClock {
    page: *const PerfEventMmapPage,
    mode: u32,
    anchor_lock: u32,
    anchor_cpu_ns: u64,
    anchor_tsc: u64,
    mult: u32,
    shift: u32,
    base_ns: u64,
    last_ns: u64,
    reads: u64,
    syscalls: u64,
    scratch: [u64; 2],
    fd: i32,
    why: i32,
    max_age_tsc: u64,
    /// 1 when the page mapping is ours to unmap although `fd` is closed
    /// ([`ThreadCpuClock::close_fd`]).
    owns_page: u32,
    /// The thread whose CPU-time table slot `page` is, while on the table.
    table_tid: u32,
    ticks_offset: u64,
    to_ticks_q32: u64,
}

/// How old (in running time) an anchor may get before a read re-anchors.
pub const MAX_ANCHOR_AGE_NS: u64 = 1_000_000;

/// `max_age_tsc >> ANCHOR_WINDOW_SHIFT` bounds the window an anchor is
/// taken in (see `ThreadCpuClock::max_anchor_window`).
const ANCHOR_WINDOW_SHIFT: u32 = 7;

/// The most an anchor-mode reading can lag the kernel's clock: the longest
/// window (TSC, CPU clock syscall, TSC) an anchor is taken from.
pub const MAX_ANCHOR_WINDOW_NS: u64 = MAX_ANCHOR_AGE_NS >> ANCHOR_WINDOW_SHIFT;

/// TSC ticks in `ns` at the calibration `mult`/`shift` (ns = ticks * mult >> shift).
fn ns_to_ticks(ns: u64, mult: u32, shift: u32) -> u64 {
    if mult == 0 || shift > 63 {
        return u64::MAX;
    }
    u64::try_from((u128::from(ns) << shift) / u128::from(mult)).unwrap_or(u64::MAX)
}

/// Offsets in [`ThreadCpuClock`], for the assembly readers. Those generated
/// code reads inline too (the page, the anchor, its age, `ticks_offset`)
/// are `weft-abi`'s.
pub use weft_abi::clock::{
    CPU_OFF_ANCHOR_LOCK, CPU_OFF_ANCHOR_TSC, CPU_OFF_MAX_AGE, CPU_OFF_PAGE, CPU_OFF_TICKS_OFFSET,
};
/// See [`CPU_OFF_PAGE`].
pub const CPU_OFF_MODE: usize = 8;
/// See [`CPU_OFF_PAGE`].
pub const CPU_OFF_ANCHOR_CPU: usize = 16;
/// See [`CPU_OFF_PAGE`].
pub const CPU_OFF_MULT: usize = 32;
/// See [`CPU_OFF_PAGE`].
pub const CPU_OFF_SHIFT: usize = 36;
/// See [`CPU_OFF_PAGE`].
pub const CPU_OFF_BASE: usize = 40;
/// See [`CPU_OFF_PAGE`].
pub const CPU_OFF_LAST: usize = 48;
/// See [`CPU_OFF_PAGE`].
pub const CPU_OFF_READS: usize = 56;
/// See [`CPU_OFF_PAGE`].
pub const CPU_OFF_SYSCALLS: usize = 64;
/// See [`CPU_OFF_PAGE`].
pub const CPU_OFF_SCRATCH: usize = 72;
/// See [`CPU_OFF_PAGE`].
pub const CPU_OFF_TO_TICKS: usize = 120;
/// An `anchor_lock` no settled page lock equals (see [`ThreadCpuClock`]).
const LOCK_INVALID: u32 = 1;
const _: () = {
    assert!(offset_of!(ThreadCpuClock, page) == CPU_OFF_PAGE);
    assert!(offset_of!(ThreadCpuClock, mode) == CPU_OFF_MODE);
    assert!(offset_of!(ThreadCpuClock, anchor_lock) == CPU_OFF_ANCHOR_LOCK);
    assert!(offset_of!(ThreadCpuClock, anchor_cpu_ns) == CPU_OFF_ANCHOR_CPU);
    assert!(offset_of!(ThreadCpuClock, anchor_tsc) == CPU_OFF_ANCHOR_TSC);
    assert!(offset_of!(ThreadCpuClock, max_age_tsc) == CPU_OFF_MAX_AGE);
    assert!(offset_of!(ThreadCpuClock, mult) == CPU_OFF_MULT);
    assert!(offset_of!(ThreadCpuClock, shift) == CPU_OFF_SHIFT);
    assert!(offset_of!(ThreadCpuClock, base_ns) == CPU_OFF_BASE);
    assert!(offset_of!(ThreadCpuClock, last_ns) == CPU_OFF_LAST);
    assert!(offset_of!(ThreadCpuClock, reads) == CPU_OFF_READS);
    assert!(offset_of!(ThreadCpuClock, syscalls) == CPU_OFF_SYSCALLS);
    assert!(offset_of!(ThreadCpuClock, scratch) == CPU_OFF_SCRATCH);
    assert!(offset_of!(ThreadCpuClock, fd) == 88);
    assert!(offset_of!(ThreadCpuClock, why) == CPU_OFF_WHY);
    assert!(offset_of!(ThreadCpuClock, owns_page) == CPU_OFF_OWNS_PAGE);
    assert!(offset_of!(ThreadCpuClock, table_tid) == CPU_OFF_TABLE_TID);
    assert!(offset_of!(ThreadCpuClock, ticks_offset) == CPU_OFF_TICKS_OFFSET);
    assert!(offset_of!(ThreadCpuClock, to_ticks_q32) == CPU_OFF_TO_TICKS);
    assert!(size_of::<ThreadCpuClock>() == 128);
    // Each row keeps its thread's clock in place (`RowHeader::clock`).
    assert!(size_of::<ThreadCpuClock>() <= size_of::<ClockStorage>());
    assert!(align_of::<ThreadCpuClock>() <= align_of::<ClockStorage>());
};

/// [`ThreadCpuClock::why`] for a forced syscall mode / an unusable TSC;
/// other values are an errno from perf_event_open (0 = no fallback).
const WHY_CPU_FORCED: i32 = -1;
const WHY_CPU_NO_TSC: i32 = -2;
/// [`ThreadCpuClock::why`] of a clock made without a perf event because no
/// CPU timer was installed when its thread registered.
pub const WHY_CPU_UNASKED: i32 = -3;
/// [`ThreadCpuClock::why`] the injector writes into a clock whose page it
/// has found mapped as this clock's perf event, to ask
/// `weft_rt_release_cpu_clocks`
/// to release it.
pub const WHY_CPU_RELEASE_ASKED: i32 = -4;
/// [`ThreadCpuClock::why`] of a clock whose perf event was released.
pub const WHY_CPU_RELEASED: i32 = -5;
/// [`ThreadCpuClock::why`] the injector writes into a clock that reads a
/// system call for want of a perf event ([`WHY_CPU_UNASKED`],
/// [`WHY_CPU_RELEASED`]) when it installs a CPU timer: the owner makes
/// the event at its next read, outside any stop of the world.
pub const WHY_CPU_ARM_ASKED: i32 = -6;
/// [`ThreadCpuClock::why`] the injector writes into a clock that has a perf
/// event of its own (anchor or perf-time mode), followed by a zero
/// `max_age_tsc` so that no fast path reads the anchor again: the owner
/// lets the event go at its next read and reads a system call from then
/// on, outside any stop of the world (an event costs its thread at every
/// switch; a thread that switches more often than it reads its clock pays
/// less for the system call).
pub const WHY_CPU_DROP_ASKED: i32 = -8;
/// The row's `cpu_why` (not the clock's: the row's `cpu_clock` pointer is
/// 0 then) while the injector has paused the thread's CPU clock: it
/// writes this, then 0 over the pointer, so that the thread's timers read
/// no CPU time at all (the generated code and the runtime skip a thread
/// with no clock) and cost nothing for it, and writes the pointer back
/// to resume. Only a clock with no perf event is paused. The clock stays
/// in the row's storage meanwhile: a thread that exits paused drops it
/// from there.
pub const WHY_CPU_PAUSED: i32 = -9;
/// Byte offset of [`ThreadCpuClock::why`], for the injector's request.
pub const CPU_OFF_WHY: usize = 92;
/// Byte offset of `owns_page`, for the assembly reader.
pub const CPU_OFF_OWNS_PAGE: usize = 104;
/// Byte offset of `table_tid`, for the assembly reader.
pub const CPU_OFF_TABLE_TID: usize = 108;
/// [`ThreadCpuClock::why`] of a clock in anchor mode on its thread's slot
/// of the CPU-time table rather than on a perf page.
pub const WHY_CPU_ON_TABLE: i32 = -7;

impl ThreadCpuClock {
    /// Sets up the calling thread's CPU clock (syscalls: perf_event_open,
    /// mmap, clock_gettime). `wall` supplies the TSC calibration the anchor
    /// mode converts deltas with; a non-TSC wall clock rules that mode out.
    /// Never fails: the worst case is [`CPU_SYSCALL`].
    pub fn new(wall: &WallClock, preference: CpuPreference) -> Self {
        let mut clock = Self::syscall_mode(wall);
        if preference == CpuPreference::Syscall {
            return clock;
        }
        if preference != CpuPreference::PerfTime && wall.kind == WALL_TSC && clock.take_table_slot()
        {
            clock.reanchor();
            return clock;
        }
        let event = match PerfTaskClock::open() {
            Ok(event) => event,
            Err(e) => {
                clock.why = e;
                return clock;
            }
        };
        // SAFETY: the page is mapped for as long as the event lives.
        let caps = unsafe { ptr::addr_of!((*event.page).capabilities).read_volatile() };
        // SAFETY: as above.
        let shift = unsafe { ptr::addr_of!((*event.page).time_shift).read_volatile() };
        let user_time = caps & CAP_USER_TIME != 0 && caps & CAP_USER_TIME_SHORT == 0 && shift <= 32;
        let mode = if user_time && preference != CpuPreference::Anchor {
            CPU_PERF_TIME
        } else if wall.kind == WALL_TSC {
            CPU_ANCHOR
        } else {
            clock.why = WHY_CPU_NO_TSC;
            return clock; // dropping `event` closes it
        };
        // Hand the event over to the clock (Drop of ThreadCpuClock releases it).
        clock.page = event.page;
        clock.fd = event.fd;
        core::mem::forget(event);
        clock.why = 0;
        clock.mode = mode;
        if mode == CPU_PERF_TIME {
            // The event counts only from now: the thread's CPU time before
            // it is the difference between the two clocks read back to back.
            let cpu = thread_cputime_ns();
            let perf = clock.perf_time_ns().unwrap_or(0);
            clock.base_ns = cpu.wrapping_sub(perf);
        } else {
            clock.max_age_tsc = ns_to_ticks(MAX_ANCHOR_AGE_NS, wall.cal.mult, wall.cal.shift);
            clock.reanchor();
        }
        clock
    }

    /// A clock with no perf event, for a thread that registered while no
    /// CPU timer was installed: a perf event costs its thread at every
    /// context switch (2.4 us a switch measured on a KVM guest) for the
    /// rest of its life, timed code or not. Read with a system call if a
    /// CPU timer comes later.
    pub fn without_event(wall: &WallClock) -> Self {
        Self {
            why: WHY_CPU_UNASKED,
            ..Self::syscall_mode(wall)
        }
    }

    /// A clock on a caller-provided page in [`CPU_PERF_TIME`] mode, to
    /// exercise the `cap_user_time` formula on machines whose kernel does
    /// not offer it.
    ///
    /// # Safety
    /// `page` must stay valid and readable for the life of the clock; it is
    /// not unmapped on drop.
    #[doc(hidden)]
    pub unsafe fn with_page(
        page: *const PerfEventMmapPage,
        wall: &WallClock,
        base_ns: u64,
    ) -> Self {
        Self {
            page,
            mode: CPU_PERF_TIME,
            base_ns,
            why: 0,
            ..Self::syscall_mode(wall)
        }
    }

    /// A clock in [`CPU_SYSCALL`] mode with no page, the TSC conversion of
    /// `wall`: where every constructor starts.
    fn syscall_mode(wall: &WallClock) -> Self {
        Self {
            page: ptr::null(),
            mode: CPU_SYSCALL,
            anchor_lock: 0,
            anchor_cpu_ns: 0,
            anchor_tsc: 0,
            mult: wall.cal.mult,
            shift: wall.cal.shift,
            base_ns: 0,
            last_ns: 0,
            reads: 0,
            syscalls: 0,
            scratch: [0; 2],
            fd: -1,
            why: WHY_CPU_FORCED,
            // The inline fast path is for anchor mode only: with 0 its age
            // test always fails (before it touches the page).
            max_age_tsc: 0,
            owns_page: 0,
            table_tid: 0,
            ticks_offset: 0,
            to_ticks_q32: wall.units().ticks_per_ns_q32,
        }
    }

    /// Which source this clock reads.
    pub fn source(&self) -> CpuSource {
        CpuSource::from_mode(self.mode, self.why)
    }

    /// [`CPU_ANCHOR`], [`CPU_PERF_TIME`] or [`CPU_SYSCALL`].
    pub fn mode(&self) -> u32 {
        self.mode
    }

    /// The reason code behind a syscall-mode source (see
    /// [`CpuSource::from_mode`]).
    pub fn why(&self) -> i32 {
        self.why
    }

    /// The perf event's file descriptor, -1 when none is open.
    pub fn fd(&self) -> i32 {
        self.fd
    }

    /// Closes the perf event's file descriptor but keeps its page mapped:
    /// the mapping holds the event alive and the kernel keeps updating the
    /// page. A runtime inside someone else's process must not use up one of
    /// its descriptors per thread.
    pub fn close_fd(&mut self) {
        if self.fd >= 0 {
            // SAFETY: we own the fd (set in new()); the mapping keeps its
            // own reference to the event.
            unsafe { libc::close(self.fd) };
            self.fd = -1;
            self.owns_page = 1;
        }
    }

    /// Where the clock's page is mapped (0: no page), to find it in the
    /// process's maps.
    pub fn page_address(&self) -> usize {
        self.page as usize
    }

    /// Reads so far (Rust and assembly readers alike).
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// Syscalls made by reads so far: re-anchors, or every read in syscall
    /// mode.
    pub fn syscalls(&self) -> u64 {
        self.syscalls
    }

    /// The page's `lock` field now (None without a page): for checking the
    /// premise of the anchor mode.
    pub fn page_lock(&self) -> Option<u32> {
        if self.page.is_null() {
            return None;
        }
        // SAFETY: the page is mapped while self lives.
        Some(unsafe { ptr::addr_of!((*self.page).lock).read_volatile() })
    }

    fn page_lock_raw(&self) -> u32 {
        // SAFETY: only called in page modes, where page is mapped.
        unsafe { ptr::addr_of!((*self.page).lock).read_volatile() }
    }

    /// The perf self-monitoring formula from linux/perf_event.h, for a
    /// software event whose thread is running (it is: we are it). None when
    /// the page no longer offers `cap_user_time` (the kernel can drop it if
    /// sched_clock becomes unstable).
    fn perf_time_ns(&self) -> Option<u64> {
        let page = self.page;
        loop {
            // SAFETY: page is mapped while self lives; volatile reads because
            // the kernel rewrites it, bracketed by the seqlock `lock`.
            unsafe {
                let seq = ptr::addr_of!((*page).lock).read_volatile();
                compiler_fence(Ordering::SeqCst);
                let caps = ptr::addr_of!((*page).capabilities).read_volatile();
                let running = ptr::addr_of!((*page).time_running).read_volatile();
                let offset = ptr::addr_of!((*page).time_offset).read_volatile();
                let mult = ptr::addr_of!((*page).time_mult).read_volatile();
                let shift = u32::from(ptr::addr_of!((*page).time_shift).read_volatile());
                let tsc = rdtsc();
                compiler_fence(Ordering::SeqCst);
                if ptr::addr_of!((*page).lock).read_volatile() != seq {
                    continue;
                }
                if caps & CAP_USER_TIME == 0 || caps & CAP_USER_TIME_SHORT != 0 || shift > 32 {
                    return None;
                }
                let delta = offset.wrapping_add(mul_u64_u32_shr(tsc, mult, shift));
                return Some(running.wrapping_add(delta));
            }
        }
    }

    /// Takes a new anchor: one CLOCK_THREAD_CPUTIME_ID read paired with the
    /// TSC, valid only if no switch happened in between (same `lock` before
    /// and after). Returns the CPU time read.
    fn reanchor(&mut self) -> u64 {
        if self.why == WHY_CPU_ON_TABLE {
            if let Some(cpu) = self.reanchor_from_table() {
                return cpu;
            }
        }
        self.syscalls += 1;
        let before = self.page_lock_raw();
        let tsc_before = rdtsc();
        let cpu = thread_cputime_ns();
        let tsc = rdtsc();
        let after = self.page_lock_raw();
        if before == after && tsc.wrapping_sub(tsc_before) < self.max_anchor_window() {
            self.publish_anchor(cpu, tsc, after);
        }
        // Otherwise the thread was switched out around the syscall, or the
        // syscall took long (an interrupt the kernel charges to the thread
        // came in between): the TSC read is not the moment of the CPU
        // reading. Keep the stale anchor so the next read tries again. The
        // value read is right either way.
        cpu
    }

    /// Makes (`cpu` ns at `tsc`, taken while the page's lock was `lock`)
    /// the anchor. The fast paths (Rust, assembly, generated) must never
    /// see a half-written anchor, not even from a signal handler.
    fn publish_anchor(&mut self, cpu: u64, tsc: u64, lock: u32) {
        self.anchor_lock = LOCK_INVALID;
        compiler_fence(Ordering::SeqCst);
        self.anchor_cpu_ns = cpu;
        self.anchor_tsc = tsc;
        self.ticks_offset = q32_mul(cpu, self.to_ticks_q32).wrapping_sub(tsc);
        compiler_fence(Ordering::SeqCst);
        self.anchor_lock = lock;
    }

    /// The longest `rdtsc` → CPU clock syscall → `rdtsc` window an anchor is
    /// taken from: 1/128 of the anchor's age limit (7.8 µs): an anchor is
    /// off by at most that much. Measured on a KVM guest: median 0.37 µs,
    /// 99.9th percentile 2.5 µs, the longest of 200,000 65 µs. Where every
    /// window is longer (a machine emulated by QEMU's TCG), no anchor
    /// holds and each read is the syscall: slower, still right.
    fn max_anchor_window(&self) -> u64 {
        self.max_age_tsc >> ANCHOR_WINDOW_SHIFT
    }

    /// The thread's CPU time in ns (Rust reader). Must be called on the
    /// thread that created the clock.
    #[inline]
    pub fn now(&mut self) -> u64 {
        self.reads += 1;
        if self.why == WHY_CPU_DROP_ASKED {
            // SAFETY: the owner is this thread, inside its own read; the
            // injector asks only clocks whose page is their own event.
            unsafe { self.release_event() };
            self.why = WHY_CPU_RELEASED;
        }
        if self.mode == CPU_SYSCALL && self.why == WHY_CPU_ARM_ASKED {
            // Anchor mode with an invalid anchor after this: re-anchored
            // below.
            self.arm_self();
        }
        let value = match self.mode {
            CPU_ANCHOR => {
                // rdtsc BEFORE the lock read: if the lock still matches, no
                // sched-in happened between the anchor and the TSC read.
                let tsc = rdtsc();
                let delta = tsc.saturating_sub(self.anchor_tsc);
                if self.page_lock_raw() == self.anchor_lock && delta < self.max_age_tsc {
                    self.anchor_cpu_ns + mul_u64_u32_shr(delta, self.mult, self.shift)
                } else {
                    self.reanchor()
                }
            }
            CPU_PERF_TIME => match self.perf_time_ns() {
                Some(t) => t.wrapping_add(self.base_ns),
                None => {
                    self.syscalls += 1;
                    thread_cputime_ns()
                }
            },
            _ => {
                self.syscalls += 1;
                thread_cputime_ns()
            }
        };
        // Never go back: an anchor extrapolation can run slightly ahead of
        // the kernel's accounting (it counts IRQ and steal time the kernel
        // may exclude), and timers subtract readings.
        let value = value.max(self.last_ns);
        self.last_ns = value;
        value
    }

    /// Same as [`ThreadCpuClock::now`], through the assembly reader.
    #[inline]
    pub fn now_asm(&mut self) -> u64 {
        // SAFETY: self is this thread's valid clock state.
        unsafe { weft_rt_cpu_now(self) }
    }

    /// The thread's CPU time in raw timer ticks ([`TimerUnits`]), as
    /// generated code reads it: `tsc + ticks_offset` while the anchor holds
    /// (`tsc` is the caller's raw wall reading, taken just before), else
    /// [`ThreadCpuClock::now`] converted. Must be called on the thread that
    /// created the clock.
    pub fn ticks(&mut self, tsc: u64) -> u64 {
        if tsc.wrapping_sub(self.anchor_tsc) < self.max_age_tsc
            && self.page_lock_raw() == self.anchor_lock
        {
            return tsc.wrapping_add(self.ticks_offset);
        }
        q32_mul(self.now(), self.to_ticks_q32)
    }

    /// Same as [`ThreadCpuClock::ticks`], through the assembly slow path
    /// generated code calls (`weft_rt_cpu_ticks`).
    pub fn ticks_asm(&mut self, tsc: u64) -> u64 {
        let out: u64;
        // SAFETY: self is this thread's valid clock state; the routine
        // preserves every register but rax and the flags.
        unsafe {
            asm!(
                "call {f}",
                f = sym weft_rt_cpu_ticks,
                inout("rax") tsc => out,
                in("rdx") self as *mut Self,
            );
        }
        out
    }
}

impl Drop for ThreadCpuClock {
    fn drop(&mut self) {
        self.leave_table_slot();
        if self.fd >= 0 || self.owns_page != 0 {
            // SAFETY: we own the page mapping (set in new()) and the fd when
            // it is still open.
            unsafe {
                libc::munmap(self.page as *mut libc::c_void, page_size());
                if self.fd >= 0 {
                    libc::close(self.fd);
                }
            }
        }
    }
}

/// Another thread's CPU time in ns, read from outside (any process that may
/// read `/proc/PID/task/TID/schedstat`, whose first field is the kernel's
/// `sum_exec_runtime`). Lags CLOCK_THREAD_CPUTIME_ID by the part of the
/// current run not yet accounted (at most a tick, typically less) for a
/// thread that is on a CPU right now; exact for one that is not.
pub fn thread_cpu_ns_from_outside(pid: u32, tid: u32) -> io::Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat"))?;
    text.split_ascii_whitespace()
        .next()
        .and_then(|field| field.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed schedstat"))
}
