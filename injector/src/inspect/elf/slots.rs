//! Pointer slots in the file's data: relocated words (RELA, RELR) that
//! hold a function's address, and IFUNC GOT slots.

use super::*;

/// What a pointer slot of an ELF file holds once relocated
/// ([`ElfImage::pointer_slot`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlotTarget {
    /// The function of this name, wherever the loader found it.
    Symbol(String),
    /// This file vaddr of the same file.
    Address(u64),
}

/// The slots a packed relative relocation section (`SHT_RELR`) names, in
/// order: an even entry is a slot (and the next one follows it); an odd
/// entry is a bitmap of the 63 words after the last slot named, bit 1 the
/// first of them, after which the next bitmap starts 63 words on.
pub(super) fn relr_slots(entries: impl Iterator<Item = u64>) -> Vec<u64> {
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

impl ElfImage {
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
}
