//! Parsing `/proc/PID/maps` and finding free address ranges.

use std::fmt;
use std::path::PathBuf;

use super::error::InspectError;
pub use super::error::MapsParseError;

/// The page size weft assumes for address arithmetic.
///
/// x86-64 Linux maps files with 4 KiB granularity even when huge pages are in
/// use, and `/proc/PID/maps` offsets are multiples of it.
pub const PAGE_SIZE: u64 = 4096;

/// Rounds `x` down to a page boundary.
#[inline]
pub fn page_down(x: u64) -> u64 {
    x & !(PAGE_SIZE - 1)
}

/// Rounds `x` up to a page boundary, or `None` on overflow.
#[inline]
pub fn page_up(x: u64) -> Option<u64> {
    Some(x.checked_add(PAGE_SIZE - 1)? & !(PAGE_SIZE - 1))
}

/// The access permissions of a mapping (the `rwxp` column).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Perms {
    /// `r`: readable.
    pub read: bool,
    /// `w`: writable.
    pub write: bool,
    /// `x`: executable.
    pub exec: bool,
    /// `s` (shared) rather than `p` (private, copy-on-write).
    pub shared: bool,
}

impl Perms {
    /// Parses the 4-character permission column, e.g. `r-xp`.
    fn parse(s: &str) -> Option<Perms> {
        let b = s.as_bytes();
        if b.len() != 4 {
            return None;
        }
        let flag = |c: u8, set: u8| match c {
            _ if c == set => Some(true),
            b'-' => Some(false),
            _ => None,
        };
        Some(Perms {
            read: flag(b[0], b'r')?,
            write: flag(b[1], b'w')?,
            exec: flag(b[2], b'x')?,
            shared: match b[3] {
                b's' => true,
                b'p' => false,
                _ => return None,
            },
        })
    }
}

impl fmt::Display for Perms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = |on: bool, ch: char| if on { ch } else { '-' };
        write!(
            f,
            "{}{}{}{}",
            c(self.read, 'r'),
            c(self.write, 'w'),
            c(self.exec, 'x'),
            if self.shared { 's' } else { 'p' }
        )
    }
}

/// What backs a mapping (the last column of `/proc/PID/maps`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum MappingPath {
    /// No name: anonymous memory (or a `MAP_ANONYMOUS` region without a name).
    Anonymous,
    /// A file, by its absolute path in the target's mount namespace.
    File {
        /// The path, without the ` (deleted)` suffix.
        path: PathBuf,
        /// The kernel appended ` (deleted)`: the file was unlinked (or
        /// replaced by a rename) after it was mapped, so opening `path` would
        /// give another file or none.
        deleted: bool,
    },
    /// A kernel-provided name that is not a file: `[vdso]`, `[vvar]`,
    /// `[stack]`, `[heap]`, `[vsyscall]`, `[anon:NAME]` (prctl
    /// `PR_SET_VMA_ANON_NAME`), `anon_inode:...`, kept verbatim.
    Pseudo(String),
}

impl MappingPath {
    fn parse(s: &str) -> MappingPath {
        if s.is_empty() {
            MappingPath::Anonymous
        } else if s.starts_with('/') {
            // The kernel appends the suffix to d_path() of an unlinked dentry.
            // A file literally named "x (deleted)" is indistinguishable; the
            // inode check when opening catches that case.
            match s.strip_suffix(" (deleted)") {
                Some(p) => MappingPath::File {
                    path: PathBuf::from(p),
                    deleted: true,
                },
                None => MappingPath::File {
                    path: PathBuf::from(s),
                    deleted: false,
                },
            }
        } else {
            MappingPath::Pseudo(s.to_owned())
        }
    }

    /// The file path, if the mapping is file-backed.
    pub fn file(&self) -> Option<&std::path::Path> {
        match self {
            MappingPath::File { path, .. } => Some(path),
            _ => None,
        }
    }
}

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mapping {
    /// First address of the mapping.
    pub start: u64,
    /// One past the last address of the mapping.
    pub end: u64,
    /// Access permissions.
    pub perms: Perms,
    /// Offset in the file of the byte mapped at `start` (0 for anonymous).
    pub offset: u64,
    /// Device of the file, `(major, minor)`.
    pub dev: (u32, u32),
    /// Inode of the file (0 for anonymous memory).
    pub inode: u64,
    /// What backs the mapping.
    pub path: MappingPath,
}

