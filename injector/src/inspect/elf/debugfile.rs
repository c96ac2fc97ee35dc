//! Finding the separate debug file of a stripped ELF file, the way gdb and
//! the distributions lay them out (see `docs/debug-files.md`):
//!
//! 1. the file's own `.symtab` (nothing to find);
//! 2. the build-id: `DEBUG_DIR/.build-id/xx/yyyy.debug`;
//! 3. `.gnu_debuglink` (a name and a CRC32): next to the file, in its
//!    `.debug/` directory, then `DEBUG_DIR/<file's directory>/<name>`;
//! 4. `.gnu_debugdata` (MiniDebugInfo: an xz-compressed ELF file holding a
//!    `.symtab`);
//! 5. nothing: the caller falls back to `.eh_frame`.
//!
//! A candidate must belong to the file: same build-id when both have one,
//! the CRC32 `.gnu_debuglink` names for a debug link. One that does not, or
//! that cannot be read, is skipped and kept as a note
//! ([`DebugInfo::ignored`]); a missing one is not worth a note.

use std::io::Write;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use object::read::elf::ElfFile64;
use object::{Endianness, Object as _, ObjectSection as _};

use super::ElfImage;
use crate::inspect::error::InspectError;

/// The environment variable listing debug directories, colon-separated. It
/// replaces the default ([`DEFAULT_DEBUG_DIR`]).
pub const DEBUG_DIRS_ENV: &str = "WEFT_DEBUG_DIRS";
/// Where Debian, Fedora and others install debug files.
pub const DEFAULT_DEBUG_DIR: &str = "/usr/lib/debug";
/// Largest MiniDebugInfo accepted once decompressed: real ones are a few
/// MiB; more means a corrupt or hostile file (an xz bomb).
const MAX_MINI_DEBUG_INFO: usize = 256 << 20;

/// Directories given by the program (e.g. `weft --debug-dir`), searched
/// before the environment's or the default.
static EXTRA_DIRS: RwLock<Vec<PathBuf>> = RwLock::new(Vec::new());

/// Sets the debug directories searched before those of
/// [`WEFT_DEBUG_DIRS`](DEBUG_DIRS_ENV) (or [`DEFAULT_DEBUG_DIR`] when it is
/// unset), for every ELF file whose symbols are read from now on. Each is a
/// path in weft's own mount namespace, laid out like `/usr/lib/debug`.
pub fn set_debug_dirs(dirs: Vec<PathBuf>) {
    // A poisoned lock only means another thread panicked while setting
    // the list, which holds no invariant beyond being a list.
    let mut extra = EXTRA_DIRS.write().unwrap_or_else(|e| e.into_inner());
    *extra = dirs;
}

/// The debug directories in search order: those of [`set_debug_dirs`], then
/// `WEFT_DEBUG_DIRS` (colon-separated, empty entries ignored) or, if it is
/// unset, `/usr/lib/debug`.
pub fn debug_dirs() -> Vec<PathBuf> {
    let mut dirs = EXTRA_DIRS.read().unwrap_or_else(|e| e.into_inner()).clone();
    dirs.extend(dirs_from_env(
        std::env::var_os(DEBUG_DIRS_ENV).as_deref().map(Path::new),
    ));
    dirs
}

/// The directories an environment value names (`None`: unset).
fn dirs_from_env(value: Option<&Path>) -> Vec<PathBuf> {
    match value {
        None => vec![PathBuf::from(DEFAULT_DEBUG_DIR)],
        Some(v) => std::env::split_paths(v)
            .filter(|p| !p.as_os_str().is_empty())
            .collect(),
    }
}

/// Where an ELF file was read from, for the searches relative to it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Origin {
    /// The file's path as its process sees it (as in `/proc/PID/maps`), for
    /// `DEBUG_DIR/<its directory>/<debuglink>`.
    pub path: Option<PathBuf>,
    /// Its directory as weft can open it (`/proc/PID/root/usr/bin` for a
    /// process's module), for the debug link next to the file.
    pub dir: Option<PathBuf>,
}

/// How a separate debug file was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinkKind {
    /// By the file's `NT_GNU_BUILD_ID` note.
    BuildId,
    /// By its `.gnu_debuglink` section.
    DebugLink,
}

