//! The search's probes: which probe measures each test (its function,
//! constrained to its parent test's probe), putting them in, judging
//! their cost, and taking them out.

use super::*;

/// For each (function address, thread) looked at in an insertion stop,
/// whether the thread was inside the function.
type OnStack = HashMap<(u64, u32), bool>;

/// Most threads whose stacks one batch of insertions looks at (a copy is
/// up to 128 KiB read while the target is stopped).
const CATCH_UP_THREADS: usize = 32;

/// Which probe measures a test: its function (by address: two names of
/// one function are one), counted inside the probe of the test's parent
/// (None: every call — a root, or a parent frame open since before the
/// search began). Tests of one function whose parents are all in flight
/// read one probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct ProbeKey {
    pub(super) address: u64,
    pub(super) inside: Option<ProbeId>,
}

/// A probe the search has in.
#[derive(Clone, Debug)]
pub(super) struct LiveProbe {
    pub(super) id: ProbeId,
    /// Its function's name (as the tests name it).
    pub(super) function: String,
    /// The tests reading it.
    pub(super) users: BTreeSet<NodeId>,
}

impl Consultant {
    /// Starts the tests the budget allows; returns how many probes went in.
    pub(super) fn start_tests(
        &mut self,
        process: &mut Process,
        progress: &mut Vec<Progress>,
    ) -> Result<usize, Error> {
        let max = self.options.max_probes;
        // New probes, and the probe of every test started.
        let mut planned: BTreeMap<ProbeKey, String> = BTreeMap::new();
        let mut keys: HashMap<NodeId, ProbeKey> = HashMap::new();
        let live = self.probes.len();
        let pending = self.pending_parents();
        let addresses = self.queued_addresses(process);
        let (probes, node_probe, open) = (&self.probes, &self.node_probe, &self.open);
        // Functions with a probe whose cost has not been read yet: another
        // probe of one (under another path) waits for that verdict, so
        // that a function too costly to time costs once, not once per path.
        let unjudged: BTreeSet<u64> = self
            .probes
            .iter()
            .filter(|(_, p)| self.cost.probe_share(p.id).is_none())
            .map(|(k, _)| k.address)
            .collect();
        let over = self.cost.recent_share();
        let max_overhead = self.options.max_overhead;
        let too_costly = &self.too_costly;
        self.search.skip_queued(|node| {
            let share = *too_costly.get(node.focus.function())?;
            Some(Setback::TooCostly {
                share,
                max: max_overhead,
            })
        });
        let started = self.search.start(|id, node| {
            if over > max_overhead {
                return Err(Setback::Overhead {
                    share: over,
                    max: max_overhead,
                });
            }
            if let Some(parent) = node.parent.and_then(|p| pending.get(&p)) {
                return Err(Setback::ParentPending {
                    parent: parent.clone(),
                });
            }
            let function = node.focus.function();
            // Not found: started without a probe, and skipped below.
            let Some(&address) = addresses.get(function) else {
                return Ok(());
            };
            let key = ProbeKey {
                address,
                inside: constraint_of(node, probes, node_probe, open),
            };
            if probes.contains_key(&key) || planned.contains_key(&key) {
                keys.insert(id, key);
                return Ok(());
            }
            // A function has several probes (each over the last), one new
            // one per batch, and one whose cost is unknown at a time.
            if unjudged.contains(&key.address) || planned.keys().any(|k| k.address == key.address) {
                return Err(Setback::PathBusy {
                    function: function.to_string(),
                });
            }
            if live + planned.len() >= max {
                return Err(Setback::ProbesFull { max });
            }
            planned.insert(key, function.to_string());
            keys.insert(id, key);
            Ok(())
        });
        // The budget is full and tests wait: true nodes already refined
        // stop being watched, so their probes can go to the tests below.
        if live + planned.len() >= max && !self.search.exhausted() {
            self.search.settle_refined();
        }
        // Each probe counts only inside its parent's probe, so a function
        // shared by several callers is measured under one path alone
        // (`ProbeSpec::inside`).
        let new: Vec<(ProbeKey, Function)> = planned
            .into_iter()
            .filter_map(|(key, name)| Some((key, self.graph.function(&name)?.clone())))
            .collect();
        // The threads each started test measures, by its function: their
        // stacks are looked at in the stop that puts the probe in.
        let mut watch: BTreeMap<u64, BTreeSet<u32>> = BTreeMap::new();
        for id in &started {
            if let Some(key) = keys.get(id) {
                let threads = &self.search.node(*id).focus.threads;
                watch
                    .entry(key.address)
                    .or_default()
                    .extend(threads.first().copied());
            }
        }
        let (inserted, on_stack) = self.insert_planned(process, new, &watch)?;
        self.peak_probes = self.peak_probes.max(self.probes.len());
        let mut testing = Vec::new();
        for id in started {
            let node = self.search.node(id);
            let f = node.focus.function().to_string();
            let key = keys.remove(&id);
            match key.as_ref().and_then(|k| self.probes.get_mut(k)) {
                Some(live) => {
                    live.users.insert(id);
                    let tid = node.focus.threads.first().copied().unwrap_or(0);
                    if let Some(&inside) = key.and_then(|k| on_stack.get(&(k.address, tid))) {
                        // Paradyn's catch-up: a frame the thread was in when
                        // the probe went in was entered before it, so its
                        // timer never runs: it is read as a frame seen open
                        // (told at the first readings: open, or called
                        // again and timed). A frame seen on an earlier walk
                        // but gone by then returned: the function's calls
                        // are timed whole from now.
                        match (inside, self.open.get(&id)) {
                            (true, _) => {
                                self.open.insert(id, OpenFrame::Unknown);
                            }
                            (false, Some(OpenFrame::Unknown)) => {
                                self.open.insert(id, OpenFrame::Timed);
                            }
                            _ => {}
                        }
                    }
                    self.node_probe.extend(key.map(|k| (id, k)));
                }
                None => {
                    let why = match self.refused.get(&f) {
                        Some((_, reason)) => Setback::Refused {
                            function: f,
                            reason: reason.clone(),
                        },
                        None => Setback::NotInExecutable { function: f },
                    };
                    self.search.skip(id, why);
                    continue;
                }
            }
            self.tests += 1;
            testing.push((
                self.name_of(node.hypothesis),
                node.focus.path.clone(),
                node.focus.threads.first().copied().unwrap_or(0),
            ));
        }
        if !testing.is_empty() {
            progress.push(Progress::Testing(testing));
        }
        Ok(inserted)
    }

