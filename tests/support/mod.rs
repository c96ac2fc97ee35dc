//! Shared helpers for weft's end-to-end tests: building the target programs
//! (once per test binary), running processes under a kill-on-drop guard with
//! timeouts, and parsing the target's and weft's output.
//!
//! Every wait has a deadline ([`TIMEOUT`]); on failure the panic message shows
//! the stdout/stderr of every process the test started.
#![allow(dead_code)]

use serde::Deserialize;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub mod kernel_calls;
pub mod qemu;
pub mod viewers;

/// Deadline for every single wait in the tests.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// The instrumented functions of the workers targets, as `-f` patterns.
pub const WORKER_PATTERNS: &str = "work_a,work_b,libwork.so:lib_work";
/// The function names these patterns resolve to.
pub const WORKER_FUNCS: [&str; 3] = ["work_a", "work_b", "lib_work"];

pub fn weft_bin() -> &'static str {
    env!("CARGO_BIN_EXE_weft")
}

// ---------------------------------------------------------------------------
// Building the targets
// ---------------------------------------------------------------------------

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

/// (steal, all) clock ticks of the whole machine so far (`/proc/stat`).
/// A hypervisor that takes the vCPUs away shows in the steal column.
pub fn steal_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    (ticks.get(7).copied().unwrap_or(0), ticks.iter().sum())
}

/// The share of the machine's time stolen between two [`steal_ticks`].
pub fn machine_steal_share(a: (u64, u64), b: (u64, u64)) -> f64 {
    b.0.saturating_sub(a.0) as f64 / b.1.saturating_sub(a.1).max(1) as f64
}

/// The binary's turn, held for a whole test: a test that loads both CPUs,
/// or times what a loaded machine would slow, takes it so that no other
/// such test of its binary runs meanwhile (libtest runs a binary's tests
/// on parallel threads; the binaries themselves run one after another).
/// One lock per test binary, since each compiles this module once.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Builds `tests/targets/NAME.c` with `gcc FLAGS -pthread` into this test
/// binary's build directory (once per variant of flags) and returns the
/// executable.
#[allow(dead_code)]
pub fn build_c_target(name: &str, flags: &[&str]) -> PathBuf {
    // One build at a time, into a file renamed when complete: a test
    // running in parallel otherwise saw the executable exist while the
    // linker still wrote it, and its exec failed with ETXTBSY.
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = variant_dir(&format!("{name}{}", flags.join("")));
    let exe = dir.join(name);
    if !exe.exists() {
        let source = src(&format!("{name}.c"));
        let partial = dir.join(format!("{name}.building"));
        let mut args: Vec<&str> = flags.to_vec();
        args.extend([
            "-pthread",
            "-o",
            partial.to_str().unwrap(),
            source.to_str().unwrap(),
        ]);
        run_build(gcc(&args, &[]));
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
#[allow(dead_code)]
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
#[allow(dead_code)]
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
#[allow(dead_code)]
pub fn loaderlock() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_simple_c("loaderlock", "loaderlock.c", &[]))
}

/// 200 small functions `f0`..`f199` threads call in turn, checking every
/// result, and `spare`, which nothing calls (`many_spare THREADS`, see
/// tests/targets/many_spare.c).
#[allow(dead_code)]
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
#[allow(dead_code)]
pub fn smallstack() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_simple_c("smallstack", "smallstack.c", &[]))
}

/// A target with `n` functions `f0`..: each of its THREADS threads
/// (`many THREADS`, default 2) calls all of them every 10 ms, until stdin
/// closes. Prints "ready pid=P threads=T" once every thread made a round.
#[allow(dead_code)]
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
#[allow(dead_code)]
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
#[allow(dead_code)]
pub fn probed() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_simple_c("probed", "probed.c", &[]))
}

/// A random generator seeded from `$var` when set (to rerun a failure),
/// else from the clock; the seed is printed either way.
#[allow(dead_code)]
pub fn rng_from_env(var: &str) -> Rng {
    let seed = std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64 | 1)
                .unwrap_or(1)
        });
    eprintln!("seed {seed} (rerun with {var}={seed})");
    Rng::new(seed)
}

/// Waits until process `pid` (one the test started) has its C library
/// mapped: a program attached to while its dynamic loader still runs has
/// no `malloc` to find yet.
#[allow(dead_code)]
pub fn wait_libc_mapped(ctx: &Ctx, pid: u32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        if maps.lines().any(|l| l.contains("/libc.so")) {
            return;
        }
        ctx.check(std::time::Instant::now() < deadline, || {
            format!("process {pid} did not map libc within 10 s")
        });
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Stops a `cycles` target (tests/targets/cycles.c): sends `stop`, waits
/// for its exit and checks that each of its `workers` reported results
/// unchanged by instrumentation (`"ok":true`). `what` names the moment in
/// the failure message.
#[allow(dead_code)]
pub fn stop_cycles(t: &mut Proc, workers: usize, what: &str) {
    t.send("stop");
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
    let out = t.stdout_text();
    let ok = out
        .lines()
        .filter(|l| l.starts_with("{\"worker\"") && l.contains("\"ok\":true"))
        .count();
    t.ctx().check(ok == workers, || {
        format!("{what}: {ok} of {workers} workers' results unchanged:\n{out}")
    });
}

/// Worker threads making indirect and virtual calls in rounds on command,
/// printing their ground truth (see tests/targets/points.c).
#[allow(dead_code)]
pub fn points() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| build_simple_c("points", "points.c", &[]))
}