/// Where the symbols and source lines of a file come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DebugSource {
    /// The file has its own `.symtab`.
    OwnSymtab,
    /// A separate debug file.
    File {
        /// Its path.
        path: PathBuf,
        /// How it was found.
        kind: LinkKind,
    },
    /// The file's `.gnu_debugdata` section (MiniDebugInfo).
    MiniDebugInfo,
    /// Nothing: the file is stripped and no debug file was found.
    None,
}

/// What the search for a file's debug information found.
#[derive(Debug)]
pub struct DebugInfo {
    source: DebugSource,
    image: Option<Box<ElfImage>>,
    ignored: Vec<Arc<InspectError>>,
}

impl DebugInfo {
    pub(crate) fn own_symtab() -> DebugInfo {
        DebugInfo {
            source: DebugSource::OwnSymtab,
            image: None,
            ignored: Vec::new(),
        }
    }

    /// Where the symbols come from.
    pub fn source(&self) -> &DebugSource {
        &self.source
    }

    /// The separate debug file or the decompressed MiniDebugInfo, parsed.
    pub fn image(&self) -> Option<&ElfImage> {
        self.image.as_deref()
    }

    /// Candidates that were found but not used: another file's debug file
    /// (build-id or CRC mismatch), unreadable, corrupt.
    pub fn ignored(&self) -> &[Arc<InspectError>] {
        &self.ignored
    }
}

/// One place a debug file may be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub path: PathBuf,
    pub kind: LinkKind,
}

/// Lowercase hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The places to look, in order: the build-id path in every debug
/// directory, then the debug link next to the file, in its `.debug/`, and
/// under every debug directory. A debug link with a `/` (not a file name)
/// is not followed.
pub(crate) fn candidates(
    origin: &Origin,
    build_id: Option<&[u8]>,
    debuglink: Option<&[u8]>,
    dirs: &[PathBuf],
) -> Vec<Candidate> {
    let mut out = Vec::new();
    if let Some(id) = build_id.filter(|id| id.len() >= 2) {
        let rel = Path::new(".build-id")
            .join(hex(&id[..1]))
            .join(format!("{}.debug", hex(&id[1..])));
        out.extend(dirs.iter().map(|d| Candidate {
            path: d.join(&rel),
            kind: LinkKind::BuildId,
        }));
    }
    let name = debuglink
        .filter(|n| !n.is_empty() && !n.contains(&b'/') && *n != b"." && *n != b"..")
        .map(|n| {
            use std::os::unix::ffi::OsStrExt as _;
            PathBuf::from(std::ffi::OsStr::from_bytes(n))
        });
    if let Some(name) = name {
        let mut push = |path: PathBuf| {
            out.push(Candidate {
                path,
                kind: LinkKind::DebugLink,
            })
        };
        if let Some(dir) = &origin.dir {
            push(dir.join(&name));
            push(dir.join(".debug").join(&name));
        }
        let file_dir = origin
            .path
            .as_deref()
            .and_then(Path::parent)
            .filter(|d| d.is_absolute());
        if let Some(file_dir) = file_dir {
            let rel = file_dir.strip_prefix("/").unwrap_or(file_dir);
            for d in dirs {
                push(d.join(rel).join(&name));
            }
        }
    }
    out
}

/// The `NT_GNU_BUILD_ID` of an ELF file, if it has one.
pub(crate) fn build_id(data: &[u8]) -> Option<Vec<u8>> {
    let file = ElfFile64::<Endianness>::parse(data).ok()?;
    file.build_id().ok().flatten().map(<[u8]>::to_vec)
}

/// What `.gnu_debuglink` says: the debug file's name and CRC32.
pub(crate) fn debuglink(data: &[u8]) -> Option<(Vec<u8>, u32)> {
    let file = ElfFile64::<Endianness>::parse(data).ok()?;
    file.gnu_debuglink()
        .ok()
        .flatten()
        .map(|(name, crc)| (name.to_vec(), crc))
}

/// What the search needs to know about the stripped file.
pub(crate) struct Stripped<'a> {
    /// Its path as its process sees it, in messages.
    pub path: &'a Path,
    /// The path it was read from, if it was (to know it again under
    /// another name).
    pub opened: Option<&'a Path>,
    /// Its bytes.
    pub data: &'a [u8],
    /// Where it was read from.
    pub origin: &'a Origin,
}

