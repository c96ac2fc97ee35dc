//! Malformed input never makes weft's parsers panic or hang.
//!
//! A binary of its own: it installs a process-wide panic hook (to catch
//! the parsers' panics per call), which the tests of no other file should
//! run under.
//!
//! One module per test file; tests/README.md says how the tests are
//! grouped into binaries and how to run one.

// Public, as in every binary: each uses a part of support, and rustc does
// not report a public module's public items as dead code (support/mod.rs).
#[path = "../support/mod.rs"]
pub mod support;

mod malformed_input;
