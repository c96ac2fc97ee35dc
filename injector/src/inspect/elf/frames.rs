//! Call-frame information (`.eh_frame`, `.eh_frame_hdr`): how a function's
//! frame looks at its entry, the rule for its return address at an
//! address, and the functions a stripped file's FDEs still tell.

use super::*;

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
pub(super) struct EntryFrames {
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

impl ElfImage {
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
    pub(super) fn add_eh_frame_functions<'d>(
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
}
