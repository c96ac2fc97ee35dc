//! Correctness of weft-rt's clock sources against the kernel's own clocks.
//!
//! Bounds are generous correctness bounds (the machine is a noisy shared
//! 2-vCPU guest), never speed assertions: speed lives in benches/clock.rs.
#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use std::hint::black_box;
use std::sync::OnceLock;
use std::time::Duration;
use weft_rt::clock::*;

fn wall() -> &'static WallClock {
    static WALL: OnceLock<WallClock> = OnceLock::new();
    WALL.get_or_init(|| WallClock::new(WallPreference::Auto))
}

/// Spins until this thread has used `ns` of CPU time (by the kernel's clock).
fn burn_cpu(ns: u64) {
    let start = thread_cputime_ns();
    let mut x = 0u64;
    while thread_cputime_ns() - start < ns {
        for i in 0..1000 {
            x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
}

/// Spins for `ns` of wall time without any syscall (so without giving the
/// kernel a reason to switch us out, other than preemption).
fn spin_wall(ns: u64) {
    let start = monotonic_ns();
    while monotonic_ns() - start < ns {
        std::hint::spin_loop();
    }
}

fn switches() -> u64 {
    // SAFETY: getrusage writes into the zeroed struct we pass.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut usage);
        (usage.ru_nvcsw + usage.ru_nivcsw) as u64
    }
}

fn assert_close(what: &str, got: u64, want: u64, rel: f64, abs_ns: u64) {
    let diff = got.abs_diff(want);
    let bound = (want as f64 * rel) as u64 + abs_ns;
    assert!(
        diff <= bound,
        "{what}: got {got} want {want} (diff {diff} ns > bound {bound} ns)"
    );
}

/// Every CPU source that can be had here, forced one at a time.
fn cpu_clocks() -> Vec<ThreadCpuClock> {
    let mut clocks = Vec::new();
    for preference in [
        CpuPreference::PerfTime,
        CpuPreference::Anchor,
        CpuPreference::Syscall,
    ] {
        let clock = ThreadCpuClock::new(wall(), preference);
        if !clocks
            .iter()
            .any(|c: &ThreadCpuClock| c.mode() == clock.mode())
        {
            clocks.push(clock);
        }
    }
    clocks
}

#[test]
fn mul_shift_is_exact() {
    for &(a, mul, shift) in &[
        (0u64, 0u32, 0u32),
        (u64::MAX >> 8, 0x3fff_ffff, 32),
        (123_456_789_012_345, 2_862_933_555, 32),
        (1 << 40, 1, 0),
        (987_654_321, 12_345, 7),
    ] {
        let exact = ((u128::from(a) * u128::from(mul)) >> shift) as u64;
        assert_eq!(mul_u64_u32_shr(a, mul, shift), exact, "{a} {mul} {shift}");
    }
    let (mult, shift) = TscCalibration::mult_shift(1_000_000, 3_000_000).unwrap();
    assert_eq!(shift, 32);
    assert_close("1/3 ns per tick", u64::from(mult), (1u64 << 32) / 3, 0.0, 1);
}

#[test]
fn wall_clock_tracks_monotonic() {
    let forced = WallClock::new(WallPreference::Monotonic);
    eprintln!("wall source: {}", wall().source());
    assert_eq!(forced.source(), WallSource::MonotonicForced);
    if tsc_is_invariant() {
        assert_eq!(wall().kind, WALL_TSC);
    }
    for clock in [wall(), &forced] {
        let mono0 = monotonic_ns();
        let (rust0, asm0) = (clock.now(), clock.now_asm());
        for interval in [0u64, 1_000_000, 10_000_000, 50_000_000] {
            std::thread::sleep(Duration::from_nanos(interval));
            // Bracket both readers between two CLOCK_MONOTONIC reads.
            let before = monotonic_ns();
            let rust = clock.now();
            let asm = clock.now_asm();
            let after = monotonic_ns();
            let elapsed = after - mono0;
            let slack = (elapsed as f64 * 0.005) as u64 + 50_000;
            for (name, value) in [("rust", rust), ("asm", asm)] {
                assert!(
                    value + slack >= before && value <= after + slack,
                    "{} {name}: {value} not within [{before}, {after}] ± {slack}",
                    clock.source()
                );
            }
            assert_close("rust delta", rust - rust0, after - mono0, 0.005, 50_000);
            assert_close("asm delta", asm - asm0, after - mono0, 0.005, 50_000);
        }
    }
}

#[test]
fn cpu_clock_matches_thread_cputime_on_busy_thread() {
    for mut clock in cpu_clocks() {
        eprintln!("cpu source: {}", clock.source());
        let kernel0 = thread_cputime_ns();
        let (rust0, asm0) = (clock.now(), clock.now_asm());
        for _ in 0..5 {
            burn_cpu(20_000_000);
            let kernel = thread_cputime_ns() - kernel0;
            let rust = clock.now() - rust0;
            let asm = clock.now_asm() - asm0;
            // 3% (the timers' acceptance bound) rather than tighter: between
            // two context switches the anchored clock counts what the TSC
            // sees, including time the host steals from this vCPU, which
            // a loaded shared CI machine does often.
            assert_close(
                &format!("{} rust", clock.source()),
                rust,
                kernel,
                0.03,
                500_000,
            );
            assert_close(
                &format!("{} asm", clock.source()),
                asm,
                kernel,
                0.03,
                500_000,
            );
        }
        assert_eq!(clock.reads(), 12);
        if clock.mode() == CPU_SYSCALL {
            assert_eq!(clock.syscalls(), 12);
        }
    }
}

#[test]
fn cpu_clock_excludes_sleep() {
    for mut clock in cpu_clocks() {
        let wall0 = monotonic_ns();
        let kernel0 = thread_cputime_ns();
        let (rust0, asm0) = (clock.now(), clock.now_asm());
        let syscalls0 = clock.syscalls();
        for _ in 0..3 {
            burn_cpu(10_000_000);
            std::thread::sleep(Duration::from_millis(50));
            // Read after every sleep so the sleep lies inside an interval
            // the clock must not count.
            black_box(clock.now());
            black_box(clock.now_asm());
        }
        burn_cpu(10_000_000);
        let kernel = thread_cputime_ns() - kernel0;
        let rust = clock.now() - rust0;
        let asm = clock.now_asm() - asm0;
        let wall_elapsed = monotonic_ns() - wall0;
        let name = clock.source().to_string();
        assert!(wall_elapsed >= 150_000_000, "slept less than 150 ms?");
        assert!(
            kernel < wall_elapsed - 100_000_000,
            "{name}: kernel counted sleep?"
        );
        assert_close(&format!("{name} rust"), rust, kernel, 0.01, 100_000);
        assert_close(&format!("{name} asm"), asm, kernel, 0.01, 100_000);
        if clock.mode() == CPU_ANCHOR {
            // Each sleep is a switch: the reads after it must re-anchor.
            assert!(
                clock.syscalls() - syscalls0 >= 3,
                "{name}: no re-anchor after sleeps"
            );
        }
    }
}

#[test]
fn cpu_clock_with_more_threads_than_cores() {
    let threads: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(|| {
                let mut results = Vec::new();
                for mut clock in cpu_clocks() {
                    let kernel0 = thread_cputime_ns();
                    let (rust0, asm0) = (clock.now(), clock.now_asm());
                    let start = monotonic_ns();
                    // Read often while competing for the two vCPUs.
                    while thread_cputime_ns() - kernel0 < 150_000_000 {
                        spin_wall(20_000);
                        black_box(clock.now());
                        black_box(clock.now_asm());
                    }
                    let rust = clock.now() - rust0;
                    let asm = clock.now_asm() - asm0;
                    let kernel = thread_cputime_ns() - kernel0;
                    let elapsed = monotonic_ns() - start;
                    results.push((
                        clock.source().to_string(),
                        rust,
                        asm,
                        kernel,
                        elapsed,
                        clock.syscalls(),
                    ));
                }
                results
            })
        })
        .collect();
    let mut anchor_syscalls = 0;
    let mut preempted = false;
    for thread in threads {
        for (name, rust, asm, kernel, elapsed, syscalls) in thread.join().unwrap() {
            eprintln!("{name}: cpu {kernel} ns over {elapsed} ns wall, {syscalls} syscalls");
            assert_close(&format!("{name} rust"), rust, kernel, 0.03, 100_000);
            assert_close(&format!("{name} asm"), asm, kernel, 0.03, 100_000);
            preempted |= elapsed > kernel + kernel / 5;
            if name.contains("anchor") {
                anchor_syscalls += syscalls;
            }
        }
    }
    // With 4 spinning threads on 2 vCPUs they must have been switched out,
    // so the anchor clocks must have re-anchored (if that source exists).
    assert!(preempted || std::thread::available_parallelism().map_or(0, |n| n.get()) > 4);
    if ThreadCpuClock::new(wall(), CpuPreference::Anchor).mode() == CPU_ANCHOR {
        assert!(anchor_syscalls > 4, "anchor clocks never re-anchored");
    }
}

