//! Modules: the ELF files mapped into a process, with their load bias.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::elf::{open_mapped_file, ElfHeaderInfo, ElfImage};
use super::error::InspectError;
use super::maps::{Mapping, MappingPath};

/// What the main executable answers to in a pattern, whatever its name.
pub const EXE_NAME: &str = "exe";
/// Refuse dynamic sections larger than this (corrupt `p_filesz`).
const MAX_DYNAMIC_LEN: u64 = 1 << 16;
/// Longest soname read.
const MAX_SONAME_LEN: usize = 256;

/// Bytes read up front to check the magic and parse the program headers;
/// they almost always fit in the first page.
const PREFIX_LEN: usize = 4096;
/// Refuse program header tables larger than this (corrupt `e_phnum`).
const MAX_HEADER_LEN: usize = 1 << 20;

/// An ELF file mapped into a process (the executable, a shared library, the
/// dynamic loader), with all its file-backed mappings.
///
/// Its symbols are parsed only when [`Module::image`] is first called.
pub struct Module {
    pid: i32,
    path: PathBuf,
    name: String,
    soname: Option<String>,
    started_as: Vec<String>,
    dev: (u32, u32),
    inode: u64,
    deleted: bool,
    is_main: bool,
    mappings: Vec<Mapping>,
    bias: u64,
    header: ElfHeaderInfo,
    image: OnceLock<ElfImage>,
}

impl fmt::Debug for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Module")
            .field("pid", &self.pid)
            .field("path", &self.path)
            .field("bias", &format_args!("{:#x}", self.bias))
            .field("mappings", &self.mappings.len())
            .field("image_loaded", &self.image.get().is_some())
            .finish_non_exhaustive()
    }
}

impl Module {
    /// The path as shown in `/proc/PID/maps` (in the target's mount
    /// namespace), without ` (deleted)`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file name, e.g. `libc.so.6`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The `DT_SONAME` of a shared library (`libevent-2.1.so.7` for the
    /// file `libevent-2.1.so.7.0.1`), if the module has one and its dynamic
    /// section could be read.
    pub fn soname(&self) -> Option<&str> {
        self.soname.as_deref()
    }

    /// For the main executable, how the process was started: `argv[0]` as in
    /// `/proc/PID/cmdline` (the path the user typed or gave `weft run`,
    /// e.g. `/usr/bin/redis-server` when that is a symlink to
    /// `redis-check-rdb`), and its file name. Empty for other modules.
    pub fn started_as(&self) -> &[String] {
        &self.started_as
    }

    /// The names a pattern's `MODULE:` part may use for this module: the
    /// file name, the soname, the names it was started as and, for the
    /// main executable, `exe`.
    pub fn names(&self) -> impl Iterator<Item = &str> + '_ {
        std::iter::once(self.name.as_str())
            .chain(self.soname.as_deref())
            .chain(self.started_as.iter().map(String::as_str))
            .chain(self.is_main.then_some(EXE_NAME))
    }

    /// Device of the file, `(major, minor)`.
    pub fn dev(&self) -> (u32, u32) {
        self.dev
    }

    /// Inode of the file.
    pub fn inode(&self) -> u64 {
        self.inode
    }

    /// Whether the kernel reports the file as deleted.
    pub fn is_deleted(&self) -> bool {
        self.deleted
    }

    /// Whether this is the process's main executable (`/proc/PID/exe`).
    pub fn is_main_executable(&self) -> bool {
        self.is_main
    }

    /// The file-backed mappings of this module, ascending by address.
    pub fn mappings(&self) -> &[Mapping] {
        &self.mappings
    }

    /// Load bias: add it to a file vaddr to get the runtime address
    /// (0 for a position-dependent executable).
    pub fn bias(&self) -> u64 {
        self.bias
    }

    /// Lowest mapped address (where the ELF header is mapped, normally).
    pub fn base(&self) -> u64 {
        self.mappings.first().map_or(0, |m| m.start)
    }

    /// One past the highest file-backed mapped address.
    pub fn end(&self) -> u64 {
        self.mappings.iter().map(|m| m.end).max().unwrap_or(0)
    }

    /// ELF header and program headers, read when the module was found.
    pub fn header(&self) -> &ElfHeaderInfo {
        &self.header
    }

    /// The runtime address of file vaddr `vaddr`.
    pub fn runtime_address(&self, vaddr: u64) -> u64 {
        vaddr.wrapping_add(self.bias)
    }

    /// Whether `addr` is inside one of the module's file-backed mappings
    /// (`.bss` beyond the file is anonymous memory and not included).
    pub fn contains(&self, addr: u64) -> bool {
        self.mappings.iter().any(|m| m.contains(addr))
    }

    /// The address ranges mapped executable.
    pub fn executable_ranges(&self) -> impl Iterator<Item = Range<u64>> + '_ {
        self.mappings
            .iter()
            .filter(|m| m.perms.exec)
            .map(|m| m.start..m.end)
    }

    /// Whether `addr` is in an executable mapping of this module.
    pub fn is_executable_address(&self, addr: u64) -> bool {
        self.executable_ranges().any(|r| r.contains(&addr))
    }

    /// The parsed ELF file, read on the first call and cached. A failure is
    /// not cached (the next call retries).
    pub fn image(&self) -> Result<&ElfImage, InspectError> {
        if let Some(img) = self.image.get() {
            return Ok(img);
        }
        let first = self
            .mappings
            .first()
            .ok_or_else(|| InspectError::NotReadable {
                path: self.path.clone(),
                reason: "the module has no mapping".into(),
            })?;
        let img = ElfImage::open_mapped(self.pid, first)?;
        Ok(self.image.get_or_init(|| img))
    }

    /// The parsed ELF file if [`Module::image`] already succeeded.
    pub fn loaded_image(&self) -> Option<&ElfImage> {
        self.image.get()
    }

    /// Supplies the ELF file from elsewhere, for a module whose file cannot
    /// be opened (e.g. weft's own runtime, loaded from a memfd whose bytes
    /// the injector has). Returns false, dropping `image`, if an image is
    /// already set.
    pub fn set_image(&self, image: ElfImage) -> bool {
        self.image.set(image).is_ok()
    }

    /// Takes the cached image from `old` if it describes the same file
    /// loaded at the same place.
    fn inherit_image(&mut self, old: &mut Module) {
        if self.image.get().is_none()
            && (self.dev, self.inode, &self.path, self.bias)
                == (old.dev, old.inode, &old.path, old.bias)
        {
            if let Some(img) = old.image.take() {
                let _ = self.image.set(img);
            }
        }
    }
}

