//! The command line's kernel half: `kernel:` and `syscall:` patterns on
//! `run` and `attach`, `weft list 'kernel:…'`, `weft doctor`.

use anyhow::{bail, Result};
use std::fmt::Write as _;
use weft::kernel::{Capabilities, KernelPattern, Session};
use weft::{Pattern, Process, Report};

/// Patterns split by where the code is.
pub struct Patterns {
    /// User functions.
    pub user: Vec<Pattern>,
    /// Kernel functions and system calls.
    pub kernel: Vec<KernelPattern>,
}

/// Splits `-f a,b -f c` into user and kernel patterns.
pub fn split(specs: &[String]) -> Result<Patterns> {
    let mut out = Patterns {
        user: Vec::new(),
        kernel: Vec::new(),
    };
    for spec in specs {
        // `ns::f(int, int)` is one pattern.
        let parts = weft::inspect::split_list(spec);
        for part in parts.into_iter().map(str::trim).filter(|p| !p.is_empty()) {
            match KernelPattern::parse(part) {
                Some(k) => out.kernel.push(k?),
                None => out.user.push(
                    Pattern::parse(part)
                        .map_err(anyhow::Error::from)
                        .map_err(|e| e.context(format!("bad function pattern `{part}`")))?,
                ),
            }
        }
    }
    if out.user.is_empty() && out.kernel.is_empty() {
        bail!("no function pattern given: name functions with -f NAME (globs like 'work_*' and MODULE:NAME work too; kernel:NAME and syscall:NAME for the kernel)");
    }
    Ok(out)
}

/// The kernel's capabilities when kernel patterns are given, said in one
/// line on standard error; an error (before the target is touched) when
/// this weft may not use BPF at all: the whole command refuses rather
/// than measure half of what was asked.
pub fn capabilities(patterns: &Patterns) -> Result<Option<Capabilities>> {
    if patterns.kernel.is_empty() {
        return Ok(None);
    }
    let caps = Capabilities::probe();
    if let Err(why) = &caps.privileged {
        return Err(weft::kernel::KernelError::NotPermitted(why.clone()).into());
    }
    eprintln!("weft: {}", caps.line());
    weft::kernel::check(&patterns.kernel, &caps)?;
    Ok(Some(caps))
}

/// Loads and attaches the kernel probes for `process` (attributed to its
/// instrumented user functions when weft's runtime is in it).
pub fn start(
    process: &Process,
    patterns: &Patterns,
    caps: Option<&Capabilities>,
) -> Result<Option<Session>> {
    let Some(caps) = caps else {
        return Ok(None);
    };
    let session = Session::start(
        process.pid(),
        &patterns.kernel,
        caps,
        process.runtime_tls_offset(),
    )?;
    let mut by: std::collections::BTreeMap<&str, usize> = Default::default();
    for p in session.probes() {
        *by.entry(p.mechanism.name()).or_default() += 1;
    }
    let text: Vec<String> = by.iter().map(|(m, n)| format!("{n} by {m}")).collect();
    eprintln!("weft: kernel probes attached: {}", text.join(", "));
    Ok(Some(session))
}

/// `attach` with kernel patterns only: no ptrace, no runtime, any process
/// (statically linked ones too); live reports every `interval`.
pub fn attach_kernel_only(
    pid: i32,
    patterns: &Patterns,
    caps: &Capabilities,
    duration: Option<std::time::Duration>,
    interval: Option<std::time::Duration>,
    sink: &mut crate::Sink,
) -> Result<()> {
    if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
        bail!("no process {pid}: give the PID of a running process");
    }
    let session = Session::start(pid, &patterns.kernel, caps, None)?;
    let started = std::time::Instant::now();
    eprintln!(
        "weft: attached pid={pid} threads={} functions={}",
        std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count()),
        session.probes().len()
    );
    let report = |session: &Session| -> Result<Report> {
        Ok(Report::of_kernel(
            pid,
            started.elapsed().as_nanos() as u64,
            &session.snapshot()?,
        ))
    };
    let mut next = interval.map(|i| std::time::Instant::now() + i);
    let mut failed = None;
    crate::cli_wait::wait(pid, duration, &mut || {
        if let (Some(at), Some(every)) = (next, interval) {
            if std::time::Instant::now() >= at && failed.is_none() {
                failed = report(&session).and_then(|r| sink.write(&r, false)).err();
                next = Some(at + every);
                if failed
                    .as_ref()
                    .is_some_and(|e| e.is::<crate::StdoutClosed>())
                {
                    crate::cli_wait::stop_now();
                }
            }
        }
        next.filter(|_| failed.is_none())
    });
    if let Some(e) = failed {
        return Err(e);
    }
    let last = report(&session)?;
    drop(session);
    sink.write(&last, true)
}

