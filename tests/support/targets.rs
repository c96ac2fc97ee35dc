//! Building the target programs of tests/targets/ (once per test binary,
//! into its own directory under `CARGO_TARGET_TMPDIR`), scratch
//! directories, and stripped copies of built programs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn src(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/targets")
        .join(name)
}

/// Per-test-binary build directory under CARGO_TARGET_TMPDIR, created fresh
/// the first time it is asked for.
fn build_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let exe = std::env::current_exe().expect("current_exe");
        let stem = exe.file_stem().unwrap().to_string_lossy().into_owned();
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("weft-targets-{stem}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create build dir");
        dir
    })
}

fn variant_dir(name: &str) -> PathBuf {
    let d = build_root().join(name);
    std::fs::create_dir_all(&d).expect("create variant dir");
    d
}

fn run_build(mut cmd: Command) {
    let shown = format!("{cmd:?}");
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"));
    if !out.status.success() {
        panic!(
            "build failed: {shown}\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn gcc(args: &[&str], extra: &[&str]) -> Command {
    let mut c = Command::new("gcc");
    c.args(args).args(extra);
    c
}

/// Builds `tests/targets/NAME.c` with `gcc FLAGS -pthread` into this test
/// binary's build directory (once per variant of flags) and returns the
/// executable.
pub fn build_c_target(name: &str, flags: &[&str]) -> PathBuf {
    build_c_target_with("gcc", name, flags)
}

/// [`build_c_target`] with another C compiler (`clang`): users build
/// with both.
pub fn build_c_target_with(compiler: &str, name: &str, flags: &[&str]) -> PathBuf {
    // One build at a time, into a file renamed when complete: a test
    // running in parallel otherwise saw the executable exist while the
    // linker still wrote it, and its exec failed with ETXTBSY.
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    let variant = if compiler == "gcc" { "" } else { compiler };
    let dir = variant_dir(&format!("{name}{variant}{}", flags.join("")));
    let exe = dir.join(name);
    // A C++ target is NAME.cpp (built with g++ or clang++).
    let source = [src(&format!("{name}.c")), src(&format!("{name}.cpp"))]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("no source {name}.c or {name}.cpp in tests/targets"));
    // Built again when its source changed since (a stale target once
    // lacked a line a test waited for).
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if !exe.exists() || modified(&source) > modified(&exe) {
        let partial = dir.join(format!("{name}.building"));
        let mut args: Vec<&str> = flags.to_vec();
        args.extend([
            "-pthread",
            "-o",
            partial.to_str().unwrap(),
            source.to_str().unwrap(),
        ]);
        let mut build = Command::new(compiler);
        build.args(&args);
        run_build(build);
        std::fs::rename(&partial, &exe)
            .unwrap_or_else(|e| panic!("renaming {} to {}: {e}", partial.display(), exe.display()));
    }
    exe
}

/// Builds libwork.so and the C workers executable into `dir`.
fn build_workers_c(dir: &Path, extra: &[&str]) -> PathBuf {
    let lib = dir.join("libwork.so");
    let exe = dir.join("workers");
    run_build(gcc(
        &[
            "-O2",
            "-shared",
            "-fPIC",
            "-o",
            lib.to_str().unwrap(),
            src("libwork.c").to_str().unwrap(),
        ],
        extra,
    ));
    run_build(gcc(
        &[
            "-O2",
            "-pthread",
            "-o",
            exe.to_str().unwrap(),
            src("workers.c").to_str().unwrap(),
            "-L",
            dir.to_str().unwrap(),
            "-lwork",
            "-Wl,-rpath,$ORIGIN",
        ],
        extra,
    ));
    exe
}

/// C workers, `gcc -O2 -pthread`, with libwork.so next to it.
pub fn workers_c() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_workers_c(&variant_dir("c"), &[]))
}

/// C workers built with `-fcf-protection=full` (every function starts with `endbr64`).
pub fn workers_c_cet() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_workers_c(&variant_dir("c-cet"), &["-fcf-protection=full"]))
}

