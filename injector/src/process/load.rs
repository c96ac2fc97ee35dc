//! Loading weft's runtime into the target: the library, its exit code, the trace ring, and unloading it when the first change fails.

use super::*;

impl Process {
    pub(super) fn ensure_runtime(&mut self, tracer: &mut Tracer) -> Result<(), Error> {
        self.load_runtime_alone(tracer)?;
        // Exit hooks are enabled in every session, even one that only
        // counts calls, so that every thread gets its return-slot block at
        // registration and a later session can time it (a quick check of
        // the region's flags once they are).
        self.ensure_exits(tracer, Metrics::CALLS, false)?;
        Ok(())
    }

    /// Loads the runtime and joins its session, if not done yet; nothing
    /// may be inserted before the exit code is in ([`Self::ensure_runtime`]).
    pub(crate) fn load_runtime_alone(&mut self, tracer: &mut Tracer) -> Result<(), Error> {
        if self.runtime.is_some() {
            return Ok(());
        }
        let tid = self.call_thread(tracer)?;
        // Nothing is reset: the words of probes other sessions still have
        // in place keep counting, and fresh words were never written.
        let rt = runtime::load(
            tracer,
            &mut self.image,
            tid,
            self.options,
            0,
            self.target.load_world,
        )?;
        self.runtime = Some(rt);
        self.join_session(tracer)?;
        Ok(())
    }

    /// Makes sure the installed exit code serves `metrics` (installing one
    /// for the union of what it serves and `metrics` when not: whichever
    /// weft installed it, never less than it served), and returns the
    /// layout entry snippets must use.
    pub(crate) fn ensure_exits(
        &mut self,
        tracer: &mut Tracer,
        metrics: Metrics,
        trace: bool,
    ) -> Result<weft_codegen::ExitHooks, Error> {
        use weft_rt::layout::{EXITS_CPU, EXITS_INSTALLED, EXITS_TRACE, EXITS_WALL};
        if trace {
            self.ensure_trace_ring()?;
        }
        let rt = self.rt()?;
        let control = rt.region.control();
        let flags = control
            .exit_flags
            .load(std::sync::atomic::Ordering::Acquire);
        // The exit code serves histograms whenever it times wall time.
        let metrics = metrics.with_histogram(false);
        let installed = (flags & EXITS_INSTALLED != 0).then_some(Metrics {
            wall: flags & EXITS_WALL != 0,
            cpu: flags & EXITS_CPU != 0,
            histogram: false,
        });
        let traces = flags & EXITS_TRACE != 0;
        let serves = |have: &Metrics| have.union(metrics) == *have && (traces || !trace);
        if let Some(have) = installed.filter(serves) {
            let code = control.exit_code.load(std::sync::atomic::Ordering::Acquire);
            let hooks = crate::exits::hooks(rt.region.header(), code, have.timers(), traces)?;
            self.exits = Some((have, hooks));
            return Ok(hooks);
        }
        let wanted = installed.unwrap_or(Metrics::CALLS).union(metrics);
        let wanted_trace = traces || trace;
        let tid = self.call_thread(tracer)?;
        let mmap_fn = self
            .image
            .symbol_address("libc.so", "mmap")
            .ok_or(Error::MissingLibc("mmap"))?;
        let rt = self.rt()?;
        let enable_fn = runtime::export_address(rt.base, "weft_rt_enable_exits")?;
        let rt_base = rt.base;
        let rt = self.runtime.as_ref().expect("checked above");
        let hooks = crate::exits::Installer {
            tracer,
            tid,
            pool: &mut self.pool,
            mmap_fn,
            rt_base,
            enable_fn,
        }
        .install(rt.region.header(), wanted.timers(), wanted_trace)?;
        let control = rt.region.control();
        control.exit_code.store(
            hooks.exit_code_address(),
            std::sync::atomic::Ordering::Release,
        );
        let flags = EXITS_INSTALLED
            | if wanted.wall { EXITS_WALL } else { 0 }
            | if wanted.cpu { EXITS_CPU } else { 0 }
            | if wanted_trace { EXITS_TRACE } else { 0 };
        control
            .exit_flags
            .store(flags, std::sync::atomic::Ordering::Release);
        self.exits = Some((wanted, hooks));
        Ok(hooks)
    }