/// An anchor pairs a CPU clock syscall with the TSC read after it; taken
/// only when the syscall's window was short, it never puts a reading behind
/// the kernel's clock by more than that window (an interrupt the kernel
/// charges to the thread inside a long window put readings 106 µs behind
/// before the window was bounded). Ahead is allowed (stolen time), behind
/// is what makes a timer's CPU exceed its wall time.
#[test]
fn anchor_readings_never_lag_the_kernel_clock() {
    if ThreadCpuClock::new(wall(), CpuPreference::Anchor).mode() != CPU_ANCHOR {
        eprintln!("no anchor mode here: premise not testable");
        return;
    }
    let threads: Vec<_> = (0..3)
        .map(|_| {
            std::thread::spawn(|| {
                let mut clock = ThreadCpuClock::new(wall(), CpuPreference::Anchor);
                let units = wall().units();
                let (mut worst, mut reads) = (0i64, 0u64);
                let start = monotonic_ns();
                while monotonic_ns() - start < 400_000_000 {
                    let kernel = thread_cputime_ns();
                    let ours = match reads % 3 {
                        0 => clock.now(),
                        1 => clock.now_asm(),
                        _ => units.to_ns(clock.ticks(wall().raw())),
                    };
                    worst = worst.max(kernel as i64 - ours as i64);
                    reads += 1;
                    spin_wall(2_000);
                }
                (worst, reads, clock.syscalls())
            })
        })
        .collect();
    for thread in threads {
        let (worst, reads, syscalls) = thread.join().unwrap();
        eprintln!("{reads} reads, {syscalls} anchors tried: at most {worst} ns behind");
        assert!(
            worst <= (MAX_ANCHOR_WINDOW_NS + 5_000) as i64,
            "a reading {worst} ns behind the kernel's clock (bound {MAX_ANCHOR_WINDOW_NS} ns)"
        );
    }
}