/// Rust workers (`rustc -O --edition 2021`), linked against libwork.so.
pub fn workers_rs() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let dir = variant_dir("rs");
        let lib = dir.join("libwork.so");
        run_build(gcc(
            &[
                "-O2",
                "-shared",
                "-fPIC",
                "-o",
                lib.to_str().unwrap(),
                src("libwork.c").to_str().unwrap(),
            ],
            &[],
        ));
        let exe = dir.join("workers");
        let mut c = Command::new("rustc");
        c.args(["-O", "--edition", "2021", "-o"])
            .arg(&exe)
            .arg("-L")
            .arg(format!("native={}", dir.display()))
            .arg("-C")
            .arg("link-arg=-Wl,-rpath,$ORIGIN")
            .arg(src("workers.rs"));
        run_build(c);
        exe
    })
}

/// workers.c linked with `-static` (lib_work compiled into the executable).
/// Fails with a clear message if the static C library is not installed.
pub fn workers_static() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let dir = variant_dir("static");
        let exe = dir.join("workers");
        let out = gcc(
            &[
                "-O2",
                "-pthread",
                "-static",
                "-DNO_LIBWORK",
                "-o",
                exe.to_str().unwrap(),
                src("workers.c").to_str().unwrap(),
            ],
            &[],
        )
        .output()
        .expect("run gcc");
        if !out.status.success() {
            let libc_a = Path::new("/usr/lib/x86_64-linux-gnu/libc.a").exists();
            panic!(
                "cannot link a static target (libc.a present: {libc_a}; on Debian it comes with \
                 libc6-dev):\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        exe
    })
}

fn build_simple_c(name: &str, source: &str, extra: &[&str]) -> PathBuf {
    let dir = variant_dir(name);
    let exe = dir.join(name);
    run_build(gcc(
        &[
            "-O2",
            "-pthread",
            "-o",
            exe.to_str().unwrap(),
            src(source).to_str().unwrap(),
        ],
        extra,
    ));
    exe
}

pub fn blocking() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_simple_c("blocking", "blocking.c", &[]))
}

/// Many short-lived threads, few alive at once (`churn TOTAL ALIVE`).
pub fn churn() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_simple_c("churn", "churn.c", &[]))
}

/// Threads spending known wall and CPU time in `spin_then_sleep` and
/// `recurse` (`timers THREADS CALLS SPIN_MS SLEEP_MS`).
pub fn timers() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_simple_c("timers", "timers.c", &[]))
}

/// A known call tree for self times and histograms (`calltree [THREADS]`,
/// tests/targets/calltree.c).
pub fn calltree() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_simple_c("calltree", "calltree.c", &[]))
}

/// One thread in one long call of `long_call` after `go` (`longcall [SPIN_MS]`).
pub fn longcall() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_simple_c("longcall", "longcall.c", &[]))
}

/// Almost always inside malloc/free's brk (see tests/targets/brkloop.c).
pub fn brkloop() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_simple_c("brkloop", "brkloop.c", &[]))
}

/// Threads holding glibc's loader lock most of the time, in a callback of
/// `dl_iterate_phdr` (see tests/targets/loaderlock.c).
pub fn loaderlock() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_simple_c("loaderlock", "loaderlock.c", &[]))
}

/// 200 small functions `f0`..`f199` threads call in turn, checking every
/// result, and `spare`, which nothing calls (`many_spare THREADS`, see
/// tests/targets/many_spare.c).
pub fn many_spare() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_simple_c("many_spare", "many_spare.c", &[]))
}

/// Threads copying memory through glibc's memcpy and mempcpy, whose
/// implementations share code (see tests/targets/multientry.c).
pub fn multientry() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_simple_c("multientry", "multientry.c", &[]))
}

/// fork, exec and plain calls on command (see tests/targets/events.c).
pub fn events() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_simple_c("events", "events.c", &[]))
}

/// Counts the SIGRTMIN+1 signals it gets, in a handler that calls an
/// instrumented function, while two threads call `work`.
pub fn signals() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_simple_c("signals", "signals.c", &[]))
}

/// Threads with the smallest stack allowed calling `work`
/// (`smallstack [THREADS] [CALLS]`).
pub fn smallstack() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_simple_c("smallstack", "smallstack.c", &[]))
}

