//! Finding and instrumenting code: names as people write them (clones,
//! C++, modules, globs, separate debug files), code a jump enters or
//! nothing calls, entry points sharing code, how much of real code can be
//! instrumented, registers kept intact, Go code, and the library's
//! inspection, instruction points and user probes.
//!
//! One module per test file; tests/README.md says how the tests are
//! grouped into binaries and how to run one.

// Public, as in every binary: each uses a part of support, and rustc does
// not report a public module's public items as dead code (support/mod.rs).
#[path = "../support/mod.rs"]
pub mod support;

mod clone_names;
mod cold_parts;
mod constrained;
mod coverage;
mod debug_files;
mod globs;
mod go_programs;
mod inspect_api;
mod module_names;
mod multientry;
mod points;
mod registers;
mod uncalled_code;
mod user_probes;
