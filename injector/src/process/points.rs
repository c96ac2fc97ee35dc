//! Instruction points: probes at any instruction of a function, before and
//! after its call sites, and the recording, per thread, of where its
//! indirect calls go (dynamic call graphs).
//!
//! A point is spliced like an entry probe — a `jmp` to a trampoline — but
//! inside the function, so its trampoline steps over the red zone, and the
//! patch may start at an earlier instruction of the point's basic block
//! when the instruction itself is too short to hold it (see
//! [`weft_codegen::analyze_at`]). Every point counts how often threads
//! reach it, in a word of their own rows, like a function's calls.

use super::{
    Error, Function, Occupied, Probe, ProbeId, ProbeKind, Process, Refused, UserProbe, Words,
};
use crate::ptrace::Tracer;
use crate::refusal::Refusal;
use std::time::Instant;
use weft_codegen::cfg::{CallSite, Flow};
use weft_codegen::{
    analyze_at, build_instruction_trampoline, CallTargets, FunctionCode, PatchSite, ProbeCall,
    Snippet, ThreadRow, TrampolineSpec,
};

/// Bytes of a function read to find its instructions (the linear sweep
/// that validates a point starts at the entry).
const MAX_POINT_FUNCTION: u64 = 64 * 1024;
/// Most (target, count) slots a call-target table may have.
pub const MAX_CALL_TARGET_SLOTS: u32 = 64;

/// A probe at one instruction of a function ([`Held::insert_points`](super::Held::insert_points)).
/// Each time a thread is about to execute the instruction it is counted
/// (per thread; reports name the point `function+0xoffset`), and, if
/// asked, a user probe is called with the registers there and the target
/// of the indirect call there is recorded.
#[derive(Clone, Debug)]
pub struct PointSpec {
    /// The function holding the instruction.
    pub function: Function,
    /// The instruction's address: the first byte of one of the function's
    /// instructions (decoded from its entry), else the point is refused.
    pub address: u64,
    /// A user probe called there (before the instruction runs); its
    /// context's `point` is `WEFT_POINT_INSTRUCTION`, `args` the argument
    /// registers there, `ret`/`ret2`/`fret` `rax`/`rdx`/`xmm0` there.
    pub probe: Option<UserProbe>,
    /// For an indirect call (`call rax`, `call [rax + 8]`, `call [rip +
    /// slot]`) or jump (a PLT stub's `jmp [rip + slot]`): record which
    /// functions it reaches, per thread, in this many (target, count)
    /// slots (1..=[`MAX_CALL_TARGET_SLOTS`]); calls to further targets are
    /// counted as overflow.
    pub call_targets: Option<u32>,
}

impl PointSpec {
    /// Counting executions of the instruction at `address`.
    pub fn at(function: Function, address: u64) -> PointSpec {
        PointSpec {
            function,
            address,
            probe: None,
            call_targets: None,
        }
    }

    /// Right before the call `site` (from [`crate::code::function_code`])
    /// calls: the arguments are in place.
    pub fn before_call(function: Function, site: &CallSite) -> PointSpec {
        PointSpec::at(function, site.address)
    }

    /// Right after the call `site` returns, at the instruction its return
    /// address names: a probe there sees the results in `ret` (`rax`),
    /// `ret2` (`rdx`) and `fret` (`xmm0`). Code that jumps to that
    /// instruction from elsewhere reaches the point too.
    pub fn after_call(function: Function, site: &CallSite) -> PointSpec {
        PointSpec::at(function, site.address + site.len as u64)
    }

    /// Recording where the indirect call `site` goes, in `slots` slots.
    pub fn call_targets(function: Function, site: &CallSite, slots: u32) -> PointSpec {
        PointSpec::targets_at(function, site.address, slots)
    }

    /// Recording where the indirect call or jump at `address` goes, in
    /// `slots` slots: a call site's, or a PLT stub's `jmp [rip + slot]`
    /// (which library function calls through that stub really reach).
    pub fn targets_at(function: Function, address: u64, slots: u32) -> PointSpec {
        PointSpec {
            call_targets: Some(slots),
            ..PointSpec::at(function, address)
        }
    }

