//! The CPU clock on the CPU-time table (`weft_abi::clock::table`), with
//! the test playing the kernel's `sched_switch` program: it writes the
//! thread's slot as the program would when the thread comes on a CPU.
//! One test function: the live table is a process-wide setting.

#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use std::hint::black_box;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use weft_abi::clock::table;
use weft_rt::clock::*;

fn burn_cpu(ns: u64) {
    let start = thread_cputime_ns();
    let mut x = 1u64;
    while thread_cputime_ns() - start < ns {
        for _ in 0..10_000 {
            x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
}

struct Slot(u64);

impl Slot {
    fn word32(&self, at: usize) -> &AtomicU32 {
        // SAFETY: a slot of the test's table, which lives for the test.
        unsafe { &*((self.0 + at as u64) as *const AtomicU32) }
    }
    fn word64(&self, at: usize) -> &AtomicU64 {
        // SAFETY: as above.
        unsafe { &*((self.0 + at as u64) as *const AtomicU64) }
    }
    /// What the program writes when the thread comes on a CPU: its time
    /// on a CPU so far (here: the kernel's clock now) and the moment.
    fn switch_in(&self) {
        self.word64(table::SUM)
            .store(thread_cputime_ns(), Ordering::Relaxed);
        self.word64(table::SWITCHED_IN)
            .store(monotonic_ns(), Ordering::Relaxed);
        self.word32(table::SEQ).fetch_add(2, Ordering::Release);
    }
}

fn gettid() -> u32 {
    // SAFETY: gettid cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// Context switches of the calling thread so far: the test's "program"
/// does not see the real ones, so a step with one in it proves nothing.
fn switches() -> i64 {
    // SAFETY: a zeroed rusage is valid for getrusage to fill.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut r) };
    r.ru_nvcsw + r.ru_nivcsw
}

/// Time a step may be off a CPU without a context switch: a step is all
/// CPU work, so its wall time and its CPU time agree unless the host took
/// the vCPU away (steal time, which the kernel leaves out of a task's
/// run time while the clock's wall-time extrapolation counts it).
const MAX_STOLEN_NS: u64 = 50_000;

/// Runs `step` until it ran without a real context switch, without
/// stolen time and within the anchor's age limit, `times` times (of at
/// most 200 tries): on a loaded machine, or a loaded host, a preemption
/// the test cannot show the clock would read as running time.
fn quiet_steps(times: u32, mut step: impl FnMut()) {
    let mut quiet = 0;
    for _ in 0..200 {
        let (before, t0, k0) = (switches(), monotonic_ns(), thread_cputime_ns());
        step();
        let (wall, cpu) = (monotonic_ns() - t0, thread_cputime_ns() - k0);
        if switches() == before
            && wall < MAX_ANCHOR_AGE_NS * 8 / 10
            && wall.saturating_sub(cpu) < MAX_STOLEN_NS
        {
            quiet += 1;
            if quiet == times {
                return;
            }
        }
    }
    panic!("only {quiet} of {times} steps ran without a context switch or stolen time");
}

fn assert_close(what: &str, got: u64, want: u64) {
    let diff = got.abs_diff(want);
    assert!(
        diff <= 300_000 + want / 50,
        "{what}: got {got} ns, the kernel says {want} ns"
    );
}

/// Both readers: a clock made while a table is live takes its thread's
/// slot; it re-anchors from the slot after each "switch" without a system
/// call and reads the kernel's CPU time; an anchor that only aged
/// re-anchors with the system call; a clock asked for an event takes a
/// slot at its next read (the assembly arming path too); a thread's slot
/// goes back when its clock goes, and the next thread reuses it.
#[test]
fn clocks_on_the_table_read_the_kernels_cpu_time_without_system_calls() {
    let wall = WallClock::new(WallPreference::Auto);
    if wall.units().ticks_per_ns_q32 == 0 || !tsc_is_invariant() {
        panic!("this test needs an invariant TSC (the machines weft runs on have one)");
    }
    let table_mem: &'static mut [u64] = vec![0u64; table::TABLE_BYTES / 8].leak();
    let base = table_mem.as_mut_ptr() as u64;
    // SAFETY: leaked: valid and writable for the rest of the process.
    unsafe { use_table(base) };

    for asm in [false, true] {
        let wall = &wall;
        std::thread::scope(|s| {
            s.spawn(move || {
                let read = |c: &mut ThreadCpuClock| if asm { c.now_asm() } else { c.now() };
                let mut clock = ThreadCpuClock::new(wall, CpuPreference::Auto);
                assert_eq!(clock.source(), CpuSource::Table, "asm {asm}");
                let tid = gettid();
                let slot = Slot(clock.page_address() as u64);
                assert_eq!(
                    slot.0,
                    base + u64::from(tid % table::SLOTS) * table::SLOT_SIZE as u64
                );
                assert_eq!(slot.word32(table::TID).load(Ordering::Relaxed), tid);

                let mut steps = Vec::new();
                quiet_steps(5, || {
                    slot.switch_in();
                    let syscalls = clock.syscalls();
                    let c0 = read(&mut clock);
                    let k0 = thread_cputime_ns();
                    let s0 = clock.syscalls();
                    burn_cpu(300_000);
                    let c1 = read(&mut clock);
                    let k1 = thread_cputime_ns();
                    steps.push((syscalls, s0, clock.syscalls(), c0, k0, c1, k1));
                });
                // The last is the quiet one (a step's numbers are judged
                // only if no real switch came in it).
                let &(syscalls, s0, s1, c0, k0, c1, k1) = steps.last().unwrap();
                assert_eq!(
                    s0, syscalls,
                    "asm {asm}: a re-anchor from the slot makes no system call"
                );
                assert_close("at the switch", c0, k0);
                assert_close("after running", c1, k1);
                assert_eq!(s1, syscalls, "asm {asm}: the anchor held");
                // Sleeping is a real switch the test's "program" does not
                // see: the anchor ages out and the system call re-anchors.
                std::thread::sleep(std::time::Duration::from_millis(3));
                let syscalls = clock.syscalls();
                let c2 = read(&mut clock);
                assert_eq!(clock.syscalls(), syscalls + 1, "asm {asm}: an aged anchor");
                assert_close("after a sleep", c2, thread_cputime_ns());

                // Released (as at the end of the last session): the slot
                // goes back; asked again, the next read takes it again.
                // SAFETY: the clock is on the table (no page of its own)
                // and its owner is this thread, outside a read.
                assert!(unsafe { clock.release_event() });
                assert_eq!(slot.word32(table::TID).load(Ordering::Relaxed), table::GONE);
                assert_eq!(clock.mode(), CPU_SYSCALL);
                clock.ask_for_event();
                slot.switch_in();
                let c3 = read(&mut clock);
                assert_eq!(clock.source(), CpuSource::Table, "asm {asm}: armed again");
                assert_eq!(clock.page_address() as u64, slot.0);
                assert_eq!(slot.word32(table::TID).load(Ordering::Relaxed), tid);
                assert_close("armed again", c3, thread_cputime_ns());
                let mut steps = Vec::new();
                quiet_steps(1, || {
                    slot.switch_in();
                    burn_cpu(300_000);
                    let syscalls = clock.syscalls();
                    let c4 = read(&mut clock);
                    steps.push((syscalls, clock.syscalls(), c4, thread_cputime_ns()));
                });
                let &(syscalls, s4, c4, k4) = steps.last().unwrap();
                assert_eq!(s4, syscalls, "asm {asm}: from the slot");
                assert_close("armed, switched", c4, k4);
                drop(clock);
                assert_eq!(slot.word32(table::TID).load(Ordering::Relaxed), table::GONE);
            });
        });
    }

    // Slots of threads whose home slots are taken: the next ones, and a
    // given-back slot is taken again.
    let home = |tid: u32| base + u64::from(tid % table::SLOTS) * table::SLOT_SIZE as u64;
    let wall = &wall;
    std::thread::scope(|s| {
        s.spawn(move || {
            let tid = gettid();
            for i in 0..3u32 {
                Slot(home(tid.wrapping_add(i)))
                    .word32(table::TID)
                    .store(tid.wrapping_add(1000 + i), Ordering::Relaxed);
            }
            Slot(home(tid.wrapping_add(1)))
                .word32(table::TID)
                .store(table::GONE, Ordering::Relaxed);
            let clock = ThreadCpuClock::new(wall, CpuPreference::Auto);
            assert_eq!(clock.page_address() as u64, home(tid.wrapping_add(1)));
        });
    });

    // SAFETY: no table: clocks made from now on use perf events.
    unsafe { use_table(0) };
}

/// The assembly reader calls the vDSO's `clock_gettime` from generated
/// code's context, where vector registers are not saved: its code must
/// have no vector or x87 instruction (the kernel builds the vDSO's C with
/// `-mno-sse -mno-mmx -mno-avx`; only `getrandom`'s hand-written ChaCha
/// uses SSE). Checked on this machine's vDSO.
#[test]
fn the_vdso_has_no_vector_instructions() {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let line = maps
        .lines()
        .find(|l| l.ends_with("[vdso]"))
        .expect("a vDSO");
    let range = line.split_whitespace().next().unwrap();
    let (lo, hi) = range.split_once('-').unwrap();
    let lo = u64::from_str_radix(lo, 16).unwrap();
    let hi = u64::from_str_radix(hi, 16).unwrap();
    // SAFETY: the vDSO mapping is readable for the life of the process.
    let image = unsafe { std::slice::from_raw_parts(lo as *const u8, (hi - lo) as usize) };
    let path = std::env::temp_dir().join(format!("weft-vdso-{}.so", std::process::id()));
    std::fs::write(&path, image).unwrap();
    let out = std::process::Command::new("objdump")
        .args(["-d", "--no-show-raw-insn"])
        .arg(&path)
        .output()
        .expect("objdump (binutils) runs");
    let _ = std::fs::remove_file(&path);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("clock_gettime"),
        "disassembled: {}",
        &text[..text.len().min(400)]
    );
    // `__vdso_getrandom`'s ChaCha is hand-written SSE (vector registers
    // are the caller's to save in the C ABI): not on the clock's path.
    let mut function = String::new();
    let mut vector = Vec::new();
    for line in text.lines() {
        if line.ends_with(">:") {
            function = line.to_string();
        } else if !function.contains("getrandom")
            && ["%xmm", "%ymm", "%zmm", "%mm", "%st", "fxsave", "xsave"]
                .iter()
                .any(|r| line.contains(r))
        {
            vector.push(format!("{function} {line}"));
        }
    }
    assert!(
        vector.is_empty(),
        "vector or x87 code in the vDSO: {vector:?}"
    );
}
