//! Inserting probes: one transaction of ordered steps (IFUNCs resolved, other sessions read, plan, reserve, build, write, directory, threads moved, splice).

use super::*;

impl Process {
    /// Resolves an IFUNC to the implementation the process uses: from a GOT
    /// slot the dynamic loader filled, else by calling the resolver.
    pub(super) fn resolve_ifunc(
        &mut self,
        tracer: &mut Tracer,
        f: &Function,
        resolver: u64,
    ) -> Result<Function, Error> {
        let mut implementation = None;
        for slot in self.image.ifunc_slots(f)? {
            if let Ok(value) = tracer.memory().read_u64(slot) {
                if value != resolver
                    && self
                        .image
                        .module_of(value)
                        .is_some_and(|m| m.name() == f.module)
                {
                    implementation = Some(value);
                    break;
                }
            }
        }
        let implementation = match implementation {
            Some(v) => v,
            None => {
                let tid = self.call_thread(tracer)?;
                let call =
                    RemoteCall::new(&format!("{} (IFUNC resolver)", f.name), resolver, vec![]);
                tracer.call(tid, &call, false)?
            }
        };
        self.implementation(f, implementation)
    }

    /// The IFUNC `f` as its implementation at `implementation`, under the
    /// names the user's patterns matched.
    pub(super) fn implementation(
        &mut self,
        f: &Function,
        implementation: u64,
    ) -> Result<Function, Error> {
        let mut resolved = self
            .image
            .function_at(implementation)?
            .unwrap_or_else(|| Function {
                address: implementation,
                size: 0,
                padding: 0,
                ..f.clone()
            });
        // Report under the names the user's patterns matched.
        resolved.name = f.name.clone();
        resolved.aliases = f.aliases.clone();
        resolved.kind = FunctionKind::Plain;
        Ok(resolved)
    }

    /// Runs `change` as a transaction: what it took from the target (and
    /// logged in `pending`) is given back if it fails.
    pub(super) fn transaction<T>(
        &mut self,
        tracer: &mut Tracer,
        change: impl FnOnce(&mut Process, &mut Tracer) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.pending = undo::Undo::default();
        // Only the change that loads the runtime takes it back out.
        let had_runtime = self.runtime.is_some();
        let result = change(self, tracer);
        let taken = std::mem::take(&mut self.pending);
        if result.is_err() {
            self.roll_back(tracer, taken);
            if !had_runtime {
                self.unload_untouched_runtime(tracer);
            }
        }
        result
    }

