//! What happens in a process while weft is not holding it: threads that
//! start and end, libraries that are loaded and unloaded, the process's
//! exit — and probes to apply to libraries that are loaded later.
//!
//! weft does not stay attached while probes are live (see
//! `docs/design.md`), so it learns about these by looking: a [`Watcher`]
//! compares `/proc/PID/task` and `/proc/PID/maps` with what it saw last
//! time. A library's functions are instrumented at the first
//! [`Watcher::poll`] after it appears: calls it makes before that are not
//! counted (poll often — the `weft` command polls every few milliseconds —
//! or hold the process around the action that loads it).
//!
//! Or, with [`Watcher::defer_at_load`], at the load itself: a probe on the
//! dynamic loader's `_dl_debug_state` makes the loading thread wait, once
//! the library is mapped and relocated and before any of its code runs
//! (its constructors included), until [`Watcher::wait`] or
//! [`Watcher::poll`] has instrumented it — at most the time given, and
//! only while the watcher has looked at the process within the last second
//! plus that time: a tool that stops polling, or dies, soon costs nothing.

use std::collections::BTreeSet;
use std::path::PathBuf;

use crate::inspect::Pattern;
use crate::{Error, Held, Metrics, ProbeId, Process};

/// Something that happened in the process since the last poll.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A thread appeared.
    ThreadStarted(i32),
    /// A thread is gone.
    ThreadExited(i32),
    /// A shared library was mapped.
    LibraryLoaded {
        /// Its path.
        path: PathBuf,
        /// Its lowest mapped address.
        base: u64,
    },
    /// A shared library was unmapped.
    LibraryUnloaded {
        /// Its path.
        path: PathBuf,
    },
    /// Deferred probes ([`Watcher::defer`]) were applied to a library that
    /// was just loaded.
    ProbesApplied {
        /// The library.
        path: PathBuf,
        /// The new probes.
        probes: Vec<ProbeId>,
    },
    /// The process is gone.
    Exited,
}

/// Probes waiting for a library to be loaded.
#[derive(Clone, Debug)]
struct Deferred {
    patterns: Vec<Pattern>,
    metrics: Metrics,
}

/// Watches a process for [`Event`]s; see the module docs.
#[derive(Debug, Default)]
pub struct Watcher {
    threads: BTreeSet<i32>,
    libraries: Vec<(PathBuf, u64)>,
    deferred: Vec<Deferred>,
    started: bool,
    exited: bool,
    /// The probe on the loader's `_dl_debug_state`, when loads wait for
    /// this watcher ([`Watcher::defer_at_load`]).
    at_load: Option<ProbeId>,
}

impl Watcher {
    /// A watcher that knows the process's current threads and libraries
    /// (so that the first poll reports only what changes after this).
    pub fn new(process: &Process) -> Watcher {
        Watcher {
            threads: threads_of(process.pid()),
            libraries: libraries_of(process.pid()),
            started: true,
            ..Watcher::default()
        }
    }

    /// Instruments the functions matching `patterns` in every library
    /// loaded from now on (at the poll that sees it), with `metrics`.
    /// Patterns naming a module (`libfoo.so:bar`) apply to that library
    /// only.
    pub fn defer(&mut self, patterns: Vec<Pattern>, metrics: Metrics) {
        self.deferred.push(Deferred { patterns, metrics });
    }

