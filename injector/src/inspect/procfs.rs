//! `/proc`: the one module that spells its paths and reads its files
//! (process state from `/proc/PID/stat` and `/proc/PID/status`, threads,
//! their names and CPU times, ...).

use std::collections::BTreeSet;
use std::path::PathBuf;

use super::error::InspectError;

/// The scheduler state of a process (the third field of `/proc/PID/stat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProcState {
    /// `R`: running or runnable.
    Running,
    /// `S`: interruptible sleep.
    Sleeping,
    /// `D`: uninterruptible sleep (usually I/O).
    DiskSleep,
    /// `T`: stopped by a job-control signal.
    Stopped,
    /// `t`: stopped by a tracer (another debugger may hold it).
    TracingStop,
    /// `Z`: exited, not yet reaped by its parent.
    Zombie,
    /// `X` / `x`: dead.
    Dead,
    /// `I`: idle kernel thread.
    Idle,
    /// `P`: parked kernel thread.
    Parked,
    /// Any other letter (`W`, `K`, future ones).
    Other(char),
}

impl ProcState {
    /// Whether the process has exited and waits to be reaped (`Z`), or is
    /// dead (`X`).
    pub fn is_zombie(self) -> bool {
        matches!(self, ProcState::Zombie | ProcState::Dead)
    }

    fn from_letter(c: char) -> ProcState {
        match c {
            'R' => ProcState::Running,
            'S' => ProcState::Sleeping,
            'D' => ProcState::DiskSleep,
            'T' => ProcState::Stopped,
            't' => ProcState::TracingStop,
            'Z' => ProcState::Zombie,
            'X' | 'x' => ProcState::Dead,
            'I' => ProcState::Idle,
            'P' => ProcState::Parked,
            c => ProcState::Other(c),
        }
    }
}

/// Extracts the state letter from the contents of `/proc/PID/stat`.
///
/// The second field, `(comm)`, may contain spaces and `)`; the kernel never
/// escapes it, so the state is found after the *last* `)`.
pub fn parse_stat_state(stat: &str) -> Option<ProcState> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let c = rest.trim_start_matches(' ').chars().next()?;
    c.is_ascii_alphabetic().then(|| ProcState::from_letter(c))
}

/// `/proc/PID/FILE` (`FILE` may hold slashes: `task`, `net/tcp`, `root`).
pub(crate) fn pid_file(pid: impl std::fmt::Display, file: &str) -> String {
    format!("/proc/{pid}/{file}")
}

/// `/proc/PID/task/TID/FILE`.
pub(crate) fn task_file(
    pid: impl std::fmt::Display,
    tid: impl std::fmt::Display,
    file: &str,
) -> String {
    format!("/proc/{pid}/task/{tid}/{file}")
}

/// `/proc/PID/fd/FD`.
pub(crate) fn fd_file(pid: impl std::fmt::Display, fd: impl std::fmt::Display) -> String {
    format!("/proc/{pid}/fd/{fd}")
}

/// `/proc/NAME`, a file of the whole system (`kallsyms`, `config.gz`).
pub(crate) fn system_file(name: &str) -> String {
    format!("/proc/{name}")
}

fn read_proc(pid: i32, file: &str) -> Result<(PathBuf, String), InspectError> {
    let path = PathBuf::from(pid_file(pid, file));
    let bytes =
        std::fs::read(&path).map_err(|e| InspectError::from_proc_io(pid, path.clone(), e))?;
    // comm may hold arbitrary bytes; only ASCII fields are parsed.
    Ok((path, String::from_utf8_lossy(&bytes).into_owned()))
}

/// The state of process `pid`, from `/proc/PID/stat`.
pub fn process_state(pid: i32) -> Result<ProcState, InspectError> {
    if pid <= 0 {
        return Err(InspectError::NoSuchProcess(pid));
    }
    let (path, text) = read_proc(pid, "stat")?;
    parse_stat_state(&text).ok_or_else(|| InspectError::BadProcFile {
        path,
        what: "no state letter after the `(comm)` field".into(),
    })
}

/// The process's PID as the process itself sees it (the last `NSpid`
/// entry of `/proc/PID/status`: it differs from `pid` when the target runs
/// in a nested PID namespace); `pid` itself on kernels without `NSpid`.
pub fn own_view_pid(pid: i32) -> Result<i32, InspectError> {
    let (_, text) = read_proc(pid, "status")?;
    Ok(parse_nspid(&text).unwrap_or(pid))
}

fn parse_nspid(status: &str) -> Option<i32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|v| v.split_whitespace().last())
        .and_then(|v| v.parse().ok())
}