    /// Inserts `specs` (one stop of the world, one transaction). Functions
    /// refused while planning — before anything is written — are left
    /// alone and returned, unless `required` holds for one of them: then
    /// nothing is changed and the error names every required one refused.
    ///
    /// The steps, in order: size the request; resolve IFUNCs; read what
    /// other sessions have in place; plan; load the runtime and take call
    /// records; build and write each trampoline (staged ones first, then
    /// the others, then companions); then [`Process::commit_probes`]
    /// enters them in the directory, moves stopped threads out of the
    /// bytes to patch and splices.
    pub(super) fn insert_probes_now(
        &mut self,
        tracer: &mut Tracer,
        specs: &[ProbeSpec],
        required: &dyn Fn(&Function) -> bool,
    ) -> Result<Applied, Error> {
        self.size_request(specs)?;
        let requests = self.resolve_ifuncs(tracer, specs)?;
        // A target without weft's runtime has no other session's probes to
        // share or take out: what must be refused is known before the
        // runtime goes in, and a refused request leaves nothing behind.
        if self.runtime.is_none() && !runtime::is_loaded(self.target.pid) {
            let must = must_refuse(&requests, self.plan_request(&requests)?.refused, required);
            if !must.is_empty() {
                return Err(Error::Refused(must));
            }
        }
        // What other sessions have in place, and what killed ones left.
        self.begin_change(tracer)?;
        self.remove_leftovers_unplanned(tracer, &requests)?;
        let Planned {
            plans,
            shares,
            companions,
            retargets,
            refused,
        } = self.plan_request(&requests)?;
        let must = must_refuse(&requests, refused.clone(), required);
        if !must.is_empty() {
            return Err(Error::Refused(must));
        }
        let refused: Vec<Refused> = refused
            .into_iter()
            .map(|(k, why)| Refused::new(requests[k].function.clone(), why))
            .collect();
        if plans.is_empty() && shares.is_empty() {
            return Ok(Applied {
                ids: Vec::new(),
                refused,
            });
        }
        let planned: Vec<&ProbeSpec> = plans.iter().map(|(r, _)| *r).collect();
        self.ensure_runtime(tracer)?;
        let build = self.prepare_build(tracer, &planned)?;

        // Build and write every trampoline (unreachable until patched):
        // counters built ahead by `hold` first, in one write per run of
        // neighbours, then the others. Their areas are mapped by bare
        // `mmap` calls.
        let (mut new_probes, mut originals, mut plans, mut moves) = self.write_staged(
            tracer,
            plans,
            build.call_tid,
            build.mmap_fn,
            build.register_fn,
        )?;
        // Where the trampolines companions and tied siblings lead into
        // are, and their copies of the displaced instructions: by patch
        // address. A sibling's is built after the one it leads into.
        let mut built: AddressMap<u64, Built> = AddressMap::default();
        let retarget_of =
            |site: &PatchSite| retargets.iter().find(|r| r.plan == site.patch_address);
        plans.sort_by_key(|(_, site)| retarget_of(site).is_some());
        let mut ties = Vec::new();
        for (request, site) in plans {
            originals.push(site.clone());
            let id = ProbeId(self.probes.len() as u32 + new_probes.len() as u32);
            let site = match retarget_of(&site) {
                Some(r) => {
                    let (of, site) = retargeted(&built, r, &site)?;
                    ties.push((id, of));
                    site
                }
                None => site,
            };
            let (probe, offsets) = self.build_probe(tracer, &build, id, request, &site)?;
            moves.extend(resumes(&site, probe.trampoline.start, &offsets));
            if companions.iter().any(|c| c.of == site.patch_address)
                || retargets.iter().any(|r| r.of == site.patch_address)
            {
                built.insert(site.patch_address, (id, probe.trampoline.start, offsets));
            }
            new_probes.push(probe);
        }
        // Companions, once the trampolines they lead into are written.
        for c in companions {
            let id = ProbeId(self.probes.len() as u32 + new_probes.len() as u32);
            let probe = self.build_companion(tracer, &build, id, &built, &c, &mut moves)?;
            originals.push(c.site.clone());
            new_probes.push(probe);
        }
        // Shared probes that time CPU need the table as much as new ones.
        let shared_cpu = shares.iter().any(|(request, _)| request.metrics.cpu);
        let ids = self.commit_probes(tracer, new_probes, &originals, &moves, &ties, shares)?;
        self.ties.extend(ties);
        self.release_forked_away(tracer);
        if build.times_cpu || shared_cpu {
            // Last, once nothing can fail (a failed insertion leaves no
            // table behind), and in the stop: threads that register or
            // arm their clocks when they run again find it.
            self.ensure_cpu_table(tracer);
        }
        Ok(Applied { ids, refused })
    }

    /// The request's size in words, call records and probes, kept for
    /// [`Process::out_of_room`]; a request more than the process can ever
    /// hold, or an exit predicate on arguments, is refused at once.
    fn size_request(&mut self, specs: &[ProbeSpec]) -> Result<(), Error> {
        self.request_size = RequestSize {
            words: specs
                .iter()
                .map(|s| u64::from(s.words(self.trace_calls)))
                .sum(),
            records: specs
                .iter()
                .filter(|s| s.hooks_exit(self.trace_calls))
                .count() as u64,
            probes: specs.len() as u64,
        };
        // More than the process can ever have: say so before planning.
        if self.request_size.records > weft_rt::layout::CALL_RECORDS as u64 {
            return Err(self.out_of_room(Room::CallRecords));
        }
        if self.request_size.probes > weft_rt::layout::DIRECTORY as u64 {
            return Err(self.out_of_room(Room::Probes));
        }
        for spec in specs {
            let exit_predicate = spec.on_exit.and_then(|p| p.predicate);
            if matches!(
                exit_predicate,
                Some(weft_codegen::Predicate::ArgEquals { .. })
            ) {
                return Err(Error::Refused(vec![Refused::new(
                    spec.function.clone(),
                    Refusal::ArgumentsAtExit,
                )]));
            }
        }
        Ok(())
    }

