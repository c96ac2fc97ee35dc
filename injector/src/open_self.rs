//! The self time so far of a thread's open activations.
//!
//! A function's `SELF_TOTAL` word counts closed activations only, while
//! its wall time counts a running outermost activation up to the reading:
//! a thread blocked in `epoll_wait` (timed, no timed callee) showed wall
//! 3.50 s and self 2.95 s. Reports add, for every timed activation still
//! open, its self time so far, from the thread's activation cells (in the
//! target's memory; the row says where) and the row's self-ticks word `N`:
//!
//! ```text
//! open timed cells c_1 … c_k, bottom to top, each with base b_i = t0_i - N_i
//! b_(k+1) = now - N
//! self so far of c_i = b_(i+1) - b_i
//! ```
//!
//! `b_(i+1) - b_i` is the time from `c_i`'s start to `c_(i+1)`'s, less the
//! self times of the activations closed in between (those nested in
//! `c_i`): `c_i`'s self time stops growing while a timed callee runs, as
//! it does once closed. Cells without timers (an untimed function's exit
//! hook) are transparent, as in the closed totals. The thread runs on while
//! its cells are read: a cell pushed or popped meanwhile makes one reading
//! off by that activation, so callers cap a function's self time at its
//! wall time, which bounds it (every activation's self time lies inside
//! its outermost activation).

use std::collections::HashMap;
use weft_rt::layout::metric::{CELL_FLAGS, CELL_METRIC, CELL_SELF_BASE, CELL_SIZE, CELL_TIMED};

/// Most cells read: a thread has 1,024 (see docs/exits-and-timers.md).
const MAX_CELLS: u64 = 1024;

/// Activations weft retired (pointed at the sink words when their probes
/// were removed, `Process::retire_open_activations`): cell address → the
/// metric base the cell had, so that their self time still goes to their
/// function while the sink stands in their cell.
pub(crate) type Retired = HashMap<u64, i32>;

/// Self ticks so far of the open timed activations in `cells` (the bytes
/// of `[first, top)`), summed per metric base (row byte offset), at raw
/// wall reading `now` with the thread's self-ticks word `n`. A cell whose
/// base is `sink` and whose address `retired` knows counts for the base
/// it had.
pub(crate) fn open_self_ticks(
    cells: &[u8],
    (first, sink, retired): (u64, i32, &Retired),
    n: u64,
    now: u64,
) -> HashMap<i32, u64> {
    let word = |c: &[u8], at: usize, len: usize| -> u64 {
        let mut b = [0u8; 8];
        b[..len].copy_from_slice(&c[at..at + len]);
        u64::from_le_bytes(b)
    };
    let timed: Vec<(i32, u64)> = cells
        .chunks_exact(CELL_SIZE)
        .enumerate()
        .filter(|(_, c)| word(c, CELL_FLAGS, 4) as u32 & CELL_TIMED != 0)
        .map(|(i, c)| {
            let metric = word(c, CELL_METRIC, 4) as u32 as i32;
            let at = first + (i * CELL_SIZE) as u64;
            let metric = match retired.get(&at) {
                Some(&was) if metric == sink => was,
                _ => metric,
            };
            (metric, word(c, CELL_SELF_BASE, 8))
        })
        .collect();
    let mut out = HashMap::new();
    let now_base = now.wrapping_sub(n);
    for (i, &(metric, base)) in timed.iter().enumerate() {
        let next = timed.get(i + 1).map_or(now_base, |&(_, b)| b);
        // Negative: a cell read mid-change, or a start after `now`.
        let ticks = next.wrapping_sub(base);
        if metric > 0 && (ticks as i64) > 0 {
            *out.entry(metric).or_insert(0) += ticks;
        }
    }
    out
}