    /// The same point, calling `probe` too.
    pub fn with_probe(self, probe: UserProbe) -> PointSpec {
        PointSpec {
            probe: Some(probe),
            ..self
        }
    }

    /// Metric words: the execution counter, then the call-target table.
    fn words(&self) -> u32 {
        1 + self.call_targets.map_or(0, |slots| 2 * slots + 1)
    }
}

/// The patches planned so far in one batch of points: start → (end, the
/// point's address).
type Batch = std::collections::BTreeMap<u64, (u64, u64)>;

/// Where one indirect call site went in one thread ([`Process::call_targets`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallTargetCounts {
    /// The thread's kernel id.
    pub tid: u32,
    /// weft's index of the thread (its row).
    pub thread: u32,
    /// The functions reached, in the order the thread first reached them,
    /// with how many calls went to each.
    pub targets: Vec<(u64, u64)>,
    /// Calls to targets beyond the table's slots.
    pub overflow: u64,
}

impl Process {
    /// [`Held::insert_points`](super::Held::insert_points).
    pub(super) fn insert_points_now(
        &mut self,
        tracer: &mut Tracer,
        specs: &[PointSpec],
    ) -> Result<Vec<ProbeId>, Error> {
        self.begin_change(tracer)?;
        let functions: Vec<&Function> = specs.iter().map(|s| &s.function).collect();
        self.remove_leftover_points(tracer, &functions)?;
        let mut refused = Vec::new();
        let mut plans: Vec<(&PointSpec, PatchSite)> = Vec::with_capacity(specs.len());
        let occupied = Occupied::of(&self.probes, &self.session.foreign);
        let mut batch = Batch::new();
        for spec in specs {
            let planned = match self.checked_plan(spec) {
                Some(site) => self.place_point(&spec.function, site, &batch, &occupied),
                None => self.plan_point(spec, &batch, &occupied),
            };
            match planned {
                Ok(site) => {
                    batch.insert(site.patch_address, (site.end(), spec.address));
                    plans.push((spec, site));
                }
                Err(why) => refused.push(Refused::at_point(
                    spec.function.clone(),
                    &point_name(&spec.function, spec.address),
                    why,
                )),
            }
        }
        if !refused.is_empty() {
            return Err(Error::Refused(refused));
        }
        self.ensure_runtime(tracer)?;
        let save = crate::cpu::vector_save();
        let header = self.runtime.as_ref().expect("loaded above").region.header();
        let register_stub_fn = header.register_fn;
        let tls_offset = i32::try_from(header.tls_offset)
            .map_err(|_| Error::Internal("TLS offset beyond ±2 GiB".into()))?;
        let mmap_fn = self
            .image
            .symbol_address("libc.so", "mmap")
            .ok_or(Error::MissingLibc("mmap"))?;
        // Trampoline areas are mapped by bare `mmap` calls.
        let call_tid = self.syscall_thread(tracer)?;

        let mut new_probes: Vec<Probe> = Vec::with_capacity(plans.len());
        let mut moves = Vec::new();
        let mut originals: Vec<Vec<u8>> = Vec::with_capacity(plans.len());
        {
            for (spec, site) in &plans {
                let words = spec.words();
                let word = self.allocate_words(words)?;
                let offset = weft_rt::layout::Geometry::metric_offset(word) as i32;
                let mut snippets = vec![Snippet::CountCall { offset }];
                if let Some(probe) = spec.probe {
                    snippets.push(Snippet::CallProbe(ProbeCall {
                        function: probe.function,
                        user: probe.user,
                        predicate: probe.predicate,
                        save,
                        row_index: weft_rt::layout::ROW_INDEX as i32,
                        instrumented: spec.address,
                    }));
                }
                let table = spec.call_targets.map(|slots| CallTargets {
                    table: weft_rt::layout::Geometry::metric_offset(word + 1) as i32,
                    slots,
                });
                if let Some(table) = table {
                    snippets.push(Snippet::RecordCallTarget(table));
                }
                let len = weft_codegen::max_trampoline_len(site, &snippets) as u64;
                let (at, stub) = self.reserve_logged(
                    tracer,
                    call_tid,
                    (mmap_fn, register_stub_fn),
                    site.patch_address,
                    len,
                )?;
                let trampoline = build_instruction_trampoline(&TrampolineSpec {
                    address: at,
                    site,
                    row: ThreadRow {
                        tls_offset,
                        register_stub: stub,
                        activity: Some(weft_rt::layout::ROW_ACTIVITY as i32),
                    },
                    snippets: &snippets,
                })
                .map_err(|e| {
                    Error::Refused(vec![Refused::at_point(
                        spec.function.clone(),
                        &point_name(&spec.function, spec.address),
                        e.into(),
                    )])
                })?;
                let (patch, original) = super::patch_for(site, at)?;
                moves.extend(super::resumes(site, at, &trampoline.instruction_offsets));
                // The leftover record, as for an entry: a later weft finds
                // the point by it if this one dies while it is live.
                crate::trampolines::write_with_record(
                    tracer.memory(),
                    at,
                    site.patch_address,
                    original,
                    &trampoline.bytes,
                )?;
                new_probes.push(Probe {
                    id: ProbeId((self.probes.len() + new_probes.len()) as u32),
                    function: spec.function.clone(),
                    patch_address: site.patch_address,
                    original,
                    patch,
                    compiled: original,
                    relocated: super::relocated_offset(&trampoline),
                    trampoline: at..at + trampoline.bytes.len() as u64,
                    active: false,
                    displaced: site.patch_address..site.end(),
                    kind: ProbeKind::Point {
                        at: spec.address,
                        words: Words::fresh(word, words),
                        probe: spec.probe,
                        call_targets: spec.call_targets,
                    },
                    entry: None,
                    borrowed: false,
                    inside: Vec::new(),
                });
                originals.push(site.original.clone());
            }
        }
        // In the directory before the patches are in place; threads stopped
        // inside the bytes about to be overwritten go on in the trampolines
        // (moved back if the patches cannot be written).
        self.enter_in_directory(&mut new_probes, &[])?;
        self.move_threads_out(tracer, &moves)?;
        let originals: Vec<&[u8]> = originals.iter().map(Vec::as_slice).collect();
        self.splice_logged(tracer, &new_probes, &originals)?;
        for probe in &mut new_probes {
            probe.active = true;
        }
        let ids = new_probes.iter().map(|p| p.id).collect();
        self.probes.extend(new_probes);
        if self.session.live_since.is_none() {
            self.session.live_since = Some(Instant::now());
        }
        Ok(ids)
    }

