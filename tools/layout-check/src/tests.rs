//! The checks on small crates held in memory.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use super::*;

/// Loads the tree of a crate whose files are `(path, source)` pairs, the
/// root `src/lib.rs`, and returns its findings.
fn findings(files: &[(&str, &str)]) -> Vec<String> {
    let table: HashMap<PathBuf, String> = files
        .iter()
        .map(|(p, s)| (PathBuf::from(p), s.to_string()))
        .collect();
    let read = move |p: &Path| {
        table
            .get(p)
            .cloned()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    };
    let tree = modules::load(Path::new("src/lib.rs"), &read);
    assert!(tree.notes.is_empty(), "{:?}", tree.notes);
    check("fixture", &tree)
}

fn long_fn(name: &str, body_lines: usize) -> String {
    let mut s = format!("pub fn {name}() {{\n");
    for i in 0..body_lines - 2 {
        s.push_str(&format!("    let _x{i} = {i};\n"));
    }
    s.push_str("}\n");
    s
}

#[test]
fn a_two_module_cycle_is_found() {
    let found = findings(&[
        ("src/lib.rs", "mod a;\nmod b;\n"),
        ("src/a.rs", "use crate::b::B;\npub struct A;\n"),
        (
            "src/b.rs",
            "pub struct B;\n\nfn f() -> super::a::A { super::a::A }\n",
        ),
    ]);
    assert_eq!(found.len(), 1, "{found:?}");
    let cycle = &found[0];
    assert!(cycle.contains("between modules a, b"), "{cycle}");
    assert!(
        cycle.contains("src/a.rs:1: a -> b (`crate::b::B`)"),
        "{cycle}"
    );
    assert!(
        cycle.contains("src/b.rs:3: b -> a (`super::a::A`)"),
        "{cycle}"
    );
}

#[test]
fn a_cycle_through_nested_files_and_a_macro_is_found() {
    let found = findings(&[
        ("src/lib.rs", "mod outer;\nmod c;\n"),
        ("src/outer.rs", "pub mod inner;\n"),
        ("src/outer/inner/mod.rs", "pub fn g() { crate::c::h() }\n"),
        (
            "src/c.rs",
            "pub fn h() {}\nfn k() { assert!(crate::outer::inner::X == 0); }\n",
        ),
    ]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("between modules c, outer::inner"),
        "{found:?}"
    );
}

#[test]
fn an_edge_to_an_ancestor_is_ignored() {
    // The child uses its parent's and the root's items; the parent uses the
    // child: no cycle.
    let found = findings(&[
        (
            "src/lib.rs",
            "mod p;\npub use p::Thing;\npub const N: u8 = 1;\n",
        ),
        (
            "src/p.rs",
            "mod child;\npub struct Thing;\nfn f() { child::g() }\n",
        ),
        (
            "src/p/child.rs",
            "use super::Thing;\npub fn g() { let _ = crate::N; let _ = crate::p::Thing; }\n",
        ),
    ]);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn a_cfg_test_module_is_ignored() {
    let found = findings(&[
        ("src/lib.rs", "mod a;\nmod b;\n"),
        ("src/a.rs", "use crate::b::B;\npub struct A;\n"),
        (
            "src/b.rs",
            &format!(
                "pub struct B;\n#[cfg(test)]\nmod tests {{\n    use crate::a::A;\n{}}}\n#[cfg(test)]\nmod more;\n",
                long_fn("big", 200)
            ),
        ),
    ]);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn a_151_line_function_is_reported_and_a_150_line_one_is_not() {
    let source = format!(
        "pub struct S;\nimpl S {{\n{}}}\n{}",
        long_fn("ok", 150),
        long_fn("too_long", 151)
    );
    let found = findings(&[("src/lib.rs", &source)]);
    assert_eq!(
        found,
        ["src/lib.rs:154: fn `too_long` has a body of 151 lines (limit 150)"]
    );
}

#[test]
fn a_long_function_in_an_impl_or_a_trait_default_is_reported() {
    let long = long_fn("m", 160);
    let default = long.replacen("pub fn", "fn", 1);
    let source = format!("pub struct S;\nimpl S {{\n{long}}}\npub trait T {{\n{default}}}\n");
    let found = findings(&[("src/lib.rs", &source)]);
    assert_eq!(found.len(), 2, "{found:?}");
}

#[test]
fn test_lines_do_not_count_towards_a_file_length() {
    let filler = "// a line\n".repeat(1_400);
    let tests = format!(
        "#[cfg(test)]\nmod tests {{\n{}}}\n",
        "    // a test line\n".repeat(300)
    );
    let ok = format!("{filler}{tests}");
    assert!(findings(&[("src/lib.rs", &ok)]).is_empty());
    let too_long = format!("{filler}{}{tests}", "// more\n".repeat(101));
    let found = findings(&[("src/lib.rs", &too_long)]);
    assert_eq!(
        found,
        ["src/lib.rs:1: file has 1501 non-test lines (limit 1500)"]
    );
}

#[test]
fn a_path_attribute_and_an_inline_module_are_followed() {
    let found = findings(&[
        (
            "src/lib.rs",
            "#[path = \"elsewhere.rs\"]\nmod a;\nmod wrap { pub mod b; }\n",
        ),
        ("src/elsewhere.rs", "pub fn f() { crate::wrap::b::g() }\n"),
        ("src/wrap/b.rs", "pub fn g() { crate::a::f() }\n"),
    ]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("between modules a, wrap::b"), "{found:?}");
}

#[test]
fn workspace_members_are_read() {
    let manifest = "[workspace]\nmembers = [\"injector\", \"rt\",\n  \"tools/layout-check\"]\ndefault-members = [\"rt\"]\n";
    assert_eq!(members(manifest), ["injector", "rt", "tools/layout-check"]);
    assert_eq!(
        package_name("[package]\nname = \"weft-rt\"\nversion = \"0.1.0\"\n").as_deref(),
        Some("weft-rt")
    );
}
