//! Reading the parts of an ELF file weft needs: load segments, function
//! symbols (from a separate debug file or `.eh_frame` for stripped files, see
//! `debugfile`), source lines, IFUNC GOT slots.
//!
//! Everything here is defensive: the bytes may come from a truncated,
//! corrupt or hostile file, so every offset is bounds-checked (by `object`,
//! `gimli`, or explicitly) and every failure is an [`InspectError`].

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use object::elf;
use object::read::elf::VersionTable;
use object::read::elf::{FileHeader, Rela as _, SectionHeader, SectionTable, Sym, SymbolTable};
use object::{Endianness, SymbolIndex};

pub(crate) mod debugfile;

use crate::inspect::names::SourceNames;

use crate::inspect::error::InspectError;
use crate::inspect::lines::{LineTable, SourceLine};
use crate::inspect::maps::{page_down, Mapping};
use debugfile::{DebugInfo, DebugSource, Origin};

type Elf64 = elf::FileHeader64<Endianness>;
type Result<T> = std::result::Result<T, InspectError>;

/// Size of the ELF64 file header.
const EHDR_SIZE: usize = 64;
/// Size of an ELF64 program header.
const PHDR_SIZE: usize = 56;
/// Largest gap after a function that [`ElfImage::padding_after`] reports.
const MAX_PADDING: u64 = 64;

/// `e_type` of an ELF file, reduced to what matters for loading.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElfType {
    /// `ET_EXEC`: a position-dependent executable, loaded at its link address.
    Executable,
    /// `ET_DYN`: a shared object or a position-independent executable.
    Dynamic,
    /// Anything else (`ET_REL`, `ET_CORE`, ...), by its raw value.
    Other(u16),
}

/// One program header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Segment {
    /// `p_type` (`PT_LOAD`, `PT_INTERP`, ...).
    pub p_type: u32,
    /// `p_flags` (`PF_R`, `PF_W`, `PF_X`).
    pub flags: u32,
    /// `p_offset`: where the segment's bytes start in the file.
    pub offset: u64,
    /// `p_vaddr`: where the segment starts in the file's address space.
    pub vaddr: u64,
    /// `p_filesz`.
    pub filesz: u64,
    /// `p_memsz`.
    pub memsz: u64,
}

impl Segment {
    /// Whether this is a `PT_LOAD` segment.
    pub fn is_load(&self) -> bool {
        self.p_type == elf::PT_LOAD
    }

    /// Whether the segment is mapped executable.
    pub fn is_executable(&self) -> bool {
        self.flags & elf::PF_X != 0
    }

    /// Whether the segment is mapped writable.
    pub fn is_writable(&self) -> bool {
        self.flags & elf::PF_W != 0
    }
}

/// What the ELF header and program headers say, parsed from a prefix of the
/// file (usually its first page), without reading the rest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElfHeaderInfo {
    /// `e_type`.
    pub elf_type: ElfType,
    /// `e_entry`: where the kernel starts the program (0 if none).
    pub entry: u64,
    /// All program headers, in file order.
    pub segments: Vec<Segment>,
}

/// Checks the identification bytes: ELF magic, 64-bit, little-endian, x86-64.
fn check_ident(path: &Path, data: &[u8]) -> Result<()> {
    if data.len() < 4 || data[..4] != elf::ELFMAG {
        return Err(InspectError::NotElf { path: path.into() });
    }
    if data.len() < EHDR_SIZE {
        return Err(InspectError::malformed(
            path,
            "file shorter than an ELF header",
        ));
    }
    let unsupported = |what: &str| InspectError::Unsupported {
        path: path.into(),
        what: what.into(),
    };
    if data[4] != elf::ELFCLASS64 {
        return Err(unsupported("not a 64-bit ELF file"));
    }
    if data[5] != elf::ELFDATA2LSB {
        return Err(unsupported("not little-endian"));
    }
    let machine = u16::from_le_bytes([data[18], data[19]]);
    if machine != elf::EM_X86_64 {
        return Err(unsupported(&format!("e_machine {machine} is not x86-64")));
    }
    Ok(())
}

impl ElfHeaderInfo {
    /// How many leading bytes of the file [`ElfHeaderInfo::parse`] needs,
    /// computed from the first 64 bytes; `None` if those are not a valid
    /// 64-bit ELF header.
    pub fn needed_len(prefix: &[u8]) -> Option<usize> {
        if prefix.len() < EHDR_SIZE {
            return None;
        }
        let phoff = u64::from_le_bytes(prefix[32..40].try_into().ok()?);
        let phnum = u16::from_le_bytes([prefix[56], prefix[57]]) as u64;
        let end = phoff.checked_add(phnum.checked_mul(PHDR_SIZE as u64)?)?;
        usize::try_from(end.max(EHDR_SIZE as u64)).ok()
    }

    /// Parses the file header and program headers from `data`, which may be a
    /// prefix of the file (see [`ElfHeaderInfo::needed_len`]). `path` is only
    /// used in error messages.
    pub fn parse(path: &Path, data: &[u8]) -> Result<Self> {
        check_ident(path, data)?;
        let hdr = Elf64::parse(data).map_err(|e| InspectError::malformed(path, e))?;
        let endian = hdr.endian().map_err(|e| InspectError::malformed(path, e))?;
        let phdrs = hdr
            .program_headers(endian, data)
            .map_err(|e| InspectError::malformed(path, e))?;
        use object::read::elf::ProgramHeader as _;
        let segments = phdrs
            .iter()
            .map(|p| Segment {
                p_type: p.p_type(endian),
                flags: p.p_flags(endian),
                offset: p.p_offset(endian),
                vaddr: p.p_vaddr(endian),
                filesz: p.p_filesz(endian),
                memsz: p.p_memsz(endian),
            })
            .collect();
        let elf_type = match hdr.e_type(endian) {
            elf::ET_EXEC => ElfType::Executable,
            elf::ET_DYN => ElfType::Dynamic,
            t => ElfType::Other(t),
        };
        Ok(ElfHeaderInfo {
            elf_type,
            entry: hdr.e_entry(endian),
            segments,
        })
    }

    /// Whether the file has a `PT_INTERP` segment (asks for a dynamic loader).
    pub fn has_interp(&self) -> bool {
        self.segments.iter().any(|s| s.p_type == elf::PT_INTERP)
    }

    /// Computes the load bias (runtime address minus file vaddr) from the
    /// mappings of this file in a process.
    ///
    /// The bias is `mapping.start - page_down(p_vaddr)` for the `PT_LOAD`
    /// whose `page_down(p_offset)` equals `mapping.offset`. When several
    /// segments share that file page (small files linked without
    /// `-z separate-code`), the one whose executable bit matches the mapping
    /// wins. Mappings that start inside a segment (split by `mprotect`, e.g.
    /// RELRO) are used as a fallback. `path` is only used in the error.
    pub fn load_bias(&self, path: &Path, mappings: &[Mapping]) -> Result<u64> {
        let loads: Vec<&Segment> = self.segments.iter().filter(|s| s.is_load()).collect();
        let mut ms: Vec<&Mapping> = mappings.iter().collect();
        ms.sort_by_key(|m| (m.offset, m.start));
        for m in &ms {
            let mut best: Option<&Segment> = None;
            for s in loads.iter().filter(|s| page_down(s.offset) == m.offset) {
                let exec_matches = s.is_executable() == m.perms.exec;
                if best.is_none()
                    || (exec_matches && best.is_some_and(|b| b.is_executable() != m.perms.exec))
                {
                    best = Some(s);
                }
            }
            if let Some(s) = best {
                return Ok(m.start.wrapping_sub(page_down(s.vaddr)));
            }
        }
        for m in &ms {
            for s in &loads {
                let po = page_down(s.offset);
                if m.offset > po && m.offset < s.offset.saturating_add(s.filesz) {
                    let vaddr = page_down(s.vaddr).wrapping_add(m.offset - po);
                    return Ok(m.start.wrapping_sub(vaddr));
                }
            }
        }
        Err(InspectError::NoLoadBias { path: path.into() })
    }
}

