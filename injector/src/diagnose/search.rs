//! The search history graph: which tests exist, which run, and how a true
//! test is refined (Cain, Miller, Wylie: "A callgraph-based search
//! strategy for automated performance diagnosis", Euro-Par 2000).
//!
//! A node is a hypothesis tested at a focus: a call path from a root
//! (`main`, a thread's start routine) and the threads it is tested for.
//! The search starts with every hypothesis at every root. A node that
//! tests true is refined: its function's callees (the static ones, plus
//! the targets its indirect calls were seen to reach, which the driver
//! learns only while the caller is instrumented) become new nodes under
//! it. A node that tests false is done, and its instrumentation can go.
//! The bottlenecks are the true nodes with no true node below them.
//!
//! This module decides only; the driver inserts and removes probes, takes
//! readings, and says what it can afford ([`Search::start`]).

use super::decision::{Decision, Hypothesis, Reading, Thresholds, Verdict};
use std::collections::{BTreeSet, VecDeque};

/// A node's index in [`Search::nodes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub usize);

/// Where a hypothesis is tested.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Focus {
    /// The call path from a root; the last function is the one measured.
    pub path: Vec<String>,
    /// The threads it is tested for (empty: every thread).
    pub threads: Vec<u32>,
}

impl Focus {
    /// The function the focus measures.
    pub fn function(&self) -> &str {
        self.path.last().map_or("", String::as_str)
    }
}

/// Why a test was put off or given up. Shown, and serialized in the
/// report's `reason`, as the sentence the reports always gave.
#[derive(Clone, Debug, PartialEq)]
pub enum Setback {
    /// The instrumentation costs `share` of the target's CPU, over the
    /// bound `max` (`--max-overhead`).
    Overhead {
        /// Its share of the target's CPU.
        share: f64,
        /// The bound.
        max: f64,
    },
    /// `max` functions are instrumented already (`--max-probes`).
    ProbesFull {
        /// The bound.
        max: usize,
    },
    /// The focus's function is not one of the executable's.
    NotInExecutable {
        /// The function.
        function: String,
    },
    /// weft refused to time the focus's function (Go code, a `.cold`
    /// part…), with the reason it gave.
    Refused {
        /// The function.
        function: String,
        /// Why, as the refusal says it.
        reason: String,
    },
    /// The focus's function is measured under another call path now (a
    /// function has one probe at a time): the test waits its turn, and
    /// the ones behind it start meanwhile.
    PathBusy {
        /// The function.
        function: String,
    },
    /// The test counts inside its parent's probe, which is not in yet or
    /// has not told yet whether its frame is one the thread never leaves:
    /// it waits its turn, and the ones behind it start meanwhile.
    ParentPending {
        /// The parent's function.
        parent: String,
    },
    /// The function's calls cost `share` of the target's CPU, over the
    /// bound `max` (`--max-overhead`): its probe was taken out.
    TooCostly {
        /// Its calls' share of the target's CPU.
        share: f64,
        /// The bound.
        max: f64,
    },
}

impl std::fmt::Display for Setback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Setback::Overhead { share, max } => write!(
                f,
                "the instrumentation costs {:.1}% of the target's CPU, over the bound of {:.1}%",
                share * 100.0,
                max * 100.0
            ),
            Setback::ProbesFull { max } => {
                write!(f, "{max} functions instrumented at once (the limit)")
            }
            Setback::NotInExecutable { function } => {
                write!(f, "{function} is not a function of the executable")
            }
            Setback::Refused { function, reason } => {
                write!(f, "weft cannot time {function}: {reason}")
            }
            Setback::PathBusy { function } => {
                write!(f, "{function} is measured under another call path now")
            }
            Setback::ParentPending { parent } => {
                write!(
                    f,
                    "the test of its caller {parent} has not read a value yet"
                )
            }
            Setback::TooCostly { share, max } => write!(
                f,
                "its calls cost {:.1}% of the target's CPU, over the bound of {:.1}%",
                share * 100.0,
                max * 100.0
            ),
        }
    }
}

impl Setback {
    /// Whether a node refused for this keeps its place in the queue, the
    /// nodes after it going on ([`Search::start`]).
    pub fn keeps_place(&self) -> bool {
        matches!(
            self,
            Setback::PathBusy { .. } | Setback::ParentPending { .. }
        )
    }
}

