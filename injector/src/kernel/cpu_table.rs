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

/// A table and the program writing it for one process.
#[derive(Debug)]
pub struct CpuTableFeed {
    // Dropped in this order: the link first, so that the program stops
    // before anything else goes.
    _link: OwnedFd,
    _program: Program,
    map: Map,
}

impl CpuTableFeed {
    /// A new table for process `tgid`, and its program attached.
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
    /// map descriptor, taken from the target.
    pub fn joining(tgid: u32, map: OwnedFd) -> Result<CpuTableFeed, KernelError> {
        let offsets = offsets()?;
        let map = Map::from_fd(map, 4, table::SLOT_SIZE);
        Self::feeding(tgid, map, offsets)
    }

    /// Loads and attaches the program on `map`: a `tp_btf` one where the
    /// kernel takes it (plain loads of `next`'s fields: on a KVM guest
    /// the raw tracepoint's three `bpf_probe_read_kernel` calls cost about
    /// as much as the tracepoint itself), else a raw tracepoint.
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
            let typed = Program::load(ProgType::Tracing, &name, &build(true)?, Some(tracing));
            if let Ok(program) = typed {
                if let Ok(link) = sys::raw_tracepoint_open(&program, None) {
                    return Ok(CpuTableFeed {
                        _link: link,
                        _program: program,
                        map,
                    });
                }
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
        let link = sys::raw_tracepoint_open(&program, Some("sched_switch")).map_err(|source| {
            KernelError::Attach {
                what: what(),
                source,
            }
        })?;
        Ok(CpuTableFeed {
            _link: link,
            _program: program,
            map,
        })
    }

    /// The table's map descriptor in this process (to hand to the target).
    pub fn map_fd(&self) -> i32 {
        self.map.raw()
    }
}
