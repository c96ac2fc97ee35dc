//! The kernel case study (docs/kernel.md), after KernInst's web proxy: a
//! threaded file server in front of a disk cache of many small files in a
//! deep directory tree (examples/c/cache_server.c), under a bounded load
//! from four loopback clients. weft times its user functions and, in the
//! same report, the system calls each worker makes, attributed to the user
//! function it was in: where each thread's time goes, user and kernel.
//! The figures point at opening cache files; the server's `--keep-open`
//! (each worker keeps the descriptors it opened) is the change they
//! suggest, measured the same way after.
//!
//! Run: `cargo run --example kernel_cache` (as root: kernel probes need
//! BPF). It checks its own result: with --keep-open, `openat` almost
//! vanishes from `cache_lookup` and a request takes less time.

mod common;

use anyhow::{bail, Context, Result};
use common::{build_program, work_dir};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use weft::kernel::{Capabilities, KernelPattern, Session};
use weft::{Metrics, Pattern, Process, Report};

const OBJECTS: u32 = 400;
const OBJECT_SIZE: usize = 2048;
const CLIENTS: usize = 4;
const REQUESTS: usize = 3000;
const WORKERS: &str = "4";

/// The object's path, as cache_server.c's cache_path() makes it.
fn object_path(root: &Path, key: u32) -> PathBuf {
    let h = key.wrapping_mul(2_654_435_761);
    let mut p = root.to_path_buf();
    for level in 0..8 {
        p.push(format!("{:02x}", (h >> (level * 4)) & 0xff));
    }
    p.push(key.to_string());
    p
}

fn fill_cache(root: &Path) -> Result<()> {
    for key in 0..OBJECTS {
        let path = object_path(root, key);
        std::fs::create_dir_all(path.parent().unwrap())?;
        std::fs::write(&path, vec![(key % 251) as u8; OBJECT_SIZE])?;
    }
    Ok(())
}

/// Each client: its own connection, REQUESTS requests for keys from a
/// fixed pseudo-random sequence, every reply read and checked.
fn load(port: u16) -> Result<()> {
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            std::thread::spawn(move || -> Result<()> {
                let s = TcpStream::connect(("127.0.0.1", port))?;
                s.set_nodelay(true)?;
                let mut reader = BufReader::new(s.try_clone()?);
                let mut writer = s;
                let mut x = 12_345u32 + c as u32;
                let mut body = vec![0u8; OBJECT_SIZE];
                for _ in 0..REQUESTS {
                    x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    let key = (x >> 8) % OBJECTS;
                    writeln!(writer, "GET {key}")?;
                    let mut head = String::new();
                    reader.read_line(&mut head)?;
                    let size: usize = head.trim().parse()?;
                    if size != OBJECT_SIZE {
                        bail!("object {key}: {size} bytes, expected {OBJECT_SIZE}");
                    }
                    reader.read_exact(&mut body)?;
                    if body[0] != (key % 251) as u8 {
                        bail!("object {key}: wrong bytes");
                    }
                }
                Ok(())
            })
        })
        .collect();
    for c in clients {
        c.join().expect("a client panicked")?;
    }
    Ok(())
}

struct Figures {
    requests: u64,
    handle_ns: u64,
    lookup_ns: u64,
    open_calls: u64,
    open_ns: u64,
    read_ns: u64,
}

