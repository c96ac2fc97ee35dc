//! What a kernel probe adds to each call it sees, per mechanism, side by
//! side with the uninstrumented call in the same run (issue #15).
//!
//! The call is a one-byte `read(2)` of `/dev/zero` (benches/kernel_cost.c):
//! almost no work of its own, so what a probe adds shows. Measured:
//! - on this machine's kernel: `syscall:read` (the `raw_syscalls`
//!   tracepoints) in the target itself; `syscall:openat` (the tracepoints
//!   on, `read` not wanted: the table lookup); and in *another* process
//!   while weft probes `syscall:read` of a sleeping one — the cost every
//!   process of the machine pays, since a tracepoint runs for all;
//! - in Debian's stock kernel under QEMU (TCG: emulated, so only the
//!   ratios mean anything), the same plus `kernel:vfs_read` by fentry/fexit
//!   and by kprobe/kretprobe, in the target and in another process.
//!
//! `cargo bench -p weft-cli --bench kernel`; `WEFT_BENCH_QUICK=1` for a short
//! run (CI). Needs root (BPF); the guest part needs QEMU
//! (tests/qemu/guest.sh), else it is skipped with the reason.

// The tests' QEMU guest harness. Public, as support is in the tests: this
// bench uses a part of it, and rustc does not report a public module's
// public items as dead code.
#[path = "../tests/support/qemu.rs"]
pub mod qemu;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn quick() -> bool {
    std::env::var_os("WEFT_BENCH_QUICK").is_some()
}

fn weft() -> &'static str {
    env!("CARGO_BIN_EXE_weft")
}

fn build_target() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("weft-bench");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("kernel_cost");
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../benches/kernel_cost.c");
    let status = Command::new("gcc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("running gcc (install it: apt-get install gcc)");
    assert!(status.success(), "building {}", src.display());
    exe
}

fn ns_per_call(stdout: &str) -> f64 {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("ns_per_call ")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no ns_per_call in {stdout:?}"))
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpu}, {} CPUs, kernel {}", num_cpus(), kernel.trim())
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The target alone, or under `weft run ARGS`.
fn run(target: &Path, calls: &str, weft_args: Option<&[&str]>) -> f64 {
    let out = match weft_args {
        None => Command::new(target).arg(calls).output().unwrap(),
        Some(args) => Command::new(weft())
            .args(["run"])
            .args(args)
            .args(["--format", "json", "-o", "/dev/null", "--"])
            .arg(target)
            .arg(calls)
            .stderr(Stdio::null())
            .output()
            .unwrap(),
    };
    assert!(out.status.success(), "{out:?}");
    ns_per_call(&String::from_utf8_lossy(&out.stdout))
}

