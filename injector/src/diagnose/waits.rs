//! What a target's threads are blocked in, sampled: which system call,
//! on which object (a futex word, a file descriptor) and for how many
//! bytes. The where-axis of objects (the mutex a thread waits for, the
//! file or peer it reads) and the measure of a frame opened before any
//! probe (a thread's whole life under an event loop) come from here.
//!
//! A thread blocked in a system call shows it in
//! `/proc/PID/task/TID/syscall` (number, arguments, stack and program
//! counter) without being stopped: a sample costs one small read per
//! thread and never touches the target.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// What a sampled thread was doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Blocked {
    /// Waiting on a futex word at this address (a mutex, condition
    /// variable, semaphore, Rust's and Go's locks).
    Sync(u64),
    /// Waiting on file descriptor `fd` (read, write, poll…), None when
    /// the call names no one descriptor (`select`, a `poll` of several,
    /// `openat` relative to the working directory); `bytes` is what a
    /// transfer asked for (0 for a readiness wait).
    Io { fd: Option<i32>, bytes: u64 },
}

/// What the samples of a thread whose CPU clock is paused found inside one
/// probe's function (its timer running there), ns: each sample stands
/// for the time since the thread's previous one, and its CPU time for the
/// CPU the thread had over that time (its schedstat).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Inside {
    /// Time inside.
    pub wall_ns: u64,
    /// CPU time inside.
    pub cpu_ns: u64,
    /// Time inside, blocked in a synchronization wait.
    pub sync_ns: u64,
    /// Time inside, blocked in I/O.
    pub io_ns: u64,
}

/// What the sampler also reads of the threads whose CPU clocks are
/// paused: whether each watched probe's timer runs on the thread at the
/// sample (its nesting word in the thread's row), for [`Inside`].
#[derive(Debug, Default)]
pub struct Watch {
    /// The region, read in place (a mapping of the sampler's own).
    pub region: Option<crate::region::Region>,
    /// The watched threads: tid → row index.
    pub threads: HashMap<u32, u32>,
    /// The watched probes: (probe, byte offset of its nesting word in a
    /// row).
    pub probes: Vec<(crate::ProbeId, usize)>,
}

/// One thread's samples.
#[derive(Clone, Debug, Default)]
pub struct ThreadWaits {
    /// Samples taken.
    pub samples: u64,
    /// Samples blocked in a synchronization wait.
    pub sync: u64,
    /// Samples blocked in I/O.
    pub io: u64,
    /// Samples per object: (sync?, futex address or fd) → (samples, bytes
    /// asked in all, transfers sampled).
    pub objects: HashMap<(bool, u64), (u64, u64, u64)>,
    /// While the thread is watched ([`Watch`]): per probe, what the
    /// samples found inside its function.
    pub inside: HashMap<crate::ProbeId, Inside>,
    /// The thread's last watched sample: when, and its CPU time then, ns.
    last_watched: Option<(std::time::Instant, u64)>,
}

impl ThreadWaits {
    /// One watched sample of thread `tid` (row `row`) of `pid`: the time
    /// and CPU since its last one go to the probes whose timers run on it
    /// now, blocked as sampled.
    fn watched(&mut self, pid: i32, tid: u32, row: u32, blocked: Option<Blocked>, watch: &Watch) {
        let now = std::time::Instant::now();
        let cpu = crate::inspect::procfs::schedstat(pid, tid).1;
        let Some((at, cpu_before)) = self.last_watched.replace((now, cpu)) else {
            return;
        };
        let Some(region) = &watch.region else {
            return;
        };
        if region
            .row_header(row)
            .tid
            .load(std::sync::atomic::Ordering::Acquire)
            != tid
        {
            return;
        }
        let wall = now.saturating_duration_since(at).as_nanos() as u64;
        let open = watch
            .probes
            .iter()
            .filter(|&&(_, nesting)| region.load_word(row, nesting) != 0)
            .map(|&(probe, _)| probe);
        self.charge(open, wall, cpu.saturating_sub(cpu_before), blocked);
    }

