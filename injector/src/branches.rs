//! Every direct branch of a module, indexed by target, so that a patch is
//! refused when *any* code in the module jumps into the bytes it would
//! overwrite — not only the patched function's own code. Hand-written
//! assembly shares code between entry points (glibc's `__mempcpy_*` jumps
//! three bytes into `__memmove_*`), and compilers emit `.cold` parts that
//! jump back into their function's body.
//!
//! Built once per module and attach, from the module's file: each function
//! (symbol or `.eh_frame` FDE) is swept from its own start, which keeps the
//! linear sweep in step with the instruction stream.

use crate::inspect::{InspectError, Module};
use weft_codegen::{direct_branches, Branch};

/// Direct branches of one module, sorted by target (runtime addresses).
#[derive(Debug, Default)]
pub struct BranchIndex {
    by_target: Vec<Branch>,
}

impl BranchIndex {
    /// Sweeps every executable `PT_LOAD` segment of `module`'s file.
    pub fn build(module: &Module) -> Result<BranchIndex, InspectError> {
        let image = module.image()?;
        let data = image.data();
        let mut starts: Vec<u64> = image.functions()?.iter().map(|f| f.vaddr).collect();
        // FDEs also cover local functions of stripped libraries.
        if let Ok(fdes) = image.fde_functions() {
            starts.extend(fdes.iter().map(|f| f.vaddr));
        }
        starts.sort_unstable();
        starts.dedup();
        let mut out = Vec::new();
        for segment in image
            .header()
            .segments
            .iter()
            .filter(|s| s.is_load() && s.is_executable())
        {
            let (Some(file_end), true) = (
                segment.offset.checked_add(segment.filesz),
                segment.offset as usize <= data.len(),
            ) else {
                continue;
            };
            let file_end = (file_end as usize).min(data.len());
            let seg_start = segment.vaddr;
            // A corrupt header can put the segment at the top of the address
            // space: skip it rather than wrap around.
            let Some(seg_end) = segment
                .vaddr
                .checked_add((file_end - segment.offset as usize) as u64)
            else {
                continue;
            };
            // Sweep from the segment start and from every function start
            // inside it, each piece up to the next start.
            let mut cuts: Vec<u64> = std::iter::once(seg_start)
                .chain(
                    starts
                        .iter()
                        .copied()
                        .filter(|&s| s > seg_start && s < seg_end),
                )
                .collect();
            cuts.push(seg_end);
            for piece in cuts.windows(2) {
                let lo = (segment.offset + (piece[0] - seg_start)) as usize;
                let hi = (segment.offset + (piece[1] - seg_start)) as usize;
                if let Some(bytes) = data.get(lo..hi) {
                    direct_branches(module.runtime_address(piece[0]), bytes, &mut out);
                }
            }
        }
        out.sort_unstable_by_key(|b| (b.target, b.source));
        Ok(BranchIndex { by_target: out })
    }

    /// A branch into `(start, end)` (exclusive at both ends) whose source is
    /// not inside `[start, end)` itself.
    pub fn into_range(&self, start: u64, end: u64) -> Option<Branch> {
        self.all_into_range(start, end).next()
    }