/// Whether a function symbol is an ordinary function or a GNU indirect
/// function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SymbolKind {
    /// `STT_FUNC` (or a function found in `.eh_frame`).
    Plain,
    /// `STT_GNU_IFUNC`: the symbol's address is the *resolver*, which returns
    /// the implementation the dynamic loader stores in GOT slots (see
    /// [`ElfImage::ifunc_got_slots`]).
    Ifunc,
}

/// Where a function was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SymbolSource {
    /// The dynamic symbol table `.dynsym`.
    Dynsym,
    /// The static symbol table `.symtab`.
    Symtab,
    /// The `.symtab` of a separate debug file (found by build-id or
    /// `.gnu_debuglink`).
    DebugFile,
    /// The `.symtab` of the file's MiniDebugInfo (`.gnu_debugdata`).
    MiniDebugInfo,
    /// An FDE of `.eh_frame` of a stripped file (named `fun_<hex vaddr>`).
    EhFrame,
}

/// The binding of a symbol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Binding {
    /// `STB_GLOBAL` (and `STB_GNU_UNIQUE`).
    Global,
    /// `STB_WEAK`.
    Weak,
    /// `STB_LOCAL` (also used for `.eh_frame` functions).
    Local,
}

/// A function defined in an ELF file.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FunctionSymbol {
    /// The name without any `@VERSION` / `@@VERSION` suffix.
    pub name: String,
    /// Address in the file's own address space (add the load bias to get the
    /// runtime address). For an IFUNC, the resolver's address.
    pub vaddr: u64,
    /// Size in bytes; for a size-0 symbol, the distance to the next symbol in
    /// its section (0 if unknown).
    pub size: u64,
    /// Plain function or IFUNC.
    pub kind: SymbolKind,
    /// Which table it came from.
    pub source: SymbolSource,
    /// Symbol binding.
    pub binding: Binding,
}

/// Sorted function list plus what `padding_after` needs.
#[derive(Debug)]
struct FunctionTable {
    /// Sorted by (vaddr, binding, name).
    functions: Vec<FunctionSymbol>,
    /// Distinct function start addresses, ascending.
    starts: Vec<u64>,
    /// Executable address ranges `[start, end)` of the file (allocated
    /// sections with `SHF_EXECINSTR`, or executable `PT_LOAD`s if there are
    /// no sections).
    text: Vec<(u64, u64)>,
}

/// What the dynamic section says that matters here.
#[derive(Clone, Copy, Debug, Default)]
struct DynamicInfo {
    needed: usize,
    has_soname: bool,
    flags_1: u64,
}

/// What a pointer slot of an ELF file holds once relocated
/// ([`ElfImage::pointer_slot`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlotTarget {
    /// The function of this name, wherever the loader found it.
    Symbol(String),
    /// This file vaddr of the same file.
    Address(u64),
}

/// An ELF file read into memory.
///
/// Construction parses only the ELF header, program headers, `PT_INTERP` and
/// `PT_DYNAMIC`; symbol tables are parsed on the first call that needs them
/// and cached.
pub struct ElfImage {
    path: PathBuf,
    data: Vec<u8>,
    header: ElfHeaderInfo,
    interp: Option<String>,
    dynamic: DynamicInfo,
    table: OnceLock<FunctionTable>,
    /// [`ElfImage::source_names`], by index of [`ElfImage::functions`].
    source_names: OnceLock<Vec<Option<SourceNames>>>,
    fdes: OnceLock<Vec<FunctionSymbol>>,
    entry_frames_cache: OnceLock<EntryFrames>,
    /// [`ElfImage::pointer_slot`]'s index.
    slots: OnceLock<Vec<(u64, SlotTarget)>>,
    origin: Origin,
    debug: OnceLock<DebugInfo>,
    lines: OnceLock<LineTable>,
}

/// Where an FDE says the canonical frame address is at its first
/// instruction, when that is not where a `call` leaves it (`rsp + 8`).
/// Code that starts with a frame already set up (a compiler's `.cold` part
/// runs in its parent's frame) is entered by a jump, never by a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameAtEntry {
    /// DWARF register number of the CFA's base (7 = `rsp`, 6 = `rbp`).
    pub register: u16,
    /// Offset from that register.
    pub offset: i64,
}

/// Why code that an FDE starts at has no return address on top of the
/// stack at its first instruction, whatever reaches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoReturnAddress {
    /// Its unwind information says the return address is undefined: the
    /// outermost frame, a process's (`_start`) or a thread's first code.
    Outermost,
    /// A signal trampoline (its CIE's augmentation `S`, as
    /// `__restore_rt`'s): entered by a signal handler's return, with the
    /// signal frame on top of the stack.
    SignalTrampoline,
}

/// What the FDEs say of their first instructions, by start address
/// (sorted): see [`ElfImage::frame_at_entry`] and
/// [`ElfImage::no_return_address_at_entry`].
#[derive(Debug, Default)]
struct EntryFrames {
    framed: Vec<(u64, FrameAtEntry)>,
    no_return_address: Vec<(u64, NoReturnAddress)>,
}

/// The value kept for `vaddr` in a list sorted by address.
fn find_at<T: Copy>(sorted: &[(u64, T)], vaddr: u64) -> Option<T> {
    sorted
        .binary_search_by_key(&vaddr, |&(a, _)| a)
        .ok()
        .map(|i| sorted[i].1)
}

/// One row of call frame information: where the caller's frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameRule {
    /// The canonical frame address: a register plus an offset.
    pub cfa: FrameAtEntry,
    /// Where the return address is.
    pub return_address: SavedAt,
    /// Where the caller's `rbp` is.
    pub rbp: SavedAt,
}

/// Where a register of the caller is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SavedAt {
    /// In memory at the CFA plus this offset.
    Cfa(i64),
    /// Nowhere: the outermost frame (`_start`, a thread's `clone`).
    Undefined,
    /// In the register itself.
    Unchanged,
}

impl fmt::Display for FrameAtEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = gimli::X86_64::register_name(gimli::Register(self.register)).unwrap_or("r?");
        write!(f, "{name}{:+}", self.offset)
    }
}

impl fmt::Debug for ElfImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ElfImage")
            .field("path", &self.path)
            .field("len", &self.data.len())
            .field("header", &self.header)
            .field("interp", &self.interp)
            .finish_non_exhaustive()
    }
}

/// Returns `data[offset..offset + len]` if it is in bounds.
fn slice(data: &[u8], offset: u64, len: u64) -> Option<&[u8]> {
    let start = usize::try_from(offset).ok()?;
    let end = start.checked_add(usize::try_from(len).ok()?)?;
    data.get(start..end)
}