/// The premise of the anchor mode: the page's `lock` changes whenever the
/// thread was switched out and back in, and not while it runs on.
#[test]
fn page_lock_changes_exactly_on_context_switches() {
    let clock = ThreadCpuClock::new(wall(), CpuPreference::Anchor);
    let Some(_) = clock.page_lock() else {
        eprintln!(
            "no perf page here ({}): premise not testable",
            clock.source()
        );
        return;
    };
    let lock = || clock.page_lock().unwrap();
    // Switches (voluntary: sleep, yield with company) must change the lock.
    let (mut switched_windows, mut quiet_windows) = (0, 0);
    let companion = std::thread::spawn(|| spin_wall(300_000_000));
    // 60 rounds, then more (with short spins) until a window without a
    // switch shows up: on a loaded machine every long window may see one.
    let mut round = 0;
    while round < 60 || (quiet_windows == 0 && round < 2_000) {
        round += 1;
        let (l0, s0) = (lock(), switches());
        match round % 3 {
            _ if round > 60 => spin_wall(20_000),
            0 => std::thread::sleep(Duration::from_micros(200)),
            1 => {
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            }
            _ => spin_wall(500_000),
        }
        let (l1, s1) = (lock(), switches());
        if s1 != s0 {
            switched_windows += 1;
            assert_ne!(
                l0,
                l1,
                "round {round}: {} switches but lock unchanged",
                s1 - s0
            );
        } else {
            quiet_windows += 1;
            assert_eq!(l0, l1, "round {round}: lock changed without a switch");
        }
        assert_eq!(l1 % 2, 0, "lock odd while we run: update in progress?");
    }
    companion.join().unwrap();
    eprintln!("lock premise: {switched_windows} windows with switches (all changed lock), {quiet_windows} without (none changed it)");
    assert!(switched_windows >= 20, "sleeps did not switch?");
    assert!(quiet_windows >= 1, "never ran a window without a switch");
}

