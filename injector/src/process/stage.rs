//! Building and writing trampolines: staged code built before the stop, written inside it, entered in the directory and spliced in.

use super::*;

impl Process {
    /// Writes the trampolines [`Process::hold`] built ahead for the plain
    /// counters among `plans` (mapping their planned areas first: a remote
    /// `mmap` each, where they were planned), one `pwrite` per run of
    /// neighbours, and returns their probes (not active yet) with their
    /// sites, and the plans left to build. A staged trampoline whose area
    /// could not be mapped where planned is built again with the others.
    pub(super) fn write_staged<'a>(
        &mut self,
        tracer: &mut Tracer,
        plans: Vec<(&'a ProbeSpec, Arc<PatchSite>)>,
        call_tid: Tid,
        mmap_fn: u64,
        register_fn: u64,
    ) -> Result<StagedWrite<'a>, Error> {
        let plain = |r: &ProbeSpec| {
            r.metrics == Metrics::CALLS && r.on_entry.is_none() && r.on_exit.is_none()
        };
        let (mut use_staged, mut rest) = (Vec::new(), Vec::new());
        for (request, site) in plans {
            let key = plan_key(&request.function);
            match self.planning.staged.get(&key) {
                Some(s) if plain(request) && Arc::ptr_eq(&s.site, &site) => use_staged.push((
                    request,
                    self.planning.staged.remove(&key).expect("found above"),
                )),
                _ => rest.push((request, site)),
            }
        }
        if use_staged.is_empty() {
            return Ok((Vec::new(), Vec::new(), rest, Vec::new()));
        }
        let mut areas: Vec<u64> = use_staged.iter().map(|(_, s)| s.area).collect();
        areas.sort_unstable();
        areas.dedup();
        let mut lost = Vec::new();
        for area in areas {
            if !self
                .pool
                .map_planned(tracer, call_tid, mmap_fn, register_fn, area)?
            {
                lost.push(area);
            }
        }
        // Into memory touched ahead (stage_prepared): on a KVM guest a first
        // touch costs microseconds a page, and a thousand probes' records
        // take 80 pages, more than writing their trampolines.
        let mut probes = std::mem::take(&mut self.spare_probes);
        probes.clear();
        probes.reserve(use_staged.len());
        let mut sites = Vec::with_capacity(use_staged.len());
        let mut moves = Vec::new();
        // Those not written ahead (stage_prepared), to write.
        let mut unwritten = Vec::new();
        for (request, s) in use_staged {
            if lost.contains(&s.area) {
                rest.push((request, s.site));
                continue;
            }
            if !s.written {
                unwritten.push((s.at - crate::trampolines::RECORD_LEN, s.bytes));
            }
            moves.extend_from_slice(&s.resumes);
            // Given back with the rest if the insertion fails.
            self.pending.words.push((s.word, 1, false));
            self.pending.space.push(s.at..s.at + s.trampoline_len);
            probes.push(Probe {
                id: ProbeId((self.probes.len() + probes.len()) as u32),
                function: request.function.clone(),
                patch_address: s.site.patch_address,
                original: s.original,
                patch: s.patch,
                compiled: s.original,
                relocated: s.relocated,
                trampoline: s.at..s.at + s.trampoline_len,
                active: false,
                displaced: s.site.patch_address..s.site.end(),
                kind: ProbeKind::Measure {
                    metrics: Metrics::CALLS,
                    words: Words::fresh(s.word, 1),
                    record: None,
                },
                entry: None,
                borrowed: false,
                inside: Vec::new(),
            });
            sites.push(s.site);
        }
        for (at, bytes, _) in adjacent_runs(unwritten) {
            tracer.memory().write(at, &bytes)?;
        }
        Ok((probes, sites, rest, moves))
    }

    /// Builds, while the target runs, the trampolines of counters for the
    /// functions [`Process::prepare`] planned and no probe serves: with
    /// the world stopped, inserting them is then writing bytes already
    /// made. Needs the runtime loaded by an earlier hold of this process
    /// (its thread-pointer offset) and at least [`STAGE_AT_LEAST`] such
    /// functions; their areas are planned in gaps of the target's address
    /// space and mapped only when they are written. Best effort: anything
    /// that fails leaves the functions to be built when inserted.
    pub(super) fn stage_prepared(&mut self) {
        let Some(rt) = &self.runtime else { return };
        let Ok(tls_offset) = i32::try_from(rt.region.header().tls_offset) else {
            return;
        };
        let active: AddressSet<u64> = self
            .probes
            .iter()
            .filter(|p| p.active)
            .map(|p| p.patch_address)
            .collect();
        let mut todo: Vec<((u64, u64, u64), Arc<PatchSite>)> = self
            .planning
            .plans
            .iter()
            .filter(|(key, site)| {
                !self.planning.staged.contains_key(key) && !active.contains(&site.patch_address)
            })
            .map(|(key, site)| (*key, site.clone()))
            .collect();
        if todo.len() < STAGE_AT_LEAST {
            return;
        }
        todo.sort_by_key(|(_, site)| site.patch_address);
        let Ok(maps) = crate::inspect::read_maps(self.target.pid) else {
            return;
        };
        // One planned area per neighbourhood, for all of its trampolines.
        let mut areas: Vec<(u64, u64, Option<u64>)> = Vec::new();
        for (_, site) in &todo {
            let room = counter_room(site);
            match areas
                .iter_mut()
                .find(|(near, _, _)| near.abs_diff(site.patch_address) < NEIGHBOURS)
            {
                Some((_, total, _)) => *total += room,
                None => areas.push((site.patch_address, room, None)),
            }
        }
        for (near, total, at) in &mut areas {
            *at = self
                .pool
                .mapped_room(*near, *total)
                .or_else(|| self.pool.plan_area(&maps, *near, *total));
        }
        for (key, site) in todo {
            let Some(area) = areas
                .iter()
                .find(|(near, _, _)| near.abs_diff(site.patch_address) < NEIGHBOURS)
                .and_then(|(_, _, at)| *at)
            else {
                continue;
            };
            let Ok(staged) = self.stage(&site, area, tls_offset) else {
                return;
            };
            self.planning.staged.insert(key, staged);
        }
        // The probes' records of an insertion of them, and their directory
        // entries, in memory touched now rather than in the stop of the
        // world.
        let staged = self.planning.staged.len();
        if let Some(rt) = &self.runtime {
            let used = rt
                .region
                .header()
                .directory_used
                .load(std::sync::atomic::Ordering::Acquire) as usize;
            rt.region.prefault_entries(used, staged);
        }
        prefault(&mut self.probes, staged);
        prefault(&mut self.spare_probes, staged);
        // Those in areas already mapped go in now, while the target runs:
        // unreachable until patched, they leave only the patches for the
        // stop of the world. One write per run of neighbours.
        let Ok(memory) = crate::memory::ProcessMemory::open(self.target.pid) else {
            return;
        };
        let mut ready: Vec<&mut Staged> = self
            .planning
            .staged
            .values_mut()
            .filter(|s| !s.written && self.pool.is_mapped(s.area))
            .collect();
        ready.sort_by_key(|s| s.at);
        let items = ready
            .iter()
            .map(|s| (s.at - crate::trampolines::RECORD_LEN, s.bytes.clone()))
            .collect();
        for (at, bytes, members) in adjacent_runs(items) {
            if memory.write(at, &bytes).is_ok() {
                for s in &mut ready[members] {
                    s.written = true;
                }
            }
        }
    }

    /// A counter's trampoline for `site`, built for a place in the planned
    /// `area`, and its metric word.
    pub(super) fn stage(
        &mut self,
        site: &Arc<PatchSite>,
        area: u64,
        tls_offset: i32,
    ) -> Result<Staged, Error> {
        let word = self.allocate_words(1)?;
        let offset = weft_rt::layout::Geometry::metric_offset(word) as i32;
        let snippets = [Snippet::CountCall { offset }];
        let len = weft_codegen::max_trampoline_len(site, &snippets) as u64;
        let (at, stub) = self
            .pool
            .reserve_planned(area, len)
            .ok_or_else(|| Error::Internal("the planned area is full".into()))?;
        let spec = TrampolineSpec {
            address: at,
            site,
            row: ThreadRow {
                tls_offset,
                register_stub: stub,
                activity: Some(weft_rt::layout::ROW_ACTIVITY as i32),
            },
            snippets: &snippets,
        };
        let trampoline = build_trampoline(&spec).map_err(|e| Error::Internal(e.to_string()))?;
        let (patch, original) = patch_for(site, at)?;
        let mut bytes =
            crate::trampolines::record(site.patch_address, original, trampoline.bytes.len() as u64)
                .to_vec();
        bytes.extend_from_slice(&trampoline.bytes);
        // int3 up to the end of its space: neighbours go out in one write.
        let room = crate::trampolines::RECORD_LEN + len.div_ceil(16) * 16;
        if bytes.len() as u64 <= room {
            bytes.resize(room as usize, 0xcc);
        }
        let resumes = resumes(site, at, &trampoline.instruction_offsets).collect();
        Ok(Staged {
            resumes,
            site: site.clone(),
            word,
            area,
            at,
            trampoline_len: trampoline.bytes.len() as u64,
            bytes,
            original,
            patch,
            relocated: relocated_offset(&trampoline),
            written: false,
        })
    }

    /// Writes `patch` over the 5 bytes at `at` with no thread inside them,
    /// and records it as an active word-less probe of `kind` (a
    /// replacement, a call redirected or removed), removable like any
    /// other.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn splice_wordless(
        &mut self,
        tracer: &mut Tracer,
        function: Function,
        at: u64,
        original: [u8; 5],
        patch: [u8; 5],
        trampoline: std::ops::Range<u64>,
        kind: ProbeKind,
    ) -> Result<ProbeId, Error> {
        self.wait_until_outside(tracer, |pc| at < pc && pc < at + 5, "a patch site")?;
        let id = ProbeId(self.probes.len() as u32);
        let mut probe = [Probe {
            id,
            function,
            patch_address: at,
            original,
            patch,
            compiled: original,
            relocated: 0,
            trampoline,
            active: true,
            displaced: at..at + 5,
            kind,
            entry: None,
            borrowed: false,
            inside: Vec::new(),
        }];
        self.enter_in_directory(&mut probe, &[])?;
        tracer.memory().write(at, &patch)?;
        let [probe] = probe;
        self.probes.push(probe);
        Ok(id)
    }

    /// Enters `probes` (about to be patched) in the target's directory,
    /// owned by this session.
    pub(super) fn enter_in_directory(
        &mut self,
        probes: &mut [Probe],
        tied: &[(ProbeId, ProbeId)],
    ) -> Result<(), Error> {
        let owners = self.owner_bit();
        let rt = self.runtime.as_ref().ok_or_else(no_runtime)?;
        // A probe other code goes around (companions, a tied sibling) is
        // private, and so is the tied sibling: a session sharing one would
        // not know to take the others out with it.
        let private: Vec<ProbeId> = probes
            .iter()
            .filter_map(Probe::companion_of)
            .chain(tied.iter().flat_map(|&(a, b)| [a, b]))
            .collect();
        let entries: Vec<weft_rt::layout::ProbeEntry> = probes
            .iter()
            .map(|p| {
                let traced = self.trace_calls && p.hooks_exit();
                directory_entry(p, owners, private.contains(&p.id), traced)
            })
            .collect();
        let Some(indices) = crate::ledger::add_all(&rt.region, &entries) else {
            return Err(self.out_of_room(Room::Probes));
        };
        for (probe, index) in probes.iter_mut().zip(indices) {
            // Freed again if the change fails (`roll_back`).
            self.pending.entries.push(index);
            probe.entry = Some(index);
        }
        Ok(())
    }

    /// Writes the patches of `probes` ([`splice`]); on failure, forgets the
    /// plans whose code changed, and when a patch may have stayed in place
    /// (putting a page back failed too), keeps what the change took: its
    /// trampolines may be reached, and its directory entries let a later
    /// weft take the patch out.
    pub(super) fn splice_logged(
        &mut self,
        tracer: &mut Tracer,
        probes: &[Probe],
        originals: &[&[u8]],
    ) -> Result<(), Error> {
        #[cfg(debug_assertions)]
        let fail_after = match self.checkpoint(undo::Fault::Splice) {
            Ok(()) => usize::MAX,
            Err(_) => 1,
        };
        #[cfg(not(debug_assertions))]
        let fail_after = usize::MAX;
        match splice(tracer.memory(), probes, originals, fail_after) {
            Ok(()) => Ok(()),
            Err((e, patched)) => {
                if let Error::Refused(refused) = &e {
                    // Planned from code that has changed since: plan again.
                    for r in refused {
                        self.planning.plans.remove(&plan_key(&r.function));
                    }
                }
                if patched {
                    self.pending = undo::Undo::default();
                }
                Err(e)
            }
        }
    }
}