impl Mapping {
    /// Whether `addr` lies inside `[start, end)`.
    #[inline]
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }

    /// `end - start`.
    #[inline]
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// Whether the mapping is empty (never true for kernel output).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Splits the next space-separated field off `rest`.
fn field<'a>(rest: &mut &'a str) -> Option<&'a str> {
    let s = rest.trim_start_matches(' ');
    if s.is_empty() {
        return None;
    }
    let end = s.find(' ').unwrap_or(s.len());
    let (f, r) = s.split_at(end);
    *rest = r;
    Some(f)
}

fn parse_line(line: &str) -> Result<Mapping, &'static str> {
    let mut rest = line;
    let range = field(&mut rest).ok_or("missing address range")?;
    let (start, end) = range.split_once('-').ok_or("address range without '-'")?;
    let start = u64::from_str_radix(start, 16).map_err(|_| "bad start address")?;
    let end = u64::from_str_radix(end, 16).map_err(|_| "bad end address")?;
    if end < start {
        return Err("end address below start address");
    }
    let perms =
        Perms::parse(field(&mut rest).ok_or("missing permissions")?).ok_or("bad permissions")?;
    let offset = u64::from_str_radix(field(&mut rest).ok_or("missing offset")?, 16)
        .map_err(|_| "bad offset")?;
    let dev = field(&mut rest).ok_or("missing device")?;
    let (major, minor) = dev.split_once(':').ok_or("device without ':'")?;
    let dev = (
        u32::from_str_radix(major, 16).map_err(|_| "bad device major")?,
        u32::from_str_radix(minor, 16).map_err(|_| "bad device minor")?,
    );
    let inode = field(&mut rest)
        .ok_or("missing inode")?
        .parse::<u64>()
        .map_err(|_| "bad inode")?;
    // The kernel pads the inode column with spaces; everything after the
    // padding is the name, which may itself contain spaces. File paths are
    // absolute, so no real name starts with a space.
    let path = MappingPath::parse(rest.trim_start_matches(' '));
    Ok(Mapping {
        start,
        end,
        perms,
        offset,
        dev,
        inode,
        path,
    })
}

/// Parses the contents of a `/proc/PID/maps` file.
///
/// Empty lines are ignored. The result is in file order, which the kernel
/// guarantees to be ascending by address.
pub fn parse_maps(text: &str) -> Result<Vec<Mapping>, MapsParseError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let m = parse_line(line).map_err(|what| MapsParseError {
            line: i + 1,
            what,
            content: line.chars().take(200).collect(),
        })?;
        out.push(m);
    }
    Ok(out)
}

/// Reads and parses `/proc/PID/maps`.
///
/// A zombie or kernel thread has an empty maps file, which gives an empty
/// vector. Paths that are not valid UTF-8 are converted lossily (such files
/// then fail to open with a clear error).
pub fn read_maps(pid: i32) -> Result<Vec<Mapping>, InspectError> {
    let path = PathBuf::from(crate::inspect::procfs::pid_file(pid, "maps"));
    let bytes =
        std::fs::read(&path).map_err(|e| InspectError::from_proc_io(pid, path.clone(), e))?;
    let text = String::from_utf8_lossy(&bytes);
    parse_maps(&text).map_err(|source| InspectError::Maps { path, source })
}

/// Never place anything in the first 64 KiB (`vm.mmap_min_addr`, and NULL
/// dereference detection).
const MIN_ADDR: u64 = 0x1_0000;
/// The top of the x86-64 user address space (4-level paging), minus the
/// guard page the kernel keeps below it.
const MAX_ADDR: u64 = 0x7fff_ffff_f000;
/// Room left below `[stack]` so the main thread's stack can still grow
/// (the default `RLIMIT_STACK` is 8 MiB, plus the kernel's 1 MiB guard gap).
const STACK_RESERVE: u64 = 9 << 20;
/// Room left above `[heap]` so `brk` can still grow the heap in place.
const HEAP_RESERVE: u64 = 64 << 20;

