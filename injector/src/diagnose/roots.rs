//! Where each thread lives when a search starts: its root (`main`, its
//! start routine) and the frames its stack keeps over a few walks, and
//! the calls seen below them. Loops entered before weft came (an event
//! loop, an interpreter's frame, a closure called once through a pointer)
//! are where a real program's threads spend their lives; an inclusive
//! timer cannot see into them, the stack can.

use super::graph::{self, StaticCallGraph};
use super::search::{CallGraph, NodeId, Search};
use super::Hypothesis;
use crate::{Error, Function, Process};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

/// Snapshots of the threads' stacks a search starts from, and the time
/// between them: a frame in all of them (same function, same frame
/// address) is taken as open for the thread's life.
pub(super) const SNAPSHOTS: usize = 3;
const SNAPSHOT_GAP: Duration = Duration::from_millis(25);

/// Deepest stack walked.
const MAX_FRAMES: usize = 256;

/// Where each thread (not yet known) lives, from its root down.
pub(super) struct ThreadPaths {
    /// (open path from the thread's root, the calls seen below it in each
    /// walk, the thread).
    paths: Vec<(Vec<Function>, Vec<Vec<Function>>, u32)>,
    /// Calls seen on the stacks: (caller, callee).
    edges: Vec<(Function, Function)>,
}

/// Each new thread's open path: its root — `main` for the main thread,
/// its start routine for the others — and below it the frames its stack
/// kept over `snapshots` walks (one stop each; the walks run after it).
///
/// A thread's start routine is found in its glibc thread descriptor (the
/// first word of the descriptor the thread pointer points at that is the
/// entry of a function of the executable), else as the first frame of
/// its stack outside the C library (a thread a library started, one the
/// descriptor does not name). Below the root, a path stops before the C
/// library (a wait primitive in it ends the path): what a thread does
/// there is how the library does it, not where the program spends.
pub(super) fn thread_paths(
    process: &mut Process,
    entries: &HashMap<u64, String>,
    known: &mut BTreeSet<u32>,
    snapshots: usize,
    stops: &mut Stops,
) -> Result<ThreadPaths, Error> {
    let pid = process.pid();
    let mut descriptors = Vec::new();
    let mut copies: HashMap<u32, Vec<crate::stack::StackCopy>> = HashMap::new();
    for i in 0..snapshots.max(1) {
        if i > 0 {
            std::thread::sleep(SNAPSHOT_GAP);
        }
        let held = process.hold()?;
        for tid in held.threads() {
            let tid32 = tid as u32;
            if i == 0 {
                if known.contains(&tid32) {
                    continue;
                }
                let fs = held.registers(tid).map(|r| r.fs_base).unwrap_or(0);
                descriptors.push((tid32, fs));
            } else if !copies.contains_key(&tid32) {
                continue;
            }
            if let Ok(copy) = held.copy_stack(tid) {
                copies.entry(tid32).or_default().push(copy);
            }
        }
        held.release()?;
        stops.note(process, "walking stacks");
    }
    let mut found = ThreadPaths {
        paths: Vec::new(),
        edges: Vec::new(),
    };
    for (tid, fs) in descriptors {
        known.insert(tid);
        // Outermost first: (function, frame address).
        let stacks: Vec<Vec<(Function, u64)>> = copies
            .remove(&tid)
            .unwrap_or_default()
            .iter()
            .map(|copy| named_frames(process, copy))
            .collect();
        let routine = if tid == pid as u32 {
            Some("main".to_string())
        } else {
            process.read_memory(fs, 0x1000).ok().and_then(|bytes| {
                bytes
                    .chunks_exact(8)
                    .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
                    .find_map(|w| entries.get(&w))
                    .cloned()
            })
        };
        let first = stacks.first().map(Vec::as_slice).unwrap_or(&[]);
        let root_at = routine
            .as_ref()
            .and_then(|name| first.iter().position(|(f, _)| &f.name == name))
            .or_else(|| {
                first
                    .iter()
                    .position(|(f, _)| !is_c_library(f) && f.name != "_start")
            });
        let mut below: Vec<Vec<Function>> = Vec::new();
        let path: Vec<Function> = match root_at {
            Some(at) => {
                for stack in &stacks {
                    for pair in stack.get(at..).unwrap_or(&[]).windows(2) {
                        found.edges.push((pair[0].0.clone(), pair[1].0.clone()));
                    }
                }
                let open = stacks.len() >= 2;
                first[at..]
                    .iter()
                    .enumerate()
                    .take_while(|&(i, (f, cfa))| {
                        i == 0
                            || (open
                                && (!is_c_library(f) || graph::wait_class(&f.name).is_some())
                                && stacks.iter().all(|s| {
                                    s.get(at + i)
                                        .is_some_and(|(g, c)| g.address == f.address && c == cfa)
                                }))
                    })
                    .map(|(_, (f, _))| f.clone())
                    // Down to a wait primitive at most: below it is how
                    // the library waits.
                    .scan(false, |past_wait, f| {
                        if *past_wait {
                            return None;
                        }
                        *past_wait = graph::wait_class(&f.name).is_some();
                        Some(f)
                    })
                    .collect::<Vec<Function>>()
            }
            // No walk to go by: the routine alone, if it is a function.
            None => routine
                .and_then(|name| {
                    entries
                        .iter()
                        .find(|(_, n)| **n == name)
                        .and_then(|(&a, _)| process.image().function_at(a).ok().flatten())
                })
                .map(|f| Function {
                    name: if tid == pid as u32 {
                        "main".into()
                    } else {
                        f.name.clone()
                    },
                    ..f
                })
                .into_iter()
                .collect(),
        };
        if let Some(at) = root_at.filter(|_| !path.is_empty()) {
            // What each walk shows below the open path, down to the C
            // library or a wait primitive: calls seen happening, tested
            // first.
            for stack in &stacks {
                let mut chain = Vec::new();
                for (f, _) in stack.iter().skip(at + path.len()) {
                    let wait = graph::wait_class(&f.name).is_some();
                    if is_c_library(f) && !wait {
                        break;
                    }
                    chain.push(f.clone());
                    if wait {
                        break;
                    }
                }
                if !chain.is_empty() && !below.contains(&chain) {
                    below.push(chain);
                }
            }
        }
        if !path.is_empty() {
            found.paths.push((path, below, tid));
        }
    }
    found.paths.sort_by_key(|(_, _, tid)| *tid);
    Ok(found)
}

