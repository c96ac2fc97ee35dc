//! Several weft sessions on one process: joining, sharing or chaining probes at one function, and sweeping what dead sessions left.

use super::*;

impl Process {
    /// Before any change: loads the runtime (or joins the one loaded), takes
    /// out what killed wefts left, and reads what other sessions have in
    /// place.
    pub(super) fn begin_change(&mut self, tracer: &mut Tracer) -> Result<(), Error> {
        if self.runtime.is_none() {
            return self.ensure_runtime(tracer); // joins the session too
        }
        self.join_session(tracer)
    }

    /// Whether `request` can share `other`, another session's live probe at
    /// its function (its directory entry's index), or why not.
    pub(super) fn share_or_refuse(
        &self,
        request: &ProbeSpec,
        other: &Probe,
    ) -> Result<usize, String> {
        let rt = self.runtime.as_ref().ok_or("the runtime is not loaded")?;
        let index = other.entry.ok_or("no directory entry")?;
        let entry = rt.region.entry(index);
        let header = rt.region.header();
        let owner = (0..weft_rt::layout::SESSIONS)
            .find(|&i| entry.owners & 1 << i != 0)
            .map_or(0, |i| {
                header.sessions[i]
                    .pid
                    .load(std::sync::atomic::Ordering::Acquire)
            });
        let measures_only = request.on_entry.is_none() && request.on_exit.is_none();
        let theirs = other.metrics();
        // A histogram is not a reason to refuse: the share has one when
        // theirs does (`borrow`).
        let covered = theirs.union(request.metrics.with_histogram(false)) == theirs;
        let traced = !self.trace_calls || entry.metrics & weft_rt::layout::METRIC_TRACE != 0;
        // A constrained probe counts only some calls: never shared, either
        // way (the one asked goes over the other).
        let constrained =
            !request.inside.is_empty() || entry.metrics & weft_rt::layout::METRIC_INSIDE != 0;
        if entry.kind == weft_rt::layout::KIND_MEASURE
            && measures_only
            && covered
            && traced
            && !constrained
        {
            return Ok(index);
        }
        let how = if constrained {
            "counting only some of its calls (a constraint): stop that weft first, or ask for \
             the same"
                .to_string()
        } else if entry.kind != weft_rt::layout::KIND_MEASURE {
            "with its own probe or replacement: stop that weft first".to_string()
        } else if !measures_only {
            "(it measures it): a user probe cannot share it; stop that weft first".to_string()
        } else if !traced {
            "without tracing its calls: its probe cannot be shared by one that traces; stop \
             that weft first"
                .to_string()
        } else {
            format!(
                "measuring only {}: ask for those metrics (-m {}) to share its probe, or stop \
                 that weft first",
                theirs.names().join(","),
                theirs.names().join(",")
            )
        };
        Err(format!(
            "it is already instrumented by another weft (pid {owner}) {how}"
        ))
    }

    /// What to do about `request` at `f`, where other sessions have
    /// probes and the patch site's bytes are `current`: share one that
    /// measures what is asked (its directory index), or put this session's
    /// own probe over the one in place (the site: [`crate::chain`]), or
    /// why neither can be done.
    pub(super) fn share_or_chain(
        &self,
        request: &ProbeSpec,
        f: &Function,
        current: Option<[u8; 5]>,
    ) -> Result<AtOtherProbe, String> {
        let here: Vec<&Probe> = self
            .session
            .foreign
            .iter()
            .filter(|p| p.is_entry() && p.function.address == f.address)
            .collect();
        let mut why = None;
        for other in &here {
            match self.share_or_refuse(request, other) {
                Ok(index) => return Ok(AtOtherProbe::Share(index)),
                Err(reason) => why = why.or(Some(reason)),
            }
        }
        let why = why.unwrap_or_else(|| "it is already instrumented by another weft".into());
        // The link in place: a probe that only measures (its directory
        // kind, which `foreign_probe` reads: one that others go around, a
        // user probe or a replacement stays alone), whose trampoline can
        // pass calls on if its session leaves first.
        let front = here
            .iter()
            .find(|p| current.is_some_and(|c| c == p.patch))
            .filter(|p| matches!(p.kind, ProbeKind::Measure { .. }) && p.relocated != 0);
        let Some(front) = front else {
            return Err(why);
        };
        PatchSite::over_jump(
            front.patch_address,
            front.patch,
            front.patch_address != f.address,
        )
        .map(AtOtherProbe::Chain)
        .ok_or(why)
    }

