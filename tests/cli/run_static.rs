//! `weft run` of a statically linked program (issue #12 item 5): refused
//! with a clear error, and the program never reaches `main` nor is left
//! running (it used to be detached at its entry point and run on,
//! orphaned, after weft had already reported the error).

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use support::*;

fn static_marker() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("weft-targets-run_static");
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("static_marker");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/targets/static_marker.c");
        let out = Command::new("gcc")
            .args(["-O2", "-static", "-o"])
            .arg(&exe)
            .arg(&src)
            .output()
            .expect("run gcc");
        assert!(
            out.status.success(),
            "cannot link a static target (libc.a comes with libc6-dev):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        exe
    })
}

/// Processes whose command line mentions `needle` (the test's own marker
/// path, so only processes this test started can match).
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(needle) {
            found.push(format!(
                "{name}: {}",
                String::from_utf8_lossy(&cmdline).replace('\0', " ")
            ));
        }
    }
    found
}

/// After a refused run: no `main` ran (no marker, nothing printed) and no
/// process of the program is left.
fn check_nothing_ran(ctx: &Ctx, weft: &Proc, marker: &Path) {
    ctx.check(!marker.exists(), || {
        format!("{} exists: the program's main ran", marker.display())
    });
    ctx.check(!weft.stdout_text().contains("main ran"), || {
        "the program printed from main".into()
    });
    let left = processes_mentioning(marker.to_str().unwrap());
    ctx.check(left.is_empty(), || {
        format!("processes left running: {left:?}")
    });
}

#[test]
fn run_refuses_a_static_program_before_starting_it() {
    let ctx = Ctx::new("run_refuses_a_static_program_before_starting_it");
    let marker = scratch_dir("run_static_direct").join("main-ran");
    let mut weft = ctx.weft(&[
        "run",
        "-f",
        "main",
        "--",
        static_marker().to_str().unwrap(),
        marker.to_str().unwrap(),
    ]);
    let (error, _) = expect_weft_error(&mut weft);
    check_nothing_ran(&ctx, &weft, &marker);
    for want in ["statically linked", "nothing was started"] {
        ctx.check(error.contains(want), || {
            format!("the error {error:?} does not say {want:?}")
        });
    }
}

/// A script whose interpreter is static passes the check before exec (the
/// file is no ELF): it is caught at the entry point, killed and reaped.
#[test]
fn run_kills_a_static_interpreter_at_its_entry_point() {
    let ctx = Ctx::new("run_kills_a_static_interpreter_at_its_entry_point");
    let dir = scratch_dir("run_static_script");
    let marker = dir.join("main-ran");
    let script = dir.join("script");
    std::fs::write(&script, format!("#!{}\n", static_marker().display())).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut weft = ctx.weft(&[
        "run",
        "-f",
        "main",
        "--",
        script.to_str().unwrap(),
        marker.to_str().unwrap(),
    ]);
    let (error, _) = expect_weft_error(&mut weft);
    ctx.check(error.contains("statically linked"), || {
        format!("the error {error:?} does not say `statically linked`")
    });
    let pid: u32 = error
        .split("process ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| ctx.fail(format!("no `process PID` in {error:?}")));
    ctx.check(!Path::new(&format!("/proc/{pid}")).exists(), || {
        format!("process {pid} is still there (running or unreaped)")
    });
    check_nothing_ran(&ctx, &weft, &marker);
}
