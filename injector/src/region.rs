//! The injector's read-only view of the runtime's shared-memory region.
//!
//! The region is the runtime's memfd, opened through `/proc/PID/fd/N` and
//! mapped `PROT_READ`: weft reads every thread's counters while the target
//! runs, without stopping it and without any lock in the target. The mapping
//! outlives the target, so the final counts of a process that exited are
//! still there to report.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use weft_rt::layout::{self, Geometry, RegionHeader, RowHeader, MAGIC, VERSION};

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
    /// Thread name as the runtime recorded it.
    pub name: String,
    /// The first `words` metric words.
    pub words: Vec<u64>,
}

impl Region {
    /// Maps the runtime's memfd `fd` of process `pid`.
    pub fn open(pid: i32, fd: i32) -> Result<Region, RegionError> {
        let map_err = |source| RegionError::Map { pid, fd, source };
        let file = File::open(format!("/proc/{pid}/fd/{fd}")).map_err(map_err)?;
        let len = file.metadata().map_err(map_err)?.len() as usize;
        if len < layout::ROWS_OFFSET {
            return Err(RegionError::Incompatible { pid, found: 0 });
        }
        // SAFETY: a fresh read-only shared mapping of a file we opened; the
        // kernel validates the length.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(map_err(std::io::Error::last_os_error()));
        }
        let mut region = Region {
            base: base as *const u8,
            len,
            geometry: Geometry {
                max_rows: 0,
                metric_words: 0,
            },
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
        let geometry = Geometry {
            max_rows: header.max_rows,
            metric_words: header.metric_words,
        };
        if geometry.region_size() as usize > len {
            return Err(RegionError::Incompatible {
                pid,
                found: version,
            });
        }
        region.geometry = geometry;
        Ok(region)
    }

    /// The region's header.
    pub fn header(&self) -> &RegionHeader {
        // SAFETY: the mapping is at least ROWS_OFFSET bytes, page aligned,
        // and RegionHeader fits before ROWS_OFFSET.
        unsafe { &*(self.base as *const RegionHeader) }
    }

    /// Rows and metric words per row.
    pub fn geometry(&self) -> Geometry {
        self.geometry
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
            let row = self.row(index);
            // SAFETY: `row` points at a RowHeader inside the mapping.
            let header = unsafe { &*(row as *const RowHeader) };
            let values = (0..words)
                .map(|w| {
                    // SAFETY: word w < metric_words lies inside the row; it is
                    // 8-byte aligned, so the read is single-copy atomic.
                    unsafe {
                        std::ptr::read_volatile(
                            row.add(Geometry::metric_offset(w) as usize) as *const u64
                        )
                    }
                })
                .collect();
            rows.push(RowSnapshot {
                index,
                state: header.state.load(Ordering::Acquire),
                tid: header.tid.load(Ordering::Acquire),
                name: read_name(header),
                words: values,
            });
        }
        rows
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

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `open`.
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.len);
        }
    }
}