    /// The probe (another session's, or this one's under a constrained
    /// probe) a patch that replaced `original` at `at` is chained over:
    /// the one whose trampoline that `jmp` enters.
    pub(super) fn link_below(&self, at: u64, original: &[u8]) -> Option<&Probe> {
        let target = crate::chain::jump_target(at, original)?;
        self.session
            .foreign
            .iter()
            .chain(self.probes.iter().filter(|p| p.active))
            .find(|p| p.patch_address == at && p.trampoline.start == target)
    }

    /// Takes this session's slot in the target's session table (again,
    /// after a release that left it), takes out every probe no live session
    /// owns any more (wefts that were killed: all their probes, not only
    /// those on functions asked for now), and reads the other sessions'
    /// live probes. The runtime must be loaded.
    pub(super) fn join_session(&mut self, tracer: &mut Tracer) -> Result<(), Error> {
        let rt = self.rt()?;
        let orphans = crate::ledger::sweep(&rt.region, self.session.adopt_forked);
        if self.session.slot.is_none() {
            self.session.slot = Some(
                crate::ledger::join(&rt.region, self.session.identity)
                    .ok_or(Error::TooManySessions(weft_rt::layout::SESSIONS))?,
            );
        }
        self.remove_orphans(tracer, &orphans)?;
        self.read_foreign();
        Ok(())
    }

    /// After the first insertion of a session following a forked child
    /// ([`Process::adopt_forked_probes`]): the sessions forked away let go
    /// of their probes, so those this session took over are its own, and
    /// the others come out. Best effort: what fails to come out now is
    /// still an orphan at the next change.
    pub(super) fn release_forked_away(&mut self, tracer: &mut Tracer) {
        if !std::mem::take(&mut self.session.adopt_forked) {
            return;
        }
        let Ok(rt) = self.rt() else {
            return;
        };
        let orphans = crate::ledger::sweep(&rt.region, false);
        let _ = self.remove_orphans(tracer, &orphans);
        self.read_foreign();
    }

    /// This session's bit in directory entries' owners.
    pub(super) fn owner_bit(&self) -> u32 {
        self.session.slot.map_or(0, |s| 1 << s)
    }

    /// Refreshes [`Process::foreign`] from the directory.
    pub(super) fn read_foreign(&mut self) {
        let Some(rt) = self.runtime.as_ref() else {
            return;
        };
        let mine = self.owner_bit();
        let own: AddressSet<usize> = self.probes.iter().filter_map(|p| p.entry).collect();
        self.session.foreign = crate::ledger::live_entries(&rt.region)
            .into_iter()
            .filter(|(i, e)| e.owners & mine == 0 && !own.contains(i))
            .map(|(i, e)| foreign_probe(i, &e))
            .collect();
    }

    /// Takes out the patches of `orphans` (probes whose every owner is
    /// gone) where they are still in place, points their open activations
    /// at the sink and frees their entries. Their trampolines, words and
    /// records are never reused: a thread may still be inside one.
    pub(super) fn remove_orphans(
        &mut self,
        tracer: &mut Tracer,
        orphans: &[crate::ledger::Orphan],
    ) -> Result<(), Error> {
        if orphans.is_empty() {
            return Ok(());
        }
        let mut ranges = Vec::new();
        let mut hooked = Vec::new();
        let leaving: Vec<usize> = orphans.iter().map(|o| o.index).collect();
        self.unlink(tracer, &leaving)?;
        for orphan in orphans {
            let e = &orphan.entry;
            if e.trampoline != 0 {
                ranges.push(e.trampoline..e.trampoline + e.trampoline_len);
            }
            if crate::ledger::record_of(e).is_some() {
                hooked.push(weft_rt::layout::Geometry::metric_offset(e.first_word) as i32);
            }
        }
        // Threads inside finish them normally (the memory stays).
        self.prefer_outside(tracer, |pc| ranges.iter().any(|r| r.contains(&pc)))?;
        self.retire_open_activations(tracer, &hooked)?;
        Ok(())
    }