/// The runtime closes each thread's perf fd at once (a target must not lose
/// a descriptor per thread) and keeps only the page mapping: the kernel
/// must go on updating the page, and the clock must stay right.
#[test]
fn clock_keeps_working_after_its_fd_is_closed() {
    let mut clock = ThreadCpuClock::new(wall(), CpuPreference::Anchor);
    let Some(l0) = clock.page_lock() else {
        eprintln!("no perf page here ({}): nothing to test", clock.source());
        return;
    };
    let fd = clock.fd();
    assert!(fd >= 0, "the perf event holds an fd");
    clock.close_fd();
    assert_eq!(clock.fd(), -1, "close_fd must release the descriptor");
    // Sleeping switches the thread out: the page's lock must still move.
    std::thread::sleep(Duration::from_millis(2));
    let l1 = clock.page_lock().unwrap();
    assert_ne!(
        l0, l1,
        "the page is no longer updated once its fd is closed"
    );
    let c0 = clock.now();
    let t0 = thread_cputime_ns();
    burn_cpu(20_000_000);
    std::thread::sleep(Duration::from_millis(5));
    burn_cpu(20_000_000);
    let c1 = clock.now();
    let t1 = thread_cputime_ns();
    assert_close("cpu after close_fd", c1 - c0, t1 - t0, 0.03, 200_000);
}

/// A fake perf page with cap_user_time exercises the formula (kernels in
/// KVM guests usually leave cap_user_time = 0, so the real page cannot).
#[test]
fn perf_time_formula_on_fake_page() {
    if wall().kind != WALL_TSC {
        return;
    }
    let cal = wall().cal;
    // SAFETY: an all-zero page is a valid value of this plain-data struct.
    let mut page: Box<PerfEventMmapPage> = Box::new(unsafe { std::mem::zeroed() });
    let tsc0 = rdtsc();
    page.lock = 2;
    page.capabilities = CAP_USER_TIME | 2;
    page.time_mult = cal.mult;
    page.time_shift = cal.shift as u16;
    page.time_running = 7_000_000;
    // delta = time_offset + cyc2ns(tsc) is 0 at tsc0, like a fresh update.
    page.time_offset = mul_u64_u32_shr(tsc0, cal.mult, cal.shift).wrapping_neg();
    let base = 1_000_000_000;
    // SAFETY: the boxed page outlives both clocks.
    let (mut a, mut b) = unsafe {
        (
            ThreadCpuClock::with_page(&*page, wall(), base),
            ThreadCpuClock::with_page(&*page, wall(), base),
        )
    };
    spin_wall(5_000_000);
    let r0 = a.now();
    let asm = b.now_asm();
    let r1 = a.now();
    let elapsed = cal.wall_ns(rdtsc()) - cal.wall_ns(tsc0);
    assert!(
        r0 <= asm + 2_000 && asm <= r1 + 2_000,
        "rust {r0}..{r1} asm {asm}"
    );
    assert_close("fake page", asm, base + 7_000_000 + elapsed, 0.0, 20_000);
    assert_eq!(a.syscalls() + b.syscalls(), 0);
    // Without cap_user_time both fall back to CLOCK_THREAD_CPUTIME_ID.
    let page_ptr: *mut PerfEventMmapPage = &mut *page;
    // SAFETY: the page is ours; the clocks only read it.
    unsafe { std::ptr::addr_of_mut!((*page_ptr).capabilities).write_volatile(2) };
    let kernel = thread_cputime_ns();
    let (mut c, mut d) = unsafe {
        (
            ThreadCpuClock::with_page(page_ptr, wall(), base),
            ThreadCpuClock::with_page(page_ptr, wall(), base),
        )
    };
    assert_close("no cap, rust", c.now(), kernel, 0.0, 1_000_000);
    assert_close("no cap, asm", d.now_asm(), kernel, 0.0, 1_000_000);
    assert_eq!((c.syscalls(), d.syscalls()), (1, 1));
}