/// Strips a symbol version from a `.symtab` name: `f@@V` gives `f`, `f@V`
/// (a non-default version) gives `None`, `f` gives `f`.
fn default_version_name(name: &[u8]) -> Option<&[u8]> {
    match name.iter().position(|&b| b == b'@') {
        None => Some(name),
        Some(i) if name.get(i + 1) == Some(&b'@') => Some(&name[..i]),
        Some(_) => None,
    }
}

/// Sort key: address, then binding, leading underscores, length, name.
fn alias_rank(f: &FunctionSymbol) -> (u64, Binding, usize, usize, &str) {
    let underscores = f.name.len() - f.name.trim_start_matches('_').len();
    (f.vaddr, f.binding, underscores, f.name.len(), &f.name)
}

/// A function symbol before sizes are fixed up.
struct RawFunction {
    sym: FunctionSymbol,
    /// Its section's address range: the same section in the stripped file
    /// and its debug file has the same range, whatever its index.
    section: (u64, u64),
}

impl ElfImage {
    /// Parses an ELF file already in memory. `path` names it in errors.
    pub fn from_bytes(path: impl Into<PathBuf>, data: Vec<u8>) -> Result<Self> {
        let path = path.into();
        let header = ElfHeaderInfo::parse(&path, &data)?;
        let interp = header
            .segments
            .iter()
            .find(|s| s.p_type == elf::PT_INTERP)
            .and_then(|s| slice(&data, s.offset, s.filesz))
            .map(|b| {
                let b = b.split(|&c| c == 0).next().unwrap_or(b);
                String::from_utf8_lossy(b).into_owned()
            });
        let mut dynamic = DynamicInfo::default();
        // A PT_DYNAMIC pointing outside the file is tolerated (reported as no
        // dynamic info) so that a damaged file can still be inspected.
        if let Some(dynbytes) = header
            .segments
            .iter()
            .find(|s| s.p_type == elf::PT_DYNAMIC)
            .and_then(|s| slice(&data, s.offset, s.filesz))
        {
            for entry in dynbytes.chunks_exact(16) {
                let tag = i64::from_le_bytes(entry[..8].try_into().unwrap_or_default());
                let val = u64::from_le_bytes(entry[8..].try_into().unwrap_or_default());
                const NULL: i64 = elf::DT_NULL as i64;
                const NEEDED: i64 = elf::DT_NEEDED as i64;
                const SONAME: i64 = elf::DT_SONAME as i64;
                const FLAGS_1: i64 = elf::DT_FLAGS_1 as i64;
                match tag {
                    NULL => break,
                    NEEDED => dynamic.needed += 1,
                    SONAME => dynamic.has_soname = true,
                    FLAGS_1 => dynamic.flags_1 = val,
                    _ => {}
                }
            }
        }
        Ok(ElfImage {
            path,
            data,
            header,
            interp,
            dynamic,
            table: OnceLock::new(),
            source_names: OnceLock::new(),
            fdes: OnceLock::new(),
            entry_frames_cache: OnceLock::new(),
            slots: OnceLock::new(),
            origin: Origin::default(),
            debug: OnceLock::new(),
            lines: OnceLock::new(),
        })
    }

