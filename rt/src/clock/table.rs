//! The CPU-time table (`weft_abi::clock::table`): how a thread's CPU clock
//! learns of its context switches without a perf event of its own.
//!
//! The injector creates the table (a `BPF_F_MMAPABLE` array) and a
//! `sched_switch` program that writes a thread's slot when the thread
//! comes on a CPU: its `sum_exec_runtime` and `bpf_ktime_get_ns()` then,
//! and a switch count. [`weft_rt_map_cpu_table`] maps the table here. A
//! clock on the table reads like one on a perf page (anchor mode, the
//! slot's count where the page's `lock` is), and re-anchors after a
//! switch from its slot and one vDSO `clock_gettime(CLOCK_MONOTONIC)`:
//! `cpu = sum + (now - switched_in)`, no system call. An anchor that ages
//! (a thread running long without a switch, whose extrapolation counts
//! the hypervisor's stolen time) re-anchors with the system call, as on a
//! perf page.
//!
//! When the last session ends, [`release_table`] lays zero pages over the
//! table's address (stale slot pointers stay readable) and keeps the
//! address for the next table.

use core::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use weft_abi::clock::table;

use super::*;

/// Address of the live table in this process; 0: none.
pub(super) static TABLE: AtomicU64 = AtomicU64::new(0);
/// Address reserved for tables (zero pages between them); 0: none yet.
static RESERVED: AtomicU64 = AtomicU64::new(0);
/// The table's map descriptor, kept so that another session can take it
/// (`pidfd_getfd`) and feed the table with its own program; -1: none.
static TABLE_FD: AtomicI32 = AtomicI32::new(-1);
/// `__vdso_clock_gettime`, for the assembly reader's re-anchor; 0: none
/// (a raw system call instead).
pub(super) static VDSO_CLOCK_GETTIME: AtomicU64 = AtomicU64::new(0);

