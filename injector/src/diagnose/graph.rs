//! The code axis: a process's call graph as far as its code says, plus the
//! indirect-call targets the driver learns at run time.
//!
//! Built lazily, one function at a time, when the search refines it: a
//! callgraph-based search decodes only the functions on true paths, not
//! the whole program. A direct call (or a tail call) names its callee; a
//! call to a PLT stub names the library function the stub reaches
//! (`read`, `pthread_mutex_lock`), so that waits in libraries appear under
//! their caller; an indirect call is an *open site* whose targets the
//! driver resolves with `PointSpec::call_targets` while the caller is
//! instrumented, then hands in with [`StaticCallGraph::learn`].

use super::decision::Hypothesis;
use super::search::CallGraph;
use crate::code::{function_code, plt_import, slot_call_target, SlotCall};
use crate::code::{CallTarget, ExitKind};
use crate::inspect::ProcessImage;
use crate::process::Function;
use std::collections::{BTreeMap, BTreeSet};

/// What the code of one function says about its calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Calls {
    /// Functions it calls or tail-calls directly (PLT stubs named by the
    /// function they reach), by name, each once.
    pub direct: BTreeSet<String>,
    /// Its indirect call sites (addresses of the call instructions).
    pub indirect_sites: Vec<u64>,
    /// Targets its indirect calls were seen to reach.
    pub learnt: BTreeSet<String>,
}

/// Library functions that wait for another thread: locks, condition
/// variables, joins, barriers, semaphores, and the raw futex calls Rust's
/// `std::sync` and others make (`syscall(SYS_futex, …)`). One list for the
/// search's refinement and its verdicts.
pub const SYNC_FUNCTIONS: &[&str] = &[
    "pthread_mutex_lock",
    "pthread_mutex_timedlock",
    "pthread_mutex_clocklock",
    "pthread_rwlock_rdlock",
    "pthread_rwlock_wrlock",
    "pthread_rwlock_timedrdlock",
    "pthread_rwlock_timedwrlock",
    "pthread_cond_wait",
    "pthread_cond_timedwait",
    "pthread_cond_clockwait",
    "pthread_join",
    "pthread_barrier_wait",
    "pthread_spin_lock",
    "sem_wait",
    "sem_timedwait",
    "sem_clockwait",
    "syscall",
];

/// Library functions that wait for a device, a file or the network.
pub const IO_FUNCTIONS: &[&str] = &[
    "read",
    "write",
    "pread",
    "pread64",
    "pwrite",
    "pwrite64",
    "readv",
    "writev",
    "recv",
    "recvfrom",
    "recvmsg",
    "recvmmsg",
    "send",
    "sendto",
    "sendmsg",
    "sendmmsg",
    "accept",
    "accept4",
    "connect",
    "poll",
    "ppoll",
    "select",
    "pselect",
    "epoll_wait",
    "epoll_pwait",
    "fsync",
    "fdatasync",
    "sync_file_range",
    "fread",
    "fwrite",
    "fgets",
    "getline",
    "open",
    "openat",
    "splice",
    "sendfile",
];

/// Library functions that sleep for a time: neither waiting for another
/// thread nor for a device, so under no waiting hypothesis (a thread that
/// sleeps between rounds of work is paced, not blocked).
pub const SLEEP_FUNCTIONS: &[&str] = &[
    "nanosleep",
    "__nanosleep",
    "clock_nanosleep",
    "__clock_nanosleep",
    "usleep",
    "sleep",
    "pause",
];

/// Whether `function` waits on a condition variable: for another thread
/// to hand something over, not for a lock.
pub fn is_condition_wait(function: &str) -> bool {
    matches!(
        function,
        "pthread_cond_wait" | "pthread_cond_timedwait" | "pthread_cond_clockwait"
    )
}

/// Whether `function` sleeps for a time ([`SLEEP_FUNCTIONS`]).
pub fn is_sleep(function: &str) -> bool {
    SLEEP_FUNCTIONS.contains(&function)
}

