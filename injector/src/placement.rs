//! Where the runtime's shared region goes in the target's address space,
//! and how large it may be.
//!
//! Two things decide it. Trampolines must lie within ±2 GiB of the code
//! they serve, and the kernel places a new mapping top-down next to the
//! last ones, so a region of gigabytes mapped with no hint lands between
//! the libraries and the threads' stacks and takes the room their code
//! needs (a process with a few hundred default 8 MiB stacks then had no
//! free range near anything). And the region reserves address space for
//! every row it may hand out, which counts against the target's
//! `RLIMIT_AS` (`ulimit -v`) although untouched pages cost no memory. So
//! the region goes in the middle of the largest hole, terabytes from any
//! code ([`crate::inspect::maps::far_gap`]), with a row for every thread
//! the process has (twice over, for those it starts later), and under an
//! address-space limit with rows only as wide as half the remaining room
//! allows.

use crate::inspect::maps::{far_gap, Mapping};
use weft_rt::layout::Geometry;

/// Threads that get a row of their own even in a process that has few:
/// later ones are served by the rows left.
pub const MIN_ROWS: u32 = 4096;
/// The most rows the runtime hands out (`weft_rt_init` refuses more).
pub const MAX_ROWS: u32 = 1 << 20;
/// Narrowest rows worth making: room for about 60 timed functions.
pub const MIN_METRIC_WORDS: u32 = 1024;

/// Why no region fits the target.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// The target's `RLIMIT_AS` leaves too little room.
    #[error(
        "the target's address-space limit (ulimit -v, {limit} bytes; {in_use} in use) leaves no \
         room for weft's counters ({needed} bytes at least): raise the limit (prlimit --as) or \
         measure a process with fewer threads"
    )]
    AddressSpaceLimit {
        /// The soft limit, in bytes.
        limit: u64,
        /// The target's virtual size now.
        in_use: u64,
        /// The smallest region that would do.
        needed: u64,
    },
    /// No hole in the address space holds the region.
    #[error("no free address range of {size} bytes in the target for weft's counters")]
    NoRoom {
        /// The region's size.
        size: u64,
    },
}

/// A region's geometry and where to map it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Rows and words.
    pub geometry: Geometry,
    /// Where to map it (a hint the kernel takes when the range is free).
    pub at: u64,
}

/// What the target's address space allows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AddressSpace {
    /// Threads the process has now.
    pub threads: usize,
    /// Its soft `RLIMIT_AS` in bytes, if finite.
    pub limit: Option<u64>,
    /// Its virtual size now, in bytes.
    pub in_use: u64,
}

impl AddressSpace {
    /// Reads the target's limit and size from `/proc/PID/limits` and
    /// `/proc/PID/status`; a file that cannot be read counts as no limit.
    pub fn of(pid: i32, threads: usize) -> AddressSpace {
        let limits = std::fs::read_to_string(crate::inspect::procfs::pid_file(pid, "limits"))
            .unwrap_or_default();
        let status = std::fs::read_to_string(crate::inspect::procfs::pid_file(pid, "status"))
            .unwrap_or_default();
        AddressSpace {
            threads,
            limit: address_space_limit(&limits),
            in_use: vm_size(&status).unwrap_or(0),
        }
    }
}