/// Searches the debug information of a file without `.symtab` functions,
/// in the order of the module documentation.
pub(crate) fn find(file: &Stripped<'_>, dirs: &[PathBuf]) -> DebugInfo {
    let own_id = build_id(file.data);
    let link = debuglink(file.data);
    let mut ignored = Vec::new();
    // The file itself, reached under another name (a debug link naming
    // the file's own name next to it), is no debug file.
    let own_file = file
        .opened
        .and_then(|p| std::fs::metadata(p).ok())
        .map(|m| (m.dev(), m.ino()));
    let mut seen: Vec<(u64, u64)> = own_file.into_iter().collect();
    for c in candidates(
        file.origin,
        own_id.as_deref(),
        link.as_ref().map(|(n, _)| &n[..]),
        dirs,
    ) {
        let Ok(md) = std::fs::metadata(&c.path) else {
            continue;
        };
        if !md.is_file() || seen.contains(&(md.dev(), md.ino())) {
            continue;
        }
        seen.push((md.dev(), md.ino()));
        match check(file, &c, own_id.as_deref(), link.as_ref().map(|l| l.1)) {
            Ok(image) => {
                return DebugInfo {
                    source: DebugSource::File {
                        path: c.path,
                        kind: c.kind,
                    },
                    image: Some(Box::new(image)),
                    ignored,
                }
            }
            Err(e) => ignored.push(Arc::new(e)),
        }
    }
    match mini_debug_info(file) {
        Ok(Some(image)) => DebugInfo {
            source: DebugSource::MiniDebugInfo,
            image: Some(Box::new(image)),
            ignored,
        },
        Ok(None) => DebugInfo {
            source: DebugSource::None,
            image: None,
            ignored,
        },
        Err(e) => {
            ignored.push(Arc::new(e));
            DebugInfo {
                source: DebugSource::None,
                image: None,
                ignored,
            }
        }
    }
}

/// Reads candidate `c` and checks that it is `file`'s debug file: an x86-64
/// ELF file; with the build-id of `file` when both have one (a build-id
/// candidate must have one); for a debug link, with the CRC32 it names.
fn check(
    file: &Stripped<'_>,
    c: &Candidate,
    own_id: Option<&[u8]>,
    crc: Option<u32>,
) -> Result<ElfImage, InspectError> {
    let unreadable = |reason: String| InspectError::DebugFileUnreadable {
        binary: file.path.to_path_buf(),
        debug_file: c.path.clone(),
        reason,
    };
    let mismatch = |reason: String| InspectError::DebugFileMismatch {
        binary: file.path.to_path_buf(),
        debug_file: c.path.clone(),
        reason,
    };
    let data = std::fs::read(&c.path).map_err(|e| unreadable(e.to_string()))?;
    let image = ElfImage::from_bytes(&c.path, data).map_err(|e| unreadable(why(e)))?;
    let theirs = build_id(image.data());
    match (own_id, theirs.as_deref()) {
        (Some(own), Some(theirs)) if own != theirs => {
            return Err(mismatch(format!(
                "its build-id is {} where the file's is {}",
                hex(theirs),
                hex(own)
            )))
        }
        (Some(own), None) if c.kind == LinkKind::BuildId => {
            return Err(mismatch(format!(
                "it has no build-id where the file's is {}",
                hex(own)
            )))
        }
        _ => {}
    }
    if c.kind == LinkKind::DebugLink {
        let want = crc.unwrap_or_default();
        let got = crc32fast::hash(image.data());
        if got != want {
            return Err(mismatch(format!(
                "its CRC32 is {got:#010x} where .gnu_debuglink names {want:#010x}"
            )));
        }
    }
    Ok(image)
}

/// What is wrong with a candidate, without the advice meant for a program
/// file.
fn why(e: InspectError) -> String {
    match e {
        InspectError::NotElf { .. } => "not an ELF file".into(),
        InspectError::Unsupported { what, .. } => format!("unsupported ELF file: {what}"),
        InspectError::Malformed { what, .. } => format!("malformed ELF file: {what}"),
        other => other.to_string(),
    }
}

/// A writer that refuses to grow past a limit.
struct Capped(Vec<u8>);

