//! Running a command in a QEMU guest that boots Debian 12's stock kernel
//! (6.1, with kprobes, BPF trampolines and BTF), through
//! `tests/qemu/guest.sh`: for tests of kernel features the host's kernel
//! lacks. See tests/qemu/README.md.
//!
//! [`guest_unavailable`] says whether the guest can run here (QEMU installed
//! and the kernel cached, downloading it the first time); [`run_in_guest`]
//! boots it once for one command.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

/// The exit status guest.sh gives when the guest stopped (kernel panic,
/// failed boot) without reporting the command's exit status.
pub const GUEST_FAILED: i32 = 125;

/// What a command run in the guest left.
#[derive(Debug, Clone)]
pub struct GuestOutput {
    /// The command's stdout and stderr, merged in the order written (both
    /// went to the guest's console), without the kernel's boot messages.
    pub stdout: String,
    /// guest.sh's own messages: why the guest failed or timed out, with the
    /// console's last lines.
    pub stderr: String,
    /// The command's exit status; 124 (guest.sh's timeout killed QEMU) or
    /// [`GUEST_FAILED`] (with `stderr` saying so) when the guest did not
    /// report one, -1 if guest.sh itself was killed.
    pub status: i32,
}

impl GuestOutput {
    /// The host's delay between the guest's host marks `start` and `end`
    /// (`@@host-mark NAME@@` lines, see tests/qemu/guest.sh), in ns: how
    /// long QEMU's threads waited for a host CPU or were stolen from in
    /// that span, time the guest's clocks counted although it did not
    /// run. With several `start` marks (a step retried), the last before
    /// `end` counts.
    pub fn host_delay_ns(&self, start: &str, end: &str) -> u64 {
        let mut at_start = None;
        for line in self.stderr.lines() {
            let Some(mark) = line.strip_prefix("guest.sh: host-mark ") else {
                continue;
            };
            let (name, ns) = mark
                .split_once(' ')
                .and_then(|(name, ns)| Some((name, ns.parse::<u64>().ok()?)))
                .unwrap_or_else(|| panic!("a malformed host mark: {line:?}"));
            if name == start {
                at_start = Some(ns);
            } else if name == end {
                if let Some(from) = at_start {
                    return ns.saturating_sub(from);
                }
            }
        }
        panic!(
            "no host marks {start} then {end} in guest.sh's messages:\n{}",
            self.stderr
        )
    }
}

/// `tests/qemu/guest.sh`.
pub fn guest_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/qemu/guest.sh")
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| {
            let p = dir.join(program);
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// Why the guest cannot run here, or `None` when it can: QEMU
/// (qemu-system-x86_64) is on PATH and `guest.sh prepare` succeeded. The
/// first call runs `prepare` (downloading the kernel and busybox the first
/// time, ~80 MB); later calls in the process return its result.
pub fn guest_unavailable() -> Option<String> {
    static WHY: OnceLock<Option<String>> = OnceLock::new();
    WHY.get_or_init(|| {
        if !on_path("qemu-system-x86_64") {
            return Some(
                "qemu-system-x86_64 is not on PATH (apt-get install qemu-system-x86)".to_string(),
            );
        }
        let script = guest_script();
        match Command::new("bash")
            .arg(&script)
            .arg("prepare")
            .stdin(Stdio::null())
            .output()
        {
            Err(e) => Some(format!("cannot run {}: {e}", script.display())),
            Ok(out) if !out.status.success() => Some(format!(
                "{} prepare failed ({}):\n{}{}",
                script.display(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )),
            Ok(_) => None,
        }
    })
    .clone()
}

fn read_all(mut r: impl Read + Send + 'static) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// Boots the guest and runs `command` in it as root, with `files` (host
/// path, absolute guest path; directories too) and the shared libraries
/// their ELF files need copied in, and `env` exported. `timeout` bounds the
/// whole boot and run (a boot takes ~5 s); past it QEMU is killed and the
/// status is 124.
///
/// A guest whose kernel reports a soft lockup (it panics at once, see
/// guest.sh) is booted once more, its output printed to stderr: under
/// multi-threaded TCG on a starved host, Debian's 6.1 once locked up both
/// guest CPUs while patching its own text, an emulator hazard rather than
/// anything the command did (a second lockup is returned as it is).
///
/// Call [`guest_unavailable`] first: this one panics if guest.sh cannot be
/// started.
pub fn run_in_guest(
    files: &[(&Path, &str)],
    env: &[(&str, &str)],
    command: &[&str],
    timeout: Duration,
) -> GuestOutput {
    let first = boot_once(files, env, command, timeout);
    let locked_up = |o: &GuestOutput| {
        o.status == GUEST_FAILED
            && (o.stdout.contains("soft lockup") || o.stderr.contains("soft lockup"))
    };
    if !locked_up(&first) {
        return first;
    }
    eprintln!(
        "run_in_guest: the guest's kernel locked up; booting it once more. Its output:\n{}\n{}",
        first.stdout, first.stderr
    );
    boot_once(files, env, command, timeout)
}

fn boot_once(
    files: &[(&Path, &str)],
    env: &[(&str, &str)],
    command: &[&str],
    timeout: Duration,
) -> GuestOutput {
    assert!(!command.is_empty(), "run_in_guest: no command");
    let script = guest_script();
    let secs = timeout.as_secs().max(1);
    let mut cmd = Command::new("bash");
    cmd.arg(&script)
        .arg("run")
        .arg("--timeout")
        .arg(secs.to_string());
    for (host, guest) in files {
        assert!(
            guest.starts_with('/'),
            "run_in_guest: guest path {guest:?} is not absolute"
        );
        let mut spec = host.as_os_str().to_owned();
        spec.push(":");
        spec.push(guest);
        cmd.arg("--file").arg(spec);
    }
    for (name, value) in env {
        cmd.arg("--env").arg(format!("{name}={value}"));
    }
    cmd.arg("--").args(command);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    let out = read_all(child.stdout.take().unwrap());
    let err = read_all(child.stderr.take().unwrap());

    // guest.sh keeps its own timeout; this one is for guest.sh itself hanging
    // (building a huge initramfs, say). SIGTERM first: its trap kills QEMU.
    let deadline = Instant::now() + Duration::from_secs(secs + 60);
    let mut terminated = false;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for guest.sh") {
            break status;
        }
        let now = Instant::now();
        if now >= deadline && !terminated {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
            terminated = true;
        } else if now >= deadline + Duration::from_secs(10) {
            let _ = child.kill();
        }
        thread::sleep(Duration::from_millis(50));
    };
    let stdout = out.join().unwrap_or_default();
    let mut stderr = err.join().unwrap_or_default();
    if terminated {
        stderr.push_str("run_in_guest: guest.sh outlived its own timeout; terminated\n");
    }
    GuestOutput {
        stdout,
        stderr,
        status: status.code().unwrap_or(-1),
    }
}
