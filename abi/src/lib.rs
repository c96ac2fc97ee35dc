//! The one definition of what weft's three parts share in memory.
//!
//! The runtime (`weft-rt`, inside the target) creates the shared region and
//! closes activations itself; the code generator (`weft-codegen`) emits
//! machine code that reads and writes the same rows, cells and clock
//! states at fixed offsets; the injector (`weft`) maps the region and reads
//! the words the other two write. Each offset here used to be written down
//! in two crates and compared by a test; now both use these, so they cannot
//! disagree.
//!
//! * [`layout`]: the region (header, session slots, probe directory, rows),
//!   the metric words and activation cells of an instrumented function,
//!   call records, the offset of a user probe's constant in its context;
//! * [`clock`]: the fields of the runtime's thread CPU clock state that
//!   generated code reads inline;
//! * [`timer`]: how a reader in another thread or process takes a
//!   consistent copy of a function's timer words and computes its values.
//!
//! Pure data and arithmetic: no `std`, no dependencies, nothing that
//! depends on the host, so every part (and a test) can use it.

#![no_std]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod clock;
pub mod layout;
pub mod timer;
