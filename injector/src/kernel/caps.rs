//! What the running kernel lets weft do, found by trying it: each
//! mechanism is loaded and attached once with an empty program, so the
//! answer is the kernel's own, with its errno, not a guess from config
//! files.

use super::btf::Btf;
use super::sys::{self, Map, ProgType, Program, TracingTarget};
use std::io;

/// One capability and why it is missing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capability {
    /// Short name.
    pub name: &'static str,
    /// What weft uses it for.
    pub used_for: &'static str,
    /// Available, or why not.
    pub available: Result<(), String>,
}

/// What the running kernel allows.
#[derive(Clone, Debug)]
pub struct Capabilities {
    /// May this process use `bpf(2)` at all.
    pub privileged: Result<(), String>,
    /// `/sys/kernel/btf/vmlinux` with the `task_struct` fields weft reads.
    pub btf: Result<(), String>,
    /// `raw_syscalls:sys_enter`/`sys_exit` raw tracepoints.
    pub syscalls: Result<(), String>,
    /// The `sched_switch` raw tracepoint (CPU time).
    pub sched_switch: Result<(), String>,
    /// fentry/fexit BPF trampolines.
    pub fentry: Result<(), String>,
    /// kprobes through the perf `kprobe` PMU.
    pub kprobes: Result<(), String>,
}

/// Kernel functions every kernel since 5.6 has, to try mechanisms on.
const TRY_ON: &[&str] = &["do_sys_openat2", "vfs_read", "ksys_read"];

fn errno_text(e: &io::Error) -> String {
    let name = match e.raw_os_error() {
        Some(libc::EPERM) => "EPERM",
        Some(libc::EACCES) => "EACCES",
        Some(libc::EINVAL) => "EINVAL",
        Some(libc::ENOENT) => "ENOENT",
        Some(libc::E2BIG) => "E2BIG",
        Some(libc::EOPNOTSUPP) => "EOPNOTSUPP",
        Some(524) => "ENOTSUPP",
        Some(libc::ENOSYS) => "ENOSYS",
        _ => return e.to_string(),
    };
    format!("{name}: {e}")
}

fn out(what: &str, e: &io::Error) -> String {
    let hint = match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => match what {
            "fentry" => {
                "; this kernel refuses BPF trampolines (lockdown, or a hypervisor or kernel policy)"
            }
            _ => "; needs root, or CAP_BPF and CAP_PERFMON",
        },
        Some(524) | Some(libc::EOPNOTSUPP) => "; not supported by this kernel",
        _ => "",
    };
    format!("{}{hint}", errno_text(e))
}

impl Capabilities {
    /// Tries each mechanism on the running kernel.
    pub fn probe() -> Capabilities {
        raise_memlock();
        let privileged = Map::create(sys::MAP_ARRAY, "weft_probe", 4, 8, 1)
            .map(drop)
            .map_err(|e| out("bpf", &e));
        if let Err(why) = &privileged {
            let why = format!("no BPF ({why})");
            return Capabilities {
                privileged: privileged.clone(),
                btf: btf_state(),
                syscalls: Err(why.clone()),
                sched_switch: Err(why.clone()),
                fentry: Err(why.clone()),
                kprobes: Err(why),
            };
        }
        let empty = weft_codegen::bpf::programs::empty_program();
        let raw_tp = |tp: &str| -> Result<(), String> {
            let p = Program::load(ProgType::RawTracepoint, "weft_probe", &empty, None)
                .map_err(|e| out("raw tracepoint", &e.error))?;
            sys::raw_tracepoint_open(&p, Some(tp))
                .map(drop)
                .map_err(|e| out("raw tracepoint", &e))
        };
        let btf = btf_state();
        let syscalls = raw_tp("sys_enter").and_then(|()| raw_tp("sys_exit"));
        let sched_switch = match &btf {
            Ok(()) => raw_tp("sched_switch"),
            Err(why) => Err(format!("no CPU time without BTF ({why})")),
        };
        let fentry = match Btf::vmlinux() {
            Err(e) => Err(format!("needs BTF: {e}")),
            Ok(btf) => match TRY_ON.iter().find_map(|f| btf.function(f)) {
                None => Err("BTF describes none of the usual kernel functions".to_string()),
                Some(id) => Program::load(
                    ProgType::Tracing,
                    "weft_probe",
                    &empty,
                    Some(TracingTarget {
                        attach_type: sys::ATTACH_FENTRY,
                        btf_id: id,
                    }),
                )
                .map_err(|e| out("fentry", &e.error))
                .and_then(|p| {
                    sys::raw_tracepoint_open(&p, None)
                        .map(drop)
                        .map_err(|e| out("fentry", &e))
                }),
            },
        };
        let kprobes = match sys::kprobe_pmu() {
            Err(_) => Err(
                "no kprobe PMU (/sys/bus/event_source/devices/kprobe): the kernel is built without kprobe events"
                    .to_string(),
            ),
            Ok(_) => Program::load(ProgType::Kprobe, "weft_probe", &empty, None)
                .map_err(|e| out("kprobe", &e.error))
                .and_then(|p| {
                    let mut last = String::new();
                    for f in TRY_ON {
                        match sys::attach_kprobe(&p, f, 0, false) {
                            Ok(_) => return Ok(()),
                            Err(e) => last = out("kprobe", &e),
                        }
                    }
                    Err(last)
                }),
        };
        Capabilities {
            privileged,
            btf,
            syscalls,
            sched_switch,
            fentry,
            kprobes,
        }
    }

