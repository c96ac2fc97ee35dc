//! The command line's kernel half: `kernel:` and `syscall:` patterns split
//! from the user ones, the kernel's capabilities, the kernel probes of a
//! session.

use anyhow::{bail, Result};
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

/// The report, with the kernel probes' figures when there are any.
pub fn report(process: &Process, session: Option<&Session>) -> Result<Report> {
    Ok(match session {
        Some(s) => process.report_with_kernel(s)?,
        None => process.report(),
    })
}
