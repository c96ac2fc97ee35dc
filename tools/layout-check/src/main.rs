//! `layout-check`: the source layout rules of weft's issue 30, checked over
//! every crate of the workspace.
//!
//! ```text
//! cargo run -q -p layout-check [WORKSPACE_ROOT]
//! ```
//!
//! For each crate (the root `Cargo.toml`'s `members`, and any `*/Cargo.toml`
//! or `*/*/Cargo.toml` with a `src/` folder, so that a new crate is covered
//! before it is listed) and each of its roots (`src/lib.rs`, `src/main.rs`,
//! `src/bin/*.rs`), it walks the module tree and reports, as `file:line:
//! message`, and exits with status 1 on:
//!
//! * **import cycles** between the crate's file modules. An edge is a path
//!   `crate::a::b::...`, `super::...`, `self::...` (or `child::...`) in a
//!   `use` item, a type, an expression or a macro's tokens, to the deepest
//!   file module it names. An edge from a module to one of its own
//!   ancestors is not counted: a child using what its parent declares or
//!   re-exports is Rust's facade convention (`lib.rs`/`mod.rs` re-export
//!   their children's items), and every module is below the root anyway.
//!   Each strongly connected component of the other edges is a cycle,
//!   printed with one place per link;
//! * **long files**: over 1,500 lines that are not test code (items under
//!   `#[cfg(test)]`, including a `#[cfg(test)] mod tests;` file, are left
//!   out);
//! * **long functions**: a `fn` (free, in an `impl`, or a trait's default)
//!   outside `#[cfg(test)]` whose body, `{` to `}`, spans over 150 lines.
//!
//! Only `src/` is checked: integration tests, examples and benches are not.

#![forbid(unsafe_code)]

mod graph;
mod modules;
mod scan;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Non-test lines a source file may have.
const MAX_FILE_LINES: usize = 1_500;
/// Lines a function's body may span.
const MAX_FN_LINES: usize = 150;

/// A workspace crate: its name and folder.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Crate {
    name: String,
    dir: PathBuf,
}

fn main() -> ExitCode {
    let root = match std::env::args_os().nth(1) {
        Some(root) => PathBuf::from(root),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."),
    };
    let crates = match discover(&root) {
        Ok(crates) => crates,
        Err(e) => {
            eprintln!("layout-check: {}: {e}", root.display());
            return ExitCode::from(2);
        }
    };
    let read = |p: &Path| fs::read_to_string(p);
    let mut findings = Vec::new();
    for c in &crates {
        for src in roots(&c.dir.join("src")) {
            let tree = modules::load(&src, &read);
            for note in &tree.notes {
                eprintln!("layout-check: note: {}", shorten(note, &root));
            }
            findings.extend(check(&c.name, &tree));
        }
    }
    // A file in two trees (shared by lib.rs and main.rs) is reported once.
    findings.sort();
    findings.dedup();
    for f in &findings {
        println!("{}", shorten(f, &root));
    }
    if findings.is_empty() {
        eprintln!("layout-check: {} crates: no import cycle, no file over {MAX_FILE_LINES} lines, no function over {MAX_FN_LINES} lines", crates.len());
        ExitCode::SUCCESS
    } else {
        eprintln!("layout-check: {} findings", findings.len());
        ExitCode::FAILURE
    }
}

/// Paths relative to the workspace root, for short lines.
fn shorten(line: &str, root: &Path) -> String {
    let prefix = format!("{}/", root.display());
    line.replace(&prefix, "")
}

