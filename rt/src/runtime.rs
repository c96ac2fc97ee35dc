//! The exported entry points and the per-thread registration.

use crate::clock::{WallClock, WallPreference};
use crate::layout::{
    Geometry, ProbeEntry, RegionHeader, RowHeader, DIRECTORY, KIND_MEASURE, MAGIC,
    MAX_METRIC_WORDS, NAME_LEN, PROBE_LIVE, ROW_CELLS, ROW_CLAIMED, ROW_EXITED, ROW_FREE, ROW_LIVE,
    ROW_OVERFLOW, ROW_TOP, SESSIONS, SESSION_FORKED_AWAY, VERSION,
};
use crate::state::{region_header, tls_row_get, tls_row_set, weft_rt_tls_offset, REGION};
use core::ptr;
use core::sync::atomic::{AtomicI32, AtomicU32, Ordering};

/// The memfd behind [`REGION`], which the injector opens via `/proc/PID/fd`.
static REGION_FD: AtomicI32 = AtomicI32::new(-1);
/// The wall clock: the injector's, handed to the first `weft_rt_init`
/// (weft calibrates it while the target runs), else calibrated there.
static mut WALL: core::mem::MaybeUninit<WallClock> = core::mem::MaybeUninit::uninit();
static WALL_READY: AtomicU32 = AtomicU32::new(0);

/// The wall clock, set up from `theirs` (the injector's) when it fits
/// this process, else calibrated now (a 10 ms sleep). Only called under
/// `INIT_BUSY`.
fn wall_clock(theirs: Option<&WallClock>) -> WallClock {
    if WALL_READY.load(Ordering::Acquire) == 0 {
        let wall = theirs
            .and_then(WallClock::adopt)
            .unwrap_or_else(|| WallClock::new(WallPreference::Auto));
        // SAFETY: only `weft_rt_init` gets here, serialised by INIT_BUSY,
        // and nothing reads WALL before WALL_READY is set.
        unsafe { (*ptr::addr_of_mut!(WALL)).write(wall) };
        WALL_READY.store(1, Ordering::Release);
    }
    // SAFETY: written once before WALL_READY was set, never again.
    unsafe { (*ptr::addr_of!(WALL)).assume_init() }
}

/// Serialises `weft_rt_init` against itself (it is only ever called by the
/// injector, never on a hot path).
static INIT_BUSY: AtomicU32 = AtomicU32::new(0);

fn errno() -> i64 {
    // SAFETY: `__errno_location` always returns this thread's errno.
    i64::from(unsafe { *libc::__errno_location() })
}

/// Creates the shared region (first call) or starts a new session in it.
///
/// `max_rows` threads get their own row; `metric_words` `u64` words per row.
/// The geometry shapes a new region only: later calls are served by the
/// existing one, whatever they ask (the caller reads its geometry from the
/// header), and the first `reset_words` metric words of every
/// row are zeroed, so a new session starts from zero while threads keep
/// their rows. The caller guarantees no trampoline writes those words
/// meanwhile (the injector only calls this before splicing).
///
/// `wall`, when not null, is the injector's wall clock
/// ([`WallClock::to_bytes`]), taken by the first call if it fits this
/// process ([`WallClock::adopt`]); otherwise that call calibrates one,
/// sleeping 10 ms.
///
/// `place_at`, when not 0, is where the first call maps the region (a hint:
/// the kernel takes it when that range is free). The injector picks an
/// address far from any code, so the region never takes the room near code
/// that trampolines need.
///
/// In a forked child, a later call is served by the region the child made
/// its own at the fork, and refuses a private view of the parent's (see
/// `after_fork_in_child`).
///
/// Returns the memfd (>= 0) or a negated errno: `-EINVAL` for a bad
/// geometry, `-EBUSY` for a concurrent call, `-EXDEV` in a forked child
/// whose region is its parent's.
///
/// # Safety
///
/// `wall` is null or points at 32 readable bytes.
#[no_mangle]
pub unsafe extern "C" fn weft_rt_init(
    max_rows: u32,
    metric_words: u32,
    reset_words: u32,
    wall: *const WallClock,
    place_at: u64,
) -> i64 {
    if INIT_BUSY.swap(1, Ordering::Acquire) != 0 {
        return -i64::from(libc::EBUSY);
    }
    // SAFETY: the caller passes null or 32 readable bytes; unaligned (a
    // remote call copies them anywhere on the stack), and any bit pattern
    // is a WallClock (plain integers), which `adopt` then checks.
    let theirs = (!wall.is_null()).then(|| unsafe { wall.read_unaligned() });
    let result = init_locked(
        Geometry {
            max_rows,
            metric_words,
        },
        reset_words,
        theirs.as_ref(),
        place_at,
    );
    INIT_BUSY.store(0, Ordering::Release);
    result
}

