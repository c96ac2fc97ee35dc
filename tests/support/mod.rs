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
//!
//! # Dead code
//!
//! Each test binary compiles this module once, and uses a part of it. It
//! declares it `pub mod support`, so that rustc does not report the public
//! items a binary leaves unused (a public module's public items are the
//! crate's exports, even in a test crate); what is private here is still
//! reported. An item public here must be used by some test:
//! `tests/support/unused.sh` (a step of scripts/test) lists the public
//! items that no binary uses.

mod checks;
mod process;
mod report;
mod rng;
mod system;
mod targets;

pub mod kernel_calls;
pub mod mariadb;
pub mod qemu;
pub mod viewers;

pub use checks::*;
pub use process::*;
pub use report::*;
pub use rng::*;
pub use system::*;
pub use targets::*;
