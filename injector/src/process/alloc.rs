//! Words, trace records and trampoline memory: allocating them, running out of them, recycling them.

use super::*;

impl Process {
    /// `len` consecutive metric words for a new probe: fresh ones, or, when
    /// the row is full, the zeroed words of a removed probe nothing writes
    /// any more (that probe then leaves reports).
    pub(super) fn allocate_words(&mut self, len: u32) -> Result<u32, Error> {
        let (word, fresh) = self.take_words(len)?;
        self.pending.words.push((word, len, fresh));
        Ok(word)
    }

    /// Words for a probe, and whether they are fresh from the target's
    /// cursor.
    pub(super) fn take_words(&mut self, len: u32) -> Result<(u32, bool), Error> {
        if let Some(i) = self.free_words.iter().position(|&(_, l)| l == len) {
            return Ok((self.free_words.swap_remove(i).0, false));
        }
        let rt = self.rt()?;
        if let Some(word) = crate::ledger::allocate_words(&rt.region, len) {
            return Ok((word, true));
        }
        let width = |p: &Probe| p.words().map_or(0, |w| w.len);
        let Some(at) = self
            .quiet
            .iter()
            .position(|&i| width(&self.probes[i]) == len)
        else {
            return Err(self.out_of_room(Room::MetricWords));
        };
        let index = self.quiet.swap_remove(at);
        let Some(words) = self.probes[index].words_mut() else {
            return Err(Error::Internal("a quiet probe without words".into()));
        };
        words.recycled = true;
        let word = words.first;
        let rt = self.rt()?;
        rt.region
            .zero_words(word, len)
            .map_err(|e| Error::Internal(format!("cannot reset recycled counters: {e}")))?;
        for row in &mut self.session.harvested {
            for w in row.words.iter_mut().skip(word as usize).take(len as usize) {
                *w = 0;
            }
        }
        Ok((word, false))
    }

    /// Trampoline space for `len` bytes near `near` (`(at, stub)`, see
    /// `Pool::reserve`), logged so that a failed change gives it back.
    pub(super) fn reserve_logged(
        &mut self,
        tracer: &mut Tracer,
        call_tid: Tid,
        (mmap_fn, register_fn): (u64, u64),
        near: u64,
        len: u64,
    ) -> Result<(u64, u64), Error> {
        let (at, stub) = self
            .pool
            .reserve(tracer, call_tid, mmap_fn, register_fn, near, len)?;
        self.pending.space.push(at..at + len);
        Ok((at, stub))
    }

    /// The error for a full table: its limit, what every session uses, and
    /// what the whole request under way needs.
    pub(super) fn out_of_room(&self, room: Room) -> Error {
        use std::sync::atomic::Ordering;
        let header = self.runtime.as_ref().map(|rt| rt.region.header());
        let load = |f: fn(&weft_rt::layout::RegionHeader) -> u64| header.map_or(0, f);
        let (limit, in_use, asked) = match room {
            Room::MetricWords => (
                u64::from(
                    self.runtime
                        .as_ref()
                        .map_or(self.options.metric_words, |rt| {
                            rt.region.geometry().metric_words
                        }),
                ),
                load(|h| u64::from(h.words_next.load(Ordering::Acquire))),
                self.request_size.words,
            ),
            Room::CallRecords => (
                weft_rt::layout::CALL_RECORDS as u64,
                load(|h| u64::from(h.records_next.load(Ordering::Acquire))),
                self.request_size.records,
            ),
            Room::Probes => (
                weft_rt::layout::DIRECTORY as u64,
                load(|h| u64::from(h.directory_used.load(Ordering::Acquire))),
                self.request_size.probes,
            ),
        };
        Error::OutOfRoom {
            room,
            limit,
            in_use,
            asked,
        }
    }

    /// A free call record for a probe with exit hooks.
    pub(super) fn allocate_record(&mut self) -> Result<u32, Error> {
        let (record, fresh) = match self.free_records.pop() {
            Some(r) => (r, false),
            None => {
                let rt = self.rt()?;
                let Some(r) = crate::ledger::allocate_record(&rt.region) else {
                    return Err(self.out_of_room(Room::CallRecords));
                };
                (r, true)
            }
        };
        self.pending.records.push((record, fresh));
        Ok(record)
    }