/// A positioned read: `pread` on a file or on `/proc/PID/mem`.
type ReadAt = dyn Fn(&mut [u8], u64) -> std::io::Result<usize>;

/// Reads the ELF header prefix of a module: from the file if it can be
/// opened, otherwise from the process memory at the mapping of file offset 0
/// (which holds the ELF header and, in practice, the program headers).
///
/// Returns the header and the soname (see [`read_soname`]).
fn read_header(
    pid: i32,
    group: &[Mapping],
    mem: &mut Option<Option<File>>,
) -> Option<(ElfHeaderInfo, Option<String>)> {
    let path = group[0].path.file()?.to_path_buf();
    let mut buf = vec![0u8; PREFIX_LEN];
    let (n, source): (usize, Box<ReadAt>) = match open_mapped_file(pid, &group[0]) {
        Ok((file, _)) => {
            let n = read_full(&|b, o| file.read_at(b, o), &mut buf, 0);
            (n, Box::new(move |b, o| file.read_at(b, o)))
        }
        Err(_) => {
            let m = group.iter().find(|m| m.offset == 0 && m.perms.read)?;
            let mem = mem
                .get_or_insert_with(|| {
                    File::open(crate::inspect::procfs::pid_file(pid, "mem")).ok()
                })
                .as_ref()?
                .try_clone()
                .ok()?;
            let base = m.start;
            let limit = m.len();
            let read = move |b: &mut [u8], o: u64| {
                if o >= limit {
                    return Ok(0);
                }
                let n = b.len().min((limit - o) as usize);
                mem.read_at(&mut b[..n], base + o)
            };
            let n = read_full(&read, &mut buf, 0);
            (n, Box::new(read))
        }
    };
    buf.truncate(n);
    let need = ElfHeaderInfo::needed_len(&buf)?;
    if need > buf.len() && need <= MAX_HEADER_LEN {
        let old = buf.len();
        buf.resize(need, 0);
        let n = read_full(&*source, &mut buf[old..], old as u64);
        buf.truncate(old + n);
    }
    let header = ElfHeaderInfo::parse(&path, &buf).ok()?;
    let soname = read_soname(&header, &*source);
    Some((header, soname))
}

