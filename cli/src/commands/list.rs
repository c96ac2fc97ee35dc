//! `weft list`: the functions of a running process (or what the kernel
//! lets weft probe), one per line.

use crate::kernel;
use crate::output::to_stdout;
use anyhow::{bail, Result};
use std::fmt::Write as _;
use std::process::ExitCode;
use weft::kernel::{Capabilities, KernelPattern};
use weft::Pattern;

// The arguments of `Command::List` (their help is the variant's, in
// main.rs).
#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// The process.
    #[arg(short = 'p', long = "pid")]
    pid: i32,
    /// Add a fifth column, FILE:LINE of each function's first line
    /// from DWARF (the module's or its debug file's), `-` if unknown.
    #[arg(long)]
    lines: bool,
    /// Only functions matching one of these patterns (as for `run`;
    /// each function is listed once). A pattern that matches nothing
    /// is named on standard error and makes the status 1.
    #[arg(value_name = "PATTERN")]
    patterns: Vec<String>,
}

/// Runs `weft list`.
pub fn exec(args: ListArgs) -> Result<ExitCode> {
    list(args.pid, &args.patterns, args.lines)
}

fn list(pid: i32, specs: &[String], lines: bool) -> Result<ExitCode> {
    let patterns = if specs.is_empty() {
        vec![Pattern::parse("*")?]
    } else {
        let split = kernel::split(specs)?;
        if !split.kernel.is_empty() {
            // Kernel code is the same for every process: listed first, and
            // alone when no user pattern is given.
            to_stdout(list_kernel(&split.kernel)?.as_bytes())?;
            if split.user.is_empty() {
                return Ok(ExitCode::SUCCESS);
            }
        }
        split.user
    };
    let mut image = weft::inspect::ProcessImage::open(pid)?;
    // One search for all: a function several patterns match is found once.
    let mut functions = image.find_functions(&patterns)?;
    let mut unmatched = Vec::new();
    for pattern in &patterns {
        let matched = functions.iter().any(|f| {
            // Every name the module answers to (soname, `exe`, the name
            // it was started as), as the search itself matched them.
            image
                .module_of(f.address)
                .is_some_and(|m| pattern.could_match_module(m))
                && (pattern.matches_names(&f.name, image.source_names_of(f).as_ref())
                    || f.aliases.iter().any(|name| pattern.matches_function(name)))
        });
        if !matched {
            unmatched.push(weft::Error::NoMatch {
                pattern: pattern.to_string(),
                suggestions: image.suggest(pattern)?,
                still_loading: image.still_loading(),
            });
        }
    }
    if unmatched.len() == patterns.len() {
        // Nothing to list: an error, as for `attach`.
        return Err(unmatched.remove(0).into());
    }
    functions.sort_by(|a, b| (a.module.as_str(), a.address).cmp(&(b.module.as_str(), b.address)));
    let mut text = String::new();
    for f in functions {
        let name = listed_name(&f.name, image.source_names_of(&f));
        // An IFUNC is listed at the implementation the process uses (as
        // `attach` instruments it) when a GOT slot already holds it; else
        // the implementation is chosen at the first call and unknown
        // without stopping the process: no address rather than the
        // resolver's.
        match image.resolved_address(&f) {
            Some(address) if address == f.address => {
                let _ = writeln!(text, "{} {:#x} {} {name}", f.module, address, f.size);
            }
            Some(address) => {
                let size = match image.function_at(address) {
                    Ok(Some(g)) if g.address == address => g.size,
                    _ => 0,
                };
                let _ = writeln!(text, "{} {:#x} {size} {name}", f.module, address);
            }
            None => {
                let _ = writeln!(
                    text,
                    "{} - - {name} (ifunc, resolved at first call)",
                    f.module
                );
            }
        }
        if lines {
            let at = match image.source_line(f.address) {
                Ok(Some(l)) => l.to_string(),
                _ => "-".to_string(),
            };
            // The line just written ends in '\n': the column goes before.
            text.pop();
            let _ = writeln!(text, " {at}");
        }
    }
    to_stdout(text.as_bytes())?;
    // What the other patterns matched is listed; the ones that matched
    // nothing are named, and the status says something was missing.
    for e in &unmatched {
        eprintln!("weft: {e}");
    }
    Ok(if unmatched.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `NAME` as `list` prints it: the demangled or source name, and the
/// linkage name after it in parentheses when that differs
/// (`parse_field (parse_field.isra.0)`).
fn listed_name(name: &str, source: Option<weft::inspect::names::SourceNames>) -> String {
    match source {
        Some(s) if s.full != name => format!("{} ({name})", s.full),
        _ => name.to_owned(),
    }
}

/// `weft list 'kernel:…'` / `'syscall:…'`: what can be probed, and how.
fn list_kernel(patterns: &[KernelPattern]) -> Result<String> {
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