/// Whether `function` can be under waiting hypothesis `class`: not a wait
/// primitive of the other class (a blocking `read` is I/O, never
/// synchronization, and a lock never I/O) and not a sleep. Each wait
/// primitive belongs to one class.
pub fn may_wait_as(class: Hypothesis, function: &str) -> bool {
    !is_sleep(function) && wait_class(function).map_or(true, |c| c == class)
}

/// The hypothesis a library wait function belongs to, if any.
pub fn wait_class(function: &str) -> Option<Hypothesis> {
    if SYNC_FUNCTIONS.contains(&function) {
        Some(Hypothesis::SyncWaiting)
    } else if IO_FUNCTIONS.contains(&function) {
        Some(Hypothesis::IoBlocking)
    } else {
        None
    }
}

/// Call graph of the functions the search has looked at.
#[derive(Debug, Default)]
pub struct StaticCallGraph {
    functions: BTreeMap<String, Function>,
    calls: BTreeMap<String, Calls>,
    /// The custom hypotheses' functions, by index.
    custom: Vec<BTreeSet<String>>,
}

impl StaticCallGraph {
    /// An empty graph.
    pub fn new() -> StaticCallGraph {
        StaticCallGraph::default()
    }

    /// The function named `name` if the graph has met it.
    pub fn function(&self, name: &str) -> Option<&Function> {
        self.functions.get(name)
    }

    /// What `name`'s code calls, if it was decoded.
    pub fn calls(&self, name: &str) -> Option<&Calls> {
        self.calls.get(name)
    }

    /// Gives custom hypothesis `Custom(i)` its functions (the ones whose
    /// time it counts), `i` being the position in `classes`.
    pub fn set_custom_classes(&mut self, classes: Vec<BTreeSet<String>>) {
        self.custom = classes;
    }

    /// Whether `function` is one whose time `hypothesis` counts: a wait
    /// primitive of its class, or one of a custom hypothesis's functions.
    pub fn in_class(&self, hypothesis: Hypothesis, function: &str) -> bool {
        match hypothesis {
            Hypothesis::Custom(i) => self
                .custom
                .get(usize::from(i))
                .is_some_and(|set| set.contains(function)),
            h => wait_class(function) == Some(h),
        }
    }

    /// Decodes `f` (once) and records its callees, resolving direct
    /// targets to the functions at those addresses. Returns its calls.
    pub fn explore(&mut self, image: &mut ProcessImage, f: &Function) -> &Calls {
        if !self.calls.contains_key(&f.name) {
            let calls = decode(image, f, &mut self.functions);
            self.functions.insert(f.name.clone(), f.clone());
            self.calls.insert(f.name.clone(), calls);
        }
        &self.calls[&f.name]
    }

    /// Adds a function found by name (a library function a PLT stub
    /// named), so that it can be instrumented.
    pub fn add_function(&mut self, f: Function) {
        self.functions.entry(f.name.clone()).or_insert(f);
    }

    /// Whether `function` is or calls (through functions the graph has
    /// decoded) a wait function of `class`.
    fn reaches(&self, class: Hypothesis, function: &str, seen: &mut BTreeSet<String>) -> bool {
        if self.in_class(class, function) {
            return true;
        }
        if !seen.insert(function.to_string()) {
            return false;
        }
        let Some(calls) = self.calls.get(function) else {
            return false;
        };
        calls
            .direct
            .iter()
            .chain(&calls.learnt)
            .any(|c| self.reaches(class, c, seen))
    }

    /// Records that `caller` was seen calling `target` at run time (an
    /// indirect call's target, or two frames of a thread's stack).
    pub fn learn(&mut self, caller: &str, target: Function) {
        if let Some(c) = self.calls.get_mut(caller) {
            c.learnt.insert(target.name.clone());
        }
        self.functions.entry(target.name.clone()).or_insert(target);
    }
}

