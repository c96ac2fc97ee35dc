//! Programs nobody here wrote: real programs run and attached to, and real
//! servers (Debian's memcached, MariaDB, nginx and PostgreSQL, which `scripts/test`
//! installs) under overlapping sessions, several hundred threads, and
//! several processes.
//!
//! One module per test file; tests/README.md says how the tests are
//! grouped into binaries and how to run one.

// Public, as in every binary: each uses a part of support, and rustc does
// not report a public module's public items as dead code (support/mod.rs).
#[path = "../support/mod.rs"]
pub mod support;

mod mariadb;
mod nginx;
mod postgres;
mod real_programs;
mod real_sessions;
