//! Debug information where distributions put it (issue #13): a stripped
//! program and library get their names and source lines back from a
//! separate debug file found by build-id or by `.gnu_debuglink`, or from
//! MiniDebugInfo (`.gnu_debugdata`); a debug file of another build is not
//! used; a stripped module without one is reported once.
//!
//! Every weft here runs with `WEFT_DEBUG_DIRS` set to a directory of the
//! test (or to nothing), so that what is installed in /usr/lib/debug plays
//! no part.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use support::*;

/// Calls each worker thread makes to `dbg_work_a` (and to
/// `dbg_lib_hidden`; `dbg_work_b` gets twice as many).
const N: u64 = 1000;
/// Worker threads of the target.
const THREADS: u64 = 2;

const EXE: &str = "dbgprog";
const LIB: &str = "libdbgwork.so";
/// The functions under test: (module, name, calls in all, calls per
/// worker thread). None of them is in `.dynsym`.
const FUNCTIONS: [(&str, &str, u64); 3] = [
    ("exe", "dbg_work_a", 1),
    ("exe", "dbg_work_b", 2),
    (LIB, "dbg_lib_hidden", 1),
];

fn src(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/targets")
        .join(name)
}

/// Runs `program args` in `dir`; panics with its output if it fails.
fn run(dir: &Path, program: &str, args: &[&str]) {
    let out = Command::new(program)
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Output of `program args`, which must succeed.
fn output(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(out.status.success(), "{program} {args:?} failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Builds the target and its library with `-g` into `dir` (fresh), with
/// extra compiler flags. Returns the program's path.
fn build(dir: &Path, cflags: &[&str]) -> PathBuf {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let lib_src = src("debugfiles_lib.c");
    let exe_src = src("debugfiles.c");
    let mut args = vec!["-O1", "-g", "-Wl,--build-id"];
    args.extend_from_slice(cflags);
    let mut lib_args = args.clone();
    lib_args.extend(["-shared", "-fPIC", "-o", LIB, lib_src.to_str().unwrap()]);
    run(dir, "gcc", &lib_args);
    let mut exe_args = args;
    exe_args.extend([
        "-pthread",
        "-o",
        EXE,
        exe_src.to_str().unwrap(),
        "-L.",
        "-ldbgwork",
        "-Wl,-rpath,$ORIGIN",
    ]);
    run(dir, "gcc", &exe_args);
    dir.join(EXE)
}

/// The hex build-id of an ELF file (`readelf -n`).
fn build_id(file: &Path) -> String {
    let notes = output("readelf", &["-n", file.to_str().unwrap()]);
    notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("{} has no build-id", file.display()))
        .trim()
        .to_string()
}

/// `objcopy --only-keep-debug` of `file` into `debug`, its debug sections
/// compressed with `compress` (`zlib`, `zstd`) if given.
fn keep_debug(file: &Path, debug: &Path, compress: Option<&str>) {
    let flag = compress.map(|c| format!("--compress-debug-sections={c}"));
    let mut args = vec!["--only-keep-debug"];
    args.extend(flag.as_deref());
    args.extend([file.to_str().unwrap(), debug.to_str().unwrap()]);
    run(Path::new("."), "objcopy", &args);
}

/// Strips everything from `file`, adding a `.gnu_debuglink` to `link`
/// (its name and CRC32) if given.
fn strip(file: &Path, link: Option<&Path>) {
    let flag = link.map(|l| format!("--add-gnu-debuglink={}", l.display()));
    let mut args = vec!["--strip-all"];
    args.extend(flag.as_deref());
    args.push(file.to_str().unwrap());
    run(Path::new("."), "objcopy", &args);
}

/// How `section` of `file` is compressed, as `readelf -t` says (`ZLIB`,
/// `ZSTD`), or None.
fn compression(file: &Path, section: &str) -> Option<String> {
    // Per section: `[Nr] NAME`, its type, addresses and flags lines, and
    // for a compressed one `ZLIB, SIZE, ALIGN` after the flags.
    let text = output("readelf", &["-W", "-t", file.to_str().unwrap()]);
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.split_whitespace().last() == Some(section))?;
    let after = &lines[at + 1..];
    let end = after
        .iter()
        .position(|l| l.trim_start().starts_with('[') && !l.contains("]:"))
        .unwrap_or(after.len());
    let flags = after[..end].iter().position(|l| l.contains("COMPRESSED"))?;
    after
        .get(flags + 1)
        .and_then(|k| k.trim().split(',').next())
        .map(str::to_string)
}

/// Checks that objcopy compressed `.debug_info` of `debug` (the units
/// the line tables are found through) and, for the program (large enough
/// for it), `.debug_line`, with `kind`: if it had not, the test would not
/// show that compressed sections are read.
fn assert_compressed(debug: &Path, kind: &str, with_lines: bool) {
    let sections: &[&str] = if with_lines {
        &[".debug_info", ".debug_line"]
    } else {
        &[".debug_info"]
    };
    for section in sections {
        assert_eq!(
            compression(debug, section).as_deref(),
            Some(kind),
            "{}: {section} is not compressed",
            debug.display()
        );
    }
}

/// Whether this objcopy can write zstd-compressed sections (binutils
/// built with libzstd); says so in the test output when it cannot.
fn objcopy_has_zstd(dir: &Path) -> bool {
    let probe = dir.join("zstd-probe.debug");
    let out = Command::new("objcopy")
        .args(["--only-keep-debug", "--compress-debug-sections=zstd"])
        .arg(dir.join(EXE))
        .arg(&probe)
        .output()
        .expect("objcopy is installed");
    let ok = out.status.success() && compression(&probe, ".debug_info").as_deref() == Some("ZSTD");
    if !ok {
        println!(
            "SKIPPED the zstd part: this objcopy cannot compress with zstd ({})",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    ok
}

/// `weft ARGS`, its debug directories `WEFT_DEBUG_DIRS=dirs`.
fn weft(ctx: &Ctx, dirs: &str, args: &[&str]) -> Proc {
    let mut c = Command::new(weft_bin());
    c.args(args).env("WEFT_DEBUG_DIRS", dirs);
    ctx.spawn(&format!("weft {}", args.join(" ")), c, false)
}

/// The line of `source` on which function `name` is defined.
fn line_of(source: &str, name: &str) -> u64 {
    let text = std::fs::read_to_string(src(source)).unwrap();
    let at = text
        .lines()
        .position(|l| l.contains(&format!(" {name}(int x) {{")))
        .unwrap_or_else(|| panic!("{name} is not defined in {source}"));
    at as u64 + 1
}

/// The patterns selecting [`FUNCTIONS`].
fn patterns() -> Vec<String> {
    FUNCTIONS
        .iter()
        .map(|(m, f, _)| format!("{m}:{f}"))
        .collect()
}

/// `weft run` of the stripped target: every function is found by its real
/// name, and counted exactly, per thread and in all.
fn check_run(ctx: &Ctx, exe: &Path, dirs: &str, extra: &[&str]) {
    let report_file = exe.with_file_name("report.json");
    let pats = patterns().join(",");
    let n = N.to_string();
    let mut args = vec![
        "run",
        "-m",
        "calls",
        "--format",
        "json",
        "-o",
        report_file.to_str().unwrap(),
        "-f",
        &pats,
    ];
    args.extend_from_slice(extra);
    args.extend(["--", exe.to_str().unwrap(), "run", &n]);
    let mut w = weft(ctx, dirs, &args);
    w.wait_code(0);
    let err = w.stderr_text();
    ctx.check(!err.contains("no debug file"), || {
        format!("weft said a debug file is missing: {err}")
    });
    let report = parse_report(ctx, &std::fs::read_to_string(&report_file).unwrap());
    for (_, name, per_call) in FUNCTIONS {
        let f = report
            .function(name)
            .unwrap_or_else(|| ctx.fail(format!("{name} is not in the report")));
        ctx.check(f.calls == THREADS * N * per_call, || {
            format!("{name}: {} calls, want {}", f.calls, THREADS * N * per_call)
        });
        let busy: Vec<u64> = report
            .threads
            .iter()
            .filter_map(|t| t.functions.get(name).map(|c| c.calls))
            .collect();
        ctx.check(busy == vec![N * per_call; THREADS as usize], || {
            format!("{name}: calls per thread {busy:?}, want {N} × {per_call} in each worker")
        });
    }
}

/// One line of `weft list --lines`: (module, size, name, file:line).
type Listed = (String, u64, String, String);

/// Starts the stripped target and lists the functions under test with
/// their source lines.
fn list_lines(ctx: &Ctx, exe: &Path, dirs: &str, extra: &[&str]) -> Vec<Listed> {
    let mut t = ctx.target(exe, &["wait"]);
    t.expect_stdout("ready", |l| l.starts_with("ready pid="));
    let pid = t.pid_str();
    let mut args = vec!["list", "-p", &pid, "--lines"];
    args.extend_from_slice(extra);
    let pats = patterns();
    args.extend(pats.iter().map(String::as_str));
    let mut w = weft(ctx, dirs, &args);
    w.wait_code(0);
    t.close_stdin();
    t.wait_code(0);
    w.stdout_text()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            ctx.check(f.len() == 5, || format!("not 5 columns: {l:?}"));
            (
                f[0].to_string(),
                f[2].parse().unwrap_or(0),
                f[3].to_string(),
                f[4].to_string(),
            )
        })
        .collect()
}

/// Every function under test is listed under its module, with a size and
/// (when `lines`) the line of its definition in its source file.
fn check_list(ctx: &Ctx, listed: &[Listed], lines: bool) {
    ctx.check(listed.len() == FUNCTIONS.len(), || {
        format!("listed {listed:?}")
    });
    for (module, name, _) in FUNCTIONS {
        let module = if module == "exe" { EXE } else { module };
        let source = if module == EXE {
            "debugfiles.c"
        } else {
            "debugfiles_lib.c"
        };
        let Some((_, size, _, at)) = listed.iter().find(|l| l.0 == module && l.2 == name) else {
            ctx.fail(format!("{module}:{name} not listed: {listed:?}"))
        };
        ctx.check(*size > 0, || format!("{name}: size 0"));
        let want = if lines {
            format!("/{source}:{}", line_of(source, name))
        } else {
            "-".to_string()
        };
        ctx.check(at.ends_with(&want), || {
            format!("{name} at {at}, want …{want}")
        });
    }
}

/// Found by build-id in a debug directory; sections compressed with zlib.
#[test]
fn found_by_build_id_zlib_compressed() {
    let ctx = Ctx::new("found_by_build_id_zlib_compressed");
    let dir = scratch_dir("found_by_build_id_zlib_compressed");
    let exe = build(&dir.join("bin"), &[]);
    let debug_dir = dir.join("debug");
    for file in [exe.clone(), exe.with_file_name(LIB)] {
        let id = build_id(&file);
        let place = debug_dir
            .join(".build-id")
            .join(&id[..2])
            .join(format!("{}.debug", &id[2..]));
        std::fs::create_dir_all(place.parent().unwrap()).unwrap();
        keep_debug(&file, &place, Some("zlib"));
        assert_compressed(&place, "ZLIB", file == exe);
        // No debug link: only the build-id leads to the debug file.
        strip(&file, None);
    }
    let dirs = debug_dir.to_str().unwrap();
    check_list(&ctx, &list_lines(&ctx, &exe, dirs, &[]), true);
    check_run(&ctx, &exe, dirs, &[]);
}

/// Found by `.gnu_debuglink`: the program's next to it, the library's in
/// `.debug/`; sections compressed with zstd.
#[test]
fn found_by_debuglink_zstd_compressed() {
    let ctx = Ctx::new("found_by_debuglink_zstd_compressed");
    let dir = scratch_dir("found_by_debuglink_zstd_compressed");
    let exe = build(&dir.join("bin"), &[]);
    let compress = objcopy_has_zstd(&dir.join("bin")).then_some("zstd");
    let lib = exe.with_file_name(LIB);
    let dot_debug = dir.join("bin/.debug");
    std::fs::create_dir_all(&dot_debug).unwrap();
    for (file, debug) in [
        (&exe, exe.with_file_name(format!("{EXE}.debug"))),
        (&lib, dot_debug.join(format!("{LIB}.debug"))),
    ] {
        keep_debug(file, &debug, compress);
        if let Some(c) = compress {
            assert_compressed(&debug, &c.to_uppercase(), file == &exe);
        }
        strip(file, Some(&debug));
    }
    // An empty debug directory: the build-id finds nothing.
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let dirs = empty.to_str().unwrap();
    check_list(&ctx, &list_lines(&ctx, &exe, dirs, &[]), true);
    check_run(&ctx, &exe, dirs, &[]);
}

/// Found by `.gnu_debuglink` under `--debug-dir DIR`, as
/// `DIR/<the binary's directory>/<name>`, with `WEFT_DEBUG_DIRS` empty.
#[test]
fn found_by_debuglink_under_debug_dir_option() {
    let ctx = Ctx::new("found_by_debuglink_under_debug_dir_option");
    let dir = scratch_dir("found_by_debuglink_under_debug_dir_option");
    let exe = build(&dir.join("bin"), &[]);
    let root = dir.join("root");
    let under = root.join(exe.parent().unwrap().strip_prefix("/").unwrap());
    std::fs::create_dir_all(&under).unwrap();
    for file in [exe.clone(), exe.with_file_name(LIB)] {
        let name = format!("{}.debug", file.file_name().unwrap().to_str().unwrap());
        // objcopy takes the CRC from the file as it is now, then it moves.
        let debug = file.with_file_name(&name);
        keep_debug(&file, &debug, None);
        strip(&file, Some(&debug));
        std::fs::rename(&debug, under.join(&name)).unwrap();
    }
    let listed = list_lines(&ctx, &exe, "", &["--debug-dir", root.to_str().unwrap()]);
    check_list(&ctx, &listed, true);
}

/// MiniDebugInfo, made as Fedora makes it: the `.symtab` of the functions
/// `.dynsym` lacks, xz-compressed into `.gnu_debugdata`. It has names and
/// sizes but no lines.
#[test]
fn found_as_mini_debug_info() {
    let ctx = Ctx::new("found_as_mini_debug_info");
    let dir = scratch_dir("found_as_mini_debug_info");
    let exe = build(&dir.join("bin"), &[]);
    for file in [exe.clone(), exe.with_file_name(LIB)] {
        let f = file.to_str().unwrap();
        let script = format!(
            r#"set -e
nm -D "{f}" --format=posix --defined-only | awk '{{ print $1 }}' | sort > dynsyms
nm "{f}" --format=posix --defined-only | awk '{{ if ($2 == "T" || $2 == "t" || $2 == "D") print $1 }}' | sort > funcsyms
comm -13 dynsyms funcsyms > keep_symbols
objcopy --only-keep-debug "{f}" debug
objcopy -S --remove-section .gdb_index --remove-section .comment --keep-symbols=keep_symbols debug mini_debuginfo
rm -f mini_debuginfo.xz
xz mini_debuginfo
objcopy --strip-all "{f}"
objcopy --add-section .gnu_debugdata=mini_debuginfo.xz "{f}"
"#
        );
        run(&dir, "sh", &["-c", &script]);
    }
    check_list(&ctx, &list_lines(&ctx, &exe, "", &[]), false);
    check_run(&ctx, &exe, "", &[]);
}

/// A debug file of another build is not used, whether found by build-id
/// (another build-id) or by debug link (another CRC): weft names the file
/// it ignored and why, and falls back to `.eh_frame`.
#[test]
fn mismatched_debug_files_are_not_used() {
    let ctx = Ctx::new("mismatched_debug_files_are_not_used");
    let dir = scratch_dir("mismatched_debug_files_are_not_used");
    let exe = build(&dir.join("bin"), &[]);
    // The same sources built otherwise: another build-id.
    let other = build(&dir.join("other"), &["-O2"]);
    assert_ne!(build_id(&exe), build_id(&other));
    let id = build_id(&exe);
    let debug_dir = dir.join("debug");
    let wrong = debug_dir
        .join(".build-id")
        .join(&id[..2])
        .join(format!("{}.debug", &id[2..]));
    std::fs::create_dir_all(wrong.parent().unwrap()).unwrap();
    keep_debug(&other, &wrong, None);
    // The right debug file, linked, then changed: another CRC.
    let linked = exe.with_file_name(format!("{EXE}.debug"));
    keep_debug(&exe, &linked, None);
    strip(&exe, Some(&linked));
    let mut bytes = std::fs::read(&linked).unwrap();
    bytes.extend_from_slice(b"changed after linking");
    std::fs::write(&linked, bytes).unwrap();

    let mut t = ctx.target(&exe, &["wait"]);
    t.expect_stdout("ready", |l| l.starts_with("ready pid="));
    let pid = t.pid_str();
    let dirs = debug_dir.to_str().unwrap();
    // The real name is not known...
    let mut w = weft(&ctx, dirs, &["list", "-p", &pid, "exe:dbg_work_a"]);
    let st = w.wait_exit();
    let err = w.stderr_text();
    ctx.check(!st.success() && err.contains("no function matches"), || {
        format!("exe:dbg_work_a was found with a wrong debug file: {st:?} {err}")
    });
    for want in [
        format!("ignored {}", wrong.display()),
        "its build-id is".to_string(),
        format!("ignored /proc/{pid}/root{}", linked.display()),
        "its CRC32 is".to_string(),
        "stripped, no debug file found".to_string(),
    ] {
        ctx.check(err.contains(&want), || {
            format!("stderr lacks {want:?}: {err}")
        });
    }
    // ...the functions are those of .eh_frame.
    let mut w = weft(&ctx, dirs, &["list", "-p", &pid, "exe:fun_*"]);
    w.wait_code(0);
    let out = w.stdout_text();
    ctx.check(out.lines().count() >= 3, || format!("fun_* listed {out:?}"));
    t.close_stdin();
    t.wait_code(0);
}

/// A stripped program without a debug file: one message however many
/// searches touch it, none when no pattern searches it or a bare name is
/// found elsewhere; its functions are still counted exactly under their
/// `fun_<vaddr>` names.
#[test]
fn no_debug_file_is_said_once() {
    let ctx = Ctx::new("no_debug_file_is_said_once");
    let dir = scratch_dir("no_debug_file_is_said_once");
    let exe = build(&dir.join("bin"), &[]);
    // File vaddrs of two functions, from the symbols before stripping.
    let symbols = output("nm", &[exe.to_str().unwrap()]);
    let vaddr = |name: &str| {
        let line = symbols
            .lines()
            .find(|l| l.ends_with(&format!(" {name}")))
            .unwrap_or_else(|| panic!("nm does not show {name}"));
        u64::from_str_radix(line.split_whitespace().next().unwrap(), 16).unwrap()
    };
    let (a, b) = (vaddr("dbg_work_a"), vaddr("dbg_work_b"));
    strip(&exe, None);
    let message = format!("weft: {EXE}: stripped, no debug file found");

    // Two patterns on the program: two searches of it, one message.
    let report_file = dir.join("report.json");
    let (fa, fb) = (format!("exe:fun_{a:x}"), format!("exe:fun_{b:x}"));
    let n = N.to_string();
    let args = [
        "run",
        "-m",
        "calls",
        "--format",
        "json",
        "-o",
        report_file.to_str().unwrap(),
        "-f",
        &fa,
        "-f",
        &fb,
        "--",
        exe.to_str().unwrap(),
        "run",
        &n,
    ];
    let mut w = weft(&ctx, "", &args);
    w.wait_code(0);
    let err = w.stderr_text();
    ctx.check(err.matches(&message).count() == 1, || {
        format!("want {message:?} once: {err}")
    });
    let report = parse_report(&ctx, &std::fs::read_to_string(&report_file).unwrap());
    for (name, per_call) in [(&fa[4..], 1), (&fb[4..], 2)] {
        let calls = report.function(name).map(|f| f.calls);
        ctx.check(calls == Some(THREADS * N * per_call), || {
            format!("{name}: {calls:?} calls, want {}", THREADS * N * per_call)
        });
    }

    let mut t = ctx.target(&exe, &["wait"]);
    t.expect_stdout("ready", |l| l.starts_with("ready pid="));
    let pid = t.pid_str();
    // A pattern that matches nothing: the search and the suggestions both
    // read the program, one message.
    let mut w = weft(&ctx, "", &["list", "-p", &pid, "exe:dbg_work_a"]);
    let st = w.wait_exit();
    let err = w.stderr_text();
    ctx.check(!st.success() && err.matches(&message).count() == 1, || {
        format!("{st:?}, want {message:?} once: {err}")
    });
    // A pattern that does not search the program, and a bare name that
    // searches it but is found in the library: no message.
    for pattern in [format!("{LIB}:dbg_lib_entry"), "dbg_lib_entry".to_string()] {
        let mut w = weft(&ctx, "", &["list", "-p", &pid, &pattern]);
        w.wait_code(0);
        let err = w.stderr_text();
        ctx.check(!err.contains("no debug file"), || {
            format!("{pattern}: a message where the program's names do not matter: {err}")
        });
    }
    t.close_stdin();
    t.wait_code(0);
}

/// With the library's debug file, its private `dbg_twin` (a local symbol)
/// is known too, but a bare `dbg_twin` still means the program's global
/// one, as a bare `strlen` means libc's and not the dynamic loader's own
/// copy; `MODULE:NAME` reaches the private one.
#[test]
fn a_bare_name_means_the_global_function() {
    let ctx = Ctx::new("a_bare_name_means_the_global_function");
    let dir = scratch_dir("a_bare_name_means_the_global_function");
    let exe = build(&dir.join("bin"), &[]);
    let lib = exe.with_file_name(LIB);
    let debug = lib.with_file_name(format!("{LIB}.debug"));
    keep_debug(&lib, &debug, None);
    strip(&lib, Some(&debug));
    let mut t = ctx.target(&exe, &["wait"]);
    t.expect_stdout("ready", |l| l.starts_with("ready pid="));
    let pid = t.pid_str();
    for (pattern, module) in [
        ("dbg_twin", EXE),
        ("exe:dbg_twin", EXE),
        ("libdbgwork.so:dbg_twin", LIB),
    ] {
        let mut w = weft(&ctx, "", &["list", "-p", &pid, pattern]);
        w.wait_code(0);
        let modules: Vec<String> = w
            .stdout_text()
            .lines()
            .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
            .collect();
        ctx.check(modules == [module], || {
            format!("{pattern}: listed in {modules:?}, want {module}")
        });
    }
    // A glob is no exact name: both.
    let mut w = weft(&ctx, "", &["list", "-p", &pid, "dbg_twi*"]);
    w.wait_code(0);
    let n = w.stdout_text().lines().count();
    ctx.check(n == 2, || format!("dbg_twi* listed {n} functions, want 2"));
    t.close_stdin();
    t.wait_code(0);
}

/// A Debian package's own debug file (`libc6-dbg`, installed by
/// `scripts/test`): libc is stripped, and its file-local `_int_malloc` exists
/// only in `/usr/lib/debug/.build-id/…` — weft finds it by build-id in the
/// default directory and counts it in a real program (`sort`), whose
/// output is unchanged.
#[test]
fn debian_libc6_dbg_names_libc_internals() {
    let ctx = Ctx::new("debian_libc6_dbg_names_libc_internals");
    let input = scratch_dir("debian_libc6_dbg").join("input");
    let text: String = (0..2000)
        .map(|i| format!("line {}\n", (i * 7919) % 2000))
        .collect();
    std::fs::write(&input, &text).unwrap();
    let plain = Command::new("sort").arg(&input).output().expect("sort");
    let mut w = ctx.weft(&[
        "run",
        "-m",
        "calls",
        "--format",
        "json",
        "-o",
        input.with_extension("json").to_str().unwrap(),
        "-f",
        "libc.so.6:_int_malloc",
        "--",
        "sort",
        input.to_str().unwrap(),
    ]);
    w.wait_code(0);
    ctx.check(
        w.stdout_text().as_bytes() == plain.stdout.as_slice(),
        || "sort's output changed under weft".into(),
    );
    let report = parse_report(
        &ctx,
        &std::fs::read_to_string(input.with_extension("json")).unwrap(),
    );
    let f = report
        .function("_int_malloc")
        .unwrap_or_else(|| ctx.fail("_int_malloc not in the report"));
    ctx.check(f.calls > 0 && f.module == "libc.so.6", || {
        format!("_int_malloc: {f:?}")
    });
}