/// The user probes of tests/targets/probe_lib.c, as a shared library.
#[allow(dead_code)]
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
#[allow(dead_code)]
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
#[allow(dead_code)]
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

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

struct Logs {
    name: String,
    pid: u32,
    stdout: Mutex<String>,
    stderr: Mutex<String>,
}

/// The set of processes a test started, for failure messages.
#[derive(Clone)]
pub struct Ctx {
    test: String,
    procs: Arc<Mutex<Vec<Arc<Logs>>>>,
}

impl Ctx {
    pub fn new(test: &str) -> Ctx {
        Ctx {
            test: test.to_string(),
            procs: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Everything every process of this test printed so far.
    pub fn dump(&self) -> String {
        let mut s = String::new();
        for l in self.procs.lock().unwrap().iter() {
            s += &format!(
                "----- {} (pid {}) stdout -----\n{}\n----- {} (pid {}) stderr -----\n{}\n",
                l.name,
                l.pid,
                l.stdout.lock().unwrap(),
                l.name,
                l.pid,
                l.stderr.lock().unwrap()
            );
        }
        s
    }

    /// Fails the test, showing every process's output. The guards then kill
    /// whatever is still running.
    #[track_caller]
    pub fn fail(&self, msg: impl AsRef<str>) -> ! {
        panic!("[{}] {}\n{}", self.test, msg.as_ref(), self.dump())
    }

    #[track_caller]
    pub fn check(&self, cond: bool, msg: impl FnOnce() -> String) {
        if !cond {
            self.fail(msg())
        }
    }

    /// Spawns `cmd` with stdout and stderr captured line by line.
    pub fn spawn(&self, name: &str, mut cmd: Command, piped_stdin: bool) -> Proc {
        cmd.stdin(if piped_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| self.fail(format!("cannot spawn {cmd:?}: {e}")));
        let pid = child.id();
        let logs = Arc::new(Logs {
            name: name.to_string(),
            pid,
            stdout: Mutex::new(String::new()),
            stderr: Mutex::new(String::new()),
        });
        self.procs.lock().unwrap().push(logs.clone());
        let (otx, orx) = mpsc::channel();
        let (etx, erx) = mpsc::channel();
        let so = child.stdout.take().unwrap();
        let se = child.stderr.take().unwrap();
        let l1 = logs.clone();
        let l2 = logs.clone();
        std::thread::spawn(move || pump(so, otx, &l1, true));
        std::thread::spawn(move || pump(se, etx, &l2, false));

        let stdin = child.stdin.take();
        Proc {
            ctx: self.clone(),
            name: name.to_string(),
            logs,
            child,
            pid,
            stdin,
            out_rx: orx,
            err_rx: erx,
            out_eof: false,
            err_eof: false,
            status: None,
        }
    }

    /// Starts a target program with a piped stdin.
    pub fn target(&self, exe: &Path, args: &[&str]) -> Proc {
        let mut c = Command::new(exe);
        c.args(args);
        self.spawn(&format!("target {}", exe.display()), c, true)
    }

    /// Starts `weft ARGS...` (stdin closed).
    pub fn weft(&self, args: &[&str]) -> Proc {
        let mut c = Command::new(weft_bin());
        c.args(args);
        self.spawn(&format!("weft {}", args.join(" ")), c, false)
    }
}

fn pump(r: impl Read, tx: mpsc::Sender<Option<String>>, logs: &Logs, is_stdout: bool) {
    let mut r = BufReader::new(r);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match r.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let line = String::from_utf8_lossy(&buf).into_owned();
                {
                    let mut l = if is_stdout {
                        logs.stdout.lock()
                    } else {
                        logs.stderr.lock()
                    }
                    .unwrap();
                    l.push_str(&line);
                }
                let _ = tx.send(Some(line.trim_end_matches('\n').to_string()));
            }
        }
    }
    let _ = tx.send(None);
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// A started process; killed (SIGKILL to its PID) and reaped on drop.
pub struct Proc {
    ctx: Ctx,
    name: String,
    logs: Arc<Logs>,
    child: Child,
    pub pid: u32,
    stdin: Option<ChildStdin>,
    out_rx: Receiver<Option<String>>,
    err_rx: Receiver<Option<String>>,
    out_eof: bool,
    err_eof: bool,
    status: Option<ExitStatus>,
}

impl Proc {
    pub fn pid_str(&self) -> String {
        self.pid.to_string()
    }

