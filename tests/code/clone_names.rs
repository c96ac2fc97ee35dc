//! Names as people write them (issue 29): the clones gcc and clang make of
//! a function (`.isra.N`, `.constprop.N`, `.part.N`, `.llvm.N`) are found
//! and reported under the function's source name, and C++ functions by
//! their demangled names (methods, overloads, templates, a method gcc
//! cloned), each counted exactly per thread against the target's own
//! counters; also from a stripped program with a separate debug file. A
//! libc-wide glob leaves out `.cold` parts and times >= 99 % of its
//! functions.

use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use support::*;

/// Records each thread of the targets processes (thread i: ROUNDS * (i+1)).
const ROUNDS: &str = "20000";

fn dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("weft-targets-clone_names");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/targets")
        .join(name)
}

fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Builds `exe` with `compiler` and `flags` from `sources`, and a copy
/// `exe-stripped` without symbols whose `.gnu_debuglink` names
/// `exe-stripped.debug` next to it (`objcopy --only-keep-debug`, then
/// `--strip-all --add-gnu-debuglink`, as tests/code/debug_files.rs does).
/// Returns both and `exe`'s linkage names (`nm`).
fn build(
    compiler: &str,
    flags: &[&str],
    sources: &[&str],
    exe: &str,
) -> (PathBuf, PathBuf, String) {
    let named = dir().join(exe);
    let stripped = dir().join(format!("{exe}-stripped"));
    let debug = dir().join(format!("{exe}-stripped.debug"));
    let building = dir().join(format!("{exe}.building"));
    let mut args: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
    args.extend([
        "-pthread".into(),
        "-o".into(),
        building.display().to_string(),
    ]);
    args.extend(sources.iter().map(|s| source(s).display().to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run(compiler, &args);
    std::fs::rename(&building, &named).unwrap();
    let (n, s, d) = (
        named.to_str().unwrap(),
        stripped.to_str().unwrap(),
        debug.to_str().unwrap(),
    );
    run("objcopy", &["--only-keep-debug", n, d]);
    let link = format!("--add-gnu-debuglink={d}");
    run("objcopy", &["--strip-all", &link, n, s]);
    let names = run("nm", &[n]);
    // `nm` finds no symbol table in the stripped copy: its names can only
    // come from the debug file.
    let stripped_names = Command::new("nm").arg(s).output().unwrap();
    assert!(
        stripped_names.stdout.is_empty(),
        "{s} still has symbols:\n{}",
        String::from_utf8_lossy(&stripped_names.stdout)
    );
    (named, stripped, names)
}

/// Asserts that the compiler emitted a function whose linkage name
/// contains `part` (else the test would prove nothing).
fn emitted(names: &str, part: &str, exe: &Path) {
    let found = names
        .lines()
        .any(|l| matches!(l.split_whitespace().nth(1), Some("t" | "T" | "W")) && l.contains(part));
    assert!(
        found,
        "{} has no function named like `{part}`; the compiler changed its mind:\n{names}",
        exe.display()
    );
}

/// The target's own counters, per thread: `thread TID k=v ...`.
fn own_counts(ctx: &Ctx, stdout: &str) -> BTreeMap<i64, BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for l in stdout.lines().filter(|l| l.starts_with("thread ")) {
        let mut words = l.split_whitespace().skip(1);
        let tid: i64 = words.next().unwrap().parse().unwrap();
        let counts = words
            .filter_map(|w| w.split_once('='))
            .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
            .collect();
        out.insert(tid, counts);
    }
    ctx.check(out.len() == 3, || format!("3 threads expected:\n{stdout}"));
    out
}

/// `weft run --strict` (every function timed, or nothing) with `patterns`:
/// the target's stdout and weft's JSON report.
fn run_under_weft(ctx: &Ctx, exe: &Path, patterns: &[&str]) -> (String, Report) {
    // One file per run: the tests run in parallel.
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let file = dir().join(format!("report-{}-{n}.json", std::process::id()));
    let mut args = vec!["run", "--strict"];
    for p in patterns {
        args.extend(["-f", p]);
    }
    let file_s = file.to_str().unwrap();
    args.extend([
        "--format",
        "json",
        "-o",
        file_s,
        "--",
        exe.to_str().unwrap(),
        ROUNDS,
    ]);
    let mut w = ctx.weft(&args);
    w.wait_code(0);
    let report = parse_report(ctx, &std::fs::read_to_string(&file).unwrap());
    (w.stdout_text(), report)
}

/// Each `(report name, target counter)`: the report's calls per thread
/// equal the target's own count, exactly, and the function is timed.
fn check_counts(ctx: &Ctx, stdout: &str, report: &Report, want: &[(&str, &str)]) {
    let own = own_counts(ctx, stdout);
    for (name, counter) in want {
        ctx.check(report.function(name).is_some(), || {
            format!(
                "no report entry `{name}`; entries: {:?}",
                report.functions.iter().map(|f| &f.name).collect::<Vec<_>>()
            )
        });
        for (tid, counts) in &own {
            let expected = counts[*counter];
            let got = report.counts(*tid, name);
            ctx.check(got.calls == expected, || {
                format!(
                    "thread {tid}: weft counted {name} {} times, the target {expected}",
                    got.calls
                )
            });
            ctx.check(
                got.wall_ns.is_some_and(|w| w > 0) && got.cpu_ns.is_some(),
                || format!("thread {tid}: {name} not timed: {got:?}"),
            );
        }
    }
}

fn gcc_build() -> &'static (PathBuf, PathBuf, String) {
    static B: std::sync::OnceLock<(PathBuf, PathBuf, String)> = std::sync::OnceLock::new();
    B.get_or_init(|| {
        build(
            "gcc",
            &["-O2", "-g"],
            &["clones.c", "clones_table.c"],
            "clones-gcc",
        )
    })
}