    /// Takes the probes of directory entries `leaving` out of their sites
    /// ([`crate::chain::unlink`]): a link in front comes off (the site gets
    /// back the bytes it replaced: the function's, or the `jmp` of the link
    /// below), and so do the bypassed links it uncovers; a link under
    /// another session's is bypassed instead. Frees the entries that came
    /// off and returns those bypassed, whose trampolines, words and records
    /// must never be reused (a link over them jumps in). A patch is only
    /// ever restored while it is still in place (the library may have been
    /// unloaded and the address reused).
    pub(super) fn unlink(
        &mut self,
        tracer: &mut Tracer,
        leaving: &[usize],
    ) -> Result<Vec<usize>, Error> {
        if leaving.is_empty() {
            return Ok(Vec::new());
        }
        let rt = self.rt()?;
        let region = &rt.region;
        let sites: AddressSet<u64> = leaving
            .iter()
            .map(|&i| region.entry(i).patch_address)
            .collect();
        let mut at: AddressMap<u64, Vec<(usize, weft_rt::layout::ProbeEntry)>> =
            AddressMap::default();
        for (i, e) in crate::ledger::linked_entries(region) {
            if sites.contains(&e.patch_address) {
                at.entry(e.patch_address).or_default().push((i, e));
            }
        }
        let mut bypass = Vec::new();
        let mut free = Vec::new();
        for (site, links) in at {
            let here: Vec<usize> = leaving
                .iter()
                .copied()
                .filter(|i| links.iter().any(|(j, _)| j == i))
                .collect();
            let mut current = [0u8; 5];
            let plan = if tracer.memory().read(site, &mut current).is_ok() {
                crate::chain::unlink(&current, &links, &here)
            } else {
                crate::chain::Unlink {
                    free: here,
                    ..Default::default()
                }
            };
            if let Some(bytes) = plan.site {
                tracer.memory().write(site, &bytes)?;
            }
            free.extend(plan.free);
            bypass.extend(
                plan.bypass
                    .into_iter()
                    .filter_map(|i| links.iter().find(|(j, _)| *j == i).copied()),
            );
        }
        // A bypassed trampoline starts with a jump to its copy of the
        // displaced instructions: no thread may be inside the bytes that
        // jump overwrites (one at its first byte runs the jump).
        let heads: Vec<u64> = bypass.iter().map(|(_, e)| e.trampoline).collect();
        if !heads.is_empty() {
            self.wait_until_outside(
                tracer,
                |pc| heads.iter().any(|&t| t < pc && pc < t + 5),
                "a bypassed trampoline's head",
            )?;
        }
        let region = &self.rt()?.region;
        for (index, mut e) in bypass.iter().copied() {
            tracer
                .memory()
                .write(e.trampoline, &crate::chain::pass_through(e.relocated))?;
            e.state = weft_rt::layout::PROBE_BYPASSED;
            e.owners = 0;
            region.set_entry(index, &e);
        }
        for index in free {
            crate::ledger::free(region, index);
        }
        Ok(bypass.into_iter().map(|(i, _)| i).collect())
    }

    /// Shares another session's live probe at `f` (`entry` of the
    /// directory): this session becomes an owner and reads its words from
    /// now on, the values they hold now (the world is stopped) subtracted.
    pub(super) fn borrow(
        &mut self,
        f: &Function,
        index: usize,
        metrics: Metrics,
    ) -> Result<Probe, Error> {
        let rt = self.rt()?;
        let mut entry = rt.region.entry(index);
        // A forked child's inherited probe counted only the child's calls
        // (the runtime zeroed it at the fork): all of them are this
        // session's.
        let inherited = crate::ledger::only_forked_away(rt.region.control(), &entry);
        entry.owners |= self.owner_bit();
        rt.region.set_entry(index, &entry);
        let mut probe = foreign_probe(index, &entry);
        probe.id = ProbeId(self.probes.len() as u32);
        probe.function = f.clone();
        // Its words have a histogram only if its owner asked for one.
        let metrics = metrics.with_histogram(
            metrics.histogram && entry.metrics & weft_rt::layout::METRIC_HISTOGRAM != 0,
        );
        // Measured as asked: a share covers at most what its owner measures.
        probe.kind = ProbeKind::Measure {
            metrics,
            words: Words::fresh(entry.first_word, entry.words),
            record: crate::ledger::record_of(&entry),
        };
        // The words that add up (calls, exits, closed time, buckets).
        let words: Vec<u32> = weft_rt::layout::metric::additive(entry.words)
            .map(|o| entry.first_word + (o / 8) as u32)
            .collect();
        if inherited {
            return Ok(probe);
        }
        let used = crate::ledger::words_used(&rt.region);
        for row in rt.region.snapshot(used) {
            let base = self
                .session
                .baselines
                .entry((row.index, row.generation))
                .or_default();
            for &w in &words {
                let value = row.words.get(w as usize).copied().unwrap_or(0);
                if value != 0 {
                    base.push((w, value));
                }
            }
        }
        Ok(probe)
    }

