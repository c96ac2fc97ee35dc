//! A function's code and source as a tool sees them: its instructions,
//! basic blocks, call sites and exit points ([`function_code`]), the source
//! line of an address from the module's DWARF line tables ([`LineTable`]),
//! and readable names of mangled Rust and C++ symbols ([`demangle`]).
//!
//! Code is decoded from the module's *file*, so it shows the function as
//! built, whatever weft (or a debugger) has patched in memory since.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSection, ObjectSegment};

/// What [`function_code`] returns, so that a tool needs no direct
/// dependency on `weft-codegen`.
pub use weft_codegen::cfg::{
    BasicBlock, CallSite, CallTarget, Disassembly, ExitKind, ExitPoint, Flow, Instruction,
};

use crate::inspect::{FoundFunction, Module, ProcessImage};

/// Why a function's code or lines could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CodeError {
    /// The function's module is not mapped any more.
    #[error("{function}: its module {module} is not mapped in the process (was it unloaded?)")]
    NoModule {
        /// The function.
        function: String,
        /// Its module's path.
        module: PathBuf,
    },
    /// The module file could not be read or parsed.
    #[error("cannot read {path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The function's bytes are not in any loadable segment of the file.
    #[error("{function}: no file bytes at {vaddr:#x} in {path} (a function of {size} bytes)")]
    NotInFile {
        /// The function.
        function: String,
        /// Its file address.
        vaddr: u64,
        /// Its size.
        size: u64,
        /// The file.
        path: PathBuf,
    },
    /// The DWARF line tables are malformed.
    #[error("{path}: malformed DWARF line information: {reason}")]
    Dwarf {
        /// The file.
        path: PathBuf,
        /// What gimli said.
        reason: String,
    },
}

/// Longest function decoded when its symbol has no size: up to the end of
/// its segment, but no further than this.
const UNSIZED_MAX: u64 = 4096;

/// The code of `f` (runtime addresses), decoded from its module's file.
///
/// # Errors
///
/// [`CodeError`] when the module is gone or its file cannot be read.
pub fn function_code(image: &ProcessImage, f: &FoundFunction) -> Result<Disassembly, CodeError> {
    let module = module_of(image, f)?;
    let elf = module.image().map_err(|e| CodeError::File {
        path: module.path().to_path_buf(),
        reason: e.to_string(),
    })?;
    let bytes = segment_bytes(elf.path(), elf.data(), f.vaddr, f.size)?.ok_or_else(|| {
        CodeError::NotInFile {
            function: f.name.clone(),
            vaddr: f.vaddr,
            size: f.size,
            path: module.path().to_path_buf(),
        }
    })?;
    Ok(weft_codegen::analyze_function(f.address, bytes))
}

/// The function a PLT stub at `address` (runtime) calls, as its symbol
/// name: the stub's `jmp [rip + slot]` (after an `endbr64`, with or
/// without a `bnd` prefix) goes through a GOT slot whose relocation names
/// it. None when `address` is not such a stub. Call graphs use it to name
/// calls into other libraries (`printf@plt`).
pub fn plt_import(image: &ProcessImage, address: u64) -> Option<String> {
    let module = image.module_of(address)?;
    let elf = module.image().ok()?;
    let vaddr = address.wrapping_sub(module.bias());
    let bytes = segment_bytes(elf.path(), elf.data(), vaddr, 16).ok()??;
    let code = weft_codegen::analyze_function(vaddr, bytes);
    let jump = code
        .instructions
        .iter()
        .take(2)
        .find(|i| !matches!(i.flow, weft_codegen::cfg::Flow::Next))?;
    let weft_codegen::cfg::Flow::IndirectJump { slot: Some(slot) } = jump.flow else {
        return None;
    };
    elf.got_slot_symbol(slot).ok()?
}

fn module_of<'a>(image: &'a ProcessImage, f: &FoundFunction) -> Result<&'a Module, CodeError> {
    image
        .modules()
        .iter()
        .find(|m| m.path() == f.module_path && m.contains(f.address))
        .ok_or_else(|| CodeError::NoModule {
            function: f.name.clone(),
            module: f.module_path.clone(),
        })
}