/// `items` (address, bytes) gathered into runs of neighbours, each the
/// next one's address being where the last one ends: (start, the run's
/// bytes, the items it holds), for one write each.
pub(super) fn adjacent_runs(
    items: Vec<(u64, Vec<u8>)>,
) -> Vec<(u64, Vec<u8>, std::ops::Range<usize>)> {
    let mut runs: Vec<(u64, Vec<u8>, std::ops::Range<usize>)> = Vec::new();
    for (i, (at, bytes)) in items.into_iter().enumerate() {
        match runs.last_mut() {
            Some((start, so_far, members)) if *start + so_far.len() as u64 == at => {
                so_far.extend_from_slice(&bytes);
                members.end = i + 1;
            }
            _ => runs.push((at, bytes, i..i + 1)),
        }
    }
    runs
}

/// Reserves room for `additional` more elements of `v` and touches every
/// page of it, so that filling it later, in a stop of the world, takes no
/// page fault (each costs microseconds on a KVM guest).
pub(super) fn prefault<T>(v: &mut Vec<T>, additional: usize) {
    v.reserve(additional);
    let spare = v.spare_capacity_mut();
    let len = std::mem::size_of_val(spare);
    let base = spare.as_mut_ptr().cast::<u8>();
    for offset in (0..len).step_by(PAGE as usize) {
        // SAFETY: `offset` is inside the spare capacity just reserved:
        // memory the vector owns and has not initialised; a byte written
        // there is never read as an element.
        unsafe { base.add(offset).write_volatile(0) };
    }
}

