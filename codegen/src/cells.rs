//! The activation cells' layout, typed for instruction operands: the exit
//! code, the entry snippets, the timers and the call traces all address a
//! thread's cells with these.

use crate::disp;
use weft_abi::layout::metric;

// The cell and word layout is `weft_abi::layout::metric`'s (the runtime
// closes activations with it too); these are its values typed for
// instruction operands.

/// Bytes per activation cell.
pub const CELL_SIZE: u32 = disp(metric::CELL_SIZE) as u32;
/// Offset inside a cell of the original return address (u64).
pub const CELL_RETURN_ADDRESS: i32 = disp(metric::CELL_RETURN_ADDRESS);
/// Offset inside a cell of the entry `rsp` (u64): the address of the return
/// address on the stack when the function was entered.
pub const CELL_ENTRY_RSP: i32 = disp(metric::CELL_ENTRY_RSP);
/// Offset inside a cell of a timed activation's self-time base (u64): the
/// raw wall reading at its start less the row's self-ticks word then (see
/// the `timer` module).
pub const CELL_SELF_BASE: i32 = disp(metric::CELL_SELF_BASE);
/// Offset inside a cell of the metric base (i32 row byte offset).
pub const CELL_METRIC: i32 = disp(metric::CELL_METRIC);
/// Offset inside a cell of its flags (u32).
pub const CELL_FLAGS: i32 = disp(metric::CELL_FLAGS);
/// Cell flags: [`CELL_TIMED`] (the function has timers: its metric base
/// holds the [`TIMER_METRIC_LEN`](crate::TIMER_METRIC_LEN) bytes of the
/// `timer` module), [`CELL_PROBE`] (the exit calls the user probe of the
/// function's call record, whose index is in the flags' bits from
/// [`CELL_RECORD_SHIFT`] up; see [`ExitProbes`](crate::ExitProbes)).
pub use metric::{
    CELL_CHAIN, CELL_HISTOGRAM, CELL_PROBE, CELL_RECORD_SHIFT, CELL_TIMED, CELL_TRACE,
};
