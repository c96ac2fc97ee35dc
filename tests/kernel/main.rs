//! Kernel probes: on this machine's own kernel (tracepoints), and on
//! Debian's stock kernel booted under QEMU (kprobes, fentry/fexit), with
//! the QEMU guest harness's own check.
//!
//! The host's tests compare times and need both CPUs, and a guest under
//! QEMU keeps a CPU busy: every test here takes
//! [`support::one_at_a_time`].
//!
//! One module per test file; tests/README.md says how the tests are
//! grouped into binaries and how to run one.

// Public, as in every binary: each uses a part of support, and rustc does
// not report a public module's public items as dead code (support/mod.rs).
#[path = "../support/mod.rs"]
pub mod support;

mod kernel_guest;
mod kernel_host;
mod qemu_guest;
