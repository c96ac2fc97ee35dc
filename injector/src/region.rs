//! The injector's read-only view of the runtime's shared-memory region.
//!
//! The region is the runtime's memfd, opened through `/proc/PID/fd/N` and
//! mapped `PROT_READ`: weft reads every thread's counters while the target
//! runs, without stopping it and without any lock in the target. The mapping
//! outlives the target, so the final counts of a process that exited are
//! still there to report.

use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering;
use weft_rt::layout::{self, Geometry, RegionHeader, RowHeader, ACKS_OFFSET, MAGIC, VERSION};

/// Failure to map the region.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// The memfd could not be opened or mapped.
    #[error("cannot map weft's shared region (/proc/{pid}/fd/{fd}): {source}")]
    Map {
        /// The target.
        pid: i32,
        /// The runtime's memfd number in the target.
        fd: i32,
        /// What failed.
        source: std::io::Error,
    },
    /// The region's header is not one this weft understands.
    #[error("the weft runtime loaded in process {pid} is incompatible (region version {found}, this weft needs {VERSION}): restart the target to load the new runtime")]
    Incompatible {
        /// The target.
        pid: i32,
        /// The version found.
        found: u32,
    },
}

/// A read-only mapping of the shared region.
#[derive(Debug)]
pub struct Region {
    base: *const u8,
    len: usize,
    geometry: Geometry,
    /// The ack pages of every session slot and the probe directory after
    /// them, mapped writable (with the header page, all weft writes).
    acks: *const AtomicU32,
    acks_len: usize,
    /// The header's page mapped writable too, for the words weft sets
    /// ([`Region::control`]); null until mapped.
    control: *const RegionHeader,
    /// The memfd, for resetting recycled words ([`Region::zero_words`]).
    file: std::fs::File,
    /// Writable one-page mappings of the words of rows weft writes (the
    /// trace rings' consumer words, [`Region::trace_tail`]; a paused CPU
    /// clock's pointer, [`Region::pause_clock`]), by file offset of the
    /// page.
    tails: std::sync::Mutex<std::collections::HashMap<u64, usize>>,
}

// SAFETY: the mapping is read-only for us and lives until Drop; readers only
// use atomic or volatile loads of plain integers.
unsafe impl Send for Region {}
// SAFETY: as above: shared references only perform reads.
unsafe impl Sync for Region {}

/// One thread's row, copied out of the region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowSnapshot {
    /// Row index (the thread's small index).
    pub index: u32,
    /// `layout::ROW_*` state.
    pub state: u32,
    /// Kernel thread id.
    pub tid: u32,
    /// How many threads owned the row before this one.
    pub generation: u32,
    /// Thread name as the runtime recorded it.
    pub name: String,
    /// The first `words` metric words.
    pub words: Vec<u64>,
    /// The thread's CPU clock source (`layout::CPU_SOURCE_NONE` or 1 + the
    /// clock's mode) and its reason code.
    pub cpu_source: (u32, i32),
}

impl Region {
    /// Maps the runtime's memfd `fd` of process `pid`.
    pub fn open(pid: i32, fd: i32) -> Result<Region, RegionError> {
        let map_err = |source| RegionError::Map { pid, fd, source };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(crate::inspect::procfs::fd_file(pid, fd))
            .map_err(map_err)?;
        Region::map(pid, fd, file)
    }

    /// A second view of the same region, mapped anew, that a thread of
    /// weft's own can own (the call-trace drainer) however long this one
    /// lives.
    pub fn reopen(&self, pid: i32) -> Result<Region, RegionError> {
        use std::os::fd::AsRawFd;
        let fd = self.file.as_raw_fd();
        let file = self
            .file
            .try_clone()
            .map_err(|source| RegionError::Map { pid, fd, source })?;
        Region::map(pid, fd, file)
    }