    /// Writes one line to the process's stdin.
    #[track_caller]
    pub fn send(&mut self, line: &str) {
        let name = self.name.clone();
        let r = match self.stdin.as_mut() {
            Some(s) => s
                .write_all(format!("{line}\n").as_bytes())
                .and_then(|_| s.flush()),
            None => Err(std::io::Error::other("stdin not piped")),
        };
        if let Err(e) = r {
            self.ctx
                .fail(format!("cannot send {line:?} to {name}: {e}"));
        }
    }

    /// Closes stdin (the targets then exit).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Waits (with [`TIMEOUT`]) for a line on `stream` satisfying `pred`;
    /// earlier lines are skipped (they stay in the logs).
    #[track_caller]
    pub fn expect_line(
        &mut self,
        stream: Stream,
        what: &str,
        pred: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let now = Instant::now();
            if now >= deadline {
                self.ctx.fail(format!(
                    "timed out after {TIMEOUT:?} waiting for {what} on {stream:?} of {}",
                    self.name
                ));
            }
            let rx = if stream == Stream::Stdout {
                &self.out_rx
            } else {
                &self.err_rx
            };
            match rx.recv_timeout(deadline - now) {
                Ok(Some(line)) if pred(&line) => return line,
                Ok(Some(_)) => continue,
                Ok(None) | Err(RecvTimeoutError::Disconnected) => {
                    if stream == Stream::Stdout {
                        self.out_eof = true
                    } else {
                        self.err_eof = true
                    }
                    self.ctx
                        .fail(format!("{:?} of {} ended before {what}", stream, self.name))
                }
                Err(RecvTimeoutError::Timeout) => continue,
            }
        }
    }

    #[track_caller]
    pub fn expect_stdout(&mut self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        self.expect_line(Stream::Stdout, what, pred)
    }

    /// True while the process has not exited (reaps it if it has).
    pub fn is_running(&mut self) -> bool {
        if self.status.is_some() {
            return false;
        }
        match self.child.try_wait() {
            Ok(Some(st)) => {
                self.status = Some(st);
                false
            }
            Ok(None) => true,
            Err(e) => self.ctx.fail(format!("try_wait on {}: {e}", self.name)),
        }
    }

    /// Waits (with [`TIMEOUT`]) for the process to exit and for its output
    /// pipes to reach end of file; returns the exit status.
    #[track_caller]
    pub fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + TIMEOUT;
        while self.is_running() {
            if Instant::now() >= deadline {
                self.ctx.fail(format!(
                    "timed out after {TIMEOUT:?} waiting for {} to exit",
                    self.name
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Drain both channels to EOF so that the logs are complete.
        for stream in [Stream::Stdout, Stream::Stderr] {
            loop {
                let eof = if stream == Stream::Stdout {
                    self.out_eof
                } else {
                    self.err_eof
                };
                if eof {
                    break;
                }
                let now = Instant::now();
                if now >= deadline {
                    self.ctx.fail(format!(
                        "{} exited but its {stream:?} stayed open (a child still holds it?)",
                        self.name
                    ));
                }
                let rx = if stream == Stream::Stdout {
                    &self.out_rx
                } else {
                    &self.err_rx
                };
                match rx.recv_timeout(deadline - now) {
                    Ok(Some(_)) => {}
                    Ok(None) | Err(RecvTimeoutError::Disconnected) => {
                        if stream == Stream::Stdout {
                            self.out_eof = true
                        } else {
                            self.err_eof = true
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                }
            }
        }
        self.status.unwrap()
    }

    /// Waits for exit and requires exit code `code`.
    #[track_caller]
    pub fn wait_code(&mut self, code: i32) {
        let st = self.wait_exit();
        if st.code() != Some(code) {
            self.ctx.fail(format!(
                "{} ended with {st:?}, expected exit code {code}",
                self.name
            ));
        }
    }

    /// Everything the process wrote to stdout so far.
    pub fn stdout_text(&self) -> String {
        self.logs().stdout.lock().unwrap().clone()
    }

    pub fn stderr_text(&self) -> String {
        self.logs().stderr.lock().unwrap().clone()
    }

    fn logs(&self) -> Arc<Logs> {
        self.logs.clone()
    }

    pub fn ctx(&self) -> &Ctx {
        &self.ctx
    }

    /// Sends `sig` to this process (which the test started), if still running.
    #[track_caller]
    pub fn signal(&mut self, sig: nix::sys::signal::Signal) {
        if self.is_running() {
            if let Err(e) = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid as i32), sig)
            {
                self.ctx
                    .fail(format!("kill({}, {sig}) failed: {e}", self.pid));
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

// ---------------------------------------------------------------------------
// weft's output
// ---------------------------------------------------------------------------

#[derive(Deserialize, Debug, Clone)]
pub struct Report {
    pub pid: i64,
    pub duration_ns: u64,
    /// The metrics measured (`calls`, `wall`, `cpu`); absent in reports
    /// that only count calls.
    #[serde(default)]
    pub metrics: Option<Vec<String>>,
    /// How each clock was read (free text per clock), when timed.
    #[serde(default)]
    pub clocks: Option<serde_json::Value>,
    pub functions: Vec<ReportFunction>,
    pub threads: Vec<ReportThread>,
    #[serde(default)]
    pub overflow_threads: u64,
    #[serde(default)]
    pub runtime: Option<RuntimeStats>,
}

#[derive(Deserialize, Debug, Clone)]
pub struct RuntimeStats {
    pub rows_used: u64,
    pub rows_reused: u64,
}

#[derive(Deserialize, Debug, Clone)]
pub struct ReportFunction {
    pub name: String,
    /// The linkage name (`weigh.isra.0`, `_ZNK3app5Cache3getEi`).
    #[serde(default)]
    pub mangled: Option<String>,
    pub module: String,
    pub address: String,
    pub calls: u64,
    /// Present only when the `wall` metric is selected.
    #[serde(default)]
    pub wall_ns: Option<u64>,
    /// Present only when the `cpu` metric is selected.
    #[serde(default)]
    pub cpu_ns: Option<u64>,
    /// Self (exclusive) wall time, with `wall`.
    #[serde(default)]
    pub self_ns: Option<u64>,
}

#[derive(Deserialize, Debug, Clone)]
pub struct ReportThread {
    pub tid: i64,
    pub name: String,
    pub exited: bool,
    pub functions: BTreeMap<String, CallCount>,
}

/// One function's figures in one thread.
#[derive(Deserialize, Debug, Clone, Default)]
pub struct CallCount {
    pub calls: u64,
    /// Inclusive wall time of the outermost activations (`wall` selected).
    #[serde(default)]
    pub wall_ns: Option<u64>,
    /// Inclusive thread CPU time of the outermost activations (`cpu` selected).
    #[serde(default)]
    pub cpu_ns: Option<u64>,
    /// Activations that returned through the exit hook (exit hooked).
    #[serde(default)]
    pub exits: Option<u64>,
    /// Activations closed because their frame vanished (exit hooked).
    #[serde(default)]
    pub unwound: Option<u64>,
    /// Entries whose exit could not be hooked (exit hooked).
    #[serde(default)]
    pub unhooked: Option<u64>,
}

impl Report {
    /// The report's row for `tid`, if any.
    pub fn thread(&self, tid: i64) -> Option<&ReportThread> {
        self.threads.iter().find(|t| t.tid == tid)
    }

    /// `tid`'s figures for function `f` (all zero/absent when it made no call).
    pub fn counts(&self, tid: i64, f: &str) -> CallCount {
        self.thread(tid)
            .and_then(|t| t.functions.get(f))
            .cloned()
            .unwrap_or_default()
    }

    /// The `functions[]` entry named `f`, if any.
    pub fn function(&self, f: &str) -> Option<&ReportFunction> {
        self.functions.iter().find(|x| x.name == f)
    }
}

/// Checks the `metrics` field: the same set as `want`.
#[track_caller]
pub fn check_metrics(ctx: &Ctx, report: &Report, want: &[&str]) {
    let mut got: Vec<String> = report.metrics.clone().unwrap_or_default();
    got.sort();
    let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    want.sort();
    ctx.check(got == want, || {
        format!(
            "report metrics {:?}, expected {want:?} (clocks: {:?}, functions: {:?})",
            report.metrics, report.clocks, report.functions
        )
    });
}

/// Checks which optional fields are present, for every function of every
/// thread and in `functions[]`: `wall_ns` iff `wall`, `cpu_ns` iff `cpu`,
/// and `exits`/`unwound`/`unhooked` iff either timer (the exit is hooked).
#[track_caller]
pub fn check_metric_fields(ctx: &Ctx, report: &Report, wall: bool, cpu: bool) {
    check_fields_of(ctx, report, wall, cpu, wall || cpu);
}

/// [`check_metric_fields`] where the exits are hooked whenever `hooked`
/// (call traces hook them too).
#[track_caller]
pub fn check_fields_of(ctx: &Ctx, report: &Report, wall: bool, cpu: bool, hooked: bool) {
    for f in &report.functions {
        ctx.check(f.wall_ns.is_some() == wall, || {
            format!(
                "functions[] {}: wall_ns is {:?}, wall selected: {wall}: {f:?}",
                f.name, f.wall_ns
            )
        });
        ctx.check(f.cpu_ns.is_some() == cpu, || {
            format!(
                "functions[] {}: cpu_ns is {:?}, cpu selected: {cpu}: {f:?}",
                f.name, f.cpu_ns
            )
        });
    }
    for t in &report.threads {
        for (name, c) in &t.functions {
            let fields = [
                ("wall_ns", c.wall_ns.is_some(), wall),
                ("cpu_ns", c.cpu_ns.is_some(), cpu),
                ("exits", c.exits.is_some(), hooked),
                ("unwound", c.unwound.is_some(), hooked),
                ("unhooked", c.unhooked.is_some(), hooked),
            ];
            for (field, present, want) in fields {
                ctx.check(present == want, || {
                    format!(
                        "tid {} {name}: field {field} present: {present}, expected {want} \
                         (wall: {wall}, cpu: {cpu})\nthread: {t:#?}",
                        t.tid
                    )
                });
            }
        }
    }
}

/// For every exited thread and every function whose exit is hooked:
/// `calls == exits + unwound + unhooked` (nothing left open).
#[track_caller]
pub fn check_exit_balance(ctx: &Ctx, report: &Report) {
    for t in report.threads.iter().filter(|t| t.exited) {
        for (name, c) in &t.functions {
            let (Some(e), Some(u), Some(h)) = (c.exits, c.unwound, c.unhooked) else {
                continue;
            };
            ctx.check(c.calls == e + u + h, || {
                format!(
                    "exited tid {} {name}: calls {} != exits {e} + unwound {u} + unhooked {h}\n\
                     thread: {t:#?}",
                    t.tid, c.calls
                )
            });
        }
    }
}

/// Checks `functions[]`'s `wall_ns`/`cpu_ns` are the sums over the threads.
#[track_caller]
pub fn check_timer_totals(ctx: &Ctx, report: &Report) {
    for f in &report.functions {
        let rows = || {
            report
                .threads
                .iter()
                .filter_map(|t| t.functions.get(&f.name))
        };
        let timers = [
            (
                "wall_ns",
                f.wall_ns,
                rows().filter_map(|c| c.wall_ns).sum::<u64>(),
            ),
            (
                "cpu_ns",
                f.cpu_ns,
                rows().filter_map(|c| c.cpu_ns).sum::<u64>(),
            ),
        ];
        for (field, total, sum) in timers {
            if let Some(total) = total {
                ctx.check(total == sum, || {
                    format!(
                        "functions[] {}: {field} {total}, the threads' sum is {sum}",
                        f.name
                    )
                });
            }
        }
    }
}

/// Lines `tid role=ROLE index=I tid=T [key=value...]` a target printed on
/// stderr (the exits and exceptions targets): `(role, index) -> fields`.
pub fn tid_lines(text: &str) -> BTreeMap<(String, u64), BTreeMap<String, String>> {
    let mut m = BTreeMap::new();
    for l in text.lines() {
        let Some(rest) = l.strip_prefix("tid ") else {
            continue;
        };
        let kv: BTreeMap<String, String> = rest
            .split_whitespace()
            .filter_map(|f| f.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if let (Some(role), Some(index)) = (kv.get("role"), kv.get("index")) {
            if let Ok(i) = index.parse() {
                m.insert((role.clone(), i), kv);
            }
        }
    }
    m
}

#[track_caller]
pub fn parse_report(ctx: &Ctx, text: &str) -> Report {
    serde_json::from_str(text.trim())
        .unwrap_or_else(|e| ctx.fail(format!("weft's JSON report does not parse ({e}):\n{text}")))
}

/// Parses `0x...` hex.
#[track_caller]
pub fn parse_hex(ctx: &Ctx, s: &str) -> u64 {
    s.strip_prefix("0x")
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .unwrap_or_else(|| ctx.fail(format!("{s:?} is not a 0x-hex address")))
}

/// The fields of `weft: attached pid=PID threads=T functions=N`.
#[derive(Debug, Clone, Copy)]
pub struct Attached {
    pub pid: u32,
    pub threads: u32,
    pub functions: u32,
}

pub const ATTACHED_PREFIX: &str = "weft: attached ";

/// Waits for weft's `weft: attached ...` stderr line and parses it.
#[track_caller]
pub fn wait_attached(weft: &mut Proc) -> Attached {
    let line = weft.expect_line(Stream::Stderr, "the `weft: attached` line", |l| {
        l.starts_with(ATTACHED_PREFIX)
    });
    let mut kv = BTreeMap::new();
    for f in line[ATTACHED_PREFIX.len()..].split_whitespace() {
        let (k, v) = f
            .split_once('=')
            .unwrap_or_else(|| weft.ctx.fail(format!("bad attached line {line:?}")));
        let v: u32 = v
            .parse()
            .unwrap_or_else(|_| weft.ctx.fail(format!("bad number in {line:?}")));
        kv.insert(k.to_string(), v);
    }
    let keys: Vec<&str> = kv.keys().map(|k| k.as_str()).collect();
    if keys != ["functions", "pid", "threads"] {
        weft.ctx.fail(format!(
            "attached line {line:?} must have exactly pid=, threads=, functions="
        ));
    }
    Attached {
        pid: kv["pid"],
        threads: kv["threads"],
        functions: kv["functions"],
    }
}

/// Starts `weft attach -p PID ARGS...` and waits until it is attached;
/// checks the pid and function count of the attached line.
#[track_caller]
pub fn attach(ctx: &Ctx, pid: u32, args: &[&str], functions: u32) -> (Proc, Attached) {
    let p = pid.to_string();
    let mut all = vec!["attach", "-p", p.as_str()];
    all.extend_from_slice(args);
    let mut weft = ctx.weft(&all);
    let a = wait_attached(&mut weft);
    ctx.check(a.pid == pid, || {
        format!("attached line says pid={}, expected {pid}", a.pid)
    });
    ctx.check(a.functions == functions, || {
        format!(
            "attached line says functions={}, expected {functions}",
            a.functions
        )
    });
    // Exactly one such line.
    (weft, a)
}

/// Sends SIGINT to weft, waits for exit code 0 and returns its stdout.
#[track_caller]
pub fn detach_with_sigint(weft: &mut Proc) -> String {
    weft.signal(nix::sys::signal::Signal::SIGINT);
    weft.wait_code(0);
    check_single_attached_line(weft);
    weft.stdout_text()
}

/// After weft exited: its stderr has exactly one `weft: attached` line.
#[track_caller]
pub fn check_single_attached_line(weft: &Proc) {
    let n = weft
        .stderr_text()
        .lines()
        .filter(|l| l.starts_with(ATTACHED_PREFIX))
        .count();
    if n != 1 {
        weft.ctx.fail(format!(
            "weft printed {n} `weft: attached` lines, expected exactly one"
        ));
    }
}

/// Checks a failed weft run against the error contract: non-zero exit code
/// (not a signal, not a Rust panic), the first stderr line starts with
/// `weft: error:`, it is the only such line, and every stderr line starts
/// with `weft:`. Returns (error line, whole stderr).
#[track_caller]
pub fn expect_weft_error(weft: &mut Proc) -> (String, String) {
    let st = weft.wait_exit();
    let err = weft.stderr_text();
    let ctx = weft.ctx.clone();
    match st.code() {
        Some(0) => ctx.fail("weft succeeded, expected an error"),
        Some(101) => ctx.fail("weft exited 101 (a Rust panic?), expected a clean error"),
        Some(_) => {}
        None => ctx.fail(format!(
            "weft was killed by a signal ({st:?}), expected a clean error"
        )),
    }
    ctx.check(!err.contains("panicked"), || "weft panicked".into());
    let lines: Vec<&str> = err.lines().collect();
    ctx.check(!lines.is_empty(), || {
        "weft printed nothing on stderr".into()
    });
    ctx.check(lines[0].starts_with("weft: error:"), || {
        format!(
            "first stderr line {:?} must start with `weft: error:`",
            lines[0]
        )
    });
    let n = lines
        .iter()
        .filter(|l| l.starts_with("weft: error:"))
        .count();
    ctx.check(n == 1, || format!("{n} `weft: error:` lines, expected one"));
    for l in &lines {
        ctx.check(l.starts_with("weft:"), || {
            format!("stderr line {l:?} does not start with `weft:`")
        });
    }
    (lines[0].to_string(), err)
}

// ---------------------------------------------------------------------------
// The workers targets' output
// ---------------------------------------------------------------------------

/// One per-thread line of the workers targets.
#[derive(Deserialize, Debug, Clone)]
pub struct WorkerLine {
    pub phase: u64,
    pub index: u64,
    pub tid: i64,
    pub name: String,
    pub work_a: u64,
    pub work_b: u64,
    pub lib_work: u64,
    pub ok: bool,
}

impl WorkerLine {
    pub fn count(&self, func: &str) -> u64 {
        match func {
            "work_a" => self.work_a,
            "work_b" => self.work_b,
            "lib_work" => self.lib_work,
            _ => panic!("unknown function {func}"),
        }
    }
}

/// Calls thread `index` makes in phase `p`: (work_a, work_b, lib_work).
pub fn expected_counts(index: u64, p: u64) -> (u64, u64, u64) {
    (
        1000 * (index + 1) + 37 * p,
        500 * (index + 1) + 11 * p,
        250 * (index + 1) + 3 * p,
    )
}

#[track_caller]
pub fn worker_lines(ctx: &Ctx, text: &str) -> Vec<WorkerLine> {
    text.lines()
        .filter(|l| l.starts_with("{\"phase\""))
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| ctx.fail(format!("bad target line {l:?}: {e}")))
        })
        .collect()
}

/// Checks the target's own view of phase `phase`: `nthreads` threads, each
/// with the exact expected counts, results ok, distinct TIDs; no FAIL lines.
#[track_caller]
pub fn check_worker_phase(ctx: &Ctx, text: &str, phase: u64, nthreads: u64) -> Vec<WorkerLine> {
    ctx.check(!text.lines().any(|l| l.starts_with("FAIL")), || {
        "the target reported FAIL".into()
    });
    let lines: Vec<WorkerLine> = worker_lines(ctx, text)
        .into_iter()
        .filter(|l| l.phase == phase)
        .collect();
    ctx.check(lines.len() as u64 == nthreads, || {
        format!(
            "phase {phase}: {} thread lines, expected {nthreads}",
            lines.len()
        )
    });
    let mut tids = std::collections::BTreeSet::new();
    for (i, l) in lines.iter().enumerate() {
        let (a, b, lw) = expected_counts(l.index, phase);
        ctx.check(l.index == i as u64, || {
            format!("phase {phase}: unexpected index order {l:?}")
        });
        ctx.check(l.ok, || {
            format!(
                "phase {phase}: thread {} computed wrong results: {l:?}",
                l.index
            )
        });
        ctx.check((l.work_a, l.work_b, l.lib_work) == (a, b, lw), || {
            format!(
                "phase {phase}: thread {} counted {l:?}, expected ({a},{b},{lw})",
                l.index
            )
        });
        ctx.check(l.tid > 0 && tids.insert(l.tid), || {
            format!("bad or repeated tid in {l:?}")
        });
    }
    lines
}

/// What a thread should show in weft's report.
#[derive(Debug, Clone, Default)]
pub struct ExpThread {
    pub name: String,
    pub calls: BTreeMap<String, u64>,
}

/// Expected per-TID counts from worker lines (summed over the given lines).
pub fn expect_from_workers<'a>(
    lines: impl IntoIterator<Item = &'a WorkerLine>,
    funcs: &[&str],
) -> BTreeMap<i64, ExpThread> {
    let mut m: BTreeMap<i64, ExpThread> = BTreeMap::new();
    for l in lines {
        let e = m.entry(l.tid).or_default();
        e.name = l.name.clone();
        for f in funcs {
            *e.calls.entry(f.to_string()).or_default() += l.count(f);
        }
    }
    m
}

/// Checks weft's report against the target's own counts: every expected
/// thread appears exactly once (matched by TID) with exactly the expected
/// calls per function and the expected name; any other thread has zero calls;
/// `functions[]` has each function once with the total over threads.
#[track_caller]
pub fn check_report_counts(
    ctx: &Ctx,
    report: &Report,
    exp: &BTreeMap<i64, ExpThread>,
    funcs: &[&str],
) {
    let show = || format!("report: {report:#?}\nexpected: {exp:#?}");
    let mut seen = std::collections::BTreeSet::new();
    for t in &report.threads {
        ctx.check(seen.insert(t.tid), || {
            format!("tid {} appears twice in the report\n{}", t.tid, show())
        });
        let calls = |f: &str| t.functions.get(f).map(|c| c.calls).unwrap_or(0);
        match exp.get(&t.tid) {
            Some(e) => {
                for f in funcs {
                    let want = e.calls.get(*f).copied().unwrap_or(0);
                    ctx.check(calls(f) == want, || {
                        format!(
                            "tid {} ({}): weft counted {} calls of {f}, the target made {want}\n{}",
                            t.tid,
                            e.name,
                            calls(f),
                            show()
                        )
                    });
                }
                ctx.check(t.name == e.name, || {
                    format!(
                        "tid {}: weft says thread name {:?}, the target named it {:?}",
                        t.tid, t.name, e.name
                    )
                });
            }
            None => {
                for f in funcs {
                    ctx.check(calls(f) == 0, || {
                        format!(
                            "tid {} made no calls of {f} per the target, weft counted {}\n{}",
                            t.tid,
                            calls(f),
                            show()
                        )
                    });
                }
            }
        }
    }
    for (tid, e) in exp {
        if e.calls.values().any(|&c| c > 0) {
            ctx.check(seen.contains(tid), || {
                format!(
                    "tid {tid} ({}) is missing from the report\n{}",
                    e.name,
                    show()
                )
            });
        }
    }
    for f in funcs {
        let entries: Vec<&ReportFunction> =
            report.functions.iter().filter(|x| x.name == *f).collect();
        ctx.check(entries.len() == 1, || {
            format!(
                "function {f} appears {} times in functions[]\n{}",
                entries.len(),
                show()
            )
        });
        let total: u64 = exp
            .values()
            .map(|e| e.calls.get(*f).copied().unwrap_or(0))
            .sum();
        ctx.check(entries[0].calls == total, || {
            format!(
                "functions[] says {f} was called {} times, expected total {total}\n{}",
                entries[0].calls,
                show()
            )
        });
        parse_hex(ctx, &entries[0].address);
    }
}

/// Checks `functions[]` modules: `(name, module basename)`.
#[track_caller]
pub fn check_report_modules(ctx: &Ctx, report: &Report, want: &[(&str, &str)]) {
    for (name, module) in want {
        let f = report.functions.iter().find(|f| f.name == *name);
        ctx.check(f.map(|f| f.module.as_str()) == Some(*module), || {
            format!("function {name}: expected module {module:?}, report has {f:?}")
        });
    }
}

/// Checks a report in which no instrumented function ran.
#[track_caller]
pub fn check_report_zero(ctx: &Ctx, report: &Report, funcs: &[&str]) {
    check_report_counts(ctx, report, &BTreeMap::new(), funcs)
}

pub fn worker_modules(exe: &Path) -> Vec<(&'static str, String)> {
    let base = exe.file_name().unwrap().to_string_lossy().into_owned();
    vec![
        ("work_a", base.clone()),
        ("work_b", base),
        ("lib_work", "libwork.so".to_string()),
    ]
}

/// Parses `ready pid=P threads=T` (threads optional).
#[track_caller]
pub fn wait_ready(target: &mut Proc) -> (u32, Option<u32>) {
    let line = target.expect_stdout("the `ready` line", |l| l.starts_with("ready pid="));
    let mut pid = None;
    let mut threads = None;
    for f in line.split_whitespace().skip(1) {
        match f.split_once('=') {
            Some(("pid", v)) => pid = v.parse().ok(),
            Some(("threads", v)) => threads = v.parse().ok(),
            _ => {}
        }
    }
    let pid = pid.unwrap_or_else(|| target.ctx.fail(format!("bad ready line {line:?}")));
    target.ctx.check(pid == target.pid, || {
        format!("ready line says pid {pid}, spawned pid {}", target.pid)
    });
    (pid, threads)
}

// ---------------------------------------------------------------------------
// /proc helpers (only ever on processes the test started)
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub perms: String,
    pub path: String,
}

pub fn maps_text(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default()
}

pub fn mappings(pid: u32) -> Vec<Mapping> {
    maps_text(pid)
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let range = it.next()?;
            let perms = it.next()?.to_string();
            let path = it.nth(3).unwrap_or("").to_string();
            let (s, e) = range.split_once('-')?;
            Some(Mapping {
                start: u64::from_str_radix(s, 16).ok()?,
                end: u64::from_str_radix(e, 16).ok()?,
                perms,
                path,
            })
        })
        .collect()
}

