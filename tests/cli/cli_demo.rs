//! `weft demo`, the README's first command: it starts its bundled server,
//! attaches, detaches, and checks weft's counts against the server's own.

use std::process::Command;

#[test]
fn demo_counts_match_the_servers_own() {
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["demo", "--threads", "3", "--requests", "4000"])
        .output()
        .expect("running weft demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "weft demo failed: {}\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("demo: OK"),
        "no OK verdict:\n{stdout}\n{stderr}"
    );
    assert!(!stdout.contains("MISMATCH"), "{stdout}");
    // The final table lists the three workers by name.
    for worker in ["worker-0", "worker-1", "worker-2"] {
        assert!(stdout.contains(worker), "{worker} missing from:\n{stdout}");
    }
}

#[test]
fn demo_rejects_bad_thread_counts() {
    let out = Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["demo", "--threads", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("weft: error:"), "{stderr}");
}