    /// Maps the region in `file` (process `pid`'s descriptor `fd`, for
    /// errors).
    fn map(pid: i32, fd: i32, file: std::fs::File) -> Result<Region, RegionError> {
        let map_err = |source| RegionError::Map { pid, fd, source };
        let len = file.metadata().map_err(map_err)?.len() as usize;
        if len < ACKS_OFFSET + layout::PAGE as usize {
            return Err(RegionError::Incompatible { pid, found: 0 });
        }
        let base = map_shared(&file, len, 0, false).map_err(map_err)?;
        let mut region = Region {
            base,
            len,
            geometry: Geometry {
                max_rows: 0,
                metric_words: 0,
            },
            acks: std::ptr::null(),
            acks_len: 0,
            control: std::ptr::null(),
            file,
            tails: Default::default(),
        };
        let header = region.header();
        // SAFETY: `magic` and `version` are plain integers inside the mapping.
        let (magic, version) = unsafe {
            (
                std::ptr::read_volatile(&header.magic),
                std::ptr::read_volatile(&header.version),
            )
        };
        if magic != MAGIC || version != VERSION {
            return Err(RegionError::Incompatible {
                pid,
                found: version,
            });
        }
        let geometry = header.geometry();
        if geometry.region_size() as usize > len {
            return Err(RegionError::Incompatible {
                pid,
                found: version,
            });
        }
        region.geometry = geometry;
        // The ack pages and the probe directory (inside the file's length,
        // checked above) and the header's page, writable: the only parts
        // weft writes.
        let acks_len = (geometry.rows_offset() - ACKS_OFFSET as u64) as usize;
        region.acks =
            map_shared(&region.file, acks_len, ACKS_OFFSET, true).map_err(map_err)? as *const _;
        region.acks_len = acks_len;
        region.control =
            map_shared(&region.file, ACKS_OFFSET, 0, true).map_err(map_err)? as *const _;
        Ok(region)
    }

    /// The header through a writable mapping: for the words weft itself
    /// sets there (the library-load handshake of
    /// [`crate::events::Watcher::defer_at_load`]), nothing else.
    pub fn control(&self) -> &RegionHeader {
        // SAFETY: mapped in `open` (a `Region` only exists once it is), page
        // aligned, the header fits in it; writes go through atomics only.
        unsafe { &*self.control }
    }

    /// The region's header.
    pub fn header(&self) -> &RegionHeader {
        // SAFETY: the mapping is at least ACKS_OFFSET bytes, page aligned,
        // and RegionHeader fits before ACKS_OFFSET.
        unsafe { &*(self.base as *const RegionHeader) }
    }