/// The soft "Max address space" of a `/proc/PID/limits` text, in bytes;
/// `None` when unlimited or absent.
fn address_space_limit(limits: &str) -> Option<u64> {
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))?;
    line["Max address space".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `VmSize` of a `/proc/PID/status` text, in bytes.
fn vm_size(status: &str) -> Option<u64> {
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// The region for a target with `space`, asked for `wanted` (rows and
/// words at most; the rows grow with the process's threads), placed in
/// `maps`.
pub fn place(
    wanted: Geometry,
    space: AddressSpace,
    maps: &[Mapping],
) -> Result<Placement, PlacementError> {
    let threads = u32::try_from(space.threads).unwrap_or(u32::MAX);
    let max_rows = threads
        .saturating_mul(2)
        .max(wanted.max_rows)
        .clamp(1, MAX_ROWS)
        .div_ceil(1024)
        * 1024;
    let mut geometry = Geometry {
        max_rows,
        metric_words: wanted.metric_words,
    };
    if let Some(limit) = space.limit {
        // Half of what is left: the program's own growth needs the rest.
        let room = limit.saturating_sub(space.in_use) / 2;
        let mut narrowest = Geometry {
            metric_words: MIN_METRIC_WORDS.min(wanted.metric_words),
            ..geometry
        };
        if narrowest.region_size() > room {
            // Fewer spare rows before no room at all: a row for each
            // thread there is, twice over.
            narrowest.max_rows = threads.saturating_mul(2).clamp(256, MAX_ROWS).div_ceil(256) * 256;
            geometry.max_rows = narrowest.max_rows.min(geometry.max_rows);
            narrowest.max_rows = geometry.max_rows;
        }
        if narrowest.region_size() > room {
            return Err(PlacementError::AddressSpaceLimit {
                limit,
                in_use: space.in_use,
                needed: narrowest.region_size(),
            });
        }
        // Whole cache lines per row; words beyond the header's share.
        let per_row = (room - narrowest.rows_offset()) / (u64::from(geometry.max_rows) + 2);
        let words = (per_row.saturating_sub(weft_rt::layout::ROW_HEADER_SIZE as u64) / 8) & !7;
        geometry.metric_words = u32::try_from(words)
            .unwrap_or(u32::MAX)
            .clamp(narrowest.metric_words, wanted.metric_words);
    }
    let size = geometry.region_size();
    let at = far_gap(maps, size).ok_or(PlacementError::NoRoom { size })?;
    Ok(Placement { geometry, at })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspect::maps::parse_maps;

    /// A process with 1,000 default 8 MiB stacks below its libraries, as
    /// the kernel lays them out.
    fn thousand_stacks() -> Vec<Mapping> {
        let mut text = String::from(
            "55d4c2a00000-55d4c2a07000 r-xp 00000000 08:01 1 /usr/bin/server\n\
             55d4c3c4e000-55d4c3c6f000 rw-p 00000000 00:00 0 [heap]\n",
        );
        let libc = 0x7f1e_5c60_0000u64;
        for i in 0..1000u64 {
            let top = libc - i * (8 << 20 | 4096);
            text += &format!("{:x}-{:x} rw-p 00000000 00:00 0\n", top - (8 << 20), top);
        }
        text +=
            "7f1e5c600000-7f1e5c77b000 r-xp 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libc.so.6\n\
                 7ffd1a9e4000-7ffd1aa05000 rw-p 00000000 00:00 0 [stack]\n";
        parse_maps(&text).unwrap()
    }

    const WANTED: Geometry = Geometry {
        max_rows: MIN_ROWS,
        metric_words: weft_rt::layout::MAX_METRIC_WORDS,
    };

    #[test]
    fn the_region_lies_terabytes_from_any_code() {
        let maps = thousand_stacks();
        let space = AddressSpace {
            threads: 1001,
            ..AddressSpace::default()
        };
        let p = place(WANTED, space, &maps).unwrap();
        assert_eq!(p.geometry.max_rows, 4096);
        let end = p.at + p.geometry.region_size();
        for m in &maps {
            assert!(
                end + (1 << 40) <= m.start || m.end + (1 << 40) <= p.at,
                "{:#x}..{end:#x} near {m:?}",
                p.at
            );
        }
    }

    #[test]
    fn rows_grow_with_the_threads() {
        let space = AddressSpace {
            threads: 10_001,
            ..AddressSpace::default()
        };
        let p = place(WANTED, space, &thousand_stacks()).unwrap();
        assert_eq!(p.geometry.max_rows, 20_480);
    }

    #[test]
    fn an_address_space_limit_narrows_the_rows() {
        let space = AddressSpace {
            threads: 5,
            limit: Some(4_000_000 * 1024),
            in_use: 200 << 20,
        };
        let p = place(WANTED, space, &thousand_stacks()).unwrap();
        let room = (4_000_000u64 * 1024 - (200 << 20)) / 2;
        assert!(p.geometry.region_size() <= room, "{p:?}");
        assert!(p.geometry.region_size() > room / 2, "{p:?}");
        assert!(p.geometry.metric_words >= MIN_METRIC_WORDS);
        assert_eq!(p.geometry.metric_words % 8, 0);

        // Too little for 4,096 rows: a row for each thread, twice over.
        let small = AddressSpace {
            limit: Some(240 << 20),
            ..space
        };
        let p = place(WANTED, small, &thousand_stacks()).unwrap();
        assert_eq!(p.geometry.max_rows, 256);
        assert!(p.geometry.region_size() <= 20 << 20, "{p:?}");
        let tight = AddressSpace {
            limit: Some(202 << 20),
            ..space
        };
        assert!(matches!(
            place(WANTED, tight, &thousand_stacks()),
            Err(PlacementError::AddressSpaceLimit { .. })
        ));
    }

    #[test]
    fn limits_and_status_parse() {
        let limits =
            "Limit                     Soft Limit           Hard Limit           Units     \n\
            Max stack size            8388608              unlimited            bytes     \n\
            Max address space         4096000000           unlimited            bytes     \n";
        assert_eq!(address_space_limit(limits), Some(4_096_000_000));
        let unlimited =
            "Max address space         unlimited            unlimited            bytes\n";
        assert_eq!(address_space_limit(unlimited), None);
        assert_eq!(vm_size("Name:\tx\nVmSize:\t  123 kB\n"), Some(123 * 1024));
    }
}
