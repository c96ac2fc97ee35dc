//! Whole-process overhead of weft's call counters, measured side by side in
//! one run: the same target uninstrumented and under `weft run -f work`, at
//! 1, 2 and 4 threads. Prints nanoseconds per call, the added cost, and the
//! ratio of the 2-thread to the 1-thread added cost (1.0 = no contention:
//! per-thread rows share no cache line).
//!
//! `cargo bench --bench overhead` (set `WEFT_BENCH_QUICK=1` for a short run).
//! The target is `benches/overhead_target.c`, built with gcc -O2.

use std::path::{Path, PathBuf};
use std::process::Command;

fn build_target() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("weft-bench");
    std::fs::create_dir_all(&dir).expect("creating the bench directory");
    let exe = dir.join("overhead_target");
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../benches/overhead_target.c");
    let status = Command::new("gcc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("running gcc (install it: apt-get install gcc)");
    assert!(status.success(), "building {}", src.display());
    exe
}

/// ns per call as the target measured it.
fn measure(exe: &Path, weft: Option<&str>, threads: usize, calls: u64) -> f64 {
    let (program, args): (String, Vec<String>) = match weft {
        None => (
            exe.display().to_string(),
            vec![threads.to_string(), calls.to_string()],
        ),
        Some(weft) => (
            weft.to_string(),
            vec![
                "run".into(),
                "-f".into(),
                "work".into(),
                "-o".into(),
                "/dev/null".into(),
                "--".into(),
                exe.display().to_string(),
                threads.to_string(),
                calls.to_string(),
            ],
        ),
    };
    let out = Command::new(&program)
        .args(&args)
        .output()
        .expect("running the target");
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .expect("the target prints ns per call")
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test` runs benches in test mode
    // with no arguments besides filters: keep that quick too.
    let quick =
        std::env::var_os("WEFT_BENCH_QUICK").is_some() || !std::env::args().any(|a| a == "--bench");
    let calls: u64 = if quick { 200_000 } else { 20_000_000 };
    let weft = env!("CARGO_BIN_EXE_weft");
    let exe = build_target();
    println!(
        "weft call-counter overhead ({} calls per thread per repetition, best of 3)",
        calls
    );
    println!(
        "{:>7}  {:>12}  {:>12}  {:>10}",
        "threads", "plain ns", "weft ns", "added ns"
    );
    let mut added = Vec::new();
    for threads in [1usize, 2, 4] {
        let plain = measure(&exe, None, threads, calls);
        let counted = measure(&exe, Some(weft), threads, calls);
        added.push(counted - plain);
        println!(
            "{threads:>7}  {plain:>12.2}  {counted:>12.2}  {:>10.2}",
            counted - plain
        );
    }
    if added[0] > 0.05 {
        println!(
            "added cost at 2 threads / 1 thread: {:.2}",
            added[1] / added[0]
        );
    }
    println!("(4 threads on a 2-core machine time-share the cores: compare 1 and 2)");
}