fn init_locked(
    geometry: Geometry,
    reset_words: u32,
    theirs: Option<&WallClock>,
    place_at: u64,
) -> i64 {
    let existing = REGION.load(Ordering::Acquire);
    if !existing.is_null() {
        // SAFETY: REGION points at a live mapping that starts with a header.
        let header = unsafe { &*(existing as *const RegionHeader) };
        // A forked child's private view of its parent's region is refused
        // (see `after_fork_in_child`).
        if header.disabled.load(Ordering::Acquire) == DISABLED_FORKED_COPY {
            return -i64::from(libc::EXDEV);
        }
        let current = header.geometry();
        let used = header.rows_in_use();
        let words = reset_words.min(current.metric_words) as usize;
        for row_index in (0..used).chain([current.overflow_row()]) {
            // SAFETY: row_index <= max_rows, so the row lies inside the
            // region; words <= metric_words, so the range lies in the row.
            unsafe {
                let words_ptr = existing.add(
                    current.row_offset(row_index) as usize + Geometry::metric_offset(0) as usize,
                );
                ptr::write_bytes(words_ptr, 0, words * 8);
            }
        }
        header.session.fetch_add(1, Ordering::AcqRel);
        return i64::from(REGION_FD.load(Ordering::Acquire));
    }

    if geometry.max_rows == 0
        || geometry.max_rows > 1 << 20
        || geometry.metric_words > MAX_METRIC_WORDS
    {
        return -i64::from(libc::EINVAL);
    }
    let size = geometry.region_size();
    // SAFETY: plain syscalls on a fresh memfd; the name is NUL-terminated.
    unsafe {
        let fd = libc::memfd_create(crate::layout::REGION_MEMFD_NAME.as_ptr(), libc::MFD_CLOEXEC);
        if fd < 0 {
            return -errno();
        }
        if libc::ftruncate(fd, size as libc::off_t) != 0 {
            let e = errno();
            libc::close(fd);
            return -e;
        }
        let base = libc::mmap(
            place_at as *mut libc::c_void,
            size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            // Rows are sized for the most words any request may need
            // (MAX_METRIC_WORDS); only the pages written take memory.
            libc::MAP_SHARED | libc::MAP_NORESERVE,
            fd,
            0,
        );
        if base == libc::MAP_FAILED {
            let e = errno();
            libc::close(fd);
            return -e;
        }
        // weft's figures are not the program's: a core dump of the target
        // should not carry gigabytes of (mostly sparse) region. Advisory.
        libc::madvise(base, size as usize, libc::MADV_DONTDUMP);
        let base = base as *mut u8;
        let header = base as *mut RegionHeader;
        // The memfd is zero-filled: only the non-zero fields need writing.
        ptr::addr_of_mut!((*header).version).write(VERSION);
        ptr::addr_of_mut!((*header).header_size).write(core::mem::size_of::<RegionHeader>() as u32);
        ptr::addr_of_mut!((*header).max_rows).write(geometry.max_rows);
        ptr::addr_of_mut!((*header).metric_words).write(geometry.metric_words);
        ptr::addr_of_mut!((*header).row_stride).write(geometry.row_stride());
        ptr::addr_of_mut!((*header).region_size).write(size);
        ptr::addr_of_mut!((*header).tls_offset).write(weft_rt_tls_offset());
        ptr::addr_of_mut!((*header).register_fn).write(weft_rt_register_thread as *const () as u64);
        ptr::addr_of_mut!((*header).wall_raw_fn)
            .write(crate::clock::weft_rt_wall_raw as *const () as u64);
        ptr::addr_of_mut!((*header).cpu_ticks_fn)
            .write(crate::clock::weft_rt_cpu_ticks as *const () as u64);
        let wall = wall_clock(theirs);
        // The header's storage fits a WallClock (asserted in `clock`).
        ptr::addr_of_mut!((*header).wall)
            .cast::<WallClock>()
            .write(wall);
        ptr::addr_of_mut!((*header).wall_address).write(ptr::addr_of!((*header).wall) as u64);
        ptr::addr_of_mut!((*header).timer_ns_per_tick_q32).write(wall.units().ns_per_tick_q32);
        let (records, targets, slot) = crate::exits::call_record_addresses();
        ptr::addr_of_mut!((*header).call_records).write(records);
        ptr::addr_of_mut!((*header).call_targets).write(targets);
        ptr::addr_of_mut!((*header).exit_handler_slot).write(slot);
        ptr::addr_of_mut!((*header).exit_probes).write(crate::exits::exit_probe_table());
        ptr::addr_of_mut!((*header).library_event_fn)
            .write(weft_rt_library_event as *const () as u64);
        (*header)
            .pid
            .store(libc::getpid() as u32, Ordering::Relaxed);
        (*header).session.store(1, Ordering::Relaxed);
        let overflow =
            &*(base.add(geometry.row_offset(geometry.max_rows) as usize) as *const RowHeader);
        overflow.state.store(ROW_OVERFLOW, Ordering::Relaxed);
        // Publish the magic last: a reader that sees it sees the rest.
        core::sync::atomic::fence(Ordering::Release);
        ptr::addr_of_mut!((*header).magic).write_volatile(MAGIC);
        crate::exits::set_unwind_rows(crate::exits::UnwindRows {
            first: base.add(geometry.rows_offset() as usize) as u64,
            stride: geometry.row_stride(),
            count: ptr::addr_of!((*header).rows_used),
            max: u64::from(geometry.max_rows),
            cells: ROW_CELLS as u64,
            top: ROW_TOP as u64,
        });
        REGION_FD.store(fd, Ordering::Release);
        REGION.store(base, Ordering::Release);
        i64::from(fd)
    }
}