    /// Takes out probes an earlier weft left in these functions (it was
    /// killed while they were live): their trampolines count into words
    /// this session reuses, and a new probe would stack on top of them.
    /// The original bytes come from the record in front of each trampoline.
    pub(super) fn remove_leftover_probes(
        &mut self,
        tracer: &mut Tracer,
        functions: &[Function],
    ) -> Result<(), Error> {
        let maps = crate::inspect::read_maps(self.target.pid)?;
        let mut leftovers = Vec::new();
        for f in functions {
            // This session's own probes are not leftovers.
            if self.probes.iter().any(|p| p.is_live_entry_of(f)) {
                continue;
            }
            // After an endbr64, where weft patches, or at the entry; not
            // another live session's probe (the directory names those).
            for at in [f.address, f.address + 4] {
                if self.session.foreign.iter().any(|p| p.patch_address == at) {
                    continue;
                }
                if let Some(probe) = crate::trampolines::leftover_probe(tracer.memory(), &maps, at)
                {
                    tracer
                        .memory()
                        .write(probe.patch_address, &probe.original)?;
                    leftovers.push(probe.trampoline);
                }
            }
        }
        if !leftovers.is_empty() {
            // Threads inside finish them normally (the memory stays).
            self.prefer_outside(tracer, |pc| leftovers.iter().any(|r| r.contains(&pc)))?;
        }
        Ok(())
    }
}

/// Another session's live probe (directory entry `index`) as this session
/// plans around it: its patch, displaced bytes and words.
pub(super) fn foreign_probe(index: usize, e: &weft_rt::layout::ProbeEntry) -> Probe {
    let mut original = [0u8; 5];
    original.copy_from_slice(&e.original[..5]);
    let mut patch = [0u8; 5];
    patch.copy_from_slice(&e.patch[..5]);
    let mut compiled = [0u8; 5];
    compiled.copy_from_slice(&e.compiled[..5]);
    let displaced = u64::from(e.displaced.max(5));
    Probe {
        id: ProbeId(u32::MAX),
        function: Function {
            name: format!("{:#x}", e.function),
            module: String::new(),
            module_path: std::path::PathBuf::new(),
            address: e.function,
            vaddr: 0,
            size: 0,
            kind: FunctionKind::Plain,
            source: crate::inspect::SymbolSource::Symtab,
            padding: 0,
            aliases: Vec::new(),
        },
        patch_address: e.patch_address,
        original,
        patch,
        compiled,
        relocated: e.relocated,
        trampoline: e.trampoline..e.trampoline + e.trampoline_len,
        active: true,
        displaced: e.patch_address..e.patch_address + displaced,
        kind: if e.kind == weft_rt::layout::KIND_MEASURE {
            ProbeKind::Measure {
                metrics: Metrics {
                    wall: e.metrics & weft_rt::layout::METRIC_WALL != 0,
                    cpu: e.metrics & weft_rt::layout::METRIC_CPU != 0,
                    histogram: e.metrics & weft_rt::layout::METRIC_HISTOGRAM != 0,
                },
                words: Words::fresh(e.first_word, e.words),
                record: crate::ledger::record_of(e),
            }
        } else {
            ProbeKind::Private {
                point: (e.function != e.patch_address).then_some(e.function),
            }
        },
        entry: Some(index),
        borrowed: true,
        inside: Vec::new(),
    }
}
