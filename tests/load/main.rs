//! Stops of the world on a loaded machine: a hot leaf under 200 threads,
//! a thread late to stop, 1,000 insert/remove cycles, live sampling, live
//! reports while every CPU is busy.
//!
//! Each of these tests loads both CPUs or times the stops, so every test
//! here takes [`support::one_at_a_time`]: they run one after another, as
//! they did when each file was a binary of its own.
//!
//! One module per test file; tests/README.md says how the tests are
//! grouped into binaries and how to run one.

// Public, as in every binary: each uses a part of support, and rustc does
// not report a public module's public items as dead code (support/mod.rs).
#[path = "../support/mod.rs"]
pub mod support;

mod hot_leaf;
mod late_stop;
mod live_load;
mod probe_cycles;
mod sampling;