    /// Rows and metric words per row.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Zeroes metric words `first .. first + count` of every row handed out
    /// (and the overflow row), through the file: words of a removed probe
    /// that no code writes any more, before a new probe gets them.
    pub fn zero_words(&self, first: u32, count: u32) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let count = count.min(self.geometry.metric_words.saturating_sub(first));
        let zeros = vec![0u8; 8 * count as usize];
        let used = self.header().rows_used.load(Ordering::Acquire);
        let rows = (0..used.min(self.geometry.max_rows)).chain([self.geometry.overflow_row()]);
        for index in rows {
            // Words in a page nobody wrote are zero already; writing would
            // allocate the page (rows are sparse, see `written_words`).
            let written = self.written_words(index, first + count);
            if !written.iter().any(|r| r.end > first) {
                continue;
            }
            let at = self.geometry.row_offset(index) + Geometry::metric_offset(first);
            self.file.write_all_at(&zeros, at)?;
        }
        Ok(())
    }

    /// Session slot `slot`'s ack of row `index` (both clamped into range).
    fn ack(&self, slot: usize, index: u32) -> &AtomicU32 {
        let slot = slot.min(layout::SESSIONS - 1);
        let index = index.min(self.geometry.max_rows.saturating_sub(1)) as usize;
        let offset = (self.geometry.acks_offset(slot) - ACKS_OFFSET as u64) as usize;
        // SAFETY: the writable mapping at ACKS_OFFSET holds every slot's
        // ack array of max_rows u32s (clamped above); it lives as long as
        // `self`.
        unsafe { &*self.acks.byte_add(offset).add(index) }
    }

    /// Pointer to probe-directory entry `i` (clamped into the directory)
    /// in the writable mapping.
    fn entry_ptr(&self, i: usize) -> *mut layout::ProbeEntry {
        let i = i.min(layout::DIRECTORY - 1);
        let offset = (self.geometry.directory_offset() - ACKS_OFFSET as u64) as usize
            + i * layout::PROBE_ENTRY_SIZE;
        // SAFETY: the writable mapping at ACKS_OFFSET reaches to the rows;
        // the directory lies inside it and `i` is clamped into it.
        unsafe { self.acks.byte_add(offset) as *mut layout::ProbeEntry }
    }

    /// A copy of probe-directory entry `i`. Only wefts that hold the
    /// process (one at a time) write entries, so a copy taken while
    /// holding it is consistent.
    pub fn entry(&self, i: usize) -> layout::ProbeEntry {
        // SAFETY: `entry_ptr` is inside the mapping and aligned (entries
        // are 80 bytes from a page boundary: 8-byte aligned); any bit
        // pattern is a ProbeEntry (plain integers).
        unsafe { std::ptr::read_volatile(self.entry_ptr(i)) }
    }

    /// The state word of probe-directory entry `i` (cheaper than a copy of
    /// the entry when scanning for a free one).
    pub fn entry_state(&self, i: usize) -> u32 {
        // SAFETY: `state` is the entry's first field, a u32 inside the
        // mapping, 4-byte aligned.
        unsafe { std::ptr::read_volatile(self.entry_ptr(i) as *const u32) }
    }

    /// Touches the pages of probe-directory entries `first .. first + n`
    /// with an atomic no-op write, so that writing them later, with the
    /// world stopped, takes no page fault (microseconds each on a KVM
    /// guest). Safe while another weft writes entries: the values stay.
    pub fn prefault_entries(&self, first: usize, n: usize) {
        let end = (first + n).min(layout::DIRECTORY);
        let per_page = layout::PAGE as usize / layout::PROBE_ENTRY_SIZE;
        for i in (first..end)
            .step_by(per_page.max(1))
            .chain(end.checked_sub(1))
        {
            // SAFETY: inside the writable mapping (`entry_ptr` clamps); the
            // state word is a 4-byte aligned u32, accessed atomically here
            // as every writer of it is another process or this one.
            let state = unsafe { &*(self.entry_ptr(i) as *const std::sync::atomic::AtomicU32) };
            state.fetch_add(0, Ordering::Relaxed);
        }
    }

    /// Writes probe-directory entry `i` (the process must be held by this
    /// weft: no other writes entries meanwhile).
    pub fn set_entry(&self, i: usize, entry: &layout::ProbeEntry) {
        // SAFETY: as in `entry`; the mapping is writable.
        unsafe { std::ptr::write_volatile(self.entry_ptr(i), *entry) }
    }

    /// Row `index`'s state, thread id, generation and recorded name (0s
    /// and an empty name past the overflow row).
    pub fn row_identity(&self, index: u32) -> (u32, u32, u32, String) {
        if index > self.geometry.overflow_row() {
            return (0, 0, 0, String::new());
        }
        // SAFETY: index <= overflow row: a RowHeader inside the mapping.
        let header = unsafe { &*(self.row(index) as *const RowHeader) };
        (
            header.state.load(Ordering::Acquire),
            header.tid.load(Ordering::Acquire),
            header.generation.load(Ordering::Acquire),
            read_name(header),
        )
    }

    /// The consumer word (`tail`) of row `index`'s trace ring at row byte
    /// offset `offset`, through a writable mapping of its page (see
    /// `weft_rt::layout::trace`). None past the last thread row, for a
    /// misaligned offset, or when the page cannot be mapped.
    pub fn trace_tail(&self, index: u32, offset: usize) -> Option<&std::sync::atomic::AtomicU64> {
        let at = self.writable(index, offset, 8)?;
        // SAFETY: `writable` gives an 8-byte aligned address of 8 bytes in
        // a page mapped writable for as long as `self` lives (unmapped in
        // Drop); the target only reads this word.
        Some(unsafe { &*(at as *const std::sync::atomic::AtomicU64) })
    }

    /// The address, in a writable mapping of its page, of the `size`
    /// bytes (8 or 4, aligned so) at byte `offset` of row `index`: the
    /// words weft writes with one store the target can read at any moment
    /// (a `pwrite` into the memfd is not one store). None past the last
    /// thread row, for a misaligned offset, or when the page cannot be
    /// mapped.
    fn writable(&self, index: u32, offset: usize, size: usize) -> Option<usize> {
        if index >= self.geometry.max_rows
            || offset % size != 0
            || offset as u64 + size as u64 > self.geometry.row_stride()
        {
            return None;
        }
        let at = self.geometry.row_offset(index) + offset as u64;
        let page = at & !(layout::PAGE - 1);
        let mut pages = self.tails.lock().unwrap_or_else(|p| p.into_inner());
        let base = match pages.get(&page) {
            Some(&base) => base,
            None => {
                let base = map_shared(&self.file, layout::PAGE as usize, page as usize, true)
                    .ok()? as usize;
                pages.insert(page, base);
                base
            }
        };
        // Rows (and so `at`) are aligned to `size` as `offset` is, and
        // `at - page` < PAGE: the bytes lie inside the mapped page.
        Some(base + (at - page) as usize)
    }

    /// Copies row `index` (its first `words` metric words); None past the
    /// overflow row.
    fn row_snapshot(&self, index: u32, words: u32) -> Option<RowSnapshot> {
        if index > self.geometry.overflow_row() {
            return None;
        }
        let words = words.min(self.geometry.metric_words);
        let row = self.row(index);
        // SAFETY: `row` points at a RowHeader inside the mapping.
        let header = unsafe { &*(row as *const RowHeader) };
        let mut values = vec![0u64; words as usize];
        for range in self.written_words(index, words) {
            for w in range {
                // SAFETY: word w < metric_words lies inside the row; it is
                // 8-byte aligned, so the read is single-copy atomic.
                values[w as usize] = unsafe {
                    std::ptr::read_volatile(
                        row.add(Geometry::metric_offset(w) as usize) as *const u64
                    )
                };
            }
        }
        Some(RowSnapshot {
            index,
            state: header.state.load(Ordering::Acquire),
            tid: header.tid.load(Ordering::Acquire),
            generation: header.generation.load(Ordering::Acquire),
            name: read_name(header),
            words: values,
            cpu_source: clock_source(header),
        })
    }

    /// The ranges of row `index`'s first `words` metric words that lie in
    /// pages the target wrote; the other words are zero. A row is sized
    /// for the most words any request may need and the memfd is sparse:
    /// reading a page nobody wrote through the mapping would allocate it in
    /// the target's memory (a shared memory fault always does), so readers
    /// skip the holes. `SEEK_DATA`/`SEEK_HOLE` count a swapped-out page as
    /// data, unlike `mincore`. A page first written after the look reads
    /// as the zero it was a moment before.
    pub fn written_words(&self, index: u32, words: u32) -> Vec<std::ops::Range<u32>> {
        use std::os::fd::AsRawFd;
        let words = words.min(self.geometry.metric_words);
        if index > self.geometry.scratch_row() || words == 0 {
            return Vec::new();
        }
        let start = self.geometry.row_offset(index) + Geometry::metric_offset(0);
        let end = start + 8 * u64::from(words);
        let word_of = |offset: u64| ((offset.clamp(start, end) - start) / 8) as u32;
        let fd = self.file.as_raw_fd();
        let mut ranges = Vec::new();
        let mut at = start;
        while at < end {
            // SAFETY: lseek on our own descriptor of the region's memfd.
            let data = unsafe { libc::lseek(fd, at as libc::off_t, libc::SEEK_DATA) };
            if data < 0 || data as u64 >= end {
                break; // ENXIO: no data after `at`
            }
            // SAFETY: as above.
            let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
            let hole = if hole < 0 {
                end
            } else {
                (hole as u64).min(end)
            };
            // Words straddling the edge of a written page: read whole.
            let (first, last) = (word_of(data as u64), word_of(hole + 7));
            if first < last {
                ranges.push(first..last);
            }
            at = hole.max(data as u64 + 1);
        }
        ranges
    }

    /// The live value of the 8-byte word at byte `offset` of row `index`
    /// (one aligned load: never torn), or 0 outside the row.
    pub fn load_word(&self, index: u32, offset: usize) -> u64 {
        if index > self.geometry.scratch_row()
            || offset % 8 != 0
            || offset as u64 + 8 > self.geometry.row_stride()
        {
            return 0;
        }
        // SAFETY: inside the row (checked above), 8-byte aligned; a volatile
        // load because the target writes it concurrently.
        unsafe { std::ptr::read_volatile(self.row(index).add(offset) as *const u64) }
    }

    /// Copies row `index`'s words from row byte offset `offset` into
    /// `out`, in one go; false (nothing copied) when they are not all
    /// inside a row. Only for words no thread writes meanwhile: trace ring
    /// slots below the head read before (`weft_rt::layout::trace`).
    pub(crate) fn copy_words(&self, index: u32, offset: usize, out: &mut [u64]) -> bool {
        if index > self.geometry.scratch_row()
            || offset % 8 != 0
            || offset as u64 + 8 * out.len() as u64 > self.geometry.row_stride()
        {
            return false;
        }
        // Not above the caller's earlier load of what published the words.
        std::sync::atomic::fence(Ordering::Acquire);
        // SAFETY: the words lie inside the row (checked above), which lies
        // inside the mapping; 8-byte aligned; nothing writes them while
        // they are read (the caller's contract), and `out` is ours.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.row(index).add(offset) as *const u64,
                out.as_mut_ptr(),
                out.len(),
            );
        }
        true
    }

    /// Row `index`'s first `words` metric words, as atomics (`words` at
    /// most the geometry's; `index` at most the scratch row, higher indices
    /// are clamped to it). The owning thread writes them concurrently:
    /// `Relaxed` loads are single aligned loads, never torn.
    pub fn row_words(&self, index: u32, words: u32) -> &[std::sync::atomic::AtomicU64] {
        let index = index.min(self.geometry.scratch_row());
        let words = words.min(self.geometry.metric_words) as usize;
        // SAFETY: the words lie inside the row (words <= metric_words), which
        // lies inside the mapping (checked when mapping); they are 8-byte
        // aligned, and AtomicU64 has u64's layout. The mapping lives as long
        // as `self`.
        unsafe {
            std::slice::from_raw_parts(
                self.row(index).add(Geometry::metric_offset(0) as usize)
                    as *const std::sync::atomic::AtomicU64,
                words,
            )
        }
    }

    /// The header of row `index` (`index` at most the scratch row; higher
    /// indices are clamped to it).
    pub fn row_header(&self, index: u32) -> &RowHeader {
        let index = index.min(self.geometry.scratch_row());
        // SAFETY: `row` points at a RowHeader inside the mapping, which
        // lives as long as `self`; its fields are atomics.
        unsafe { &*(self.row(index) as *const RowHeader) }
    }

    fn row(&self, index: u32) -> *const u8 {
        // SAFETY: callers pass index <= max_rows; region_size() <= len was
        // checked when mapping.
        unsafe { self.base.add(self.geometry.row_offset(index) as usize) }
    }

    /// Copies out every row handed out so far (the overflow row included
    /// when it was used), with its first `words` metric words.
    pub fn snapshot(&self, words: u32) -> Vec<RowSnapshot> {
        let words = words.min(self.geometry.metric_words);
        let used = self.header().rows_used.load(Ordering::Acquire);
        let mut rows = Vec::new();
        let mut indices: Vec<u32> = (0..used.min(self.geometry.max_rows)).collect();
        if used > self.geometry.max_rows {
            indices.push(self.geometry.max_rows);
        }
        for index in indices {
            if let Some(row) = self.row_snapshot(index, words) {
                rows.push(row);
            }
        }
        rows
    }
}

