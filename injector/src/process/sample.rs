//! Reading what the probes measured, live, without stopping the target: snapshots, running timers, reports.

use super::*;

impl Process {
    /// Copies every thread's row out of the shared region (no stop):
    /// the rows of threads already harvested, then the region's current
    /// rows (except those harvested copies' own, now stale, generations).
    ///
    /// For timed probes the copy's total words (wall and CPU) hold the
    /// timers' values at this moment: a live thread's running timer is read
    /// consistently (seqlock) and counted up to now, its CPU time from
    /// `/proc/PID/task/TID/schedstat`.
    pub fn snapshot(&self) -> Vec<RowSnapshot> {
        let Some(rt) = &self.runtime else {
            return Vec::new();
        };
        let mut rows = self.session.harvested.clone();
        let wall = *weft_rt::clock::WallClock::in_region(rt.region.header());
        let words = crate::ledger::words_used(&rt.region);
        let live = rt.region.snapshot(words).into_iter().filter(|r| {
            !self
                .session
                .harvested
                .iter()
                .any(|h| h.index == r.index && h.generation == r.generation)
        });
        let mut memory = None;
        for mut row in live {
            if row.state == weft_rt::layout::ROW_LIVE {
                self.sample_running_timers(&rt.region, &wall, &mut row, &mut memory);
            }
            self.subtract_baseline(&mut row);
            rows.push(row);
        }
        rows
    }

    /// What borrowed probes' word `word` of row `index` (of `generation`)
    /// held when this session started sharing it (0 for others).
    pub(crate) fn baseline(&self, index: u32, generation: u32, word: u32) -> u64 {
        self.session
            .baselines
            .get(&(index, generation))
            .and_then(|b| b.iter().find(|&&(w, _)| w == word))
            .map_or(0, |&(_, v)| v)
    }

    /// Takes out of `row` what borrowed probes had counted before this
    /// session started sharing them.
    pub(super) fn subtract_baseline(&self, row: &mut RowSnapshot) {
        if let Some(base) = self.session.baselines.get(&(row.index, row.generation)) {
            for &(word, value) in base {
                if let Some(w) = row.words.get_mut(word as usize) {
                    *w = w.saturating_sub(value);
                }
            }
        }
    }

