//! Shared helpers for weft's end-to-end tests: building the target programs
//! (once per test binary), running processes under a kill-on-drop guard with
//! timeouts, and parsing the target's and weft's output.
//!
//! Every wait has a deadline ([`TIMEOUT`]); on failure the panic message shows
//! the stdout/stderr of every process the test started.
//!
//! One module per job; their items are re-exported here, so that a test
//! reaches them all with `use support::*`. The modules of a few tests
//! only are reached by name (`support::qemu::run_in_guest`).
#![allow(dead_code)]

mod checks;
mod process;
mod report;
mod rng;
mod system;
mod targets;

pub mod kernel_calls;
pub mod qemu;
pub mod viewers;

pub use checks::*;
pub use process::*;
pub use report::*;
pub use rng::*;
pub use system::*;
pub use targets::*;