    /// `specs` with IFUNCs resolved to their implementations, first: the
    /// resolver may need the runtime-free world.
    fn resolve_ifuncs<'a>(
        &mut self,
        tracer: &mut Tracer,
        specs: &'a [ProbeSpec],
    ) -> Result<Vec<std::borrow::Cow<'a, ProbeSpec>>, Error> {
        let mut requests = Vec::with_capacity(specs.len());
        for spec in specs {
            requests.push(match spec.function.kind {
                FunctionKind::Ifunc { resolver } => std::borrow::Cow::Owned(ProbeSpec {
                    function: self.resolve_ifunc(tracer, &spec.function, resolver)?,
                    ..spec.clone()
                }),
                _ => std::borrow::Cow::Borrowed(spec),
            });
        }
        Ok(requests)
    }

    /// Takes out what killed sessions left at the requested functions that
    /// `prepare` did not plan (it checked the planned ones then, and their
    /// code is checked again before patching).
    fn remove_leftovers_unplanned(
        &mut self,
        tracer: &mut Tracer,
        requests: &[std::borrow::Cow<ProbeSpec>],
    ) -> Result<(), Error> {
        let unplanned: Vec<Function> = requests
            .iter()
            .filter(|r| !self.planning.plans.contains_key(&plan_key(&r.function)))
            .map(|r| r.function.clone())
            .collect();
        if !unplanned.is_empty() {
            self.remove_leftover_probes(tracer, &unplanned)?;
        }
        Ok(())
    }

    /// What building `planned`'s trampolines needs from the target: call
    /// records (taken only here: a request that cannot get them all fails
    /// before anything is built), the exit code, the runtime's addresses
    /// and a thread for `mmap` calls.
    fn prepare_build(
        &mut self,
        tracer: &mut Tracer,
        planned: &[&ProbeSpec],
    ) -> Result<BuildContext, Error> {
        let trace = self.trace_calls;
        let records = planned.iter().filter(|r| r.hooks_exit(trace)).count();
        let in_use = crate::ledger::records_used(&self.rt()?.region) as usize;
        let free = weft_rt::layout::CALL_RECORDS.saturating_sub(in_use) + self.free_records.len();
        if records > free {
            return Err(self.out_of_room(Room::CallRecords));
        }
        let wanted = planned
            .iter()
            .fold(Metrics::CALLS, |m, r| m.union(r.metrics));
        let hooks = if planned.iter().any(|r| r.hooks_exit(trace)) {
            Some(self.ensure_exits(tracer, wanted, trace)?)
        } else {
            None
        };
        if hooks.is_some() && wanted.cpu && !self.target.clocks_chosen {
            // Threads that read their CPU clock with a system call for want
            // of a perf event make one (best effort: the system call reads
            // right too).
            let _ = self.ask_for_cpu_events();
        }
        let rt = self.runtime.as_ref().expect("loaded before building");
        let header = rt.region.header();
        let (tls_offset, register_fn) = (header.tls_offset, header.register_fn);
        let (call_targets, exit_probes) = (header.call_targets, header.exit_probes);
        let mmap_fn = self
            .image
            .symbol_address("libc.so", "mmap")
            .ok_or(Error::MissingLibc("mmap"))?;
        let tls_offset = i32::try_from(tls_offset)
            .map_err(|_| Error::Internal("TLS offset beyond ±2 GiB".into()))?;
        let call_tid = self.syscall_thread(tracer)?;
        Ok(BuildContext {
            trace,
            times_cpu: hooks.is_some() && wanted.cpu,
            hooks,
            save: crate::cpu::vector_save(),
            tls_offset,
            register_fn,
            mmap_fn,
            call_targets,
            exit_probes,
            call_tid,
        })
    }

    /// Builds and writes the trampoline of `request` at `site` (its
    /// words, call record and space taken, logged for undo), returning
    /// the probe, not yet spliced, and the trampoline's instruction
    /// offsets.
    fn build_probe(
        &mut self,
        tracer: &mut Tracer,
        build: &BuildContext,
        id: ProbeId,
        request: &ProbeSpec,
        site: &PatchSite,
    ) -> Result<(Probe, Vec<(u32, u32)>), Error> {
        let f = request.function.clone();
        let words = request.words(build.trace);
        let word = self.allocate_words(words)?;
        checkpoint!(self, Words);
        let offset = weft_rt::layout::Geometry::metric_offset(word) as i32;
        let record = match (build.hooks, request.hooks_exit(build.trace)) {
            (Some(_), true) => Some(self.allocate_record()?),
            _ => None,
        };
        if record.is_some() {
            checkpoint!(self, Record);
        }
        // Over another session's probe of this function (its `jmp` is
        // what this one displaces): the function's own bytes are that
        // probe's.
        let below = self.link_below(site.patch_address, &site.original);
        let chained = below.is_some();
        let compiled_below = below.map(|p| p.compiled);
        let inside = self
            .constraint(request)
            .map_err(|why| Error::Refused(vec![Refused::new(f.clone(), why)]))?;
        let snippets = snippets_for(build, request, offset, record, chained, inside);
        let len = weft_codegen::max_trampoline_len(site, &snippets) as u64;
        let (at, stub) = self.reserve_logged(
            tracer,
            build.call_tid,
            (build.mmap_fn, build.register_fn),
            site.patch_address,
            len,
        )?;
        checkpoint!(self, Space);
        let spec = TrampolineSpec {
            address: at,
            site,
            row: ThreadRow {
                tls_offset: build.tls_offset,
                register_stub: stub,
                activity: Some(weft_rt::layout::ROW_ACTIVITY as i32),
            },
            snippets: &snippets,
        };
        let trampoline = build_trampoline(&spec)
            .map_err(|e| Error::Refused(vec![Refused::new(f.clone(), e.into())]))?;
        let (patch, original) = patch_for(site, at)?;
        // The record lets a later weft take this probe out if this weft
        // dies while it is live; it goes out with the trampoline, in one
        // write.
        crate::trampolines::write_with_record(
            tracer.memory(),
            at,
            site.patch_address,
            original,
            &trampoline.bytes,
        )?;
        if let Some(record) = record {
            let body = at + trampoline.relocated_offset as u64;
            self.write_call_record(tracer, build, request, record, body)?;
        }
        checkpoint!(self, Trampoline);
        let probe = Probe {
            id,
            function: f,
            patch_address: site.patch_address,
            original,
            patch,
            compiled: compiled_below.unwrap_or(original),
            relocated: relocated_offset(&trampoline),
            trampoline: at..at + trampoline.bytes.len() as u64,
            active: false,
            displaced: site.patch_address..site.end(),
            kind: request.kind(Words::fresh(word, words), record),
            entry: None,
            borrowed: false,
            inside: request.inside.clone(),
        };
        Ok((probe, trampoline.instruction_offsets))
    }

    /// Fills call record `record`: the address its exit code calls, the
    /// trampoline's copy of the displaced instructions at `body` (which
    /// continue into the function), and the request's exit probe if any.
    /// The old contents are logged for undo.
    fn write_call_record(
        &mut self,
        tracer: &mut Tracer,
        build: &BuildContext,
        request: &ProbeSpec,
        record: u32,
        body: u64,
    ) -> Result<(), Error> {
        let slot = build.call_targets + 8 * u64::from(record);
        let before = tracer.memory().read_vec(slot, 8)?;
        self.pending.writes.push((slot, before));
        tracer.memory().write(slot, &body.to_le_bytes())?;
        if let Some(exit) = request.on_exit {
            // The exit code calls this record's probe. Its thread
            // predicate: 0 for every thread, else 1 + the thread's index.
            let thread = match exit.predicate {
                Some(weft_codegen::Predicate::Thread(t)) => u64::from(t) + 1,
                _ => 0,
            };
            let entry: Vec<u8> = [exit.function, exit.user, request.function.address, thread]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            let at = build.exit_probes + weft_codegen::EXIT_PROBE_SIZE * u64::from(record);
            let before = tracer.memory().read_vec(at, entry.len())?;
            self.pending.writes.push((at, before));
            tracer.memory().write(at, &entry)?;
        }
        Ok(())
    }

    /// Builds and writes companion `c`: the sibling's code around its jump
    /// into a planned site, relocated with the jump sent to the copy in
    /// that site's trampoline (`built`). Its threads' moves go to `moves`.
    fn build_companion(
        &mut self,
        tracer: &mut Tracer,
        build: &BuildContext,
        id: ProbeId,
        built: &AddressMap<u64, Built>,
        c: &CompanionPlan,
        moves: &mut Vec<Resume>,
    ) -> Result<Probe, Error> {
        let Some((of, main, offsets)) = built.get(&c.of) else {
            return Err(Error::Internal("a companion's probe was not built".into()));
        };
        let copy = main + u64::from(offsets[c.target].1);
        let site = c
            .site
            .with_jump_to(c.jump, copy)
            .ok_or_else(|| Error::Internal(format!("no jump to send around at {:#x}", c.jump)))?;
        let len = weft_codegen::max_relocated_len(&site) as u64;
        let (at, _) = self.reserve_logged(
            tracer,
            build.call_tid,
            (build.mmap_fn, build.register_fn),
            site.patch_address,
            len,
        )?;
        let relocated = weft_codegen::relocate(&site, at)
            .map_err(|e| Error::Refused(vec![Refused::new(c.function.clone(), e.into())]))?;
        let (patch, original) = patch_for(&site, at)?;
        let offsets: Vec<(u32, u32)> = relocated
            .instruction_offsets
            .iter()
            .map(|&o| (o, o))
            .collect();
        moves.extend(resumes(&site, at, &offsets));
        crate::trampolines::write_with_record(
            tracer.memory(),
            at,
            site.patch_address,
            original,
            &relocated.bytes,
        )?;
        Ok(Probe {
            id,
            function: c.function.clone(),
            patch_address: site.patch_address,
            original,
            patch,
            compiled: original,
            relocated: 0,
            trampoline: at..at + relocated.bytes.len() as u64,
            active: false,
            displaced: site.patch_address..site.end(),
            kind: ProbeKind::Companion { of: *of },
            entry: None,
            borrowed: false,
            inside: Vec::new(),
        })
    }

    /// Makes written trampolines live: in the target's directory before
    /// any patch is (a weft killed in between leaves entries whose patches
    /// are not there, which the next one frees); threads stopped inside
    /// the bytes about to be overwritten moved to the same instruction's
    /// copy (moved back if the patches cannot be written); then the
    /// patches. Shared probes are borrowed last. Returns the new probes'
    /// ids (companions left out).
    fn commit_probes(
        &mut self,
        tracer: &mut Tracer,
        mut new_probes: Vec<Probe>,
        originals: &[Arc<PatchSite>],
        moves: &[Resume],
        ties: &[(ProbeId, ProbeId)],
        shares: Vec<(&ProbeSpec, usize)>,
    ) -> Result<Vec<ProbeId>, Error> {
        self.enter_in_directory(&mut new_probes, ties)?;
        checkpoint!(self, Directory);
        self.move_threads_out(tracer, moves)?;
        checkpoint!(self, Moved);
        let originals: Vec<&[u8]> = originals.iter().map(|s| &s.original[..]).collect();
        self.splice_logged(tracer, &new_probes, &originals)?;
        for probe in &mut new_probes {
            probe.active = true;
        }
        for (request, index) in shares {
            let mut probe = self.borrow(&request.function, index, request.metrics)?;
            probe.id = ProbeId((self.probes.len() + new_probes.len()) as u32);
            new_probes.push(probe);
        }
        let ids = new_probes
            .iter()
            .filter(|p| p.companion_of().is_none())
            .map(|p| p.id)
            .collect();
        self.probes.append(&mut new_probes);
        self.spare_probes = new_probes;
        if self.session.live_since.is_none() {
            self.session.live_since = Some(Instant::now());
        }
        Ok(ids)
    }
}