    /// Replaces the timer totals of a live row's timed probes with their
    /// values now (total + time since a running timer's start; self time
    /// with the open activations' self time so far, see `open_self`).
    /// `memory`: the target's memory, opened at the first row that needs
    /// it.
    pub(super) fn sample_running_timers(
        &self,
        region: &crate::region::Region,
        wall: &weft_rt::clock::WallClock,
        row: &mut RowSnapshot,
        memory: &mut Option<crate::memory::ProcessMemory>,
    ) {
        use weft_codegen::{read_timer_words, timer_value};
        let mut cpu_now = None;
        let index = row.index;
        let read = |base: usize| {
            read_timer_words(
                |off| region.load_word(index, base + off),
                weft_codegen::TIMER_READ_ATTEMPTS,
            )
        };
        // Clocks before the words: a running timer's value then never
        // exceeds what its stop will record. One reading serves the row.
        let wall_now = wall.raw();
        let q32 = region.header().timer_ns_per_tick_q32;
        // The open activations' self ticks, read once the row has a
        // running timer.
        let mut open: Option<std::collections::HashMap<i32, u64>> = None;
        let mut open_self = |base: usize| -> u64 {
            let open = open.get_or_insert_with(|| {
                crate::open_self::row_open_self_ticks(
                    region,
                    (index, self.target.pid, &self.retired_cells),
                    memory,
                    wall_now,
                )
            });
            let ticks = i32::try_from(base)
                .ok()
                .and_then(|b| open.get(&b))
                .copied()
                .unwrap_or(0);
            weft_rt::clock::q32_mul(ticks, q32)
        };
        for probe in self.probes.iter().filter(|p| p.metrics().hooks_exit()) {
            let Some(word) = probe.calls_word() else {
                continue;
            };
            let first = word as usize;
            let base = weft_rt::layout::Geometry::metric_offset(word) as usize;
            let at = |off: i32| first + (off / 8) as usize;
            let (wall_at, self_at) = (
                at(weft_codegen::METRIC_WALL_TOTAL),
                at(weft_codegen::METRIC_SELF_TOTAL),
            );
            // A writer stuck mid-update (switched out between its seqlock
            // stores): the copy's closed totals stand, self time capped
            // by wall time (a stop adds to self time first).
            let stuck = |row: &mut RowSnapshot| {
                if let (Some(&wall), Some(own)) = (row.words.get(wall_at), row.words.get(self_at)) {
                    let capped = (*own).min(wall);
                    row.words[self_at] = capped;
                }
            };
            let Some(mut words) = read(base) else {
                stuck(row);
                continue;
            };
            // The thread's CPU time only for a running CPU timer (one
            // /proc read per thread and report at most), then the words
            // again, after it.
            if probe.metrics().cpu && words.cpu_start != 0 && cpu_now.is_none() {
                cpu_now =
                    weft_rt::clock::thread_cpu_ns_from_outside(self.target.pid as u32, row.tid)
                        .ok();
                match read(base) {
                    Some(again) => words = again,
                    None => {
                        stuck(row);
                        continue;
                    }
                }
            }
            let value = timer_value(&words, wall_now, cpu_now, q32);
            // A running call's self time so far counts as its wall time
            // does; self time never exceeds wall time.
            let own = if words.wall_start != 0 {
                words
                    .self_total
                    .saturating_add(open_self(base))
                    .min(value.wall_ns)
            } else {
                words.self_total
            };
            // All three from the one consistent reading.
            for (index, ns) in [
                (wall_at, value.wall_ns),
                (at(weft_codegen::METRIC_CPU_TOTAL), value.cpu_ns),
                (self_at, own),
            ] {
                if let Some(w) = row.words.get_mut(index) {
                    *w = ns;
                }
            }
        }
    }

    /// Takes the final figures of threads that have exited and lets the
    /// runtime give their rows to new threads. Call it periodically while a
    /// program that creates many short-lived threads runs (the `weft`
    /// command does, every few milliseconds); without it rows are not
    /// reused. Returns how many rows were harvested.
    pub fn harvest(&mut self) -> usize {
        let (Some(rt), Some(slot)) = (&self.runtime, self.session.slot) else {
            return 0;
        };
        let pid = self.target.pid;
        let exited = self.target.exit.is_some();
        let words = crate::ledger::words_used(&rt.region);
        // Trace rings first, then the rows of threads gone, each drained a
        // last time right before its ack lets a new thread take it.
        self.drain_trace(false);
        // The log is taken per row gone, not across the look at every
        // thread in /proc: the drain thread must not wait on this one.
        let trace = self.trace.as_ref();
        let mut rows = rt.region.harvest(
            slot,
            words,
            |tid| exited || std::fs::metadata(format!("/proc/{pid}/task/{tid}")).is_err(),
            |index| {
                if let Some(log) = trace {
                    let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
                    log.drain_row(&rt.region, index, true);
                }
            },
        );
        let n = rows.len();
        for row in &mut rows {
            self.subtract_baseline(row);
        }
        self.session
            .harvested
            .extend(rows.into_iter().filter(|r| r.words.iter().any(|&w| w != 0)));
        n
    }

    /// [`Process::report`] with a kernel session's figures added: its
    /// kernel functions and system calls per thread, split by the user
    /// functions of this process the threads were in.
    pub fn report_with_kernel(
        &self,
        kernel: &crate::kernel::Session,
    ) -> Result<Report, crate::kernel::KernelError> {
        let mut report = self.report();
        self.add_kernel_to(&mut report, kernel)?;
        Ok(report)
    }

