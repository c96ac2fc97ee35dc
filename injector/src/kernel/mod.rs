//! Kernel functions and system calls, per thread of one process, through
//! eBPF: the KernInst half of weft.
//!
//! `kernel:NAME` (a glob), `kernel:NAME+0x1c` (an instruction inside a
//! function) and `syscall:NAME` (a glob) name what to measure; a
//! [`Session`] loads the programs ([`weft_codegen::bpf`] generates them)
//! for one target, keeps them attached while it lives, and reads calls,
//! wall and CPU time per thread, split by the instrumented user function
//! each thread was innermost in when it entered the kernel. Dropping the
//! session (or weft dying) closes its descriptors, which detaches and
//! unloads everything.
//!
//! Mechanisms, best first: fentry/fexit (BPF trampolines; BTF needed),
//! kprobe/kretprobe, and for system calls the `raw_syscalls` tracepoints.
//! [`Capabilities::probe`] finds which the running kernel allows.

mod btf;
mod caps;
mod cpu_table;
mod session;
mod sys;
mod syscalls;

pub use btf::BtfError;
pub use caps::{Capabilities, Capability, CAPABILITY_PROBE};
pub(crate) use cpu_table::CpuTableFeed;
pub use session::{check, KernelRow, KernelSnapshot, ProbeInfo, Session, MAX_FUNCTIONS};
pub use sys::{loaded_programs, LoadedProgram};

use crate::inspect::pattern::{Glob, PatternError};
use std::fmt;

/// Names programs so that they can be found (and so that a test can check
/// that none is left): `weft_<tgid>_<kind>`.
pub const PROGRAM_PREFIX: &str = "weft_";

/// A pattern naming kernel code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelPattern {
    /// `kernel:GLOB`: kernel functions, timed from entry to return.
    Function(Glob),
    /// `kernel:NAME+OFFSET`: one instruction inside a function, counted.
    Instruction {
        /// The function.
        function: String,
        /// Bytes from its start.
        offset: u64,
    },
    /// `syscall:GLOB`: system calls, timed from `sys_enter` to `sys_exit`.
    Syscall(Glob),
}

impl fmt::Display for KernelPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelPattern::Function(g) => write!(f, "kernel:{}", g.as_str()),
            KernelPattern::Instruction { function, offset } => {
                write!(f, "kernel:{function}+{offset:#x}")
            }
            KernelPattern::Syscall(g) => write!(f, "syscall:{}", g.as_str()),
        }
    }
}

impl KernelPattern {
    /// `None` when `text` names user code (no `kernel:` or `syscall:`
    /// prefix); else the pattern or why it is wrong.
    pub fn parse(text: &str) -> Option<Result<KernelPattern, KernelError>> {
        let bad = |why: String| KernelError::BadPattern {
            pattern: text.to_string(),
            why,
        };
        let glob = |g: &str| {
            Glob::new(g)
                .map_err(|e: PatternError| bad(e.to_string()))
                .and_then(|g| {
                    if g.as_str().is_empty() {
                        Err(bad("nothing after the prefix".to_string()))
                    } else {
                        Ok(g)
                    }
                })
        };
        if let Some(rest) = text.strip_prefix("syscall:") {
            return Some(glob(rest).map(KernelPattern::Syscall));
        }
        let rest = text.strip_prefix("kernel:")?;
        Some(match rest.split_once('+') {
            None => glob(rest).map(KernelPattern::Function),
            Some((function, offset)) => {
                let value = match offset.strip_prefix("0x") {
                    Some(hex) => u64::from_str_radix(hex, 16),
                    None => offset.parse(),
                };
                match value {
                    Ok(offset) if !function.is_empty() && !function.contains(['*', '?', '[']) => {
                        Ok(KernelPattern::Instruction {
                            function: function.to_string(),
                            offset,
                        })
                    }
                    Ok(_) => Err(bad(
                        "an instruction needs one function by its exact name: kernel:NAME+0x1c"
                            .to_string(),
                    )),
                    Err(_) => Err(bad(format!(
                        "`{offset}` is not an offset; write kernel:NAME+0x1c (hex) or +28"
                    ))),
                }
            }
        })
    }
}

/// How a kernel probe is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mechanism {
    /// BPF trampolines at entry and return.
    Fentry,
    /// kprobe at entry, kretprobe at return.
    Kprobe,
    /// kprobe at an instruction inside the function (counts only).
    KprobeOffset,
    /// `raw_syscalls:sys_enter`/`sys_exit`.
    SyscallTracepoints,
}

impl Mechanism {
    /// How reports name it.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Fentry => "fentry/fexit",
            Mechanism::Kprobe => "kprobe/kretprobe",
            Mechanism::KprobeOffset => "kprobe at offset",
            Mechanism::SyscallTracepoints => "raw_syscalls tracepoints",
        }
    }
}