    /// Reads and parses the ELF file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| InspectError::Io {
            path: path.into(),
            source,
        })?;
        let mut image = Self::from_file(path, file)?;
        image.origin = Origin {
            path: Some(path.to_path_buf()),
            dir: path.parent().map(Path::to_path_buf),
        };
        Ok(image)
    }

    /// Reads all of `file` and parses it; `path` names it in errors.
    pub fn from_file(path: &Path, mut file: File) -> Result<Self> {
        let hint = file.metadata().map(|m| m.len() as usize).unwrap_or(0);
        let mut data = Vec::with_capacity(hint);
        file.read_to_end(&mut data)
            .map_err(|source| InspectError::Io {
                path: path.into(),
                source,
            })?;
        Self::from_bytes(path, data)
    }

    /// Opens the file behind `mapping` of process `pid` and parses it: as
    /// `/proc/PID/root/PATH` (the target's mount namespace; accepted only
    /// if its inode is the mapping's), else `/proc/PID/map_files/START-END`
    /// (reaches a deleted file, but needs `CAP_CHECKPOINT_RESTORE` or
    /// `CAP_SYS_ADMIN`).
    pub fn open_mapped(pid: i32, mapping: &Mapping) -> Result<Self> {
        let (file, path) = open_mapped_file(pid, mapping)?;
        let mut image = Self::from_file(&path, file)?;
        // Debug links are looked up next to the file in the target's mount
        // namespace, whichever way the file itself was opened.
        if let Some(seen) = mapping.path.file() {
            image.origin = Origin {
                path: Some(seen.to_path_buf()),
                dir: seen.parent().map(|d| {
                    Path::new(&format!("/proc/{pid}/root")).join(d.strip_prefix("/").unwrap_or(d))
                }),
            };
        }
        Ok(image)
    }

    /// The path the file was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole file.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// ELF header and program headers.
    pub fn header(&self) -> &ElfHeaderInfo {
        &self.header
    }

    /// `e_type`: `ET_EXEC` (position-dependent executable) or `ET_DYN`
    /// (shared object or PIE).
    pub fn elf_type(&self) -> ElfType {
        self.header.elf_type
    }

    /// The `PT_INTERP` path (e.g. `/lib64/ld-linux-x86-64.so.2`), if any.
    pub fn interpreter(&self) -> Option<&str> {
        self.interp.as_deref()
    }

    /// Whether the file takes part in dynamic linking with other objects: it
    /// has a `PT_INTERP` or at least one `DT_NEEDED`. False for static
    /// executables (including static-pie, which has a `PT_DYNAMIC` for its
    /// own relocations but no interpreter and no dependency).
    pub fn is_dynamic(&self) -> bool {
        self.interp.is_some() || self.dynamic.needed > 0
    }

    /// Whether the file is a program rather than a library: `ET_EXEC`, or
    /// flagged `DF_1_PIE`, or with an interpreter and no `DT_SONAME` (glibc's
    /// `libc.so.6` has a `PT_INTERP` but also a soname).
    pub fn is_executable(&self) -> bool {
        self.header.elf_type == ElfType::Executable
            || self.dynamic.flags_1 & u64::from(elf::DF_1_PIE) != 0
            || (self.interp.is_some() && !self.dynamic.has_soname)
    }

    /// See [`ElfHeaderInfo::load_bias`].
    pub fn load_bias(&self, mappings: &[Mapping]) -> Result<u64> {
        self.header.load_bias(&self.path, mappings)
    }

    fn malformed(&self, what: impl fmt::Display) -> InspectError {
        InspectError::malformed(&self.path, what)
    }

    /// The parsed header and section table.
    fn sections(&self) -> Result<(Endianness, SectionTable<'_, Elf64, &[u8]>)> {
        let data = &self.data[..];
        let hdr = Elf64::parse(data).map_err(|e| self.malformed(e))?;
        let endian = hdr.endian().map_err(|e| self.malformed(e))?;
        let sections = hdr.sections(endian, data).map_err(|e| self.malformed(e))?;
        Ok((endian, sections))
    }

    /// Whether the file holds Go code: a `.go.buildinfo` section (every Go
    /// toolchain since 1.13 writes one, stripped or not, executables and
    /// `c-shared` libraries alike), or, failing that, Go's runtime entry
    /// `runtime.goexit`.
    pub fn is_go(&self) -> bool {
        if let Ok((endian, sections)) = self.sections() {
            if sections.section_by_name(endian, b".go.buildinfo").is_some() {
                return true;
            }
        }
        self.functions()
            .is_ok_and(|fs| fs.iter().any(|f| f.name == "runtime.goexit"))
    }

    /// All defined functions, sorted by address; aliases at one address are
    /// ordered global, weak, local, then fewest leading underscores, then
    /// shortest name (so `malloc` comes before `__libc_malloc`).
    ///
    /// Sources: `.dynsym` (only the default version of each versioned name),
    /// then `.symtab` (names `f@V` of non-default versions skipped), deduped
    /// by (name, address). When the file has no `.symtab` functions and is
    /// an executable or exports no function, the FDEs of `.eh_frame` that no
    /// symbol covers are added as `fun_<hex vaddr>`.
    pub fn functions(&self) -> Result<&[FunctionSymbol]> {
        Ok(&self.table()?.functions)
    }

    /// The source names of [`ElfImage::functions`], index for index
    /// (`None` for a function that is its own source name): demangled on
    /// the first call and cached, as every search over a C++ library
    /// needs them.
    pub fn source_names(&self) -> Result<&[Option<SourceNames>]> {
        if let Some(n) = self.source_names.get() {
            return Ok(n);
        }
        let names = self
            .functions()?
            .iter()
            .map(|f| crate::inspect::names::source_names(&f.name))
            .collect();
        Ok(self.source_names.get_or_init(|| names))
    }

    fn table(&self) -> Result<&FunctionTable> {
        if let Some(t) = self.table.get() {
            return Ok(t);
        }
        let t = self.build_table()?;
        Ok(self.table.get_or_init(|| t))
    }

    fn build_table(&self) -> Result<FunctionTable> {
        let data = &self.data[..];
        let (endian, sections) = self.sections()?;
        let mut raw: Vec<RawFunction> = Vec::new();

        let dynsym = sections
            .symbols(endian, data, elf::SHT_DYNSYM)
            .map_err(|e| self.malformed(e))?;
        // A broken version table should not hide all functions: without it
        // we merely cannot drop non-default versions.
        let versions = sections.versions(endian, data).ok().flatten();
        collect_functions(
            &dynsym,
            &sections,
            endian,
            versions.as_ref(),
            SymbolSource::Dynsym,
            &mut raw,
        );
        let dyn_defined = raw.len();

        let symtab = sections
            .symbols(endian, data, elf::SHT_SYMTAB)
            .map_err(|e| self.malformed(e))?;
        collect_functions(
            &symtab,
            &sections,
            endian,
            None,
            SymbolSource::Symtab,
            &mut raw,
        );
        if raw.len() == dyn_defined {
            // Stripped: the separate debug file's or MiniDebugInfo's
            // `.symtab`, in this file's address space.
            let debug = self.debug.get_or_init(|| self.find_debug_info());
            let source = match debug.source() {
                DebugSource::File { .. } => Some(SymbolSource::DebugFile),
                DebugSource::MiniDebugInfo => Some(SymbolSource::MiniDebugInfo),
                DebugSource::OwnSymtab | DebugSource::None => None,
            };
            if let (Some(source), Some(img)) = (source, debug.image()) {
                // A debug file whose tables cannot be parsed adds nothing.
                if let Ok((dendian, dsections)) = img.sections() {
                    if let Ok(table) = dsections.symbols(dendian, img.data(), elf::SHT_SYMTAB) {
                        collect_functions(&table, &dsections, dendian, None, source, &mut raw);
                    }
                }
            }
        } else {
            let _ = self.debug.set(DebugInfo::own_symtab());
        }
        let symtab_defined = raw.len() - dyn_defined;

        // Fill in sizes of size-0 functions from the next start in the same
        // section, capped at the section end. Sections are compared by
        // address range: in a `--only-keep-debug` file `.text` is
        // `SHT_NOBITS` but keeps its address and size.
        let mut by_section: Vec<((u64, u64), u64)> =
            raw.iter().map(|r| (r.section, r.sym.vaddr)).collect();
        by_section.sort_unstable();
        by_section.dedup();
        for r in raw.iter_mut().filter(|r| r.sym.size == 0) {
            let i = by_section.partition_point(|&(s, v)| (s, v) <= (r.section, r.sym.vaddr));
            let next = by_section
                .get(i)
                .filter(|&&(s, _)| s == r.section)
                .map(|&(_, v)| v);
            // (0, 0): the section could not be read; the next start alone
            // bounds the function.
            let section_end = if r.section.1 == 0 {
                r.sym.vaddr
            } else {
                r.section.1
            };
            let limit = match next {
                Some(n) if r.section.1 == 0 => n,
                Some(n) => n.min(section_end),
                None => section_end,
            };
            r.sym.size = limit.saturating_sub(r.sym.vaddr);
        }

        // By flags and addresses, not type or data: a `--only-keep-debug`
        // file's `.text` is `SHT_NOBITS`, and still the code at those
        // addresses.
        let exec_alloc = u64::from(elf::SHF_EXECINSTR | elf::SHF_ALLOC);
        let mut text: Vec<(u64, u64)> = sections
            .iter()
            .filter(|s| s.sh_flags(endian) & exec_alloc == exec_alloc)
            .map(|s| {
                let a = s.sh_addr(endian);
                (a, a.saturating_add(s.sh_size(endian)))
            })
            .collect();
        if text.is_empty() {
            text = self
                .header
                .segments
                .iter()
                .filter(|s| s.is_load() && s.is_executable())
                .map(|s| (s.vaddr, s.vaddr.saturating_add(s.memsz)))
                .collect();
        }
        text.sort_unstable();

        let mut functions: Vec<FunctionSymbol> = raw.into_iter().map(|r| r.sym).collect();
        // Stable sort: for equal (vaddr, name) the .dynsym entry, pushed
        // first, survives the dedup.
        functions.sort_by(|a, b| (a.vaddr, &a.name).cmp(&(b.vaddr, &b.name)));
        functions.dedup_by(|b, a| a.vaddr == b.vaddr && a.name == b.name);

        if symtab_defined == 0 && (self.is_executable() || dyn_defined == 0) {
            self.add_eh_frame_functions(&sections, endian, &text, &mut functions);
        }

        // Among aliases, the most user-facing name comes first: `malloc`
        // before `__libc_malloc`, global before weak before local.
        // Keys computed once: a separate debug file brings thousands of
        // functions (libc's has 7000), and counting underscores in every
        // comparison cost tens of milliseconds.
        functions.sort_by_cached_key(|f| {
            let (vaddr, binding, underscores, len, name) = alias_rank(f);
            (vaddr, binding, underscores, len, name.to_owned())
        });
        let mut starts: Vec<u64> = functions.iter().map(|f| f.vaddr).collect();
        starts.dedup();
        Ok(FunctionTable {
            functions,
            starts,
            text,
        })
    }

    /// Where this file's symbols and source lines come from: its own
    /// `.symtab`, a separate debug file or its MiniDebugInfo (searched in
    /// the order of `docs/debug-files.md`, in the directories of
    /// [`debug_dirs`](crate::inspect::debug_dirs) at the first call), or nothing.
    /// Candidates that were found but not used are in
    /// [`DebugInfo::ignored`].
    pub fn debug_info(&self) -> Result<&DebugInfo> {
        if let Some(d) = self.debug.get() {
            return Ok(d);
        }
        // The table decides whether the own `.symtab` suffices.
        self.table()?;
        Ok(self.debug.get_or_init(|| self.find_debug_info()))
    }

    fn find_debug_info(&self) -> DebugInfo {
        debugfile::find(
            &debugfile::Stripped {
                path: self.origin.path.as_deref().unwrap_or(&self.path),
                // Bytes handed over (`from_bytes`) are no file to stat.
                opened: self.origin.path.is_some().then_some(self.path.as_path()),
                data: &self.data,
                origin: &self.origin,
            },
            &debugfile::debug_dirs(),
        )
    }

    /// The source line of the code at file vaddr `vaddr` (for a function's
    /// entry, the line of its opening), from the DWARF line table of this
    /// file or of its separate debug file; `None` if neither has one or it
    /// does not cover `vaddr`. The table is read on the first call.
    pub fn source_line(&self, vaddr: u64) -> Result<Option<SourceLine>> {
        if let Some(t) = self.lines.get() {
            return Ok(t.find(vaddr));
        }
        let mut table = LineTable::parse(&self.data);
        if table.is_empty() {
            if let Some(img) = self.debug_info()?.image() {
                table = LineTable::parse(img.data());
            }
        }
        Ok(self.lines.get_or_init(|| table).find(vaddr))
    }

    /// `.eh_frame` ready to walk: the section, its base addresses (and
    /// `.text`'s, for text-relative pointers) and its bytes.
    #[allow(clippy::type_complexity)]
    fn eh_frame<'d>(
        &'d self,
        sections: &SectionTable<'d, Elf64, &'d [u8]>,
        endian: Endianness,
    ) -> Option<(
        gimli::EhFrame<gimli::EndianSlice<'d, gimli::LittleEndian>>,
        gimli::BaseAddresses,
        &'d [u8],
    )> {
        let (bytes, addr) = self.eh_frame_bytes(sections, endian)?;
        let mut eh = gimli::EhFrame::new(bytes, gimli::LittleEndian);
        eh.set_address_size(8);
        let mut bases = gimli::BaseAddresses::default().set_eh_frame(addr);
        if let Some((_, t)) = sections.section_by_name(endian, b".text") {
            bases = bases.set_text(t.sh_addr(endian));
        }
        Some((eh, bases, bytes))
    }

    /// Locates `.eh_frame`: by section name, or through `PT_GNU_EH_FRAME`
    /// (`.eh_frame_hdr`) for files without section headers. Returns the bytes
    /// and their vaddr.
    fn eh_frame_bytes<'d>(
        &'d self,
        sections: &SectionTable<'d, Elf64, &'d [u8]>,
        endian: Endianness,
    ) -> Option<(&'d [u8], u64)> {
        let data = &self.data[..];
        if let Some((_, s)) = sections.section_by_name(endian, b".eh_frame") {
            if s.sh_type(endian) != elf::SHT_NOBITS {
                let bytes = slice(data, s.sh_offset(endian), s.sh_size(endian))?;
                return Some((bytes, s.sh_addr(endian)));
            }
        }
        // No section headers: .eh_frame_hdr's eh_frame_ptr tells where
        // .eh_frame is; it runs to its zero terminator, at most to the end of
        // the PT_LOAD holding it.
        let hdr_seg = self
            .header
            .segments
            .iter()
            .find(|s| s.p_type == elf::PT_GNU_EH_FRAME)?;
        let hdr_bytes = slice(data, hdr_seg.offset, hdr_seg.filesz)?;
        let bases = gimli::BaseAddresses::default().set_eh_frame_hdr(hdr_seg.vaddr);
        let parsed = gimli::EhFrameHdr::new(hdr_bytes, gimli::LittleEndian)
            .parse(&bases, 8)
            .ok()?;
        let gimli::Pointer::Direct(addr) = parsed.eh_frame_ptr() else {
            return None;
        };
        let seg =
            self.header.segments.iter().find(|s| {
                s.is_load() && s.vaddr <= addr && addr < s.vaddr.saturating_add(s.filesz)
            })?;
        let off = seg.offset.checked_add(addr - seg.vaddr)?;
        let len = seg.vaddr.saturating_add(seg.filesz) - addr;
        Some((slice(data, off, len)?, addr))
    }

    /// The CFA at the first instruction of the FDE starting at `vaddr`, when
    /// it is not `rsp + 8` (the state a `call` leaves): such code runs in a
    /// frame set up before it and is entered by a jump. `None` when no FDE
    /// starts there or it starts like a called function. Parsed on first
    /// use and cached; bad entries are skipped.
    pub fn frame_at_entry(&self, vaddr: u64) -> Result<Option<FrameAtEntry>> {
        Ok(find_at(&self.entry_frames()?.framed, vaddr))
    }

    /// Whether the FDE starting at `vaddr` says its code has no return
    /// address on top of the stack at its first instruction (and why).
    /// `None` when no FDE starts there or it starts like a called function.
    pub fn no_return_address_at_entry(&self, vaddr: u64) -> Result<Option<NoReturnAddress>> {
        Ok(find_at(&self.entry_frames()?.no_return_address, vaddr))
    }

    /// The FDEs' first rows, parsed on first use and cached; bad entries
    /// are skipped.
    fn entry_frames(&self) -> Result<&EntryFrames> {
        if let Some(f) = self.entry_frames_cache.get() {
            return Ok(f);
        }
        let (endian, sections) = self.sections()?;
        let found = self.parse_entry_frames(&sections, endian);
        Ok(self.entry_frames_cache.get_or_init(|| found))
    }

    fn parse_entry_frames<'d>(
        &'d self,
        sections: &SectionTable<'d, Elf64, &'d [u8]>,
        endian: Endianness,
    ) -> EntryFrames {
        use gimli::UnwindSection as _;
        let Some((eh, bases, bytes)) = self.eh_frame(sections, endian) else {
            return EntryFrames::default();
        };
        let mut context = Box::new(gimli::UnwindContext::new());
        let mut entries = eh.entries(&bases);
        let mut found = Vec::new();
        let mut no_return_address = Vec::new();
        // As in `parse_fdes`: each `next` consumes an entry header; the cap
        // bounds work on absurd inputs.
        for _ in 0..(bytes.len() / 8 + 1) {
            let partial = match entries.next() {
                Ok(Some(gimli::CieOrFde::Fde(p))) => p,
                Ok(Some(gimli::CieOrFde::Cie(_))) => continue,
                Ok(None) | Err(_) => break,
            };
            let Ok(fde) = partial.parse(gimli::EhFrame::cie_from_offset) else {
                continue;
            };
            if fde.cie().is_signal_trampoline() {
                no_return_address.push((fde.initial_address(), NoReturnAddress::SignalTrampoline));
            }
            let Ok(mut rows) = fde.rows(&eh, &bases, &mut context) else {
                continue;
            };
            // The first row holds from the first instruction on.
            let Ok(Some(row)) = rows.next_row() else {
                continue;
            };
            // `.cfi_undefined rip` (gimli does not keep it apart from no
            // rule at all, which no x86-64 CIE leaves the return address
            // with: theirs say it is at CFA - 8; reading an odd one as
            // outermost only refuses a timer).
            if row.register(gimli::X86_64::RA) == gimli::RegisterRule::Undefined {
                no_return_address.push((row.start_address(), NoReturnAddress::Outermost));
            }
            if let gimli::CfaRule::RegisterAndOffset { register, offset } = *row.cfa() {
                if register != gimli::X86_64::RSP || offset != 8 {
                    found.push((
                        fde.initial_address(),
                        FrameAtEntry {
                            register: register.0,
                            offset,
                        },
                    ));
                }
            }
        }
        found.sort_by_key(|&(a, _)| a);
        found.dedup_by_key(|&mut (a, _)| a);
        no_return_address.sort_by_key(|&(a, _)| a);
        no_return_address.dedup_by_key(|&mut (a, _)| a);
        EntryFrames {
            framed: found,
            no_return_address,
        }
    }

    /// How to find the caller's frame from code at `vaddr`: the CFI row of
    /// `.eh_frame` covering it (looked up through `.eh_frame_hdr`'s sorted
    /// table when there is one). `None` when no FDE covers `vaddr` or its
    /// rule is one a stack walk cannot follow (a DWARF expression, as in a
    /// signal trampoline or a PLT stub).
    pub fn frame_rule(&self, vaddr: u64) -> Result<Option<FrameRule>> {
        use gimli::UnwindSection as _;
        let (endian, sections) = self.sections()?;
        let Some((eh, mut bases, _)) = self.eh_frame(&sections, endian) else {
            return Ok(None);
        };
        let mut context = Box::new(gimli::UnwindContext::new());
        let parsed = self
            .eh_frame_hdr_bytes(&sections, endian)
            .and_then(|(bytes, addr)| {
                bases = bases.clone().set_eh_frame_hdr(addr);
                gimli::EhFrameHdr::new(bytes, gimli::LittleEndian)
                    .parse(&bases, 8)
                    .ok()
            });
        let from = gimli::EhFrame::cie_from_offset;
        let row = match parsed.as_ref().and_then(|p| p.table()) {
            Some(table) => table
                .unwind_info_for_address(&eh, &bases, &mut context, vaddr, from)
                .ok()
                .cloned(),
            None => eh
                .unwind_info_for_address(&bases, &mut context, vaddr, from)
                .ok()
                .cloned(),
        };
        let Some(row) = row else {
            return Ok(None);
        };
        let gimli::CfaRule::RegisterAndOffset { register, offset } = *row.cfa() else {
            return Ok(None);
        };
        let saved = |reg: gimli::Register| match row.register(reg) {
            gimli::RegisterRule::Offset(o) => Some(SavedAt::Cfa(o)),
            gimli::RegisterRule::Undefined => Some(SavedAt::Undefined),
            gimli::RegisterRule::SameValue => Some(SavedAt::Unchanged),
            _ => None,
        };
        // A callee-saved register no rule mentions keeps its value (gimli
        // reads "no rule" as undefined; unwinders read it as unchanged).
        let rbp = match saved(gimli::X86_64::RBP) {
            Some(SavedAt::Undefined) => Some(SavedAt::Unchanged),
            other => other,
        };
        let (Some(return_address), Some(rbp)) = (saved(gimli::X86_64::RA), rbp) else {
            return Ok(None);
        };
        Ok(Some(FrameRule {
            cfa: FrameAtEntry {
                register: register.0,
                offset,
            },
            return_address,
            rbp,
        }))
    }

    /// `.eh_frame_hdr`'s bytes and vaddr, by section or program header.
    fn eh_frame_hdr_bytes<'d>(
        &'d self,
        sections: &SectionTable<'d, Elf64, &'d [u8]>,
        endian: Endianness,
    ) -> Option<(&'d [u8], u64)> {
        if let Some((_, s)) = sections.section_by_name(endian, b".eh_frame_hdr") {
            if s.sh_type(endian) != elf::SHT_NOBITS {
                return Some((
                    slice(&self.data, s.sh_offset(endian), s.sh_size(endian))?,
                    s.sh_addr(endian),
                ));
            }
        }
        let seg = self
            .header
            .segments
            .iter()
            .find(|s| s.p_type == elf::PT_GNU_EH_FRAME)?;
        Some((slice(&self.data, seg.offset, seg.filesz)?, seg.vaddr))
    }

    /// One `fun_<hex vaddr>` function per FDE of `.eh_frame` that starts in
    /// executable code, sorted by address, whether or not a symbol covers it.
    /// Parsed on first use and cached. Bad entries are skipped; a broken
    /// entry header ends the walk (the next entry's position is then
    /// unknown). Empty if the file has no `.eh_frame`.
    pub fn fde_functions(&self) -> Result<&[FunctionSymbol]> {
        if let Some(f) = self.fdes.get() {
            return Ok(f);
        }
        let (endian, sections) = self.sections()?;
        let text = &self.table()?.text;
        let found = self.parse_fdes(&sections, endian, text);
        Ok(self.fdes.get_or_init(|| found))
    }

    fn parse_fdes<'d>(
        &'d self,
        sections: &SectionTable<'d, Elf64, &'d [u8]>,
        endian: Endianness,
        text: &[(u64, u64)],
    ) -> Vec<FunctionSymbol> {
        use gimli::UnwindSection as _;
        let Some((eh, bases, bytes)) = self.eh_frame(sections, endian) else {
            return Vec::new();
        };
        let in_text = |a: u64| text.iter().any(|&(s, e)| s <= a && a < e);

        let mut cies: HashMap<usize, gimli::CommonInformationEntry<_>> = HashMap::new();
        let mut entries = eh.entries(&bases);
        let mut found = Vec::new();
        // Each successful `next` consumes at least one entry header, so the
        // loop ends; the cap only bounds work on absurd inputs.
        for _ in 0..(bytes.len() / 8 + 1) {
            let partial = match entries.next() {
                Ok(Some(gimli::CieOrFde::Fde(p))) => p,
                Ok(Some(gimli::CieOrFde::Cie(_))) => continue,
                Ok(None) | Err(_) => break,
            };
            let fde = partial.parse(|section, bases, offset| {
                if let Some(c) = cies.get(&offset.0) {
                    return Ok(c.clone());
                }
                let c = section.cie_from_offset(bases, offset)?;
                cies.insert(offset.0, c.clone());
                Ok(c)
            });
            let Ok(fde) = fde else { continue };
            let (start, len) = (fde.initial_address(), fde.len());
            if len == 0 || start.checked_add(len).is_none() || !in_text(start) {
                continue;
            }
            found.push(FunctionSymbol {
                name: format!("fun_{start:x}"),
                vaddr: start,
                size: len,
                kind: SymbolKind::Plain,
                source: SymbolSource::EhFrame,
                binding: Binding::Local,
            });
        }
        found.sort_by_key(|f| f.vaddr);
        found.dedup_by_key(|f| f.vaddr);
        found
    }

    /// Adds the FDE functions that start inside no known function.
    fn add_eh_frame_functions<'d>(
        &'d self,
        sections: &SectionTable<'d, Elf64, &'d [u8]>,
        endian: Endianness,
        text: &[(u64, u64)],
        functions: &mut Vec<FunctionSymbol>,
    ) {
        let fdes = self.parse_fdes(sections, endian, text);
        // Known ranges, sorted by start, to skip FDEs symbols describe.
        let known: Vec<(u64, u64)> = functions
            .iter()
            .map(|f| (f.vaddr, f.vaddr.saturating_add(f.size.max(1))))
            .collect();
        let covered = |a: u64| {
            let i = known.partition_point(|&(s, _)| s <= a);
            // Functions rarely nest; looking back a few entries suffices.
            known[..i]
                .iter()
                .rev()
                .take(64)
                .any(|&(s, e)| s <= a && a < e)
        };
        let extra: Vec<FunctionSymbol> =
            fdes.iter().filter(|f| !covered(f.vaddr)).cloned().collect();
        functions.extend(extra);
        let _ = self.fdes.set(fdes);
    }

    /// How many bytes after the function `[vaddr, vaddr + size)` belong to no
    /// other function: the distance to the next function start (or the end
    /// of the executable section), capped at 64. Zero if another function
    /// starts inside the range.
    ///
    /// Only symbols are consulted; whether those bytes really are padding
    /// (`int3`, `nop`) is for the caller to check.
    pub fn padding_after(&self, vaddr: u64, size: u64) -> Result<u64> {
        let t = self.table()?;
        let end = vaddr.saturating_add(size);
        let i = t.starts.partition_point(|&s| s <= vaddr);
        let mut limit = t.starts.get(i).copied().unwrap_or(u64::MAX);
        if let Some(&(_, e)) = t.text.iter().find(|&&(s, e)| s <= vaddr && vaddr < e) {
            limit = limit.min(e);
        } else if limit == u64::MAX {
            // Not in any known code range and nothing follows: claim nothing.
            limit = end;
        }
        Ok(limit.saturating_sub(end).min(MAX_PADDING))
    }

    /// What a call or jump through the pointer at file vaddr `slot_vaddr`
    /// reaches, when the file alone says so: the symbol an
    /// `R_X86_64_JUMP_SLOT` or `R_X86_64_GLOB_DAT` relocation binds there
    /// (a PLT stub's, or `-fno-plt` code's, GOT slot), or the address an
    /// `R_X86_64_RELATIVE` relocation puts in a slot of the `PT_GNU_RELRO`
    /// segment (read-only once relocated: Rust's calls into the standard
    /// library compiled into the same executable go through such slots).
    /// A pointer in writable data is the program's to change: None.
    pub fn pointer_slot(&self, slot_vaddr: u64) -> Option<&SlotTarget> {
        let slots = self.slots.get_or_init(|| self.read_pointer_slots());
        let at = slots.binary_search_by_key(&slot_vaddr, |(s, _)| *s).ok()?;
        Some(&slots[at].1)
    }

    /// [`ElfImage::pointer_slot`]'s index, sorted by slot.
    fn read_pointer_slots(&self) -> Vec<(u64, SlotTarget)> {
        use object::read::elf::Rela as _;
        let data = &self.data[..];
        let Ok((endian, sections)) = self.sections() else {
            return Vec::new();
        };
        let relro: Vec<(u64, u64)> = self
            .header
            .segments
            .iter()
            .filter(|s| s.p_type == elf::PT_GNU_RELRO)
            .map(|s| (s.vaddr, s.vaddr.saturating_add(s.memsz)))
            .collect();
        let mut slots = Vec::new();
        for section in sections.iter() {
            let Ok(Some((relas, link))) = section.rela(endian, data) else {
                continue;
            };
            let symtab = (link.0 != 0)
                .then(|| sections.symbol_table_by_index(endian, data, link).ok())
                .flatten();
            for r in relas {
                let slot = r.r_offset(endian);
                match r.r_type(endian, false) {
                    elf::R_X86_64_JUMP_SLOT | elf::R_X86_64_GLOB_DAT => {
                        let name = symtab.as_ref().and_then(|t| {
                            let sym = t.symbol(SymbolIndex(r.r_sym(endian, false) as usize));
                            sym.and_then(|s| t.symbol_name(endian, s)).ok()
                        });
                        if let Some(name) = name.filter(|n| !n.is_empty()) {
                            let name = String::from_utf8_lossy(name).into_owned();
                            slots.push((slot, SlotTarget::Symbol(name)));
                        }
                    }
                    elf::R_X86_64_RELATIVE
                        if relro
                            .iter()
                            .any(|&(from, to)| from <= slot && slot + 8 <= to) =>
                    {
                        slots.push((slot, SlotTarget::Address(r.r_addend(endian) as u64)));
                    }
                    _ => {}
                }
            }
        }
        // Packed relative relocations (`-z pack-relative-relocs`, DT_RELR):
        // the same RELATIVE slots, their addend the value the file holds
        // there.
        for section in sections.iter() {
            if section.sh_type(endian) != elf::SHT_RELR {
                continue;
            }
            let Ok(bytes) = section.data(endian, data) else {
                continue;
            };
            let entries = bytes
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()));
            for slot in relr_slots(entries) {
                if !relro
                    .iter()
                    .any(|&(from, to)| from <= slot && slot + 8 <= to)
                {
                    continue;
                }
                if let Some(target) = self.file_word(slot) {
                    slots.push((slot, SlotTarget::Address(target)));
                }
            }
        }
        slots.sort_by_key(|(s, _)| *s);
        slots.dedup_by_key(|(s, _)| *s);
        slots
    }

    /// The 8 bytes the file holds at vaddr `vaddr`, if a segment has them
    /// in the file.
    fn file_word(&self, vaddr: u64) -> Option<u64> {
        let segment = self.header.segments.iter().find(|s| {
            s.is_load() && s.vaddr <= vaddr && vaddr.saturating_add(8) <= s.vaddr + s.filesz
        })?;
        let bytes = slice(&self.data, segment.offset + (vaddr - segment.vaddr), 8)?;
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    }

    /// File vaddrs of the GOT slots in this file that the dynamic loader
    /// fills with the implementation chosen for the IFUNC `name` whose
    /// resolver is at `resolver_vaddr` (a file vaddr of the defining image).
    ///
    /// Two kinds of slots: `R_X86_64_IRELATIVE` relocations whose addend is
    /// `resolver_vaddr` (the defining image's own calls, e.g. libc calling
    /// `memcpy`; pass `resolver_vaddr` only for that image) and
    /// `R_X86_64_JUMP_SLOT` / `R_X86_64_GLOB_DAT` naming `name` (any image
    /// importing it). A lazily bound `JUMP_SLOT` holds a PLT stub address
    /// until the first call. Sorted, without duplicates.
    pub fn ifunc_got_slots(&self, name: &str, resolver_vaddr: u64) -> Result<Vec<u64>> {
        let data = &self.data[..];
        let (endian, sections) = self.sections()?;
        let mut out = Vec::new();
        for section in sections.iter() {
            let Some((relas, link)) = section.rela(endian, data).map_err(|e| self.malformed(e))?
            else {
                continue;
            };
            // sh_link 0 means no symbol table: only IRELATIVE can be used.
            let symtab = if link.0 == 0 {
                None
            } else {
                sections.symbol_table_by_index(endian, data, link).ok()
            };
            for r in relas {
                let slot = r.r_offset(endian);
                match r.r_type(endian, false) {
                    elf::R_X86_64_IRELATIVE if r.r_addend(endian) as u64 == resolver_vaddr => {
                        out.push(slot);
                    }
                    elf::R_X86_64_JUMP_SLOT | elf::R_X86_64_GLOB_DAT => {
                        let Some(symtab) = &symtab else { continue };
                        let sym_name = symtab
                            .symbol(SymbolIndex(r.r_sym(endian, false) as usize))
                            .and_then(|s| symtab.symbol_name(endian, s));
                        if sym_name.is_ok_and(|n| n == name.as_bytes()) {
                            out.push(slot);
                        }
                    }
                    _ => {}
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// The file vaddr of the defined symbol `name` (any type but sections,
    /// files and TLS; for an IFUNC, its resolver). `.dynsym` is searched
    /// first, ignoring non-default versions, then `.symtab` (where `name@@V`
    /// also matches). `None` if it is not defined here.
    pub fn symbol_vaddr(&self, name: &str) -> Result<Option<u64>> {
        let data = &self.data[..];
        let (endian, sections) = self.sections()?;
        let versions = sections.versions(endian, data).ok().flatten();
        for (sh_type, versions) in [
            (elf::SHT_DYNSYM, versions.as_ref()),
            (elf::SHT_SYMTAB, None),
        ] {
            let table = sections
                .symbols(endian, data, sh_type)
                .map_err(|e| self.malformed(e))?;
            for (idx, sym) in table.enumerate() {
                if matches!(
                    sym.st_type(),
                    elf::STT_SECTION | elf::STT_FILE | elf::STT_TLS
                ) {
                    continue;
                }
                let Ok(Some(_)) = table.symbol_section(endian, sym, idx) else {
                    continue;
                };
                let Ok(n) = table.symbol_name(endian, sym) else {
                    continue;
                };
                if default_version_name(n) != Some(name.as_bytes()) {
                    continue;
                }
                if versions.is_some_and(|v| v.version_index(endian, idx).is_hidden()) {
                    continue;
                }
                return Ok(Some(sym.st_value(endian)));
            }
        }
        Ok(None)
    }
}

/// Appends the defined `STT_FUNC`/`STT_GNU_IFUNC` symbols of `table`.
fn collect_functions<'d>(
    table: &SymbolTable<'d, Elf64, &'d [u8]>,
    sections: &SectionTable<'d, Elf64, &'d [u8]>,
    endian: Endianness,
    versions: Option<&VersionTable<'_, Elf64>>,
    source: SymbolSource,
    out: &mut Vec<RawFunction>,
) {
    for (idx, sym) in table.enumerate() {
        let kind = match sym.st_type() {
            elf::STT_FUNC => SymbolKind::Plain,
            elf::STT_GNU_IFUNC => SymbolKind::Ifunc,
            _ => continue,
        };
        // Undefined (imports), absolute and common symbols are not code here.
        let Ok(Some(section)) = table.symbol_section(endian, sym, idx) else {
            continue;
        };
        let vaddr = sym.st_value(endian);
        if vaddr == 0 {
            continue;
        }
        if versions.is_some_and(|v| v.version_index(endian, idx).is_hidden()) {
            continue;
        }
        let Ok(raw_name) = table.symbol_name(endian, sym) else {
            continue;
        };
        let Some(name) = default_version_name(raw_name).filter(|n| !n.is_empty()) else {
            continue;
        };
        let binding = match sym.st_bind() {
            elf::STB_LOCAL => Binding::Local,
            elf::STB_WEAK => Binding::Weak,
            _ => Binding::Global,
        };
        out.push(RawFunction {
            sym: FunctionSymbol {
                name: String::from_utf8_lossy(name).into_owned(),
                vaddr,
                size: sym.st_size(endian),
                kind,
                source,
                binding,
            },
            section: sections.section(section).map_or((0, 0), |s| {
                let a = s.sh_addr(endian);
                (a, a.saturating_add(s.sh_size(endian)))
            }),
        });
    }
}

/// The slots a packed relative relocation section (`SHT_RELR`) names, in
/// order: an even entry is a slot (and the next one follows it); an odd
/// entry is a bitmap of the 63 words after the last slot named, bit 1 the
/// first of them, after which the next bitmap starts 63 words on.
fn relr_slots(entries: impl Iterator<Item = u64>) -> Vec<u64> {
    let mut slots = Vec::new();
    let mut next = 0u64;
    for entry in entries {
        if entry & 1 == 0 {
            slots.push(entry);
            next = entry.wrapping_add(8);
        } else {
            let mut bits = entry >> 1;
            let mut at = next;
            while bits != 0 {
                if bits & 1 != 0 {
                    slots.push(at);
                }
                bits >>= 1;
                at = at.wrapping_add(8);
            }
            next = next.wrapping_add(63 * 8);
        }
    }
    slots
}

/// Opens the file behind a file-backed mapping of process `pid`.
///
/// Tries, in order: `/proc/PID/root/PATH` (so that files of containerized
/// targets are found in the target's mount namespace), accepted only if its
/// inode matches the mapping's (the file may have been replaced, e.g. by an
/// upgrade); then `/proc/PID/map_files/START-END`, which reaches the mapped
/// file even when deleted but needs `CAP_CHECKPOINT_RESTORE` or
/// `CAP_SYS_ADMIN`. Returns the open file and the path that worked.
pub fn open_mapped_file(pid: i32, mapping: &Mapping) -> Result<(File, PathBuf)> {
    use std::os::unix::fs::MetadataExt as _;
    let crate::inspect::maps::MappingPath::File { path, deleted } = &mapping.path else {
        return Err(InspectError::NotReadable {
            path: PathBuf::from(format!("{:#x}", mapping.start)),
            reason: "the mapping is not file-backed".into(),
        });
    };
    let mut reasons = Vec::new();
    if *deleted {
        reasons.push("the file was deleted".to_string());
    } else {
        let rooted =
            Path::new(&format!("/proc/{pid}/root")).join(path.strip_prefix("/").unwrap_or(path));
        match File::open(&rooted) {
            Ok(f) => match f.metadata() {
                Ok(md) if mapping.inode == 0 || md.ino() == mapping.inode => {
                    return Ok((f, rooted))
                }
                Ok(md) => reasons.push(format!(
                    "{} is now another file (inode {} instead of {})",
                    rooted.display(),
                    md.ino(),
                    mapping.inode
                )),
                Err(e) => reasons.push(format!("{}: {e}", rooted.display())),
            },
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(InspectError::PermissionDenied { pid, path: rooted })
            }
            Err(e) => reasons.push(format!("{}: {e}", rooted.display())),
        }
    }
    let mf = PathBuf::from(format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        mapping.start, mapping.end
    ));
    match File::open(&mf) {
        Ok(f) => return Ok((f, mf)),
        Err(e) => reasons.push(format!("{}: {e}", mf.display())),
    }
    Err(InspectError::NotReadable {
        path: path.clone(),
        reason: reasons.join("; "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_relative_relocations_decode() {
        // The example of the RELR proposal (generic-abi): an address, then
        // a bitmap naming the 1st and 3rd words after it, then one naming
        // the 63rd word of the next stretch of 63.
        let slots = relr_slots(
            [
                0x10000u64,
                0b101 << 1 | 1,
                1 | (1 << 63),
                0x20000,
                1 << 1 | 1,
            ]
            .into_iter(),
        );
        assert_eq!(
            slots,
            [
                0x10000,
                0x10008,
                0x10018,
                0x10008 + 63 * 8 + 62 * 8,
                0x20000,
                0x20008
            ]
        );
    }

    #[test]
    fn version_suffixes() {
        assert_eq!(
            default_version_name(b"memcpy@@GLIBC_2.14"),
            Some(&b"memcpy"[..])
        );
        assert_eq!(default_version_name(b"memcpy@GLIBC_2.2.5"), None);
        assert_eq!(default_version_name(b"memcpy"), Some(&b"memcpy"[..]));
    }

    #[test]
    fn rejects_non_elf() {
        assert!(matches!(
            ElfImage::from_bytes("x", b"#!/bin/sh\n".to_vec()),
            Err(InspectError::NotElf { .. })
        ));
        assert!(matches!(
            ElfImage::from_bytes("x", b"\x7fELF".to_vec()),
            Err(InspectError::Malformed { .. })
        ));
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = 1; // ELFCLASS32
        assert!(matches!(
            ElfImage::from_bytes("x", h),
            Err(InspectError::Unsupported { .. })
        ));
    }
}
