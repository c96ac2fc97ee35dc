//! One module per command: its arguments (a clap `Args` struct, the
//! command's help being its variant's in main.rs) and `exec`, which runs it.

pub mod attach;
pub mod demo;
pub mod diagnose;
pub mod doctor;
pub mod list;
pub mod run;
pub mod top;
