//! Planning probes before the stop: which bytes each patch displaces, where its trampoline goes, which other probes it meets.

use super::*;

impl Process {
    /// Plans an insertion of `requests` (IFUNCs resolved) without changing
    /// anything: the sites to patch, the other sessions' probes to share,
    /// the companions of sites other code jumps into, and the requests
    /// refused (by index) with the reason. The same for an insertion and
    /// for a dry run ([`Process::check`]), so that a check cannot promise
    /// what an insertion would refuse.
    pub(super) fn plan_request<'a>(
        &mut self,
        requests: &'a [std::borrow::Cow<'a, ProbeSpec>],
    ) -> Result<Planned<'a>, Error> {
        let active: AddressSet<u64> = self
            .probes
            .iter()
            .filter(|p| p.active && p.is_entry())
            .map(|p| p.function.address)
            .collect();
        let mut sites = AddressSet::default();
        // Built once: the stop of the world may plan a thousand functions.
        let occupied = Occupied::of(&self.probes, &self.session.foreign);
        let mut planned = Planned {
            plans: Vec::with_capacity(requests.len()),
            shares: Vec::new(),
            companions: Vec::new(),
            retargets: Vec::new(),
            refused: Vec::new(),
        };
        // Request index of each plan.
        let mut planned_from = Vec::with_capacity(requests.len());
        // The target's maps, read when a site has no trampoline area near.
        let mut maps = None;
        for (k, request) in requests.iter().enumerate() {
            let request: &'a ProbeSpec = request;
            let f = &request.function;
            let mut over = None;
            if active.contains(&f.address) {
                let plain = |p: &Probe| p.is_live_entry_of(f) && p.inside.is_empty();
                if request.inside.is_empty() && self.probes.iter().any(plain) {
                    continue; // already instrumented: one probe per address
                }
                // A constrained probe measures other calls than the one in
                // place (or the one in place is): it goes over it, as
                // another session's would.
                match self.over_own_probe(f)? {
                    Ok(site) => over = Some(Arc::new(site)),
                    Err(reason) => {
                        planned.refused.push((k, reason));
                        continue;
                    }
                }
            }
            // Another session's probe there: shared when it measures what
            // is asked, else this session's own probe goes over it.
            match self
                .at_other_probe(request)
                .map(|r| r.filter(|_| over.is_none()))?
            {
                None => {}
                Some(Ok(AtOtherProbe::Share(index))) => {
                    planned.shares.push((request, index));
                    continue;
                }
                Some(Ok(AtOtherProbe::Chain(site))) => over = Some(Arc::new(site)),
                Some(Err(reason)) => {
                    planned.refused.push((k, Refusal::OtherWeft(reason)));
                    continue;
                }
            }
            if let Some(reason) = self.untimeable(request)? {
                planned.refused.push((k, reason));
                continue;
            }
            if let Err(reason) = self.constraint(request) {
                planned.refused.push((k, reason));
                continue;
            }
            let cached = over
                .clone()
                .or_else(|| self.planning.plans.get(&plan_key(f)).cloned());
            let (site, entered) = match cached {
                Some(site) => (site, Vec::new()),
                None => match self.plan_shared(f, &occupied) {
                    Ok((site, entered)) => (Arc::new(site), entered),
                    Err(reason) => {
                        planned.refused.push((k, reason));
                        continue;
                    }
                },
            };
            // One probe per site, even if two names lead to it.
            if !sites.insert(site.patch_address) {
                continue;
            }
            if !self.trampoline_room(&mut maps, site.patch_address) {
                sites.remove(&site.patch_address);
                planned.refused.push((
                    k,
                    Refusal::NoRoomNearby {
                        patch_address: site.patch_address,
                    },
                ));
                continue;
            }
            // A probe over another's patch overlaps exactly that one.
            if let Some(other) = occupied
                .overlapping(
                    &self.probes,
                    &self.session.foreign,
                    site.patch_address..site.end(),
                )
                .filter(|_| over.is_none())
            {
                planned.refused.push((
                    k,
                    Refusal::Overlaps(format!(
                        "its entry's patch overlaps the probe at {:#x} ({}): remove that first",
                        other.patch_address,
                        self.probe_label(other)
                    )),
                ));
                continue;
            }
            let mut companions = Vec::with_capacity(entered.len());
            let mut failed = None;
            for branch in entered {
                match self.plan_companion(f, &site, branch, &occupied) {
                    Ok(c) => companions.push(c),
                    Err(reason) => {
                        failed = Some(reason);
                        break;
                    }
                }
            }
            if let Some(reason) = failed {
                sites.remove(&site.patch_address);
                planned.refused.push((k, reason));
                continue;
            }
            planned.companions.extend(companions);
            planned.plans.push((request, site));
            planned_from.push(k);
        }
        planned.retarget_siblings();
        planned.give_way(planned_from);
        Ok(planned)
    }

    /// Decides how to patch `f`, or says why it cannot be done safely:
    /// refused when any code jumps into the bytes the patch overwrites
    /// (see [`Process::plan_shared`] for what an insertion does instead).
    pub(super) fn plan(
        &mut self,
        f: &Function,
        occupied: &Occupied,
    ) -> Result<weft_codegen::PatchSite, Refusal> {
        let (site, entered) = self.plan_shared(f, occupied)?;
        match entered.first() {
            Some(branch) => Err(jumped_into(branch, &f.module, &site)),
            None => Ok(site),
        }
    }

    /// The site of `f`'s patch, with every direct branch from other code of
    /// the module (a sibling entry point, in hand-written assembly) that
    /// lands strictly inside the bytes it overwrites.
    pub(super) fn plan_shared(
        &mut self,
        f: &Function,
        occupied: &Occupied,
    ) -> Result<(PatchSite, Vec<weft_codegen::Branch>), Refusal> {
        // Code elsewhere in the module may jump into the patch too.
        self.branch_index(f.address)
            .map_err(|e| Refusal::Unreadable(e.to_string()))?;
        let (code, padding) = self.read_code(f, occupied)?;
        let site = analyze_entry(&FunctionCode {
            address: f.address,
            bytes: &code,
            padding: &padding,
        })?;
        let entered = self
            .image
            .module_of(f.address)
            .and_then(|m| self.planning.branch_indexes.get(m.path()))
            .map(|i| i.all_into_range(site.patch_address, site.end()).collect())
            .unwrap_or_default();
        Ok((site, entered))
    }

    /// `f`'s bytes (its size, at most [`MAX_ANALYZED`]; 16 when unknown)
    /// as compiled (probes' patches undone in the copy), and the padding
    /// after it.
    pub(super) fn read_code(
        &mut self,
        f: &Function,
        occupied: &Occupied,
    ) -> Result<(Vec<u8>, Vec<u8>), Refusal> {
        let memory = self
            .reader()
            .map_err(|e| Refusal::Unreadable(e.to_string()))?;
        let size = if f.size == 0 {
            16
        } else {
            f.size.min(MAX_ANALYZED)
        };
        let mut code = memory
            .read_vec(f.address, size as usize)
            .map_err(|e| Refusal::Unreadable(e.to_string()))?;
        let padding = if f.padding > 0 {
            memory
                .read_vec(f.address + f.size, f.padding.min(64) as usize)
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        // Instruction points in the body: decode the code as compiled.
        occupied.restore_originals(&self.probes, &self.session.foreign, f.address, &mut code);
        Ok((code, padding))
    }

    /// How the jump `branch` into the bytes `site` (of `f`) overwrites goes
    /// around the patch: the instructions of its own function around it
    /// (from itself when it can, else from up to 5 bytes before it in its
    /// block), relocated by the insertion into a companion whose copy of
    /// the jump goes to the same instruction's copy in `f`'s trampoline.
    /// So a call of the sibling never runs `f`'s snippets (it is not a
    /// call of `f`), and never lands inside the patch.
    pub(super) fn plan_companion(
        &mut self,
        f: &Function,
        site: &PatchSite,
        branch: weft_codegen::Branch,
        occupied: &Occupied,
    ) -> Result<CompanionPlan, Refusal> {
        let refuse = |why: SharedCode| Refusal::SharedCode {
            from: branch.source,
            target: branch.target,
            module: f.module.clone(),
            len: site.original.len(),
            patch_address: site.patch_address,
            why,
        };
        if !branch.kind.is_jump() {
            return Err(refuse(SharedCode::NotAJump));
        }
        let Some(target) = site
            .instructions
            .iter()
            .position(|i| i.ip() == branch.target)
        else {
            return Err(refuse(SharedCode::InsideInstruction));
        };
        let sibling = match self.image.function_at(branch.source) {
            Ok(Some(g)) if g.size > 0 => g,
            _ => return Err(refuse(SharedCode::NoFunction)),
        };
        let (code, padding) = self.read_code(&sibling, occupied)?;
        let companion = weft_codegen::analyze_at(
            &FunctionCode {
                address: sibling.address,
                bytes: &code,
                padding: &padding,
            },
            branch.source,
        )
        .map_err(|e| refuse(SharedCode::Unpatchable(e)))?;
        let range = companion.patch_address..companion.end();
        let index = self
            .image
            .module_of(branch.source)
            .and_then(|m| self.planning.branch_indexes.get(m.path()));
        if let Some(other) = index.and_then(|i| i.into_range(range.start, range.end)) {
            return Err(refuse(SharedCode::Entered {
                from: other.source,
                patch_address: range.start,
            }));
        }
        if let Some(other) = occupied.overlapping(&self.probes, &self.session.foreign, range) {
            return Err(refuse(SharedCode::InsideProbe {
                at: other.patch_address,
                name: self.probe_label(other),
            }));
        }
        Ok(CompanionPlan {
            of: site.patch_address,
            function: sibling,
            jump: branch.source,
            target,
            site: Arc::new(companion),
        })
    }

    /// The target's memory for reading: a read-only handle of our own,
    /// held or not (reading needs no attach, only the right to trace).
    pub(super) fn reader(&mut self) -> Result<&crate::memory::ProcessMemory, Error> {
        let memory = match self.target.memory.take() {
            Some(memory) => memory,
            None => crate::memory::ProcessMemory::open_read_only(self.target.pid)?,
        };
        Ok(self.target.memory.insert(memory))
    }

    /// At another session's probe of `request`'s function: shared when it
    /// measures what is asked, else this session's probe goes over it, or
    /// why neither can be; `None` when no other session's probe is there.
    fn at_other_probe(
        &mut self,
        request: &ProbeSpec,
    ) -> Result<Option<Result<AtOtherProbe, String>>, Error> {
        let f = &request.function;
        let Some(at) = self
            .session
            .foreign
            .iter()
            .find(|p| p.is_entry() && p.function.address == f.address)
            .map(|p| p.patch_address)
        else {
            return Ok(None);
        };
        let mut current = [0u8; 5];
        let readable = self.reader()?.read(at, &mut current).is_ok();
        Ok(Some(self.share_or_chain(
            request,
            f,
            readable.then_some(current),
        )))
    }

    /// Where a constrained probe of `f`, which this session has a probe at
    /// already, goes: over the probe whose `jmp` is in place (the front of
    /// the site's chain, see [`crate::chain`]), when that one can pass
    /// calls on if it leaves first.
    fn over_own_probe(&mut self, f: &Function) -> Result<Result<PatchSite, Refusal>, Error> {
        let Some(at) = self
            .probes
            .iter()
            .find(|p| p.is_live_entry_of(f))
            .map(|p| p.patch_address)
        else {
            return Ok(Err(Refusal::AlreadyInstrumented));
        };
        let mut current = [0u8; 5];
        if self.reader()?.read(at, &mut current).is_err() {
            return Ok(Err(Refusal::AlreadyInstrumented));
        }
        let front = self
            .probes
            .iter()
            .filter(|p| p.active)
            .chain(self.session.foreign.iter())
            .find(|p| p.is_entry() && p.patch_address == at && p.patch == current)
            .filter(|p| {
                matches!(
                    p.kind,
                    ProbeKind::Measure { .. } | ProbeKind::UserProbes { .. }
                ) && p.relocated != 0
            });
        Ok(front
            .and_then(|p| PatchSite::over_jump(at, p.patch, at != f.address))
            .ok_or(Refusal::AlreadyInstrumented))
    }

    /// The row words `request`'s entry tests to count only inside its
    /// constraining probes, or why they cannot be tested: each must be
    /// this session's live, timed probe at a function's entry (its nesting
    /// word is the constraint), and the request must hook its exit.
    pub(super) fn constraint(&self, request: &ProbeSpec) -> Result<weft_codegen::Inside, Refusal> {
        if request.inside.is_empty() {
            return Ok(weft_codegen::Inside::ALWAYS);
        }
        if !request.metrics.hooks_exit() {
            return Err(Refusal::Constraint(
                "a constrained probe hooks the function's exit: ask for wall or CPU time too"
                    .into(),
            ));
        }
        let mut words = Vec::with_capacity(request.inside.len());
        for id in &request.inside {
            let Some(p) = self.probes.iter().find(|p| p.id == *id) else {
                return Err(Refusal::Constraint(format!(
                    "probe {} is not one of this session's",
                    id.0
                )));
            };
            let label = &p.function.name;
            if !p.active || !p.is_entry() {
                return Err(Refusal::Constraint(format!(
                    "the probe on {label} is not live at a function's entry"
                )));
            }
            if p.function.address == request.function.address {
                return Err(Refusal::Constraint(format!(
                    "{label} cannot be constrained to its own probe"
                )));
            }
            let timed = p.metrics().hooks_exit() && !p.borrowed;
            let Some(w) = p.own_words().filter(|_| timed) else {
                return Err(Refusal::Constraint(format!(
                    "the probe on {label} does not time its calls (its nesting word is the \
                     constraint): insert it with wall or CPU time"
                )));
            };
            let base = weft_rt::layout::Geometry::metric_offset(w.first) as i32;
            words.push(base + weft_codegen::METRIC_NESTING);
        }
        weft_codegen::Inside::new(&words).map_err(|e| Refusal::Constraint(e.to_string()))
    }

    /// Why `request`, which times its function (or hooks its exit), cannot
    /// be timed, if it cannot: a function never to hook the exit of, or
    /// one not entered by calls.
    fn untimeable(&mut self, request: &ProbeSpec) -> Result<Option<Refusal>, Error> {
        if !request.hooks_exit(self.trace_calls) {
            return Ok(None);
        }
        let f = &request.function;
        let reason = std::iter::once(&f.name)
            .chain(&f.aliases)
            .find_map(|n| crate::exits::never_hook_exit(n))
            .map(str::to_string)
            .or_else(|| crate::exits::never_hook_exit_in(&self.image, f));
        if let Some(reason) = reason {
            return Ok(Some(Refusal::NotTimeable(reason)));
        }
        self.branch_index(f.address)?;
        Ok(
            crate::exits::not_called(&mut self.image, &self.planning.branch_indexes, f).map(
                |reason| {
                    // `not_called` says "cannot time it" itself.
                    let reason = reason
                        .strip_prefix("cannot time it: ")
                        .map_or(reason.clone(), str::to_string);
                    Refusal::NotTimeable(reason)
                },
            ),
        )
    }
}