/// The target alone while weft probes `pattern` in another process.
fn run_beside(target: &Path, calls: &str, pattern: &str) -> f64 {
    let mut sleeper = Command::new("sleep").arg("600").spawn().unwrap();
    let mut w = Command::new(weft())
        .args(["attach", "-p", &sleeper.id().to_string(), "-f", pattern])
        .args(["--format", "json", "-o", "/dev/null"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(w.stderr.take().unwrap()).lines();
    for line in lines.by_ref() {
        if line.unwrap().contains("attached pid=") {
            break;
        }
    }
    let ns = run(target, calls, None);
    // SIGTERM: weft detaches and reports (to /dev/null).
    let _ = Command::new("kill")
        .args(["-TERM", &w.id().to_string()])
        .status();
    let _ = w.wait();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    ns
}

fn table(title: &str, rows: &[(String, f64)]) {
    let base = rows[0].1;
    println!("{title}");
    println!(
        "  {:<58} {:>10} {:>10} {:>7}",
        "", "ns/call", "added ns", "ratio"
    );
    for (name, ns) in rows {
        println!(
            "  {:<58} {:>10.1} {:>10.1} {:>7.2}",
            name,
            ns,
            ns - base,
            ns / base
        );
    }
}

const GUEST_SCRIPT: &str = r#"
W=/opt/weft/weft; K=/opt/weft/kernel_cost; N=$1
one() { echo "RESULT $1 $(grep ns_per_call /tmp/o | cut -d' ' -f2)"; }
$K $N > /tmp/o; one plain
$W run -f syscall:read --format json -o /dev/null -- $K $N > /tmp/o 2>/dev/null; one syscall
$W run -f kernel:vfs_read --format json -o /dev/null -- $K $N > /tmp/o 2>/dev/null; one fentry
WEFT_KERNEL_MECHANISM=kprobe $W run -f kernel:vfs_read --format json -o /dev/null -- $K $N > /tmp/o 2>/dev/null; one kprobe
beside() {
  rm -f /tmp/a
  sleep 600 & s=$!
  $W attach -p $s -f "$2" --format json -o /dev/null 2> /tmp/a &
  a=$!
  while ! grep -q attached /tmp/a; do
    if ! kill -0 $a 2>/dev/null; then echo "weft attach failed:"; cat /tmp/a; exit 1; fi
    sleep 0.1
  done
  $K $N > /tmp/o; one "$1"
  # TERM: a background job of a script ignores INT from birth.
  kill -TERM $a; wait $a; kill $s
}
beside other-syscall syscall:read
beside other-fentry kernel:vfs_read
WEFT_KERNEL_MECHANISM=kprobe beside other-kprobe kernel:vfs_read
"#;

fn guest(target: &Path, calls: &str) -> Result<Vec<(String, f64)>, String> {
    if let Some(why) = qemu::guest_unavailable() {
        return Err(why);
    }
    let out = qemu::run_in_guest(
        &[
            (Path::new(weft()), "/opt/weft/weft"),
            (target, "/opt/weft/kernel_cost"),
        ],
        &[],
        &["sh", "-c", GUEST_SCRIPT, "sh", calls],
        Duration::from_secs(900),
    );
    if out.status != 0 {
        return Err(format!(
            "the guest failed ({}): {}{}",
            out.status, out.stdout, out.stderr
        ));
    }
    let value = |name: &str| -> Result<f64, String> {
        out.stdout
            .lines()
            .find_map(|l| {
                let rest = l.strip_prefix("RESULT ")?;
                let (n, v) = rest.split_once(' ')?;
                (n == name).then(|| v.trim().parse().ok())?
            })
            .ok_or_else(|| format!("no {name} in the guest's output: {}", out.stdout))
    };
    Ok(vec![
        ("uninstrumented".into(), value("plain")?),
        (
            "syscall:read (raw_syscalls tracepoints)".into(),
            value("syscall")?,
        ),
        ("kernel:vfs_read by fentry/fexit".into(), value("fentry")?),
        (
            "kernel:vfs_read by kprobe/kretprobe".into(),
            value("kprobe")?,
        ),
        (
            "another process's syscall:read probed (tracepoints)".into(),
            value("other-syscall")?,
        ),
        (
            "another process's vfs_read probed (fentry)".into(),
            value("other-fentry")?,
        ),
        (
            "another process's vfs_read probed (kprobe)".into(),
            value("other-kprobe")?,
        ),
    ])
}

fn main() {
    // `cargo test` runs benches as tests with --bench absent: keep short.
    let calls = if quick() { "20000" } else { "300000" };
    println!("weft kernel probes: added cost per call; {}", machine());
    if !std::fs::metadata("/proc/self").is_ok_and(|m| {
        use std::os::unix::fs::MetadataExt;
        m.uid() == 0
    }) {
        println!("skipped: kernel probes need root");
        return;
    }
    let target = build_target();
    let plain = run(&target, calls, None);
    let own = run(&target, calls, Some(&["-f", "syscall:read"]));
    let unwanted = run(&target, calls, Some(&["-f", "syscall:openat"]));
    let beside = run_beside(&target, calls, "syscall:read");
    table(
        "this machine's kernel (one-byte read of /dev/zero):",
        &[
            ("uninstrumented".into(), plain),
            ("syscall:read (raw_syscalls tracepoints)".into(), own),
            (
                "syscall:openat probed, read passes the filter".into(),
                unwanted,
            ),
            (
                "another process's syscall:read probed (tracepoints)".into(),
                beside,
            ),
        ],
    );
    let guest_calls = if quick() { "5000" } else { "50000" };
    match guest(&target, guest_calls) {
        Ok(rows) => table(
            "Debian 6.1 under QEMU TCG (emulated: compare ratios, not ns):",
            &rows,
        ),
        Err(why) => println!("guest part skipped: {why}"),
    }
}