    /// Makes the threads' trace rings if no weft did yet (the top
    /// [`weft_rt::layout::trace::ring_bytes`] of every row, one place for
    /// the process, kept for good: installed exit code writes there), and
    /// starts this session's log of them.
    pub(super) fn ensure_trace_ring(&mut self) -> Result<(), Error> {
        use std::sync::atomic::Ordering;
        let pid = self.target.pid;
        let mine = self.owner_bit();
        let rt = self.rt()?;
        // One reader per ring: no other live weft may trace too (the
        // directory's live probes are those of live sessions).
        let other = crate::ledger::live_entries(&rt.region)
            .into_iter()
            .map(|(_, e)| e)
            .find(|e| e.metrics & weft_rt::layout::METRIC_TRACE != 0 && e.owners & !mine != 0);
        if let Some(e) = other {
            let header = rt.region.header();
            let other = (0..weft_rt::layout::SESSIONS)
                .find(|&i| e.owners & !mine & (1 << i) != 0)
                .map_or(0, |i| header.sessions[i].pid.load(Ordering::Acquire));
            return Err(crate::trace::CallTraceError::OtherWeft(other).into());
        }
        let control = rt.region.control();
        if control.trace_ring.load(Ordering::Acquire) == 0 {
            let metric_words = rt.region.geometry().metric_words;
            let used = crate::ledger::words_used(&rt.region);
            let Some((capacity, first)) = crate::trace::ring_place(metric_words, used)? else {
                return Err(self.out_of_room(Room::MetricWords));
            };
            control.trace_capacity.store(capacity, Ordering::Release);
            control.trace_ring.store(first + 1, Ordering::Release);
        }
        if self.trace.is_none() {
            let header = rt.region.header();
            let first = header.trace_ring.load(Ordering::Acquire) - 1;
            let capacity = header.trace_capacity.load(Ordering::Acquire);
            let budget = crate::trace::budget()?;
            let log = crate::trace::TraceLog::new(
                pid,
                first,
                capacity,
                header.timer_ns_per_tick_q32,
                budget,
            );
            let log = std::sync::Arc::new(std::sync::Mutex::new(log));
            self.trace_drainer = rt
                .region
                .reopen(pid)
                .ok()
                .and_then(|region| crate::trace::Drainer::start(&log, region));
            self.trace = Some(log);
        }
        Ok(())
    }

    /// Copies the threads' new trace events out of their rings (`force`:
    /// every row, not only those whose activity moved), naming the
    /// functions this session traces. Unforced, it only names them while
    /// the drain thread runs: that thread is real-time, this one is not,
    /// and a drain preempted half way here would hold the log from it
    /// while the rings fill (a loaded CI machine dropped 39,749 events).
    pub(super) fn drain_trace(&self, force: bool) {
        let (Some(trace), Some(rt)) = (&self.trace, &self.runtime) else {
            return;
        };
        let mut log = trace.lock().unwrap_or_else(|p| p.into_inner());
        for p in &self.probes {
            if let Some(words) = p.words() {
                log.name_function(words.first, &points::probe_name(p));
            }
        }
        if force || self.trace_drainer.is_none() {
            log.drain_all(&rt.region, force);
        }
    }

    /// Whether the functions this session instruments from now on have
    /// their calls traced (`-m …,trace`, see `docs/trace.md`): their exits
    /// are hooked (even without timers) and every entry and exit goes into
    /// the thread's trace ring, which [`Process::harvest`] drains.
    /// [`Held::set_trace_calls`] sets it while held.
    pub fn set_trace_calls(&mut self, on: bool) {
        self.trace_calls = on;
    }

    /// The call trace recorded so far (`-m trace`), drained first; None
    /// when nothing was traced.
    pub fn trace(&self) -> Option<crate::trace::Trace> {
        self.drain_trace(true);
        self.trace.clone().map(crate::trace::Trace)
    }