/// The calls (caller, callee) the stacks of threads `tids` show now, in
/// one walk (one short stop): where an indirect call goes that weft cannot
/// arm (its patch would cover a jump target, or a return into it).
pub(super) fn stack_edges(
    process: &mut Process,
    tids: &BTreeSet<u32>,
    stops: &mut Stops,
) -> Result<Vec<(Function, Function)>, Error> {
    let held = process.hold()?;
    let copies: Vec<crate::stack::StackCopy> = held
        .threads()
        .into_iter()
        .filter(|&tid| tids.contains(&(tid as u32)))
        .filter_map(|tid| held.copy_stack(tid).ok())
        .collect();
    held.release()?;
    stops.note(process, "walking stacks");
    let mut edges = Vec::new();
    for copy in &copies {
        for pair in named_frames(process, copy).windows(2) {
            edges.push((pair[0].0.clone(), pair[1].0.clone()));
        }
    }
    Ok(edges)
}

/// Puts the threads' open paths into the search (each taken as true and
/// refined, see [`Search::add_open_path`]), after teaching the call graph
/// the calls the stacks showed and decoding every function on a path.
pub(super) fn add_thread_paths(
    search: &mut Search,
    graph: &mut StaticCallGraph,
    process: &mut Process,
    found: ThreadPaths,
    hypotheses: &[Hypothesis],
) -> HashMap<NodeId, OpenFrame> {
    let mut open = HashMap::new();
    for (caller, callee) in found.edges {
        graph.explore(process.image(), &caller);
        if caller.address != callee.address {
            graph.learn(&caller.name, callee);
        }
    }
    for (path, below, tid) in found.paths {
        for f in path.iter().chain(below.iter().flatten()) {
            graph.explore(process.image(), f);
        }
        let names: Vec<String> = path.iter().map(|f| f.name.clone()).collect();
        for &h in hypotheses {
            // The calls seen below first (they go to the queue's front
            // before the open frames do), each a test of its own.
            for chain in &below {
                let mut seen = names.clone();
                // As far as the hypothesis can hold there (a call that
                // reaches no wait of its class is not tested for it).
                seen.extend(
                    chain
                        .iter()
                        .map(|f| f.name.clone())
                        .take_while(|f| graph.relevant(h, f)),
                );
                if seen.len() > names.len() {
                    search.add_open_path(h, &seen, &[tid], graph);
                }
            }
            // A thread stopped in a wait primitive of the other class, or
            // asleep, is not tested there for this hypothesis: a blocking
            // read is I/O only (it read true as sync too), a sleep neither.
            let mut names = names.clone();
            while names.len() > 1
                && names.last().is_some_and(|f| match h {
                    Hypothesis::SyncWaiting | Hypothesis::IoBlocking => !graph::may_wait_as(h, f),
                    _ => false,
                })
            {
                names.pop();
            }
            let nodes = search.add_open_path(h, &names, &[tid], graph);
            open.extend(nodes.into_iter().skip(1).map(|id| (id, OpenFrame::Unknown)));
        }
    }
    open
}

