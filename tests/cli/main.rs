//! `weft` the command: `run` and `attach` against the workers targets,
//! `list`, its errors and exit codes, exit hooks and timers, threads
//! blocked in system calls while it attaches, the small things users hit,
//! `weft demo`, statically linked programs, targets that fork, exec or
//! are stopped while weft's probes are live, and several processes in one
//! session.
//!
//! One module per test file; tests/README.md says how the tests are
//! grouped into binaries and how to run one.

// Public, as in every binary: each uses a part of support, and rustc does
// not report a public module's public items as dead code (support/mod.rs).
#[path = "../support/mod.rs"]
pub mod support;

mod cli_attach;
mod cli_blocking;
mod cli_demo;
mod cli_errors;
mod cli_exits;
mod cli_run;
mod cli_small;
mod cli_timers;
mod process_events;
mod run_static;
mod several_processes;
