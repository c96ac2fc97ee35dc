//! `weft doctor`: what this machine lets weft do.

use crate::output::to_stdout;
use anyhow::Result;
use std::fmt::Write as _;
use std::process::ExitCode;
use weft::kernel::Capabilities;

/// Runs `weft doctor`.
pub fn exec() -> Result<ExitCode> {
    to_stdout(doctor().as_bytes())?;
    Ok(ExitCode::SUCCESS)
}

/// `weft doctor`: what this machine lets weft do.
fn doctor() -> String {
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