/// Finds a page-aligned address `a` such that `[a, a + size)` is unmapped and
/// lies entirely within `max_distance` bytes of `near`
/// (`near - max_distance <= a` and `a + size <= near + max_distance`).
///
/// Among the candidates, the one whose extent is closest to `near` wins. The
/// result is never below 64 KiB nor above `0x7fff_ffff_f000`, and keeps clear
/// of the room `[stack]` and `[heap]` need to grow. `size` is rounded up to
/// whole pages. `maps` need not be sorted. Returns `None` when no hole fits
/// (or `size` is 0).
///
/// This is used to place trampolines within `rel32` reach (±2 GiB) of a
/// module; the caller should still map with `MAP_FIXED_NOREPLACE`, as the
/// target may map something in the meantime.
pub fn free_gap_near(maps: &[Mapping], near: u64, size: u64, max_distance: u64) -> Option<u64> {
    if size == 0 {
        return None;
    }
    let size = page_up(size)?;
    let used = occupied(maps);

    let window_lo = near.saturating_sub(max_distance).max(MIN_ADDR);
    let window_hi = near.saturating_add(max_distance).min(MAX_ADDR);

    // Distance between the extent [a, a+size) and `near`.
    let dist = |a: u64| -> u64 {
        let e = a + size;
        if e <= near {
            near - e
        } else {
            // 0 when the extent straddles `near`.
            a.saturating_sub(near)
        }
    };

    let mut best: Option<u64> = None;
    let mut consider_hole = |lo: u64, hi: u64| {
        let lo = lo.max(window_lo);
        let hi = hi.min(window_hi);
        let Some(a_lo) = page_up(lo) else { return };
        let Some(last) = hi.checked_sub(size) else {
            return;
        };
        let a_hi = page_down(last);
        if a_lo > a_hi {
            return;
        }
        let clamp = |a: u64| a.clamp(a_lo, a_hi);
        for a in [
            a_lo,
            a_hi,
            clamp(page_down(near)),
            clamp(page_down(near.saturating_sub(size))),
        ] {
            if !matches!(best, Some(b) if dist(b) <= dist(a)) {
                best = Some(a);
            }
        }
    };

    for (lo, hi) in holes(&used) {
        consider_hole(lo, hi);
    }
    best
}

/// The ranges `maps` occupy, page-aligned and sorted, widened where a
/// mapping needs room to grow (`[stack]` down, `[heap]` up).
fn occupied(maps: &[Mapping]) -> Vec<(u64, u64)> {
    let mut used: Vec<(u64, u64)> = maps
        .iter()
        .map(|m| {
            let mut lo = page_down(m.start);
            let mut hi = page_up(m.end).unwrap_or(u64::MAX);
            match &m.path {
                MappingPath::Pseudo(p) if p == "[stack]" => lo = lo.saturating_sub(STACK_RESERVE),
                MappingPath::Pseudo(p) if p == "[heap]" => hi = hi.saturating_add(HEAP_RESERVE),
                _ => {}
            }
            (lo, hi)
        })
        .collect();
    used.sort_unstable();
    used
}

/// The holes between sorted occupied ranges, within the user address
/// space.
fn holes(used: &[(u64, u64)]) -> impl Iterator<Item = (u64, u64)> + '_ {
    let mut cursor = MIN_ADDR;
    used.iter()
        .map(Some)
        .chain([None])
        .filter_map(move |range| {
            let (lo, hi) = range.copied().unwrap_or((MAX_ADDR, MAX_ADDR));
            let hole = (lo > cursor).then_some((cursor, lo.min(MAX_ADDR)));
            cursor = cursor.max(hi);
            hole.filter(|(a, b)| a < b)
        })
}