    /// The first of the words open activations of removed probes are
    /// pointed at: one set for the process, whichever weft took it.
    pub(super) fn sink_word(&self) -> Result<u32, Error> {
        use std::sync::atomic::Ordering;
        let rt = self.rt()?;
        let control = rt.region.control();
        if let Some(word) = control.sink_word.load(Ordering::Acquire).checked_sub(1) {
            return Ok(word);
        }
        let len = (weft_codegen::TIMER_METRIC_LEN / 8) as u32;
        let Some(word) = crate::ledger::allocate_words(&rt.region, len) else {
            return Err(self.out_of_room(Room::MetricWords));
        };
        control.sink_word.store(word + 1, Ordering::Release);
        Ok(word)
    }

    /// Points the still-open activations of the given (removed) probes at
    /// the sink words. A thread blocked inside a timed function when weft
    /// detaches returns later through whatever exit handler is installed
    /// then, and would count its exit and stop its timer in the words its
    /// cell names, which a later session may have given to another
    /// function. Needs the world stopped (`tracer`), no thread inside a
    /// trampoline.
    pub(super) fn retire_open_activations(
        &mut self,
        tracer: &mut Tracer,
        bases: &[i32],
    ) -> Result<(), Error> {
        use weft_rt::layout::{ROW_CELLS, ROW_CELLS_END, ROW_TOP};
        if bases.is_empty() {
            return Ok(());
        }
        let sink = self.sink_word()?;
        let Some(rt) = self.runtime.as_ref() else {
            return Ok(());
        };
        let sink = weft_rt::layout::Geometry::metric_offset(sink) as i32;
        let region = &rt.region;
        let rows = region
            .header()
            .rows_used
            .load(std::sync::atomic::Ordering::Acquire)
            .min(region.geometry().max_rows);
        let size = u64::from(weft_codegen::CELL_SIZE);
        for index in 0..rows {
            let cells = region.load_word(index, ROW_CELLS);
            let top = region.load_word(index, ROW_TOP);
            let end = region.load_word(index, ROW_CELLS_END);
            if cells == 0 || top <= cells || top > end {
                continue;
            }
            let mut cell = cells;
            while cell < top {
                // The metric base and the flags, next to each other.
                let at = cell + weft_codegen::CELL_METRIC as u64;
                let mut fields = [0u8; 8];
                if tracer.memory().read(at, &mut fields).is_err() {
                    break; // the thread and its cells are gone
                }
                let metric = i32::from_le_bytes(fields[..4].try_into().expect("4 bytes"));
                if bases.contains(&metric) {
                    // Its words go to the sink, and its exit calls no user
                    // probe (the record may serve another function by then)
                    // and counts no histogram (the sink has none).
                    let flags = u32::from_le_bytes(fields[4..].try_into().expect("4 bytes"))
                        & !(weft_codegen::CELL_PROBE | weft_codegen::CELL_HISTOGRAM);
                    fields[..4].copy_from_slice(&sink.to_le_bytes());
                    fields[4..].copy_from_slice(&flags.to_le_bytes());
                    tracer.memory().write(at, &fields)?;
                    self.retired_cells.insert(cell, metric);
                }
                cell += size;
            }
        }
        Ok(())
    }

    /// The rows of the threads live now, by thread ID (empty before the
    /// runtime is loaded): built once per hold, not once per thread.
    pub(crate) fn live_rows(&self) -> std::collections::HashMap<u32, u32> {
        use std::sync::atomic::Ordering;
        let Some(rt) = self.runtime.as_ref() else {
            return Default::default();
        };
        let region = &rt.region;
        let rows = region
            .header()
            .rows_used
            .load(Ordering::Acquire)
            .min(region.geometry().max_rows);
        (0..rows)
            .filter(|&i| {
                region.row_header(i).state.load(Ordering::Acquire) == weft_rt::layout::ROW_LIVE
            })
            .map(|i| (region.row_header(i).tid.load(Ordering::Acquire), i))
            .collect()
    }