/// The crates of the workspace at `root`, sorted.
fn discover(root: &Path) -> std::io::Result<Vec<Crate>> {
    let manifest = fs::read_to_string(root.join("Cargo.toml"))?;
    let mut dirs: Vec<PathBuf> = members(&manifest).iter().map(|m| root.join(m)).collect();
    for entry in fs::read_dir(root)? {
        let dir = entry?.path();
        let hidden = dir
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.') || n == "target");
        if !dir.is_dir() || hidden {
            continue;
        }
        dirs.push(dir.clone());
        for sub in fs::read_dir(&dir)?.flatten() {
            dirs.push(sub.path());
        }
    }
    let mut crates: Vec<Crate> = dirs
        .into_iter()
        .filter(|d| d.join("src").is_dir())
        .filter_map(|dir| {
            let manifest = fs::read_to_string(dir.join("Cargo.toml")).ok()?;
            let name = package_name(&manifest)?;
            let dir = dir.canonicalize().ok()?;
            let dir = dir
                .strip_prefix(root.canonicalize().ok()?)
                .map(|d| root.join(d))
                .unwrap_or(dir);
            Some(Crate { name, dir })
        })
        .collect();
    crates.sort();
    crates.dedup();
    Ok(crates)
}

/// The `members = [...]` of a workspace manifest (a small reading of TOML:
/// the quoted strings between `members = [` and `]`).
fn members(manifest: &str) -> Vec<String> {
    let Some(start) = manifest
        .lines()
        .position(|l| l.trim_start().starts_with("members"))
    else {
        return Vec::new();
    };
    let text: String = manifest.lines().skip(start).collect::<Vec<_>>().join("\n");
    let Some(open) = text.find('[') else {
        return Vec::new();
    };
    let close = text.find(']').unwrap_or(text.len());
    text[open + 1..close.max(open + 1)]
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty() && !m.starts_with('#'))
        .collect()
}

/// The `name` of a manifest's `[package]`.
fn package_name(manifest: &str) -> Option<String> {
    let package = manifest.split("[package]").nth(1)?;
    package.lines().find_map(|l| {
        let (key, value) = l.split_once('=')?;
        (key.trim() == "name").then(|| value.trim().trim_matches('"').to_string())
    })
}

/// A crate's root files: `lib.rs`, `main.rs`, `bin/*.rs`, `bin/*/main.rs`.
fn roots(src: &Path) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = ["lib.rs", "main.rs"]
        .iter()
        .map(|f| src.join(f))
        .filter(|p| p.is_file())
        .collect();
    if let Ok(bins) = fs::read_dir(src.join("bin")) {
        let mut bins: Vec<PathBuf> = bins
            .flatten()
            .map(|e| e.path())
            .map(|p| if p.is_dir() { p.join("main.rs") } else { p })
            .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "rs"))
            .collect();
        bins.sort();
        roots.extend(bins);
    }
    roots
}

/// The findings in one module tree of crate `name`, one line each.
fn check(name: &str, tree: &modules::Tree) -> Vec<String> {
    let mut findings = Vec::new();
    for file in &tree.files {
        let path = file.path.display();
        let lines = file.scan.non_test_lines();
        if lines > MAX_FILE_LINES {
            findings.push(format!(
                "{path}:1: file has {lines} non-test lines (limit {MAX_FILE_LINES})"
            ));
        }
        for f in &file.scan.fns {
            if f.body_lines > MAX_FN_LINES {
                findings.push(format!(
                    "{path}:{}: fn `{}` has a body of {} lines (limit {MAX_FN_LINES})",
                    f.line, f.name, f.body_lines
                ));
            }
        }
    }
    let edges = graph::edges(tree);
    let module_name = |i: usize| match tree.files[i].module.join("::") {
        m if m.is_empty() => "crate".to_string(),
        m => m,
    };
    for mut cycle in graph::cycles(tree.files.len(), &edges) {
        cycle.sort_by_key(|&i| module_name(i));
        let names: Vec<String> = cycle.iter().map(|&i| module_name(i)).collect();
        let mut text = format!(
            "{}:1: import cycle in crate `{name}` between modules {}",
            tree.files[cycle[0]].path.display(),
            names.join(", ")
        );
        for ((from, to), edge) in &edges {
            if cycle.contains(from) && cycle.contains(to) {
                text.push_str(&format!(
                    "\n    {}:{}: {} -> {} (`{}`)",
                    tree.files[*from].path.display(),
                    edge.line,
                    module_name(*from),
                    module_name(*to),
                    edge.path
                ));
            }
        }
        findings.push(text);
    }
    findings
}

#[cfg(test)]
mod tests;