/// The threads of process `pid` now (`/proc/PID/task`), none if it is gone.
pub(crate) fn thread_ids<T: std::str::FromStr + Ord>(pid: i32) -> BTreeSet<T> {
    std::fs::read_dir(pid_file(pid, "task"))
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Thread `tid`'s (time runnable but waiting for a CPU, time on a CPU)
/// so far, ns (`/proc/PID/task/TID/schedstat`); zeros if unknown.
pub(crate) fn schedstat(pid: i32, tid: u32) -> (u64, u64) {
    let [on_cpu, run_delay, _] = schedstat_fields(pid, tid);
    (run_delay, on_cpu)
}

/// A thread's schedstat: its time on a CPU and waiting for one, ns, and
/// the times it was scheduled in; zeros once it is gone.
pub(crate) fn schedstat_fields(pid: i32, tid: u32) -> [u64; 3] {
    let text = std::fs::read_to_string(task_file(pid, tid, "schedstat")).unwrap_or_default();
    let mut f = text
        .split_whitespace()
        .map(|v| v.parse::<u64>().unwrap_or(0));
    [(); 3].map(|_| f.next().unwrap_or(0))
}

/// A live thread's name (`comm`), `None` once it is gone.
pub(crate) fn thread_name(pid: i32, tid: u32) -> Option<String> {
    std::fs::read_to_string(task_file(pid, tid, "comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

/// The processes running the program `name`, as `pidof` finds them: the
/// file name of their executable (`/proc/PID/exe`), or their command
/// (`comm`, which a program may set) when the executable cannot be read;
/// a `name` with a slash is matched against the executable's whole path.
/// Zombies and the calling process are left out. Ascending PIDs.
pub fn pids_of(name: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me)
        .filter(|&pid| {
            let exe = std::fs::read_link(pid_file(pid, "exe")).ok();
            let named = match &exe {
                Some(path) if name.contains('/') => path == std::path::Path::new(name),
                Some(path) => {
                    path.file_name().is_some_and(|f| f == name)
                        || command(pid).is_some_and(|c| c == name)
                }
                None => !name.contains('/') && command(pid).is_some_and(|c| c == name),
            };
            named && !matches!(process_state(pid), Ok(ProcState::Zombie) | Err(_))
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// Process `pid`'s command (`/proc/PID/comm`), if it exists.
pub fn command(pid: i32) -> Option<String> {
    let text = std::fs::read_to_string(pid_file(pid, "comm")).ok()?;
    Some(text.trim_end_matches('\n').to_string())
}

/// The children of process `pid` (of all its threads) that run the same
/// executable as it does: the workers of a server whose master forks them
/// (nginx, Apache, PostgreSQL, gunicorn). Ascending PIDs.
pub fn children_running_the_same_program(pid: i32) -> Vec<i32> {
    let Ok(exe) = std::fs::read_link(pid_file(pid, "exe")) else {
        return Vec::new();
    };
    let mut children: Vec<i32> = thread_ids::<i32>(pid)
        .into_iter()
        .filter_map(|tid| std::fs::read_to_string(task_file(pid, tid, "children")).ok())
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|c| c.parse::<i32>().ok())
                .collect::<Vec<_>>()
        })
        .filter(|&child| std::fs::read_link(pid_file(child, "exe")).is_ok_and(|e| e == exe))
        .collect();
    children.sort_unstable();
    children.dedup();
    children
}

/// The descendants of process `pid` now (its children, theirs, ...), in
/// breadth-first order, whatever program they run.
pub fn descendants(pid: i32) -> Vec<i32> {
    let mut found = Vec::new();
    let mut queue = std::collections::VecDeque::from([pid]);
    while let Some(p) = queue.pop_front() {
        for tid in thread_ids::<i32>(p) {
            let Ok(text) = std::fs::read_to_string(task_file(p, tid, "children")) else {
                continue;
            };
            for child in text
                .split_whitespace()
                .filter_map(|c| c.parse::<i32>().ok())
            {
                if child != pid && !found.contains(&child) {
                    found.push(child);
                    queue.push_back(child);
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nspid_innermost() {
        assert_eq!(parse_nspid("Name:\tx\nNSpid:\t4242\t17\n"), Some(17));
        assert_eq!(parse_nspid("NSpid:\t4242\n"), Some(4242));
        assert_eq!(parse_nspid("Name:\tx\n"), None);
        assert_eq!(parse_nspid("NSpid:\tbad\n"), None);
    }

    #[test]
    fn stat_state() {
        let s = "1234 (cat) S 1 1234 1234 34816 1234 4194304 95 0 0 0 0 0";
        assert_eq!(parse_stat_state(s), Some(ProcState::Sleeping));
        let s = "1234 (evil) R (x) Z) t 1 2 3";
        assert_eq!(parse_stat_state(s), Some(ProcState::TracingStop));
        assert_eq!(parse_stat_state("5 (a b) Z 1"), Some(ProcState::Zombie));
        assert_eq!(parse_stat_state("5 ()) D 1"), Some(ProcState::DiskSleep));
        assert_eq!(parse_stat_state("5 (x) W 1"), Some(ProcState::Other('W')));
        assert_eq!(parse_stat_state("5 (x)"), None);
        assert_eq!(parse_stat_state("5 (x) 7"), None);
        assert_eq!(parse_stat_state("garbage"), None);
        assert_eq!(parse_stat_state(""), None);
    }

    #[test]
    fn own_process() {
        let pid = std::process::id() as i32;
        // /proc/PID/stat shows the main thread, which may be waiting for
        // the test threads.
        let state = process_state(pid).unwrap();
        assert!(
            matches!(state, ProcState::Running | ProcState::Sleeping),
            "{state:?}"
        );
        assert!(!state.is_zombie());
        assert!(matches!(
            process_state(-1),
            Err(InspectError::NoSuchProcess(-1))
        ));
        // PIDs are below 2^22; this one cannot exist.
        assert!(matches!(
            process_state(i32::MAX),
            Err(InspectError::NoSuchProcess(_))
        ));
    }

    #[test]
    fn zombie_is_detected() {
        let child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        // Not waited for: it becomes a zombie once it exits.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while process_state(pid).unwrap() != ProcState::Zombie {
            assert!(
                std::time::Instant::now() < deadline,
                "child never became a zombie"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let err = super::super::ProcessImage::open(pid).unwrap_err();
        assert!(matches!(err, InspectError::Zombie(p) if p == pid), "{err}");
        assert!(err.to_string().contains("zombie"));
        let mut child = child;
        child.wait().unwrap();
    }
}