    /// Gives the space of retired trampolines back to the pool once no
    /// thread executes in one or has an address inside one on its stack
    /// (a return address of a timer subroutine, a signal frame's saved
    /// PC); the others stay retired and are checked again next time.
    /// Scans each thread's stack from its `rsp` to the end of that mapping
    /// (the stack it is on now: frames on another stack, below a
    /// `sigaltstack` handler, are not seen).
    pub(super) fn recycle_trampolines(&mut self, tracer: &mut Tracer) -> Result<(), Error> {
        if self.retired.is_empty() {
            return Ok(());
        }
        const MAX_SCAN: u64 = 16 << 20;
        let maps = crate::inspect::read_maps(self.target.pid)?;
        let mut busy = vec![false; self.retired.len()];
        let retired = &self.retired;
        // A thread about to execute a retired probe's call record (its PC
        // on the record's `call`, or that PC in a signal frame) would call
        // whatever the record calls next: the record is busy with the
        // trampoline. (Return points are not: returning through any record
        // leads to the exit handler, whatever the record is used for.)
        let records: Vec<Option<std::ops::Range<u64>>> = {
            let first = self
                .runtime
                .as_ref()
                .map_or(0, |rt| rt.region.header().call_records);
            retired
                .iter()
                .map(|r| {
                    let probe = self.probes.iter().find(|p| &p.trampoline == r)?;
                    let at = first + u64::from(probe.record()?) * weft_codegen::RECORD_SIZE;
                    Some(at..at + weft_codegen::RECORD_RETURN)
                })
                .collect()
        };
        // Every range that pins a retired trampoline, sorted, for a binary
        // search per stack word: 200 threads' stacks are a million words,
        // and a linear pass over the retired list per word made removal's
        // stop grow with it (25 to 60 ms over 40 cycles under 200 threads).
        let mut pins: Vec<(u64, u64, usize)> = retired
            .iter()
            .enumerate()
            .map(|(i, r)| (r.start, r.end, i))
            .chain(
                records
                    .iter()
                    .enumerate()
                    .filter_map(|(i, c)| c.as_ref().map(|c| (c.start, c.end, i))),
            )
            .collect();
        pins.sort_unstable();
        // Ranges may nest only in the records (several probes can share
        // none), so the candidates are the few starting at or before value.
        let mark = |busy: &mut Vec<bool>, value: u64| {
            let k = pins.partition_point(|&(start, _, _)| start <= value);
            for &(_, end, i) in pins[..k].iter().rev().take(2) {
                if value < end {
                    busy[i] = true;
                }
            }
        };
        for tid in tracer.threads().collect::<Vec<_>>() {
            let Ok(regs) = tracer.registers(tid) else {
                continue;
            };
            mark(&mut busy, regs.rip);
            let rsp = regs.rsp & !7;
            let Some(stack) = maps.iter().find(|m| m.start <= rsp && rsp < m.end) else {
                continue;
            };
            let len = (stack.end - rsp).min(MAX_SCAN) as usize;
            match tracer.memory().read_vec(rsp, len) {
                Ok(bytes) => {
                    for chunk in bytes.chunks_exact(8) {
                        mark(
                            &mut busy,
                            u64::from_le_bytes(chunk.try_into().expect("8 bytes")),
                        );
                    }
                }
                // Unreadable: assume the worst.
                Err(_) => busy.iter_mut().for_each(|b| *b = true),
            }
        }
        // A thread in a companion (or a tied sibling's trampoline) goes on
        // into its probe's trampoline: that one is busy as long as the
        // other is.
        for (i, range) in retired.iter().enumerate() {
            if !busy[i] {
                continue;
            }
            let of = self
                .probes
                .iter()
                .find(|p| &p.trampoline == range)
                .and_then(|p| {
                    p.companion_of().or_else(|| {
                        self.ties
                            .iter()
                            .find(|&&(sibling, _)| sibling == p.id)
                            .map(|&(_, of)| of)
                    })
                });
            let main = of
                .and_then(|of| self.probes.get(of.0 as usize))
                .and_then(|p| retired.iter().position(|r| *r == p.trampoline));
            if let Some(j) = main {
                busy[j] = true;
            }
        }
        let mut still = Vec::new();
        for (range, busy) in std::mem::take(&mut self.retired).into_iter().zip(busy) {
            if busy {
                still.push(range);
                continue;
            }
            self.pool.release(range.clone());
            if let Some(i) = self.probes.iter().position(|p| p.trampoline == range) {
                self.quiet.push(i);
                if let Some(record) = self.probes[i].take_record() {
                    self.free_records.push(record);
                }
            }
        }
        self.retired = still;
        Ok(())
    }
}