/// The open timed activations' self ticks of row `index`'s thread, per
/// metric base, at raw wall reading `now` (see the module docs); empty
/// when its cells cannot be read. `memory`: the target's, opened here
/// when None.
pub(crate) fn row_open_self_ticks(
    region: &crate::region::Region,
    (index, pid, retired): (u32, i32, &Retired),
    memory: &mut Option<crate::memory::ProcessMemory>,
    now: u64,
) -> HashMap<i32, u64> {
    use std::sync::atomic::Ordering::Acquire;
    let sink = match region.control().sink_word.load(Acquire).checked_sub(1) {
        Some(word) => weft_rt::layout::Geometry::metric_offset(word) as i32,
        None => -1, // no sink yet: no cell names it
    };
    let thread = &region.row_header(index).thread;
    // The thread runs on: an activation opened or closed between these
    // loads and the cells' read puts this reading off by its self time
    // (see the module docs: callers cap self time at wall time).
    let n = thread.self_ticks.load(Acquire);
    let (cells, top) = (thread.cells.load(Acquire), thread.top.load(Acquire));
    if memory.is_none() {
        *memory = crate::memory::ProcessMemory::open_read_only(pid).ok();
    }
    memory
        .as_ref()
        .and_then(|m| read_open_cells(m, cells, top))
        .map(|c| open_self_ticks(&c, (cells, sink, retired), n, now))
        .unwrap_or_default()
}

/// The bytes of a thread's open cells `[cells, top)`, read from the
/// target; None when it has none or the words make no sense.
fn read_open_cells(memory: &crate::memory::ProcessMemory, cells: u64, top: u64) -> Option<Vec<u8>> {
    let len = top.checked_sub(cells)?;
    if cells == 0 || len == 0 || len % CELL_SIZE as u64 != 0 || len > MAX_CELLS * CELL_SIZE as u64 {
        return None;
    }
    memory.read_vec(cells, len as usize).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(metric: i32, flags: u32, base: u64) -> Vec<u8> {
        let mut c = vec![0u8; CELL_SIZE];
        c[CELL_SELF_BASE..CELL_SELF_BASE + 8].copy_from_slice(&base.to_le_bytes());
        c[CELL_METRIC..CELL_METRIC + 4].copy_from_slice(&metric.to_le_bytes());
        c[CELL_FLAGS..CELL_FLAGS + 4].copy_from_slice(&flags.to_le_bytes());
        c
    }

    #[test]
    fn a_lone_open_call_is_all_self() {
        // Started at 1,000 with N = 100; now 5,000 with N = 300 (a callee
        // ran 200 ticks and closed).
        let cells = cell(64, CELL_TIMED, 1_000 - 100);
        let open = open_self_ticks(&cells, (0, -1, &Retired::new()), 300, 5_000);
        assert_eq!(open[&64], 4_000 - 200);
    }

    #[test]
    fn an_open_callee_stops_its_callers_self_time() {
        // outer at 1,000 (N 0); an untimed hook at 1,500 (transparent);
        // inner at 2,000 (N 100 by then); now 9,000, N still 100.
        let mut cells = cell(64, CELL_TIMED, 1_000);
        cells.extend(cell(96, 0, 12_345));
        cells.extend(cell(128, CELL_TIMED, 2_000 - 100));
        let open = open_self_ticks(&cells, (0, -1, &Retired::new()), 100, 9_000);
        assert_eq!(open[&64], 900);
        assert_eq!(open[&128], 7_000);
        assert!(!open.contains_key(&96));
        // Recursion: both activations of one function add up.
        let mut cells = cell(64, CELL_TIMED, 1_000);
        cells.extend(cell(64, CELL_TIMED, 3_000));
        assert_eq!(
            open_self_ticks(&cells, (0, -1, &Retired::new()), 0, 4_000)[&64],
            3_000
        );
        // A base past now (read mid-change) counts nothing, and retired
        // (negative) bases nothing.
        let mut cells = cell(-64, CELL_TIMED, 1_000);
        cells.extend(cell(64, CELL_TIMED, 9_000));
        assert!(open_self_ticks(&cells, (0, -1, &Retired::new()), 0, 5_000).is_empty());
    }

    #[test]
    fn a_retired_activation_counts_for_its_function() {
        // Two cells at 0x1000 and 0x1020, the second pointed at the sink
        // (base 4096) and known to have been base 128's.
        let mut cells = cell(64, CELL_TIMED, 1_000);
        cells.extend(cell(4096, CELL_TIMED, 3_000));
        let retired: Retired = [(0x1020, 128)].into();
        let open = open_self_ticks(&cells, (0x1000, 4096, &retired), 0, 4_000);
        assert_eq!((open[&64], open[&128]), (2_000, 1_000));
        assert!(!open.contains_key(&4096));
    }
}
