//! The runtime's contract, exercised in-process: rows per thread, TIDs and
//! names recorded, exit marked, sessions reset, geometry checked.

use std::sync::atomic::Ordering;
use weft_rt::clock::{tsc_is_invariant, WallClock, WallPreference, WALL_TSC};
use weft_rt::layout::{Geometry, RegionHeader, RowHeader, MAGIC, ROW_EXITED, ROW_LIVE};
use weft_rt::{weft_rt_init, weft_rt_register_thread, weft_rt_tls_offset};

/// The wall clock every `init` hands over, as weft hands its own: a real
/// one with its rate nudged by one part in 2^20 or so, so the region's
/// copy shows whose it is.
fn handed_clock() -> WallClock {
    static CLOCK: std::sync::OnceLock<WallClock> = std::sync::OnceLock::new();
    *CLOCK.get_or_init(|| {
        let mut wall = WallClock::new(WallPreference::Auto);
        if wall.kind == WALL_TSC {
            wall.cal.mult += (wall.cal.mult >> 20).max(1);
            wall.cal.ns_base = 12_345; // re-based by the runtime
        }
        wall
    })
}

fn init(max_rows: u32, metric_words: u32, reset_words: u32) -> i64 {
    let bytes = handed_clock().to_bytes();
    // SAFETY: 32 readable bytes, as weft_rt_init wants.
    unsafe {
        weft_rt_init(
            max_rows,
            metric_words,
            reset_words,
            bytes.as_ptr().cast(),
            0,
        )
    }
}

fn region() -> *const u8 {
    // The region is mapped at an address only the runtime knows; find it
    // through a registered row: row 0 lies ROWS_OFFSET bytes past the start.
    let row = weft_rt_register_thread();
    assert!(!row.is_null());
    let fd = init(64, 16, 0);
    assert!(fd >= 0);
    let map = std::fs::read_to_string("/proc/self/maps").unwrap();
    let line = map
        .lines()
        .find(|l| l.contains("memfd:weft-shm"))
        .expect("region mapped");
    let start = u64::from_str_radix(line.split('-').next().unwrap(), 16).unwrap();
    start as *const u8
}

fn gettid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

#[test]
fn the_runtime_contract() {
    // Before init, registration counts nothing.
    assert!(weft_rt_register_thread().is_null());
    let fd = init(64, 16, 0);
    assert!(fd >= 0, "init failed: {fd}");
    // A later session is served by the existing region, whatever geometry
    // it asks for (the injector reads the region's own from its header).
    assert_eq!(init(65, 32, 0), fd);
    assert!(
        weft_rt_tls_offset() < 0,
        "static TLS lies below the thread pointer"
    );

    let base = region();
    // SAFETY: the region starts with a header the runtime initialised.
    let header = unsafe { &*(base as *const RegionHeader) };
    assert_eq!(header.magic, MAGIC);
    assert_eq!(header.tls_offset, weft_rt_tls_offset());
    // The handed clock's rate, re-based on this process's own timeline.
    let handed = handed_clock();
    let wall = WallClock::in_region(header);
    assert_eq!(wall.kind, handed.kind);
    assert_eq!(wall.source(), handed.source());
    if handed.kind == WALL_TSC {
        assert!(tsc_is_invariant());
        assert_eq!(wall.cal.mult, handed.cal.mult);
        assert_eq!(wall.cal.shift, handed.cal.shift);
        assert_ne!(wall.cal.ns_base, 12_345, "not re-based");
        let skew = wall.now().abs_diff(weft_rt::clock::monotonic_ns());
        assert!(skew < 1_000_000, "re-based clock off by {skew} ns");
    }
    let geometry = Geometry {
        max_rows: header.max_rows,
        metric_words: header.metric_words,
    };
    assert_eq!(geometry.row_stride() % 64, 0);

    // The main thread's row is stable and holds its TID.
    let main_row = weft_rt_register_thread();
    assert_eq!(main_row, weft_rt_register_thread());
    // SAFETY: rows start with a RowHeader.
    let main_header = unsafe { &*(main_row as *const RowHeader) };
    assert_eq!(main_header.tid.load(Ordering::Relaxed), gettid());
    assert_eq!(main_header.state.load(Ordering::Relaxed), ROW_LIVE);

    // Eight threads get eight distinct rows, cache-line apart, named, and
    // marked exited when they end.
    let rows: Vec<(usize, u32)> = (0..8)
        .map(|i| {
            std::thread::Builder::new()
                .name(format!("rt-test-{i}"))
                .spawn(|| {
                    let row = weft_rt_register_thread();
                    // Count into word 3 as a trampoline would.
                    // SAFETY: word 3 < metric_words lies inside this thread's row.
                    unsafe { *(row.add(Geometry::metric_offset(3) as usize) as *mut u64) += 7 };
                    (row as usize, gettid())
                })
                .unwrap()
        })
        .map(|h| h.join().unwrap())
        .collect();
    let mut addresses: Vec<usize> = rows.iter().map(|r| r.0).collect();
    addresses.sort_unstable();
    addresses.dedup();
    assert_eq!(addresses.len(), 8);
    assert!(addresses.windows(2).all(|w| w[1] - w[0] >= 64));
    for (row, tid) in &rows {
        // SAFETY: as above.
        let h = unsafe { &*(*row as *const RowHeader) };
        assert_eq!(h.tid.load(Ordering::Relaxed), *tid);
        assert_eq!(
            h.state.load(Ordering::Acquire),
            ROW_EXITED,
            "exit not recorded"
        );
        let name: Vec<u8> = h
            .name
            .iter()
            .flat_map(|w| w.0.load(Ordering::Relaxed).to_le_bytes())
            .collect();
        assert!(
            name.starts_with(b"rt-test-"),
            "{:?}",
            String::from_utf8_lossy(&name)
        );
        // SAFETY: word 3 of the row.
        assert_eq!(
            unsafe { *((*row + Geometry::metric_offset(3) as usize) as *const u64) },
            7
        );
    }

    // A new session zeroes the words it will use, rows and TIDs stay.
    let session = header.session.load(Ordering::Relaxed);
    assert_eq!(init(64, 16, 4), fd);
    assert_eq!(header.session.load(Ordering::Relaxed), session + 1);
    for (row, tid) in &rows {
        // SAFETY: as above.
        assert_eq!(
            unsafe { *((*row + Geometry::metric_offset(3) as usize) as *const u64) },
            0
        );
        let h = unsafe { &*(*row as *const RowHeader) };
        assert_eq!(h.tid.load(Ordering::Relaxed), *tid);
    }
}