    /// Which of `specs` [`Held::insert_points`](super::Held::insert_points) would refuse, and why
    /// (`None`: it would go in), changing nothing; the process need not be
    /// held. A tool instrumenting many points (every call site of a
    /// module, say) keeps those that pass and inserts them in one batch.
    /// The points are checked as one batch: a point overlapping an earlier
    /// one that passes is refused.
    pub fn check_points(&mut self, specs: &[PointSpec]) -> Vec<Option<String>> {
        let mut batch = Batch::new();
        let mut out = Vec::with_capacity(specs.len());
        let occupied = Occupied::of(&self.probes, &self.session.foreign);
        for spec in specs {
            match self.plan_point(spec, &batch, &occupied) {
                Ok(site) => {
                    batch.insert(site.patch_address, (site.end(), spec.address));
                    self.planning.point_plans.insert(point_key(spec), site);
                    out.push(None);
                }
                Err(why) => out.push(Some(why.to_string())),
            }
        }
        out
    }

    /// Where each thread's indirect call at the point `id` went, read from
    /// the shared region without stopping the target (exited threads'
    /// rows as [`Process::harvest`] kept them). Threads that never reached
    /// the point are left out.
    ///
    /// # Errors
    ///
    /// [`Error::NotACallTargetPoint`] when `id` is not a point inserted
    /// with [`PointSpec::call_targets`], or its words were given to a later
    /// probe.
    pub fn call_targets(&self, id: ProbeId) -> Result<Vec<CallTargetCounts>, Error> {
        let probe = self
            .probes
            .iter()
            .find(|p| p.id == id)
            .ok_or(Error::NotACallTargetPoint(id.0))?;
        let (table, slots) = match &probe.kind {
            ProbeKind::Point {
                words,
                call_targets: Some(slots),
                ..
            } if !words.recycled => (words.first + 1, *slots),
            _ => return Err(Error::NotACallTargetPoint(id.0)),
        };
        let mut out = Vec::new();
        for row in self.snapshot() {
            let word = |i: u32| row.words.get((table + i) as usize).copied().unwrap_or(0);
            let targets: Vec<(u64, u64)> = (0..slots)
                .map(|i| (word(2 * i), word(2 * i + 1)))
                .filter(|&(target, calls)| target != 0 && calls > 0)
                .collect();
            let overflow = word(2 * slots);
            if !targets.is_empty() || overflow > 0 {
                out.push(CallTargetCounts {
                    tid: row.tid,
                    thread: row.index,
                    targets,
                    overflow,
                });
            }
        }
        Ok(out)
    }