/// A target with `n` functions `f0`..: each of its THREADS threads
/// (`many THREADS`, default 2) calls all of them every 10 ms, until stdin
/// closes. Prints "ready pid=P threads=T" once every thread made a round.
pub fn many_functions(n: usize) -> PathBuf {
    let dir = variant_dir(&format!("many_{n}"));
    let src = dir.join("many.c");
    let exe = dir.join("many");
    if exe.exists() {
        return exe;
    }
    let mut c = String::from(
        "#include <pthread.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <unistd.h>\n\
         #include <stdatomic.h>\n",
    );
    for i in 0..n {
        c.push_str(&format!(
            "__attribute__((noinline, noipa)) long f{i}(long x) {{ return x * {} + {i}; }}\n",
            2 * i + 3
        ));
    }
    c.push_str("typedef long (*fn_t)(long);\nstatic fn_t table[] = {");
    for i in 0..n {
        c.push_str(&format!("f{i},"));
    }
    c.push_str(
        "};\nstatic atomic_int started;\n\
         static void *run(void *a) { long x = (long)a; int first = 1; for (;;) {\n\
           for (unsigned i = 0; i < sizeof table / sizeof *table; i++) x = table[i](x);\n\
           if (first) { first = 0; atomic_fetch_add(&started, 1); }\n\
           usleep(10000); } return (void *)x; }\n\
         int main(int argc, char **argv) { int n = argc > 1 ? atoi(argv[1]) : 2;\n\
           for (int i = 0; i < n; i++) { pthread_t t; if (pthread_create(&t, 0, run, (void *)(long)i)) return 1; }\n\
           while (atomic_load(&started) < n) usleep(1000);\n\
           printf(\"ready pid=%d threads=%d\\n\", (int)getpid(), n + 1); fflush(stdout);\n\
           char buf[16]; while (read(0, buf, sizeof buf) > 0) {} return 0; }\n",
    );
    std::fs::write(&src, c).expect("writing the generated target");
    run_build(gcc(
        &[
            "-O2",
            "-pthread",
            "-o",
            exe.to_str().unwrap(),
            src.to_str().unwrap(),
        ],
        &[],
    ));
    exe
}

/// A target that dlopens a library and starts threads on command (see
/// tests/targets/lateload.c), and libwork.so for it to load.
pub fn lateload() -> (&'static Path, &'static Path) {
    static P: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    let (exe, lib) = P.get_or_init(|| {
        let dir = variant_dir("lateload");
        let lib = dir.join("libwork.so");
        run_build(gcc(
            &[
                "-O2",
                "-shared",
                "-fPIC",
                "-o",
                lib.to_str().unwrap(),
                src("libwork.c").to_str().unwrap(),
            ],
            &[],
        ));
        (build_simple_c("lateload", "lateload.c", &["-ldl"]), lib)
    });
    (exe, lib)
}

/// Functions with integer, pointer and floating-point arguments, called
/// in rounds on command (see tests/targets/probed.c).
pub fn probed() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_simple_c("probed", "probed.c", &[]))
}

/// Worker threads making indirect and virtual calls in rounds on command,
/// printing their ground truth (see tests/targets/points.c).
pub fn points() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_simple_c("points", "points.c", &[]))
}

/// The user probes of tests/targets/probe_lib.c, as a shared library.
pub fn probe_lib() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let lib = variant_dir("probe_lib").join("libprobe.so");
        let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("../include");
        run_build(gcc(
            &[
                "-O2",
                "-shared",
                "-fPIC",
                "-I",
                include.to_str().unwrap(),
                "-o",
                lib.to_str().unwrap(),
                src("probe_lib.c").to_str().unwrap(),
            ],
            &[],
        ));
        lib
    })
}

/// Two threads calling `hot` in a tight loop until told to stop.
pub fn cycles() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_simple_c("cycles", "cycles.c", &[]))
}

/// Many threads spinning through `leaf`, a 4-instruction function.
pub fn hotleaf() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_simple_c("hotleaf", "hotleaf.c", &[]))
}

/// A thread left blocked inside `blocked` across weft sessions, and `g`.
pub fn sessions() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_simple_c("sessions", "sessions.c", &[]))
}

/// A thread blocked inside `inner` called by `outer`, for gdb (`-g`).
pub fn gdbwait() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_simple_c("gdbwait", "gdbwait.c", &["-g"]))
}

