//! Several sessions' probes on one function: the *chain* at a patch site,
//! and what taking some of its links out means (pure logic over directory
//! entries; `Process` carries it out).
//!
//! Each link's patch is a `jmp` to its trampoline, whose displaced
//! instruction is what the patch replaced: the link below's `jmp`, or for
//! the first link the function's own bytes. So a call runs every link's
//! trampoline, newest first, then the function. A link can only come out
//! of the site while it is the front (its `jmp` is the one in place):
//! writing back its `original` makes the link below the front. A link with
//! others over it cannot be cut out (the one above has a `jmp` to it baked
//! into its trampoline), so it is *bypassed* instead: its trampoline starts
//! with a jump to its copy of the displaced instructions, and its entry
//! stays, [`PROBE_BYPASSED`], until every link over it is gone.

use weft_rt::layout::{ProbeEntry, PROBE_BYPASSED, PROBE_FREE, PROBE_LIVE};

/// The directory entries at one patch site (live and bypassed), by index.
pub(crate) type Links = [(usize, ProbeEntry)];

/// Where the `jmp rel32` in `bytes` at `at` goes, if it is one.
pub(crate) fn jump_target(at: u64, bytes: &[u8]) -> Option<u64> {
    let rel: [u8; 4] = bytes.get(1..5)?.try_into().ok()?;
    (bytes[0] == 0xe9).then(|| {
        at.wrapping_add(5)
            .wrapping_add(i64::from(i32::from_le_bytes(rel)) as u64)
    })
}

/// The links of the chain at a site whose bytes are now `current`, front
/// (the link whose patch is in place) first, down to the first link (whose
/// `original` is the function's own code), as positions in `links`. Empty
/// when no link's patch is in place. Entries not reached this way (a patch
/// that never went in) are not in it.
pub(crate) fn order(current: &[u8; 5], links: &Links) -> Vec<usize> {
    let mut chain = Vec::new();
    let Some(mut k) = links
        .iter()
        .position(|(_, e)| e.patch[..5] == current[..] && e.state != PROBE_FREE)
    else {
        return chain;
    };
    loop {
        chain.push(k);
        let e = &links[k].1;
        let Some(target) = jump_target(e.patch_address, &e.original[..5]) else {
            break;
        };
        match links
            .iter()
            .position(|(_, below)| below.trampoline == target && below.trampoline != 0)
        {
            // A cycle cannot be built; never loop on a damaged directory.
            Some(next) if !chain.contains(&next) => k = next,
            _ => break,
        }
    }
    chain
}

/// What taking `leaving` (directory indices) out of the chain at a site
/// takes.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Unlink {
    /// The bytes to write at the site (the last link cut off the front's
    /// `original`), if the front changes.
    pub site: Option<[u8; 5]>,
    /// Entries to free: links cut off the front, and leaving entries whose
    /// patch is not in the chain (nothing to write for them).
    pub free: Vec<usize>,
    /// Leaving links with links over them: to bypass.
    pub bypass: Vec<usize>,
}

/// Plans taking `leaving` out of the site whose bytes are `current` and
/// whose entries are `links`: links come off the front while they are
/// leaving or bypassed already; the leaving links under one that stays are
/// bypassed.
pub(crate) fn unlink(current: &[u8; 5], links: &Links, leaving: &[usize]) -> Unlink {
    let chain = order(current, links);
    let mut plan = Unlink::default();
    let mut front = 0;
    while let Some(&k) = chain.get(front) {
        let (index, e) = &links[k];
        if !(leaving.contains(index) || e.state == PROBE_BYPASSED) {
            break;
        }
        let mut bytes = [0u8; 5];
        bytes.copy_from_slice(&e.original[..5]);
        plan.site = Some(bytes);
        plan.free.push(*index);
        front += 1;
    }
    for &k in &chain[front..] {
        let (index, e) = &links[k];
        if leaving.contains(index) && e.state == PROBE_LIVE {
            plan.bypass.push(*index);
        }
    }
    for &index in leaving {
        let in_chain = chain.iter().any(|&k| links[k].0 == index);
        if !in_chain && !plan.free.contains(&index) {
            plan.free.push(index);
        }
    }
    plan
}

/// The `jmp rel32` written at a trampoline's start to its copy of the
/// displaced instructions, `relocated` bytes on: what makes a bypassed
/// link's trampoline pass calls straight on.
pub(crate) fn pass_through(relocated: u16) -> [u8; 5] {
    let mut jump = [0xe9, 0, 0, 0, 0];
    jump[1..].copy_from_slice(&(i32::from(relocated) - 5).to_le_bytes());
    jump
}

#[cfg(test)]
mod tests {
    use super::*;

    const SITE: u64 = 0x40_1004;

