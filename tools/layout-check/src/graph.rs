//! The dependency graph between a crate's file modules, and its cycles.
//!
//! A path `crate::a::b::X`, `super::X`, `self::a::X` or `a::X` (for a child
//! module `a`) is an edge from the file it is written in to the deepest
//! file module the path names (`a/b.rs` here; an item re-exported by the
//! root, `crate::X`, names the root). Edges from a module to one of its own
//! ancestors are left out: a child using what its parent declares or
//! re-exports is the facade convention (`lib.rs` or `mod.rs` re-exports its
//! children's items, the children use them and each other through it), not
//! a layering fault. The remaining edges must form no cycle.

use std::collections::BTreeMap;

use crate::modules::Tree;

/// An edge between two files of a tree, with the first place it is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edge {
    /// The line of the first path making it, in the `from` file.
    pub line: usize,
    /// That path, as written.
    pub path: String,
}

/// Edges by (from, to) file index.
pub type Edges = BTreeMap<(usize, usize), Edge>;

/// The module a path written in `file` (inside its inline modules `inline`)
/// names, as a file index; `None` when it is not a module-tree path.
fn resolve(tree: &Tree, file: usize, inline: &[String], segments: &[String]) -> Option<usize> {
    let current = [tree.files[file].module.clone(), inline.to_vec()].concat();
    let (mut base, rest) = match segments.first().map(String::as_str) {
        Some("crate") => (Vec::new(), &segments[1..]),
        Some("self") => (current, &segments[1..]),
        Some("super") => {
            let mut base = current;
            let supers = segments.iter().take_while(|s| *s == "super").count();
            for _ in 0..supers {
                base.pop()?;
            }
            (base, &segments[supers..])
        }
        Some(first) => {
            let child = [current.clone(), vec![first.to_string()]].concat();
            if !tree.modules.contains_key(&child) {
                return None;
            }
            (current, segments)
        }
        None => return None,
    };
    for segment in rest {
        base.push(segment.clone());
        if !tree.modules.contains_key(&base) {
            base.pop();
            break;
        }
    }
    tree.modules.get(&base).copied()
}

/// Every edge of the tree, ancestors left out.
pub fn edges(tree: &Tree) -> Edges {
    let mut edges = Edges::new();
    for (from, file) in tree.files.iter().enumerate() {
        for r in &file.scan.refs {
            let Some(to) = resolve(tree, from, &r.inline, &r.segments) else {
                continue;
            };
            let target = &tree.files[to].module;
            if to == from || file.module.starts_with(target) {
                continue;
            }
            edges.entry((from, to)).or_insert_with(|| Edge {
                line: r.line,
                path: r.segments.join("::"),
            });
        }
    }
    edges
}

/// The strongly connected components of more than one node (Tarjan), each
/// sorted, in order of their first node.
pub fn cycles(nodes: usize, edges: &Edges) -> Vec<Vec<usize>> {
    let mut adjacent = vec![Vec::new(); nodes];
    for &(from, to) in edges.keys() {
        adjacent[from].push(to);
    }
    let mut t = Tarjan {
        adjacent,
        index: vec![None; nodes],
        low: vec![0; nodes],
        on_stack: vec![false; nodes],
        stack: Vec::new(),
        next: 0,
        components: Vec::new(),
    };
    for v in 0..nodes {
        if t.index[v].is_none() {
            t.connect(v);
        }
    }
    let mut found: Vec<Vec<usize>> = t
        .components
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|mut c| {
            c.sort_unstable();
            c
        })
        .collect();
    found.sort();
    found
}

struct Tarjan {
    adjacent: Vec<Vec<usize>>,
    index: Vec<Option<usize>>,
    low: Vec<usize>,
    on_stack: Vec<bool>,
    stack: Vec<usize>,
    next: usize,
    components: Vec<Vec<usize>>,
}

impl Tarjan {
    fn connect(&mut self, v: usize) {
        self.index[v] = Some(self.next);
        self.low[v] = self.next;
        self.next += 1;
        self.stack.push(v);
        self.on_stack[v] = true;
        for i in 0..self.adjacent[v].len() {
            let w = self.adjacent[v][i];
            match self.index[w] {
                None => {
                    self.connect(w);
                    self.low[v] = self.low[v].min(self.low[w]);
                }
                Some(index) if self.on_stack[w] => self.low[v] = self.low[v].min(index),
                Some(_) => {}
            }
        }
        if Some(self.low[v]) == self.index[v] {
            let mut component = Vec::new();
            while let Some(w) = self.stack.pop() {
                self.on_stack[w] = false;
                component.push(w);
                if w == v {
                    break;
                }
            }
            self.components.push(component);
        }
    }
}