/// The file bytes of `[vaddr, vaddr + size)` (`size` 0: up to
/// [`UNSIZED_MAX`] or the end of the segment), or None when no loadable
/// segment holds them.
fn segment_bytes<'a>(
    path: &Path,
    data: &'a [u8],
    vaddr: u64,
    size: u64,
) -> Result<Option<&'a [u8]>, CodeError> {
    let file = object::File::parse(data).map_err(|e| CodeError::File {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    for seg in file.segments() {
        let (start, len) = (seg.address(), seg.size());
        if vaddr < start || vaddr >= start + len {
            continue;
        }
        let Ok(bytes) = seg.data() else { continue };
        let from = (vaddr - start) as usize;
        if from >= bytes.len() {
            return Ok(None);
        }
        let want = if size == 0 { UNSIZED_MAX } else { size };
        let to = (from as u64 + want).min(bytes.len() as u64) as usize;
        return Ok(Some(&bytes[from..to]));
    }
    Ok(None)
}

/// A source position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceLocation {
    /// The source file (as the compiler recorded it: absolute, or relative
    /// to the compilation directory, which is then prepended).
    pub file: PathBuf,
    /// Line, from 1.
    pub line: u32,
    /// Column, from 1 (0: unknown).
    pub column: u32,
}

/// One row of a line table: the code from `address` on comes from
/// `location` (until the next row's address).
#[derive(Clone, Debug)]
struct Row {
    address: u64,
    /// Index into `files`; `None` marks the end of a sequence.
    file: Option<usize>,
    line: u32,
    column: u32,
}

/// A module's DWARF line table, addresses in the file's own (vaddr)
/// space. Built from the module file's `.debug_line`, or from its separate
/// debug file (`/usr/lib/debug/.build-id/xx/yyyy.debug`) when the module
/// is stripped.
#[derive(Clone, Debug)]
pub struct LineTable {
    rows: Vec<Row>,
    files: Vec<PathBuf>,
}

impl LineTable {
    /// The line table of `module`, or None when neither the module nor a
    /// separate debug file for it has line information.
    ///
    /// # Errors
    ///
    /// [`CodeError`] when a file cannot be parsed or its DWARF is
    /// malformed.
    pub fn for_module(module: &Module) -> Result<Option<LineTable>, CodeError> {
        let elf = module.image().map_err(|e| CodeError::File {
            path: module.path().to_path_buf(),
            reason: e.to_string(),
        })?;
        if let Some(table) = Self::from_elf(elf.path(), elf.data())? {
            return Ok(Some(table));
        }
        let Some(debug) = separate_debug_file(elf.data()) else {
            return Ok(None);
        };
        let Ok(data) = std::fs::read(&debug) else {
            return Ok(None);
        };
        Self::from_elf(&debug, &data)
    }