/// A row's CPU clock source (1 + mode) and reason: the clock's own while
/// the thread has one (it changes its mode itself when it makes a perf
/// event the injector asked for), else what the row recorded.
fn clock_source(header: &RowHeader) -> (u32, i32) {
    use weft_rt::clock::{CPU_OFF_MODE, CPU_OFF_WHY};
    if header.thread.cpu_clock.load(Ordering::Acquire) == 0 {
        return (
            header.thread.cpu_source.load(Ordering::Acquire),
            header.thread.cpu_why.load(Ordering::Acquire),
        );
    }
    let clock = std::ptr::addr_of!(header.clock) as *const u8;
    // SAFETY: both fields lie inside the row's clock storage, in our
    // mapping, 4-byte aligned; plain words the owner writes, read
    // volatile (a torn pair is at worst a stale source in a report).
    let (mode, why) = unsafe {
        (
            std::ptr::read_volatile(clock.add(CPU_OFF_MODE) as *const u32),
            std::ptr::read_volatile(clock.add(CPU_OFF_WHY) as *const i32),
        )
    };
    (1 + mode, why)
}

impl Region {
    /// The address of row `index`'s CPU clock page in the target (0: none),
    /// as the runtime keeps it in the row's clock storage.
    pub(crate) fn clock_page(&self, index: u32) -> u64 {
        let row = self.row_header(index);
        let word = weft_rt::clock::CPU_OFF_PAGE / 8;
        // SAFETY: the storage is inside the row, in our mapping; a plain
        // word the owning thread wrote once, read volatile.
        unsafe { std::ptr::read_volatile(std::ptr::addr_of!(row.clock.0[word])) }
    }

