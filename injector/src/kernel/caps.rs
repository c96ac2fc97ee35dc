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
    /// CPU time without the time a hypervisor stole, as the kernel counts
    /// its threads' CPU time: on a KVM guest kernel that leaves stolen time
    /// out of its threads' (`CONFIG_PARAVIRT_TIME_ACCOUNTING`) and lets BPF
    /// read its per-CPU steal counter.
    pub steal: Result<(), String>,
}

/// The name of the programs and maps loaded to try a mechanism (closed at
/// once; the kernel frees them a moment later).
pub const CAPABILITY_PROBE: &str = "weft_probe";

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
        let privileged = Map::create(sys::MAP_ARRAY, CAPABILITY_PROBE, 4, 8, 1)
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
                kprobes: Err(why.clone()),
                steal: Err(why),
            };
        }
        let empty = weft_codegen::bpf::programs::empty_program();
        let raw_tp = |tp: &str| -> Result<(), String> {
            let p = Program::load(ProgType::RawTracepoint, CAPABILITY_PROBE, &empty, None)
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
                    CAPABILITY_PROBE,
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
            Ok(_) => Program::load(ProgType::Kprobe, CAPABILITY_PROBE, &empty, None)
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
        let steal = match &sched_switch {
            Ok(()) => steal_state(),
            Err(_) => Err("no CPU time (sched_switch)".into()),
        };
        Capabilities {
            privileged,
            btf,
            syscalls,
            sched_switch,
            fentry,
            kprobes,
            steal,
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
            Capability {
                name: "steal accounting",
                used_for: "CPU time without what the hypervisor stole, as the thread's own clock",
                available: self.steal.clone(),
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

/// The per-CPU counter of the time a hypervisor stole (KVM's
/// `steal_time.steal`), when this kernel leaves that time out of its
/// threads' CPU time (`CONFIG_PARAVIRT_TIME_ACCOUNTING`): weft's kernel CPU
/// times then leave it out as well. `Err` says why not.
///
/// `WEFT_KERNEL_STEAL=always` reads the counter whatever the config says
/// (the tests' way to run the read on a kernel that does not need it).
pub(crate) fn steal_counter(btf: &Btf) -> Result<weft_codegen::bpf::programs::Steal, String> {
    let always = std::env::var_os("WEFT_KERNEL_STEAL").is_some_and(|v| v == "always");
    let config = if always {
        Some(true)
    } else {
        kernel_config("CONFIG_PARAVIRT_TIME_ACCOUNTING")
    };
    match config {
        Some(true) => {}
        Some(false) => {
            return Err("this kernel counts stolen time as its threads' CPU time \
                 (CONFIG_PARAVIRT_TIME_ACCOUNTING off), and so does weft"
                .into())
        }
        None => {
            return Err(
                "kernel config not found (/proc/config.gz, /boot/config-RELEASE): \
                 stolen time is counted as CPU time"
                    .into(),
            )
        }
    }
    let (var, offset) = btf.variable_member("steal_time", "steal").ok_or_else(|| {
        "not needed: no KVM steal counter in this kernel (not a KVM guest kernel)".to_string()
    })?;
    Ok(weft_codegen::bpf::programs::Steal { var, offset })
}

fn steal_state() -> Result<(), String> {
    let btf = Btf::vmlinux().map_err(|e| e.to_string())?;
    let steal = steal_counter(&btf)?;
    let program = weft_codegen::bpf::programs::steal_probe_program(steal)
        .map_err(|e| format!("internal: {e}"))?;
    let p =
        Program::load(ProgType::RawTracepoint, CAPABILITY_PROBE, &program, None).map_err(|e| {
            if e.error.raw_os_error() == Some(libc::ENOENT) {
                // The verifier finds a kernel variable's address in kallsyms.
                "this kernel lists no data symbols (CONFIG_KALLSYMS_ALL off), so BPF cannot reach \
             its steal counter: stolen time is counted as CPU time"
                    .to_string()
            } else {
                format!("the kernel refuses the read: {}", out("steal", &e.error))
            }
        })?;
    drop(p);
    Ok(())
}

/// Whether kernel option `name` is `y` in the running kernel's config
/// (`/proc/config.gz`, else `/boot/config-RELEASE`); `None` when neither is
/// there.
fn kernel_config(name: &str) -> Option<bool> {
    use std::io::Read;
    let text = std::fs::File::open(crate::inspect::procfs::system_file("config.gz"))
        .ok()
        .and_then(|f| {
            let mut text = String::new();
            flate2::read::GzDecoder::new(f)
                .read_to_string(&mut text)
                .ok()
                .map(|_| text)
        })
        .or_else(|| {
            let release = std::fs::read_to_string(crate::inspect::procfs::system_file(
                "sys/kernel/osrelease",
            ))
            .ok()?;
            std::fs::read_to_string(format!("/boot/config-{}", release.trim())).ok()
        })?;
    let set = format!("{name}=y");
    Some(text.lines().any(|l| l == set))
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
    std::fs::read_to_string(crate::inspect::procfs::system_file("kallsyms"))
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