/// The callees of `f` from its code.
fn decode(image: &mut ProcessImage, f: &Function, known: &mut BTreeMap<String, Function>) -> Calls {
    let mut calls = Calls::default();
    let Ok(code) = function_code(image, f) else {
        return calls;
    };
    let mut targets = Vec::new();
    for site in &code.calls {
        match site.target {
            CallTarget::Direct(to) => targets.push(to),
            // Through a slot the files fill and nobody changes (a GOT
            // entry, a relocated read-only pointer): as good as direct.
            CallTarget::Indirect { slot: Some(slot) } => match slot_call_target(image, slot) {
                Some(SlotCall::Named(name)) => {
                    calls.direct.insert(name);
                }
                Some(SlotCall::At(to)) => targets.push(to),
                None => calls.indirect_sites.push(site.address),
            },
            CallTarget::Indirect { slot: None } => calls.indirect_sites.push(site.address),
        }
    }
    for exit in &code.exits {
        if let ExitKind::TailCall { target } = exit.kind {
            targets.push(target);
        }
    }
    for to in targets {
        if let Some(name) = plt_import(image, to) {
            // A library function through its stub: found by name when the
            // driver instruments it.
            calls.direct.insert(name);
            continue;
        }
        if let Ok(Some(callee)) = image.function_at(to) {
            // Only calls to a function's entry: a jump into the middle of
            // another function is shared code, not a call.
            if callee.address == to && callee.address != f.address {
                calls.direct.insert(callee.name.clone());
                known.entry(callee.name.clone()).or_insert(callee);
            }
        }
    }
    calls
}

impl CallGraph for StaticCallGraph {
    fn relevant(&self, hypothesis: Hypothesis, function: &str) -> bool {
        match hypothesis {
            // CPU time is measured in the program's own functions: a
            // library function's share shows in its caller.
            Hypothesis::CpuBound => {
                self.calls.contains_key(function) && wait_class(function).is_none()
            }
            // A wait (or a custom hypothesis's function) is found where
            // it is called: down to the function itself. A function with an
            // indirect call not yet resolved may reach one too.
            class => {
                may_wait_as(class, function)
                    && (self.reaches(class, function, &mut BTreeSet::new())
                        || self
                            .calls
                            .get(function)
                            .is_some_and(|c| !c.indirect_sites.is_empty()))
            }
        }
    }

    fn seen(&self, caller: &str, callee: &str) -> bool {
        self.calls
            .get(caller)
            .is_some_and(|c| c.learnt.contains(callee))
    }

    /// The callees seen at run time first (on a thread's stack, or
    /// reached by an indirect call): the search tests them first.
    fn callees(&self, function: &str) -> Vec<String> {
        let Some(c) = self.calls.get(function) else {
            return Vec::new();
        };
        let mut callees: Vec<String> = c.learnt.iter().cloned().collect();
        callees.extend(c.direct.iter().filter(|d| !c.learnt.contains(*d)).cloned());
        callees
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(calls: &[(&str, &[&str], usize)]) -> StaticCallGraph {
        let mut g = StaticCallGraph::new();
        for &(caller, callees, indirect) in calls {
            g.calls.insert(
                caller.to_string(),
                Calls {
                    direct: callees.iter().map(|c| c.to_string()).collect(),
                    indirect_sites: vec![0x1000; indirect],
                    learnt: BTreeSet::new(),
                },
            );
        }
        g
    }

    /// A blocking read is I/O only, a lock sync only, a sleep neither,
    /// even where a library function's unresolved indirect calls would
    /// otherwise let it reach anything.
    #[test]
    fn each_wait_primitive_belongs_to_one_class() {
        let g = graph(&[
            ("reader", &["read"], 0),
            ("read", &[], 2),
            ("nanosleep", &[], 2),
            ("pacer", &["nanosleep"], 0),
            ("locker", &["pthread_mutex_lock"], 0),
        ]);
        let (sync, io) = (Hypothesis::SyncWaiting, Hypothesis::IoBlocking);
        assert!(g.relevant(io, "read"));
        assert!(!g.relevant(sync, "read"));
        assert!(g.relevant(io, "reader"));
        assert!(!g.relevant(sync, "reader"));
        assert!(g.relevant(sync, "pthread_mutex_lock"));
        assert!(!g.relevant(io, "pthread_mutex_lock"));
        for h in [sync, io] {
            assert!(!g.relevant(h, "nanosleep"));
            assert!(!g.relevant(h, "pacer"));
        }
    }
}