    /// Writes `why` into row `index`'s CPU clock (through the file: our
    /// view is read-only): a request to its runtime, either
    /// `WHY_CPU_RELEASE_ASKED` (for `weft_rt_release_cpu_clocks`, the
    /// caller having checked that the clock's page is a perf event mapping
    /// of the process) or `WHY_CPU_ARM_ASKED` (the owner makes an event at
    /// its next read).
    pub(crate) fn ask_clock(&self, index: u32, why: i32) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let at = self.geometry.row_offset(index)
            + (layout::ROW_CLOCK_STORAGE + weft_rt::clock::CPU_OFF_WHY) as u64;
        self.file.write_all_at(&why.to_le_bytes(), at)
    }

    /// Asks row `index`'s CPU clock to let its perf event go at its owner's
    /// next read: `WHY_CPU_DROP_ASKED`, then a zero age limit, so that no
    /// fast path (Rust, assembly or generated) reads the anchor again and
    /// every reading reaches the slow path that acts on the request (as
    /// `ThreadCpuClock::ask_to_drop_event`). In that order: a reader that
    /// sees the age limit gone finds the request.
    pub(crate) fn ask_clock_to_drop(&self, index: u32) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.ask_clock(index, weft_rt::clock::WHY_CPU_DROP_ASKED)?;
        let at = self.geometry.row_offset(index)
            + (layout::ROW_CLOCK_STORAGE + weft_rt::clock::CPU_OFF_MAX_AGE) as u64;
        self.file.write_all_at(&0u64.to_le_bytes(), at)
    }
}