pub(super) fn plan_key(f: &Function) -> (u64, u64, u64) {
    (f.address, f.size, f.padding)
}

/// The most a counter's trampoline for `site` takes of a pool, its record
/// included.
pub(super) fn counter_room(site: &PatchSite) -> u64 {
    let len = weft_codegen::max_trampoline_len(site, &[Snippet::CountCall { offset: 0 }]) as u64;
    len.div_ceil(16) * 16 + crate::trampolines::RECORD_LEN
}

impl Planned<'_> {
    /// A sibling asked for too whose own entry patch displaces a
    /// companion's jump takes the companion's part: its trampoline's copy
    /// of the jump goes to the target's copy. Not in a chain (a site both
    /// leading into another and led into), whose trampolines would need an
    /// order of their own.
    fn retarget_siblings(&mut self) {
        let planned = self;
        let companions = std::mem::take(&mut planned.companions);
        for c in companions {
            let sibling = planned.plans.iter().position(|(_, s)| {
                s.patch_address != c.of && s.instructions.iter().any(|i| i.ip() == c.jump)
            });
            let chained = |at: u64| planned.retargets.iter().any(|r| r.plan == at || r.of == at);
            match sibling {
                Some(i)
                    if !chained(planned.plans[i].1.patch_address)
                        && !planned.retargets.iter().any(|r| r.plan == c.of) =>
                {
                    let site = &mut planned.plans[i].1;
                    // A plan of its own: one built ahead (`stage_prepared`)
                    // has the jump going into the patch.
                    *site = Arc::new((**site).clone());
                    planned.retargets.push(Retarget {
                        plan: site.patch_address,
                        jump: c.jump,
                        of: c.of,
                        target: c.target,
                    });
                }
                _ => planned.companions.push(c),
            }
        }
    }

    /// A companion goes into a sibling's code: it must not overlap another
    /// patch of this insertion (the sibling's own entry, asked for too, or
    /// another companion). The function whose companion it is gives way
    /// (refused; `planned_from` is each plan's request index).
    fn give_way(&mut self, planned_from: Vec<usize>) {
        let planned = self;
        let mut ranges: Vec<(u64, u64, u64, String)> = planned
            .plans
            .iter()
            .map(|(r, s)| {
                (
                    s.patch_address,
                    s.end(),
                    s.patch_address,
                    r.function.name.clone(),
                )
            })
            .chain(planned.companions.iter().map(|c| {
                (
                    c.site.patch_address,
                    c.site.end(),
                    c.of,
                    c.function.name.clone(),
                )
            }))
            .collect();
        ranges.sort_unstable_by_key(|r| r.0);
        let mut giving_way: Vec<(u64, String)> = Vec::new();
        for pair in ranges.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            if b.0 < a.1 {
                // The one of the two that is a companion (or both).
                let companion_of = |r: &(u64, u64, u64, String)| r.0 != r.2;
                if companion_of(b) {
                    giving_way.push((b.2, a.3.clone()));
                }
                if companion_of(a) {
                    giving_way.push((a.2, b.3.clone()));
                }
            }
        }
        if !giving_way.is_empty() {
            let mut kept = Vec::with_capacity(planned.plans.len());
            for (plan, k) in std::mem::take(&mut planned.plans)
                .into_iter()
                .zip(planned_from)
            {
                match giving_way
                    .iter()
                    .find(|(of, _)| *of == plan.1.patch_address)
                {
                    Some((_, other)) => {
                        let c = planned
                            .companions
                            .iter()
                            .find(|c| c.of == plan.1.patch_address)
                            .expect("a companion gives way");
                        planned.refused.push((
                            k,
                            Refusal::SharedCode {
                                from: c.jump,
                                target: plan.1.instructions[c.target].ip(),
                                module: plan.0.function.module.clone(),
                                len: plan.1.original.len(),
                                patch_address: plan.1.patch_address,
                                why: SharedCode::OverlapsRequest {
                                    other: other.clone(),
                                },
                            },
                        ));
                    }
                    None => kept.push(plan),
                }
            }
            planned.plans = kept;
            planned
                .companions
                .retain(|c| !giving_way.iter().any(|(of, _)| *of == c.of));
            planned.refused.sort_by_key(|r| r.0);
        }
    }
}