fn figures(report: &Report) -> Figures {
    let f = |name: &str| report.functions.iter().find(|f| f.name == name);
    let by = |name: &str, user: &str| {
        f(name)
            .and_then(|f| f.by_user_function.get(user))
            .map_or((0, 0), |c| (c.calls, c.wall_ns.unwrap_or(0)))
    };
    let (open_calls, open_ns) = by("syscall:openat", "cache_lookup");
    let read_ns = by("syscall:read", "cache_lookup").1 + by("syscall:pread64", "cache_lookup").1;
    Figures {
        requests: f("handle_request").map_or(0, |f| f.calls),
        handle_ns: f("handle_request").and_then(|f| f.wall_ns).unwrap_or(0),
        lookup_ns: f("cache_lookup").and_then(|f| f.wall_ns).unwrap_or(0),
        open_calls,
        open_ns,
        read_ns,
    }
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        // Our own child, by its PID.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn measure(exe: &Path, root: &Path, keep_open: bool, caps: &Capabilities) -> Result<Figures> {
    let mut cmd = Command::new(exe);
    cmd.arg(root).arg(WORKERS).stdout(Stdio::piped());
    if keep_open {
        cmd.arg("--keep-open");
    }
    let mut server = Server(cmd.spawn().context("starting cache_server")?);
    let mut line = String::new();
    BufReader::new(server.0.stdout.take().unwrap()).read_line(&mut line)?;
    let port: u16 = line
        .trim()
        .strip_prefix("port ")
        .context("cache_server did not say its port")?
        .parse()?;
    let pid = server.0.id() as i32;

    let mut process = Process::open(pid)?;
    let patterns: Vec<Pattern> = ["handle_request", "cache_lookup", "send_reply"]
        .iter()
        .map(|p| Pattern::parse(p))
        .collect::<Result<_, _>>()?;
    let functions = process.find_functions(&patterns)?;
    process.prepare(&functions)?;
    let mut held = process.hold()?;
    held.insert(&functions, Metrics::ALL)?;
    held.release()?;
    let kernel: Vec<KernelPattern> = [
        "syscall:openat",
        "syscall:read",
        "syscall:pread64",
        "syscall:close",
        "syscall:sendto",
    ]
    .iter()
    .map(|p| KernelPattern::parse(p).expect("a kernel pattern"))
    .collect::<Result<_, _>>()?;
    let session = Session::start(pid, &kernel, caps, process.runtime_tls_offset())?;

    load(port)?;

    let report = process.report_with_kernel(&session)?;
    drop(session);
    let mut held = process.hold()?;
    held.remove_all()?;
    held.release()?;
    println!(
        "\n== cache_server{} ==",
        if keep_open { " --keep-open" } else { "" }
    );
    print!("{}", report.to_table());
    Ok(figures(&report))
}

fn per_request(total: u64, requests: u64) -> f64 {
    total as f64 / requests.max(1) as f64 / 1000.0
}

fn main() -> Result<()> {
    if !std::fs::metadata("/proc/self").is_ok_and(|m| {
        use std::os::unix::fs::MetadataExt;
        m.uid() == 0
    }) {
        println!("kernel_cache: skipped, kernel probes need root (or CAP_BPF and CAP_PERFMON)");
        return Ok(());
    }
    let dir = work_dir("kernel_cache");
    let exe = build_program(&dir, "cache_server");
    let root = dir.join("cache");
    fill_cache(&root)?;
    let caps = Capabilities::probe();
    println!("{}", caps.line());

    let before = measure(&exe, &root, false, &caps)?;
    let after = measure(&exe, &root, true, &caps)?;

    println!("\n== per request, all workers (µs) ==");
    println!(
        "{:<24} {:>10} {:>12} {:>14} {:>12} {:>10}",
        "", "handle", "cache_lookup", "openat (calls)", "openat", "read"
    );
    for (name, f) in [("opening every time", &before), ("--keep-open", &after)] {
        println!(
            "{:<24} {:>10.2} {:>12.2} {:>14} {:>12.2} {:>10.2}",
            name,
            per_request(f.handle_ns, f.requests),
            per_request(f.lookup_ns, f.requests),
            f.open_calls,
            per_request(f.open_ns, f.requests),
            per_request(f.read_ns, f.requests),
        );
    }
    let share = |f: &Figures| f.open_ns as f64 / f.handle_ns.max(1) as f64;
    println!(
        "openat's share of a request: {:.0}% before, {:.0}% after",
        100.0 * share(&before),
        100.0 * share(&after)
    );

    let expected = (CLIENTS * REQUESTS) as u64;
    if before.requests != expected || after.requests != expected {
        bail!(
            "handle_request counted {} and {} times, the clients made {expected} requests each run",
            before.requests,
            after.requests
        );
    }
    if before.open_calls != expected {
        bail!(
            "cache_lookup opened {} files for {expected} requests",
            before.open_calls
        );
    }
    // Each object is opened once (twice at most when two workers race).
    if after.open_calls > u64::from(OBJECTS) * 2 {
        bail!("--keep-open still opened {} files", after.open_calls);
    }
    if per_request(after.handle_ns, after.requests)
        >= per_request(before.handle_ns, before.requests)
    {
        bail!("keeping descriptors open did not make requests faster");
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