/// The directory entry of `probe`, owned by `owners`. Only a probe that
/// just measures a function's entry may be shared by another session.
pub(super) fn directory_entry(
    probe: &Probe,
    owners: u32,
    private: bool,
    traced: bool,
) -> weft_rt::layout::ProbeEntry {
    use weft_rt::layout as l;
    let shareable = matches!(probe.kind, ProbeKind::Measure { .. }) && !private;
    let metrics = probe.metrics();
    let words = probe.words().copied().unwrap_or(Words::fresh(0, 0));
    let mut original = [0u8; 8];
    original[..5].copy_from_slice(&probe.original);
    let mut patch = [0u8; 8];
    patch[..5].copy_from_slice(&probe.patch);
    let mut compiled = [0u8; 8];
    compiled[..5].copy_from_slice(&probe.compiled);
    l::ProbeEntry {
        state: l::PROBE_LIVE,
        owners,
        kind: if shareable {
            l::KIND_MEASURE
        } else {
            l::KIND_PRIVATE
        },
        metrics: if metrics.wall { l::METRIC_WALL } else { 0 }
            | if metrics.cpu { l::METRIC_CPU } else { 0 }
            | if metrics.keeps_histogram() {
                l::METRIC_HISTOGRAM
            } else {
                0
            }
            | if traced { l::METRIC_TRACE } else { 0 }
            | if probe.inside.is_empty() {
                0
            } else {
                l::METRIC_INSIDE
            },
        first_word: words.first,
        words: words.len,
        record: probe.record().unwrap_or(l::NO_RECORD),
        displaced: u16::try_from(probe.displaced.end - probe.displaced.start).unwrap_or(u16::MAX),
        relocated: probe.relocated,
        function: probe.point().unwrap_or(probe.function.address),
        patch_address: probe.patch_address,
        trampoline: probe.trampoline.start,
        trampoline_len: probe.trampoline.end - probe.trampoline.start,
        original,
        patch,
        compiled,
    }
}