    /// Puts the `new` probes in, a few per stop of the world; returns how
    /// many went in, and for each (function address, thread) of `watch`
    /// whether the thread was inside the function when its probe went in
    /// (or, for a function probed already, at the first stop): its
    /// stack, copied in that stop, walked once the target runs again.
    fn insert_planned(
        &mut self,
        process: &mut Process,
        new: Vec<(ProbeKey, Function)>,
        watch: &BTreeMap<u64, BTreeSet<u32>>,
    ) -> Result<(usize, OnStack), Error> {
        let mut inserted_all: Vec<(ProbeKey, Function, ProbeId)> = Vec::new();
        // (thread, the functions it is looked at for, its stack).
        let mut copies: Vec<(u32, Vec<u64>, crate::stack::StackCopy)> = Vec::new();
        let mut looked: BTreeSet<u32> = BTreeSet::new();
        let mut first_stop = true;
        // A few functions per stop, so that no stop grows with the batch;
        // functions weft refuses to time (a `.cold` part, a jump into the
        // patch…) leave their batch, and their tests are skipped below.
        for chunk in new.chunks(FUNCTIONS_PER_STOP) {
            let mut batch = chunk.to_vec();
            while !batch.is_empty() {
                let specs: Vec<ProbeSpec> = batch
                    .iter()
                    .map(|(key, f)| {
                        ProbeSpec::measure(f.clone(), TIMERS).inside(key.inside.as_slice())
                    })
                    .collect();
                let functions: Vec<Function> = batch.iter().map(|(_, f)| f.clone()).collect();
                // Planned while the target runs, not in the stop.
                let _ = process.prepare(&functions);
                let mut held = process.hold()?;
                let inserted = held.insert_probes(&specs);
                // Which threads to look at in this stop: those whose tests
                // measure a function of the batch (and, in the first stop,
                // those of tests sharing a probe already in).
                let mut wanted: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
                for (address, threads) in watch {
                    let in_batch = batch.iter().any(|(k, _)| k.address == *address);
                    let already = first_stop && !new.iter().any(|(k, _)| k.address == *address);
                    if in_batch || already {
                        for &tid in threads {
                            wanted.entry(tid).or_default().push(*address);
                        }
                    }
                }
                first_stop = false;
                let live: BTreeSet<u32> = held.threads().into_iter().map(|t| t as u32).collect();
                for (tid, addresses) in wanted {
                    if copies.len() >= CATCH_UP_THREADS || !live.contains(&tid) {
                        continue;
                    }
                    if let Ok(copy) = held.copy_stack(tid as crate::Tid) {
                        looked.insert(tid);
                        copies.push((tid, addresses, copy));
                    }
                }
                held.release()?;
                self.stops.note(process, "inserting probes");
                match inserted {
                    Ok(ids) => {
                        // By what each probe is (a function weft already
                        // probes under another name gets no new one).
                        for (key, f) in batch.drain(..) {
                            let id = process.probes().iter().find(|p| {
                                ids.contains(&p.id)
                                    && (p.function.address == f.address
                                        || p.function.name == f.name)
                                    && p.inside.first().copied() == key.inside
                            });
                            if let Some(p) = id {
                                inserted_all.push((key, f, p.id));
                            }
                        }
                    }
                    Err(Error::Refused(refused)) => {
                        batch.retain(|(_, f)| {
                            !refused.iter().any(|r| r.function.address == f.address)
                        });
                        for r in refused {
                            self.refused
                                .insert(r.function.name.clone(), (r.why.kind(), r.reason));
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        let inserted = inserted_all.len();
        for (key, f, id) in inserted_all {
            count_module(process, &mut self.module_functions, &f);
            self.probes.insert(
                key,
                LiveProbe {
                    id,
                    function: f.name.clone(),
                    users: BTreeSet::new(),
                },
            );
            self.probed_ever.insert(f.name.clone());
        }
        let mut on_stack = HashMap::new();
        for (tid, addresses, copy) in copies {
            let named = crate::diagnose::roots::named_frames(process, &copy);
            // Outermost first: a walk that reached the thread's start
            // (the C library's, or `_start`) tells a function is not on
            // the stack; one that stopped short tells only what it saw.
            let whole = named.first().is_some_and(|(f, _)| {
                crate::diagnose::roots::is_c_library(f) || f.name == "_start"
            });
            let frames: BTreeSet<u64> = named.into_iter().map(|(f, _)| f.address).collect();
            for address in addresses {
                let inside = frames.contains(&address);
                if inside || whole {
                    on_stack.insert((address, tid), inside);
                }
            }
        }
        Ok((inserted, on_stack))
    }

    /// The tests whose children must wait (a test counts inside its
    /// parent's probe): those not in yet, and those whose frame was open
    /// when the search began and that have not told yet whether the
    /// thread still is in it.
    fn pending_parents(&self) -> HashMap<NodeId, String> {
        let nodes = self.search.nodes();
        nodes
            .iter()
            .filter_map(|n| n.parent)
            .filter(|&parent| {
                let state = &nodes[parent.0].state;
                self.open.get(&parent) == Some(&OpenFrame::Unknown)
                    || matches!(state, State::Queued | State::Deferred(_))
                    || (matches!(state, State::Testing(_))
                        && !self.node_probe.contains_key(&parent))
            })
            .map(|parent| (parent, nodes[parent.0].focus.function().to_string()))
            .collect()
    }

    /// Each function a queued test measures, by name, at its address;
    /// library functions (a wait primitive a PLT stub named) are found by
    /// name the first time.
    fn queued_addresses(&mut self, process: &mut Process) -> HashMap<String, u64> {
        let names: BTreeSet<String> = self
            .search
            .nodes()
            .iter()
            .filter(|n| matches!(n.state, State::Queued | State::Deferred(_)))
            .map(|n| n.focus.function().to_string())
            .collect();
        let mut addresses = HashMap::new();
        for name in names {
            if self.not_found.contains(&name) {
                continue;
            }
            if self.graph.function(&name).is_none() {
                let found = Pattern::parse(&name)
                    .ok()
                    .and_then(|p| process.find_functions(&[p]).ok())
                    .and_then(|mut v| (!v.is_empty()).then(|| v.remove(0)));
                match found {
                    Some(f) => self.graph.add_function(Function {
                        name: name.clone(),
                        ..f
                    }),
                    None => {
                        self.not_found.insert(name);
                        continue;
                    }
                }
            }
            if let Some(f) = self.graph.function(&name) {
                addresses.insert(name, f.address);
            }
        }
        addresses
    }

    /// Takes out the probes whose calls alone cost more than the bound
    /// allows (their tests are skipped with the reason; `retire_probes`
    /// removes them).
    pub(super) fn drop_costly(&mut self, progress: &mut Vec<Progress>) {
        let max = self.options.max_overhead;
        // (A probe judged already waits for its removal.)
        let mut shares: Vec<(ProbeKey, f64)> = self
            .probes
            .iter()
            .filter(|(_, p)| !self.too_costly.contains_key(&p.function))
            .filter_map(|(key, p)| Some((*key, self.cost.probe_share(p.id)?)))
            .collect();
        // The costliest first: each over the bound alone goes, and then
        // more until what stays is within it (probes each under the bound
        // added up to 36% of a CPython target's CPU).
        shares.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let mut total: f64 = shares.iter().map(|(_, share)| share).sum();
        let costly: Vec<(ProbeKey, f64)> = shares
            .into_iter()
            .take_while(|&(_, share)| {
                let goes = share > max || total > max;
                if goes {
                    total -= share;
                }
                goes
            })
            .collect();
        // By function: one judged too costly under one path is not tried
        // under another either (and is said once).
        let mut by_function: BTreeMap<String, (f64, Vec<ProbeKey>)> = BTreeMap::new();
        for (key, share) in costly {
            let e = by_function
                .entry(self.probes[&key].function.clone())
                .or_insert((0.0, Vec::new()));
            e.0 = e.0.max(share);
            e.1.push(key);
        }
        for (name, (share, _)) in by_function {
            // The tests of every probe of it go (another path's probe may
            // be too new to have been judged), and those of the probes
            // counting inside them (which could not go on without them).
            let mut going: Vec<ProbeId> = self
                .probes
                .values()
                .filter(|p| p.function == name)
                .map(|p| p.id)
                .collect();
            let mut users = Vec::new();
            while let Some(id) = going.pop() {
                for (k, p) in &self.probes {
                    if p.id == id {
                        users.extend(p.users.iter().copied());
                    }
                    if k.inside == Some(id) {
                        going.push(p.id);
                    }
                }
            }
            for id in users {
                self.search.skip(id, Setback::TooCostly { share, max });
            }
            self.too_costly.insert(name.clone(), share);
            progress.push(Progress::TooCostly(name, share));
        }
    }

    pub(super) fn retire_probes(&mut self, process: &mut Process) -> Result<(), Error> {
        let mut gone = Vec::new();
        for (key, live) in self.probes.iter_mut() {
            live.users
                .retain(|&n| matches!(self.search.node(n).state, State::Testing(_)));
            if live.users.is_empty() {
                gone.push((*key, live.id));
            }
        }
        // Probes of functions with tests queued stay until those ran,
        // unless the budget is full (a long queue must not pin it) or the
        // function is too costly to time (those tests will be skipped).
        let full = self.probes.len() >= self.options.max_probes;
        gone.retain(|(key, _)| {
            let name = &self.probes[key].function;
            full || self.too_costly.contains_key(name)
                || !self.search.nodes().iter().any(|n| {
                    n.focus.function() == name
                        && matches!(n.state, State::Queued | State::Deferred(_))
                })
        });
        // A probe that queued tests will count inside stays (each is the
        // probe of a queued test's parent), whatever the budget.
        let parents: BTreeSet<&ProbeKey> = self
            .search
            .nodes()
            .iter()
            .filter(|n| matches!(n.state, State::Queued | State::Deferred(_)))
            .filter_map(|n| self.node_probe.get(&n.parent?))
            .collect();
        gone.retain(|(key, _)| !parents.contains(key));
        // A probe that constrains one that stays stays too; the rest go
        // each before the probe that constrains it.
        loop {
            let leaving: BTreeSet<ProbeId> = gone.iter().map(|(_, id)| *id).collect();
            let needed: BTreeSet<ProbeId> = self
                .probes
                .iter()
                .filter(|(_, p)| !leaving.contains(&p.id))
                .filter_map(|(k, _)| k.inside)
                .collect();
            let before = gone.len();
            gone.retain(|(_, id)| !needed.contains(id));
            if gone.len() == before {
                break;
            }
        }
        let depth = |key: &ProbeKey| {
            let mut depth = 0;
            let mut inside = key.inside;
            while let Some(id) = inside.filter(|_| depth < self.probes.len()) {
                depth += 1;
                inside = self
                    .probes
                    .iter()
                    .find(|(_, p)| p.id == id)
                    .and_then(|(k, _)| k.inside);
            }
            depth
        };
        gone.sort_by_cached_key(|(key, _)| (std::cmp::Reverse(depth(key)), *key));
        if gone.is_empty() {
            return Ok(());
        }
        // A few per stop, like insertions.
        for batch in gone.chunks(FUNCTIONS_PER_STOP * 2) {
            let ids: Vec<ProbeId> = batch.iter().map(|(_, id)| *id).collect();
            let mut held = process.hold()?;
            held.remove(&ids)?;
            held.release()?;
            self.stops.note(process, "removing probes");
            for (key, _) in batch {
                self.probes.remove(key);
                self.node_probe.retain(|_, k| k != key);
            }
        }
        Ok(())
    }
}

/// The probe a new test's probe counts inside: its parent's, when that
/// one is in and its function's frames come and go. A parent frame open
/// on its thread's stack since before its probe went in (a thread's loop,
/// a start seeded from a stack; `open`) never raised its nesting: the
/// thread is inside it anyway, and nothing is constrained by it.
fn constraint_of(
    node: &crate::diagnose::search::Node,
    probes: &HashMap<ProbeKey, LiveProbe>,
    node_probe: &HashMap<NodeId, ProbeKey>,
    open: &HashMap<NodeId, OpenFrame>,
) -> Option<ProbeId> {
    let parent = node.parent?;
    if matches!(
        open.get(&parent),
        Some(OpenFrame::Open | OpenFrame::Unknown)
    ) {
        return None;
    }
    probes.get(node_probe.get(&parent)?).map(|p| p.id)
}
