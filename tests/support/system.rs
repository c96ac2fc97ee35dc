//! The machine and its processes as /proc shows them (only ever processes
//! the test started): mappings, threads, tracers, listening sockets,
//! stolen time, tasks waiting for a CPU; and the binary's turn for tests
//! that need the machine.

use super::process::Ctx;
use std::path::Path;
use std::sync::Mutex;

/// The machine's CPU pressure (`/proc/pressure/cpu`, "some"): how long
/// runnable tasks waited for a CPU, read at a start.
pub struct CpuPressure {
    at: std::time::Instant,
    stalled_us: Option<u64>,
}

impl CpuPressure {
    pub fn now() -> CpuPressure {
        CpuPressure {
            at: std::time::Instant::now(),
            stalled_us: Self::read(),
        }
    }

    fn read() -> Option<u64> {
        let text = std::fs::read_to_string("/proc/pressure/cpu").ok()?;
        let some = text.lines().find(|l| l.starts_with("some "))?;
        some.split_whitespace()
            .find_map(|kv| kv.strip_prefix("total="))?
            .parse()
            .ok()
    }

    /// The share of the time since the start during which some task
    /// waited for a CPU (0 when the kernel does not tell).
    pub fn share_since(&self) -> f64 {
        let (Some(before), Some(after)) = (self.stalled_us, Self::read()) else {
            return 0.0;
        };
        let wall = self.at.elapsed().as_micros().max(1) as f64;
        after.saturating_sub(before) as f64 / wall
    }
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

/// Waits until process `pid` (one the test started) has its C library
/// mapped: a program attached to while its dynamic loader still runs has
/// no `malloc` to find yet.
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

/// Where `f` is in `pid`, as `weft list` says (`MODULE ADDRESS SIZE NAME`).
pub fn address_of(ctx: &Ctx, pid: u32, f: &str) -> u64 {
    let p = pid.to_string();
    let mut w = ctx.weft(&["list", "-p", &p, f]);
    w.wait_code(0);
    let out = w.stdout_text();
    out.lines()
        .find_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            (fields.len() == 4 && fields[3] == f)
                .then(|| u64::from_str_radix(fields[1].trim_start_matches("0x"), 16).ok())
                .flatten()
        })
        .unwrap_or_else(|| panic!("weft list does not give {f}'s address: {out}"))
}

/// The first bytes of `pid`'s code at `at`.
pub fn code_at(pid: u32, at: u64) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).expect("the target's memory");
    mem.seek(SeekFrom::Start(at)).expect("seek");
    let mut bytes = vec![0u8; 16];
    mem.read_exact(&mut bytes).expect("read the target's code");
    bytes
}
