//! Preparing and checking functions before any change: what would be refused, and why.

use super::*;

impl Process {
    /// Does the work of planning that needs no stopped target — sweeping
    /// the direct branches of the modules holding `functions`, reading each
    /// function's first bytes and deciding how to patch it — so that it
    /// happens before [`Process::hold`] rather than inside the pause.
    /// Optional: [`Held::insert_counters`] does what is left itself.
    /// Sites planned here are checked against the code again, with the
    /// world stopped, right before they are patched. Once the runtime is
    /// loaded (after a first insertion), `hold` also builds the counters'
    /// trampolines of 64 or more planned functions before it stops the
    /// world, for an insertion to find them made.
    pub fn prepare(&mut self, functions: &[Function]) -> Result<(), Error> {
        for f in functions {
            self.branch_index(f.address)?;
            // What the check that a timed function is called (not jumped
            // into) reads: its module's FDEs, parsed on first use — 11 ms
            // for libc, which would otherwise go into the stop.
            if let Some(elf) = self.image.module_of(f.address).and_then(|m| m.image().ok()) {
                let _ = elf.frame_at_entry(f.vaddr);
            }
        }
        // Planning ahead is optional: on any trouble, `insert` plans.
        let Ok(maps) = crate::inspect::read_maps(self.target.pid) else {
            return Ok(());
        };
        let occupied = Occupied::of(&self.probes, &self.session.foreign);
        for f in functions {
            if f.kind != FunctionKind::Plain || self.planning.plans.contains_key(&plan_key(f)) {
                continue;
            }
            let Ok(memory) = self.reader() else {
                break; // not readable without attaching: planned when held
            };
            // A probe an earlier weft left here is taken out first, when
            // held: plan this one then.
            let leftover = [f.address, f.address + 4]
                .into_iter()
                .any(|at| crate::trampolines::leftover_probe(memory, &maps, at).is_some());
            if leftover {
                continue;
            }
            // Refusals are not kept: the code may change (a debugger's
            // breakpoint removed) before the insertion.
            if let Ok(site) = self.plan(f, &occupied) {
                self.planning.plans.insert(plan_key(f), Arc::new(site));
            }
        }
        Ok(())
    }

    /// A probe's name for messages: a companion is named after the probe
    /// it belongs to, not the sibling whose code it holds.
    pub(super) fn probe_label(&self, p: &Probe) -> String {
        match p
            .companion_of()
            .and_then(|of| self.probes.get(of.0 as usize))
        {
            Some(main) => format!(
                "the companion of {}'s probe, over a jump in {} into its patch",
                points::probe_name(main),
                p.function.name
            ),
            None => points::probe_name(p),
        }
    }

    /// Whether each of `functions` can be instrumented measuring `metrics`,
    /// without changing anything (no attach needed): the planning an
    /// insertion of them all at once does — the code at each entry, every
    /// jump into the bytes its patch would overwrite and the companion
    /// that would go around it, whether its exit may be hooked, the probes
    /// already in place — answered per function. An IFUNC is checked at
    /// the implementation the process uses, when it has chosen one yet
    /// ([`Refusal::UnresolvedIfunc`] otherwise). Functions already
    /// instrumented count as possible.
    pub fn check(&mut self, functions: &[Function], metrics: Metrics) -> Vec<Result<(), Refusal>> {
        let mut out: Vec<Result<(), Refusal>> = vec![Ok(()); functions.len()];
        let mut requests = Vec::with_capacity(functions.len());
        let mut asked = Vec::with_capacity(functions.len());
        for (i, f) in functions.iter().enumerate() {
            let f = match f.kind {
                FunctionKind::Ifunc { .. } => match self.image.resolved_address(f) {
                    Some(at) => match self.implementation(f, at) {
                        Ok(g) => g,
                        Err(e) => {
                            out[i] = Err(Refusal::Unreadable(e.to_string()));
                            continue;
                        }
                    },
                    None => {
                        out[i] = Err(Refusal::UnresolvedIfunc);
                        continue;
                    }
                },
                _ => f.clone(),
            };
            requests.push(std::borrow::Cow::Owned(ProbeSpec::measure(f, metrics)));
            asked.push(i);
        }
        match self.plan_request(&requests) {
            Ok(planned) => {
                for (k, why) in planned.refused {
                    out[asked[k]] = Err(why);
                }
            }
            Err(e) => {
                for &i in &asked {
                    out[i] = Err(Refusal::Unreadable(e.to_string()));
                }
            }
        }
        out
    }

    /// The branch index of the module holding `address`, built on first use.
    pub(super) fn branch_index(
        &mut self,
        address: u64,
    ) -> Result<Option<&crate::branches::BranchIndex>, Error> {
        let Some(module) = self.image.module_of(address) else {
            return Ok(None);
        };
        let path = module.path().to_path_buf();
        if !self.planning.branch_indexes.contains_key(&path) {
            let index = crate::branches::BranchIndex::build(module)?;
            self.planning.branch_indexes.insert(path.clone(), index);
        }
        Ok(self.planning.branch_indexes.get(&path))
    }
}

/// The refusals among `refused` (by request index) that fail the whole
/// request: those of functions `required` says were named exactly.
pub(super) fn must_refuse(
    requests: &[std::borrow::Cow<ProbeSpec>],
    refused: Vec<(usize, Refusal)>,
    required: &dyn Fn(&Function) -> bool,
) -> Vec<Refused> {
    refused
        .into_iter()
        .filter(|(k, _)| required(&requests[*k].function))
        .map(|(k, why)| Refused::new(requests[k].function.clone(), why))
        .collect()
}