impl Region {
    /// Pauses row `index`'s CPU clock (see `weft_rt::clock::WHY_CPU_PAUSED`):
    /// the row's `cpu_why` says paused, then its clock pointer is 0, so the
    /// thread's timers read no CPU time and pay nothing for it. Returns the
    /// pointer it had, for [`Region::resume_clock`]; None when the row has
    /// no clock (nothing to pause).
    pub(crate) fn pause_clock(&self, index: u32) -> std::io::Result<Option<u64>> {
        let pointer = self.clock_pointer(index);
        if pointer == 0 {
            return Ok(None);
        }
        self.thread_why(index)?
            .store(weft_rt::clock::WHY_CPU_PAUSED, Ordering::Release);
        self.thread_clock(index)?.store(0, Ordering::Release);
        Ok(Some(pointer))
    }

    /// Gives row `index` its clock `pointer` back after
    /// [`Region::pause_clock`]: the pointer first, then the pause mark
    /// cleared, so that a thread exiting in between finds its clock by one
    /// or the other.
    pub(crate) fn resume_clock(&self, index: u32, pointer: u64) -> std::io::Result<()> {
        self.thread_clock(index)?.store(pointer, Ordering::Release);
        self.thread_why(index)?.store(0, Ordering::Release);
        Ok(())
    }

    /// Row `index`'s CPU clock pointer (the target's address of its
    /// clock; 0: none, or paused).
    pub(crate) fn clock_pointer(&self, index: u32) -> u64 {
        self.row_header(index)
            .thread
            .cpu_clock
            .load(Ordering::Acquire)
    }

    /// Whether row `index`'s clock is paused ([`Region::pause_clock`]).
    pub(crate) fn clock_paused(&self, index: u32) -> bool {
        let thread = &self.row_header(index).thread;
        thread.cpu_clock.load(Ordering::Acquire) == 0
            && thread.cpu_why.load(Ordering::Acquire) == weft_rt::clock::WHY_CPU_PAUSED
    }

    /// Row `index`'s CPU clock pointer, writable: the thread loads it
    /// once per reading and dereferences it, so it is written with one
    /// store (a torn pointer would send the thread to a wild address).
    fn thread_clock(&self, index: u32) -> std::io::Result<&std::sync::atomic::AtomicU64> {
        let at = self
            .writable(index, THREAD_OFFSET + THREAD_CPU_CLOCK, 8)
            .ok_or_else(|| std::io::Error::other("cannot map the row's clock pointer"))?;
        // SAFETY: `writable` gives an aligned address of 8 bytes in a page
        // mapped writable for as long as `self` lives.
        Ok(unsafe { &*(at as *const std::sync::atomic::AtomicU64) })
    }

