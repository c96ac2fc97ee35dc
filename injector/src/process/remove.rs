//! Taking probes out.

use super::*;

impl Process {
    /// [`Held::remove`].
    pub(super) fn remove_now(&mut self, tracer: &mut Tracer, ids: &[ProbeId]) -> Result<(), Error> {
        // Only the probes still in: removing one twice is a no-op. A
        // probe's companions go with it, and tied probes go together.
        let mut ids = ids.to_vec();
        loop {
            let more: Vec<ProbeId> = self
                .ties
                .iter()
                .flat_map(|&(a, b)| [(a, b), (b, a)])
                .filter(|(a, b)| ids.contains(a) && !ids.contains(b))
                .map(|(_, b)| b)
                .collect();
            if more.is_empty() {
                break;
            }
            ids.extend(more);
        }
        let ids: Vec<ProbeId> = self
            .probes
            .iter()
            .filter(|p| {
                p.active
                    && (ids.contains(&p.id) || p.companion_of().is_some_and(|of| ids.contains(&of)))
            })
            .map(|p| p.id)
            .collect();
        // A constrained probe's entry tests its constraints' nesting words:
        // they go with it or after it, never before.
        for p in self.probes.iter().filter(|p| ids.contains(&p.id)) {
            let by: Vec<String> = self
                .probes
                .iter()
                .filter(|q| q.active && !ids.contains(&q.id) && q.inside.contains(&p.id))
                .map(|q| q.function.name.clone())
                .collect();
            if !by.is_empty() {
                return Err(Error::ConstraintInUse {
                    function: p.function.name.clone(),
                    by,
                });
            }
        }
        let mine = self.session.slot.map_or(0, |s| 1u32 << s);
        let region = self.runtime.as_ref().map(|rt| &rt.region);
        let mut handed_over = Vec::new();
        let mut leaving = Vec::new();
        for probe in self
            .probes
            .iter_mut()
            .filter(|p| p.active && ids.contains(&p.id))
        {
            // A probe another live session shares stays in place, theirs
            // now: this session only stops reading it.
            if let (Some(index), Some(region)) = (probe.entry, region) {
                let mut entry = region.entry(index);
                if entry.state == weft_rt::layout::PROBE_LIVE && entry.owners & !mine != 0 {
                    entry.owners &= !mine;
                    region.set_entry(index, &entry);
                    probe.active = false;
                    probe.borrowed = true;
                    handed_over.push(probe.id);
                    continue;
                }
                if entry.state == weft_rt::layout::PROBE_LIVE {
                    // Out of its site's chain of probes, below.
                    leaving.push(index);
                    probe.active = false;
                    continue;
                }
                crate::ledger::free(region, index);
            }
            // Restore only if our jmp is still there: the library may have
            // been unloaded and the address reused.
            let mut current = [0u8; 5];
            if tracer
                .memory()
                .read(probe.patch_address, &mut current)
                .is_ok()
                && current == probe.patch
            {
                tracer
                    .memory()
                    .write(probe.patch_address, &probe.original)?;
            }
            probe.active = false;
        }
        let bypassed = self.unlink(tracer, &leaving)?;
        let ids: Vec<ProbeId> = ids
            .into_iter()
            .filter(|id| !handed_over.contains(id))
            .collect();
        let ranges: Vec<std::ops::Range<u64>> = self
            .probes
            .iter()
            .filter(|p| ids.contains(&p.id))
            .map(|p| p.trampoline.clone())
            .collect();
        // A thread still inside a trampoline finishes it normally (the code
        // stays; its space is reused only once no thread is in it, see
        // recycle_trampolines), but would count once more: let threads leave
        // first when they do so quickly.
        self.prefer_outside(tracer, |pc| ranges.iter().any(|r| r.contains(&pc)))?;
        let hooked: Vec<i32> = self
            .probes
            .iter()
            .filter(|p| ids.contains(&p.id) && p.hooks_exit())
            .filter_map(Probe::calls_word)
            .map(|word| weft_rt::layout::Geometry::metric_offset(word) as i32)
            .collect();
        self.retire_open_activations(tracer, &hooked)?;
        // Only this session's own trampolines come back to its pool (a
        // borrowed one lies in another weft's area), and not those bypassed
        // under another session's probe (it jumps into them).
        let own: Vec<std::ops::Range<u64>> = self
            .probes
            .iter()
            .filter(|p| ids.contains(&p.id) && !p.borrowed)
            .filter(|p| !p.entry.is_some_and(|e| bypassed.contains(&e)))
            .map(|p| p.trampoline.clone())
            .collect();
        self.retired.extend(own);
        self.recycle_trampolines(tracer)?;
        if !self.probes.iter().any(|p| p.active) {
            if let Some(since) = self.session.live_since.take() {
                self.session.live_for += since.elapsed();
            }
        }
        Ok(())
    }
}
