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

use std::collections::BTreeSet;
use std::path::PathBuf;

use crate::inspect::Pattern;
use crate::{Error, Metrics, ProbeId, Process};

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

    /// Looks at the process and returns what changed since the last poll,
    /// applying deferred probes to newly loaded libraries (holding the
    /// process for that, then releasing it).
    ///
    /// # Errors
    ///
    /// From finding and inserting deferred probes; the events up to then
    /// are lost with it only if the process itself is gone.
    pub fn poll(&mut self, process: &mut Process) -> Result<Vec<Event>, Error> {
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
            process.hold()?;
            let inserted = process.insert(&in_library, d.metrics);
            process.release()?;
            ids.extend(inserted?);
        }
        Ok(ids)
    }
}

fn threads_of(pid: i32) -> BTreeSet<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
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