    /// Charges `wall` ns of the thread's time, `cpu` of them on a CPU,
    /// blocked as `blocked` at the sample, to the probes `open` on it.
    fn charge(
        &mut self,
        open: impl Iterator<Item = crate::ProbeId>,
        wall: u64,
        cpu: u64,
        blocked: Option<Blocked>,
    ) {
        for probe in open {
            let i = self.inside.entry(probe).or_default();
            i.wall_ns += wall;
            i.cpu_ns += cpu;
            match blocked {
                Some(Blocked::Sync(_)) => i.sync_ns += wall,
                Some(Blocked::Io { .. }) => i.io_ns += wall,
                None => {}
            }
        }
    }
}

/// Classifies one `/proc/PID/task/TID/syscall` line, reading each call's
/// descriptor from the argument that holds one; `poll_fd(address)` reads
/// the `fd` of the `struct pollfd` at `address` in the target (a `poll`
/// or `ppoll` of a single descriptor names it only there).
pub fn classify_in(line: &str, poll_fd: impl Fn(u64) -> Option<i32>) -> Option<Blocked> {
    let mut it = line.split_whitespace();
    let nr: i64 = it.next()?.parse().ok()?;
    let args: Vec<u64> = it
        .take(6)
        .filter_map(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok())
        .collect();
    let arg = |i: usize| args.get(i).copied().unwrap_or(0);
    // A descriptor is a small non-negative int: anything else in the
    // argument (AT_FDCWD, a pointer) names none.
    let fd = |v: u64| i32::try_from(v).ok().filter(|&fd| fd >= 0);
    Some(match nr {
        // futex, futex_waitv (its first argument is an array: the first
        // waiter's address is not read here).
        202 | 449 => Blocked::Sync(arg(0)),
        // read, write, pread64, pwrite64, sendto, recvfrom: the third
        // argument is the size asked for.
        0 | 1 | 17 | 18 | 44 | 45 => Blocked::Io {
            fd: fd(arg(0)),
            bytes: arg(2),
        },
        // readv, writev, recvmsg, sendmsg, accept, connect, accept4,
        // epoll_wait, epoll_pwait, epoll_pwait2 (the epoll descriptor),
        // fsync, fdatasync, openat (dirfd), sendfile (out), splice (in),
        // recvmmsg, sendmmsg, io_uring_enter, sync_file_range: the first
        // argument is the descriptor.
        19 | 20 | 46 | 47 | 43 | 42 | 288 | 232 | 281 | 441 | 74 | 75 | 257 | 40 | 275 | 299
        | 307 | 426 | 277 => Blocked::Io {
            fd: fd(arg(0)),
            bytes: 0,
        },
        // poll, ppoll: an array of `struct pollfd` and its length; one
        // descriptor is named, several are not one object.
        7 | 271 => Blocked::Io {
            fd: (arg(1) == 1).then(|| poll_fd(arg(0))).flatten(),
            bytes: 0,
        },
        // select, pselect6: a count and bit sets, no one descriptor.
        23 | 270 => Blocked::Io { fd: None, bytes: 0 },
        _ => return None,
    })
}

