//! The `bpf(2)` and `perf_event_open(2)` calls weft makes, each a safe
//! function over owned file descriptors: closing one detaches what it
//! holds, so a weft that dies (even by `kill -9`) leaves no program behind.
//!
//! `union bpf_attr` is written as bytes at the offsets of
//! `include/uapi/linux/bpf.h` (checked against the header when this was
//! written); fields a command does not use stay zero, as the kernel
//! demands.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const BPF_MAP_CREATE: i64 = 0;
const BPF_MAP_LOOKUP_ELEM: i64 = 1;
const BPF_MAP_UPDATE_ELEM: i64 = 2;
const BPF_MAP_GET_NEXT_KEY: i64 = 4;
const BPF_PROG_LOAD: i64 = 5;
const BPF_PROG_GET_NEXT_ID: i64 = 11;
const BPF_PROG_GET_FD_BY_ID: i64 = 13;
const BPF_OBJ_GET_INFO_BY_FD: i64 = 15;
const BPF_RAW_TRACEPOINT_OPEN: i64 = 17;

/// `enum bpf_map_type` values weft uses.
pub(crate) const MAP_HASH: u32 = 1;
/// An array map.
pub(crate) const MAP_ARRAY: u32 = 2;

/// `enum bpf_prog_type` values weft uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ProgType {
    Kprobe = 2,
    RawTracepoint = 17,
    Tracing = 26,
}

/// `enum bpf_attach_type` for tracing programs: `tp_btf`.
pub(crate) const ATTACH_TRACE_RAW_TP: u32 = 23;
/// fentry.
pub(crate) const ATTACH_FENTRY: u32 = 24;
/// fexit.
pub(crate) const ATTACH_FEXIT: u32 = 25;

/// The bytes of `union bpf_attr` (144 bytes in the 6.x headers).
struct Attr([u8; 144]);

