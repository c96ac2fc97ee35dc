//! Memory for trampolines inside the target, placed near the code it serves.
//!
//! A patch is a `jmp rel32`, and relocated instructions keep their
//! RIP-relative operands, so a trampoline must lie within ±2 GiB of both the
//! function and whatever the function's first instructions reference. Areas
//! are therefore mapped (remote `mmap` with `MAP_FIXED_NOREPLACE`) in a free
//! gap at most [`MAX_DISTANCE`] from the module, and each area starts with
//! its own copy of the registration stub so that trampolines reach it with a
//! `call rel32`. Areas are mapped read+execute only: weft writes them through
//! `/proc/PID/mem`, so the target never has writable code.
//!
//! Areas are never unmapped: a thread preempted inside a trampoline, or
//! inside the runtime called from one, must always find it there. The
//! space of a removed probe's trampoline is reused ([`Pool::release`]) only
//! once weft has checked, with the world stopped, that no thread executes in
//! it or has an address inside it on its stack.

pub(crate) use crate::cpu::vector_save;
use crate::inspect::maps::Mapping;
use crate::inspect::read_maps;
use crate::ptrace::{RemoteArg, RemoteCall, RemoteError, Tid, Tracer};
use weft_codegen::{register_stub, register_stub_len};

/// How far an area may be from the code it serves: half the reach of
/// rel32, leaving the other half for the function's own data references.
pub const MAX_DISTANCE: u64 = 1 << 30;
/// Smallest area mapped at a time: room for ~4,000 counters' trampolines,
/// so that later batches fit in an area already mapped (written while the
/// target runs, no remote `mmap` in their stop). Untouched pages cost the
/// target nothing but address space.
pub const AREA_SIZE: u64 = 1 << 20;
/// First 8 bytes of every trampoline area, for people reading a target's
/// memory (leftover probes are recognised by their records).
pub const AREA_MAGIC: u64 = u64::from_le_bytes(*b"WEFTAREA");
/// Bytes at the start of an area before its registration stub.
const AREA_HEADER: u64 = 64;
/// Marks the record in front of every trampoline.
pub const RECORD_MAGIC: u64 = u64::from_le_bytes(*b"WEFTPRB1");
/// Bytes of the record in front of every trampoline: magic, patched
/// address, the 5 original bytes (padded to 8), trampoline length.
pub const RECORD_LEN: u64 = 32;

/// Writes `code` at `at` with its [`record`] in front, in one write: a
/// later weft finds the probe by the record if this one dies while the
/// probe is live.
pub fn write_with_record(
    memory: &crate::memory::ProcessMemory,
    at: u64,
    patch_address: u64,
    original: [u8; 5],
    code: &[u8],
) -> Result<(), crate::memory::MemoryError> {
    let mut bytes = record(patch_address, original, code.len() as u64).to_vec();
    bytes.extend_from_slice(code);
    memory.write(at - RECORD_LEN, &bytes)
}

/// The record weft writes in front of a trampoline: what a later weft needs
/// to take the probe out if this one dies first.
pub fn record(
    patch_address: u64,
    original: [u8; 5],
    trampoline_len: u64,
) -> [u8; RECORD_LEN as usize] {
    let mut r = [0u8; RECORD_LEN as usize];
    r[..8].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
    r[8..16].copy_from_slice(&patch_address.to_le_bytes());
    r[16..21].copy_from_slice(&original);
    r[24..32].copy_from_slice(&trampoline_len.to_le_bytes());
    r
}

/// A probe an earlier weft left in place (it was killed while live).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeftoverProbe {
    /// The patched address.
    pub patch_address: u64,
    /// The bytes the `jmp` replaced.
    pub original: [u8; 5],
    /// The leftover trampoline.
    pub trampoline: std::ops::Range<u64>,
}

/// If `patch_address` holds a `jmp rel32` into a weft trampoline area whose
/// record names this address, the probe an earlier weft left there.
pub fn leftover_probe(
    memory: &crate::memory::ProcessMemory,
    maps: &[Mapping],
    patch_address: u64,
) -> Option<LeftoverProbe> {
    let mut jmp = [0u8; 5];
    memory.read(patch_address, &mut jmp).ok()?;
    if jmp[0] != 0xe9 {
        return None;
    }
    let rel = i32::from_le_bytes([jmp[1], jmp[2], jmp[3], jmp[4]]);
    let target = patch_address
        .wrapping_add(5)
        .wrapping_add(rel as i64 as u64);
    // The record alone identifies a weft probe (its magic followed by this
    // very address). The area's own magic is not required: the kernel merges
    // adjacent anonymous mappings with the same permissions (two areas, or an
    // area and the remote-call stub page), so a mapping's start need not be
    // an area's start.
    let area = maps
        .iter()
        .find(|m| m.contains(target) && m.inode == 0 && m.perms.exec)?;
    if target < area.start + RECORD_LEN {
        return None;
    }
    let mut rec = [0u8; RECORD_LEN as usize];
    memory.read(target - RECORD_LEN, &mut rec).ok()?;
    let word = |i: usize| u64::from_le_bytes(rec[i..i + 8].try_into().unwrap_or_default());
    if word(0) != RECORD_MAGIC || word(8) != patch_address {
        return None;
    }
    let mut original = [0u8; 5];
    original.copy_from_slice(&rec[16..21]);
    Some(LeftoverProbe {
        patch_address,
        original,
        trampoline: target..target + word(24),
    })
}

