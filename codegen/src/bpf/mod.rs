//! eBPF code for kernel probes: an assembler ([`asm`]) and the programs
//! weft loads ([`programs`]). Pure like the rest of the crate: programs are
//! functions of the target's tgid, structure offsets and map descriptors;
//! the injector creates the maps, loads and attaches.

pub mod asm;
pub mod cpu_table;
pub mod programs;
