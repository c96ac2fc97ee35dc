//! A process held and changed while it lives: as many threads as servers
//! run, 100,000 counted functions, several sessions at once, signals,
//! threads and libraries that come and go, weft killed at any moment, a
//! change that fails half-way, several processes held by one program, and
//! their stacks walked.
//!
//! One module per test file; tests/README.md says how the tests are
//! grouped into binaries and how to run one.

// Public, as in every binary: each uses a part of support, and rustc does
// not report a public module's public items as dead code (support/mod.rs).
#[path = "../support/mod.rs"]
pub mod support;

mod capacity;
mod clock_events;
mod events;
mod failed_changes;
mod many_processes;
mod many_threads;
mod sessions;
mod signals;
mod stack_walk;
mod weft_killed;
