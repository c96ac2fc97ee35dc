//! What weft shows: reports at any size (self times, histograms, long
//! tables), call traces and flame graphs loaded into real viewers,
//! `weft top` in a real terminal, and `--serve` scraped by a real
//! Prometheus.
//!
//! One module per test file; tests/README.md says how the tests are
//! grouped into binaries and how to run one.
//!
//! Every test takes the binary's turn (`one_at_a_time`): a burst of calls
//! traced at ~100 million events a second (trace.rs) fills a thread's ring
//! in 2.6 ms, and its drain, at real-time priority, kept up on a 2-vCPU
//! machine beside three CPU hogs but not beside this binary's other tests
//! once in a fresh-clone CI (43,447 events dropped); run alone they are
//! also what they time.

// Public, as in every binary: each uses a part of support, and rustc does
// not report a public module's public items as dead code (support/mod.rs).
#[path = "../support/mod.rs"]
pub mod support;

mod reports;
mod serve;
mod top;
mod trace;