/// What went wrong with kernel probes.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// A malformed pattern.
    #[error("bad kernel pattern `{pattern}`: {why}")]
    BadPattern {
        /// As given.
        pattern: String,
        /// What is wrong.
        why: String,
    },
    /// No privilege for BPF.
    #[error("kernel patterns need root, or CAP_BPF and CAP_PERFMON ({0}): run weft as root, or leave out the kernel: and syscall: patterns (user functions need only ptrace)")]
    NotPermitted(String),
    /// Nothing matched.
    #[error("no {what} matches `{pattern}`{}", suggestions_text(.suggestions))]
    NoMatch {
        /// As given.
        pattern: String,
        /// "kernel function" or "system call".
        what: &'static str,
        /// Close names.
        suggestions: Vec<String>,
    },
    /// The kernel offers no way to probe it.
    #[error("cannot probe `{pattern}` on this kernel: {why}")]
    Unavailable {
        /// As given.
        pattern: String,
        /// Each mechanism and why it is out.
        why: String,
    },
    /// The verifier or the kernel refused a program.
    #[error("the kernel refused weft's BPF program for {what}: {source}{}", log_text(.log))]
    Load {
        /// Which probe.
        what: String,
        /// The errno.
        source: std::io::Error,
        /// The verifier log's last lines.
        log: String,
    },
    /// An offset in the middle of an instruction.
    #[error("`{pattern}`: the kernel refuses a probe there (EILSEQ): the offset is not the start of an instruction, or is inside the function's ftrace call; disassemble the function (e.g. `gdb -batch -ex 'disassemble FUNCTION' vmlinux`) and pick an instruction's offset")]
    NotAnInstruction {
        /// As given.
        pattern: String,
    },
    /// Attaching failed.
    #[error("cannot attach to {what}: {source}")]
    Attach {
        /// Which probe.
        what: String,
        /// Why.
        source: std::io::Error,
    },
    /// A map operation failed.
    #[error("BPF map {what}: {source}")]
    Map {
        /// Which operation.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
}

fn suggestions_text(s: &[String]) -> String {
    if s.is_empty() {
        String::new()
    } else {
        format!("; did you mean {}?", s.join(", "))
    }
}

fn log_text(log: &str) -> String {
    if log.is_empty() {
        String::new()
    } else {
        format!(" (verifier: {log})")
    }
}

/// What a pattern resolved to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// A kernel function (from its entry, or at an offset).
    Function { name: String, offset: Option<u64> },
    /// A system call by number.
    Syscall { name: String, number: u32 },
}

/// Every system call a glob matches, by name.
pub fn syscalls_matching(glob: &Glob) -> Vec<(&'static str, u32)> {
    syscalls::SYSCALLS
        .iter()
        .filter(|(name, _)| glob.matches(name))
        .copied()
        .collect()
}

/// The names of system calls (for suggestions).
pub(crate) fn syscall_names() -> impl Iterator<Item = &'static str> {
    syscalls::SYSCALLS.iter().map(|(n, _)| *n)
}

/// Kernel functions a probe can be put on, with the mechanism weft would
/// use; what `weft list 'kernel:…'` prints. fentry's come from BTF, kprobe's
/// from the tracing filter list (`available_filter_functions`) or, without
/// tracefs, `/proc/kallsyms`.
pub fn probeable_functions(caps: &Capabilities) -> Vec<(String, Mechanism)> {
    let mut out: std::collections::BTreeMap<String, Mechanism> = Default::default();
    if caps.kprobes.is_ok() {
        for name in caps::kprobe_candidates() {
            out.insert(name, Mechanism::Kprobe);
        }
    }
    if caps.fentry.is_ok() {
        if let Ok(btf) = btf::Btf::vmlinux() {
            for name in btf.function_names() {
                out.insert(name.to_string(), Mechanism::Fentry);
            }
        }
    }
    out.into_iter().collect()
}

/// Every kernel function name the machine knows (probeable or not), for
/// suggestions and for telling "no such function" from "cannot probe it".
pub(crate) fn known_functions() -> Vec<String> {
    let mut names = caps::kprobe_candidates();
    if names.is_empty() {
        if let Ok(btf) = btf::Btf::vmlinux() {
            names = btf.function_names().map(str::to_string).collect();
        }
    }
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kernel_and_syscall_patterns() {
        assert!(KernelPattern::parse("work_*").is_none());
        assert!(KernelPattern::parse("libc.so.6:malloc").is_none());
        assert_eq!(
            KernelPattern::parse("kernel:do_filp_open+0x1c")
                .unwrap()
                .unwrap(),
            KernelPattern::Instruction {
                function: "do_filp_open".into(),
                offset: 0x1c
            }
        );
        assert_eq!(
            KernelPattern::parse("kernel:vfs_read+28").unwrap().unwrap(),
            KernelPattern::Instruction {
                function: "vfs_read".into(),
                offset: 28
            }
        );
        match KernelPattern::parse("syscall:open*").unwrap().unwrap() {
            KernelPattern::Syscall(g) => assert!(g.matches("openat") && !g.matches("read")),
            other => panic!("{other:?}"),
        }
        for bad in [
            "kernel:",
            "syscall:",
            "kernel:vfs_*+4",
            "kernel:vfs_read+zz",
        ] {
            let e = KernelPattern::parse(bad).unwrap().unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
    }

    #[test]
    fn syscall_globs_match_by_name() {
        let g = Glob::new("openat*").unwrap();
        let found = syscalls_matching(&g);
        assert!(found.contains(&("openat", 257)));
        assert!(found.contains(&("openat2", 437)));
        assert_eq!(
            syscalls_matching(&Glob::new("read").unwrap()),
            vec![("read", 0)]
        );
    }
}