/// An address for a large data mapping of `size` bytes that keeps clear of
/// the neighbourhoods code needs: the middle of the largest hole in `maps`,
/// aligned to 1 GiB where the hole allows. Trampolines must lie within
/// ±2 GiB of the code they serve, and the kernel places new mappings
/// top-down next to the last ones (libraries, thread stacks), so a region
/// of gigabytes mapped there leaves no room near the code around it; in
/// the middle of the largest hole it is terabytes from any of it. `None`
/// when no hole holds `size` bytes.
pub fn far_gap(maps: &[Mapping], size: u64) -> Option<u64> {
    const ALIGN: u64 = 1 << 30;
    let size = page_up(size)?;
    let (lo, hi) = holes(&occupied(maps)).max_by_key(|(lo, hi)| hi - lo)?;
    if hi - lo < size {
        return None;
    }
    let middle = lo + (hi - lo - size) / 2;
    let aligned = middle / ALIGN * ALIGN;
    Some(if aligned >= lo {
        aligned
    } else {
        page_down(middle)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
55d4c2a00000-55d4c2a02000 r--p 00000000 08:01 1311768                    /usr/bin/cat
55d4c2a02000-55d4c2a07000 r-xp 00002000 08:01 1311768                    /usr/bin/cat
55d4c3c4e000-55d4c3c6f000 rw-p 00000000 00:00 0                          [heap]
7f1e5c600000-7f1e5c626000 r--p 00000000 103:02 2885433                   /usr/lib/x86_64-linux-gnu/libc.so.6
7f1e5c626000-7f1e5c77b000 r-xp 00026000 103:02 2885433                   /usr/lib/x86_64-linux-gnu/libc.so.6
7f1e5c800000-7f1e5c801000 rw-s 00000000 00:01 4096                       /memfd:weft (deleted)
7f1e5c900000-7f1e5c901000 r-xp 00000000 08:01 42                         /home/me/My Programs/a b.so
7f1e5ca00000-7f1e5ca01000 r--p 00000000 08:01 43                         /tmp/old lib.so (deleted)
7f1e5cb00000-7f1e5cb01000 rw-p 00000000 00:00 0                          [anon:glibc: malloc arena]
7f1e5cc00000-7f1e5cc01000 rw-p 00000000 00:00 0 
7ffd1a9e4000-7ffd1aa05000 rw-p 00000000 00:00 0                          [stack]
7ffd1ab5e000-7ffd1ab60000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";

    #[test]
    fn parses_real_sample() {
        let m = parse_maps(SAMPLE).unwrap();
        assert_eq!(m.len(), 13);
        assert_eq!(m[0].start, 0x55d4_c2a0_0000);
        assert_eq!(m[0].end, 0x55d4_c2a0_2000);
        assert_eq!(m[1].offset, 0x2000);
        assert!(m[1].perms.exec && m[1].perms.read && !m[1].perms.write && !m[1].perms.shared);
        assert_eq!(m[0].dev, (8, 1));
        assert_eq!(m[3].dev, (0x103, 2));
        assert_eq!(m[0].inode, 1311768);
        assert_eq!(
            m[0].path.file().unwrap(),
            std::path::Path::new("/usr/bin/cat")
        );
        assert_eq!(m[2].path, MappingPath::Pseudo("[heap]".into()));
        assert!(m[5].perms.shared);
        assert_eq!(
            m[5].path,
            MappingPath::File {
                path: "/memfd:weft".into(),
                deleted: true
            }
        );
        assert_eq!(
            m[6].path,
            MappingPath::File {
                path: "/home/me/My Programs/a b.so".into(),
                deleted: false
            }
        );
        assert_eq!(
            m[7].path,
            MappingPath::File {
                path: "/tmp/old lib.so".into(),
                deleted: true
            }
        );
        assert_eq!(
            m[8].path,
            MappingPath::Pseudo("[anon:glibc: malloc arena]".into())
        );
        assert_eq!(m[9].path, MappingPath::Anonymous);
        assert_eq!(m[10].path, MappingPath::Pseudo("[stack]".into()));
        assert_eq!(m[12].start, 0xffff_ffff_ff60_0000);
        assert_eq!(m[0].perms.to_string(), "r--p");
        assert_eq!(m[5].perms.to_string(), "rw-s");
    }

    #[test]
    fn rejects_bad_lines() {
        for bad in [
            "zz-10 r--p 0 08:01 1",
            "10 r--p 0 08:01 1",
            "20-10 r--p 0 08:01 1",
            "10-20 rq-p 0 08:01 1",
            "10-20 r--p 0 0801 1",
            "10-20 r--p 0 08:01",
            "10-20 r--p 0 08:01 x /a",
            "10-20 r--pp 0 08:01 1 /a",
            "10-20",
            "ffffffffffffffffff-1 r--p 0 08:01 1",
        ] {
            let e = parse_maps(&format!("10-20 r--p 0 08:01 1 /ok\n{bad}\n")).unwrap_err();
            assert_eq!(e.line, 2, "{bad}");
            assert!(e.to_string().contains("line 2"), "{e}");
        }
        assert!(parse_maps("").unwrap().is_empty());
        assert_eq!(parse_maps("\n\n10-20 r--p 0 08:01 1\n\n").unwrap().len(), 1);
    }

    #[test]
    fn reads_own_maps() {
        let pid = std::process::id() as i32;
        let maps = read_maps(pid).unwrap();
        assert!(maps.len() > 5);
        assert!(maps.windows(2).all(|w| w[0].start < w[1].start));
        // The code of this very function is in an executable file mapping.
        let here = reads_own_maps as *const () as usize as u64;
        let m = maps.iter().find(|m| m.contains(here)).unwrap();
        assert!(m.perms.exec);
        assert!(m.path.file().is_some());
        assert!(maps
            .iter()
            .any(|m| m.path == MappingPath::Pseudo("[stack]".into())));
    }

    fn anon(start: u64, end: u64) -> Mapping {
        Mapping {
            start,
            end,
            perms: Perms::default(),
            offset: 0,
            dev: (0, 0),
            inode: 0,
            path: MappingPath::Anonymous,
        }
    }

    #[test]
    fn gap_finding() {
        const G: u64 = 1 << 30;
        let maps = vec![
            anon(0x10_0000, 0x20_0000),
            anon(0x20_0000, 0x30_0000),
            anon(0x40_0000, 0x50_0000),
        ];
        // Hole right before the module wins (closest).
        let a = free_gap_near(&maps, 0x20_0000, 0x1000, 2 * G).unwrap();
        assert_eq!(a, 0xf_f000);
        // Hole between mappings, exactly sized.
        let a = free_gap_near(&maps, 0x30_0000, 0x10_0000, 0x20_0000).unwrap();
        assert_eq!(a, 0x30_0000);
        // Size is rounded up to pages: too big for the inner and the low
        // hole, so it goes right after the last mapping.
        let a = free_gap_near(&maps, 0x30_0000, 0x10_0001, 0x40_0000).unwrap();
        assert_eq!(a, 0x50_0000);
        // Nothing within reach.
        assert_eq!(free_gap_near(&maps, 0x30_0000, 0x20_0000, 0x18_0000), None);
        assert_eq!(free_gap_near(&maps, 0x30_0000, 0, G), None);
        // Never below 64 KiB.
        let low = vec![anon(0x2_0000, 0x7fff_ffff_f000)];
        assert_eq!(free_gap_near(&low, 0x2_0000, 0x1000, G), Some(0x1_f000));
        assert_eq!(free_gap_near(&low, 0x2_0000, 0x10000, G), Some(0x1_0000));
        let low = vec![anon(0x1_0000, 0x7fff_ffff_f000)];
        assert_eq!(free_gap_near(&low, 0x2_0000, 0x1000, G), None);
        // Never above the user address space.
        let high = vec![anon(0x1_0000, 0x7fff_fff0_0000)];
        let a = free_gap_near(&high, 0x7fff_fff0_0000, 0x1000, G).unwrap();
        assert_eq!(a, 0x7fff_fff0_0000);
        assert_eq!(free_gap_near(&high, 0x7fff_fff0_0000, 0x10_0000, G), None);
        // Extreme arguments do not overflow.
        assert_eq!(free_gap_near(&[], u64::MAX, u64::MAX, u64::MAX), None);
        assert!(free_gap_near(&[], u64::MAX, 1, u64::MAX).is_some());
        assert!(free_gap_near(&[], 0, 1, 0).is_none());
    }

    #[test]
    fn gap_respects_stack_and_heap_room() {
        let mut stack = anon(0x7ffd_0000_0000, 0x7ffd_0002_0000);
        stack.path = MappingPath::Pseudo("[stack]".into());
        let start = 0x7ffd_0000_0000;
        let a = free_gap_near(std::slice::from_ref(&stack), start, 0x1000, 1 << 31).unwrap();
        assert!(
            a + 0x1000 <= start - STACK_RESERVE || a >= stack.end,
            "{a:#x}"
        );
        // With the space above the stack taken, it goes below the reserve.
        let above = anon(stack.end, 0x7fff_ffff_f000);
        let a = free_gap_near(&[stack, above], start, 0x1000, 1 << 31).unwrap();
        assert_eq!(a + 0x1000, start - STACK_RESERVE, "{a:#x}");
        let mut heap = anon(0x5000_0000, 0x5010_0000);
        heap.path = MappingPath::Pseudo("[heap]".into());
        let a = free_gap_near(&[heap], 0x5010_0000, 0x1000, 1 << 31).unwrap();
        assert!(
            !(0x5000_0000..0x5010_0000 + HEAP_RESERVE).contains(&a),
            "{a:#x}"
        );
    }
}
