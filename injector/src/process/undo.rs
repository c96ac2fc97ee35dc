//! An insertion as a transaction: everything it takes from the target
//! (metric words, call records, trampoline space, directory entries) and
//! every thread it moves is logged, and given back in reverse order if any
//! step fails, so a failed insertion leaves the target where it was.
//!
//! In debug builds, tests can make a chosen step fail ([`Fault`]) to show
//! it; the hook does not exist in release builds.

#[cfg(debug_assertions)]
use super::Error;
use super::Process;
use crate::ptrace::{Tid, Tracer};

/// What the insertion in progress has taken so far.
#[derive(Debug, Default)]
pub(crate) struct Undo {
    /// Metric words (first, count, fresh from the target's cursor).
    pub words: Vec<(u32, u32, bool)>,
    /// Call records (record, fresh from the target's cursor).
    pub records: Vec<(u32, bool)>,
    /// Trampoline space (as `Pool::reserve` returned it).
    pub space: Vec<std::ops::Range<u64>>,
    /// Probe-directory entries written.
    pub entries: Vec<usize>,
    /// Threads moved into trampolines: (thread, its PC before).
    pub moved: Vec<(Tid, u64)>,
    /// Bytes written outside trampoline space (call records' targets,
    /// exit-probe entries): (address, what was there before).
    pub writes: Vec<(u64, Vec<u8>)>,
}

/// A step of an insertion a test can make fail (debug builds only).
#[cfg(debug_assertions)]
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// After metric words were taken.
    Words,
    /// After a call record was taken.
    Record,
    /// After trampoline space was reserved.
    Space,
    /// After a trampoline was written into the target.
    Trampoline,
    /// After the probes were entered in the directory.
    Directory,
    /// After threads inside the patch sites were moved.
    Moved,
    /// Writing the patches (after the first page of them was written).
    Splice,
}

#[cfg(debug_assertions)]
impl Fault {
    /// Every step, in pipeline order.
    pub const ALL: [Fault; 7] = [
        Fault::Words,
        Fault::Record,
        Fault::Space,
        Fault::Trampoline,
        Fault::Directory,
        Fault::Moved,
        Fault::Splice,
    ];
}

impl Process {
    /// Makes the next insertion fail at `step` (debug builds only: a test's
    /// hook to show that every step is undone).
    #[cfg(debug_assertions)]
    #[doc(hidden)]
    pub fn fail_next_insertion_at(&mut self, step: Fault) {
        self.fault = Some(step);
    }

    /// What the target's shared region has handed out: (first metric word
    /// never handed out, first call record never handed out, live
    /// directory entries), for tests that check a failed change gave
    /// everything back. None before the runtime is loaded.
    #[doc(hidden)]
    pub fn ledger_state(&self) -> Option<(u32, u32, usize)> {
        let rt = self.runtime.as_ref()?;
        let header = rt.region.header();
        Some((
            header.words_next.load(std::sync::atomic::Ordering::Acquire),
            header
                .records_next
                .load(std::sync::atomic::Ordering::Acquire),
            crate::ledger::live_entries(&rt.region).len(),
        ))
    }

    /// Fails here if a test asked for it.
    #[cfg(debug_assertions)]
    pub(crate) fn checkpoint(&mut self, step: Fault) -> Result<(), Error> {
        if self.fault == Some(step) {
            self.fault = None;
            return Err(Error::Internal(format!("injected failure at {step:?}")));
        }
        Ok(())
    }

    /// Gives back everything `undo` logged, newest first.
    pub(crate) fn roll_back(&mut self, tracer: &mut Tracer, undo: Undo) {
        for &(tid, pc) in undo.moved.iter().rev() {
            if let Ok(mut regs) = tracer.registers(tid) {
                regs.rip = pc;
                let _ = tracer.set_registers(tid, &regs);
            }
        }
        for (at, before) in undo.writes.iter().rev() {
            let _ = tracer.memory().write(*at, before);
        }
        let Some(rt) = self.runtime.as_ref() else {
            return;
        };
        for &index in undo.entries.iter().rev() {
            crate::ledger::free(&rt.region, index);
        }
        for space in undo.space.iter().rev() {
            self.pool.release(space.clone());
        }
        // Fresh ones go back to the target's cursor when nothing was taken
        // after them (then the region is exactly as before); the others to
        // this session's free lists.
        for &(record, fresh) in undo.records.iter().rev() {
            if !(fresh && crate::ledger::give_back_record(&rt.region, record)) {
                self.free_records.push(record);
            }
        }
        for &(word, len, fresh) in undo.words.iter().rev() {
            // A reused row is zeroed only below the cursor (see the runtime's
            // `reuse_harvested_row`): words going back above it must be
            // clean. Nothing writes them any more: their patches are gone.
            let _ = rt.region.zero_words(word, len);
            if !(fresh && crate::ledger::give_back_words(&rt.region, word, len)) {
                self.free_words.push((word, len));
            }
        }
    }
}