    /// Every branch into `(start, end)` (exclusive at both ends) whose
    /// source is not inside `[start, end)` itself, by target.
    pub fn all_into_range(&self, start: u64, end: u64) -> impl Iterator<Item = Branch> + '_ {
        let first = self.by_target.partition_point(|b| b.target <= start);
        self.by_target[first..]
            .iter()
            .take_while(move |b| b.target < end)
            .filter(move |b| !(start..end).contains(&b.source))
            .copied()
    }

    /// Direct branches to exactly `address`, with their kinds.
    pub fn to(&self, address: u64) -> &[Branch] {
        let first = self.by_target.partition_point(|b| b.target < address);
        let end = first + self.by_target[first..].partition_point(|b| b.target == address);
        &self.by_target[first..end]
    }

    /// A `jmp` or `jcc` to the entry `start` of the function `[start,
    /// end)` from code outside it, preferring one from the nearest code (a
    /// compiler's split-off part is entered from its parent, and a tail
    /// call's caller is no worse a name for it). A jump reaches a function
    /// without pushing a return address: if the jumping code's frame is
    /// still live there, the function is a fragment of that code, not a
    /// function that returns to a caller.
    pub fn jump_to_entry(&self, start: u64, end: u64) -> Option<Branch> {
        self.to(start)
            .iter()
            .filter(|b| b.kind.is_jump() && !(start..end).contains(&b.source))
            .min_by_key(|b| b.source.abs_diff(start))
            .copied()
    }

    /// Number of branches indexed.
    pub fn len(&self) -> usize {
        self.by_target.len()
    }

    /// Whether no branch was found.
    pub fn is_empty(&self) -> bool {
        self.by_target.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_codegen::BranchKind;

    fn jump(source: u64, target: u64) -> Branch {
        Branch {
            source,
            target,
            kind: BranchKind::Jump,
        }
    }

    #[test]
    fn range_queries_exclude_the_range_itself() {
        let index = BranchIndex {
            by_target: vec![
                jump(0x50, 0x100),
                jump(0x101, 0x102),
                jump(0x200, 0x103),
                jump(0x300, 0x105),
            ],
        };
        assert_eq!(index.into_range(0x100, 0x105), Some(jump(0x200, 0x103)));
        assert_eq!(index.into_range(0x103, 0x105), None);
        assert_eq!(index.into_range(0x0, 0x100), None);
        // Every one, by target: a patch two siblings jump into needs a
        // companion for each.
        let all: Vec<Branch> = index.all_into_range(0x100, 0x106).collect();
        assert_eq!(all, [jump(0x200, 0x103), jump(0x300, 0x105)]);
    }

    #[test]
    fn jumps_and_calls_to_an_entry_are_told_apart() {
        // 0x1000: call 0x1020 ; jmp 0x1020 ; je 0x1020 ; call 0x1030 ; nops
        // 0x1020: the function [0x1020, 0x1030), which jumps to its own
        //         entry (a loop, not an entry by jump) at 0x1020.
        let mut code = vec![0xe8, 0x1b, 0, 0, 0]; // call rel32 -> 0x1020
        code.extend([0xe9, 0x16, 0, 0, 0]); // jmp rel32 -> 0x1020
        code.extend([0x74, 0x14]); // je rel8 -> 0x1020
        code.extend([0xe8, 0x1f, 0, 0, 0]); // call rel32 -> 0x1030
        code.resize(0x20, 0x90);
        code.extend([0xeb, 0xfe]); // jmp rel8 -> 0x1020 (itself)
        let mut found = Vec::new();
        direct_branches(0x1000, &code, &mut found);
        found.sort_unstable_by_key(|b| (b.target, b.source));
        let index = BranchIndex { by_target: found };
        let kinds: Vec<(u64, BranchKind)> = index
            .to(0x1020)
            .iter()
            .map(|b| (b.source, b.kind))
            .collect();
        assert_eq!(
            kinds,
            [
                (0x1000, BranchKind::Call),
                (0x1005, BranchKind::Jump),
                (0x100a, BranchKind::Conditional),
                (0x1020, BranchKind::Jump),
            ]
        );
        // The nearest jump from outside the function; never a call, never
        // its own loop.
        assert_eq!(
            index
                .jump_to_entry(0x1020, 0x1030)
                .map(|b| (b.source, b.kind)),
            Some((0x100a, BranchKind::Conditional))
        );
        assert_eq!(index.to(0x1030).len(), 1);
        assert_eq!(index.jump_to_entry(0x1030, 0x1040), None, "only called");
        assert!(index.to(0x1021).is_empty());
    }

    #[test]
    fn libc_has_the_mempcpy_into_memmove_jump() {
        // This test process's own libc: some branch must land strictly inside
        // the first bytes of the memmove implementation glibc's mempcpy
        // variants share (their `jmp L(start_erms)`).
        let image = crate::inspect::ProcessImage::open(std::process::id() as i32).unwrap();
        let libc = image
            .modules()
            .iter()
            .find(|m| m.name().starts_with("libc.so"))
            .unwrap();
        let index = BranchIndex::build(libc).unwrap();
        assert!(
            index.len() > 10_000,
            "only {} branches in libc",
            index.len()
        );
        let functions = libc.image().unwrap().fde_functions().unwrap();
        let shared_entries = functions
            .iter()
            .filter(|f| {
                let start = libc.runtime_address(f.vaddr);
                index.into_range(start, start + 5).is_some()
            })
            .count();
        assert!(
            shared_entries > 0,
            "no function of libc is jumped into near its entry"
        );
    }
}