/// Counts the functions of `f`'s module once.
pub(super) fn count_module(
    process: &mut Process,
    counted: &mut BTreeMap<std::path::PathBuf, usize>,
    f: &Function,
) {
    if counted.contains_key(&f.module_path) {
        return;
    }
    let n = process
        .image()
        .modules()
        .iter()
        .find(|m| m.path() == f.module_path)
        .and_then(|m| Some(m.image().ok()?.functions().ok()?.len()))
        .unwrap_or(0);
    counted.insert(f.module_path.clone(), n);
}

/// A copied stack's frames, outermost first, as far as they are named.
pub(super) fn named_frames(
    process: &mut Process,
    copy: &crate::stack::StackCopy,
) -> Vec<(Function, u64)> {
    let frames = copy.walk(process.image(), MAX_FRAMES);
    let mut named = Vec::new();
    for (i, frame) in frames.iter().enumerate() {
        match process.image().function_at(frame.lookup_address(i == 0)) {
            Ok(Some(f)) => named.push((f, frame.cfa)),
            _ => break,
        }
    }
    named.reverse();
    named
}

/// Whether `f` is in the C library or the dynamic loader: frames a
/// thread's own code runs under (`__libc_start_main`, `start_thread`) or
/// calls into, never where a search starts.
pub(super) fn is_c_library(f: &Function) -> bool {
    let file = f
        .module_path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("");
    ["libc.so", "libc-", "ld-linux", "libpthread"]
        .iter()
        .any(|p| file.starts_with(p))
}

/// How a test of a frame seen open on its thread's stack is read, decided
/// at its first reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OpenFrame {
    /// Not read yet.
    Unknown,
    /// Its function was not called since the probe went in: the thread
    /// is still in the activation it was in, so its whole time is the
    /// function's (CPU from schedstat, waits from the wait samples).
    Open,
    /// Called since: a short call the walks kept catching; its timers
    /// tell.
    Timed,
}

/// The stops of the world a search made.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Stops {
    pub(super) count: usize,
    pub(super) longest: crate::StopTime,
    /// What the longest was for.
    pub(super) longest_for: &'static str,
    /// The process's stops given up, as of the last hold noted.
    pub(super) given_up: u64,
    /// How long a program weft started was held at its entry, before any
    /// of it ran (not a stop: nothing of the program waited).
    pub(super) start_held: Option<std::time::Duration>,
}

impl Stops {
    /// Counts the hold `process` just released, made for `what`.
    pub(super) fn note(&mut self, process: &Process, what: &'static str) {
        self.count += 1;
        self.given_up = process.stops_given_up();
        if process.longest_stop_time() > self.longest {
            self.longest = process.longest_stop_time();
            self.longest_for = what;
        }
    }
}