/// The address of the slot of `tid`, claiming it if the thread has none:
/// `None` when its [`table::PROBES`] slots are all another thread's. The
/// slot's switch time is cleared, so that its first re-anchor reads the
/// system call rather than a dead thread's numbers.
///
/// # Safety
/// `base` must be a mapped table of [`table::TABLE_BYTES`].
unsafe fn claim_slot(base: u64, tid: u32) -> Option<u64> {
    let slot = |i: u32| {
        base + u64::from(tid.wrapping_add(i) & (table::SLOTS - 1)) * table::SLOT_SIZE as u64
    };
    // The tid word is shared with the kernel's program and other threads,
    // hence atomic.
    let word = |at: u64| {
        // SAFETY: `at` is a slot inside the mapped table (masked index);
        // the word is aligned.
        unsafe { &*((at + table::TID as u64) as *const AtomicU32) }
    };
    // A lookup stops at a free slot, as the program's does.
    let mine = (0..table::PROBES)
        .map(slot)
        .map(|at| (at, word(at).load(Ordering::Acquire)))
        .take_while(|&(_, t)| t != table::FREE)
        .find(|&(_, t)| t == tid)
        .map(|(at, _)| at);
    let at = match mine {
        Some(at) => at,
        None => (0..table::PROBES).map(slot).find(|&at| {
            let w = word(at);
            let t = w.load(Ordering::Acquire);
            (t == table::FREE || t == table::GONE)
                && w.compare_exchange(t, tid, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
        })?,
    };
    // SAFETY: the slot is this thread's now; the program writes it only
    // while the thread is off a CPU, and it is on one.
    unsafe { ((at + table::SWITCHED_IN as u64) as *mut u64).write_volatile(0) };
    Some(at)
}

/// This thread's id.
fn gettid() -> u32 {
    // SAFETY: gettid cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

impl ThreadCpuClock {
    /// Puts the clock on the calling thread's slot of the live table, in
    /// anchor mode with an invalid anchor; false (and nothing changed)
    /// when there is no table, no TSC calibration or no free slot.
    pub(super) fn take_table_slot(&mut self) -> bool {
        let base = TABLE.load(Ordering::Acquire);
        if base == 0 || self.mult == 0 {
            return false;
        }
        let tid = gettid();
        // SAFETY: a live table is mapped while TABLE holds its address.
        let Some(slot) = (unsafe { claim_slot(base, tid) }) else {
            return false;
        };
        self.anchor_lock = LOCK_INVALID;
        if self.owns_page != 0 && !self.page.is_null() {
            // SAFETY: a released perf page (zeros) this clock owns.
            unsafe { libc::munmap(self.page as *mut libc::c_void, page_size()) };
        }
        self.page = slot as *const PerfEventMmapPage;
        self.table_tid = tid;
        self.owns_page = 0;
        self.fd = -1;
        self.max_age_tsc = ns_to_ticks(MAX_ANCHOR_AGE_NS, self.mult, self.shift);
        self.why = WHY_CPU_ON_TABLE;
        compiler_fence(Ordering::SeqCst);
        self.mode = CPU_ANCHOR;
        true
    }

    /// Gives the thread's slot back (its thread is leaving, or the clock
    /// is let go; any thread may do it): a later thread may claim it. On
    /// a released table, the zero page laid over it holds no thread id,
    /// and nothing is written.
    pub(super) fn leave_table_slot(&mut self) {
        if self.why != WHY_CPU_ON_TABLE || self.page.is_null() || self.table_tid == 0 {
            return;
        }
        // SAFETY: the slot (or the zero page laid over it) stays mapped
        // for the life of the process; the word is aligned.
        let word = unsafe { &*((self.page as u64 + table::TID as u64) as *const AtomicU32) };
        let _ = word.compare_exchange(
            self.table_tid,
            table::GONE,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
        self.table_tid = 0;
    }

    /// A new anchor from the slot, when the program has written it since
    /// the last anchor: the CPU time the thread had when it came on, plus
    /// the time since (CLOCK_MONOTONIC, the program's clock). `None` when
    /// the anchor only aged, the slot holds nothing yet, or a switch came
    /// in between: the caller re-anchors with the system call.
    pub(super) fn reanchor_from_table(&mut self) -> Option<u64> {
        let slot = self.page as u64;
        // SAFETY: a clock on the table points at its slot, mapped (or
        // zero-filled) for the life of the process; the fields are aligned.
        let (seq_at, sum_at, at_at) = unsafe {
            (
                &*((slot + table::SEQ as u64) as *const AtomicU32),
                &*((slot + table::SUM as u64) as *const AtomicU64),
                &*((slot + table::SWITCHED_IN as u64) as *const AtomicU64),
            )
        };
        let seq = seq_at.load(Ordering::Acquire);
        let switched_in = at_at.load(Ordering::Acquire);
        if seq == self.anchor_lock || switched_in == 0 {
            return None;
        }
        let sum = sum_at.load(Ordering::Acquire);
        let tsc_before = rdtsc();
        let now = monotonic_ns();
        let tsc = rdtsc();
        if seq_at.load(Ordering::Acquire) != seq
            || tsc.wrapping_sub(tsc_before) >= self.max_anchor_window()
        {
            return None;
        }
        let cpu = sum.wrapping_add(now.saturating_sub(switched_in));
        self.publish_anchor(cpu, tsc, seq);
        Some(cpu)
    }
}

/// Maps the table the injector made (map descriptor `fd` in process
/// `pid`, taken with `pidfd_getfd`) and makes it the live one; called by
/// the injector, in a stop. Returns the table's address, or `-errno`.
/// With a live table already, returns its address and keeps it (the
/// caller feeds it with its own program: see [`weft_rt_cpu_table_fd`]).
/// System calls only, no lock.
#[no_mangle]
pub extern "C" fn weft_rt_map_cpu_table(pid: i32, fd: i32) -> i64 {
    let live = TABLE.load(Ordering::Acquire);
    if live != 0 {
        return live as i64;
    }
    if VDSO_CLOCK_GETTIME.load(Ordering::Relaxed) == 0 {
        VDSO_CLOCK_GETTIME.store(
            vdso_symbol(c"__vdso_clock_gettime").unwrap_or(0),
            Ordering::Relaxed,
        );
    }
    // SAFETY: plain system calls on descriptors this function owns; the
    // mapping goes at the reserved address only over the zero pages this
    // runtime laid there itself.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid, 0);
        if pidfd < 0 {
            return -i64::from(errno());
        }
        let map = libc::syscall(libc::SYS_pidfd_getfd, pidfd as i32, fd, 0);
        let e = errno();
        libc::close(pidfd as i32);
        if map < 0 {
            return -i64::from(e);
        }
        let reserved = RESERVED.load(Ordering::Relaxed);
        let (hint, fixed) = if reserved != 0 {
            (reserved as *mut libc::c_void, libc::MAP_FIXED)
        } else {
            (ptr::null_mut(), 0)
        };
        let at = libc::mmap(
            hint,
            table::TABLE_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | fixed,
            map as i32,
            0,
        );
        if at == libc::MAP_FAILED {
            let e = errno();
            libc::close(map as i32);
            if reserved != 0 {
                // A failed fixed mapping may have taken the zero pages.
                zero_fill(reserved);
            }
            return -i64::from(e);
        }
        // As perf pages are: a forked child's threads have slots of
        // their own to find (or none), never the parent's.
        libc::madvise(at, table::TABLE_BYTES, libc::MADV_DONTFORK);
        RESERVED.store(at as u64, Ordering::Relaxed);
        TABLE_FD.store(map as i32, Ordering::Relaxed);
        TABLE.store(at as u64, Ordering::Release);
        at as i64
    }
}

/// The live table's map descriptor in this process (for another session
/// to take with `pidfd_getfd`), or -1.
#[no_mangle]
pub extern "C" fn weft_rt_cpu_table_fd() -> i64 {
    if TABLE.load(Ordering::Acquire) == 0 {
        return -1;
    }
    i64::from(TABLE_FD.load(Ordering::Relaxed))
}

/// Lays zero pages over the live table and closes its descriptor: the
/// map goes when its last program does. Every clock on it must have been
/// let go first (`weft_rt_release_cpu_clocks`); a stale slot pointer still
/// reads (zeros: a re-anchor by system call).
pub(crate) fn release_table() -> bool {
    let at = TABLE.swap(0, Ordering::AcqRel);
    if at == 0 {
        return false;
    }
    zero_fill(at);
    let fd = TABLE_FD.swap(-1, Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: the descriptor is the runtime's (weft_rt_map_cpu_table).
        unsafe { libc::close(fd) };
    }
    true
}

/// Private zero pages over the table's address range, in one step.
fn zero_fill(at: u64) {
    // SAFETY: the range is the runtime's own table reservation.
    unsafe {
        libc::mmap(
            at as *mut libc::c_void,
            table::TABLE_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        );
    }
}

/// Makes `base` (a [`table::TABLE_BYTES`] mapping or buffer) the live
/// table of the calling process: clocks made or armed from now on take
/// slots there. For a process that maps a table itself (weft measuring
/// what the program costs) and tests that play the program; 0 makes none
/// live.
///
/// # Safety
/// `base` must stay valid and writable while any clock uses it.
pub unsafe fn use_table(base: u64) {
    if VDSO_CLOCK_GETTIME.load(Ordering::Relaxed) == 0 {
        VDSO_CLOCK_GETTIME.store(
            vdso_symbol(c"__vdso_clock_gettime").unwrap_or(0),
            Ordering::Relaxed,
        );
    }
    TABLE.store(base, Ordering::Release);
}

/// The address of a symbol of the vDSO, from its ELF image in memory
/// (section headers: `.dynsym` and its string table).
fn vdso_symbol(name: &core::ffi::CStr) -> Option<u64> {
    // SAFETY: getauxval is always safe to call.
    let base = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) };
    if base == 0 {
        return None;
    }
    // SAFETY: the kernel maps the whole vDSO image (headers, sections)
    // at `base`; every read below stays inside what its headers describe.
    unsafe {
        let ehdr = &*(base as *const libc::Elf64_Ehdr);
        if &ehdr.e_ident[..4] != b"\x7fELF"
            || ehdr.e_shentsize as usize != size_of::<libc::Elf64_Shdr>()
        {
            return None;
        }
        let phdrs = core::slice::from_raw_parts(
            (base + ehdr.e_phoff) as *const libc::Elf64_Phdr,
            usize::from(ehdr.e_phnum),
        );
        let load = phdrs.iter().find(|p| p.p_type == libc::PT_LOAD)?;
        let bias = base.wrapping_sub(load.p_vaddr.wrapping_sub(load.p_offset));
        let shdrs = core::slice::from_raw_parts(
            (base + ehdr.e_shoff) as *const libc::Elf64_Shdr,
            usize::from(ehdr.e_shnum),
        );
        let dynsym = shdrs.iter().find(|s| s.sh_type == SHT_DYNSYM)?;
        let strtab = shdrs.get(dynsym.sh_link as usize)?;
        let syms = core::slice::from_raw_parts(
            (base + dynsym.sh_offset) as *const libc::Elf64_Sym,
            (dynsym.sh_size / size_of::<libc::Elf64_Sym>() as u64) as usize,
        );
        let strings = base + strtab.sh_offset;
        syms.iter()
            .find(|s| {
                s.st_value != 0
                    && u64::from(s.st_name) < strtab.sh_size
                    && core::ffi::CStr::from_ptr(
                        (strings + u64::from(s.st_name)) as *const libc::c_char,
                    ) == name
            })
            .map(|s| bias.wrapping_add(s.st_value))
    }
}

/// `SHT_DYNSYM` of the ELF specification.
const SHT_DYNSYM: u32 = 11;

/// In a forked child: the table is not mapped here (`MADV_DONTFORK`), and
/// its descriptor is the parent's business.
pub(crate) fn forget_table_after_fork() {
    TABLE.store(0, Ordering::Release);
    RESERVED.store(0, Ordering::Relaxed);
    let fd = TABLE_FD.swap(-1, Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: the child's copy of the runtime's descriptor.
        unsafe { libc::close(fd) };
    }
}