/// gcc -O2's `.isra`, `.constprop` and `.part` clones, by source name.
#[test]
fn gcc_clones_are_counted_by_source_name() {
    let ctx = Ctx::new("gcc_clones_are_counted_by_source_name");
    let (named, stripped, names) = gcc_build();
    for part in ["weigh.isra.", "scale.part.0.constprop.", "lookup.part."] {
        emitted(names, part, named);
    }
    let want = [
        ("parse_field", "parse_field"),
        ("weigh", "weigh"),
        ("scale", "scale"),
        ("lookup", "lookup"),
        ("hash_key", "hash_key"),
    ];
    for exe in [named, stripped] {
        let (stdout, report) = run_under_weft(
            &ctx,
            exe,
            &["parse_field,weigh,scale", "lookup", "exe:hash_key"],
        );
        check_counts(&ctx, &stdout, &report, &want);
        let weigh = report.function("weigh").unwrap();
        ctx.check(
            weigh
                .mangled
                .as_deref()
                .is_some_and(|m| m.starts_with("weigh.isra.")),
            || format!("weigh's linkage name is not beside it: {weigh:?}"),
        );
    }
}

/// clang -O2 with ThinLTO promotes a file's static `hash_key` to
/// `hash_key.llvm.N`: found and counted as `hash_key`.
#[test]
fn clang_thinlto_clones_are_counted_by_source_name() {
    let ctx = Ctx::new("clang_thinlto_clones_are_counted_by_source_name");
    let (named, stripped, names) = build(
        "clang",
        &["-O2", "-g", "-flto=thin", "-fuse-ld=gold"],
        &["clones.c", "clones_table.c"],
        "clones-clang",
    );
    emitted(&names, "hash_key.llvm.", &named);
    for exe in [&named, &stripped] {
        let (stdout, report) = run_under_weft(&ctx, exe, &["hash_key", "parse_field"]);
        check_counts(
            &ctx,
            &stdout,
            &report,
            &[("hash_key", "hash_key"), ("parse_field", "parse_field")],
        );
    }
}

