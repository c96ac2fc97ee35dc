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

use super::search::CallGraph;
use crate::code::{function_code, plt_import};
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

/// Call graph of the functions the search has looked at.
#[derive(Debug, Default)]
pub struct StaticCallGraph {
    functions: BTreeMap<String, Function>,
    calls: BTreeMap<String, Calls>,
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

    /// Records that an indirect call in `caller` reached `target`.
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
            CallTarget::Indirect { .. } => calls.indirect_sites.push(site.address),
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
    fn callees(&self, function: &str) -> Vec<String> {
        self.calls
            .get(function)
            .map(|c| {
                c.direct
                    .iter()
                    .chain(&c.learnt)
                    .cloned()
                    .collect::<BTreeSet<_>>()
            })
            .map(|s| s.into_iter().collect())
            .unwrap_or_default()
    }
}