/// Samples every thread of a process on a thread of its own until dropped.
pub struct WaitSampler {
    stats: Arc<Mutex<HashMap<u32, ThreadWaits>>>,
    watch: Arc<Mutex<Watch>>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl WaitSampler {
    /// Starts sampling process `pid` every `period`.
    pub fn start(pid: i32, period: Duration) -> WaitSampler {
        let stats: Arc<Mutex<HashMap<u32, ThreadWaits>>> = Arc::default();
        let watch: Arc<Mutex<Watch>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (s, w, halt) = (stats.clone(), watch.clone(), stop.clone());
        let handle = std::thread::Builder::new()
            .name("weft-waits".into())
            .spawn(move || {
                while !halt.load(Ordering::Relaxed) {
                    let seen = sample_once(pid);
                    let watch = w.lock().unwrap_or_else(|p| p.into_inner());
                    if let Ok(mut all) = s.lock() {
                        for (tid, blocked) in seen {
                            let t = all.entry(tid).or_default();
                            match watch.threads.get(&tid) {
                                Some(&row) => t.watched(pid, tid, row, blocked, &watch),
                                None => t.last_watched = None,
                            }
                            t.samples += 1;
                            let key = match blocked {
                                Some(Blocked::Sync(addr)) => {
                                    t.sync += 1;
                                    Some(((true, addr), 0))
                                }
                                Some(Blocked::Io { fd, bytes }) => {
                                    t.io += 1;
                                    fd.map(|fd| ((false, fd as u64), bytes))
                                }
                                None => None,
                            };
                            if let Some((key, bytes)) = key {
                                let o = t.objects.entry(key).or_default();
                                o.0 += 1;
                                if bytes > 0 {
                                    o.1 += bytes;
                                    o.2 += 1;
                                }
                            }
                        }
                    }
                    std::thread::sleep(period);
                }
            })
            .ok();
        WaitSampler {
            stats,
            watch,
            stop,
            handle,
        }
    }

    /// What the sampler watches from its next sample on ([`Watch`]).
    pub fn watch(&self, f: impl FnOnce(&mut Watch)) {
        f(&mut self.watch.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// Every thread's samples so far.
    pub fn snapshot(&self) -> HashMap<u32, ThreadWaits> {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for WaitSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// One look at every thread: what each is blocked in, if anything.
fn sample_once(pid: i32) -> Vec<(u32, Option<Blocked>)> {
    let Ok(dir) = std::fs::read_dir(crate::inspect::procfs::pid_file(pid, "task")) else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let tid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let line =
            std::fs::read_to_string(crate::inspect::procfs::task_file(pid, tid, "syscall")).ok()?;
        // "running": on a CPU (or about to be); a thread stopped by weft
        // reads like the call it was in.
        Some((tid, classify_in(&line, |at| read_i32(pid, at))))
    })
    .collect()
}

/// The `int` at `address` in process `pid`, read without stopping it.
fn read_i32(pid: i32, address: u64) -> Option<i32> {
    use std::os::unix::fs::FileExt;
    let mem = std::fs::File::open(crate::inspect::procfs::pid_file(pid, "mem")).ok()?;
    let mut word = [0u8; 4];
    mem.read_exact_at(&mut word, address).ok()?;
    Some(i32::from_le_bytes(word))
}

/// What file descriptor `fd` of `pid` is, for a report: its path, or for
/// a TCP socket its peer (`socket 127.0.0.1:11211 -> 127.0.0.1:40112`);
/// None when the process has no such descriptor (closed since, or never
/// one: an object weft cannot name is left out, not guessed).
pub fn describe_fd(pid: i32, fd: i32) -> Option<String> {
    let link = std::fs::read_link(crate::inspect::procfs::fd_file(pid, fd)).ok()?;
    let link = link.to_string_lossy().into_owned();
    if let Some(inode) = link
        .strip_prefix("socket:[")
        .and_then(|s| s.strip_suffix(']'))
    {
        if let Some(peer) = tcp_peer(pid, inode) {
            return Some(format!("fd {fd} {peer}"));
        }
    }
    Some(format!("fd {fd} {link}"))
}

/// The local and remote addresses of the TCP socket with `inode`.
fn tcp_peer(pid: i32, inode: &str) -> Option<String> {
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(crate::inspect::procfs::pid_file(
            pid,
            &format!("net/{table}"),
        ))
        .ok()?;
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.get(9) == Some(&inode) {
                let (local, remote) = (hex_address(f.get(1)?)?, hex_address(f.get(2)?)?);
                return Some(format!("tcp {local} -> {remote}"));
            }
        }
    }
    None
}

/// `0100007F:2B67` (or a 32-digit IPv6 address) as `127.0.0.1:11111`.
fn hex_address(s: &str) -> Option<String> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let bytes: Vec<u8> = (0..ip.len() / 2)
        .map(|i| u8::from_str_radix(&ip[2 * i..2 * i + 2], 16))
        .collect::<Result<_, _>>()
        .ok()?;
    // /proc prints each 32-bit word in host (little-endian) order.
    let words: Vec<u8> = bytes
        .chunks(4)
        .flat_map(|w| w.iter().rev().copied())
        .collect();
    Some(match words.len() {
        4 => format!(
            "{}:{port}",
            std::net::Ipv4Addr::new(words[0], words[1], words[2], words[3])
        ),
        16 => {
            let a: [u8; 16] = words.try_into().ok()?;
            format!("[{}]:{port}", std::net::Ipv6Addr::from(a))
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`classify_in`] where no memory can be read.
    fn classify(line: &str) -> Option<Blocked> {
        classify_in(line, |_| None)
    }

    #[test]
    fn classifies_waits_from_the_syscall_file() {
        assert_eq!(
            classify("202 0x55d0c0 0x80 0x2 0x0 0x0 0x0 0x7ffd 0x7f00"),
            Some(Blocked::Sync(0x55d0c0))
        );
        assert_eq!(
            classify("0 0x3 0x7ffd10 0x10 0x0 0x0 0x0 0x7ffd 0x7f00"),
            Some(Blocked::Io {
                fd: Some(3),
                bytes: 16
            })
        );
        assert_eq!(
            classify("232 0x5 0x7ffd10 0x20 0xffffffff 0x0 0x0 0x7ffd 0x7f00"),
            Some(Blocked::Io {
                fd: Some(5),
                bytes: 0
            })
        );
        // poll's first argument is a pointer, not a descriptor (it read
        // as "fd -871298776"): the one pollfd's fd is read from memory.
        let poll = "7 0x7ffdcc1a2b28 0x1 0xffffffff 0x0 0x0 0x0 0x7ffd 0x7f00";
        assert_eq!(
            classify_in(poll, |at| (at == 0x7ffd_cc1a_2b28).then_some(9)),
            Some(Blocked::Io {
                fd: Some(9),
                bytes: 0
            })
        );
        let poll_many = "7 0x7ffdcc1a2b28 0x3 0xffffffff 0x0 0x0 0x0 0x7ffd 0x7f00";
        assert_eq!(
            classify_in(poll_many, |_| Some(9)),
            Some(Blocked::Io { fd: None, bytes: 0 })
        );
        // select's first argument is a count; openat's AT_FDCWD no fd.
        assert_eq!(
            classify("23 0x8 0x7ffd10 0x0 0x0 0x0 0x0 0x7ffd 0x7f00"),
            Some(Blocked::Io { fd: None, bytes: 0 })
        );
        assert_eq!(
            classify("257 0xffffffffffffff9c 0x7ffd10 0x0 0x0 0x0 0x0 0x7ffd 0x7f00"),
            Some(Blocked::Io { fd: None, bytes: 0 })
        );
        assert_eq!(classify("running"), None);
        assert_eq!(classify("-1 0x7ffd 0x7f00"), None);
        assert_eq!(
            classify("230 0x1 0x0 0x7ffd 0x0 0x0 0x0 0x7ffd 0x7f00"),
            None
        );
    }

    /// Each sample's time goes to the functions open at it: CPU time to
    /// all of them, blocked time to the class it was blocked in.
    #[test]
    fn samples_charge_the_functions_open_at_them() {
        use crate::ProbeId;
        let (outer, inner) = (ProbeId(1), ProbeId(2));
        let mut t = ThreadWaits::default();
        // 5 ms on the CPU in both, then 5 ms blocked on a futex in both,
        // then 5 ms reading in `outer` alone.
        t.charge([outer, inner].into_iter(), 5_000_000, 5_000_000, None);
        t.charge(
            [outer, inner].into_iter(),
            5_000_000,
            0,
            Some(Blocked::Sync(0x10)),
        );
        let read = Blocked::Io {
            fd: Some(3),
            bytes: 16,
        };
        t.charge([outer].into_iter(), 5_000_000, 0, Some(read));
        let i = |p| t.inside.get(&p).copied().unwrap_or_default();
        assert_eq!(
            i(outer),
            Inside {
                wall_ns: 15_000_000,
                cpu_ns: 5_000_000,
                sync_ns: 5_000_000,
                io_ns: 5_000_000
            }
        );
        assert_eq!(
            i(inner),
            Inside {
                wall_ns: 10_000_000,
                cpu_ns: 5_000_000,
                sync_ns: 5_000_000,
                io_ns: 0
            }
        );
    }

    #[test]
    fn reads_proc_net_addresses() {
        assert_eq!(
            hex_address("0100007F:2B67").as_deref(),
            Some("127.0.0.1:11111")
        );
        assert_eq!(
            hex_address("00000000000000000000000001000000:0050").as_deref(),
            Some("[::1]:80")
        );
    }
}