#[test]
fn schedstat_from_outside_matches_own_clock() {
    let (tx, rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let worker = std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
        burn_cpu(30_000_000);
        let own = thread_cputime_ns();
        tx.send((tid, own)).unwrap();
        // Blocked from here on: its runtime is settled while we look.
        done_rx.recv().unwrap();
        burn_cpu(10_000_000);
        thread_cputime_ns()
    });
    let (tid, own) = rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let outside = thread_cpu_ns_from_outside(std::process::id(), tid).unwrap();
    assert!(outside >= own, "schedstat {outside} < own {own}");
    assert_close("schedstat while blocked", outside, own, 0.0, 1_000_000);
    done_tx.send(()).unwrap();
    let own_end = worker.join().unwrap();
    assert!(own_end >= own + 10_000_000);
    assert!(thread_cpu_ns_from_outside(std::process::id(), u32::MAX).is_err());
}

/// What backs `address` in this process's maps (the mapping's name).
fn mapping_name(address: usize) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().find_map(|l| {
        let (range, rest) = l.split_once(' ')?;
        let (start, end) = range.split_once('-')?;
        let (start, end) = (
            usize::from_str_radix(start, 16).ok()?,
            usize::from_str_radix(end, 16).ok()?,
        );
        (start..end)
            .contains(&address)
            .then(|| rest.split_whitespace().nth(4).unwrap_or("").to_string())
    })
}

fn is_perf_page(address: usize) -> bool {
    mapping_name(address).is_some_and(|n| n.ends_with("[perf_event]"))
}

/// A clock in anchor mode on a perf event of its own, its fd closed (as
/// the runtime keeps them); None, said, where there is no anchor mode.
fn anchor_clock() -> Option<ThreadCpuClock> {
    let mut clock = ThreadCpuClock::new(wall(), CpuPreference::Anchor);
    if clock.mode() != CPU_ANCHOR {
        eprintln!("no anchor mode here ({}): nothing to test", clock.source());
        return None;
    }
    clock.close_fd();
    Some(clock)
}

/// The last session's release of a clock's perf event (a zero page over
/// the event's, system-call reads), then a later CPU timer's request for
/// one, which the owner's next read fulfils (the Rust reader and the
/// assembly one): the reading stays on the kernel's timeline throughout,
/// never goes back, and the page is the event's exactly while the clock
/// has one.
#[test]
fn a_clock_released_and_asked_for_an_event_again_reads_right() {
    let Some(mut clock) = anchor_clock() else {
        return;
    };
    let page = clock.page_address();
    assert!(is_perf_page(page), "{:?}", mapping_name(page));
    let c0 = clock.now();
    let t0 = thread_cputime_ns();
    burn_cpu(10_000_000);
    // SAFETY: the page is this clock's perf mapping; its owner (this
    // thread) is not inside a read.
    assert!(unsafe { clock.release_event() });
    assert_eq!(clock.mode(), CPU_SYSCALL);
    assert!(
        clock.source().to_string().contains("released"),
        "{}",
        clock.source()
    );
    assert_eq!(mapping_name(page).as_deref(), Some(""), "the zero page");
    burn_cpu(10_000_000);
    let c1 = clock.now();
    let t1 = thread_cputime_ns();
    assert_close("cpu across the release", c1 - c0, t1 - t0, 0.03, 200_000);

    for (round, asm) in [(0, false), (1, true)] {
        // SAFETY: as above.
        if round > 0 {
            assert!(unsafe { clock.release_event() });
        }
        clock.ask_for_event();
        assert_eq!(clock.mode(), CPU_SYSCALL, "nothing made before a read");
        let read = |clock: &mut ThreadCpuClock| if asm { clock.now_asm() } else { clock.now() };
        let c2 = read(&mut clock);
        let t2 = thread_cputime_ns();
        assert_eq!(clock.mode(), CPU_ANCHOR, "asm {asm}: {}", clock.source());
        assert_eq!(
            clock.page_address(),
            page,
            "asm {asm}: the event's page over the zero page"
        );
        assert!(is_perf_page(page), "asm {asm}: {:?}", mapping_name(page));
        let l0 = clock.page_lock().unwrap();
        burn_cpu(20_000_000);
        std::thread::sleep(Duration::from_millis(5));
        burn_cpu(20_000_000);
        let c3 = read(&mut clock);
        let t3 = thread_cputime_ns();
        assert_ne!(
            clock.page_lock().unwrap(),
            l0,
            "asm {asm}: the event follows the thread"
        );
        assert_close(
            &format!("asm {asm}: cpu after the event came back"),
            c3 - c2,
            t3 - t2,
            0.03,
            200_000,
        );
        // An anchor-mode clock asked again is left as it is.
        clock.ask_for_event();
        assert_eq!(clock.mode(), CPU_ANCHOR);
    }

    // A thread that registered before any CPU timer: a fresh page.
    let mut unasked = ThreadCpuClock::without_event(wall());
    assert_eq!(unasked.page_address(), 0);
    unasked.ask_for_event();
    let c4 = unasked.now_asm();
    let t4 = thread_cputime_ns();
    assert_eq!(unasked.mode(), CPU_ANCHOR, "{}", unasked.source());
    assert!(is_perf_page(unasked.page_address()));
    burn_cpu(20_000_000);
    let c5 = unasked.now_asm();
    let t5 = thread_cputime_ns();
    assert_close(
        "cpu of a clock given its first event",
        c5 - c4,
        t5 - t4,
        0.03,
        200_000,
    );
}