/// A g++ -O2 program: methods, overloads and template instances by their
/// demangled names (with leading scopes left out, with a parameter list),
/// a method gcc cloned (`.constprop.0.isra.0`) by its own; reported
/// demangled, with the mangled name beside.
#[test]
fn cpp_functions_are_counted_by_demangled_name() {
    let ctx = Ctx::new("cpp_functions_are_counted_by_demangled_name");
    let (named, stripped, names) = build("g++", &["-O2", "-g"], &["cppnames.cpp"], "cppnames");
    emitted(
        &names,
        "Eviction5scoreERKNS_5EntryE.constprop.0.isra.0",
        &named,
    );
    // `get(int)` is small enough that g++ inlines it at its call site:
    // its out-of-line copy, which weft finds, is never called, and the
    // target's counter (which counts the inlined calls) is no truth for it.
    let get_int = "app::Cache::get(int) const";
    let get_str = "app::Cache::get(std::__cxx11::basic_string<char, std::char_traits<char>, \
                   std::allocator<char> > const&) const";
    let want = [
        (get_str, "get_str"),
        ("app::Cache::put(int, int)", "put"),
        (
            "app::(anonymous namespace)::Eviction::score(app::Entry const&) const",
            "evict",
        ),
        (
            "app::largest<int>(std::vector<int, std::allocator<int> > const&)",
            "max_int",
        ),
        (
            "app::largest<double>(std::vector<double, std::allocator<double> > const&)",
            "max_double",
        ),
    ];
    for exe in [&named, &stripped] {
        let (stdout, report) = run_under_weft(
            &ctx,
            exe,
            &[
                "Cache::get",
                "app::Cache::put(int, int)",
                "app::largest<*>",
                "Eviction::score",
            ],
        );
        check_counts(&ctx, &stdout, &report, &want);
        // Both overloads of `get`, and nothing else.
        ctx.check(report.functions.len() == want.len() + 1, || {
            format!("other functions selected: {:?}", report.functions)
        });
        let get = report.function(get_int).unwrap();
        ctx.check(
            get.mangled.as_deref() == Some("_ZNK3app5Cache3getEi"),
            || format!("{get:?}"),
        );
    }

    // A glob over the namespace leaves out the `.cold` part gcc split off
    // `recent_scores`, and times everything else.
    emitted(&names, "recent_scoresEv.cold", &named);
    let (stdout, report) = run_under_weft(&ctx, &named, &["app::*"]);
    own_counts(&ctx, &stdout);
    ctx.check(
        report.functions.iter().all(|f| {
            !f.name.contains("clone .cold") && !f.mangled.as_deref().unwrap_or("").contains(".cold")
        }),
        || format!("a cold part selected by a glob: {:?}", report.functions),
    );

    // `list` prints the demangled name and the linkage name.
    let mut t = ctx.target(&named, &["100000000"]);
    let pid = t.pid_str();
    let mut w = ctx.weft(&["list", "-p", &pid, "Eviction::score"]);
    w.wait_code(0);
    let text = w.stdout_text();
    ctx.check(
        text.contains(
            " app::(anonymous namespace)::Eviction::score(app::Entry const&) const \
             (_ZNK3app12_GLOBAL__N_18Eviction5scoreERKNS_5EntryE.constprop.0.isra.0)",
        ),
        || format!("list does not show both names:\n{text}"),
    );
    t.signal(nix::sys::signal::Signal::SIGKILL);
    t.wait_exit();
}

/// `weft list` with several patterns, one matching nothing: the others are
/// listed, the one that matched nothing is named with suggestions, and the
/// status is 1.
#[test]
fn list_names_the_pattern_that_matched_nothing() {
    let ctx = Ctx::new("list_names_the_pattern_that_matched_nothing");
    let (named, _, _) = gcc_build();
    let mut t = ctx.target(named, &["100000000"]);
    let pid = t.pid_str();
    let mut w = ctx.weft(&["list", "-p", &pid, "weigh", "no_such_fn", "lookup"]);
    w.wait_code(1);
    let out = w.stdout_text();
    let err = w.stderr_text();
    ctx.check(out.contains(" weigh (weigh.isra.0)"), || {
        format!("weigh not listed:\n{out}")
    });
    ctx.check(out.contains(" lookup (lookup.part.0)"), || {
        format!("lookup not listed:\n{out}")
    });
    ctx.check(
        err.contains("no_such_fn") && !err.contains("`lookup`"),
        || format!("stderr should name the pattern that matched nothing, only it: {err}"),
    );
    t.signal(nix::sys::signal::Signal::SIGKILL);
    t.wait_exit();
}

