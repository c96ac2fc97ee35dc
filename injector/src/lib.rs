//! weft: dynamic instrumentation of running threaded programs.
//!
//! Attach to an unmodified, running process (or launch one), find its
//! functions, splice per-thread counters into them, read the counters while
//! the process runs, and take everything out again, leaving the process as
//! it was. See [`Process`] for the entry point, `docs/api.md` for a map
//! for tool builders and `docs/design.md` for how it works.
//!
//! # The public surface
//!
//! * At the root: [`Process`] (open, launch, find functions, read reports
//!   and memory) and [`Held`] (every change, while the process is held);
//!   what a change is made of: [`ProbeSpec`], [`Metrics`], [`UserProbe`],
//!   [`Predicate`], [`PointSpec`], [`ProbeId`], [`Probe`], [`ProbeKind`],
//!   [`Replacement`], [`CallTargetCounts`], [`Library`]; [`Pattern`],
//!   [`Function`]; [`Tid`], [`Registers`], [`ProcessExit`]; [`Report`],
//!   [`Sampler`]; [`Error`]; [`RuntimeOptions`], [`RealtimeGuard`].
//! * [`inspect`]: the process's modules, mappings and ELF files
//!   ([`ProcessImage`](inspect::ProcessImage), [`Module`](inspect::Module),
//!   [`ElfImage`](inspect::ElfImage)).
//! * [`code`]: a function's instructions, blocks, call sites and exits,
//!   source lines, demangled names.
//! * [`events`]: threads, libraries and exit as they happen; probes for
//!   libraries loaded later.
//! * [`report`] and [`sample`]: reading results (all of it, or live values
//!   cheaply and often).
//! * [`error`]: [`Error`] and the errors of the layers it wraps.
//!
//! Everything else (ptrace plumbing, the trampoline pool, the shared region,
//! runtime loading, the branch index) is internal.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod branches;
mod chain;
pub mod code;
mod cpu;
pub mod diagnose;
pub mod error;
pub mod events;
mod exits;
pub mod inspect;
pub mod kernel;
mod launch;
mod ledger;
mod library;
mod memory;
mod open_self;
mod placement;
mod process;
mod ptrace;
mod refusal;
mod region;
pub mod report;
mod runtime;
pub mod sample;
pub mod stack;
pub mod trace;
mod trampolines;

pub use error::{Error, Room};
pub use exits::Metrics;
pub use inspect::Pattern;
pub use library::Library;
pub use process::{
    Applied, CallTargetCounts, CpuClock, Function, Held, PointSpec, Probe, ProbeId, ProbeKind,
    ProbeSpec, Process, Refusal, Refused, Replacement, SharedCode, UserProbe, Words,
    MAX_CALL_TARGET_SLOTS,
};
pub use ptrace::{ProcessExit, RealtimeGuard, Registers, StopTime, Tid};
pub use report::Report;
pub use runtime::RuntimeOptions;
pub use sample::Sampler;
pub use trampolines::AREA_SIZE as TRAMPOLINE_AREA_SIZE;
/// The condition of a [`UserProbe`] (re-exported from `weft-codegen`).
pub use weft_codegen::Predicate;

/// Internals that weft's own integration tests exercise directly: the
/// parsers `tests/malformed_input/malformed_input.rs` feeds malformed
/// input, the branch index (`tests/code/cold_parts.rs`), the sampling
/// bench's memory floor, and fault injection in debug builds
/// (`tests/attach/failed_changes.rs`). Not part of the API.
#[doc(hidden)]
pub mod internals {
    pub use crate::branches::BranchIndex;
    pub use crate::inspect::maps::{free_gap_near, parse_maps};
    pub use crate::inspect::module::modules_from_maps;
    pub use crate::inspect::pattern::suggest;
    pub use crate::inspect::procfs::{parse_stat_state, process_state, ProcState};
    #[cfg(debug_assertions)]
    pub use crate::process::Fault;
    pub use crate::sample::LineFloor;
}

/// Bytes with the alignment an ELF parser needs for zero-copy reads.
#[repr(C, align(16))]
struct Aligned<T: ?Sized>(T);

static RT_ALIGNED: &Aligned<[u8]> = &Aligned(*include_bytes!(env!("WEFT_RT_EMBEDDED")));

/// The runtime library (`weft-rt`), embedded at build time (16-byte aligned).
pub(crate) static RT: &[u8] = &RT_ALIGNED.0;