    fn jmp(from: u64, to: u64) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0] = 0xe9;
        b[1..5].copy_from_slice(&((to as i64 - from as i64 - 5) as i32).to_le_bytes());
        b
    }

    /// A link with its trampoline at `trampoline`, over `below` (a
    /// trampoline) or the function's code.
    fn link(trampoline: u64, below: Option<u64>) -> ProbeEntry {
        let code = [0x55, 0x48, 0x89, 0xe5, 0x41, 0, 0, 0];
        ProbeEntry {
            state: PROBE_LIVE,
            owners: 1,
            patch_address: SITE,
            trampoline,
            trampoline_len: 64,
            relocated: 40,
            displaced: 5,
            original: below.map_or(code, |t| jmp(SITE, t)),
            patch: jmp(SITE, trampoline),
            compiled: code,
            ..ProbeEntry::default()
        }
    }

    fn five(b: [u8; 8]) -> [u8; 5] {
        b[..5].try_into().unwrap()
    }

    /// A (first), B over A, C over B: indices 10, 11, 12, C in place.
    fn three() -> Vec<(usize, ProbeEntry)> {
        vec![
            (11, link(0x2000, Some(0x1000))),
            (10, link(0x1000, None)),
            (12, link(0x3000, Some(0x2000))),
        ]
    }

    #[test]
    fn the_chain_runs_from_the_patch_in_place_down_to_the_code() {
        let links = three();
        let current = five(jmp(SITE, 0x3000));
        let chain: Vec<usize> = order(&current, &links)
            .into_iter()
            .map(|k| links[k].0)
            .collect();
        assert_eq!(chain, [12, 11, 10]);
        // A patch not in place: no chain.
        assert!(order(&[0x55, 0x48, 0x89, 0xe5, 0x41], &links).is_empty());
    }

    #[test]
    fn the_front_leaving_puts_back_the_link_below() {
        let links = three();
        let plan = unlink(&five(jmp(SITE, 0x3000)), &links, &[12]);
        assert_eq!(plan.site, Some(five(jmp(SITE, 0x2000))));
        assert_eq!((plan.free, plan.bypass), (vec![12], vec![]));
    }

    #[test]
    fn a_link_under_another_is_bypassed_and_freed_once_it_comes_to_the_front() {
        let mut links = three();
        let current = five(jmp(SITE, 0x3000));
        let plan = unlink(&current, &links, &[11]);
        assert_eq!(plan.site, None);
        assert_eq!((plan.free, plan.bypass), (vec![], vec![11]));
        links[0].1.state = PROBE_BYPASSED;
        links[0].1.owners = 0;
        // C leaves: B, bypassed, goes with it; A is in front again.
        let plan = unlink(&current, &links, &[12]);
        assert_eq!(plan.site, Some(five(jmp(SITE, 0x1000))));
        assert_eq!(plan.free, vec![12, 11]);
        // Then A, the code comes back.
        let plan = unlink(&five(jmp(SITE, 0x1000)), &links[1..2], &[10]);
        assert_eq!(plan.site, Some([0x55, 0x48, 0x89, 0xe5, 0x41]));
    }

    #[test]
    fn everything_leaving_at_once_puts_the_code_back() {
        let links = three();
        let plan = unlink(&five(jmp(SITE, 0x3000)), &links, &[10, 11, 12]);
        assert_eq!(plan.site, Some([0x55, 0x48, 0x89, 0xe5, 0x41]));
        assert_eq!(plan.free, vec![12, 11, 10]);
        assert!(plan.bypass.is_empty());
        // The first and the last leave, the middle stays: the front goes, the
        // first is bypassed under the middle.
        let plan = unlink(&five(jmp(SITE, 0x3000)), &links, &[10, 12]);
        assert_eq!(plan.site, Some(five(jmp(SITE, 0x2000))));
        assert_eq!((plan.free, plan.bypass), (vec![12], vec![10]));
    }

    #[test]
    fn a_patch_that_never_went_in_is_only_freed() {
        let mut links = three();
        links.push((13, link(0x4000, Some(0x3000))));
        let plan = unlink(&five(jmp(SITE, 0x3000)), &links, &[13]);
        assert_eq!(
            (plan.site, plan.free, plan.bypass),
            (None, vec![13], vec![])
        );
    }

    #[test]
    fn a_pass_through_jumps_to_the_copy() {
        let jump = pass_through(40);
        assert_eq!(jump_target(0x1000, &jump), Some(0x1000 + 40));
        assert_eq!(jump_target(SITE, &jmp(SITE, 0x2000)), Some(0x2000));
        assert_eq!(jump_target(SITE, &[0x55, 0x48, 0x89, 0xe5, 0x41]), None);
    }
}