    /// Makes every library loaded from now on wait, inside the dynamic
    /// loader, until this watcher has applied the deferred probes
    /// ([`Watcher::defer`]) to it — at most `wait` each — so that none of
    /// its code runs uninstrumented. The process is held for it (the probe
    /// on the loader goes in now, loading weft's runtime if need be); poll
    /// with [`Watcher::wait`], which wakes as soon as a load waits. Undo
    /// with [`Watcher::stop_deferring_at_load`] (and [`Held::remove`] of
    /// the returned probe).
    ///
    /// # Errors
    ///
    /// [`Error::NoMatch`], [`Error::Refused`] or
    /// [`Error::MissingLibc`] when the loader's `_dl_debug_state` or
    /// `_r_debug` cannot be had or patched (not a glibc loader).
    pub fn defer_at_load(
        &mut self,
        process: &mut Held<'_>,
        wait: std::time::Duration,
    ) -> Result<ProbeId, Error> {
        let f = process
            .find_functions(&[Pattern::parse("_dl_debug_state")?])?
            .remove(0);
        let r_debug = process
            .image()
            .symbol_address("ld", "_r_debug")
            .ok_or(Error::MissingLibc("_r_debug"))?;
        let hook = process.region_header()?.library_event_fn;
        let id = match self.at_load {
            Some(id) if process.probes().iter().any(|p| p.id == id && p.active) => id,
            _ => process.insert_probes(&[crate::ProbeSpec {
                on_entry: Some(crate::UserProbe {
                    function: hook,
                    user: r_debug,
                    predicate: None,
                }),
                ..crate::ProbeSpec::measure(f, Metrics::CALLS)
            }])?[0],
        };
        let ms = wait.as_millis().clamp(1, u128::from(u32::MAX)) as u32;
        {
            let h = process.region_header()?;
            use std::sync::atomic::Ordering;
            h.library_watcher_ms
                .store(monotonic_ms(), Ordering::Release);
            h.library_wait_ms.store(ms, Ordering::Release);
        }
        // weft's own probe: its calls are not the user's business.
        process.leave_out_of_reports(id);
        self.at_load = Some(id);
        Ok(id)
    }

    /// Loads no longer wait for this watcher (a thread waiting now goes on
    /// at once). The probe on the loader stays, harmless, until removed.
    pub fn stop_deferring_at_load(&mut self, process: &Process) {
        if let Some(h) = process.region_header() {
            use std::sync::atomic::Ordering;
            h.library_wait_ms.store(0, Ordering::Release);
            h.library_loads_done
                .store(h.library_loads.load(Ordering::Acquire), Ordering::Release);
            futex_wake(&h.library_loads_done);
        }
        self.at_load = None;
    }

    /// [`Watcher::poll`] after waiting up to `timeout` — less when, with
    /// [`Watcher::defer_at_load`], a library load is waiting for this
    /// watcher (it is then instrumented before the load goes on).
    pub fn wait(
        &mut self,
        process: &mut Process,
        timeout: std::time::Duration,
    ) -> Result<Vec<Event>, Error> {
        use std::sync::atomic::Ordering;
        let armed = self.at_load.is_some();
        match process.region_header() {
            Some(h) if armed => {
                h.library_watcher_ms
                    .store(monotonic_ms(), Ordering::Release);
                let loads = h.library_loads.load(Ordering::Acquire);
                if loads == h.library_loads_done.load(Ordering::Acquire) {
                    futex_wait(&h.library_loads, loads, timeout);
                }
            }
            _ => std::thread::sleep(timeout),
        }
        self.poll(process)
    }

    /// Looks at the process and returns what changed since the last poll,
    /// applying deferred probes to newly loaded libraries (holding the
    /// process for that, then releasing it), and lets loads waiting for
    /// this watcher ([`Watcher::defer_at_load`]) go on.
    ///
    /// # Errors
    ///
    /// From finding and inserting deferred probes; the events up to then
    /// are lost with it only if the process itself is gone.
    pub fn poll(&mut self, process: &mut Process) -> Result<Vec<Event>, Error> {
        // Loads waiting now: their libraries are mapped, so the look at
        // /proc below sees them; later ones wait for the next poll.
        let waiting = match (self.at_load, process.region_header()) {
            (Some(_), Some(h)) => {
                use std::sync::atomic::Ordering;
                h.library_watcher_ms
                    .store(monotonic_ms(), Ordering::Release);
                Some(h.library_loads.load(Ordering::Acquire))
            }
            _ => None,
        };
        let events = self.look(process);
        if let (Some(loads), Some(h)) = (waiting, process.region_header()) {
            use std::sync::atomic::Ordering;
            if h.library_loads_done.load(Ordering::Acquire) != loads {
                h.library_loads_done.store(loads, Ordering::Release);
                futex_wake(&h.library_loads_done);
            }
        }
        events
    }

