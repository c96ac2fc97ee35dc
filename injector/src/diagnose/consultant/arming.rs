//! Call sites armed to learn where a true caller's indirect calls go:
//! call-target points on its indirect calls and jumps, read each step,
//! and disarmed once they have been watched long enough, or at once when
//! their hits cost more than the budget (what they learned stays: the
//! callees are in the graph).

use super::*;

impl Consultant {
    /// Puts call-target points on the indirect call sites of the callers
    /// that turned true (one stop for all): the search can then refine
    /// into what they really call. Sites weft refuses are left out.
    pub(super) fn arm_callers(&mut self, process: &mut Process) -> Result<(), Error> {
        let callers = std::mem::take(&mut self.to_arm);
        let mut specs = Vec::new();
        let mut owners = Vec::new();
        for name in callers {
            let Some(f) = self.graph.function(&name).cloned() else {
                continue;
            };
            let Ok(code) = crate::code::function_code(process.image(), &f) else {
                continue;
            };
            self.armed.entry(name.clone()).or_default();
            self.armed_at.insert(name.clone(), Instant::now());
            for site in &code.calls {
                if matches!(site.target, crate::code::CallTarget::Indirect { .. }) {
                    specs.push(PointSpec::call_targets(f.clone(), site, TARGET_SLOTS));
                    owners.push(name.clone());
                }
            }
            // An indirect jump: a tail call through a table or a pointer
            // (`return handlers[i](req)`: the function's frame is gone
            // from every stack, so only this tells where it leads), or a
            // switch (its targets, inside the function, are no callees).
            for exit in &code.exits {
                if matches!(exit.kind, weft_codegen::cfg::ExitKind::IndirectJump { .. }) {
                    specs.push(PointSpec::targets_at(f.clone(), exit.address, TARGET_SLOTS));
                    owners.push(name.clone());
                }
            }
        }
        if specs.is_empty() {
            return Ok(());
        }
        let verdicts = process.check_points(&specs);
        for (owner, refusal) in owners.iter().zip(&verdicts) {
            if refusal.is_some() {
                self.unarmable.entry(owner.clone()).or_insert(0);
            }
        }
        let (specs, owners): (Vec<PointSpec>, Vec<String>) = specs
            .into_iter()
            .zip(owners)
            .zip(verdicts)
            .filter(|(_, refusal)| refusal.is_none())
            .map(|(pair, _)| pair)
            .unzip();
        if specs.is_empty() {
            return Ok(());
        }
        for (specs, owners) in specs
            .chunks(FUNCTIONS_PER_STOP * 2)
            .zip(owners.chunks(FUNCTIONS_PER_STOP * 2))
        {
            let mut held = process.hold()?;
            let ids = held.insert_points(specs);
            held.release()?;
            self.stops.note(process, "arming call sites");
            for (owner, id) in owners.iter().zip(ids?) {
                self.armed.entry(owner.clone()).or_default().push(id);
            }
        }
        Ok(())
    }

    /// Reads the armed call sites; a new target becomes a callee of its
    /// caller, and the caller's true tests are refined into it.
    pub(super) fn learn_targets(&mut self, process: &mut Process) {
        let mut learnt = Vec::new();
        for (caller, points) in &self.armed {
            for &point in points {
                let Ok(per_thread) = process.call_targets(point) else {
                    continue;
                };
                for (target, _) in per_thread.iter().flat_map(|t| t.targets.iter().copied()) {
                    learnt.push((caller.clone(), target));
                }
            }
        }
        // A target inside the caller itself is a switch's case, no call.
        let calls: Vec<(String, Function)> = learnt
            .into_iter()
            .filter_map(|(caller, target)| {
                Some((caller, process.image().function_at(target).ok()??))
            })
            .filter(|(caller, f)| &f.name != caller)
            .collect();
        self.learn_calls(process, calls);
    }

    /// Each armed call site's hits per thread (calls to every target it
    /// recorded, and past its slots), for the cost bookkeeping: a point
    /// costs about what a timed call does (counted so, conservatively).
    pub(super) fn point_hits(&self, process: &Process) -> HashMap<(u32, ProbeId), u64> {
        let mut hits = HashMap::new();
        for &point in self.armed.values().flatten() {
            let Ok(per_thread) = process.call_targets(point) else {
                continue;
            };
            for t in per_thread {
                let n = t.targets.iter().map(|&(_, calls)| calls).sum::<u64>() + t.overflow;
                hits.insert((t.tid, point), n);
            }
        }
        hits
    }

    /// Takes out the call sites of callers watched for the minimum
    /// observation time (their targets are learnt: the callees stay in
    /// the graph), and at once those whose hits cost more than
    /// `--max-overhead` (costliest callers first, until the rest is
    /// within it): learning where a hot loop's indirect calls go must not
    /// cost the target more than the tests do. One stop for all.
    pub(super) fn disarm_callers(&mut self, process: &mut Process) -> Result<(), Error> {
        let max = self.options.max_overhead;
        let settle = self.options.thresholds.min_observation;
        let mut shares: Vec<(String, f64)> = self
            .armed
            .iter()
            .map(|(caller, points)| {
                let share = points
                    .iter()
                    .filter_map(|&p| self.cost.probe_share(p))
                    .sum::<f64>();
                (caller.clone(), share)
            })
            .collect();
        shares.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let mut total: f64 = shares.iter().map(|(_, s)| s).sum();
        let mut going = Vec::new();
        for (caller, share) in shares {
            let watched = self
                .armed_at
                .get(&caller)
                .map_or(true, |at| at.elapsed() >= settle);
            if watched || share > max || total > max {
                total -= share;
                going.push(caller);
            }
        }
        if going.is_empty() {
            return Ok(());
        }
        let ids: Vec<ProbeId> = going
            .iter()
            .filter_map(|c| self.armed.remove(c))
            .flatten()
            .collect();
        if ids.is_empty() {
            return Ok(());
        }
        let mut held = process.hold()?;
        held.remove(&ids)?;
        held.release()?;
        self.stops.note(process, "disarming call sites");
        Ok(())
    }
}
