//! weft's in-target runtime.
//!
//! `weft` loads this library into the target with a remote `dlopen` and calls
//! [`weft_rt_init`]. From then on the runtime's only jobs are:
//!
//! * to own the shared-memory region (a memfd, see [`layout`]) that holds
//!   every thread's counters, which the injector maps read-only;
//! * to give each thread a row the first time it runs instrumented code
//!   ([`weft_rt_register_thread`], reached through the registration stub),
//!   record its TID and name, and mark the row exited when the thread ends;
//! * to keep the row pointer in a static-TLS variable whose offset from the
//!   thread pointer ([`weft_rt_tls_offset`]) generated code reads directly.
//!
//! The hot path (counting) is generated machine code, not Rust: nothing here
//! runs per instrumented call. Nothing here may panic: every function is
//! `extern "C"` and reached from the target's threads.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod clock;
/// The region layout, defined once in `weft-abi` for the runtime, the code
/// generator and the injector; kept under this name so that
/// `weft_rt::layout::...` paths stay valid.
pub use weft_abi::layout;

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod exits;
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod runtime;
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod state;

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub use exits::{
    call_record_addresses, cells_len, set_unwind_rows, weft_rt_enable_exits, UnwindRows,
    UNWIND_RA_EXPR,
};
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub use runtime::{weft_rt_init, weft_rt_register_thread};
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub use state::weft_rt_tls_offset;