/// Registers the fork handler when the library is loaded: `pthread_atfork`
/// takes a lock, and `weft_rt_init` runs with every other thread stopped
/// (a stopped thread may hold it), while `dlopen` runs under
/// `World::WhenWaiting` (the others run whenever the loader waits).
///
/// Linked into an executable instead (the `weft` binary and the test
/// binaries use this crate for its layouts), there is no target to serve
/// and the constructor does nothing.
extern "C" fn on_load() {
    if !loaded_as_library() {
        return;
    }
    // SAFETY: registering a handler that only uses async-signal-safe calls.
    unsafe {
        libc::pthread_atfork(None, None, Some(after_fork_in_child));
    }
}

/// Whether this code lives in a shared object other than the main
/// executable. When the loader cannot say, it answers yes: a runtime that
/// does its set-up needlessly is better than one that skips it in a target.
fn loaded_as_library() -> bool {
    // SAFETY: dladdr only reads the loader's tables; both Dl_info structs
    // are plain data it fills in, and getauxval has no preconditions.
    unsafe {
        let mut here: libc::Dl_info = core::mem::zeroed();
        let mut main: libc::Dl_info = core::mem::zeroed();
        let program_headers = libc::getauxval(libc::AT_PHDR);
        if program_headers == 0
            || libc::dladdr(on_load as *const libc::c_void, &mut here) == 0
            || libc::dladdr(program_headers as *const libc::c_void, &mut main) == 0
        {
            return true;
        }
        here.dli_fbase != main.dli_fbase
    }
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

/// In a forked child the shared mapping would let the child's copy of the
/// forking thread keep counting into its parent's row, and a weft attached
/// to the child would read (and write the ledger of) its parent. The child
/// gets a region of its own: a new memfd holding a copy of the parent's
/// (its ledger describes the instrumentation the child inherited), mapped
/// over the same range under the same descriptor number. In it:
///
/// * the sessions are the parent's, which none of them knows: each is
///   marked forked away ([`SESSION_FORKED_AWAY`]). A weft following the
///   child adopts their probes; any other takes them out as a dead
///   session's;
/// * the child counts from zero: the forking thread's row (its only
///   thread's) keeps its open activations and running timers, but the
///   words that add up are zeroed, as are the overflow row's; the parent's
///   other threads' rows are freed;
/// * the runtime counts on (new threads take rows), so that a weft
///   following the child misses none of its calls.
///
/// If the copy cannot be made, the mapping becomes a private copy-on-write
/// view as before and the region is marked a forked copy: `weft_rt_init`
/// then refuses, so that no weft reads the parent's figures as the
/// child's.
extern "C" fn after_fork_in_child() {
    crate::clock::forget_table_after_fork();
    let base = REGION.load(Ordering::Acquire);
    let fd = REGION_FD.load(Ordering::Acquire);
    if base.is_null() || fd < 0 {
        return;
    }
    // SAFETY: base points at our region (never unmapped), and its header
    // stays readable; every mapping below replaces exactly that range.
    unsafe {
        let header = &*(base as *const RegionHeader);
        let size = header.region_size as usize;
        let own = own_copy_of_region(base, fd, size);
        if !own {
            private_view_of_region(base, fd, size);
        }
        let header = &*(base as *const RegionHeader);
        header.pid.store(libc::getpid() as u32, Ordering::Release);
        let mine = tls_row_get();
        if !mine.is_null() {
            crate::exits::forget_clock_after_fork(mine);
        }
        if !own {
            header
                .disabled
                .store(DISABLED_FORKED_COPY, Ordering::Release);
            return;
        }
        start_counting_anew(base, header, mine);
    }
}

/// The child's own region as [`after_fork_in_child`] describes it.
///
/// # Safety
/// `base` is the child's own region, `header` its header, `mine` null or
/// the forking thread's row in it; the child has one thread.
unsafe fn start_counting_anew(base: *mut u8, header: &RegionHeader, mine: *mut u8) {
    // No weft watches this process's loads yet; the region is the child's
    // own even if its parent's was a private view (a fork of a fork).
    header.library_wait_ms.store(0, Ordering::Release);
    header.disabled.store(0, Ordering::Release);
    for slot in &header.sessions {
        if slot.pid.load(Ordering::Acquire) != 0 {
            slot.start_time
                .store(SESSION_FORKED_AWAY, Ordering::Release);
        }
    }
    // SAFETY: every row index is below `max_rows` (or the overflow row),
    // every directory index below DIRECTORY: all inside the region the
    // caller vouches for; entries are plain integers (read volatile).
    unsafe {
        let geometry = header.geometry();
        let used = header.rows_in_use();
        let overflow = base.add(geometry.row_offset(geometry.overflow_row()) as usize);
        for index in 0..used {
            let row = base.add(geometry.row_offset(index) as usize);
            if row != mine {
                (*(row as *const RowHeader))
                    .state
                    .store(ROW_FREE, Ordering::Release);
            }
        }
        if !mine.is_null() {
            // SAFETY: gettid has no preconditions.
            let tid = libc::syscall(libc::SYS_gettid) as u32;
            (*(mine as *const RowHeader))
                .tid
                .store(tid, Ordering::Release);
        }
        let directory = base.add(geometry.directory_offset() as usize) as *const ProbeEntry;
        let entries = (header.directory_used.load(Ordering::Acquire) as usize).min(DIRECTORY);
        for i in 0..entries {
            let entry = ptr::read_volatile(directory.add(i));
            if entry.state != PROBE_LIVE || entry.kind != KIND_MEASURE {
                continue;
            }
            for row in [mine, overflow].into_iter().filter(|r| !r.is_null()) {
                zero_additive_words(row, &entry, geometry.metric_words);
            }
        }
    }
}

/// Zeroes the words of a measuring probe `entry` in `row` that add up
/// (`metric::additive`).
///
/// # Safety
/// `row` is a row of a region whose rows have `metric_words` words.
unsafe fn zero_additive_words(row: *mut u8, entry: &ProbeEntry, metric_words: u32) {
    for o in crate::layout::metric::additive(entry.words) {
        let word = entry.first_word as u64 + (o / 8) as u64;
        if word < u64::from(metric_words) {
            // SAFETY: the word lies inside the row (checked above).
            unsafe {
                let at = row.add(Geometry::metric_offset(word as u32) as usize) as *mut u64;
                ptr::write_volatile(at, 0);
            }
        }
    }
}

/// `disabled`: a forked child's private view of its parent's region.
const DISABLED_FORKED_COPY: i64 = 2;

/// Copies the region in `fd` (the parent's, mapped shared at `base`) into
/// a new memfd and maps that over `base` under descriptor `fd`; false
/// (nothing changed) if any step fails. Only the extents the parent wrote
/// are copied: the region is sparse.
///
/// # Safety
/// `base` is the runtime's region mapping of `size` bytes of `fd`; called
/// in a forked child, which has one thread.
unsafe fn own_copy_of_region(base: *mut u8, fd: i32, size: usize) -> bool {
    // SAFETY: system calls on descriptors this function owns or the
    // runtime's region descriptor; the temporary mapping is this
    // function's and `base..base + size` is the region.
    unsafe {
        let new = libc::memfd_create(crate::layout::REGION_MEMFD_NAME.as_ptr(), libc::MFD_CLOEXEC);
        if new < 0 {
            return false;
        }
        let give_up = |new: i32| {
            libc::close(new);
            false
        };
        if libc::ftruncate(new, size as libc::off_t) != 0 {
            return give_up(new);
        }
        let copy = libc::mmap(
            ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_NORESERVE,
            new,
            0,
        );
        if copy == libc::MAP_FAILED {
            return give_up(new);
        }
        let mut at: libc::off_t = 0;
        while (at as usize) < size {
            let data = libc::lseek(fd, at, libc::SEEK_DATA);
            if data < 0 {
                break; // ENXIO: no data after `at`
            }
            let hole = libc::lseek(fd, data, libc::SEEK_HOLE);
            let end = if hole < 0 { size as libc::off_t } else { hole }.min(size as libc::off_t);
            ptr::copy_nonoverlapping(
                base.add(data as usize),
                (copy as *mut u8).add(data as usize),
                (end - data) as usize,
            );
            at = end;
        }
        libc::munmap(copy, size);
        let mapped = libc::mmap(
            base as *mut libc::c_void,
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_NORESERVE,
            new,
            0,
        );
        if mapped == libc::MAP_FAILED {
            // MAP_FIXED may have unmapped the range: a view of the parent's
            // file goes back (the caller makes it private).
            return give_up(new);
        }
        libc::madvise(mapped, size, libc::MADV_DONTDUMP);
        // The same number names the child's region: what weft_rt_init
        // returns, and what the library's users kept.
        if libc::dup3(new, fd, libc::O_CLOEXEC) < 0 {
            libc::close(new);
            return false;
        }
        libc::close(new);
        true
    }
}

/// The parent's region as a private copy-on-write view: the child's hits
/// stay its own and never reach the injector's view of the parent.
///
/// # Safety
/// As [`own_copy_of_region`].
unsafe fn private_view_of_region(base: *mut u8, fd: i32, size: usize) {
    // SAFETY: MAP_FIXED replaces exactly the region's range.
    unsafe {
        // MAP_NORESERVE: a private writable mapping is charged in full
        // against overcommit, and the region reserves gigabytes of rows
        // it never touches; the charge failed and (MAP_FIXED having
        // unmapped the range first) the child crashed at its next count.
        let replaced = libc::mmap(
            base as *mut libc::c_void,
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_FIXED | libc::MAP_NORESERVE,
            fd,
            0,
        );
        if replaced == libc::MAP_FAILED {
            // The range may be gone: zero pages keep the child's counting
            // harmless (it counts into memory nobody reads).
            libc::mmap(
                base as *mut libc::c_void,
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_FIXED | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            );
        }
    }
}

fn write_name(row: &RowHeader) {
    let mut name = [0u8; NAME_LEN];
    // SAFETY: PR_GET_NAME writes at most 16 bytes into `name`.
    unsafe {
        libc::prctl(
            libc::PR_GET_NAME,
            name.as_mut_ptr() as libc::c_ulong,
            0,
            0,
            0,
        );
    }
    row.name_seq.fetch_add(1, Ordering::AcqRel);
    for (word, chunk) in row.name.iter().zip(name.chunks_exact(4)) {
        let bytes = [chunk[0], chunk[1], chunk[2], chunk[3]];
        word.0.store(u32::from_le_bytes(bytes), Ordering::Relaxed);
    }
    row.name_seq.fetch_add(1, Ordering::Release);
}

/// Marks the thread's row exited when the thread ends (run by glibc's
/// thread-local destructors, for `pthread_exit` and returning alike).
struct ExitGuard(*const RowHeader);

impl Drop for ExitGuard {
    fn drop(&mut self) {
        // SAFETY: the row lives in the region, which is never unmapped.
        let row = unsafe { &*self.0 };
        if row.state.load(Ordering::Acquire) == ROW_LIVE {
            // prctl and friends may be instrumented: their calls are ours.
            let own = tls_row_get();
            with_scratch_row(|| {
                if let Some(header) = region_header() {
                    crate::exits::finish_thread(header, self.0 as *mut u8);
                }
                write_name(row)
            });
            tls_row_set(own);
            row.state.store(ROW_EXITED, Ordering::Release);
        }
        // The row pointer stays in TLS: destructors that run after this one
        // may still call instrumented functions, and they keep counting into
        // the same row rather than registering the dying thread again.
    }
}

std::thread_local! {
    static EXIT_GUARD: core::cell::Cell<Option<ExitGuard>> = const { core::cell::Cell::new(None) };
}

/// Takes over a row whose thread is gone and whose figures the injector has
/// copied (its ack equals generation + 1): zeroes it, bumps its generation.
/// A linear scan, but only on a thread's first hit.
fn reuse_harvested_row(
    base: *mut u8,
    header: &RegionHeader,
    geometry: Geometry,
) -> Option<*mut u8> {
    let used = header.rows_in_use();
    // Every session slot in use must have copied the row (an unused slot's
    // acks are not looked at): two wefts watching at once each get every
    // exited thread's figures.
    let watching: [bool; SESSIONS] =
        core::array::from_fn(|slot| header.sessions[slot].pid.load(Ordering::Acquire) != 0);
    let acked = |slot: usize, index: usize, wanted: u32| {
        // SAFETY: each slot's ack array holds max_rows u32s at
        // acks_offset(slot), inside the region; index < max_rows.
        let ack = unsafe {
            &*(base.add(geometry.acks_offset(slot) as usize) as *const AtomicU32).add(index)
        };
        ack.load(Ordering::Acquire) == wanted
    };
    for index in 0..used as usize {
        // SAFETY: index < used <= max_rows: the row lies inside the region.
        let row_ptr = unsafe { base.add(geometry.row_offset(index as u32) as usize) };
        // SAFETY: rows start with a RowHeader.
        let row = unsafe { &*(row_ptr as *const RowHeader) };
        if row.state.load(Ordering::Acquire) != ROW_EXITED {
            continue;
        }
        let generation = row.generation.load(Ordering::Acquire);
        let wanted = generation.wrapping_add(1);
        // Nobody watching: nobody will copy the row, so it is not reused
        // (its figures stay for a later weft's report).
        let copied = (0..SESSIONS).all(|slot| !watching[slot] || acked(slot, index, wanted));
        if !watching.contains(&true) || !copied {
            continue;
        }
        if !claim(row, generation) {
            continue;
        }
        // Only words some session handed out can hold figures: the others
        // were never written (words given back after a failed change are
        // zeroed by the injector first), and zeroing them would touch every
        // page of a row sized for MAX_METRIC_WORDS.
        let words_used = header
            .words_next
            .load(Ordering::Acquire)
            .min(geometry.metric_words);
        // SAFETY: the metric words follow the header inside this row, which
        // the CAS made ours; words_used <= metric_words keeps the range in
        // the row.
        unsafe {
            zero_sparse(
                row_ptr.add(Geometry::metric_offset(0) as usize),
                words_used as usize * 8,
            );
        }
        row.generation
            .store(generation.wrapping_add(1), Ordering::Release);
        header.rows_reused.fetch_add(1, Ordering::Relaxed);
        return Some(row_ptr);
    }
    None
}

/// Takes `row` (state `CLAIMED`) if it still holds the exited thread of
/// `generation`, the one whose copy the caller checked.
///
/// ABA: between the caller's read of the generation and the
/// compare-and-swap, another thread may have claimed the row, run in it and
/// exited; the `EXITED` the swap took is then that thread's, whose figures
/// no injector has copied yet (a loaded machine preempts the caller there
/// long enough: one thread of 10,000 short-lived ones went missing). The
/// swap read that thread's release store, so its generation is visible
/// now: the row is handed back untouched.
fn claim(row: &RowHeader, generation: u32) -> bool {
    if row
        .state
        .compare_exchange(ROW_EXITED, ROW_CLAIMED, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return false;
    }
    if row.generation.load(Ordering::Acquire) != generation {
        row.state.store(ROW_EXITED, Ordering::Release);
        return false;
    }
    true
}

/// Zeroes `len` bytes at `at` in the region, giving whole pages back to the
/// memfd (`MADV_REMOVE`) instead of writing them: a reused row must not
/// cost the pages its old thread never wrote (rows are sized for the most
/// words any request may need), and a punched page reads as zero.
///
/// # Safety
///
/// `at .. at + len` lies inside the region's shared, writable mapping and
/// nobody else writes it meanwhile.
unsafe fn zero_sparse(at: *mut u8, len: usize) {
    let page = 4096usize;
    let start = at as usize;
    let end = start + len;
    let (first_page, last_page) = (start.div_ceil(page) * page, end / page * page);
    if first_page >= last_page {
        // SAFETY: the caller's range.
        unsafe { ptr::write_bytes(at, 0, len) };
        return;
    }
    // SAFETY: the caller's range, split into head, whole pages and tail.
    unsafe {
        ptr::write_bytes(at, 0, first_page - start);
        let whole = last_page - first_page;
        if libc::madvise(first_page as *mut libc::c_void, whole, libc::MADV_REMOVE) != 0 {
            ptr::write_bytes(first_page as *mut u8, 0, whole);
        }
        ptr::write_bytes(last_page as *mut u8, 0, end - last_page);
    }
}

/// Runs `f` with the thread's row pointer on the scratch row, so that any
/// instrumented function the runtime itself calls (memcpy, malloc, prctl...)
/// counts there instead of re-entering registration. Leaves the scratch row
/// in place; callers set the final row afterwards.
fn with_scratch_row<T>(f: impl FnOnce() -> T) -> T {
    let base = REGION.load(Ordering::Acquire);
    if !base.is_null() {
        // SAFETY: base points at an initialised region header.
        let header = unsafe { &*(base as *const RegionHeader) };
        let geometry = header.geometry();
        // SAFETY: the scratch row is the last row of the region.
        tls_row_set(unsafe { base.add(geometry.row_offset(geometry.scratch_row()) as usize) });
    }
    f()
}

/// `r_state` in glibc's `struct r_debug` (`int r_version; struct link_map
/// *r_map; ElfW(Addr) r_brk; enum r_state; ...`), and its value once a
/// change of the link map is complete.
const R_STATE_OFFSET: usize = 24;
const RT_CONSISTENT: i32 = 0;

/// The user probe on the dynamic loader's `_dl_debug_state`, which the
/// loader calls around every change of its list of libraries; the probe's
/// constant is the address of the loader's `_r_debug`. When a change is
/// complete (`r_state == RT_CONSISTENT`: a library mapped and relocated,
/// its constructors not run yet) and an injector asked
/// ([`RegionHeader::library_wait_ms`]), it tells the injector (bumps
/// `library_loads`, wakes its futex) and waits, at most that long, until
/// the injector has instrumented the library (`library_loads_done`). A
/// dead or slow injector costs each `dlopen` that wait, no more. Runs on
/// the loading thread, inside the loader; never panics.
///
/// # Safety
///
/// Called by generated code with a valid probe context whose `user` is
/// the address of the loader's `struct r_debug`. Not exported: the
/// injector finds it in the region's header.
pub unsafe extern "C" fn weft_rt_library_event(ctx: *const u8) {
    let base = REGION.load(Ordering::Acquire);
    if base.is_null() || ctx.is_null() {
        return;
    }
    // SAFETY: base points at an initialised region header.
    let header = unsafe { &*(base as *const RegionHeader) };
    let wait_ms = header.library_wait_ms.load(Ordering::Acquire);
    if wait_ms == 0 {
        return;
    }
    // SAFETY: the context is valid for reads (the caller's contract).
    let r_debug = unsafe { (ctx.add(crate::layout::PROBE_CTX_USER) as *const u64).read_unaligned() }
        as *const u8;
    if r_debug.is_null() {
        return;
    }
    // SAFETY: `user` is the loader's `_r_debug` (the caller's contract),
    // which lives as long as the process.
    let state = unsafe { (r_debug.add(R_STATE_OFFSET) as *const i32).read_volatile() };
    if state != RT_CONSISTENT {
        return;
    }
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    // Only for a watcher that is still looking.
    let seen = header.library_watcher_ms.load(Ordering::Acquire);
    if (timespec_ns(&now) / 1_000_000).saturating_sub(seen) > 1_000 + u64::from(wait_ms) {
        return;
    }
    let ticket = header
        .library_loads
        .fetch_add(1, Ordering::AcqRel)
        .wrapping_add(1);
    futex(
        &header.library_loads,
        libc::FUTEX_WAKE,
        i32::MAX as u32,
        None,
    );
    let deadline = timespec_ns(&now) + u64::from(wait_ms) * 1_000_000;
    loop {
        let done = header.library_loads_done.load(Ordering::Acquire);
        if done.wrapping_sub(ticket) as i32 >= 0 {
            return;
        }
        // SAFETY: as above.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
        let left = deadline.saturating_sub(timespec_ns(&now));
        if left == 0 {
            return;
        }
        let timeout = libc::timespec {
            tv_sec: (left / 1_000_000_000) as libc::time_t,
            tv_nsec: (left % 1_000_000_000) as libc::c_long,
        };
        futex(
            &header.library_loads_done,
            libc::FUTEX_WAIT,
            done,
            Some(&timeout),
        );
    }
}

fn timespec_ns(t: &libc::timespec) -> u64 {
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}

/// A shared (not process-private) futex operation on `word`: the injector
/// waits and wakes on the same word through its own mapping of the region.
fn futex(word: &AtomicU32, op: i32, value: u32, timeout: Option<&libc::timespec>) {
    let timeout = timeout.map_or(ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a valid, aligned u32 in the shared region; the
    // timeout, if any, is a valid timespec; errors (EAGAIN, ETIMEDOUT,
    // EINTR) only end the wait early, which the caller's loop handles.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            op,
            value,
            timeout,
            ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Gives the calling thread its row (once) and returns the row's address.
///
/// Reached from the registration stub the first time a thread runs
/// instrumented code; the stub has saved every register and the vector
/// state. Returns null when the runtime is not initialised or disabled, in
/// which case the hit is not counted.
#[no_mangle]
pub extern "C" fn weft_rt_register_thread() -> *mut u8 {
    let existing = tls_row_get();
    if !existing.is_null() {
        return existing;
    }
    let base = REGION.load(Ordering::Acquire);
    if base.is_null() {
        return ptr::null_mut();
    }
    // SAFETY: base points at an initialised region header.
    let header = unsafe { &*(base as *const RegionHeader) };
    if header.disabled.load(Ordering::Acquire) != 0 {
        return ptr::null_mut();
    }
    let geometry = header.geometry();
    with_scratch_row(|| register_in(base, header, geometry))
}

fn register_in(base: *mut u8, header: &RegionHeader, geometry: Geometry) -> *mut u8 {
    let row_ptr = match reuse_harvested_row(base, header, geometry) {
        Some(row) => row,
        None => {
            let index = header.rows_used.fetch_add(1, Ordering::AcqRel);
            if index >= geometry.max_rows {
                header.overflow_threads.fetch_add(1, Ordering::Relaxed);
                // SAFETY: the overflow row is the last row of the region.
                let row =
                    unsafe { base.add(geometry.row_offset(geometry.overflow_row()) as usize) };
                tls_row_set(row);
                return row;
            }
            // SAFETY: index < max_rows, so the row lies inside the region.
            unsafe { base.add(geometry.row_offset(index) as usize) }
        }
    };
    // SAFETY: the row is ours alone: handed out once, or claimed by CAS.
    let row = unsafe { &*(row_ptr as *const RowHeader) };
    let index = (row_ptr as u64 - base as u64 - geometry.rows_offset()) / geometry.row_stride();
    row.index.store(index as u32, Ordering::Relaxed);
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
    row.tid.store(tid, Ordering::Relaxed);
    write_name(row);
    crate::exits::setup_thread(header, row);
    row.state.store(ROW_LIVE, Ordering::Release);
    // `try_with` fails only while this thread's TLS is being torn down;
    // then there is nothing left to mark and the row simply stays live.
    let _ = EXIT_GUARD.try_with(|guard| guard.set(Some(ExitGuard(row_ptr as *const RowHeader))));
    tls_row_set(row_ptr);
    row_ptr
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_reclaimed_and_exited_since_its_generation_was_read_is_not_taken() {
        // SAFETY: RowHeader is made of atomics and plain integers, for
        // which all-zero bytes are valid.
        let row: RowHeader = unsafe { core::mem::zeroed() };
        row.state.store(ROW_EXITED, Ordering::Relaxed);
        row.generation.store(5, Ordering::Relaxed);
        // The scanner saw generation 4 (copied); the row's thread is
        // generation 5's, not copied: handed back as it was.
        assert!(!claim(&row, 4));
        assert_eq!(row.state.load(Ordering::Relaxed), ROW_EXITED);
        assert_eq!(row.generation.load(Ordering::Relaxed), 5);
        assert!(claim(&row, 5));
        assert_eq!(row.state.load(Ordering::Relaxed), ROW_CLAIMED);
        // Claimed: nobody else takes it.
        assert!(!claim(&row, 5));
    }
}