/// A glob over libc with timers: `.cold` parts (92 in Debian 12's libc, in
/// its debug file) are no functions, and >= 99 % of the functions are
/// timed. `weft list` of the same glob counts the functions independently.
#[test]
fn libc_glob_times_99_percent_of_its_functions() {
    let ctx = Ctx::new("libc_glob_times_99_percent_of_its_functions");
    let mut w = ctx.weft(&[
        "run",
        "-f",
        "libc.so.6:*",
        "-o",
        "/dev/null",
        "--",
        "/bin/sleep",
        "0.2",
    ]);
    w.wait_code(0);
    let err = w.stderr_text();
    let (done, total) = match err.lines().find_map(|l| {
        l.strip_prefix("weft: ")?
            .split_once(" functions instrumented")
    }) {
        Some((figures, _)) => {
            let (a, b) = figures.split_once(" of ").expect("N of M");
            let n = |s: &str| s.replace(',', "").parse::<u64>().unwrap();
            (n(a), n(b))
        }
        // Nothing refused: no summary line; everything was timed.
        None => (0, 0),
    };
    ctx.check(total == 0 || done * 100 >= total * 99, || {
        format!("only {done} of {total} libc functions timed:\n{err}")
    });

    let mut t = ctx.target(Path::new("/bin/sleep"), &["30"]);
    let pid = t.pid_str();
    wait_libc_mapped(&ctx, t.pid);
    let mut w = ctx.weft(&["list", "-p", &pid, "libc.so.6:*"]);
    w.wait_code(0);
    let listed = w.stdout_text();
    let count = listed.lines().count() as u64;
    ctx.check(!listed.contains(".cold"), || {
        "a .cold part listed by a glob".into()
    });
    ctx.check(total == 0 || total == count, || {
        format!("weft run counted {total} functions, weft list lists {count}")
    });
    ctx.check(count > 2000, || {
        format!("only {count} libc functions listed")
    });
    t.signal(nix::sys::signal::Signal::SIGKILL);
    t.wait_exit();
}

/// Rust functions answer to their demangled paths (the hash left out),
/// and `list` prints the path with the mangled name beside it.
#[test]
fn rust_functions_by_their_paths() {
    let ctx = Ctx::new("rust_functions_by_their_paths");
    let mut t = ctx.target(workers_rs(), &["--threads", "2"]);
    let (pid, _) = wait_ready(&mut t);
    let pid = pid.to_string();
    let mut w = ctx.weft(&["list", "-p", &pid, "exe:std::rt::lang_start_internal"]);
    w.wait_code(0);
    let text = w.stdout_text();
    let lines: Vec<&str> = text.lines().collect();
    ctx.check(
        lines.len() == 1
            // Legacy (`_ZN3std2rt19lang_start_internal17h…E`) or v0
            // (`_RNvNtCs…_3std2rt19lang_start_internal`) mangling.
            && lines[0].contains(" std::rt::lang_start_internal (_")
            && lines[0].contains("3std2rt19lang_start_internal"),
        || format!("expected one line with both names:\n{text}"),
    );
    let mut w = ctx.weft(&["list", "-p", &pid, "exe:std::thread::*"]);
    w.wait_code(0);
    let text = w.stdout_text();
    ctx.check(
        text.lines().count() >= 2 && text.lines().all(|l| l.contains(" std::thread::")),
        || format!("std::thread::* should list Rust's thread functions:\n{text}"),
    );
}
