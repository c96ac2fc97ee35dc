//! What weft shows: reports at any size (self times, histograms, long
//! tables), call traces and flame graphs loaded into real viewers,
//! `weft top` in a real terminal, and `--serve` scraped by a real
//! Prometheus.
//!
//! One module per test file; tests/README.md says how the tests are
//! grouped into binaries and how to run one.

// Public, as in every binary: each uses a part of support, and rustc does
// not report a public module's public items as dead code (support/mod.rs).
#[path = "../support/mod.rs"]
pub mod support;

mod reports;
mod serve;
mod top;
mod trace;