    fn look(&mut self, process: &mut Process) -> Result<Vec<Event>, Error> {
        let mut events = Vec::new();
        if self.exited {
            return Ok(events);
        }
        if !self.started {
            *self = Watcher {
                deferred: std::mem::take(&mut self.deferred),
                ..Watcher::new(process)
            };
        }
        let pid = process.pid();
        if !process.is_alive() {
            self.exited = true;
            events.push(Event::Exited);
            return Ok(events);
        }
        let threads = threads_of(pid);
        events.extend(
            threads
                .difference(&self.threads)
                .map(|&t| Event::ThreadStarted(t)),
        );
        events.extend(
            self.threads
                .difference(&threads)
                .map(|&t| Event::ThreadExited(t)),
        );
        self.threads = threads;
        let libraries = libraries_of(pid);
        let new: Vec<(PathBuf, u64)> = libraries
            .iter()
            .filter(|l| !self.libraries.contains(l))
            .cloned()
            .collect();
        for (path, _) in self.libraries.iter().filter(|l| !libraries.contains(l)) {
            events.push(Event::LibraryUnloaded { path: path.clone() });
        }
        self.libraries = libraries;
        for (path, base) in new {
            events.push(Event::LibraryLoaded {
                path: path.clone(),
                base,
            });
            let probes = self.apply_deferred(process, &path)?;
            if !probes.is_empty() {
                events.push(Event::ProbesApplied { path, probes });
            }
        }
        Ok(events)
    }

    /// Inserts the deferred probes that match functions of the library at
    /// `path`.
    fn apply_deferred(
        &mut self,
        process: &mut Process,
        path: &std::path::Path,
    ) -> Result<Vec<ProbeId>, Error> {
        let mut ids = Vec::new();
        if self.deferred.is_empty() {
            return Ok(ids);
        }
        process.image().refresh()?;
        for d in &self.deferred {
            let Ok(found) = process.find_functions(&d.patterns) else {
                continue; // nothing matches (yet)
            };
            let in_library: Vec<_> = found
                .into_iter()
                .filter(|f| f.module_path == path)
                .collect();
            if in_library.is_empty() {
                continue;
            }
            process.prepare(&in_library)?;
            let mut held = process.hold()?;
            let inserted = held.insert(&in_library, d.metrics);
            held.release()?;
            ids.extend(inserted?);
        }
        Ok(ids)
    }
}

/// `CLOCK_MONOTONIC` in milliseconds (the clock the runtime compares
/// [`weft_rt::layout::RegionHeader::library_watcher_ms`] with).
fn monotonic_ms() -> u64 {
    monotonic_ns() / 1_000_000
}

/// `CLOCK_MONOTONIC` in nanoseconds: the machine's clock every process
/// reads alike (the target's own figures can be set beside weft's).
pub(crate) fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Waits on the shared futex `word` (the runtime's region, mapped here
/// too) while it holds `value`, up to `timeout`.
fn futex_wait(word: &std::sync::atomic::AtomicU32, value: u32, timeout: std::time::Duration) {
    let t = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a valid aligned u32 of the mapped region and `t` a
    // valid timespec; an early return (EAGAIN, EINTR, ETIMEDOUT) is fine.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            value,
            &t as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every waiter of the shared futex `word`.
fn futex_wake(word: &std::sync::atomic::AtomicU32) {
    // SAFETY: `word` is a valid aligned u32 of the mapped region.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

fn threads_of(pid: i32) -> BTreeSet<i32> {
    crate::inspect::procfs::thread_ids(pid)
}

/// The shared libraries mapped (file-backed executable mappings at offset
/// 0 of `.so` files, the main executable excluded), with their bases.
fn libraries_of(pid: i32) -> Vec<(PathBuf, u64)> {
    let Ok(maps) = crate::inspect::read_maps(pid) else {
        return Vec::new();
    };
    let mut out: Vec<(PathBuf, u64)> = Vec::new();
    for m in &maps {
        let Some(file) = m.path.file() else { continue };
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !name.contains(".so") {
            continue;
        }
        if !out.iter().any(|(p, _)| p == file) {
            out.push((file.to_path_buf(), m.start));
        }
    }
    out
}