/// Failure to get trampoline memory.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// No free gap close enough to the code.
    #[error("no free address range within 1 GiB of {near:#x} for trampolines")]
    NoGap {
        /// The code address.
        near: u64,
    },
    /// The remote mmap failed or landed elsewhere.
    #[error("mmap in the target for trampolines at {at:#x} failed (returned {got:#x})")]
    Mmap {
        /// Requested address.
        at: u64,
        /// What mmap returned.
        got: u64,
    },
    /// A remote call failed.
    #[error(transparent)]
    Remote(#[from] RemoteError),
    /// The registration stub could not be built.
    #[error("building the registration stub: {0}")]
    Stub(#[from] weft_codegen::BuildError),
    /// Reading the target's maps failed.
    #[error(transparent)]
    Inspect(#[from] crate::inspect::InspectError),
    /// Writing to the target failed.
    #[error(transparent)]
    Memory(#[from] crate::memory::MemoryError),
}

/// One mapped area.
#[derive(Clone, Debug)]
pub struct Area {
    /// First address.
    pub start: u64,
    /// Size in bytes.
    pub size: u64,
    /// Bytes handed out so far (the stub first).
    pub used: u64,
    /// Address of this area's registration stub.
    pub stub: u64,
}

/// Every trampoline area of one target.
#[derive(Debug, Default)]
pub struct Pool {
    areas: Vec<Area>,
    /// Released spans (record included), reused by later reservations.
    free: Vec<std::ops::Range<u64>>,
    /// Spans handed out, by start (a reused span may be longer than asked).
    given: std::collections::HashMap<u64, u64>,
    /// Areas planned but not mapped yet ([`Pool::plan_area`]).
    planned: Vec<Area>,
}

impl Pool {
    /// Every mapped area: (start, size).
    pub fn areas(&self) -> Vec<(u64, u64)> {
        self.areas.iter().map(|a| (a.start, a.size)).collect()
    }

    /// Bytes of target memory mapped for trampolines (all areas).
    pub fn mapped_bytes(&self) -> u64 {
        self.areas.iter().map(|a| a.size).sum()
    }

    /// Bytes of the areas handed out so far (their high-water marks):
    /// reused spans do not add to it.
    pub fn used_bytes(&self) -> u64 {
        self.areas.iter().map(|a| a.used).sum()
    }

    /// Makes the span of a removed probe's trampoline — `trampoline` as
    /// returned by [`Pool::reserve`], its record in front included — free
    /// for later reservations. The caller guarantees no thread can still
    /// execute in it or return into it.
    pub fn release(&mut self, trampoline: std::ops::Range<u64>) {
        let start = trampoline.start - RECORD_LEN;
        if let Some(end) = self.given.remove(&start) {
            self.free.push(start..end);
        }
    }

    /// Reserves `len` bytes (16-aligned) within [`MAX_DISTANCE`] of `near`,
    /// mapping a new area when needed, with [`RECORD_LEN`] bytes in front for
    /// the probe's [`record`]. Returns the trampoline's address and the
    /// area's registration stub.
    pub fn reserve(
        &mut self,
        tracer: &mut Tracer,
        call_tid: Tid,
        mmap_fn: u64,
        register_fn: u64,
        near: u64,
        len: u64,
    ) -> Result<(u64, u64), PoolError> {
        self.reserve_within(
            tracer,
            call_tid,
            mmap_fn,
            register_fn,
            near,
            len,
            MAX_DISTANCE,
        )
    }

    /// [`Pool::reserve`] for code that nothing reaches with a `rel32` and
    /// that reaches nothing with one (the exit code: call records jump to
    /// it through a pointer, it calls through literals): near `near` where
    /// there is room, anywhere else otherwise.
    pub fn reserve_preferably_near(
        &mut self,
        tracer: &mut Tracer,
        call_tid: Tid,
        mmap_fn: u64,
        register_fn: u64,
        near: u64,
        len: u64,
    ) -> Result<(u64, u64), PoolError> {
        match self.reserve(tracer, call_tid, mmap_fn, register_fn, near, len) {
            Err(PoolError::NoGap { .. }) => {
                self.reserve_within(tracer, call_tid, mmap_fn, register_fn, near, len, u64::MAX)
            }
            got => got,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn reserve_within(
        &mut self,
        tracer: &mut Tracer,
        call_tid: Tid,
        mmap_fn: u64,
        register_fn: u64,
        near: u64,
        len: u64,
        reach: u64,
    ) -> Result<(u64, u64), PoolError> {
        if let Some(got) = self.try_reserve_within(near, len, reach) {
            return Ok(got);
        }
        let size = area_size(len);
        let maps: Vec<Mapping> = read_maps(tracer.pid())?;
        let at = self
            .free_gap(&maps, near, size, reach)
            .ok_or(PoolError::NoGap { near })?;
        let got = map_area(tracer, call_tid, mmap_fn, register_fn, at, size)?;
        if got != at {
            return Err(PoolError::Mmap { at, got });
        }
        self.areas.push(Area::fresh(at, size));
        Ok(self
            .try_reserve_within(near, len, reach)
            .expect("a fresh area has room for what it was mapped for"))
    }

    /// [`Pool::reserve`] without mapping: `None` when no released span and
    /// no mapped area within `reach` of `near` has room.
    fn try_reserve_within(&mut self, near: u64, len: u64, reach: u64) -> Option<(u64, u64)> {
        let len = len.div_ceil(16) * 16 + RECORD_LEN;
        // A released span first: the smallest one that fits and is near.
        let near_enough = |r: &std::ops::Range<u64>| {
            r.end - r.start >= len && r.start.abs_diff(near) < reach && r.end.abs_diff(near) < reach
        };
        if let Some((i, _)) = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, r)| near_enough(r))
            .min_by_key(|(_, r)| r.end - r.start)
        {
            let span = self.free.swap_remove(i);
            self.given.insert(span.start, span.end);
            let area = self
                .areas
                .iter()
                .find(|a| a.start <= span.start && span.start < a.start + a.size)
                .expect("released spans lie in areas");
            return Some((span.start + RECORD_LEN, area.stub));
        }
        let area = self.areas.iter_mut().find(|a| a.fits(near, len, reach))?;
        Some(area.take(len, &mut self.given))
    }

    /// Plans an area for a batch of trampolines of `total` bytes (records
    /// included) near `near`, in a gap of the target's `maps`, without
    /// mapping it: trampolines can be reserved in it
    /// ([`Pool::reserve_planned`]) and built for their final addresses while
    /// the target runs, and the area is mapped, at that very address, when
    /// they are written ([`Pool::map_planned`]). Returns its start.
    pub fn plan_area(&mut self, maps: &[Mapping], near: u64, total: u64) -> Option<u64> {
        let size = area_size(total.saturating_sub(RECORD_LEN));
        let at = self.free_gap(maps, near, size, MAX_DISTANCE)?;
        self.planned.push(Area::fresh(at, size));
        Some(at)
    }

    /// Whether an area (mapped or planned) lies within reach of `near`.
    pub fn has_area_near(&self, near: u64) -> bool {
        self.areas
            .iter()
            .chain(&self.planned)
            .any(|a| a.fits(near, 0, MAX_DISTANCE))
    }

    /// A free range in `maps` for a new area within reach of `near`.
    pub fn gap_near(&self, maps: &[Mapping], near: u64) -> Option<u64> {
        self.free_gap(maps, near, AREA_SIZE, MAX_DISTANCE)
    }

    /// Whether the area starting at `area` is mapped (not only planned).
    pub fn is_mapped(&self, area: u64) -> bool {
        self.areas.iter().any(|a| a.start == area)
    }

    /// A mapped area within reach of `near` with `total` bytes (records
    /// included) still to hand out: a batch built ahead goes there rather
    /// than into a new area, so that its insertion needs no remote `mmap`
    /// in the stop of the world (and repeated batches do not map an area
    /// each). Its start.
    pub fn mapped_room(&self, near: u64, total: u64) -> Option<u64> {
        self.areas
            .iter()
            .find(|a| a.fits(near, total, MAX_DISTANCE))
            .map(|a| a.start)
    }

    /// Reserves `len` bytes (and the record in front) in the area starting
    /// at `area`, planned ([`Pool::plan_area`]) or mapped
    /// ([`Pool::mapped_room`]): the trampoline's address and the area's
    /// registration stub (written when a planned area is mapped).
    pub fn reserve_planned(&mut self, area: u64, len: u64) -> Option<(u64, u64)> {
        let len = len.div_ceil(16) * 16 + RECORD_LEN;
        let area = self
            .planned
            .iter_mut()
            .chain(self.areas.iter_mut())
            .find(|a| a.start == area && a.used + len <= a.size)?;
        Some(area.take(len, &mut self.given))
    }

    /// Maps the planned area starting at `area` where it was planned (a
    /// remote `mmap`, `call_tid` stopped) and writes its header and
    /// registration stub. `Ok(false)` when that address is no longer free:
    /// the area and every reservation in it are dropped then, and so is an
    /// area already mapped or unknown.
    pub fn map_planned(
        &mut self,
        tracer: &mut Tracer,
        call_tid: Tid,
        mmap_fn: u64,
        register_fn: u64,
        area: u64,
    ) -> Result<bool, PoolError> {
        let Some(i) = self.planned.iter().position(|a| a.start == area) else {
            return Ok(self.areas.iter().any(|a| a.start == area));
        };
        let planned = self.planned.swap_remove(i);
        match map_area(tracer, call_tid, mmap_fn, register_fn, area, planned.size) {
            Ok(got) if got == area => {
                self.areas.push(planned);
                Ok(true)
            }
            // Taken meanwhile (EEXIST), or elsewhere: reserve otherwise.
            Ok(_) => {
                self.given
                    .retain(|&s, _| !(area <= s && s < area + planned.size));
                Ok(false)
            }
            Err(e) => {
                self.given
                    .retain(|&s, _| !(area <= s && s < area + planned.size));
                Err(e)
            }
        }
    }

    /// A gap of `size` bytes within `reach` of `near` in `maps` that no
    /// planned area takes.
    fn free_gap(&self, maps: &[Mapping], near: u64, size: u64, reach: u64) -> Option<u64> {
        if self.planned.is_empty() {
            return crate::inspect::maps::free_gap_near(maps, near, size, reach - size);
        }
        // The planned areas count as mappings.
        let mut all: Vec<Mapping> = maps.to_vec();
        all.extend(self.planned.iter().filter_map(|a| {
            maps.first().map(|m| Mapping {
                start: a.start,
                end: a.start + a.size,
                ..m.clone()
            })
        }));
        all.sort_by_key(|m| m.start);
        crate::inspect::maps::free_gap_near(&all, near, size, reach - size)
    }
}

impl Area {
    /// A new area of `size` bytes at `start`: its header and registration
    /// stub, nothing handed out yet.
    fn fresh(start: u64, size: u64) -> Area {
        Area {
            start,
            size,
            used: AREA_HEADER + stub_room(),
            stub: start + AREA_HEADER,
        }
    }

    fn fits(&self, near: u64, len: u64, reach: u64) -> bool {
        self.used + len <= self.size
            && self.start.abs_diff(near) < reach
            && (self.start + self.size).abs_diff(near) < reach
    }

    /// Hands out the next `len` bytes (a record and a trampoline).
    fn take(&mut self, len: u64, given: &mut std::collections::HashMap<u64, u64>) -> (u64, u64) {
        let at = self.start + self.used;
        self.used += len;
        given.insert(at, at + len);
        (at + RECORD_LEN, self.stub)
    }
}

/// Bytes of an area's registration stub, rounded to a cache line.
fn stub_room() -> u64 {
    (register_stub_len(vector_save()) as u64).div_ceil(64) * 64
}

/// The size of an area with room for one trampoline of `len` bytes (and
/// its record) after its header and stub: [`AREA_SIZE`] at least.
fn area_size(len: u64) -> u64 {
    let len = len.div_ceil(16) * 16 + RECORD_LEN;
    (AREA_HEADER + stub_room() + len)
        .max(AREA_SIZE)
        .div_ceil(4096)
        * 4096
}

/// Maps `size` bytes at `at` in the target (read and execute,
/// `MAP_FIXED_NOREPLACE`) and writes an area's magic and registration
/// stub there; returns what `mmap` returned (not `at`: nothing written).
fn map_area(
    tracer: &mut Tracer,
    call_tid: Tid,
    mmap_fn: u64,
    register_fn: u64,
    at: u64,
    size: u64,
) -> Result<u64, PoolError> {
    let prot = (libc::PROT_READ | libc::PROT_EXEC) as u64;
    let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64;
    let got = tracer.call(
        call_tid,
        &RemoteCall::new(
            "mmap",
            mmap_fn,
            vec![
                RemoteArg::Value(at),
                RemoteArg::Value(size),
                RemoteArg::Value(prot),
                RemoteArg::Value(flags),
                RemoteArg::Value(u64::MAX),
                RemoteArg::Value(0),
            ],
        ),
        false,
    )?;
    if got != at {
        return Ok(got);
    }
    let stub_at = at + AREA_HEADER;
    let stub = register_stub(stub_at, register_fn, vector_save())?;
    tracer.memory().write(stub_at, &stub)?;
    tracer.memory().write(at, &AREA_MAGIC.to_le_bytes())?;
    Ok(got)
}