    /// Adds a kernel session's figures to a report of this process (see
    /// [`Process::report_with_kernel`]).
    pub fn add_kernel_to(
        &self,
        report: &mut Report,
        kernel: &crate::kernel::Session,
    ) -> Result<(), crate::kernel::KernelError> {
        let snapshot = kernel.snapshot()?;
        let pid = self.target.pid;
        report.add_kernel(
            &snapshot,
            |base| self.function_at_metric_offset(base),
            |tid| crate::report::live_thread_name(pid, tid),
        );
        Ok(())
    }

    /// A report of every probe (active or removed) from a fresh snapshot.
    pub fn report(&self) -> Report {
        let probes: Vec<ProbeInfo> = self
            .probes
            .iter()
            .filter(|p| !self.unreported.contains(&p.id))
            .filter_map(|p| {
                Some(ProbeInfo {
                    name: points::probe_name(p),
                    aliases: match p.point() {
                        Some(_) => Vec::new(),
                        None => p.function.aliases.clone(),
                    },
                    module: p.function.module.clone(),
                    address: p.patch_address,
                    calls_word: p.own_words()?.first,
                    metrics: p.metrics(),
                })
            })
            .collect();
        let overflow = self.runtime.as_ref().map_or(0, |rt| {
            rt.region
                .header()
                .overflow_threads
                .load(std::sync::atomic::Ordering::Relaxed)
        });
        let pid = self.target.pid;
        let rows = self.snapshot();
        // Traced probes hook their exits without timers. Only in a session
        // that traces: a counting probe that borrows another session's timed
        // one also has a call record, and its report has no exits.
        let hooked: Vec<u32> = self
            .probes
            .iter()
            .filter(|p| self.trace_calls && p.hooks_exit() && !p.metrics().hooks_exit())
            .filter_map(|p| Some(p.own_words()?.first))
            .collect();
        let mut report = Report::build_hooked(
            pid,
            self.live_duration().as_nanos() as u64,
            &probes,
            &rows,
            overflow,
            |tid| crate::report::live_thread_name(pid, tid),
            &hooked,
        );
        let asked = self
            .probes
            .iter()
            .fold(Metrics::CALLS, |m, p| m.union(p.metrics()));
        if let (true, Some(rt)) = (asked.wall || asked.cpu, &self.runtime) {
            let wall = weft_rt::clock::WallClock::in_region(rt.region.header());
            report.clocks = Some(clocks(wall, &rows, asked));
        }
        let (rows_used, rows_reused) = self.row_usage();
        report.runtime = Some(crate::report::RuntimeStats {
            rows_used,
            rows_reused,
        });
        if let Some(trace) = self.trace() {
            report.metrics.push("trace");
            report.trace = Some(trace.with(|log| log.summary()));
            report.trace_log = Some(trace);
        }
        report
    }
}

/// The clock sources behind a report's times, in words.
/// The clocks behind the metrics `asked` (only those: `-m wall` has no CPU
/// clock to speak of).
pub(super) fn clocks(
    wall: &weft_rt::clock::WallClock,
    rows: &[RowSnapshot],
    asked: Metrics,
) -> crate::report::Clocks {
    let mut cpu: Vec<String> = Vec::new();
    for row in rows {
        let (source, why) = row.cpu_source;
        let text = match source {
            weft_rt::layout::CPU_SOURCE_NONE => continue,
            s => weft_rt::clock::CpuSource::from_mode(s - 1, why).to_string(),
        };
        if !cpu.contains(&text) {
            cpu.push(text);
        }
    }
    crate::report::Clocks {
        wall: asked.wall.then(|| wall.source().to_string()),
        cpu: asked.cpu.then(|| {
            if cpu.is_empty() {
                "none (no thread has a CPU clock)".to_string()
            } else {
                cpu.join("; ")
            }
        }),
    }
}