impl serde::Serialize for Setback {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// What became of a node.
#[derive(Clone, Debug, PartialEq)]
pub enum State {
    /// Waiting for the driver to start it.
    Queued,
    /// Not started: the driver could not afford it (the reason).
    Deferred(Setback),
    /// Given up: the driver cannot measure it (the reason).
    Skipped(Setback),
    /// Instrumented and being decided.
    Testing(Decision),
    /// Concluded (the decision keeps the value and interval).
    Done(Decision),
}

/// One test.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// What is tested.
    pub hypothesis: Hypothesis,
    /// Where.
    pub focus: Focus,
    /// The node it refines.
    pub parent: Option<NodeId>,
    /// Where it stands.
    pub state: State,
}

impl Node {
    /// The verdict so far (`Testing` for queued and deferred nodes too).
    pub fn verdict(&self) -> Verdict {
        match &self.state {
            State::Testing(d) | State::Done(d) => d.verdict(),
            _ => Verdict::Testing,
        }
    }

    /// The latest value, when measured.
    pub fn value(&self) -> Option<f64> {
        match &self.state {
            State::Testing(d) | State::Done(d) => d.value(),
            _ => None,
        }
    }

    /// The span of test time the value covers ([`Decision::value_window`]).
    pub fn value_window(&self) -> Option<(std::time::Duration, std::time::Duration)> {
        match &self.state {
            State::Testing(d) | State::Done(d) => d.value_window(),
            _ => None,
        }
    }

    pub(super) fn is_true(&self) -> bool {
        matches!(self.verdict(), Verdict::True { .. })
    }
}

/// Where the code axis leads: a function's callees.
pub trait CallGraph {
    /// The functions `function` calls that the search may refine into
    /// (static callees, and indirect-call targets seen so far).
    fn callees(&self, function: &str) -> Vec<String>;

    /// Whether a test of `hypothesis` in `function` can be true at all (a
    /// function that reaches no synchronization call cannot wait for
    /// one): refinement skips the others. Every function by default.
    fn relevant(&self, hypothesis: Hypothesis, function: &str) -> bool {
        let _ = (hypothesis, function);
        true
    }

    /// Whether `caller` was seen calling `callee` at run time (on a
    /// thread's stack, or through an indirect call): such callees are
    /// tested before the others. None by default.
    fn seen(&self, caller: &str, callee: &str) -> bool {
        let _ = (caller, callee);
        false
    }
}

/// What the driver must do after a reading.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The node concluded false: its instrumentation can go (unless
    /// another node uses the same function).
    Retire(NodeId),
    /// The node concluded true: these new nodes refine it (queued).
    Refined(NodeId, Vec<NodeId>),
    /// A true node turned false: its subtree is no longer a bottleneck.
    Fell(NodeId),
}

/// The search state.
#[derive(Clone, Debug)]
pub struct Search {
    thresholds: Thresholds,
    nodes: Vec<Node>,
    queue: VecDeque<NodeId>,
    /// (hypothesis, path, threads) already made: a path reached twice is
    /// tested once (a function already on its own path is not refined
    /// again: recursion).
    made: BTreeSet<(Hypothesis, Vec<String>, Vec<u32>)>,
    /// Deepest path the search refines to.
    max_depth: usize,
}

impl Search {
    /// A search of `hypotheses` from `roots` (each root a function and the
    /// threads that run under it; empty for all).
    pub fn new(
        thresholds: Thresholds,
        hypotheses: &[Hypothesis],
        roots: &[(String, Vec<u32>)],
    ) -> Search {
        let mut s = Search {
            thresholds,
            nodes: Vec::new(),
            queue: VecDeque::new(),
            made: BTreeSet::new(),
            max_depth: 64,
        };
        for &h in hypotheses {
            for (root, threads) in roots {
                s.add(
                    h,
                    Focus {
                        path: vec![root.clone()],
                        threads: threads.clone(),
                    },
                    None,
                );
            }
        }
        s
    }

    fn add(
        &mut self,
        hypothesis: Hypothesis,
        focus: Focus,
        parent: Option<NodeId>,
    ) -> Option<NodeId> {
        if !self
            .made
            .insert((hypothesis, focus.path.clone(), focus.threads.clone()))
        {
            return None;
        }
        let id = NodeId(self.nodes.len());
        self.nodes.push(Node {
            hypothesis,
            focus,
            parent,
            state: State::Queued,
        });
        self.queue.push_back(id);
        Some(id)
    }

