//! What the examples share: building the example server and a probe
//! library with the system's C compiler, and starting the server.

#![allow(dead_code)] // each example uses a part

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// A scratch directory for this example's builds.
pub fn work_dir(example: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weft-example-{example}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("creating a scratch directory");
    dir
}

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

fn cc(args: &[&str]) {
    let status = Command::new("cc")
        .args(args)
        .status()
        .expect("running cc (install a C compiler: apt-get install gcc)");
    assert!(status.success(), "cc {args:?} failed");
}

/// Builds examples/c/server.c into `dir`.
pub fn build_server(dir: &Path) -> PathBuf {
    build_program(dir, "server")
}

/// Builds the program examples/c/`name`.c into `dir`.
pub fn build_program(dir: &Path, name: &str) -> PathBuf {
    let exe = dir.join(name);
    let src = examples_dir().join(format!("c/{name}.c"));
    cc(&[
        "-O2",
        "-pthread",
        "-o",
        exe.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    exe
}

/// Builds examples/c/`name`.c into a shared library in `dir`.
pub fn build_probes(dir: &Path, name: &str) -> PathBuf {
    let lib = dir.join(format!("lib{name}.so"));
    let src = examples_dir().join(format!("c/{name}.c"));
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("../include");
    cc(&[
        "-O2",
        "-shared",
        "-fPIC",
        "-I",
        include.to_str().unwrap(),
        "-o",
        lib.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    lib
}

/// The example server, running and waiting for `go`; killed on drop.
pub struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Server {
    /// Starts `exe` with `workers` threads serving `requests` each.
    pub fn start(exe: &Path, workers: u32, requests: u64) -> Server {
        let mut child = Command::new(exe)
            .args([workers.to_string(), requests.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the server");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut s = Server {
            child,
            stdin,
            stdout,
        };
        let ready = s.line();
        assert!(ready.starts_with("ready"), "the server said {ready:?}");
        s
    }

    /// Its process ID.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends a line.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").expect("writing to the server");
        stdin.flush().expect("flushing");
    }

    /// Its next output line (panics at end of output).
    pub fn line(&mut self) -> String {
        let mut l = String::new();
        let n = self.stdout.read_line(&mut l).expect("reading the server");
        assert!(n > 0, "the server's output ended");
        l.trim_end().to_string()
    }

    /// Its lines up to and including `done`.
    pub fn until_done(&mut self) -> Vec<String> {
        let mut lines = Vec::new();
        loop {
            let l = self.line();
            let done = l == "done";
            lines.push(l);
            if done {
                return lines;
            }
        }
    }

    /// Lets it exit (closes its stdin) and waits.
    pub fn finish(mut self) -> std::process::ExitStatus {
        self.stdin = None;
        self.child.wait().expect("waiting for the server")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Only our own child, by PID: never left running.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