    /// Row `index`'s `cpu_why`, writable.
    fn thread_why(&self, index: u32) -> std::io::Result<&std::sync::atomic::AtomicI32> {
        let at = self
            .writable(index, THREAD_OFFSET + THREAD_CPU_WHY, 4)
            .ok_or_else(|| std::io::Error::other("cannot map the row's clock state"))?;
        // SAFETY: as in `thread_clock`, 4 aligned bytes.
        Ok(unsafe { &*(at as *const std::sync::atomic::AtomicI32) })
    }
}

/// Byte offsets of a row's thread state, and in it of the words
/// [`Region::pause_clock`] writes.
const THREAD_OFFSET: usize = std::mem::offset_of!(RowHeader, thread);
const THREAD_CPU_CLOCK: usize = std::mem::offset_of!(layout::ThreadState, cpu_clock);
const THREAD_CPU_WHY: usize = std::mem::offset_of!(layout::ThreadState, cpu_why);

impl Region {
    /// Copies out the rows of threads that are gone (their row says exited
    /// and `is_gone(tid)` confirms the kernel no longer has the thread, so
    /// nothing can write the row any more) and acks them, which lets the
    /// runtime give the rows to new threads. Returns the copies; the caller
    /// keeps them for its reports. `before_ack(index)` runs right before a
    /// row is acked: the last moment its words (a trace ring) can be read.
    pub fn harvest(
        &self,
        slot: usize,
        words: u32,
        is_gone: impl Fn(u32) -> bool,
        mut before_ack: impl FnMut(u32),
    ) -> Vec<RowSnapshot> {
        let mut harvested = Vec::new();
        let used = self
            .header()
            .rows_used
            .load(Ordering::Acquire)
            .min(self.geometry.max_rows);
        for index in 0..used {
            // SAFETY: index < max_rows: the row lies inside the mapping.
            let header = unsafe { &*(self.row(index) as *const RowHeader) };
            let ack = self.ack(slot, index);
            // State, generation and thread first, the words after: a copy
            // whose words were read before its thread ran (or before the row
            // passed to a new thread) must never be taken as final.
            let state = header.state.load(Ordering::Acquire);
            let generation = header.generation.load(Ordering::Acquire);
            let tid = header.tid.load(Ordering::Acquire);
            let wanted = generation.wrapping_add(1);
            if state != layout::ROW_EXITED || ack.load(Ordering::Acquire) == wanted || !is_gone(tid)
            {
                continue;
            }
            // The thread is gone: nothing writes the words any more.
            let Some(row) = self.row_snapshot(index, words) else {
                continue;
            };
            if row.state != layout::ROW_EXITED || row.generation != generation {
                continue;
            }
            // The last look at the row before a new thread may take it.
            before_ack(index);
            ack.store(wanted, Ordering::Release);
            harvested.push(row);
        }
        harvested
    }
}

/// Reads a row's name consistently (seqlock: retry while it changes).
fn read_name(row: &RowHeader) -> String {
    for _ in 0..100 {
        let before = row.name_seq.load(Ordering::Acquire);
        if before % 2 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let mut bytes = Vec::with_capacity(layout::NAME_LEN);
        for word in &row.name {
            bytes.extend_from_slice(&word.0.load(Ordering::Relaxed).to_le_bytes());
        }
        std::sync::atomic::fence(Ordering::Acquire);
        if row.name_seq.load(Ordering::Relaxed) == before {
            let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
            return String::from_utf8_lossy(&bytes[..end]).into_owned();
        }
    }
    String::new()
}

/// A shared mapping of `len` bytes of `file` from `offset`, read-only or
/// read-write.
fn map_shared(
    file: &std::fs::File,
    len: usize,
    offset: usize,
    writable: bool,
) -> std::io::Result<*const u8> {
    let prot = if writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: a fresh shared mapping of a file we hold open; the kernel
    // validates the length and offset; nothing else refers to it yet.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            offset as libc::off_t,
        )
    };
    if at == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(at as *const u8)
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mappings created in `open` and the
        // one-page mappings `trace_tail` made (each once, by its base);
        // nothing refers to them once `self` is dropped (references they
        // gave out borrow `self`).
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.len);
            if !self.acks.is_null() {
                libc::munmap(self.acks as *mut libc::c_void, self.acks_len);
            }
            if !self.control.is_null() {
                libc::munmap(self.control as *mut libc::c_void, ACKS_OFFSET);
            }
            let tails = self.tails.get_mut().unwrap_or_else(|p| p.into_inner());
            for &base in tails.values() {
                libc::munmap(base as *mut libc::c_void, layout::PAGE as usize);
            }
        }
    }
}
