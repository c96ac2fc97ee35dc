//! Module names as users type them (issue #13): a pattern's `MODULE:` part
//! matches a library's soname, the executable's `exe` and the name it was
//! started as through a symlink, and a misspelled module gets suggestions.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use support::*;

const LIB_C: &str = "int foo(int x) { return x * 3; }\n";

const MAIN_C: &str = r#"#include <stdio.h>
#include <unistd.h>
int foo(int);
__attribute__((noinline)) int work_a(int x) { return foo(x) + 1; }
__attribute__((noinline)) int work_b(int x) { return work_a(x) * 2; }
int main(void) {
    volatile int r = work_b(2);
    (void)r;
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) {}
    return 0;
}
"#;

fn gcc(dir: &Path, args: &[&str]) {
    let out = Command::new("gcc")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("gcc is installed");
    assert!(
        out.status.success(),
        "gcc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `libfoo.so.1.2.3` with soname `libfoo.so.1` (reached through the
/// `libfoo.so.1` symlink, as installed libraries are), `realprog` linked
/// against it, and `mytool`, a symlink to `realprog`. Returns `mytool`.
fn build(dir: &Path) -> PathBuf {
    std::fs::write(dir.join("foo.c"), LIB_C).unwrap();
    std::fs::write(dir.join("main.c"), MAIN_C).unwrap();
    gcc(
        dir,
        &[
            "-O1",
            "-shared",
            "-fPIC",
            "-Wl,-soname,libfoo.so.1",
            "-o",
            "libfoo.so.1.2.3",
            "foo.c",
        ],
    );
    std::os::unix::fs::symlink("libfoo.so.1.2.3", dir.join("libfoo.so.1")).unwrap();
    std::os::unix::fs::symlink("libfoo.so.1.2.3", dir.join("libfoo.so")).unwrap();
    gcc(
        dir,
        &[
            "-O1",
            "-o",
            "realprog",
            "main.c",
            "-L.",
            "-lfoo",
            "-Wl,-rpath,$ORIGIN",
        ],
    );
    let tool = dir.join("mytool");
    std::os::unix::fs::symlink("realprog", &tool).unwrap();
    tool
}

/// `weft list -p PID PATTERN` lines as (module, name).
fn list(ctx: &Ctx, pid: u32, pattern: &str) -> Vec<(String, String)> {
    let p = pid.to_string();
    let mut w = ctx.weft(&["list", "-p", &p, pattern]);
    w.wait_code(0);
    w.stdout_text()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0].to_string(), f[3].to_string())
        })
        .collect()
}

#[test]
fn list_by_soname_exe_and_started_name() {
    let ctx = Ctx::new("list_by_soname_exe_and_started_name");
    let dir = scratch_dir("list_by_soname_exe_and_started_name");
    let tool = build(&dir);
    let mut t = ctx.target(&tool, &[]);
    let (pid, _) = wait_ready(&mut t);

    let exe = |name: &str| ("realprog".to_string(), name.to_string());
    let lib = |name: &str| ("libfoo.so.1.2.3".to_string(), name.to_string());
    for (pattern, want) in [
        ("exe:work_*", vec![exe("work_a"), exe("work_b")]),
        ("mytool:work_a", vec![exe("work_a")]),
        ("realprog:work_a", vec![exe("work_a")]),
        ("libfoo.so.1:foo", vec![lib("foo")]),
        ("libfoo.so.1.2.3:foo", vec![lib("foo")]),
        ("libfoo:foo", vec![lib("foo")]),
    ] {
        let got = list(&ctx, pid, pattern);
        ctx.check(got == want, || format!("{pattern}: {got:?}, want {want:?}"));
    }

    // Misspelled modules: an error that suggests the near module names.
    let p = pid.to_string();
    for (pattern, suggestion) in [
        ("mytol:work_a", "`mytool:work_a`"),
        ("libfoo.so.2:foo", "`libfoo.so.1:foo`"),
        ("exx:work_a", "`exe:work_a`"),
    ] {
        let mut w = ctx.weft(&["list", "-p", &p, pattern]);
        let st = w.wait_exit();
        let err = w.stderr_text();
        ctx.check(
            !st.success() && err.contains("did you mean") && err.contains(suggestion),
            || format!("{pattern}: {st:?}, stderr {err:?}, want {suggestion}"),
        );
    }
    t.close_stdin();
    t.wait_code(0);
}
