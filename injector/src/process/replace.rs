//! Replacing whole functions and redirecting call sites.

use super::*;

impl Process {
    pub(super) fn replace_function_now(
        &mut self,
        tracer: &mut Tracer,
        f: &Function,
        with: u64,
    ) -> Result<Replacement, Error> {
        let f = match f.kind {
            FunctionKind::Ifunc { resolver } => self.resolve_ifunc(tracer, f, resolver)?,
            _ => f.clone(),
        };
        self.begin_change(tracer)?;
        self.remove_leftover_probes(tracer, std::slice::from_ref(&f))?;
        let refuse = |why: Refusal| Error::Refused(vec![Refused::new(f.clone(), why)]);
        if self.probes.iter().any(|p| p.is_live_entry_of(&f)) {
            return Err(refuse(Refusal::AlreadyInstrumented));
        }
        let occupied = Occupied::of(&self.probes, &self.session.foreign);
        let site = self.plan(&f, &occupied).map_err(refuse)?;
        if let Some(other) = occupied.overlapping(
            &self.probes,
            &self.session.foreign,
            site.patch_address..site.end(),
        ) {
            return Err(refuse(Refusal::Overlaps(format!(
                "its entry's patch overlaps the probe at {:#x} ({}): remove that first",
                other.patch_address,
                self.probe_label(other)
            ))));
        }
        let len = weft_codegen::max_redirect_len(&site) as u64;
        let at = self.reserve_near(tracer, site.patch_address, len)?;
        let redirect =
            weft_codegen::build_redirect(at, &site, with).map_err(|e| refuse(e.into()))?;
        let (patch, original) = patch_for(&site, at)?;
        let record =
            crate::trampolines::record(site.patch_address, original, redirect.bytes.len() as u64);
        tracer
            .memory()
            .write(at - crate::trampolines::RECORD_LEN, &record)?;
        tracer.memory().write(at, &redirect.bytes)?;
        let id = self.splice_wordless(
            tracer,
            f,
            site.patch_address,
            original,
            patch,
            at..at + redirect.bytes.len() as u64,
            ProbeKind::Replacement { with },
        )?;
        if let Some(p) = self.probes.iter_mut().find(|p| p.id == id) {
            p.displaced = site.patch_address..site.end();
        }
        Ok(Replacement {
            id,
            original: redirect.original,
        })
    }

    /// Whether a trampoline for a patch at `at` can be placed: an area is
    /// mapped within reach, or `maps` (read on first need) has a free
    /// range there for one.
    pub(super) fn trampoline_room(&self, maps: &mut Option<Vec<Mapping>>, at: u64) -> bool {
        if self.pool.has_area_near(at) {
            return true;
        }
        if maps.is_none() {
            *maps = Some(crate::inspect::read_maps(self.target.pid).unwrap_or_default());
        }
        let maps = maps.as_deref().unwrap_or_default();
        // Unreadable maps say nothing: the reservation will tell.
        maps.is_empty() || self.pool.gap_near(maps, at).is_some()
    }

    /// Reserves `len` bytes of trampoline space within `rel32` reach of
    /// `near` (loading the runtime first: new areas register with it), with
    /// a leftover record's room in front.
    pub(super) fn reserve_near(
        &mut self,
        tracer: &mut Tracer,
        near: u64,
        len: u64,
    ) -> Result<u64, Error> {
        self.ensure_runtime(tracer)?;
        let register_fn = self
            .runtime
            .as_ref()
            .expect("loaded above")
            .region
            .header()
            .register_fn;
        let mmap_fn = self
            .image
            .symbol_address("libc.so", "mmap")
            .ok_or(Error::MissingLibc("mmap"))?;
        let tid = self.syscall_thread(tracer)?;
        let (at, _) = self
            .pool
            .reserve(tracer, tid, mmap_fn, register_fn, near, len)?;
        self.pending.space.push(at..at + len);
        Ok(at)
    }

    pub(super) fn redirect_call_now(
        &mut self,
        tracer: &mut Tracer,
        site: u64,
        to: u64,
    ) -> Result<ProbeId, Error> {
        let (f, original) = self.call_site(tracer, site)?;
        let direct = weft_codegen::jmp_rel32(site, to).ok().map(|mut call| {
            call[0] = 0xe8; // the same displacement, as a call
            call
        });
        let (patch, trampoline) = match direct {
            Some(call) => (call, site..site),
            None => {
                // Out of rel32 reach: call a `jmp [rip]` next to the site.
                let at = self.reserve_near(tracer, site, 14)?;
                let mut code = vec![0xff, 0x25, 0, 0, 0, 0];
                code.extend_from_slice(&to.to_le_bytes());
                tracer.memory().write(at, &code)?;
                let mut call = weft_codegen::jmp_rel32(site, at)
                    .map_err(|e| Error::Internal(e.to_string()))?;
                call[0] = 0xe8;
                (call, at..at + code.len() as u64)
            }
        };
        self.splice_wordless(
            tracer,
            f,
            site,
            original,
            patch,
            trampoline,
            ProbeKind::CallRedirect { to },
        )
    }

    pub(super) fn remove_call_now(
        &mut self,
        tracer: &mut Tracer,
        site: u64,
    ) -> Result<ProbeId, Error> {
        let (f, original) = self.call_site(tracer, site)?;
        const NOP5: [u8; 5] = [0x0f, 0x1f, 0x44, 0x00, 0x00];
        self.splice_wordless(
            tracer,
            f,
            site,
            original,
            NOP5,
            site..site,
            ProbeKind::CallRemoved,
        )
    }

    /// The function holding the `call rel32` at `site`, and its 5 bytes;
    /// refused when it is not one, or already changed.
    pub(super) fn call_site(
        &mut self,
        tracer: &mut Tracer,
        site: u64,
    ) -> Result<(Function, [u8; 5]), Error> {
        self.begin_change(tracer)?;
        let f = self.image.function_at(site)?.unwrap_or_else(|| Function {
            name: format!("{site:#x}"),
            module: String::new(),
            module_path: Default::default(),
            address: site,
            vaddr: site,
            size: 0,
            kind: FunctionKind::Plain,
            source: crate::inspect::SymbolSource::Symtab,
            padding: 0,
            aliases: Vec::new(),
        });
        let refuse = |why: Refusal| Error::Refused(vec![Refused::new(f.clone(), why)]);
        let mut bytes = [0u8; 5];
        tracer.memory().read(site, &mut bytes)?;
        if bytes[0] != 0xe8 {
            return Err(refuse(Refusal::NotADirectCall { site }));
        }
        if let Some(other) = Occupied::of(&self.probes, &self.session.foreign).overlapping(
            &self.probes,
            &self.session.foreign,
            site..site + 5,
        ) {
            return Err(refuse(Refusal::Overlaps(format!(
                "the call at {site:#x} is already changed, or inside the patch of the probe at \
                 {:#x} ({}): remove that first",
                other.patch_address,
                self.probe_label(other)
            ))));
        }
        Ok((f, bytes))
    }
}