/// The `DT_SONAME` string, read through `read` (positioned reads of the
/// file): the `PT_DYNAMIC` entries, then the string at `DT_STRTAB` (a file
/// vaddr, turned into an offset through the `PT_LOAD` containing it) plus
/// the soname's offset. `None` if there is none or anything is out of
/// bounds, unreadable or not UTF-8.
pub(crate) fn read_soname(
    header: &ElfHeaderInfo,
    read: &dyn Fn(&mut [u8], u64) -> std::io::Result<usize>,
) -> Option<String> {
    use object::elf;
    let dynamic = header
        .segments
        .iter()
        .find(|s| s.p_type == elf::PT_DYNAMIC)?;
    let mut buf = vec![0u8; dynamic.filesz.min(MAX_DYNAMIC_LEN) as usize];
    let n = read_full(read, &mut buf, dynamic.offset);
    buf.truncate(n);
    let (mut soname, mut strtab) = (None, None);
    for entry in buf.chunks_exact(16) {
        let tag = i64::from_le_bytes(entry[..8].try_into().ok()?);
        let val = u64::from_le_bytes(entry[8..].try_into().ok()?);
        match tag {
            t if t == elf::DT_NULL as i64 => break,
            t if t == elf::DT_SONAME as i64 => soname = Some(val),
            t if t == elf::DT_STRTAB as i64 => strtab = Some(val),
            _ => {}
        }
    }
    let (soname, strtab) = (soname?, strtab?);
    let seg = header
        .segments
        .iter()
        .find(|s| s.is_load() && s.vaddr <= strtab && strtab - s.vaddr < s.filesz)?;
    let offset = seg
        .offset
        .checked_add(strtab - seg.vaddr)?
        .checked_add(soname)?;
    let mut name = vec![0u8; MAX_SONAME_LEN];
    let n = read_full(read, &mut name, offset);
    name.truncate(n);
    let end = name.iter().position(|&b| b == 0)?;
    let name = std::str::from_utf8(&name[..end]).ok()?;
    (!name.is_empty()).then(|| name.to_owned())
}

/// How process `pid` was started, from `argv[0]` in `/proc/PID/cmdline`:
/// `argv[0]` and its file name. A program that rewrote its title
/// (`redis-server *:6379`) is taken by the first word; a login shell's
/// leading `-` (`-bash`) is dropped.
fn started_as(pid: i32) -> Vec<String> {
    let Ok(raw) = std::fs::read(crate::inspect::procfs::pid_file(pid, "cmdline")) else {
        return Vec::new();
    };
    let argv0 = raw.split(|&b| b == 0).next().unwrap_or_default();
    let argv0 = String::from_utf8_lossy(argv0);
    let first = argv0
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .trim_start_matches('-');
    let file_name = first.rsplit('/').next().unwrap_or_default();
    let mut out: Vec<String> = Vec::new();
    for n in [argv0.as_ref(), first, file_name] {
        if !n.is_empty() && !out.iter().any(|o| o == n) {
            out.push(n.to_owned());
        }
    }
    out
}

/// Reads until `buf` is full, end of file or an error; returns the count.
fn read_full(
    read: &dyn Fn(&mut [u8], u64) -> std::io::Result<usize>,
    buf: &mut [u8],
    offset: u64,
) -> usize {
    let mut done = 0;
    while done < buf.len() {
        match read(&mut buf[done..], offset + done as u64) {
            Ok(0) | Err(_) => break,
            Ok(n) => done += n,
        }
    }
    done
}

/// Groups the file-backed mappings of `maps` into modules.
///
/// Mappings are grouped by (device, inode, path); groups that are not ELF
/// files (fonts, locale archives, data files), whose header cannot be read,
/// or for which no load bias can be computed are left out. The main
/// executable (matched by inode with `/proc/PID/exe`) comes first, the rest
/// keep address order.
pub fn modules_from_maps(pid: i32, maps: &[Mapping]) -> Vec<Module> {
    use std::os::unix::fs::MetadataExt as _;
    let mut groups: Vec<Vec<Mapping>> = Vec::new();
    let mut index: HashMap<((u32, u32), u64, &Path), usize> = HashMap::new();
    for m in maps {
        let MappingPath::File { path, .. } = &m.path else {
            continue;
        };
        let key = (m.dev, m.inode, path.as_path());
        let i = *index.entry(key).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[i].push(m.clone());
    }

    let exe_inode = std::fs::metadata(crate::inspect::procfs::pid_file(pid, "exe"))
        .ok()
        .map(|m| m.ino());
    let mut mem = None;
    let mut out = Vec::new();
    for mut group in groups {
        group.sort_by_key(|m| m.start);
        let Some((header, soname)) = read_header(pid, &group, &mut mem) else {
            continue;
        };
        let MappingPath::File { path, deleted } = &group[0].path else {
            continue;
        };
        let Ok(bias) = header.load_bias(path, &group) else {
            continue;
        };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.to_string_lossy().into_owned());
        out.push(Module {
            pid,
            path: path.clone(),
            name,
            soname,
            started_as: Vec::new(),
            dev: group[0].dev,
            inode: group[0].inode,
            deleted: *deleted,
            is_main: false,
            bias,
            header,
            mappings: group,
            image: OnceLock::new(),
        });
    }
    if let Some(i) = exe_inode.and_then(|ino| out.iter().position(|m| m.inode == ino)) {
        let mut exe = out.remove(i);
        exe.is_main = true;
        exe.started_as = started_as(pid);
        out.insert(0, exe);
    }
    out
}

/// Moves cached images from `old` modules to the equal ones in `new`.
pub(crate) fn carry_over_images(new: &mut [Module], old: &mut [Module]) {
    for n in new.iter_mut() {
        if let Some(o) = old
            .iter_mut()
            .find(|o| o.inode == n.inode && o.path == n.path)
        {
            n.inherit_image(o);
        }
    }
}