/// What every trampoline of one insertion is built with
/// ([`Process::prepare_build`]).
struct BuildContext {
    /// Calls are traced (`weft run --trace`).
    trace: bool,
    /// A probe times CPU: the threads' clocks want the CPU-time table.
    times_cpu: bool,
    /// The runtime's exit code, when a probe hooks exits.
    hooks: Option<weft_codegen::ExitHooks>,
    /// How trampolines that call user probes save vector registers.
    save: weft_codegen::VectorSave,
    /// The runtime's thread row, from the thread pointer.
    tls_offset: i32,
    /// The runtime's function that gives a new thread its row.
    register_fn: u64,
    /// libc's `mmap`, for trampoline areas.
    mmap_fn: u64,
    /// The runtime's call-target table (one slot per call record).
    call_targets: u64,
    /// The runtime's exit-probe table (one entry per call record).
    exit_probes: u64,
    /// The thread that makes the `mmap` calls.
    call_tid: Tid,
}

/// The snippets of `request`'s trampoline: its entry probe, then its
/// counter (and exit hook, with a call record).
fn snippets_for(
    build: &BuildContext,
    request: &ProbeSpec,
    offset: i32,
    record: Option<u32>,
    chained: bool,
    inside: weft_codegen::Inside,
) -> Vec<Snippet> {
    let mut snippets = Vec::with_capacity(2);
    if let Some(entry) = request.on_entry {
        snippets.push(Snippet::CallProbe(weft_codegen::ProbeCall {
            function: entry.function,
            user: entry.user,
            predicate: entry.predicate,
            save: build.save,
            row_index: weft_rt::layout::ROW_INDEX as i32,
            instrumented: request.function.address,
        }));
    }
    snippets.push(match (build.hooks, record) {
        (Some(hooks), Some(record)) => Snippet::CountCallHookExit {
            metric: offset,
            record,
            // Without timers when only a user probe hooks the exit (4
            // words, not 10); marked for the exit probe.
            hooks: match request.on_exit {
                Some(_) => hooks
                    .with_histogram(request.metrics.keeps_histogram())
                    .probing_exits(request.metrics.hooks_exit()),
                None => hooks.with_histogram(request.metrics.keeps_histogram()),
            }
            .tracing(build.trace)
            .chained(chained),
            inside,
        },
        _ => Snippet::CountCall { offset },
    });
    snippets
}

/// A sibling's site whose displaced jump into a planned site `r.of` goes
/// to that site's copy in its (already built) trampoline instead, and the
/// probe the two are tied to.
fn retargeted(
    built: &AddressMap<u64, Built>,
    r: &Retarget,
    site: &PatchSite,
) -> Result<(ProbeId, Arc<PatchSite>), Error> {
    let Some((of, main, offsets)) = built.get(&r.of) else {
        return Err(Error::Internal(
            "a sibling's probe was built before the one it leads into".into(),
        ));
    };
    let copy = main + u64::from(offsets[r.target].1);
    let site = site
        .with_jump_to(r.jump, copy)
        .ok_or_else(|| Error::Internal(format!("no jump to send around at {:#x}", r.jump)))?;
    Ok((*of, Arc::new(site)))
}
