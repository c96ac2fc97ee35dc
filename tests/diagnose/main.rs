//! `weft diagnose`: the search on planted bottlenecks, on real programs,
//! the acceptance of issue #14 and the static call graph.
//!
//! The searches measure shares of the machine, and the acceptance test
//! bounds the stops of the world: every test here that runs a target takes
//! [`support::one_at_a_time`], so that none runs beside another's target.
//!
//! One module per test file; tests/README.md says how the tests are
//! grouped into binaries and how to run one.

// Public, as in every binary: each uses a part of support, and rustc does
// not report a public module's public items as dead code (support/mod.rs).
#[path = "../support/mod.rs"]
pub mod support;

mod diagnose;
mod diagnose_acceptance;
mod diagnose_graph;
mod diagnose_real;
mod late_threads;
mod mariadb_idle;
mod shared_code;