    /// A root for `hypothesis` at `function` for `threads` (a thread that
    /// started after the search began), queued; None if it exists.
    pub fn add_root(
        &mut self,
        hypothesis: Hypothesis,
        function: &str,
        threads: &[u32],
    ) -> Option<NodeId> {
        self.add(
            hypothesis,
            Focus {
                path: vec![function.to_string()],
                threads: threads.to_vec(),
            },
            None,
        )
    }

    /// Every node made so far, in the order made.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Node `id`.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.0]
    }

    /// A thread's open path: the functions it stayed inside of from its
    /// root down while the driver looked (the frames its stack kept). The
    /// root is taken as true and refined; the frames below it are tested
    /// first (at the front of the queue, outermost first), each a child
    /// of the one above — the driver reads a frame that is still open as
    /// the thread's whole time, since an activation entered before any
    /// probe cannot be timed. Returns the path's nodes, root first (those
    /// already made are reused as they are).
    pub fn add_open_path(
        &mut self,
        hypothesis: Hypothesis,
        path: &[String],
        threads: &[u32],
        graph: &dyn CallGraph,
    ) -> Vec<NodeId> {
        let mut parent = None;
        let mut chain = Vec::new();
        for i in 1..=path.len().min(self.max_depth) {
            let key = (hypothesis, path[..i].to_vec(), threads.to_vec());
            let existing = (0..self.nodes.len()).map(NodeId).find(|&n| {
                let node = &self.nodes[n.0];
                node.hypothesis == hypothesis
                    && node.focus.path == key.1
                    && node.focus.threads == key.2
            });
            let id = match existing {
                Some(id) => id,
                None => {
                    let focus = Focus {
                        path: key.1.clone(),
                        threads: key.2.clone(),
                    };
                    match self.add(hypothesis, focus, parent) {
                        Some(id) => id,
                        None => break,
                    }
                }
            };
            chain.push(id);
            parent = Some(id);
        }
        // Open frames first, outermost first.
        for &id in chain.iter().skip(1).rev() {
            if matches!(self.nodes[id.0].state, State::Queued) {
                self.queue.retain(|&q| q != id);
                self.queue.push_front(id);
            }
        }
        if let Some(&root) = chain.first() {
            if matches!(self.nodes[root.0].state, State::Queued) {
                self.assume_true(root, graph);
            }
        }
        chain
    }

    /// Nodes being tested now.
    pub fn testing(&self) -> Vec<NodeId> {
        (0..self.nodes.len())
            .map(NodeId)
            .filter(|&i| matches!(self.nodes[i.0].state, State::Testing(_)))
            .collect()
    }

    /// Whether nothing is queued or being tested: the search is exhausted
    /// (true nodes stay watched, but find nothing new).
    pub fn exhausted(&self) -> bool {
        self.queue.is_empty()
            && self
                .nodes
                .iter()
                .all(|n| !matches!(n.state, State::Testing(_)) || n.is_true())
    }

    /// Starts queued nodes, in the order made (breadth first), while
    /// `afford` accepts them; a node it refuses is deferred with its reason
    /// and the ones after it wait for the next call, except that a node
    /// refused with a setback that [keeps its place](Setback::keeps_place)
    /// stays and the ones after it go on. Returns the started
    /// nodes: the driver instruments them and reads them from now on.
    pub fn start(
        &mut self,
        mut afford: impl FnMut(NodeId, &Node) -> Result<(), Setback>,
    ) -> Vec<NodeId> {
        let mut started = Vec::new();
        let mut at = 0;
        while let Some(&id) = self.queue.get(at) {
            match afford(id, &self.nodes[id.0]) {
                Ok(()) => {
                    self.queue.remove(at);
                    let d = Decision::new(self.nodes[id.0].hypothesis, &self.thresholds);
                    self.nodes[id.0].state = State::Testing(d);
                    started.push(id);
                }
                Err(why) if why.keeps_place() => at += 1,
                Err(why) => {
                    self.nodes[id.0].state = State::Deferred(why);
                    break;
                }
            }
        }
        started
    }

    /// Skips every queued node `never` gives a reason for (a focus the
    /// driver will not measure again, such as a function found too costly
    /// to time), without starting it; the others keep their places.
    pub fn skip_queued(&mut self, mut never: impl FnMut(&Node) -> Option<Setback>) {
        let nodes = &mut self.nodes;
        self.queue.retain(|&id| match never(&nodes[id.0]) {
            Some(why) => {
                nodes[id.0].state = State::Skipped(why);
                false
            }
            None => true,
        });
    }

    /// Takes queued node `id` as true without testing it (see
    /// [`Decision::assumed_true`]) and refines it at once.
    pub fn assume_true(&mut self, id: NodeId, graph: &dyn CallGraph) -> Change {
        self.queue.retain(|&q| q != id);
        let d = Decision::assumed_true(self.nodes[id.0].hypothesis, &self.thresholds);
        self.nodes[id.0].state = State::Done(d);
        self.refine(id, graph)
    }

    /// Gives up on node `id` (started, but the driver cannot measure its
    /// focus: a function it cannot instrument, or too costly to), with the
    /// reason. A node already found true keeps its finding as last
    /// measured (the watch ends, not the truth): memcached's workers'
    /// `epoll_wait`, true at 93 %, vanished from the diagnosis when its
    /// probe went for its cost a moment later.
    pub fn skip(&mut self, id: NodeId, reason: Setback) {
        let node = &self.nodes[id.0];
        if node.is_true() {
            self.conclude(id);
        } else if !matches!(node.state, State::Done(_)) {
            self.nodes[id.0].state = State::Skipped(reason);
        }
    }

    /// Gives node `id` a reading; returns what changed, if anything.
    pub fn observe(
        &mut self,
        id: NodeId,
        reading: Reading,
        graph: &dyn CallGraph,
    ) -> Option<Change> {
        let node = &mut self.nodes[id.0];
        let State::Testing(decision) = &mut node.state else {
            return None;
        };
        let before = decision.verdict();
        let after = decision.observe(reading);
        match (before, after) {
            (Verdict::Testing, Verdict::True { .. }) => Some(self.refine(id, graph)),
            (Verdict::Testing, Verdict::False { .. }) => {
                self.conclude(id);
                Some(Change::Retire(id))
            }
            (Verdict::True { .. }, Verdict::False { .. }) => {
                self.conclude(id);
                Some(Change::Fell(id))
            }
            _ => None,
        }
    }

    fn conclude(&mut self, id: NodeId) {
        let state = std::mem::replace(&mut self.nodes[id.0].state, State::Queued);
        self.nodes[id.0].state = match state {
            State::Testing(d) => State::Done(d),
            other => other,
        };
    }

    fn refine(&mut self, id: NodeId, graph: &dyn CallGraph) -> Change {
        let (h, focus) = {
            let n = &self.nodes[id.0];
            (n.hypothesis, n.focus.clone())
        };
        let mut children = Vec::new();
        let mut seen_children = Vec::new();
        if focus.path.len() < self.max_depth {
            for callee in graph.callees(focus.function()) {
                if focus.path.contains(&callee) || !graph.relevant(h, &callee) {
                    continue; // recursion (the path measures it), or hopeless
                }
                let mut path = focus.path.clone();
                path.push(callee);
                let child = Focus {
                    path,
                    threads: focus.threads.clone(),
                };
                let seen = graph.seen(focus.function(), child.function());
                if let Some(c) = self.add(h, child, Some(id)) {
                    if seen {
                        seen_children.push(c);
                    } else {
                        children.push(c);
                    }
                }
            }
        }
        // Deeper first: a true node's children go before what waits in
        // the queue (the search follows a true path down before it widens),
        // the calls seen happening first of all.
        let mut all = seen_children;
        all.append(&mut children);
        self.queue.retain(|q| !all.contains(q));
        for &c in all.iter().rev() {
            self.queue.push_front(c);
        }
        Change::Refined(id, all)
    }

    /// Refines node `id` (true) again into callees learnt since it turned
    /// true (an indirect call's targets); returns the new nodes.
    pub fn refine_more(&mut self, id: NodeId, graph: &dyn CallGraph) -> Vec<NodeId> {
        if !self.nodes[id.0].is_true() {
            return Vec::new();
        }
        match self.refine(id, graph) {
            Change::Refined(_, c) => c,
            _ => Vec::new(),
        }
    }

    /// Stops watching the true nodes that have been refined (their
    /// children are queued or tested): they stay true, and their
    /// instrumentation can go. For a driver whose budget is taken by the
    /// true nodes it watches, so that the search can go deeper; the price
    /// is that such a node can no longer be seen to fall.
    pub fn settle_refined(&mut self) -> Vec<NodeId> {
        let parents: BTreeSet<usize> = self
            .nodes
            .iter()
            .filter_map(|n| n.parent.map(|p| p.0))
            .collect();
        let settled: Vec<NodeId> = parents
            .into_iter()
            .filter(|&i| {
                self.nodes[i].is_true() && matches!(self.nodes[i].state, State::Testing(_))
            })
            .map(NodeId)
            .collect();
        for &id in &settled {
            self.conclude(id);
        }
        settled
    }

    /// The bottlenecks: true nodes with no true node below them.
    pub fn bottlenecks(&self) -> Vec<NodeId> {
        let has_true_child: BTreeSet<usize> = self
            .nodes
            .iter()
            .filter(|n| n.is_true())
            .filter_map(|n| n.parent.map(|p| p.0))
            .collect();
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_true() && !has_true_child.contains(&i))
            .map(NodeId)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::time::Duration;

    /// A call graph and each function's inclusive share for one hypothesis.
    struct Program {
        calls: HashMap<&'static str, Vec<&'static str>>,
        share: HashMap<&'static str, f64>,
    }

    impl CallGraph for Program {
        fn callees(&self, f: &str) -> Vec<String> {
            self.calls
                .get(f)
                .map(|c| c.iter().map(|s| s.to_string()).collect())
                .unwrap_or_default()
        }
    }

    fn program() -> Program {
        // main → {a, b, c}; a → {a1, a2}; a1 → hot (0.40); b → decoy (0.20);
        // c → small (0.08); hot calls main (a cycle through a pointer).
        let calls = HashMap::from([
            ("main", vec!["a", "b", "c"]),
            ("a", vec!["a1", "a2"]),
            ("a1", vec!["hot"]),
            ("b", vec!["decoy"]),
            ("c", vec!["small"]),
            ("hot", vec!["main"]),
        ]);
        let share = HashMap::from([
            ("main", 0.95),
            ("a", 0.45),
            ("a1", 0.42),
            ("a2", 0.02),
            ("hot", 0.40),
            ("b", 0.22),
            ("decoy", 0.20),
            ("c", 0.09),
            ("small", 0.08),
        ]);
        Program { calls, share }
    }

    /// Runs the search to exhaustion with readings every 100 ms.
    fn run(p: &Program, budget: usize) -> (Search, usize) {
        let mut s = Search::new(
            Thresholds::default(),
            &[Hypothesis::CpuBound],
            &[("main".to_string(), vec![])],
        );
        let mut clock: HashMap<NodeId, u64> = HashMap::new();
        let mut peak = 0;
        for _round in 0..200 {
            let active = s.testing().len();
            let mut room = budget.saturating_sub(active);
            let started = s.start(|_, _| {
                if room == 0 {
                    return Err(Setback::ProbesFull { max: budget });
                }
                room -= 1;
                Ok(())
            });
            if started.is_empty() && s.testing().len() >= budget {
                s.settle_refined();
            }
            for id in started {
                clock.insert(id, 0);
            }
            peak = peak.max(s.testing().len());
            for id in s.testing() {
                let at = clock.get_mut(&id).unwrap();
                *at += 100;
                let share = p.share[s.node(id).focus.function()];
                let whole = *at * 1_000_000;
                s.observe(
                    id,
                    Reading {
                        at: Duration::from_millis(*at),
                        part_ns: (whole as f64 * share) as u64,
                        whole_ns: whole,
                    },
                    p,
                );
            }
            if s.exhausted() {
                break;
            }
        }
        (s, peak)
    }

    #[test]
    fn the_search_refines_down_true_paths_only_and_finds_the_hot_leaf() {
        let p = program();
        let (s, _) = run(&p, 100);
        assert!(s.exhausted());
        let found: Vec<Vec<String>> = s
            .bottlenecks()
            .into_iter()
            .map(|id| s.node(id).focus.path.clone())
            .collect();
        assert_eq!(found, vec![vec!["main", "a", "a1", "hot"]]);
        // Tested: main, its 3 callees, a's 2, a1's 1, hot (main skipped:
        // on the path); never the decoys' callees.
        let tested: BTreeSet<&str> = s.nodes().iter().map(|n| n.focus.function()).collect();
        assert_eq!(
            tested,
            BTreeSet::from(["main", "a", "b", "c", "a1", "a2", "hot"])
        );
        for n in s.nodes() {
            if ["b", "c", "a2"].contains(&n.focus.function()) {
                assert_eq!(n.verdict(), Verdict::False { was_true: None });
            }
        }
    }

    /// A queued node whose function the driver will not measure again is
    /// skipped with the reason; the rest of the queue still starts.
    #[test]
    fn skipped_queued_nodes_leave_the_queue_and_the_rest_start() {
        let mut s = Search::new(
            Thresholds::default(),
            &[Hypothesis::CpuBound],
            &[
                ("costly".to_string(), vec![1]),
                ("costly".to_string(), vec![2]),
                ("fine".to_string(), vec![1]),
            ],
        );
        s.skip_queued(|n| {
            (n.focus.function() == "costly").then_some(Setback::TooCostly {
                share: 0.2,
                max: 0.05,
            })
        });
        let started = s.start(|_, _| Ok(()));
        let functions: Vec<&str> = started
            .iter()
            .map(|&id| s.node(id).focus.function())
            .collect();
        assert_eq!(functions, ["fine"]);
        let skipped = s
            .nodes()
            .iter()
            .filter(|n| matches!(n.state, State::Skipped(Setback::TooCostly { .. })))
            .count();
        assert_eq!(skipped, 2);
    }

    /// A node found true whose probe then goes (too costly to keep) stays
    /// true as last measured; one still undecided is skipped.
    #[test]
    fn skipping_a_true_node_keeps_its_finding() {
        let p = program();
        let mut s = Search::new(
            Thresholds::default(),
            &[Hypothesis::CpuBound],
            &[("main".to_string(), vec![])],
        );
        let started = s.start(|_, _| Ok(()));
        let main = started[0];
        for at in 1..=20u64 {
            let whole = at * 100_000_000;
            s.observe(
                main,
                Reading {
                    at: Duration::from_millis(at * 100),
                    part_ns: whole * 95 / 100,
                    whole_ns: whole,
                },
                &p,
            );
        }
        assert!(s.node(main).is_true());
        let children = s.start(|_, _| Ok(()));
        let setback = || Setback::TooCostly {
            share: 0.2,
            max: 0.05,
        };
        s.skip(main, setback());
        assert!(s.node(main).is_true(), "{:?}", s.node(main).state);
        assert!(matches!(s.node(main).state, State::Done(_)));
        s.skip(children[0], setback());
        assert!(matches!(s.node(children[0]).state, State::Skipped(_)));
        assert!(s.bottlenecks().contains(&main));
    }

    #[test]
    fn a_budget_defers_tests_but_the_search_still_completes() {
        let p = program();
        let (s, peak) = run(&p, 2);
        assert!(peak <= 2, "peak {peak}");
        assert!(s.exhausted());
        let found: Vec<&str> = s
            .bottlenecks()
            .into_iter()
            .map(|id| s.node(id).focus.function())
            .collect();
        assert_eq!(found, vec!["hot"]);
    }

    #[test]
    fn a_node_that_falls_is_no_longer_a_bottleneck() {
        let p = program();
        let mut s = Search::new(
            Thresholds::default(),
            &[Hypothesis::IoBlocking],
            &[("c".to_string(), vec![7])],
        );
        let id = s.start(|_, _| Ok(()))[0];
        let mut whole = 0;
        let mut part = 0;
        for step in 1..=40u64 {
            whole += 100_000_000;
            part += if step <= 15 { 50_000_000 } else { 0 };
            let change = s.observe(
                id,
                Reading {
                    at: Duration::from_millis(step * 100),
                    part_ns: part,
                    whole_ns: whole,
                },
                &p,
            );
            if step == 10 {
                assert!(matches!(change, Some(Change::Refined(_, ref c)) if c.len() == 1));
                assert_eq!(s.bottlenecks(), vec![id]);
            }
        }
        assert!(matches!(
            s.node(id).verdict(),
            Verdict::False { was_true: Some(_) }
        ));
        assert!(s.bottlenecks().is_empty());
        assert_eq!(s.node(id).focus.threads, vec![7]);
    }
}