impl Attr {
    fn new() -> Attr {
        Attr([0; 144])
    }
    fn u32(&mut self, at: usize, v: u32) -> &mut Attr {
        self.0[at..at + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(&mut self, at: usize, v: u64) -> &mut Attr {
        self.0[at..at + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn name(&mut self, at: usize, name: &str) -> &mut Attr {
        // BPF_OBJ_NAME_LEN is 16 with the NUL; the kernel accepts
        // [A-Za-z0-9_.] only.
        let clean: Vec<u8> = name
            .bytes()
            .filter(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'.')
            .take(15)
            .collect();
        self.0[at..at + clean.len()].copy_from_slice(&clean);
        self
    }
    fn read_u32(&self, at: usize) -> u32 {
        u32::from_ne_bytes(self.0[at..at + 4].try_into().expect("4 bytes"))
    }
}

fn bpf(cmd: i64, attr: &mut Attr) -> io::Result<i64> {
    // SAFETY: `attr` is a live, writable 144-byte buffer laid out as
    // `union bpf_attr`; every pointer stored in it points at memory the
    // caller keeps alive for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.0.as_mut_ptr(),
            attr.0.len() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn owned(fd: i64) -> OwnedFd {
    // SAFETY: the kernel just returned this descriptor to us; nothing
    // else owns it.
    unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
}

/// A map, by its descriptor.
#[derive(Debug)]
pub(crate) struct Map {
    fd: OwnedFd,
    key_size: usize,
    value_size: usize,
}

impl Map {
    /// `BPF_MAP_CREATE`.
    pub(crate) fn create(
        kind: u32,
        name: &str,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
    ) -> io::Result<Map> {
        Self::create_with_flags(kind, name, key_size, value_size, max_entries, 0)
    }

    /// `BPF_MAP_CREATE` of an array user space may `mmap`
    /// (`BPF_F_MMAPABLE`).
    pub(crate) fn create_mmapable(
        kind: u32,
        name: &str,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
    ) -> io::Result<Map> {
        const BPF_F_MMAPABLE: u32 = 1 << 10;
        Self::create_with_flags(
            kind,
            name,
            key_size,
            value_size,
            max_entries,
            BPF_F_MMAPABLE,
        )
    }

    fn create_with_flags(
        kind: u32,
        name: &str,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        flags: u32,
    ) -> io::Result<Map> {
        let mut attr = Attr::new();
        attr.u32(0, kind)
            .u32(4, key_size)
            .u32(8, value_size)
            .u32(12, max_entries)
            .u32(16, flags)
            .name(28, name);
        let fd = bpf(BPF_MAP_CREATE, &mut attr)?;
        Ok(Map {
            fd: owned(fd),
            key_size: key_size as usize,
            value_size: value_size as usize,
        })
    }

    /// A map by a descriptor obtained elsewhere (another process's, taken
    /// with `pidfd_getfd`), with the sizes its maker used.
    pub(crate) fn from_fd(fd: OwnedFd, key_size: usize, value_size: usize) -> Map {
        Map {
            fd,
            key_size,
            value_size,
        }
    }

    pub(crate) fn raw(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// `BPF_MAP_UPDATE_ELEM` with `BPF_ANY`.
    pub(crate) fn update(&self, key: &[u8], value: &[u8]) -> io::Result<()> {
        assert_eq!((key.len(), value.len()), (self.key_size, self.value_size));
        let mut attr = Attr::new();
        attr.u32(0, self.raw() as u32)
            .u64(8, key.as_ptr() as u64)
            .u64(16, value.as_ptr() as u64);
        bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(|_| ())
    }

    /// `BPF_MAP_LOOKUP_ELEM`: the value, or `None` if the key is absent.
    pub(crate) fn lookup(&self, key: &[u8]) -> io::Result<Option<Vec<u8>>> {
        assert_eq!(key.len(), self.key_size);
        let mut value = vec![0u8; self.value_size];
        let mut attr = Attr::new();
        attr.u32(0, self.raw() as u32)
            .u64(8, key.as_ptr() as u64)
            .u64(16, value.as_mut_ptr() as u64);
        match bpf(BPF_MAP_LOOKUP_ELEM, &mut attr) {
            Ok(_) => Ok(Some(value)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every (key, value) of a hash map. Entries added or removed while it
    /// reads may or may not be seen, as with any live read.
    pub(crate) fn entries(&self) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        let mut key: Option<Vec<u8>> = None;
        loop {
            let mut next = vec![0u8; self.key_size];
            let mut attr = Attr::new();
            attr.u32(0, self.raw() as u32)
                .u64(8, key.as_ref().map_or(0, |k| k.as_ptr() as u64))
                .u64(16, next.as_mut_ptr() as u64);
            match bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
                Err(e) => return Err(e),
            }
            if let Some(value) = self.lookup(&next)? {
                out.push((next.clone(), value));
            }
            key = Some(next);
        }
    }
}

/// A loaded program.
#[derive(Debug)]
pub(crate) struct Program {
    fd: OwnedFd,
}

/// Why the kernel refused a program: its errno and the verifier's log.
#[derive(Debug)]
pub(crate) struct LoadError {
    pub(crate) error: io::Error,
    pub(crate) log: String,
}

/// The tracing target of a `BPF_PROG_TYPE_TRACING` program.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TracingTarget {
    pub(crate) attach_type: u32,
    pub(crate) btf_id: u32,
}

impl Program {
    /// `BPF_PROG_LOAD`; on a refusal, loads again with the verifier's log
    /// on so that the error can say why.
    pub(crate) fn load(
        kind: ProgType,
        name: &str,
        insns: &[weft_codegen::bpf::asm::Insn],
        tracing: Option<TracingTarget>,
    ) -> Result<Program, LoadError> {
        let bytes: Vec<u8> = insns.iter().flat_map(|i| i.to_bytes()).collect();
        // GPL-compatible: the tracing helpers weft's programs call
        // (bpf_probe_read_kernel, bpf_get_current_task) are GPL-only.
        let license = CString::new("Dual MIT/GPL").expect("no NUL");
        let attempt = |log: Option<&mut Vec<u8>>| {
            let mut attr = Attr::new();
            attr.u32(0, kind as u32)
                .u32(4, insns.len() as u32)
                .u64(8, bytes.as_ptr() as u64)
                .u64(16, license.as_ptr() as u64)
                .name(48, name);
            if let Some(log) = log {
                attr.u32(24, 1)
                    .u32(28, log.len() as u32)
                    .u64(32, log.as_mut_ptr() as u64);
            }
            if let Some(t) = tracing {
                attr.u32(68, t.attach_type).u32(108, t.btf_id);
            }
            bpf(BPF_PROG_LOAD, &mut attr)
        };
        match attempt(None) {
            Ok(fd) => Ok(Program { fd: owned(fd) }),
            Err(error) => {
                let mut log = vec![0u8; 256 * 1024];
                let _ = attempt(Some(&mut log));
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                let text = String::from_utf8_lossy(&log[..end]);
                // The last lines say what the verifier tripped on.
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(6)..].join(" | ");
                Err(LoadError { error, log: tail })
            }
        }
    }

    pub(crate) fn raw(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

/// Attaches a raw-tracepoint program to tracepoint `name`, or a tracing
/// (fentry/fexit) program to its target when `name` is `None`; the link
/// lives as long as the returned descriptor.
pub(crate) fn raw_tracepoint_open(program: &Program, name: Option<&str>) -> io::Result<OwnedFd> {
    let name = name.map(|n| CString::new(n).expect("tracepoint names have no NUL"));
    let mut attr = Attr::new();
    attr.u64(0, name.as_ref().map_or(0, |n| n.as_ptr() as u64))
        .u32(8, program.raw() as u32);
    bpf(BPF_RAW_TRACEPOINT_OPEN, &mut attr).map(owned)
}

/// `PERF_FLAG_FD_CLOEXEC` (`include/uapi/linux/perf_event.h`).
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;

/// The dynamic PMU type of kprobes (`/sys/bus/event_source/devices/kprobe/type`),
/// and the config bit that makes a return probe.
pub(crate) fn kprobe_pmu() -> io::Result<(u32, u32)> {
    let dir = std::path::Path::new("/sys/bus/event_source/devices/kprobe");
    let kind = std::fs::read_to_string(dir.join("type"))?
        .trim()
        .parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "kprobe PMU type"))?;
    // "config:0"
    let bit = std::fs::read_to_string(dir.join("format/retprobe"))
        .ok()
        .and_then(|s| s.trim().strip_prefix("config:")?.parse().ok())
        .unwrap_or(0);
    Ok((kind, bit))
}

/// A kprobe (or kretprobe) at `function + offset` running `program`, live
/// while the returned descriptor is open.
pub(crate) fn attach_kprobe(
    program: &Program,
    function: &str,
    offset: u64,
    retprobe: bool,
) -> io::Result<OwnedFd> {
    let (pmu, ret_bit) = kprobe_pmu()?;
    let symbol = CString::new(function).expect("symbol names have no NUL");
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&pmu.to_ne_bytes());
    attr[4..8].copy_from_slice(&128u32.to_ne_bytes());
    let config: u64 = if retprobe { 1 << ret_bit } else { 0 };
    attr[8..16].copy_from_slice(&config.to_ne_bytes());
    // config1: the symbol; config2: the offset into it.
    attr[56..64].copy_from_slice(&(symbol.as_ptr() as u64).to_ne_bytes());
    attr[64..72].copy_from_slice(&offset.to_ne_bytes());
    // SAFETY: `attr` is a zeroed 128-byte `struct perf_event_attr` whose
    // size field says 128; `symbol` outlives the call. pid -1 with cpu 0
    // is how a kprobe event is opened for a BPF program: the program runs
    // for every CPU.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr.as_ptr(),
            -1i32,
            0i32,
            -1i32,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = owned(fd);
    const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;
    const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
    // SAFETY: plain ioctls on a perf event descriptor we own, with an int
    // argument.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), PERF_EVENT_IOC_SET_BPF, program.raw()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), PERF_EVENT_IOC_ENABLE, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// A loaded program as `BPF_OBJ_GET_INFO_BY_FD` describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadedProgram {
    /// The kernel's id of the program.
    pub id: u32,
    /// Its name (up to 15 characters).
    pub name: String,
}

/// Every BPF program loaded in the machine (needs the same privileges as
/// loading one).
pub fn loaded_programs() -> io::Result<Vec<LoadedProgram>> {
    let mut out = Vec::new();
    let mut id = 0u32;
    loop {
        let mut attr = Attr::new();
        attr.u32(0, id);
        match bpf(BPF_PROG_GET_NEXT_ID, &mut attr) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
            Err(e) => return Err(e),
        }
        id = attr.read_u32(4);
        let mut attr = Attr::new();
        attr.u32(0, id);
        let fd = match bpf(BPF_PROG_GET_FD_BY_ID, &mut attr) {
            Ok(fd) => owned(fd),
            // Unloaded in between.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(e),
        };
        let mut info = [0u8; 232];
        let mut attr = Attr::new();
        attr.u32(0, fd.as_raw_fd() as u32)
            .u32(4, info.len() as u32)
            .u64(8, info.as_mut_ptr() as u64);
        bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
        let name = &info[64..80];
        let end = name.iter().position(|&b| b == 0).unwrap_or(16);
        out.push(LoadedProgram {
            id,
            name: String::from_utf8_lossy(&name[..end]).into_owned(),
        });
    }
}