    /// Each capability with what it is for.
    pub fn list(&self) -> Vec<Capability> {
        vec![
            Capability {
                name: "bpf",
                used_for: "any kernel probe",
                available: self.privileged.clone(),
            },
            Capability {
                name: "btf",
                used_for: "CPU time, attribution to user functions, fentry",
                available: self.btf.clone(),
            },
            Capability {
                name: "syscall tracepoints",
                used_for: "syscall: patterns",
                available: self.syscalls.clone(),
            },
            Capability {
                name: "sched_switch",
                used_for: "CPU time inside kernel code",
                available: self.sched_switch.clone(),
            },
            Capability {
                name: "fentry/fexit",
                used_for: "kernel: patterns (best)",
                available: self.fentry.clone(),
            },
            Capability {
                name: "kprobes",
                used_for: "kernel: patterns, kernel:NAME+OFFSET",
                available: self.kprobes.clone(),
            },
        ]
    }

    /// One line: what works and what does not, and why.
    pub fn line(&self) -> String {
        let parts: Vec<String> = self
            .list()
            .iter()
            .map(|c| match &c.available {
                Ok(()) => format!("{} yes", c.name),
                Err(why) => format!("{} no ({why})", c.name),
            })
            .collect();
        format!("kernel probes: {}", parts.join("; "))
    }
}

fn btf_state() -> Result<(), String> {
    let btf = Btf::vmlinux().map_err(|e| e.to_string())?;
    for path in [&["pid"][..], &["tgid"], &["thread", "fsbase"]] {
        if btf.offset_of("task_struct", path).is_none() {
            return Err(format!("BTF has no task_struct.{}", path.join(".")));
        }
    }
    Ok(())
}

/// Kernels before 5.11 charge BPF memory to `RLIMIT_MEMLOCK`; later ones
/// ignore it. Best effort: raising it needs the privilege BPF needs anyway.
pub(crate) fn raise_memlock() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads the struct we pass; failure is harmless.
    unsafe {
        libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited);
    }
}

/// Functions kprobes may be put on: the tracing filter list when tracefs is
/// mounted, else every text symbol of `/proc/kallsyms`.
pub(crate) fn kprobe_candidates() -> Vec<String> {
    for path in [
        "/sys/kernel/tracing/available_filter_functions",
        "/sys/kernel/debug/tracing/available_filter_functions",
    ] {
        if let Ok(text) = std::fs::read_to_string(path) {
            return text
                .lines()
                .filter_map(|l| l.split_whitespace().next())
                .filter(|n| !n.starts_with("__ftrace_invalid"))
                .map(str::to_string)
                .collect();
        }
    }
    std::fs::read_to_string("/proc/kallsyms")
        .map(|text| {
            text.lines()
                .filter_map(|l| {
                    let mut f = l.split_whitespace();
                    let (_, kind, name) = (f.next()?, f.next()?, f.next()?);
                    (kind == "t" || kind == "T").then(|| name.to_string())
                })
                .collect()
        })
        .unwrap_or_default()
}
