//! The target's own record of its instrumentation: which weft sessions have
//! probes in it, every live probe with its owners, and the cursors metric
//! words and call records are handed out from (`weft_rt::layout`, "Who owns
//! the instrumentation").
//!
//! Every weft reads and writes this record in the shared region instead of
//! keeping its own: a second weft attached at the same time, or one attached
//! after another was killed, sees exactly what is in place. Only a weft that
//! holds the process with ptrace writes it (the kernel lets one tracer
//! attach at a time), so plain loads and stores suffice.

use crate::region::Region;
use std::sync::atomic::Ordering;
use weft_rt::layout::{
    ProbeEntry, RegionHeader, CALL_RECORDS, DIRECTORY, NO_RECORD, PROBE_BYPASSED, PROBE_FREE,
    PROBE_LIVE, SESSIONS,
};

/// One session as a slot records it: the weft process's PID and start time,
/// and which of that process's sessions (a tool may hold several
/// `Process`es of one target, one after another or at once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    pub pid: u32,
    pub start_time: u64,
    pub instance: u32,
}

impl Identity {
    /// A new session of the running weft process.
    pub fn own() -> Identity {
        static INSTANCES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
        let pid = std::process::id();
        Identity {
            pid,
            start_time: start_time(pid).unwrap_or(0),
            instance: INSTANCES.fetch_add(1, Ordering::Relaxed),
        }
    }
}

/// A process's start time in clock ticks since boot (`/proc/PID/stat`
/// field 22), None when it is gone or a zombie (a killed weft its parent
/// has not reaped yet is no session any more).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(crate::inspect::procfs::pid_file(pid, "stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after
    // the last ')'. The state is the first after it, field 22 the 20th.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Whether the session in `slot` is a running process (not a free slot,
/// not a weft that died, not its PID reused by another process).
pub(crate) fn is_alive(header: &RegionHeader, slot: usize) -> bool {
    let s = &header.sessions[slot];
    let pid = s.pid.load(Ordering::Acquire);
    pid != 0 && start_time(pid) == Some(s.start_time.load(Ordering::Acquire))
}

/// Whether the session in `slot` is one of a forked child's parent's
/// (`weft_rt::layout::SESSION_FORKED_AWAY`): not alive here, its probes
/// counting the child's calls since the fork.
pub(crate) fn forked_away(header: &RegionHeader, slot: usize) -> bool {
    let s = &header.sessions[slot];
    s.pid.load(Ordering::Acquire) != 0
        && s.start_time.load(Ordering::Acquire) == weft_rt::layout::SESSION_FORKED_AWAY
}

/// Whether every owner of `entry` is a forked-away session.
pub(crate) fn only_forked_away(header: &RegionHeader, entry: &ProbeEntry) -> bool {
    entry.owners != 0
        && (0..SESSIONS)
            .filter(|&i| entry.owners & 1 << i != 0)
            .all(|i| forked_away(header, i))
}

/// Takes a session slot for `me` in the region: the one it already has, a
/// free one, or (after [`sweep`] freed it) a dead session's. None when all
/// are used by live sessions.
pub(crate) fn join(region: &Region, me: Identity) -> Option<usize> {
    let header = region.control();
    let slots = &header.sessions;
    let mine = |i: usize| {
        slots[i].pid.load(Ordering::Acquire) == me.pid
            && slots[i].start_time.load(Ordering::Acquire) == me.start_time
            && slots[i].instance.load(Ordering::Acquire) == me.instance
    };
    if let Some(i) = (0..SESSIONS).find(|&i| mine(i)) {
        return Some(i);
    }
    let free = (0..SESSIONS).find(|&i| slots[i].pid.load(Ordering::Acquire) == 0)?;
    slots[free]
        .start_time
        .store(me.start_time, Ordering::Release);
    slots[free].instance.store(me.instance, Ordering::Release);
    slots[free].pid.store(me.pid, Ordering::Release);
    Some(free)
}

/// Gives `slot` back (the session has no probe left).
pub(crate) fn leave(region: &Region, slot: usize) {
    let s = &region.control().sessions[slot];
    s.pid.store(0, Ordering::Release);
    s.start_time.store(0, Ordering::Release);
}

/// The directory's live entries, with their indices.
pub(crate) fn live_entries(region: &Region) -> Vec<(usize, ProbeEntry)> {
    let used = (region.header().directory_used.load(Ordering::Acquire) as usize).min(DIRECTORY);
    (0..used)
        .map(|i| (i, region.entry(i)))
        .filter(|(_, e)| e.state == PROBE_LIVE)
        .collect()
}

/// The directory's entries that are links of a chain at a patch site
/// (live or bypassed, see [`crate::chain`]), with their indices.
pub(crate) fn linked_entries(region: &Region) -> Vec<(usize, ProbeEntry)> {
    let used = (region.header().directory_used.load(Ordering::Acquire) as usize).min(DIRECTORY);
    (0..used)
        .map(|i| (i, region.entry(i)))
        .filter(|(_, e)| e.state == PROBE_LIVE || e.state == PROBE_BYPASSED)
        .collect()
}