/// A diagnosis's request that a thread let its clock's event go (its
/// switches cost more with the event than its readings without): the
/// owner's next read through each reader (Rust, assembly, and the slow
/// path generated timers call) drops the event, reads the system call
/// from then on, stays on the kernel's timeline, and can be given an
/// event again.
#[test]
fn a_clock_asked_to_drop_its_event_lets_it_go_at_its_next_read() {
    for reader in ["rust", "asm", "ticks"] {
        let Some(mut clock) = anchor_clock() else {
            return;
        };
        let page = clock.page_address();
        let read = |clock: &mut ThreadCpuClock| match reader {
            "rust" => clock.now(),
            "asm" => clock.now_asm(),
            _ => {
                let units = wall().units();
                units.to_ns(clock.ticks_asm(wall().raw()))
            }
        };
        let c0 = read(&mut clock);
        let t0 = thread_cputime_ns();
        burn_cpu(5_000_000);
        clock.ask_to_drop_event();
        assert_eq!(clock.mode(), CPU_ANCHOR, "{reader}: nothing before a read");
        assert!(is_perf_page(page), "{reader}: {:?}", mapping_name(page));
        let c1 = read(&mut clock);
        let t1 = thread_cputime_ns();
        assert_eq!(clock.mode(), CPU_SYSCALL, "{reader}: {}", clock.source());
        assert!(
            clock.source().to_string().contains("released"),
            "{reader}: {}",
            clock.source()
        );
        assert_eq!(
            mapping_name(page).as_deref(),
            Some(""),
            "{reader}: the zero page over the event's"
        );
        assert_close(
            &format!("{reader}: cpu across the drop"),
            c1 - c0,
            t1 - t0,
            0.03,
            200_000,
        );
        let syscalls = clock.syscalls();
        burn_cpu(5_000_000);
        let c2 = read(&mut clock);
        assert!(clock.syscalls() > syscalls, "{reader}: a system call read");
        assert!(c2 >= c1 + 4_000_000, "{reader}: {c1} then {c2}");
        // Asked for an event again, it makes one.
        clock.ask_for_event();
        read(&mut clock);
        assert_eq!(clock.mode(), CPU_ANCHOR, "{reader}: {}", clock.source());
        assert!(is_perf_page(page), "{reader}: {:?}", mapping_name(page));
        // A clock without an event is not asked.
        let mut none = ThreadCpuClock::without_event(wall());
        none.ask_to_drop_event();
        none.now_asm();
        assert_eq!(none.mode(), CPU_SYSCALL);
        assert!(!none.source().to_string().contains("released"));
    }
}
