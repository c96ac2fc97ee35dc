//! Source lines: the DWARF line tables (`.debug_line`) of an ELF file,
//! reduced to a sorted address → `file:line` table.
//!
//! Debug sections may be compressed (`SHF_COMPRESSED` with zlib or zstd, or
//! the older `.zdebug_*`): `object` inflates them. A unit whose DWARF is
//! broken is skipped rather than failing the whole table, since a name
//! without a line is still useful.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use object::read::elf::ElfFile64;
use object::{Endianness, Object as _, ObjectSection as _};

/// Largest debug section inflated: a section claiming more is corrupt (real
/// ones of the biggest programs stay well below).
const MAX_SECTION: u64 = 1 << 30;

/// A source position.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SourceLine {
    /// The source file as the compiler recorded it, joined with its
    /// directory (absolute when the compilation directory was).
    pub file: PathBuf,
    /// The line, from 1.
    pub line: u64,
}

impl fmt::Display for SourceLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file.display(), self.line)
    }
}

/// One sequence of rows (a contiguous range of code).
#[derive(Debug)]
struct Sequence {
    start: u64,
    end: u64,
    /// (address, index in `files`, line; 0 when the compiler gave none),
    /// ascending by address.
    rows: Vec<(u64, u32, u32)>,
}

/// An ELF file's line table.
#[derive(Debug, Default)]
pub(crate) struct LineTable {
    files: Vec<PathBuf>,
    /// Sorted by start.
    sequences: Vec<Sequence>,
}

impl LineTable {
    /// Reads the line table of the ELF file `data`; empty if it has no
    /// `.debug_line` or it cannot be parsed.
    pub fn parse(data: &[u8]) -> LineTable {
        let Ok(file) = ElfFile64::<Endianness>::parse(data) else {
            return LineTable::default();
        };
        if file.section_by_name(".debug_line").is_none() {
            return LineTable::default();
        }
        let mut loaded: HashMap<gimli::SectionId, Cow<'_, [u8]>> = HashMap::new();
        for id in [
            gimli::SectionId::DebugAbbrev,
            gimli::SectionId::DebugInfo,
            gimli::SectionId::DebugLine,
            gimli::SectionId::DebugLineStr,
            gimli::SectionId::DebugStr,
            gimli::SectionId::DebugStrOffsets,
            gimli::SectionId::DebugAddr,
        ] {
            let bytes = file
                .section_by_name(id.name())
                .and_then(|s| {
                    let c = s.compressed_data().ok()?;
                    (c.uncompressed_size <= MAX_SECTION).then_some(c)
                })
                .and_then(|c| c.decompress().ok());
            if let Some(b) = bytes {
                loaded.insert(id, b);
            }
        }
        let dwarf = gimli::Dwarf::load(|id| {
            Ok::<_, gimli::Error>(gimli::EndianSlice::new(
                loaded.get(&id).map_or(&[][..], |b| &b[..]),
                gimli::LittleEndian,
            ))
        });
        let Ok(dwarf) = dwarf else {
            return LineTable::default();
        };
        let mut table = LineTable::default();
        let mut units = dwarf.units();
        while let Ok(Some(header)) = units.next() {
            let Ok(unit) = dwarf.unit(header) else {
                continue;
            };
            table.add_unit(&dwarf, &unit);
        }
        // Code removed by the linker (--gc-sections, COMDAT duplicates) keeps
        // its rows at address 0 or a tombstone: no real function is there.
        table
            .sequences
            .retain(|s| s.start != 0 && s.start < u64::MAX - 1 && s.end > s.start);
        table.sequences.sort_by_key(|s| s.start);
        table
    }