    /// The open activations of the thread in row `row` whose return
    /// address an exit hook replaced: (the stack slot, the original return
    /// address), from its activation cells, read in one go. A stack walk
    /// reads through them; without them it saw weft's exit code as the
    /// caller (a CPython thread's path came out as `weft_rt_call_records >
    /// _PyEval_EvalFrameDefault`).
    pub(crate) fn hooked_returns(
        &self,
        memory: &crate::memory::ProcessMemory,
        row: u32,
    ) -> Vec<(u64, u64)> {
        use weft_rt::layout::{ROW_CELLS, ROW_CELLS_END, ROW_TOP};
        let Some(rt) = self.runtime.as_ref() else {
            return Vec::new();
        };
        let cells = rt.region.load_word(row, ROW_CELLS);
        let top = rt.region.load_word(row, ROW_TOP);
        let end = rt.region.load_word(row, ROW_CELLS_END);
        if cells == 0 || top <= cells || top > end {
            return Vec::new();
        }
        let Ok(bytes) = memory.read_vec(cells, (top - cells) as usize) else {
            return Vec::new(); // the thread and its cells are gone
        };
        let word = |cell: &[u8], offset: i32| {
            let at = usize::try_from(offset).ok()?;
            Some(u64::from_le_bytes(cell.get(at..at + 8)?.try_into().ok()?))
        };
        bytes
            .chunks_exact(weft_codegen::CELL_SIZE as usize)
            .filter_map(|cell| {
                let original = word(cell, weft_codegen::CELL_RETURN_ADDRESS)?;
                let slot = word(cell, weft_codegen::CELL_ENTRY_RSP)?;
                Some((slot, original))
            })
            .collect()
    }

    /// After a failed change that loaded the runtime: it goes back out
    /// when nothing ever ran it (no thread took a row) and no probe of any
    /// session is in, so that a failed first attach leaves nothing of
    /// weft's in the target: its trampoline areas (the exit code's among
    /// them), the region and the library ([`runtime::unload`]). Best
    /// effort: what cannot go stays, as after a detach.
    pub(super) fn unload_untouched_runtime(&mut self, tracer: &mut Tracer) {
        let Some(rt) = &self.runtime else { return };
        let Some(loaded) = rt.loaded else { return };
        let untouched = rt
            .region
            .header()
            .rows_used
            .load(std::sync::atomic::Ordering::Acquire)
            == 0
            && crate::ledger::linked_entries(&rt.region).is_empty()
            && !self.probes.iter().any(|p| p.active);
        let munmap = self.image.symbol_address("libc.so", "munmap");
        let (true, Some(munmap)) = (untouched, munmap) else {
            return;
        };
        let Ok(tid) = self.call_thread(tracer) else {
            return;
        };
        match runtime::unload(tracer, &mut self.image, tid, loaded, self.target.load_world) {
            Ok(true) => {}
            _ => return,
        }
        // Nothing runs in the areas: no patch ever led there.
        for (start, size) in self.pool.areas() {
            let call = RemoteCall::new(
                "munmap",
                munmap,
                vec![
                    crate::ptrace::RemoteArg::Value(start),
                    crate::ptrace::RemoteArg::Value(size),
                ],
            );
            let _ = tracer.call(tid, &call, false);
        }
        // The remote calls' return stub last.
        let cave = self.code_cave(weft_codegen::BOOTSTRAP_LEN);
        if tracer.remove_return_stub(tid, munmap, cave).is_ok() {
            self.target.stub_address = None;
        }
        self.runtime = None;
        self.session.slot = None;
        self.exits = None;
        self.pool = Pool::default();
        self.planning.staged = AddressMap::default();
        self.free_words.clear();
        self.free_records.clear();
        self.retired.clear();
        self.quiet.clear();
        self.session.foreign.clear();
        self.session.baselines = AddressMap::default();
    }

    /// [`Held::load_library`].
    pub(super) fn load_library_now(
        &mut self,
        tracer: &mut Tracer,
        path: &std::path::Path,
    ) -> Result<crate::library::Library, Error> {
        let path =
            std::fs::canonicalize(path).map_err(|source| crate::library::LibraryError::Path {
                path: path.to_path_buf(),
                source,
            })?;
        let tid = self.call_thread(tracer)?;
        let handle = crate::library::dlopen(tracer, &mut self.image, tid, &path)?;
        self.image.refresh()?;
        let base = self
            .image
            .modules()
            .iter()
            .find(|m| m.path() == path)
            .map(|m| m.base())
            .ok_or_else(|| crate::library::LibraryError::Dlopen {
                path: path.clone(),
                message: "dlopen returned a handle but the library is not mapped".into(),
            })?;
        Ok(crate::library::Library { path, handle, base })
    }
}