/// The report, with the kernel probes' figures when there are any.
pub fn report(process: &Process, session: Option<&Session>) -> Result<Report> {
    Ok(match session {
        Some(s) => process.report_with_kernel(s)?,
        None => process.report(),
    })
}

/// `weft list 'kernel:…'` / `'syscall:…'`: what can be probed, and how.
pub fn list(patterns: &[KernelPattern]) -> Result<String> {
    let caps = Capabilities::probe();
    let mut text = String::new();
    let functions = patterns
        .iter()
        .any(|p| !matches!(p, KernelPattern::Syscall(_)));
    let probeable = if functions {
        weft::kernel::probeable_functions(&caps)
    } else {
        Vec::new()
    };
    for pattern in patterns {
        let before = text.len();
        match pattern {
            KernelPattern::Syscall(glob) => {
                let how = match &caps.syscalls {
                    Ok(()) => "raw_syscalls tracepoints",
                    Err(_) => "unavailable",
                };
                for (name, number) in weft::kernel::syscalls_matching(glob) {
                    let _ = writeln!(text, "syscall {number} {name} {how}");
                }
            }
            KernelPattern::Function(glob) => {
                for (name, mechanism) in probeable.iter().filter(|(n, _)| glob.matches(n)) {
                    let _ = writeln!(text, "kernel - - {name} {}", mechanism.name());
                }
            }
            KernelPattern::Instruction { function, offset } => {
                if probeable.iter().any(|(n, _)| n == function) && caps.kprobes.is_ok() {
                    let _ = writeln!(text, "kernel - - {function}+{offset:#x} kprobe at offset");
                }
            }
        }
        if text.len() == before {
            bail!(
                "nothing matches `{pattern}` that this kernel lets weft probe ({})",
                caps.line()
            );
        }
    }
    Ok(text)
}

/// `weft doctor`: what this machine lets weft do.
pub fn doctor() -> String {
    let mut text = String::new();
    let caps = Capabilities::probe();
    let _ = writeln!(text, "kernel: {}", kernel_release());
    for c in caps.list() {
        let state = match &c.available {
            Ok(()) => "yes".to_string(),
            Err(why) => format!("no: {why}"),
        };
        let _ = writeln!(
            text,
            "{:<20} {:<4} for {}",
            c.name,
            if c.available.is_ok() { "yes" } else { "no" },
            c.used_for
        );
        if c.available.is_err() {
            let _ = writeln!(text, "{:<20} {state}", "");
        }
    }
    // What weft left loaded (nothing, unless a weft is running now).
    match weft::kernel::loaded_programs() {
        Ok(all) => {
            let ours: Vec<String> = all
                .into_iter()
                // Not the capability probes just tried above, which the
                // kernel may not have freed yet.
                .filter(|p| {
                    p.name.starts_with(weft::kernel::PROGRAM_PREFIX)
                        && p.name != weft::kernel::CAPABILITY_PROBE
                })
                .map(|p| p.name)
                .collect();
            let _ = writeln!(
                text,
                "{:<20} {} (BPF programs named {}*, held by running wefts)",
                "weft programs",
                ours.len(),
                weft::kernel::PROGRAM_PREFIX
            );
        }
        Err(e) => {
            let _ = writeln!(text, "{:<20} unknown ({e})", "weft programs");
        }
    }
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "absent".to_string());
    let _ = writeln!(
        text,
        "{:<20} {:<4} for user functions (yama ptrace_scope {scope})",
        "ptrace",
        if scope == "3" { "no" } else { "yes" }
    );
    text
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".to_string())
}