/// True if `addr` lies in an executable mapping whose file name satisfies `file`.
pub fn addr_in_exec_mapping(pid: u32, addr: u64, file: impl Fn(&str) -> bool) -> bool {
    mappings(pid).iter().any(|m| {
        m.perms.contains('x')
            && addr >= m.start
            && addr < m.end
            && file(
                Path::new(&m.path)
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_default()
                    .as_str(),
            )
    })
}

/// Every thread of `pid`: not traced by anyone and not stopped.
#[track_caller]
pub fn check_not_traced_nor_stopped(ctx: &Ctx, pid: u32) {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap_or_else(|e| ctx.fail(format!("cannot list /proc/{pid}/task: {e}")));
    for t in tasks.flatten() {
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        for l in status.lines() {
            if let Some(v) = l.strip_prefix("TracerPid:") {
                ctx.check(v.trim() == "0", || {
                    format!("task {:?} of {pid} is still traced: {l}", t.file_name())
                });
            }
            if let Some(v) = l.strip_prefix("State:") {
                let v = v.trim();
                ctx.check(
                    !v.starts_with('T') && !v.starts_with('t') && !v.starts_with('Z'),
                    || format!("task {:?} of {pid} is in state {v}", t.file_name()),
                );
            }
        }
    }
}

pub fn thread_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------
// Deterministic randomness
// ---------------------------------------------------------------------------

