//! weft: dynamic instrumentation of running threaded programs.
//!
//! Attach to an unmodified, running process (or launch one), find its
//! functions, splice per-thread counters into them, read the counters while
//! the process runs, and take everything out again, leaving the process as
//! it was. See [`Process`] for the entry point and `docs/design.md` for how
//! it works.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]

pub mod branches;
pub mod code;
mod error;
pub mod events;
pub mod exits;
pub mod inspect;
pub mod launch;
mod ledger;
pub mod library;
pub mod memory;
pub mod process;
pub mod ptrace;
pub mod region;
pub mod report;
pub mod runtime;
pub mod sample;
pub mod trampolines;

pub use error::Error;
pub use exits::Metrics;
pub use inspect::pattern::Pattern;
pub use process::{
    CallTargetCounts, Function, Held, PointSpec, Probe, ProbeId, ProbeKind, ProbeSpec, Process,
    Refused, Replacement, UserProbe, Words,
};
pub use report::Report;
pub use sample::Sampler;

/// Bytes with the alignment an ELF parser needs for zero-copy reads.
#[repr(C, align(16))]
struct Aligned<T: ?Sized>(T);

static RT_ALIGNED: &Aligned<[u8]> = &Aligned(*include_bytes!(env!("WEFT_RT_EMBEDDED")));

/// The runtime library (`weft-rt`), embedded at build time (16-byte aligned).
pub static RT: &[u8] = &RT_ALIGNED.0;