/// Functions left by several `ret`s, a tail call, recursion, `longjmp`,
/// `pthread_exit`, and a `backtrace()` through instrumented frames
/// (`-rdynamic` so that `dladdr` names the executable's functions).
pub fn exits() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_simple_c("exits", "exits.c", &["-rdynamic", "-ldl"]))
}

/// Every general register, the flags and the caller's frame checked inside
/// an instrumented `checked` (`regs THREADS CALLS [now]`, tests/targets/regs.c
/// and regs_asm.S).
pub fn regs() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let exe = variant_dir("regs").join("regs");
        run_build(gcc(
            &[
                "-O2",
                "-pthread",
                "-o",
                exe.to_str().unwrap(),
                src("regs.c").to_str().unwrap(),
                src("regs_asm.S").to_str().unwrap(),
            ],
            &[],
        ));
        exe
    })
}

/// The cgo-linked Go program of tests/targets/gocompute (`gocompute
/// CALLS`), built with the `go` tool (Debian's golang-go, 1.19 or later).
pub fn go_compute() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let dir = variant_dir("gocompute");
        let exe = dir.join("gocompute");
        let mut c = Command::new("go");
        c.args(["build", "-o"])
            .arg(&exe)
            .arg(".")
            .current_dir(src("gocompute"))
            // The build cache and module cache in the build directory: the
            // tests may run without a writable $HOME.
            .env("GOCACHE", dir.join("gocache"))
            .env("GOPATH", dir.join("gopath"))
            .env("GOFLAGS", "-mod=mod")
            .env("GOTOOLCHAIN", "local")
            .env("CGO_ENABLED", "1");
        if let Err(e) = c.output() {
            panic!("cannot run `go` ({e}): the Go tests need it (apt-get install golang-go)");
        }
        run_build(c);
        exe
    })
}

/// C++ exceptions thrown through `extern "C"` `thrower` and `middle`
/// (`g++ -O2 -pthread`).
pub fn exceptions() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let dir = variant_dir("exceptions");
        let exe = dir.join("exceptions");
        let mut c = Command::new("g++");
        c.args(["-O2", "-pthread", "-o"])
            .arg(&exe)
            .arg(src("exceptions.cpp"));
        run_build(c);
        exe
    })
}

pub fn unpatchable() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_simple_c("unpatchable", "unpatchable.c", &[]))
}

pub fn zombie() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_simple_c("zombie", "zombie.c", &[]))
}

/// A per-test scratch directory (for `-o FILE`).
pub fn scratch_dir(test: &str) -> PathBuf {
    let d = build_root().join("scratch").join(test);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// Writes a copy of executable `named` without symbols to `stripped`
/// (`strip -o`), and returns `named`'s symbol table (`nm`'s lines), to
/// find with [`symbol_address`] what weft names `fun_<addr>` in the copy.
pub fn strip_copy(named: &Path, stripped: &Path) -> String {
    let ok = Command::new("strip")
        .arg("-o")
        .arg(stripped)
        .arg(named)
        .status()
        .expect("run strip");
    assert!(ok.success(), "strip failed on {}", named.display());
    let nm = Command::new("nm").arg(named).output().expect("run nm");
    String::from_utf8_lossy(&nm.stdout).into_owned()
}

/// The address of symbol `name` in `nm`'s lines `symbols`, if listed.
pub fn symbol_address(symbols: &str, name: &str) -> Option<u64> {
    symbols.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (a, _, n) = (f.next()?, f.next()?, f.next()?);
        (n == name).then(|| u64::from_str_radix(a, 16).ok())?
    })
}

/// A program that has mapped all the memory within 2 GiB of its library
/// `libcrowded.so` (see tests/targets/crowded.c).
pub fn crowded() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let dir = variant_dir("crowded");
        let lib = dir.join("libcrowded.so");
        let exe = dir.join("crowded");
        run_build(gcc(
            &["-O2", "-g", "-shared", "-fPIC", "-o", lib.to_str().unwrap()],
            &[src("crowded_lib.c").to_str().unwrap()],
        ));
        let rpath = format!("-Wl,-rpath,{}", dir.display());
        run_build(gcc(
            &["-O2", "-g", "-o", exe.to_str().unwrap()],
            &[
                src("crowded.c").to_str().unwrap(),
                lib.to_str().unwrap(),
                &rpath,
            ],
        ));
        exe
    })
}