    fn add_unit<R: gimli::Reader>(&mut self, dwarf: &gimli::Dwarf<R>, unit: &gimli::Unit<R>) {
        let Some(program) = unit.line_program.clone() else {
            return;
        };
        let comp_dir = unit
            .comp_dir
            .as_ref()
            .and_then(|d| d.to_string_lossy().ok())
            .map(|d| PathBuf::from(d.as_ref()));
        let mut file_ids: HashMap<u64, u32> = HashMap::new();
        let mut rows = program.rows();
        let mut current: Vec<(u64, u32, u32)> = Vec::new();
        // An error leaves the rest of the program unreadable: stop there.
        while let Ok(Some((header, row))) = rows.next_row() {
            if row.end_sequence() {
                if let Some(&(start, _, _)) = current.first() {
                    self.sequences.push(Sequence {
                        start,
                        end: row.address(),
                        rows: std::mem::take(&mut current),
                    });
                }
                continue;
            }
            let index = row.file_index();
            let file = match file_ids.get(&index) {
                Some(&f) => f,
                None => {
                    let path = row
                        .file(header)
                        .map(|f| file_path(dwarf, unit, header, f, comp_dir.as_deref()))
                        .unwrap_or_else(|| PathBuf::from("?"));
                    let id = u32::try_from(self.files.len()).unwrap_or(u32::MAX);
                    self.files.push(path);
                    file_ids.insert(index, id);
                    id
                }
            };
            let line = row
                .line()
                .map_or(0, |l| u32::try_from(l.get()).unwrap_or(u32::MAX));
            current.push((row.address(), file, line));
        }
        // A sequence left open by a broken program has no known end.
    }

    /// The line of the code at `vaddr`: the first row at the greatest
    /// address not above it, in the sequence holding it.
    pub fn find(&self, vaddr: u64) -> Option<SourceLine> {
        let i = self.sequences.partition_point(|s| s.start <= vaddr);
        // Sequences may overlap (duplicate code); look back a few.
        let seq = self.sequences[..i]
            .iter()
            .rev()
            .take(16)
            .find(|s| vaddr < s.end)?;
        let j = seq.rows.partition_point(|&(a, _, _)| a <= vaddr);
        let at = seq.rows.get(j.checked_sub(1)?)?.0;
        let first = seq.rows.partition_point(|&(a, _, _)| a < at);
        let &(_, file, line) = seq.rows[first..j].iter().find(|r| r.2 != 0)?;
        Some(SourceLine {
            file: self.files.get(file as usize)?.clone(),
            line: u64::from(line),
        })
    }

    /// Whether the table has no rows.
    pub fn is_empty(&self) -> bool {
        self.sequences.is_empty()
    }
}

/// The path of a line table's file entry: its directory (relative ones
/// under the compilation directory) joined with its name.
fn file_path<R: gimli::Reader>(
    dwarf: &gimli::Dwarf<R>,
    unit: &gimli::Unit<R>,
    header: &gimli::LineProgramHeader<R>,
    file: &gimli::FileEntry<R>,
    comp_dir: Option<&Path>,
) -> PathBuf {
    let text = |v: gimli::AttributeValue<R>| -> Option<String> {
        let r = dwarf.attr_string(unit, v).ok()?;
        let s = r.to_string_lossy().ok()?;
        Some(s.into_owned())
    };
    let name = text(file.path_name()).unwrap_or_else(|| "?".into());
    let mut path = comp_dir.map(Path::to_path_buf).unwrap_or_default();
    if let Some(dir) = file.directory(header).and_then(text) {
        path.push(dir);
    }
    path.push(name);
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> LineTable {
        LineTable {
            files: vec!["/src/a.c".into(), "/src/b.h".into()],
            sequences: vec![
                Sequence {
                    start: 0x1000,
                    end: 0x1040,
                    rows: vec![
                        (0x1000, 0, 10),
                        (0x1000, 0, 11),
                        (0x1008, 1, 3),
                        (0x1010, 0, 0),
                        (0x1020, 0, 12),
                    ],
                },
                Sequence {
                    start: 0x2000,
                    end: 0x2010,
                    rows: vec![(0x2000, 1, 7)],
                },
            ],
        }
    }

    #[test]
    fn lookups() {
        let t = table();
        let at = |a| t.find(a).map(|l| l.to_string());
        assert_eq!(at(0x1000).as_deref(), Some("/src/a.c:10"));
        assert_eq!(at(0x1004).as_deref(), Some("/src/a.c:10"));
        assert_eq!(at(0x1008).as_deref(), Some("/src/b.h:3"));
        assert_eq!(at(0x1010), None, "line 0: no line");
        assert_eq!(at(0x103f).as_deref(), Some("/src/a.c:12"));
        assert_eq!(at(0x1040), None, "past the sequence's end");
        assert_eq!(at(0xfff), None);
        assert_eq!(at(0x200f).as_deref(), Some("/src/b.h:7"));
    }

    #[test]
    fn not_elf_gives_an_empty_table() {
        assert!(LineTable::parse(b"nothing").is_empty());
    }
}