    /// The line table in ELF file `data` (None: no `.debug_line`).
    ///
    /// # Errors
    ///
    /// [`CodeError`] for an unparsable file or malformed DWARF.
    pub fn from_elf(path: &Path, data: &[u8]) -> Result<Option<LineTable>, CodeError> {
        let file = object::File::parse(data).map_err(|e| CodeError::File {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        if file.section_by_name(".debug_line").is_none() {
            return Ok(None);
        }
        let dwarf_err = |e: gimli::Error| CodeError::Dwarf {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        let load = |id: gimli::SectionId| -> Result<Cow<'_, [u8]>, gimli::Error> {
            Ok(match file.section_by_name(id.name()) {
                Some(s) => s.uncompressed_data().unwrap_or(Cow::Borrowed(&[][..])),
                None => Cow::Borrowed(&[][..]),
            })
        };
        let owned = gimli::DwarfSections::load(load).map_err(dwarf_err)?;
        let dwarf = owned.borrow(|s| gimli::EndianSlice::new(s, gimli::LittleEndian));
        let mut table = LineTable {
            rows: Vec::new(),
            files: Vec::new(),
        };
        let mut file_index: std::collections::HashMap<PathBuf, usize> = Default::default();
        let mut units = dwarf.units();
        while let Some(header) = units.next().map_err(dwarf_err)? {
            let unit = dwarf.unit(header).map_err(dwarf_err)?;
            let Some(program) = unit.line_program.clone() else {
                continue;
            };
            let comp_dir = unit
                .comp_dir
                .map(|d| PathBuf::from(d.to_string_lossy().into_owned()));
            let mut rows = program.rows();
            while let Some((header, row)) = rows.next_row().map_err(dwarf_err)? {
                if row.end_sequence() {
                    table.rows.push(Row {
                        address: row.address(),
                        file: None,
                        line: 0,
                        column: 0,
                    });
                    continue;
                }
                let Some(entry) = row.file(header) else {
                    continue;
                };
                let mut path = PathBuf::new();
                if let Some(dir) = comp_dir.as_ref() {
                    path.push(dir);
                }
                if let Some(dir) = entry.directory(header) {
                    if let Ok(dir) = dwarf.attr_string(&unit, dir) {
                        path.push(dir.to_string_lossy().as_ref());
                    }
                }
                if let Ok(name) = dwarf.attr_string(&unit, entry.path_name()) {
                    path.push(name.to_string_lossy().as_ref());
                }
                let next = table.files.len();
                let index = *file_index.entry(path.clone()).or_insert(next);
                if index == next {
                    table.files.push(path);
                }
                table.rows.push(Row {
                    address: row.address(),
                    file: Some(index),
                    line: row.line().map_or(0, |l| l.get() as u32),
                    column: match row.column() {
                        gimli::ColumnType::LeftEdge => 0,
                        gimli::ColumnType::Column(c) => c.get() as u32,
                    },
                });
            }
        }
        // Stable: an end-of-sequence row and the next sequence's first row
        // at the same address keep their order.
        table.rows.sort_by_key(|r| r.address);
        Ok(Some(table))
    }

    /// Where the code at file address `vaddr` comes from (None: no line
    /// information covers it).
    pub fn lookup(&self, vaddr: u64) -> Option<SourceLocation> {
        let i = self.rows.partition_point(|r| r.address <= vaddr);
        let row = self.rows.get(i.checked_sub(1)?)?;
        let file = row.file?;
        Some(SourceLocation {
            file: self.files[file].clone(),
            line: row.line,
            column: row.column,
        })
    }

    /// Number of rows (for diagnostics).
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// The separate debug file of an ELF file, by its GNU build ID, if it is
/// installed (`/usr/lib/debug/.build-id/ab/cdef....debug`).
fn separate_debug_file(data: &[u8]) -> Option<PathBuf> {
    let file = object::File::parse(data).ok()?;
    let id = file.build_id().ok()??;
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    if hex.len() < 3 {
        return None;
    }
    let path = PathBuf::from(format!(
        "/usr/lib/debug/.build-id/{}/{}.debug",
        &hex[..2],
        &hex[2..]
    ));
    path.exists().then_some(path)
}

/// A readable form of a mangled Rust (legacy or v0) or C++ (Itanium)
/// symbol name; other names come back unchanged. Version suffixes
/// (`@GLIBC_2.2.5`) are kept.
pub fn demangle(name: &str) -> Cow<'_, str> {
    let (base, version) = match name.find('@') {
        Some(at) => name.split_at(at),
        None => (name, ""),
    };
    if let Ok(d) = rustc_demangle::try_demangle(base) {
        // `{:#}` drops the hash suffix of legacy symbols.
        return Cow::Owned(format!("{d:#}{version}"));
    }
    if base.starts_with("_Z") {
        if let Ok(sym) = cpp_demangle::Symbol::new(base) {
            if let Ok(d) = sym.demangle() {
                return Cow::Owned(format!("{d}{version}"));
            }
        }
    }
    Cow::Borrowed(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demangles_rust_and_cpp_and_leaves_c_alone() {
        assert_eq!(
            demangle("_ZN4weft7process7Process6attach17h0123456789abcdefE"),
            "weft::process::Process::attach"
        );
        assert_eq!(demangle("_RNvCs1234_4weft4main"), "weft::main");
        assert_eq!(demangle("_ZN3foo3barEv"), "foo::bar()");
        assert_eq!(demangle("_Z6middlei"), "middle(int)");
        assert_eq!(demangle("malloc"), "malloc");
        assert_eq!(demangle("memcpy@GLIBC_2.14"), "memcpy@GLIBC_2.14");
        assert_eq!(demangle("_Z6middlei@V1"), "middle(int)@V1");
        // Not valid mangling: unchanged.
        assert_eq!(demangle("_Zgarbage"), "_Zgarbage");
    }

    #[test]
    fn line_table_of_this_test_binary_finds_this_function() {
        let exe = std::env::current_exe().unwrap();
        let data = std::fs::read(&exe).unwrap();
        let Some(table) = LineTable::from_elf(&exe, &data).unwrap() else {
            panic!("the test binary has debug info (cargo's dev profile)");
        };
        assert!(!table.is_empty());
        // This function's own address, as a file vaddr: PIE, so subtract
        // the load bias (found from /proc/self/maps).
        let here = line_table_of_this_test_binary_finds_this_function as *const () as u64;
        let image = crate::inspect::ProcessImage::open(std::process::id() as i32).unwrap();
        let module = image.modules().iter().find(|m| m.contains(here)).unwrap();
        let vaddr = here - module.bias();
        let loc = table.lookup(vaddr).expect("a line for this function");
        assert!(loc.file.ends_with("code.rs"), "{loc:?}");
        assert!(loc.line > 300, "{loc:?}");
    }
}
