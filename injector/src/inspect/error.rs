//! The error types of the `inspect` module: a leaf the other `inspect`
//! modules depend on, depending on none of them.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong while inspecting a process or an ELF file.
///
/// Messages are meant to be shown to the user as they are: each says what
/// happened and, where there is one, what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InspectError {
    /// `/proc/PID` does not exist: the process never existed or has exited.
    #[error("no such process: PID {0} (check the PID with `ps`; it may have exited)")]
    NoSuchProcess(i32),

    /// The kernel refused to show us the process (`/proc/PID/maps`, `mem`, ...
    /// are guarded by the ptrace access check).
    #[error(
        "permission denied reading {path}: ptrace needs CAP_SYS_PTRACE or the same user \
         (and /proc/sys/kernel/yama/ptrace_scope <= 1 with the target not protected); \
         run weft as the target's user or as root"
    )]
    PermissionDenied {
        /// The process we were looking at.
        pid: i32,
        /// The `/proc` file or the ELF file that could not be read.
        path: PathBuf,
    },

    /// The process has exited but its parent has not reaped it yet.
    #[error(
        "process {0} is a zombie: it has exited and waits for its parent to reap it; \
         there is nothing left to instrument"
    )]
    Zombie(i32),

    /// The process has no user address space (a kernel thread).
    #[error("process {0} has no user address space (is it a kernel thread?); pick a user process")]
    NoAddressSpace(i32),

    /// The file does not start with the ELF magic.
    #[error("{path} is not an ELF file (bad magic); pass an executable or a shared library")]
    NotElf {
        /// The file.
        path: PathBuf,
    },

    /// The ELF file is valid but of a kind weft does not handle.
    #[error(
        "{path}: unsupported ELF file: {what} (weft handles 64-bit little-endian x86-64 only)"
    )]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// What is unsupported.
        what: String,
    },

    /// The ELF file is truncated or corrupt.
    #[error("{path}: malformed ELF file: {what} (is the file truncated or corrupt?)")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What could not be parsed.
        what: String,
    },

    /// A mapped file can no longer be opened, typically because it was deleted
    /// or replaced (package upgrade) after the process mapped it.
    #[error(
        "cannot read the file mapped at {path}: {reason}; if it was deleted or replaced \
         (e.g. by a package upgrade), restart the target or run weft as root so that \
         /proc/PID/map_files can be opened"
    )]
    NotReadable {
        /// The path as shown in `/proc/PID/maps`.
        path: PathBuf,
        /// Why each way of opening it failed.
        reason: String,
    },

    /// A line of `/proc/PID/maps` could not be parsed.
    #[error("{path}: {source}")]
    Maps {
        /// The maps file.
        path: PathBuf,
        /// The offending line.
        #[source]
        source: MapsParseError,
    },

    /// A line of `/proc/PID/stat` or `/proc/PID/status` could not be parsed.
    #[error("{path}: unexpected contents: {what} (is /proc mounted normally?)")]
    BadProcFile {
        /// The `/proc` file.
        path: PathBuf,
        /// What was wrong.
        what: String,
    },

    /// None of a file's mappings matches one of its `PT_LOAD` segments, so the
    /// load bias cannot be computed.
    #[error(
        "{path}: no mapping matches a PT_LOAD segment, cannot compute the load bias \
         (was the file replaced on disk after it was mapped?)"
    )]
    NoLoadBias {
        /// The file.
        path: PathBuf,
    },

    /// A debug file was found for a stripped file but belongs to another
    /// build (build-id or `.gnu_debuglink` CRC mismatch); it is ignored.
    #[error(
        "ignored {debug_file} as debug file of {binary}: {reason}; it is from another build \
         (install the debug package of the exact version installed, or remove the stale file)"
    )]
    DebugFileMismatch {
        /// The stripped file.
        binary: PathBuf,
        /// The candidate debug file.
        debug_file: PathBuf,
        /// What did not match.
        reason: String,
    },

    /// A debug file was found for a stripped file but could not be read or
    /// parsed; it is ignored.
    #[error(
        "ignored {debug_file} as debug file of {binary}: {reason} \
         (reinstall the debug package, or remove the file)"
    )]
    DebugFileUnreadable {
        /// The stripped file.
        binary: PathBuf,
        /// The candidate debug file.
        debug_file: PathBuf,
        /// Why it could not be used.
        reason: String,
    },

    /// The `.gnu_debugdata` section (MiniDebugInfo) of a file is corrupt;
    /// it is ignored.
    #[error(
        "{binary}: ignored its MiniDebugInfo (.gnu_debugdata): {what} \
         (the file may be damaged: reinstall its package, or install its debug package)"
    )]
    MiniDebugInfo {
        /// The file.
        binary: PathBuf,
        /// What was wrong.
        what: String,
    },

    /// A function pattern is invalid.
    #[error(transparent)]
    Pattern(#[from] PatternError),

    /// Any other I/O error.
    #[error("{path}: {source}")]
    Io {
        /// The file being read.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

impl InspectError {
    /// Classifies an I/O error on a file of `/proc/PID`: a missing file means
    /// the process is gone, `EACCES`/`EPERM` a failed ptrace access check.
    pub(crate) fn from_proc_io(pid: i32, path: PathBuf, source: io::Error) -> Self {
        match source.kind() {
            io::ErrorKind::NotFound => InspectError::NoSuchProcess(pid),
            io::ErrorKind::PermissionDenied => InspectError::PermissionDenied { pid, path },
            // ESRCH: the process died between open and read.
            _ if source.raw_os_error() == Some(libc::ESRCH) => InspectError::NoSuchProcess(pid),
            _ => InspectError::Io { path, source },
        }
    }

    /// Wraps an `object` parse error for `path`.
    pub(crate) fn malformed(path: impl Into<PathBuf>, what: impl std::fmt::Display) -> Self {
        InspectError::Malformed {
            path: path.into(),
            what: what.to_string(),
        }
    }
}

/// A line of `/proc/PID/maps` that could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "line {line}: {what}: {content:?} (expected `START-END PERMS OFFSET MAJ:MIN INODE [PATH]`)"
)]
pub struct MapsParseError {
    /// 1-based line number.
    pub line: usize,
    /// What was wrong.
    pub what: &'static str,
    /// The line (truncated to 200 bytes).
    pub content: String,
}

/// An invalid pattern.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// Nothing to match.
    #[error(
        "empty function pattern; write NAME or MODULE:NAME, e.g. `work_*` or `libc.so.6:malloc`"
    )]
    Empty,
    /// `MODULE:` with nothing after it, or `:NAME`.
    #[error(
        "pattern `{0}` has an empty module or function part; write MODULE:NAME, e.g. `libc:malloc`"
    )]
    EmptyPart(String),
    /// A `[` without its `]`.
    #[error(
        "pattern `{0}`: unclosed `[` character class; close it with `]` or escape it as `\\[`"
    )]
    UnclosedClass(String),
    /// A `\` at the end.
    #[error("pattern `{0}` ends with a lone `\\`; remove it or escape it as `\\\\`")]
    TrailingEscape(String),
}