/// xorshift64*: a tiny deterministic PRNG (no dependency needed), so that a
/// failing input can be reproduced from its seed.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.index(xs.len())]
    }
}

/// Splits weft run's stdout into the target's part (up to and including its
/// `done` line) and what follows (the report).
#[track_caller]
pub fn split_at_done(ctx: &Ctx, out: &str) -> (String, String) {
    let mut target = String::new();
    let mut rest = out;
    loop {
        let Some(nl) = rest.find('\n') else {
            ctx.fail("no `done` line from the target in weft's stdout");
        };
        let line = &rest[..nl];
        target.push_str(line);
        target.push('\n');
        rest = &rest[nl + 1..];
        if line == "done" {
            return (target, rest.to_string());
        }
    }
}

/// Whether the tests run as root.
pub fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Whether process `pid` has a socket listening on 127.0.0.1:`port`.
pub fn listens_on(pid: u32, port: u16) -> bool {
    let local = format!("0100007F:{port:04X}");
    let tcp = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    // Inodes of the listening sockets on that address (state 0A).
    let inodes: Vec<String> = tcp
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 9 && f[1] == local && f[3] == "0A").then(|| format!("socket:[{}]", f[9]))
        })
        .collect();
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten().any(|e| {
                std::fs::read_link(e.path())
                    .is_ok_and(|l| inodes.iter().any(|i| l.as_os_str() == i.as_str()))
            })
        })
        .unwrap_or(false)
}

/// A port free on loopback just now.
pub fn free_port() -> u16 {
    let l =
        std::net::TcpListener::bind("127.0.0.1:0").expect("binding an ephemeral port on 127.0.0.1");
    l.local_addr().expect("local_addr").port()
}

/// `n` as weft's tables print it: 3,074.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
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
#[allow(dead_code)]
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