/// Writes every probe's `jmp`, the world stopped: one read and one
/// `pwrite` per page of patches (a write within a page is done whole or
/// not at all, even if weft is killed; a patch across a page boundary gets
/// its own write). First checks that the bytes each patch displaces are
/// still `originals` (they were read when planned, perhaps while the
/// target ran): if any changed, nothing is written. If a write fails, the
/// pages already written are put back. The error says whether a patch may
/// remain (only if putting a page back failed too).
pub(super) fn splice(
    memory: &crate::memory::ProcessMemory,
    probes: &[Probe],
    originals: &[&[u8]],
    fail_after: usize,
) -> Result<(), (Error, bool)> {
    let mut order: Vec<usize> = (0..probes.len()).collect();
    order.sort_by_key(|&i| probes[i].patch_address);
    // Groups of probes (ranges of `order`) whose patches lie in one page.
    let page_of = |i: usize| {
        let at = probes[i].patch_address;
        (at / PAGE == (at + 4) / PAGE).then_some(at / PAGE)
    };
    let mut groups: Vec<std::ops::Range<usize>> = Vec::new();
    for (k, &i) in order.iter().enumerate() {
        match groups.last_mut() {
            Some(g) if page_of(i).is_some() && page_of(order[g.start]) == page_of(i) => {
                g.end = k + 1
            }
            _ => groups.push(k..k + 1),
        }
    }
    // Read and check every group first: nothing is written unless all the
    // code is as planned.
    let mut pages = Vec::with_capacity(groups.len());
    let mut changed = Vec::new();
    for g in &groups {
        let members = &order[g.clone()];
        let lo = probes[members[0]].patch_address;
        let hi = members
            .iter()
            .map(|&i| probes[i].patch_address + originals[i].len().max(5) as u64)
            .max()
            .expect("groups are not empty");
        let current = memory
            .read_vec(lo, (hi - lo) as usize)
            .map_err(|e| (e.into(), false))?;
        let mut patched = current.clone();
        for &i in members {
            let off = (probes[i].patch_address - lo) as usize;
            if current[off..off + originals[i].len()] != *originals[i] {
                changed.push(Refused::new(
                    probes[i].function.clone(),
                    Refusal::CodeChanged,
                ));
            }
            patched[off..off + 5].copy_from_slice(&probes[i].patch);
        }
        // Only up to the last patched byte: the rest was read to check.
        let end = members
            .iter()
            .map(|&i| probes[i].patch_address + 5)
            .max()
            .expect("groups are not empty");
        let len = (end - lo) as usize;
        pages.push((lo, current[..len].to_vec(), patched[..len].to_vec()));
    }
    if !changed.is_empty() {
        return Err((Error::Refused(changed), false));
    }
    for (k, (lo, _, patched)) in pages.iter().enumerate() {
        // (A test's injected failure: the page write after `fail_after`.)
        let written = if k >= fail_after {
            Err(crate::memory::MemoryError::Access {
                op: "write",
                pid: 0,
                address: *lo,
                len: patched.len(),
                source: std::io::Error::other("a failure a test injected"),
            })
        } else {
            memory.write(*lo, patched)
        };
        if let Err(e) = written {
            // Undo: the target must never keep half an insertion.
            let kept = pages[..k]
                .iter()
                .any(|(lo, original, _)| memory.write(*lo, original).is_err());
            return Err((e.into(), kept));
        }
    }
    Ok(())
}