    /// Plans the point `spec` from the function's original code (active
    /// probes' patches undone in the copy read), or says why not.
    fn plan_point(
        &mut self,
        spec: &PointSpec,
        batch: &Batch,
        occupied: &Occupied,
    ) -> Result<PatchSite, Refusal> {
        let f = &spec.function;
        if let Some(slots) = spec.call_targets {
            if slots == 0 || slots > MAX_CALL_TARGET_SLOTS {
                return Err(Refusal::Point(format!(
                    "a call-target table has 1 to {MAX_CALL_TARGET_SLOTS} slots, not {slots}"
                )));
            }
        }
        if f.size == 0 {
            return Err(Refusal::Point(
                "the function's size is unknown (no symbol size, no unwind entry), so its \
                 instructions cannot be told apart from what follows it"
                    .into(),
            ));
        }
        let size = f.size.min(MAX_POINT_FUNCTION);
        if spec.address < f.address || spec.address >= f.address + size {
            return Err(Refusal::Point(format!(
                "{:#x} is outside the function ({:#x}..{:#x})",
                spec.address,
                f.address,
                f.address + f.size
            )));
        }
        let unreadable = |e: Error| Refusal::Unreadable(e.to_string());
        self.branch_index(f.address).map_err(unreadable)?;
        let memory = self.reader().map_err(unreadable)?;
        let mut code = memory
            .read_vec(f.address, size as usize)
            .map_err(|e| Refusal::Unreadable(e.to_string()))?;
        let mut padding = if f.padding > 0 {
            memory
                .read_vec(f.address + f.size, f.padding.min(64) as usize)
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        // Planned from the code as compiled: this session's patches undone.
        occupied.restore_originals(&self.probes, &self.session.foreign, f.address, &mut code);
        occupied.restore_originals(
            &self.probes,
            &self.session.foreign,
            f.address + f.size,
            &mut padding,
        );
        let site = analyze_at(
            &FunctionCode {
                address: f.address,
                bytes: &code,
                padding: &padding,
            },
            spec.address,
        )?;
        if spec.call_targets.is_some() {
            let here = weft_codegen::analyze_function(f.address, &code)
                .instruction_at(spec.address)
                .map(|i| (i.flow, i.mnemonic));
            if !matches!(
                here,
                Some((Flow::IndirectCall { .. } | Flow::IndirectJump { .. }, _))
            ) {
                return Err(Refusal::Point(format!(
                    "call targets are recorded at an indirect call or jump (`call reg`, \
                     `call [mem]`, a PLT stub's `jmp [rip + slot]`), and the instruction there \
                     is {}",
                    here.map_or("unknown".to_string(), |(_, m)| format!("a {m:?}"))
                )));
            }
        }
        self.place_point(f, site, batch, occupied)
    }

    /// The plan [`Process::check_points`] made for `spec`, if the bytes it
    /// patches are still those it was made from (nothing patched them
    /// since, the code did not change); taken out of the cache either way.
    fn checked_plan(&mut self, spec: &PointSpec) -> Option<PatchSite> {
        let site = self.planning.point_plans.remove(&point_key(spec))?;
        let memory = self.reader().ok()?;
        let now = memory
            .read_vec(site.patch_address, site.original.len())
            .ok()?;
        (now == site.original).then_some(site)
    }

    /// Checks that a planned point's patch overlaps no probe in place and
    /// no other point of the batch.
    fn place_point(
        &self,
        f: &Function,
        site: PatchSite,
        batch: &Batch,
        occupied: &Occupied,
    ) -> Result<PatchSite, Refusal> {
        let range = site.patch_address..site.end();
        if let Some(other) =
            occupied.overlapping(&self.probes, &self.session.foreign, range.clone())
        {
            return Err(Refusal::Overlaps(format!(
                "its patch ({:#x}..{:#x}) overlaps probe {} at {:#x} ({}): remove that first",
                range.start,
                range.end,
                other.id.0,
                other.patch_address,
                probe_name(other)
            )));
        }
        // The batch's patches are disjoint: only the last one starting
        // before this one ends can overlap it.
        if let Some((_, &(end, other))) = batch.range(..range.end).next_back() {
            if end > range.start {
                return Err(Refusal::Overlaps(format!(
                    "its patch ({:#x}..{:#x}) overlaps that of the point at {other:#x} in the \
                     same batch",
                    range.start, range.end
                )));
            }
        }
        let index = self
            .image
            .module_of(f.address)
            .and_then(|m| self.planning.branch_indexes.get(m.path()));
        if let Some(branch) = index.and_then(|i| i.into_range(site.patch_address, site.end())) {
            return Err(super::jumped_into(&branch, &f.module, &site));
        }
        Ok(site)
    }

    /// Takes out the probes an earlier weft (killed while they were live)
    /// left anywhere in `functions`, so that the code planned from is the
    /// original: each instruction that is a `jmp` into a weft trampoline
    /// whose record names that address gets its bytes back. Leftovers only
    /// come from before this `Process` attached, so each function is looked
    /// at once per `Process` (this runs with the world stopped).
    fn remove_leftover_points(
        &mut self,
        tracer: &mut Tracer,
        functions: &[&Function],
    ) -> Result<(), Error> {
        let todo: Vec<&Function> = functions
            .iter()
            .copied()
            .filter(|f| f.size > 0 && self.session.leftovers_checked.insert(f.address))
            .collect();
        if todo.is_empty() {
            return Ok(());
        }
        let maps = crate::inspect::read_maps(self.target.pid)?;
        let occupied = Occupied::of(&self.probes, &self.session.foreign);
        let mut leftovers = Vec::new();
        for f in todo {
            // Each restore may bring instructions the jmp hid: decode again.
            for _ in 0..64 {
                let mut code = tracer
                    .memory()
                    .read_vec(f.address, f.size.min(MAX_POINT_FUNCTION) as usize)?;
                occupied.restore_originals(
                    &self.probes,
                    &self.session.foreign,
                    f.address,
                    &mut code,
                );
                let found = weft_codegen::analyze_function(f.address, &code)
                    .instructions
                    .iter()
                    .filter(|i| code[(i.address - f.address) as usize] == 0xe9)
                    .find_map(|i| {
                        crate::trampolines::leftover_probe(tracer.memory(), &maps, i.address)
                    });
                let Some(probe) = found else { break };
                // Another live session's point (the directory names those).
                if self
                    .session
                    .foreign
                    .iter()
                    .any(|p| p.patch_address == probe.patch_address)
                {
                    break;
                }
                tracer
                    .memory()
                    .write(probe.patch_address, &probe.original)?;
                leftovers.push(probe.trampoline);
            }
        }
        if !leftovers.is_empty() {
            // Threads inside finish them normally (the memory stays).
            self.prefer_outside(tracer, |pc| leftovers.iter().any(|r| r.contains(&pc)))?;
        }
        Ok(())
    }
}

/// `function+0xoffset`, or the function's name at its entry.
pub(crate) fn point_name(f: &Function, address: u64) -> String {
    match address.checked_sub(f.address) {
        Some(0) | None => f.name.clone(),
        Some(off) => format!("{}+{off:#x}", f.name),
    }
}

/// How a probe is named in messages and reports.
pub(crate) fn probe_name(p: &Probe) -> String {
    match p.point() {
        Some(at) => point_name(&p.function, at),
        None => p.function.name.clone(),
    }
}

/// What a point's plan is kept by: its function, its address, and whether
/// it records call targets (checked only when it does).
fn point_key(spec: &PointSpec) -> (u64, u64, Option<u32>) {
    (spec.function.address, spec.address, spec.call_targets)
}