impl Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len().saturating_add(buf.len()) > MAX_MINI_DEBUG_INFO {
            return Err(std::io::Error::other(format!(
                "more than {} MiB once decompressed",
                MAX_MINI_DEBUG_INFO >> 20
            )));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The ELF file in `.gnu_debugdata`, decompressed and parsed; `None` if
/// there is no such section.
fn mini_debug_info(file: &Stripped<'_>) -> Result<Option<ElfImage>, InspectError> {
    let Ok(elf) = ElfFile64::<Endianness>::parse(file.data) else {
        return Ok(None);
    };
    let Some(section) = elf.section_by_name(".gnu_debugdata") else {
        return Ok(None);
    };
    let corrupt = |what: String| InspectError::MiniDebugInfo {
        binary: file.path.to_path_buf(),
        what,
    };
    let xz = section.data().map_err(|e| corrupt(e.to_string()))?;
    let mut out = Capped(Vec::new());
    lzma_rs::xz_decompress(&mut std::io::BufReader::new(xz), &mut out)
        .map_err(|e| corrupt(format!("not a valid xz stream: {e}")))?;
    let inner = file.path.join(".gnu_debugdata");
    ElfImage::from_bytes(inner, out.0)
        .map(Some)
        .map_err(|e| corrupt(why(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(c: &[Candidate]) -> Vec<(String, LinkKind)> {
        c.iter()
            .map(|c| (c.path.to_string_lossy().into_owned(), c.kind))
            .collect()
    }

    #[test]
    fn search_order_is_build_id_then_debuglink_places() {
        let origin = Origin {
            path: Some("/usr/sbin/memcached".into()),
            dir: Some("/proc/42/root/usr/sbin".into()),
        };
        let dirs = vec![PathBuf::from("/tmp/dbg"), PathBuf::from("/usr/lib/debug")];
        let got = candidates(
            &origin,
            Some(&[0xab, 0xcd, 0x01]),
            Some(b"memcached.debug"),
            &dirs,
        );
        use LinkKind::*;
        let want = [
            ("/tmp/dbg/.build-id/ab/cd01.debug", BuildId),
            ("/usr/lib/debug/.build-id/ab/cd01.debug", BuildId),
            ("/proc/42/root/usr/sbin/memcached.debug", DebugLink),
            ("/proc/42/root/usr/sbin/.debug/memcached.debug", DebugLink),
            ("/tmp/dbg/usr/sbin/memcached.debug", DebugLink),
            ("/usr/lib/debug/usr/sbin/memcached.debug", DebugLink),
        ];
        let want: Vec<(String, LinkKind)> = want.iter().map(|&(p, k)| (p.to_string(), k)).collect();
        assert_eq!(paths(&got), want);
    }

    #[test]
    fn no_build_id_or_link_means_no_candidate() {
        let origin = Origin {
            path: Some("/bin/x".into()),
            dir: Some("/bin".into()),
        };
        let dirs = vec![PathBuf::from("/usr/lib/debug")];
        assert!(candidates(&origin, None, None, &dirs).is_empty());
        // A one-byte build-id has no `xx/rest` form.
        assert!(candidates(&origin, Some(&[1]), None, &dirs).is_empty());
    }

    #[test]
    fn debuglink_that_is_a_path_is_not_followed() {
        let origin = Origin {
            path: Some("/bin/x".into()),
            dir: Some("/bin".into()),
        };
        let dirs = vec![PathBuf::from("/usr/lib/debug")];
        for bad in [&b"../../etc/shadow"[..], b"/etc/shadow", b"..", b"."] {
            assert!(
                candidates(&origin, None, Some(bad), &dirs).is_empty(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn without_origin_only_build_id_paths() {
        let dirs = vec![PathBuf::from("/d")];
        let got = candidates(&Origin::default(), Some(&[1, 2]), Some(b"x.debug"), &dirs);
        assert_eq!(
            paths(&got),
            vec![("/d/.build-id/01/02.debug".to_string(), LinkKind::BuildId)]
        );
    }

    #[test]
    fn env_replaces_default_and_skips_empty_entries() {
        assert_eq!(dirs_from_env(None), vec![PathBuf::from(DEFAULT_DEBUG_DIR)]);
        assert_eq!(
            dirs_from_env(Some(Path::new("/a::/b:"))),
            vec![PathBuf::from("/a"), PathBuf::from("/b")]
        );
        assert!(dirs_from_env(Some(Path::new(""))).is_empty());
    }

    #[test]
    fn gnu_debuglink_crc_is_ieee_crc32() {
        // The value gdb's and binutils' `gnu_debuglink_crc32` give.
        assert_eq!(crc32fast::hash(b"123456789"), 0xcbf4_3926);
    }

    #[test]
    fn corrupt_mini_debug_info_is_an_error_not_a_panic() {
        let err = Capped(Vec::new());
        let mut out = err;
        let r = lzma_rs::xz_decompress(&mut &b"\xfd7zXZ\0garbage"[..], &mut out);
        assert!(r.is_err());
    }
}
