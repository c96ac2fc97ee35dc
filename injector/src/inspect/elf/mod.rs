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
mod frames;
mod slots;

use frames::EntryFrames;
pub use frames::{FrameAtEntry, FrameRule, NoReturnAddress, SavedAt};
pub use slots::SlotTarget;

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
                    Path::new(&crate::inspect::procfs::pid_file(pid, "root"))
                        .join(d.strip_prefix("/").unwrap_or(d))
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
        let rooted = Path::new(&crate::inspect::procfs::pid_file(pid, "root"))
            .join(path.strip_prefix("/").unwrap_or(path));
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
    let mf = PathBuf::from(crate::inspect::procfs::pid_file(
        pid,
        &format!("map_files/{:x}-{:x}", mapping.start, mapping.end),
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
    use super::slots::relr_slots;
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
