//! The CPU-time table's feed: the `sched_switch` program that writes a
//! target thread's slot when it comes on a CPU
//! ([`weft_codegen::bpf::cpu_table`]), and the table itself, a
//! `BPF_F_MMAPABLE` array the target's runtime maps
//! (`weft_rt::clock::weft_rt_map_cpu_table`). With it, a thread's CPU clock
//! needs no perf event: on a KVM guest an event costs its thread about a
//! microsecond at every context switch, the program a few dozen
//! nanoseconds for the target's switches.
//!
//! The feed lives as long as this value (the link, the program, weft's
//! descriptor of the map): a weft that dies takes its program with it,
//! and the target's clocks fall back to re-anchoring with a system call
//! once their anchors age (a millisecond).

use std::os::fd::OwnedFd;
use std::sync::OnceLock;

use weft_abi::clock::table;
use weft_codegen::bpf::cpu_table::{cpu_table_program, CpuTableProgram};

use super::btf::Btf;
use super::sys::{self, Map, ProgType, Program};
use super::{KernelError, PROGRAM_PREFIX};

/// Where the program finds what it reads in the running kernel.
#[derive(Clone, Copy, Debug)]
struct Offsets {
    /// `btf_trace_sched_switch`, for a `tp_btf` program.
    typedef: Option<u32>,
    next_arg: u32,
    task_pid: u32,
    task_tgid: u32,
    task_sum_exec: u32,
}

fn offsets() -> Result<Offsets, KernelError> {
    static OFFSETS: OnceLock<Result<Offsets, String>> = OnceLock::new();
    OFFSETS
        .get_or_init(|| {
            let btf = Btf::vmlinux().map_err(|e| e.to_string())?;
            let found = (
                btf.tracepoint_arg("sched_switch", "next"),
                btf.offset_of("task_struct", &["pid"]),
                btf.offset_of("task_struct", &["tgid"]),
                btf.offset_of("task_struct", &["se", "sum_exec_runtime"]),
            );
            match found {
                (Some(next_arg), Some(task_pid), Some(task_tgid), Some(task_sum_exec)) => Ok(Offsets {
                    typedef: btf.typedef("btf_trace_sched_switch"),
                    next_arg,
                    task_pid,
                    task_tgid,
                    task_sum_exec,
                }),
                _ => Err("the kernel's BTF does not describe sched_switch's `next` or task_struct's pid, tgid, se.sum_exec_runtime".to_string()),
            }
        })
        .clone()
        .map_err(|why| KernelError::Unavailable {
            pattern: "the CPU-time table".to_string(),
            why,
        })
}

/// A table and the program writing it for one process. Made (the map,
/// the program through the verifier: milliseconds) apart from attached
/// (at once): a tool makes it before the stop of the world that installs
/// the first CPU timer, and only attaching costs the machine's switches.
#[derive(Debug)]
pub(crate) struct CpuTableFeed {
    // Dropped in this order: the link first, so that the program stops
    // before anything else goes.
    link: Option<OwnedFd>,
    program: Program,
    map: Map,
    /// Whether `program` is a `tp_btf` one (else a raw tracepoint).
    typed: bool,
}

impl CpuTableFeed {
    /// A new table for process `tgid`, and its program loaded (not yet
    /// attached: [`CpuTableFeed::attach`]).
    pub fn new(tgid: u32) -> Result<CpuTableFeed, KernelError> {
        let offsets = offsets()?;
        let map = Map::create_mmapable(
            sys::MAP_ARRAY,
            &format!("{PROGRAM_PREFIX}{tgid}_cpu"),
            4,
            table::SLOT_SIZE as u32,
            table::SLOTS,
        )
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => KernelError::NotPermitted(e.to_string()),
            _ => KernelError::Map {
                what: "create",
                source: e,
            },
        })?;
        Self::feeding(tgid, map, offsets)
    }

    /// A program of this weft's for the table another session made: its
    /// map descriptor, taken from the target (loaded, not yet attached).
    pub fn joining(tgid: u32, map: OwnedFd) -> Result<CpuTableFeed, KernelError> {
        let offsets = offsets()?;
        let map = Map::from_fd(map, 4, table::SLOT_SIZE);
        Self::feeding(tgid, map, offsets)
    }

    /// Loads the program on `map`: a `tp_btf` one where the kernel takes
    /// it (plain loads of `next`'s fields: on a KVM guest the raw
    /// tracepoint's three `bpf_probe_read_kernel` calls cost about as much
    /// as the tracepoint itself), else a raw tracepoint.
    fn feeding(tgid: u32, map: Map, o: Offsets) -> Result<CpuTableFeed, KernelError> {
        let what = || "the CPU-time table".to_string();
        let name = format!("{PROGRAM_PREFIX}{tgid}_cpu");
        let build = |typed: bool| {
            cpu_table_program(&CpuTableProgram {
                tgid,
                next_arg: o.next_arg,
                task_pid: o.task_pid,
                task_tgid: o.task_tgid,
                task_sum_exec: o.task_sum_exec,
                table: map.raw(),
                typed,
            })
            .map_err(|e| KernelError::Load {
                what: what(),
                source: std::io::Error::other(e.to_string()),
                log: String::new(),
            })
        };
        if let Some(btf_id) = o.typedef {
            let tracing = sys::TracingTarget {
                attach_type: sys::ATTACH_TRACE_RAW_TP,
                btf_id,
            };
            if let Ok(program) =
                Program::load(ProgType::Tracing, &name, &build(true)?, Some(tracing))
            {
                return Ok(CpuTableFeed {
                    link: None,
                    program,
                    map,
                    typed: true,
                });
            }
        }
        let program =
            Program::load(ProgType::RawTracepoint, &name, &build(false)?, None).map_err(|e| {
                KernelError::Load {
                    what: what(),
                    source: e.error,
                    log: e.log,
                }
            })?;
        Ok(CpuTableFeed {
            link: None,
            program,
            map,
            typed: false,
        })
    }

    /// Attaches the program to `sched_switch` (once; again is nothing).
    pub fn attach(&mut self) -> Result<(), KernelError> {
        if self.link.is_some() {
            return Ok(());
        }
        let name = (!self.typed).then_some("sched_switch");
        let link = sys::raw_tracepoint_open(&self.program, name).map_err(|source| {
            KernelError::Attach {
                what: "the CPU-time table".to_string(),
                source,
            }
        })?;
        self.link = Some(link);
        Ok(())
    }

    /// The table's map descriptor in this process (to hand to the target).
    pub fn map_fd(&self) -> i32 {
        self.map.raw()
    }

    /// Maps the table into this process (for a feed of weft's own
    /// threads: measuring what the program costs a switch).
    pub fn map_here(&self) -> std::io::Result<TableMapping> {
        // SAFETY: a shared mapping of a BPF array weft made mmapable, as
        // long as the array; nothing else is at the address the kernel
        // picks.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                table::TABLE_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.map.raw(),
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(TableMapping(at as u64))
    }
}

/// A table mapped into weft's own process; unmapped on drop.
#[derive(Debug)]
pub(crate) struct TableMapping(u64);

impl TableMapping {
    /// Where it is mapped.
    pub fn base(&self) -> u64 {
        self.0
    }
}

impl Drop for TableMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made by `map_here`, unmapped once.
        unsafe { libc::munmap(self.0 as *mut libc::c_void, table::TABLE_BYTES) };
    }
}