/// Writes `entries` (live) into free directory entries, in one pass over
/// the directory (an insertion of a thousand probes happens in a stop of
/// the world), and returns their indices; None when the directory is full
/// (then nothing was written).
pub(crate) fn add_all(region: &Region, entries: &[ProbeEntry]) -> Option<Vec<usize>> {
    let header = region.control();
    let used = (header.directory_used.load(Ordering::Acquire) as usize).min(DIRECTORY);
    let mut slots: Vec<usize> = (0..used)
        .filter(|&i| region.entry_state(i) == PROBE_FREE)
        .take(entries.len())
        .collect();
    let more = entries.len() - slots.len();
    if used + more > DIRECTORY {
        return None;
    }
    slots.extend(used..used + more);
    for (&i, entry) in slots.iter().zip(entries) {
        region.set_entry(
            i,
            &ProbeEntry {
                state: PROBE_LIVE,
                ..*entry
            },
        );
    }
    header
        .directory_used
        .store((used + more) as u32, Ordering::Release);
    Some(slots)
}

/// Marks entry `i` free.
pub(crate) fn free(region: &Region, i: usize) {
    region.set_entry(i, &ProbeEntry::default());
}

/// `len` fresh metric words (never handed out by any session), or None
/// when the row has no room left. A compare-and-swap: words may be taken
/// while the process is not held (trampolines built ahead of a stop), even
/// with another weft holding it.
pub(crate) fn allocate_words(region: &Region, len: u32) -> Option<u32> {
    // The trace ring, when there is one, takes the top of every row.
    let limit = match region.header().trace_ring.load(Ordering::Acquire) {
        0 => region.geometry().metric_words,
        ring => (ring - 1).min(region.geometry().metric_words),
    };
    take(&region.control().words_next, len, limit)
}

/// One past the last metric word any session handed out.
pub(crate) fn words_used(region: &Region) -> u32 {
    region.header().words_next.load(Ordering::Acquire)
}

/// One past the last call record any session handed out.
pub(crate) fn records_used(region: &Region) -> u32 {
    region.header().records_next.load(Ordering::Acquire)
}

/// A fresh call record, or None when all were handed out (a
/// compare-and-swap, as [`allocate_words`]).
pub(crate) fn allocate_record(region: &Region) -> Option<u32> {
    take(&region.control().records_next, 1, CALL_RECORDS as u32)
}

/// Gives back words `word .. word + len` if they are the last handed out
/// (no session took any since); false when not (the caller keeps them).
pub(crate) fn give_back_words(region: &Region, word: u32, len: u32) -> bool {
    let cursor = &region.control().words_next;
    cursor
        .compare_exchange(word + len, word, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
}

/// Gives back call record `record` if it is the last handed out.
pub(crate) fn give_back_record(region: &Region, record: u32) -> bool {
    let cursor = &region.control().records_next;
    cursor
        .compare_exchange(record + 1, record, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
}

/// Advances `cursor` by `len` if it stays within `limit`; the old value.
fn take(cursor: &std::sync::atomic::AtomicU32, len: u32, limit: u32) -> Option<u32> {
    cursor
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |next| {
            next.checked_add(len).filter(|&end| end <= limit)
        })
        .ok()
}

/// What the sweep found for one entry of dead sessions only.
#[derive(Debug)]
pub(crate) struct Orphan {
    pub index: usize,
    pub entry: ProbeEntry,
}

/// Clears the owner bits of dead sessions in every live entry and frees
/// their slots; returns the entries no live session owns any more (their
/// patches must come out: the caller restores them, then frees them).
/// With `keep_forked_away`, sessions forked away stay (a session following
/// a forked child takes their probes over first).
pub(crate) fn sweep(region: &Region, keep_forked_away: bool) -> Vec<Orphan> {
    let header = region.control();
    let dead: u32 = (0..SESSIONS)
        .filter(|&i| header.sessions[i].pid.load(Ordering::Acquire) != 0 && !is_alive(header, i))
        .filter(|&i| !(keep_forked_away && forked_away(header, i)))
        .fold(0, |m, i| m | 1 << i);
    let mut orphans = Vec::new();
    for (index, mut entry) in live_entries(region) {
        if entry.owners & dead != 0 {
            entry.owners &= !dead;
            region.set_entry(index, &entry);
        }
        if entry.owners == 0 {
            orphans.push(Orphan { index, entry });
        }
    }
    for i in (0..SESSIONS).filter(|i| dead & 1 << i != 0) {
        leave(region, i);
    }
    orphans
}

/// The record of a directory entry, if it has one.
pub(crate) fn record_of(entry: &ProbeEntry) -> Option<u32> {
    (entry.record != NO_RECORD).then_some(entry.record)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_start_time_is_found_and_stable() {
        let me = Identity::own();
        assert_ne!(me.start_time, 0);
        let again = Identity::own();
        assert_eq!((again.pid, again.start_time), (me.pid, me.start_time));
        assert_ne!(again.instance, me.instance);
        assert_eq!(start_time(u32::MAX), None);
        // A zombie is not a live session.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while start_time(pid).is_some() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(start_time(pid), None, "an exited, unreaped child");
        child.wait().unwrap();
    }
}
