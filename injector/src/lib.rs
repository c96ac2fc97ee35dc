//! weft: dynamic instrumentation of running threaded programs.
pub mod inspect;
