//! Malformed input never makes weft's parsers panic or hang (issue #4).
//!
//! A deterministic corpus of broken ELF files is derived from real ones (this
//! test binary, the system libc, small system libraries, weft's own binary):
//! truncations at every interesting offset, random byte flips in headers and
//! tables, and targeted corruptions of the ELF header, program and section
//! headers, symbol tables, string tables, relocations, version tables,
//! `.dynamic`, `.eh_frame` and `.eh_frame_hdr`. Every public parsing entry
//! point of `weft::inspect` runs on each variant, and so does the machine
//! code sweep of `weft::internals::BranchIndex` (which reads the executable
//! segments the corrupt headers describe). `/proc/PID/maps` and
//! `/proc/PID/stat` text and function patterns get the same treatment.
//!
//! Any result, `Ok` or `Err`, is fine; a panic is not. Panics are caught per
//! call, collected (call, variant description with every edit, panic location
//! and message, a backtrace for each new location) and reported together.
//! Each corpus runs on its own thread; the test fails if it does not finish
//! within [`DEADLINE`] (a hang detector, not a timing assertion).
//!
//! The variants are reproducible: the random generator is a fixed-seed
//! xorshift, and each reported variant lists the exact edits applied to the
//! named base file.

use crate::support;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};
use support::Rng;

use weft::inspect::{ElfHeaderInfo, ElfImage, Glob, Mapping, MappingPath, Module, Pattern, Perms};
use weft::internals::{
    free_gap_near, modules_from_maps, parse_maps, parse_stat_state, suggest, BranchIndex,
};

/// A corpus that has not finished after this long is taken to hang.
const DEADLINE: Duration = Duration::from_secs(120);
/// Stack of the corpus threads: the size of a main thread's stack, so that
/// a deep recursion is caught as it would be in weft itself.
const STACK_SIZE: usize = 8 << 20;
/// `BranchIndex::build` decodes every executable byte; variants whose
/// executable segments hold more than this are not swept, to keep the test
/// fast in debug builds (the targeted segment variants keep them small).
const SWEEP_LIMIT: u64 = 32 << 10;

// ---------------------------------------------------------------------------
// Catching panics with their location and a backtrace
// ---------------------------------------------------------------------------

/// A panic caught while calling a parser.
#[derive(Clone, Debug)]
struct Caught {
    location: String,
    message: String,
    /// Captured for the first panic at each location only (symbolizing is
    /// slow).
    backtrace: Option<String>,
}

thread_local! {
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
    static CAUGHT: RefCell<Option<Caught>> = const { RefCell::new(None) };
    static SEEN_LOCATIONS: RefCell<HashSet<String>> = RefCell::new(HashSet::new());
}

fn payload_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_owned()
    }
}

/// Keeps the interesting frames of a backtrace: from the panic site up to
/// this test's caller, without the standard library's panic machinery.
fn trim_backtrace(full: &str) -> String {
    let mut frames: Vec<Vec<&str>> = Vec::new();
    for line in full.lines() {
        let t = line.trim_start();
        let starts_frame = t
            .split_once(':')
            .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if starts_frame || frames.is_empty() {
            frames.push(vec![line]);
        } else if let Some(f) = frames.last_mut() {
            f.push(line);
        }
    }
    // The panic machinery ends with the frame that raised the panic.
    let machinery = [
        "core::panicking",
        "std::panicking",
        "rust_begin_unwind",
        "panic_const",
    ];
    let top = frames
        .iter()
        .position(|f| machinery.iter().any(|m| f[0].contains(m)))
        .unwrap_or(0);
    let first = top
        + frames[top..]
            .iter()
            .take_while(|f| machinery.iter().any(|m| f[0].contains(m)))
            .count();
    let mut out = String::new();
    let mut kept = 0;
    for f in &frames[first..] {
        let head = f[0];
        for l in f {
            out.push_str(l);
            out.push('\n');
        }
        kept += 1;
        if head.contains("malformed_input::") || kept >= 30 {
            break;
        }
    }
    out
}

/// Installs (once) a panic hook that records panics of threads inside
/// [`catch`] instead of printing them; other panics go to the old hook.
fn install_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !CAPTURING.with(Cell::get) {
                previous(info);
                return;
            }
            let location = info
                .location()
                .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()))
                .unwrap_or_else(|| "(unknown location)".to_owned());
            let first = SEEN_LOCATIONS.with(|s| s.borrow_mut().insert(location.clone()));
            let backtrace = first
                .then(|| trim_backtrace(&std::backtrace::Backtrace::force_capture().to_string()));
            let caught = Caught {
                location,
                message: payload_text(info.payload()),
                backtrace,
            };
            CAUGHT.with(|c| *c.borrow_mut() = Some(caught));
        }));
    });
}

/// Runs `f`, turning a panic into a [`Caught`].
fn catch<R>(f: impl FnOnce() -> R) -> Result<R, Caught> {
    CAPTURING.with(|c| c.set(true));
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    CAPTURING.with(|c| c.set(false));
    result.map_err(|payload| {
        CAUGHT
            .with(|c| c.borrow_mut().take())
            .unwrap_or_else(|| Caught {
                location: "(not recorded)".to_owned(),
                message: payload_text(&*payload),
                backtrace: None,
            })
    })
}

/// A panic, attributed to a call and an input.
struct PanicRecord {
    call: &'static str,
    input: String,
    caught: Caught,
}

/// Results of a corpus run.
#[derive(Default)]
struct Tally {
    /// Per entry point: (Ok, Err, panicked).
    calls: BTreeMap<&'static str, [u64; 3]>,
    /// Per entry point: time spent.
    time: BTreeMap<&'static str, Duration>,
    panics: Vec<PanicRecord>,
}

impl Tally {
    /// Calls `f` under [`catch`]; counts Ok / Err / panic. The error is
    /// formatted too, as a caller would show it.
    fn run<T, E: fmt::Display>(
        &mut self,
        call: &'static str,
        input: &str,
        f: impl FnOnce() -> Result<T, E>,
    ) -> Option<T> {
        let t0 = Instant::now();
        let result = catch(|| f().map_err(|e| e.to_string()));
        *self.time.entry(call).or_default() += t0.elapsed();
        let slot = self.calls.entry(call).or_default();
        match result {
            Ok(Ok(v)) => {
                slot[0] += 1;
                Some(v)
            }
            Ok(Err(_)) => {
                slot[1] += 1;
                None
            }
            Err(caught) => {
                slot[2] += 1;
                self.panics.push(PanicRecord {
                    call,
                    input: input.to_owned(),
                    caught,
                });
                None
            }
        }
    }

    /// For calls without an error case (`Option`, `bool`, ...): `Some` and
    /// `true` count as Ok.
    fn run_opt<T>(
        &mut self,
        call: &'static str,
        input: &str,
        f: impl FnOnce() -> Option<T>,
    ) -> Option<T> {
        self.run(call, input, || f().ok_or("none"))
    }

    fn print_calls(&self) {
        eprintln!(
            "  {:<34} {:>8} {:>8} {:>8} {:>10}",
            "entry point", "Ok", "Err", "panic", "time"
        );
        for (call, [ok, err, panicked]) in &self.calls {
            let time = self.time.get(call).copied().unwrap_or_default();
            eprintln!("  {call:<34} {ok:>8} {err:>8} {panicked:>8} {time:>10.2?}");
        }
        eprintln!("  (for calls returning Option or bool: Ok = Some/true, Err = None/false)");
    }

    /// Fails the test with every panic, grouped by call and location.
    fn assert_no_panics(&self, what: &str) {
        if self.panics.is_empty() {
            return;
        }
        let mut groups: BTreeMap<(&str, &str), Vec<&PanicRecord>> = BTreeMap::new();
        for p in &self.panics {
            groups
                .entry((p.call, p.caught.location.as_str()))
                .or_default()
                .push(p);
        }
        let mut report = format!(
            "{what}: {} call(s) panicked on malformed input, at {} distinct (call, location) pairs\n",
            self.panics.len(),
            groups.len()
        );
        for ((call, location), ps) in &groups {
            report.push_str(&format!(
                "\n=== {call} panicked {} time(s) at {location}\n    message: {}\n",
                ps.len(),
                ps[0].caught.message
            ));
            for p in ps.iter().take(5) {
                report.push_str(&format!("    input: {}\n", p.input));
            }
            if ps.len() > 5 {
                report.push_str(&format!("    ... and {} more inputs\n", ps.len() - 5));
            }
            if let Some(bt) = ps.iter().find_map(|p| p.caught.backtrace.as_ref()) {
                report.push_str("    backtrace:\n");
                for l in bt.lines() {
                    report.push_str("      ");
                    report.push_str(l);
                    report.push('\n');
                }
            }
        }
        panic!("{report}");
    }
}

/// Runs `f` on a thread of its own and waits at most [`DEADLINE`] for it.
/// `f` reports the input it is working on in the shared string, which a
/// timeout shows.
fn with_deadline<T: Send + 'static>(
    name: &str,
    f: impl FnOnce(Arc<Mutex<String>>) -> T + Send + 'static,
) -> T {
    install_hook();
    let progress = Arc::new(Mutex::new(String::from("(not started)")));
    let (tx, rx) = mpsc::channel();
    let p = progress.clone();
    let handle = std::thread::Builder::new()
        .name(name.to_owned())
        .stack_size(STACK_SIZE)
        .spawn(move || {
            let r = f(p);
            let _ = tx.send(());
            r
        })
        .expect("spawn corpus thread");
    match rx.recv_timeout(DEADLINE) {
        Ok(()) => handle.join().expect("corpus thread"),
        Err(RecvTimeoutError::Disconnected) => match handle.join() {
            Ok(r) => r,
            Err(e) => panic::resume_unwind(e),
        },
        Err(RecvTimeoutError::Timeout) => {
            let current = progress.lock().map(|s| s.clone()).unwrap_or_default();
            panic!(
                "{name}: not finished after {DEADLINE:?}: a parser hangs (or is pathologically \
                 slow) on this input: {current}"
            )
        }
    }
}

fn set_progress(progress: &Mutex<String>, what: &str) {
    if let Ok(mut p) = progress.lock() {
        p.clear();
        p.push_str(what);
    }
}

// ---------------------------------------------------------------------------
// ELF layout, read by hand from the pristine files
// ---------------------------------------------------------------------------

const EHDR: usize = 64;
const PHDR: usize = 56;
const SHDR: usize = 64;
const SYM: usize = 24;
const RELA: usize = 24;

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const PT_GNU_EH_FRAME: u32 = 0x6474_e550;
const PF_X: u32 = 1;

const SHT_PROGBITS: u32 = 1;
const SHT_SYMTAB: u32 = 2;
const SHT_RELA: u32 = 4;
const SHT_NOBITS: u32 = 8;
const SHT_REL: u32 = 9;
const SHT_DYNSYM: u32 = 11;
const SHT_GNU_VERSYM: u32 = 0x6fff_ffff;

/// Offsets of ELF header fields.
mod eh {
    pub const CLASS: usize = 4;
    pub const DATA: usize = 5;
    pub const TYPE: usize = 16;
    pub const MACHINE: usize = 18;
    pub const PHOFF: usize = 32;
    pub const SHOFF: usize = 40;
    pub const PHENTSIZE: usize = 54;
    pub const PHNUM: usize = 56;
    pub const SHENTSIZE: usize = 58;
    pub const SHNUM: usize = 60;
    pub const SHSTRNDX: usize = 62;
}

/// Offsets of program header fields.
mod ph {
    pub const TYPE: usize = 0;
    pub const FLAGS: usize = 4;
    pub const OFFSET: usize = 8;
    pub const VADDR: usize = 16;
    pub const FILESZ: usize = 32;
    pub const MEMSZ: usize = 40;
}

/// Offsets of section header fields.
mod sh {
    pub const NAME: usize = 0;
    pub const TYPE: usize = 4;
    pub const FLAGS: usize = 8;
    pub const ADDR: usize = 16;
    pub const OFFSET: usize = 24;
    pub const SIZE: usize = 32;
    pub const LINK: usize = 40;
    pub const INFO: usize = 44;
    pub const ENTSIZE: usize = 56;
}

fn rd(data: &[u8], at: usize, width: usize) -> Option<u64> {
    let b = data.get(at..at.checked_add(width)?)?;
    let mut v = [0u8; 8];
    v[..width].copy_from_slice(b);
    Some(u64::from_le_bytes(v))
}

fn rd16(data: &[u8], at: usize) -> usize {
    rd(data, at, 2).unwrap_or(0) as usize
}

fn rd32(data: &[u8], at: usize) -> u64 {
    rd(data, at, 4).unwrap_or(0)
}

fn rd64(data: &[u8], at: usize) -> u64 {
    rd(data, at, 8).unwrap_or(0)
}

#[derive(Clone, Debug)]
struct Seg {
    /// File offset of the program header.
    hdr: usize,
    p_type: u32,
    flags: u32,
    offset: u64,
    vaddr: u64,
    filesz: u64,
}

#[derive(Clone, Debug)]
struct Sect {
    index: usize,
    name: String,
    /// File offset of the section header.
    hdr: usize,
    name_off: u64,
    sh_type: u32,
    offset: u64,
    size: u64,
    link: usize,
}

impl Sect {
    fn start(&self) -> usize {
        self.offset as usize
    }
    fn end(&self) -> usize {
        (self.offset + self.size) as usize
    }
    fn has_bytes(&self, len: usize) -> bool {
        self.sh_type != SHT_NOBITS && self.size > 0 && self.end() <= len
    }
}

#[derive(Clone, Debug)]
struct Layout {
    phoff: usize,
    phnum: usize,
    shoff: usize,
    shnum: usize,
    segs: Vec<Seg>,
    sects: Vec<Sect>,
}

impl Layout {
    fn parse(data: &[u8]) -> Layout {
        assert!(data.len() >= EHDR && data[..4] == *b"\x7fELF", "not ELF");
        let phoff = rd64(data, eh::PHOFF) as usize;
        let phnum = rd16(data, eh::PHNUM);
        let shoff = rd64(data, eh::SHOFF) as usize;
        let shnum = rd16(data, eh::SHNUM);
        let shstrndx = rd16(data, eh::SHSTRNDX);
        let segs = (0..phnum)
            .map(|i| {
                let hdr = phoff + i * PHDR;
                Seg {
                    hdr,
                    p_type: rd32(data, hdr + ph::TYPE) as u32,
                    flags: rd32(data, hdr + ph::FLAGS) as u32,
                    offset: rd64(data, hdr + ph::OFFSET),
                    vaddr: rd64(data, hdr + ph::VADDR),
                    filesz: rd64(data, hdr + ph::FILESZ),
                }
            })
            .collect();
        let mut sects: Vec<Sect> = (0..shnum)
            .map(|index| {
                let hdr = shoff + index * SHDR;
                Sect {
                    index,
                    name: String::new(),
                    hdr,
                    name_off: rd32(data, hdr + sh::NAME),
                    sh_type: rd32(data, hdr + sh::TYPE) as u32,
                    offset: rd64(data, hdr + sh::OFFSET),
                    size: rd64(data, hdr + sh::SIZE),
                    link: rd32(data, hdr + sh::LINK) as usize,
                }
            })
            .collect();
        if let Some(strtab) = sects.get(shstrndx).cloned() {
            for s in &mut sects {
                let start = strtab.start() + s.name_off as usize;
                if let Some(bytes) = data.get(start..strtab.end().min(data.len())) {
                    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
                    s.name = String::from_utf8_lossy(&bytes[..end]).into_owned();
                }
            }
        }
        Layout {
            phoff,
            phnum,
            shoff,
            shnum,
            segs,
            sects,
        }
    }

    fn section(&self, name: &str) -> Option<&Sect> {
        self.sects.iter().find(|s| s.name == name)
    }

    fn seg(&self, p_type: u32) -> Option<&Seg> {
        self.segs.iter().find(|s| s.p_type == p_type)
    }
}

/// Sections whose corruption matters to the parsers.
const KEY_SECTIONS: &[&str] = &[
    ".dynsym",
    ".dynstr",
    ".symtab",
    ".strtab",
    ".shstrtab",
    ".eh_frame",
    ".eh_frame_hdr",
    ".dynamic",
    ".rela.dyn",
    ".rela.plt",
    ".gnu.version",
    ".gnu.version_d",
    ".gnu.version_r",
    ".text",
];

/// One entry of `.eh_frame`, found by walking the pristine section.
#[derive(Clone, Copy, Debug)]
struct EhEntry {
    /// File offset of the length field.
    off: usize,
    /// Bytes of the whole entry, length field included.
    total: usize,
    cie: bool,
}

fn eh_entries(data: &[u8], s: &Sect) -> Vec<EhEntry> {
    let mut out = Vec::new();
    let (mut pos, end) = (s.start(), s.end().min(data.len()));
    while pos + 8 <= end && out.len() < 1_000_000 {
        let len = rd32(data, pos);
        if len == 0 {
            break;
        }
        let (hdr, len) = if len == 0xffff_ffff {
            (12, rd64(data, pos + 4))
        } else {
            (4, len)
        };
        let id = rd32(data, pos + hdr);
        let total = hdr + len as usize;
        out.push(EhEntry {
            off: pos,
            total,
            cie: id == 0,
        });
        pos += total;
    }
    out
}

fn read_uleb(data: &[u8], mut at: usize) -> usize {
    // Returns the position after the LEB128 at `at`.
    while at < data.len() && data[at] & 0x80 != 0 {
        at += 1;
    }
    at + 1
}

// ---------------------------------------------------------------------------
// Edits and variants
// ---------------------------------------------------------------------------

/// One change to a base file; printed in reports so that a variant can be
/// rebuilt exactly.
#[derive(Clone, Copy, Debug)]
enum Edit {
    /// Keep only the first `n` bytes.
    Truncate(usize),
    /// Store `value` little-endian in `width` bytes at `at`.
    Put { at: usize, width: u8, value: u64 },
    /// XOR the byte at `at` with `mask`.
    Xor { at: usize, mask: u8 },
    /// Set `len` bytes from `at` to `byte`.
    Fill { at: usize, len: usize, byte: u8 },
}

impl Edit {
    fn apply(&self, d: &mut Vec<u8>) {
        match *self {
            Edit::Truncate(n) => d.truncate(n),
            Edit::Put { at, width, value } => {
                let w = width as usize;
                if let Some(b) = at.checked_add(w).and_then(|e| d.get_mut(at..e)) {
                    b.copy_from_slice(&value.to_le_bytes()[..w]);
                }
            }
            Edit::Xor { at, mask } => {
                if let Some(b) = d.get_mut(at) {
                    *b ^= mask;
                }
            }
            Edit::Fill { at, len, byte } => {
                let end = at.saturating_add(len).min(d.len());
                if at < end {
                    d[at..end].fill(byte);
                }
            }
        }
    }
}

impl fmt::Display for Edit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Edit::Truncate(n) => write!(f, "truncate to {n:#x}"),
            Edit::Put { at, width, value } => write!(f, "u{}@{at:#x}={value:#x}", width * 8),
            Edit::Xor { at, mask } => write!(f, "xor@{at:#x}^{mask:#04x}"),
            Edit::Fill { at, len, byte } => write!(f, "fill@{at:#x}+{len:#x}={byte:#04x}"),
        }
    }
}

fn put(at: usize, width: u8, value: u64) -> Edit {
    Edit::Put { at, width, value }
}

/// Removes the section header table, so that the parsers fall back to the
/// program headers (`PT_GNU_EH_FRAME`, executable `PT_LOAD`s).
fn no_sections() -> Vec<Edit> {
    vec![
        put(eh::SHOFF, 8, 0),
        put(eh::SHNUM, 2, 0),
        put(eh::SHSTRNDX, 2, 0),
    ]
}

#[derive(Clone, Debug)]
struct Variant {
    /// Kind of corruption, for the statistics.
    category: &'static str,
    label: String,
    edits: Vec<Edit>,
}

impl Variant {
    fn describe(&self, base: &str) -> String {
        let edits: Vec<String> = self.edits.iter().map(Edit::to_string).collect();
        format!("{base}: {} [{}]", self.label, edits.join(", "))
    }
}

/// Collects variants of one base file.
struct Gen<'a> {
    data: &'a [u8],
    l: &'a Layout,
    out: Vec<Variant>,
}

impl Gen<'_> {
    fn len(&self) -> usize {
        self.data.len()
    }

    fn add(&mut self, category: &'static str, label: impl Into<String>, edits: Vec<Edit>) {
        self.out.push(Variant {
            category,
            label: label.into(),
            edits,
        });
    }

    fn truncations(&mut self) {
        let l = self.l;
        let len = self.len();
        let mut at: Vec<usize> = vec![
            0, 1, 3, 4, 5, 6, 16, 17, 18, 19, 20, 24, 32, 40, 48, 52, 56, 58, 60, 62, 63, 64, 65,
        ];
        let phend = l.phoff + l.phnum * PHDR;
        at.extend([l.phoff, l.phoff + 1, l.phoff + PHDR / 2, phend - 1, phend]);
        at.extend((1..l.phnum).map(|i| l.phoff + i * PHDR));
        let shend = l.shoff + l.shnum * SHDR;
        at.extend([
            l.shoff,
            l.shoff + 1,
            l.shoff + SHDR,
            l.shoff + (l.shnum / 2) * SHDR + 7,
            shend - 1,
        ]);
        for s in l
            .sects
            .iter()
            .filter(|s| KEY_SECTIONS.contains(&s.name.as_str()))
        {
            if s.has_bytes(len) {
                let (a, n) = (s.start(), s.size as usize);
                at.extend([a, a + 1, a + n / 2, a + n - 1, a + n]);
            }
        }
        for s in l.segs.iter().filter(|s| s.p_type == PT_LOAD) {
            let (a, n) = (s.offset as usize, s.filesz as usize);
            at.extend([a + n / 3, a + n - 1]);
        }
        at.extend([len / 2, len * 9 / 10, len - 1]);
        at.sort_unstable();
        at.dedup();
        for n in at.into_iter().filter(|&n| n < len) {
            self.add(
                "truncation",
                format!("truncated at {n:#x}"),
                vec![Edit::Truncate(n)],
            );
        }
    }

    fn elf_header(&mut self) {
        let len = self.len() as u64;
        let shnum = self.l.shnum as u64;
        let c = "ELF header";
        self.add(c, "ELFCLASS32", vec![put(eh::CLASS, 1, 1)]);
        self.add(c, "big-endian", vec![put(eh::DATA, 1, 2)]);
        self.add(c, "e_machine i386", vec![put(eh::MACHINE, 2, 3)]);
        self.add(c, "e_type ET_REL", vec![put(eh::TYPE, 2, 1)]);
        self.add(c, "e_type ET_EXEC", vec![put(eh::TYPE, 2, 2)]);
        for v in [
            len,
            len - 1,
            len - PHDR as u64,
            u64::MAX,
            u64::MAX - 55,
            1 << 63,
            1,
            0,
        ] {
            self.add(c, "e_phoff out of range", vec![put(eh::PHOFF, 8, v)]);
        }
        for v in [0, 1, 0xffff] {
            self.add(c, "e_phnum", vec![put(eh::PHNUM, 2, v)]);
        }
        for v in [0, 1, 55, 57, 0xffff] {
            self.add(c, "e_phentsize", vec![put(eh::PHENTSIZE, 2, v)]);
        }
        for v in [
            len,
            len - 1,
            len - SHDR as u64,
            u64::MAX,
            u64::MAX - 63,
            1 << 63,
            1,
            4,
        ] {
            self.add(c, "e_shoff out of range", vec![put(eh::SHOFF, 8, v)]);
        }
        for v in [0, 1, shnum + 1, 0xff00, 0xffff] {
            self.add(c, "e_shnum", vec![put(eh::SHNUM, 2, v)]);
        }
        for v in [0, 1, 63, 65, 0xffff] {
            self.add(c, "e_shentsize", vec![put(eh::SHENTSIZE, 2, v)]);
        }
        for v in [0, shnum, 0xfeff, 0xffff] {
            self.add(c, "e_shstrndx", vec![put(eh::SHSTRNDX, 2, v)]);
        }
        if let Some(s) = self.l.section(".dynstr") {
            let i = s.index as u64;
            self.add(c, "e_shstrndx is .dynstr", vec![put(eh::SHSTRNDX, 2, i)]);
        }
        if let Some(s) = self.l.section(".text") {
            let i = s.index as u64;
            self.add(c, "e_shstrndx is .text", vec![put(eh::SHSTRNDX, 2, i)]);
        }
        // Extended numbering: counts in section 0.
        let s0 = self.l.shoff;
        for v in [0xffff_ffff, u64::MAX, shnum * 2, shnum - 1] {
            self.add(
                c,
                "e_shnum 0, section 0 sh_size holds the count",
                vec![put(eh::SHNUM, 2, 0), put(s0 + sh::SIZE, 8, v)],
            );
        }
        for v in [u32::MAX as u64, shnum, 0] {
            self.add(
                c,
                "e_shstrndx SHN_XINDEX, section 0 sh_link holds it",
                vec![put(eh::SHSTRNDX, 2, 0xffff), put(s0 + sh::LINK, 4, v)],
            );
        }
        self.add(c, "no section headers", no_sections());
    }

    fn program_headers(&mut self) {
        let len = self.len() as u64;
        let c = "program header";
        for (i, s) in self.l.segs.clone().iter().enumerate() {
            let interesting =
                matches!(s.p_type, PT_LOAD | PT_DYNAMIC | PT_INTERP | PT_GNU_EH_FRAME);
            if !interesting {
                continue;
            }
            let h = s.hdr;
            let label = |what: &str| format!("phdr {i} (p_type {:#x}): {what}", s.p_type);
            for v in [len, len - 1, u64::MAX, u64::MAX - 7] {
                self.add(
                    c,
                    label("p_offset out of range"),
                    vec![put(h + ph::OFFSET, 8, v)],
                );
            }
            for v in [u64::MAX, len + 1, 0, 17] {
                self.add(c, label("p_filesz"), vec![put(h + ph::FILESZ, 8, v)]);
            }
            self.add(
                c,
                label("p_memsz huge"),
                vec![put(h + ph::MEMSZ, 8, u64::MAX)],
            );
            for v in [u64::MAX - 0xfff, u64::MAX] {
                self.add(
                    c,
                    label("p_vaddr near the top"),
                    vec![put(h + ph::VADDR, 8, v)],
                );
            }
            if s.p_type == PT_LOAD && s.flags & PF_X != 0 {
                // Small sweeps (see SWEEP_LIMIT) with absurd addresses.
                self.add(
                    c,
                    label("executable segment at the top of the address space"),
                    vec![
                        put(h + ph::VADDR, 8, u64::MAX - 0xfff),
                        put(h + ph::FILESZ, 8, 0x2000),
                    ],
                );
                self.add(
                    c,
                    label("executable segment ending at 2^64"),
                    vec![
                        put(h + ph::VADDR, 8, u64::MAX - 0x1fff),
                        put(h + ph::FILESZ, 8, 0x2000),
                    ],
                );
                self.add(
                    c,
                    label("executable segment past the end of the file"),
                    vec![
                        put(h + ph::OFFSET, 8, len - 0x100),
                        put(h + ph::FILESZ, 8, 0x1000),
                    ],
                );
                self.add(
                    c,
                    label("executable segment at offset len"),
                    vec![put(h + ph::OFFSET, 8, len), put(h + ph::FILESZ, 8, 0x1000)],
                );
                self.add(
                    c,
                    label("tiny executable segment, stripped"),
                    [put(h + ph::FILESZ, 8, 0x800)]
                        .into_iter()
                        .chain(no_sections())
                        .collect(),
                );
            }
            if s.p_type == PT_GNU_EH_FRAME || s.p_type == PT_LOAD {
                let mut e = no_sections();
                e.push(put(h + ph::FILESZ, 8, u64::MAX));
                self.add(c, label("p_filesz huge, no section headers"), e);
                let mut e = no_sections();
                e.push(put(h + ph::VADDR, 8, u64::MAX - 0xfff));
                self.add(c, label("p_vaddr near the top, no section headers"), e);
                let mut e = no_sections();
                e.push(put(h + ph::OFFSET, 8, len));
                self.add(c, label("p_offset = len, no section headers"), e);
            }
        }
        // Every header a PT_LOAD, all executable.
        let mut e = Vec::new();
        for s in &self.l.segs {
            e.push(put(s.hdr + ph::TYPE, 4, PT_LOAD as u64));
            e.push(put(s.hdr + ph::FLAGS, 4, 7));
        }
        self.add(c, "every program header an RWX PT_LOAD", e);
        let mut e = Vec::new();
        for s in &self.l.segs {
            e.push(put(s.hdr + ph::TYPE, 4, PT_GNU_EH_FRAME as u64));
        }
        self.add(c, "every program header PT_GNU_EH_FRAME", e);
    }

    fn section_headers(&mut self) {
        let len = self.len() as u64;
        let shnum = self.l.shnum as u64;
        let c = "section header";
        let text = self.l.section(".text").cloned();
        let eh_frame = self.l.section(".eh_frame").cloned();
        let mut picked: Vec<Sect> = self
            .l
            .sects
            .iter()
            .filter(|s| KEY_SECTIONS.contains(&s.name.as_str()))
            .cloned()
            .collect();
        picked.extend(self.l.sects.first().cloned());
        picked.extend(self.l.sects.last().cloned());
        for s in &picked {
            let h = s.hdr;
            let label = |what: &str| format!("section {} {}: {what}", s.index, s.name);
            for v in [len, len - 1, u64::MAX, u64::MAX - 7, 0] {
                self.add(c, label("sh_offset"), vec![put(h + sh::OFFSET, 8, v)]);
            }
            if let Some(t) = &text {
                self.add(
                    c,
                    label("sh_offset overlaps .text"),
                    vec![put(h + sh::OFFSET, 8, t.offset)],
                );
            }
            for v in [
                0,
                u64::MAX,
                len,
                s.size + 1,
                s.size.saturating_sub(1),
                1 << 62,
            ] {
                self.add(c, label("sh_size"), vec![put(h + sh::SIZE, 8, v)]);
            }
            for v in [0, s.index as u64, shnum, u32::MAX as u64] {
                self.add(c, label("sh_link"), vec![put(h + sh::LINK, 4, v)]);
            }
            if let Some(t) = &text {
                let v = t.index as u64;
                self.add(c, label("sh_link is .text"), vec![put(h + sh::LINK, 4, v)]);
            }
            self.add(
                c,
                label("sh_info huge"),
                vec![put(h + sh::INFO, 4, u32::MAX as u64)],
            );
            for v in [0, 1, 7, u64::MAX] {
                self.add(c, label("sh_entsize"), vec![put(h + sh::ENTSIZE, 8, v)]);
            }
            for (v, what) in [
                (SHT_NOBITS, "SHT_NOBITS"),
                (0, "SHT_NULL"),
                (SHT_SYMTAB, "SHT_SYMTAB"),
                (SHT_DYNSYM, "SHT_DYNSYM"),
                (SHT_RELA, "SHT_RELA"),
                (SHT_REL, "SHT_REL"),
                (SHT_GNU_VERSYM, "SHT_GNU_versym"),
                (SHT_PROGBITS, "SHT_PROGBITS"),
            ] {
                if v != s.sh_type {
                    self.add(c, label(what), vec![put(h + sh::TYPE, 4, v as u64)]);
                }
            }
            for v in [0, u64::MAX] {
                self.add(c, label("sh_flags"), vec![put(h + sh::FLAGS, 8, v)]);
            }
            for v in [u64::MAX, u64::MAX - s.size / 2] {
                self.add(
                    c,
                    label("sh_addr near the top"),
                    vec![put(h + sh::ADDR, 8, v)],
                );
            }
            self.add(
                c,
                label("sh_name huge"),
                vec![put(h + sh::NAME, 4, u32::MAX as u64)],
            );
            if let Some(e) = &eh_frame {
                if e.index != s.index {
                    self.add(
                        c,
                        label("renamed .eh_frame (an earlier .eh_frame wins)"),
                        vec![put(h + sh::NAME, 4, e.name_off)],
                    );
                }
            }
        }
        // Two sections sharing their bytes with the section header table.
        if let (Some(a), Some(b)) = (self.l.section(".dynsym"), self.l.section(".dynstr")) {
            let so = self.l.shoff as u64;
            self.add(
                c,
                "symbols and strings are the section header table",
                vec![
                    put(a.hdr + sh::OFFSET, 8, so),
                    put(b.hdr + sh::OFFSET, 8, so),
                ],
            );
        }
    }

    fn symbols(&mut self, rng: &mut Rng) {
        let len = self.len();
        let c = "symbol";
        for name in [".dynsym", ".symtab"] {
            let Some(s) = self.l.section(name).cloned() else {
                continue;
            };
            if !s.has_bytes(len) {
                continue;
            }
            let count = s.size as usize / SYM;
            if count < 2 {
                continue;
            }
            let strsize = self.l.sects.get(s.link).map_or(0, |t| t.size);
            let mut idx = vec![1, 2, count - 1];
            for _ in 0..3 {
                idx.push(1 + rng.index(count - 1));
            }
            idx.retain(|&i| i > 0 && i < count);
            idx.sort_unstable();
            idx.dedup();
            for i in idx {
                let o = s.start() + i * SYM;
                let label = |what: &str| format!("{name}[{i}]: {what}");
                for v in [strsize, strsize.saturating_sub(1), u32::MAX as u64] {
                    self.add(
                        c,
                        label("st_name out of the string table"),
                        vec![put(o, 4, v)],
                    );
                }
                for v in [self.l.shnum as u64, 0xfff1, 0xffff, 0xff00] {
                    self.add(c, label("st_shndx"), vec![put(o + 6, 2, v)]);
                }
                self.add(c, label("st_value huge"), vec![put(o + 8, 8, u64::MAX)]);
                self.add(c, label("st_size huge"), vec![put(o + 16, 8, u64::MAX)]);
                self.add(
                    c,
                    label("st_value and st_size huge"),
                    vec![put(o + 8, 8, u64::MAX - 1), put(o + 16, 8, u64::MAX)],
                );
                for (v, what) in [(0x1a, "GLOBAL IFUNC"), (0x12, "GLOBAL FUNC")] {
                    self.add(c, label(what), vec![put(o + 4, 1, v)]);
                }
            }
            if let Some(t) = self.l.sects.get(s.link).cloned() {
                if t.has_bytes(len) {
                    let n = (t.size as usize).min(16);
                    self.add(
                        c,
                        format!("{} (strings of {name}) not NUL-terminated", t.name),
                        vec![Edit::Fill {
                            at: t.end() - n,
                            len: n,
                            byte: b'A',
                        }],
                    );
                    self.add(
                        c,
                        format!("{} (strings of {name}) all 0xff", t.name),
                        vec![Edit::Fill {
                            at: t.start(),
                            len: t.size as usize,
                            byte: 0xff,
                        }],
                    );
                }
            }
            self.add(
                c,
                format!("{name}: every entry 0xff"),
                vec![Edit::Fill {
                    at: s.start(),
                    len: s.size as usize,
                    byte: 0xff,
                }],
            );
        }
    }

    fn relocations(&mut self, rng: &mut Rng, resolver: u64) {
        let len = self.len();
        let c = "relocation";
        for name in [".rela.dyn", ".rela.plt"] {
            let Some(s) = self.l.section(name).cloned() else {
                continue;
            };
            if !s.has_bytes(len) || s.size < RELA as u64 {
                continue;
            }
            let count = s.size as usize / RELA;
            let mut idx = vec![0, count - 1, rng.index(count), rng.index(count)];
            idx.sort_unstable();
            idx.dedup();
            let dynsyms = self.l.section(".dynsym").map_or(0, |d| d.size / SYM as u64);
            for i in idx {
                let o = s.start() + i * RELA;
                let label = |what: &str| format!("{name}[{i}]: {what}");
                for (v, what) in [
                    ((0xffff_ffff << 32) | 7, "JUMP_SLOT of symbol 2^32-1"),
                    ((0xffff_ffff << 32) | 6, "GLOB_DAT of symbol 2^32-1"),
                    ((dynsyms << 32) | 7, "JUMP_SLOT of the symbol past the end"),
                    (u64::MAX, "r_info all ones"),
                ] {
                    self.add(c, label(what), vec![put(o + 8, 8, v)]);
                }
                self.add(
                    c,
                    label("IRELATIVE of the probed resolver, r_offset huge"),
                    vec![
                        put(o, 8, u64::MAX),
                        put(o + 8, 8, 37),
                        put(o + 16, 8, resolver),
                    ],
                );
            }
            self.add(
                c,
                format!("{name}: partial last entry"),
                vec![put(s.hdr + sh::SIZE, 8, s.size - 1)],
            );
        }
    }

    fn versions(&mut self, rng: &mut Rng) {
        let len = self.len();
        let c = "symbol versions";
        if let Some(s) = self.l.section(".gnu.version").cloned() {
            if s.has_bytes(len) && s.size >= 4 {
                let count = s.size as usize / 2;
                let mut idx = vec![1, count - 1, rng.index(count)];
                idx.dedup();
                for i in idx {
                    for v in [0x7fff, 0xffff, 0x8002, 2] {
                        self.add(
                            c,
                            format!(".gnu.version[{i}]"),
                            vec![put(s.start() + 2 * i, 2, v)],
                        );
                    }
                }
                for v in [2, 0] {
                    self.add(
                        c,
                        ".gnu.version shorter than .dynsym",
                        vec![put(s.hdr + sh::SIZE, 8, v)],
                    );
                }
            }
        }
        if let Some(s) = self.l.section(".gnu.version_d").cloned() {
            if s.has_bytes(len) {
                let o = s.start();
                let vd_aux = rd32(self.data, o + 12) as usize;
                for (at, width, v, what) in [
                    (o, 2, 0, "vd_version 0"),
                    (o, 2, 2, "vd_version 2"),
                    (o + 6, 2, 0xffff, "vd_cnt huge"),
                    (o + 12, 4, u32::MAX as u64, "vd_aux huge"),
                    (o + 12, 4, 0, "vd_aux 0"),
                    (o + 16, 4, u32::MAX as u64, "vd_next huge"),
                    (o + 16, 4, 1, "vd_next misaligned"),
                    (o + vd_aux, 4, u32::MAX as u64, "vda_name huge"),
                    (o + vd_aux + 4, 4, u32::MAX as u64, "vda_next huge"),
                    (s.hdr + sh::INFO, 4, u32::MAX as u64, "sh_info (count) huge"),
                ] {
                    self.add(
                        c,
                        format!(".gnu.version_d: {what}"),
                        vec![put(at, width, v)],
                    );
                }
            }
        }
        if let Some(s) = self.l.section(".gnu.version_r").cloned() {
            if s.has_bytes(len) {
                let o = s.start();
                let vn_aux = rd32(self.data, o + 8) as usize;
                for (at, width, v, what) in [
                    (o, 2, 0, "vn_version 0"),
                    (o, 2, 2, "vn_version 2"),
                    (o + 2, 2, 0xffff, "vn_cnt huge"),
                    (o + 4, 4, u32::MAX as u64, "vn_file huge"),
                    (o + 8, 4, u32::MAX as u64, "vn_aux huge"),
                    (o + 8, 4, 0, "vn_aux 0"),
                    (o + 12, 4, u32::MAX as u64, "vn_next huge"),
                    (o + vn_aux + 6, 2, 0x7fff, "vna_other huge"),
                    (o + vn_aux + 6, 2, 0xffff, "vna_other 0xffff"),
                    (o + vn_aux + 8, 4, u32::MAX as u64, "vna_name huge"),
                    (o + vn_aux + 12, 4, u32::MAX as u64, "vna_next huge"),
                    (s.hdr + sh::INFO, 4, u32::MAX as u64, "sh_info (count) huge"),
                ] {
                    self.add(
                        c,
                        format!(".gnu.version_r: {what}"),
                        vec![put(at, width, v)],
                    );
                }
            }
        }
    }

    fn dynamic(&mut self) {
        let len = self.len();
        let c = "dynamic";
        let Some(s) = self.l.section(".dynamic").cloned() else {
            return;
        };
        if !s.has_bytes(len) {
            return;
        }
        for byte in [0x41, 0xff, 0] {
            self.add(
                c,
                format!(".dynamic filled with {byte:#04x} (no DT_NULL)"),
                vec![Edit::Fill {
                    at: s.start(),
                    len: s.size as usize,
                    byte,
                }],
            );
        }
        let mut seen = HashSet::new();
        for e in (s.start()..s.end()).step_by(16) {
            let tag = rd64(self.data, e);
            if tag == 0 {
                break;
            }
            if seen.insert(tag) {
                self.add(
                    c,
                    format!(".dynamic tag {tag:#x}: value huge"),
                    vec![put(e + 8, 8, u64::MAX)],
                );
            }
        }
        if let Some(p) = self.l.seg(PT_DYNAMIC) {
            let h = p.hdr;
            self.add(
                c,
                "PT_DYNAMIC at the last 8 bytes",
                vec![
                    put(h + ph::OFFSET, 8, len as u64 - 8),
                    put(h + ph::FILESZ, 8, 8),
                ],
            );
        }
    }

    fn eh_frame(&mut self) {
        let len = self.len();
        let c = ".eh_frame";
        let Some(s) = self.l.section(".eh_frame").cloned() else {
            return;
        };
        if !s.has_bytes(len) {
            return;
        }
        let entries = eh_entries(self.data, &s);
        let fdes: Vec<EhEntry> = entries.iter().copied().filter(|e| !e.cie).collect();
        let cies: Vec<EhEntry> = entries.iter().copied().filter(|e| e.cie).collect();
        let mut picked: Vec<(&str, EhEntry)> = Vec::new();
        picked.extend(cies.first().map(|e| ("first CIE", *e)));
        picked.extend(cies.last().map(|e| ("last CIE", *e)));
        picked.extend(fdes.first().map(|e| ("first FDE", *e)));
        picked.extend(fdes.get(fdes.len() / 2).map(|e| ("middle FDE", *e)));
        picked.extend(fdes.last().map(|e| ("last FDE", *e)));
        let (start, end) = (s.start(), s.end());
        for (which, e) in picked {
            let o = e.off;
            let label = |what: &str| format!(".eh_frame {which} at {o:#x}: {what}");
            let past_end = (end - o) as u64;
            for (v, what) in [
                (u64::MAX, "64-bit length 2^64-1"),
                (past_end, "64-bit length one past the section"),
                (0, "64-bit length 0"),
                (1 << 40, "64-bit length 2^40"),
            ] {
                self.add(
                    c,
                    label(what),
                    vec![put(o, 4, 0xffff_ffff), put(o + 4, 8, v)],
                );
            }
            for (v, what) in [
                (0xffff_fff0, "length 0xfffffff0 (reserved)"),
                (0xffff_fffe, "length 0xfffffffe"),
                (past_end - 3, "length one past the section"),
                (0, "length 0 (early terminator)"),
                (1, "length 1"),
                (3, "length 3"),
                (4, "length 4 (id only)"),
            ] {
                self.add(c, label(what), vec![put(o, 4, v)]);
            }
            if e.cie {
                let aug = o + 9;
                let aug_end = self.data[aug..o + e.total]
                    .iter()
                    .position(|&b| b == 0)
                    .map_or(o + e.total, |p| aug + p);
                for (v, what) in [(0, "version 0"), (2, "version 2"), (0xff, "version 255")] {
                    self.add(c, label(what), vec![put(o + 8, 1, v)]);
                }
                self.add(
                    c,
                    label("augmentation string without NUL"),
                    vec![Edit::Fill {
                        at: aug,
                        len: o + e.total - aug,
                        byte: b'z',
                    }],
                );
                self.add(
                    c,
                    label("unknown augmentation"),
                    vec![put(aug, 1, b'Q' as u64)],
                );
                for byte in [0xff, 0x80] {
                    self.add(
                        c,
                        label("endless LEB128 fields"),
                        vec![Edit::Fill {
                            at: aug_end + 1,
                            len: (o + e.total).saturating_sub(aug_end + 1),
                            byte,
                        }],
                    );
                }
                // code_align, data_align, return register, augmentation
                // length, then the augmentation data ('R': FDE encoding).
                let mut p = aug_end + 1;
                for _ in 0..3 {
                    p = read_uleb(self.data, p);
                }
                let aug_len_at = p;
                let data_at = read_uleb(self.data, p);
                self.add(
                    c,
                    label("augmentation length huge"),
                    vec![Edit::Fill {
                        at: aug_len_at,
                        len: 4,
                        byte: 0xff,
                    }],
                );
                if data_at < o + e.total {
                    for enc in [0xff, 0x80, 0x50, 0x0c, 0x0f, 0x9b, 0x00, 0x04] {
                        self.add(
                            c,
                            label(&format!("pointer encoding {enc:#04x}")),
                            vec![put(data_at, 1, enc)],
                        );
                    }
                }
            } else {
                let rel = o + 4 - start; // distance from the section start
                for (v, what) in [
                    (0, "CIE pointer 0 (looks like a CIE)"),
                    (u32::MAX as u64, "CIE pointer 2^32-1"),
                    (rel as u64 + 4, "CIE pointer before the section"),
                    (4, "CIE pointer to itself"),
                    (2, "CIE pointer into its own length"),
                ] {
                    self.add(c, label(what), vec![put(o + 4, 4, v)]);
                }
                if let Some(other) = fdes.iter().find(|f| f.off < o) {
                    self.add(
                        c,
                        label("CIE pointer to another FDE"),
                        vec![put(o + 4, 4, (o + 4 - other.off) as u64)],
                    );
                }
                if let Some(cie) = cies.iter().find(|f| f.off < o) {
                    self.add(
                        c,
                        label("CIE pointer into the middle of a CIE"),
                        vec![put(o + 4, 4, (o + 4 - cie.off - 6) as u64)],
                    );
                }
                for (at, v, what) in [
                    (o + 8, 0x7fff_ffff, "pc_begin 0x7fffffff"),
                    (o + 8, 0x8000_0000, "pc_begin -2^31"),
                    (o + 12, u32::MAX as u64, "pc_range 2^32-1"),
                ] {
                    self.add(c, label(what), vec![put(at, 4, v)]);
                }
                self.add(
                    c,
                    label("augmentation length huge"),
                    vec![Edit::Fill {
                        at: o + 16,
                        len: 5,
                        byte: 0xff,
                    }],
                );
                self.add(
                    c,
                    label("body all 0xff"),
                    vec![Edit::Fill {
                        at: o + 8,
                        len: e.total - 8,
                        byte: 0xff,
                    }],
                );
            }
            // The same entry corruption when .eh_frame is found through
            // .eh_frame_hdr (no section headers).
            for (v, what) in [
                (u64::MAX, "64-bit length 2^64-1"),
                (past_end, "64-bit length past the end"),
            ] {
                let mut edits = no_sections();
                edits.extend([put(o, 4, 0xffff_ffff), put(o + 4, 8, v)]);
                self.add(c, label(&format!("{what}, no section headers")), edits);
            }
            let mut edits = no_sections();
            edits.push(put(o, 4, 0xffff_fff0));
            self.add(c, label("length 0xfffffff0, no section headers"), edits);
        }
        for byte in [0xff, 0x00, 0x41] {
            let fill = Edit::Fill {
                at: start,
                len: end - start,
                byte,
            };
            self.add(c, format!(".eh_frame filled with {byte:#04x}"), vec![fill]);
            let mut edits = no_sections();
            edits.push(fill);
            self.add(
                c,
                format!(".eh_frame filled with {byte:#04x}, no section headers"),
                edits,
            );
        }
        // Without section headers the walk runs to the end of the PT_LOAD:
        // remove the terminator.
        if let Some(last) = entries.last() {
            let term = last.off + last.total;
            let mut edits = no_sections();
            edits.push(Edit::Fill {
                at: term,
                len: 4,
                byte: 0xff,
            });
            self.add(c, ".eh_frame without terminator, no section headers", edits);
        }
    }

    fn eh_frame_hdr(&mut self) {
        let Some(p) = self.l.seg(PT_GNU_EH_FRAME).cloned() else {
            return;
        };
        let c = ".eh_frame_hdr";
        let h = p.offset as usize;
        for (at, width, v, what) in [
            (h, 1, 0, "version 0"),
            (h, 1, 2, "version 2"),
            (h + 1, 1, 0xff, "eh_frame_ptr omitted"),
            (h + 1, 1, 0x9b, "eh_frame_ptr indirect"),
            (h + 1, 1, 0x50, "eh_frame_ptr aligned"),
            (h + 1, 1, 0x0c, "eh_frame_ptr bad format"),
            (h + 1, 1, 0x00, "eh_frame_ptr absptr"),
            (h + 1, 1, 0x30, "eh_frame_ptr datarel"),
            (h + 4, 4, 0x7fff_ffff, "eh_frame_ptr +2^31"),
            (h + 4, 4, 0x8000_0000, "eh_frame_ptr -2^31"),
            (h + 4, 4, 0, "eh_frame_ptr to the header itself"),
            (h + 4, 4, u32::MAX as u64, "eh_frame_ptr -1"),
            (h + 2, 1, 0xff, "fde_count omitted"),
            (h + 8, 4, u32::MAX as u64, "fde_count huge"),
            (h + 3, 1, 0x0f, "table encoding bad"),
        ] {
            let mut edits = no_sections();
            edits.push(put(at, width, v));
            self.add(c, format!("{what}, no section headers"), edits);
            self.add(c, what, vec![put(at, width, v)]);
        }
    }

    /// `n` variants with 1 to 8 random changes each, mostly in the headers
    /// and tables.
    fn random(&mut self, n: usize, rng: &mut Rng) {
        let len = self.len();
        let l = self.l;
        let phend = (l.phoff + l.phnum * PHDR).max(EHDR);
        let shend = l.shoff + l.shnum * SHDR;
        let tables: Vec<(usize, usize)> = l
            .sects
            .iter()
            .filter(|s| KEY_SECTIONS.contains(&s.name.as_str()) && s.has_bytes(len))
            .map(|s| (s.start(), s.end()))
            .collect();
        for i in 0..n {
            let seed = rng.next();
            let mut r = Rng::new(seed);
            let mut edits = Vec::new();
            for _ in 0..=r.below(8) {
                let (lo, hi) = match r.below(100) {
                    0..=29 => (0, phend),
                    30..=49 => (l.shoff, shend),
                    50..=84 if !tables.is_empty() => r.pick(&tables),
                    _ => (0, len),
                };
                let at = lo + r.index(hi - lo);
                edits.push(match r.below(10) {
                    0..=3 => Edit::Xor {
                        at,
                        mask: 1 << r.below(8),
                    },
                    4..=5 => put(at, 1, r.below(256)),
                    _ => {
                        let width = r.pick(&[2u8, 4, 8]);
                        let at = at & !(width as usize - 1);
                        let any = r.next();
                        let value = r.pick(&[
                            0,
                            u64::MAX,
                            u32::MAX as u64,
                            0x7fff_ffff,
                            0x8000_0000,
                            len as u64,
                            len as u64 + 1,
                            any,
                        ]);
                        put(at, width, value)
                    }
                });
            }
            self.add("random", format!("random #{i} (seed {seed:#x})"), edits);
        }
    }
}

/// How many variants of each kind a base file gets; big files (debug Rust
/// binaries) are slow to parse, so they get a sample.
struct Budget {
    random: usize,
    /// Cap on the targeted and truncation variants (sampled if more).
    targeted: usize,
}

impl Budget {
    /// Parsing a file in a debug build costs about 1 ms per 60 KiB: small
    /// files get every targeted variant, big ones a sample.
    fn for_size(len: usize) -> Budget {
        let (targeted, random) = match len {
            0..=0xffff => (usize::MAX, 250),
            0x1_0000..=0xf_ffff => (500, 80),
            0x10_0000..=0x3f_ffff => (200, 40),
            _ => (10, 4),
        };
        Budget { random, targeted }
    }
}

fn variants(data: &[u8], l: &Layout, resolver: u64, budget: &Budget, seed: u64) -> Vec<Variant> {
    let mut rng = Rng::new(seed);
    let mut g = Gen {
        data,
        l,
        out: Vec::new(),
    };
    g.truncations();
    g.elf_header();
    g.program_headers();
    g.section_headers();
    g.symbols(&mut rng);
    g.relocations(&mut rng, resolver);
    g.versions(&mut rng);
    g.dynamic();
    g.eh_frame();
    g.eh_frame_hdr();
    let mut targeted = g.out.split_off(0);
    if targeted.len() > budget.targeted {
        // Deterministic sample that keeps the original order.
        let mut keys: Vec<(u64, usize)> = (0..targeted.len()).map(|i| (rng.next(), i)).collect();
        keys.sort_unstable();
        let mut keep: Vec<usize> = keys[..budget.targeted].iter().map(|&(_, i)| i).collect();
        keep.sort_unstable();
        targeted = keep.into_iter().map(|i| targeted[i].clone()).collect();
    }
    g.random(budget.random, &mut rng);
    targeted.append(&mut g.out);
    targeted
}

// ---------------------------------------------------------------------------
// The ELF corpus
// ---------------------------------------------------------------------------

struct Base {
    name: String,
    path: PathBuf,
    data: Vec<u8>,
    layout: Layout,
    /// An IFUNC of the pristine file and its resolver, for
    /// `ifunc_got_slots` (`malloc`, 0 if there is none).
    ifunc: (String, u64),
    /// Mappings of the pristine file in an imaginary process.
    maps: Vec<Mapping>,
    /// Whether a `Module` can be made for it (for `BranchIndex::build`).
    has_module: bool,
}

/// The path of the libc this test runs with, from its own mappings.
fn own_libc() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libc.so"))
        })
        .map(PathBuf::from)
}

fn fake_mapping(path: &Path, start: u64, len: u64, offset: u64, exec: bool) -> Mapping {
    Mapping {
        start,
        end: start + len,
        perms: Perms {
            read: true,
            write: false,
            exec,
            shared: false,
        },
        offset,
        dev: (0, 0),
        inode: 0,
        path: MappingPath::File {
            path: path.to_path_buf(),
            deleted: false,
        },
    }
}

/// A small C program with a `.symtab` (the system libraries are stripped)
/// and an IFUNC, built with gcc; `None` if gcc is missing.
fn tiny_c_program() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("malformed_input");
    std::fs::create_dir_all(&dir).ok()?;
    let src = dir.join("tiny.c");
    std::fs::write(
        &src,
        r#"#include <stdio.h>
static int impl_a(int x) { return x + 1; }
static int (*resolve_f(void))(int) { return impl_a; }
int f(int) __attribute__((ifunc("resolve_f")));
__attribute__((noinline)) int work(int n) {
    int s = 0;
    for (int i = 0; i < n; i++) s += f(i);
    return s;
}
int main(int argc, char **argv) {
    (void)argv;
    printf("%d\n", work(argc));
    return 0;
}
"#,
    )
    .ok()?;
    let exe = dir.join("tiny");
    let ok = std::process::Command::new("gcc")
        .args(["-O1", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(exe)
}

/// A module of this process for `base`'s file (its header read from the
/// pristine file), whose image the caller then supplies.
fn module_for(base: &Base) -> Option<Module> {
    let pid = std::process::id() as i32;
    let len = (base.data.len() as u64 + 0xfff) & !0xfff;
    let m = fake_mapping(&base.path, 0x7e00_0000_0000, len, 0, true);
    modules_from_maps(pid, &[m]).into_iter().next()
}

const PAGE: u64 = 0xfff;

fn load_base(name: &str, path: &Path) -> Option<Base> {
    let data = std::fs::read(path).ok()?;
    let layout = Layout::parse(&data);
    let img = ElfImage::from_bytes(path, data.clone())
        .unwrap_or_else(|e| panic!("pristine {} does not parse: {e}", path.display()));
    let funcs = img
        .functions()
        .unwrap_or_else(|e| panic!("pristine {}: {e}", path.display()));
    let ifunc = funcs
        .iter()
        .find(|f| f.kind == weft::inspect::SymbolKind::Ifunc)
        .map_or(("malloc".to_owned(), 0), |f| (f.name.clone(), f.vaddr));
    let maps: Vec<Mapping> = layout
        .segs
        .iter()
        .filter(|s| s.p_type == PT_LOAD)
        .map(|s| {
            let start = 0x7f00_0000_0000 + (s.vaddr & !PAGE);
            let len = ((s.vaddr & PAGE) + s.filesz + PAGE) & !PAGE;
            fake_mapping(
                path,
                start,
                len.max(0x1000),
                s.offset & !PAGE,
                s.flags & PF_X != 0,
            )
        })
        .collect();
    let mut base = Base {
        name: name.to_owned(),
        path: path.to_path_buf(),
        data,
        layout,
        ifunc,
        maps,
        has_module: false,
    };
    base.has_module = module_for(&base).is_some();
    Some(base)
}

/// Bytes `BranchIndex::build` would decode for this header.
fn sweep_bytes(h: &ElfHeaderInfo, len: u64) -> u64 {
    h.segments
        .iter()
        .filter(|s| s.is_load() && s.is_executable() && s.offset <= len)
        .map(|s| s.offset.saturating_add(s.filesz).min(len) - s.offset)
        .sum()
}

#[derive(Default)]
struct ElfStats {
    variants: u64,
    by_category: BTreeMap<&'static str, u64>,
    swept: u64,
    not_swept: u64,
}

/// Calls every public parsing entry point on one variant.
/// Files up to this size are also written out and read back the way weft
/// reads a target's modules (`modules_from_maps`, `Module::image`).
const FILE_ROUND_TRIP_LIMIT: usize = 64 << 10;

/// The module for a variant written to `file`, found the way weft finds the
/// modules of a process: from a mapping, reading the header from the file.
fn exercise_file(data: &[u8], file: &Path, input: &str, t: &mut Tally) {
    if std::fs::write(file, data).is_err() {
        return;
    }
    let len = (data.len() as u64 + 0xfff) & !0xfff;
    let m = fake_mapping(file, 0x7d00_0000_0000, len.max(0x1000), 0, true);
    let pid = std::process::id() as i32;
    let Some(modules) = t.run_opt("modules_from_maps (file)", input, || {
        let found = modules_from_maps(pid, std::slice::from_ref(&m));
        (!found.is_empty()).then_some(found)
    }) else {
        return;
    };
    for module in &modules {
        t.run("Module::image (file)", input, || {
            module
                .image()
                .and_then(|img| img.functions().map(<[_]>::len))
        });
    }
}

fn exercise(
    base: &Base,
    data: Vec<u8>,
    input: &str,
    round_trip: bool,
    t: &mut Tally,
    stats: &mut ElfStats,
) {
    let path = Path::new("corpus.elf");
    if round_trip && data.len() <= FILE_ROUND_TRIP_LIMIT {
        let file = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("malformed_input")
            .join(format!("variant-{}.elf", std::process::id()));
        exercise_file(&data, &file, input, t);
    }
    t.run_opt("ElfHeaderInfo::needed_len", input, || {
        ElfHeaderInfo::needed_len(&data[..data.len().min(EHDR)])
    });
    if let Some(h) = t.run("ElfHeaderInfo::parse", input, || {
        ElfHeaderInfo::parse(path, &data)
    }) {
        t.run_opt("ElfHeaderInfo::has_interp", input, || {
            h.has_interp().then_some(())
        });
        t.run("ElfHeaderInfo::load_bias", input, || {
            h.load_bias(path, &base.maps)
        });
    }
    let len = data.len() as u64;
    let Some(img) = t.run("ElfImage::from_bytes", input, || {
        ElfImage::from_bytes(path, data)
    }) else {
        return;
    };
    let sweep = base.has_module && sweep_bytes(img.header(), len) <= SWEEP_LIMIT;
    let module = if sweep { module_for(base) } else { None };
    let owned;
    let img: &ElfImage = match &module {
        Some(m) => {
            assert!(m.set_image(img), "fresh module already has an image");
            m.loaded_image().expect("image just set")
        }
        None => {
            owned = img;
            &owned
        }
    };
    t.run("ElfImage accessors", input, || {
        let _ = (
            img.elf_type(),
            img.interpreter(),
            img.path(),
            img.data().len(),
        );
        let _ = (img.is_dynamic(), img.is_executable(), format!("{img:?}"));
        Ok::<_, String>(())
    });
    t.run("ElfImage::load_bias", input, || img.load_bias(&base.maps));
    let mut probes: Vec<(u64, u64)> = vec![
        (0, 0),
        (u64::MAX, u64::MAX),
        (u64::MAX, 1),
        (1, u64::MAX),
        (u64::MAX - 1, 0),
    ];
    let mut names = vec!["malloc".to_owned()];
    if let Some(funcs) = t.run("ElfImage::functions", input, || img.functions()) {
        for f in [funcs.first(), funcs.get(funcs.len() / 2), funcs.last()]
            .into_iter()
            .flatten()
        {
            probes.push((f.vaddr, f.size));
            probes.push((f.vaddr.wrapping_add(f.size), 0));
        }
        names.extend(funcs.last().map(|f| f.name.clone()));
    }
    if let Some(fdes) = t.run("ElfImage::fde_functions", input, || img.fde_functions()) {
        for f in [fdes.first(), fdes.last()].into_iter().flatten() {
            probes.push((f.vaddr, f.size));
        }
    }
    for name in &names {
        t.run("ElfImage::symbol_vaddr", input, || img.symbol_vaddr(name));
    }
    for &(vaddr, size) in &probes {
        t.run("ElfImage::padding_after", input, || {
            img.padding_after(vaddr, size)
        });
    }
    for (name, resolver) in [
        (base.ifunc.0.as_str(), base.ifunc.1),
        ("malloc", u64::MAX),
        ("", 0),
    ] {
        t.run("ElfImage::ifunc_got_slots", input, || {
            img.ifunc_got_slots(name, resolver)
        });
    }
    match &module {
        Some(m) => {
            stats.swept += 1;
            if let Some(index) = t.run("BranchIndex::build", input, || BranchIndex::build(m)) {
                t.run_opt("BranchIndex::into_range", input, || {
                    let _ = index.into_range(0, u64::MAX);
                    let _ = index.into_range(u64::MAX, 0);
                    index.into_range(m.base(), m.base() + 0x1000)
                });
            }
        }
        None => stats.not_swept += 1,
    }
}

#[test]
fn malformed_elf_files_give_errors_not_panics() {
    let started = Instant::now();
    let (tally, stats, bases) = with_deadline("elf-corpus", |progress| {
        let mut bases: Vec<Base> = Vec::new();
        std::fs::create_dir_all(Path::new(env!("CARGO_TARGET_TMPDIR")).join("malformed_input"))
            .expect("create the scratch directory");
        let exe = std::env::current_exe().expect("current_exe");
        let libc = own_libc().unwrap_or_else(|| PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"));
        let candidates: Vec<(&str, PathBuf)> = vec![
            (
                "libdl.so.2",
                PathBuf::from("/lib/x86_64-linux-gnu/libdl.so.2"),
            ),
            (
                "libgcc_s.so.1",
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
            ),
            ("libc", libc),
            ("tiny C program", tiny_c_program().unwrap_or_default()),
            ("test binary", exe),
            ("weft binary", PathBuf::from(env!("CARGO_BIN_EXE_weft"))),
        ];
        for (name, path) in candidates {
            match load_base(name, &path) {
                Some(b) => bases.push(b),
                None => eprintln!("note: {} ({}) not available, skipped", name, path.display()),
            }
        }
        assert!(
            bases.iter().any(|b| b.name == "libc"),
            "the system libc must be part of the corpus"
        );
        let mut tally = Tally::default();
        let mut stats = ElfStats::default();
        let mut summary = Vec::new();
        for (bi, base) in bases.iter().enumerate() {
            let budget = Budget::for_size(base.data.len());
            let seed = 0x5eed_0000_0000_0001 ^ ((bi as u64 + 1) << 32);
            let vs = variants(&base.data, &base.layout, base.ifunc.1, &budget, seed);
            let t0 = Instant::now();
            for v in &vs {
                let input = v.describe(&format!("{} ({})", base.name, base.path.display()));
                set_progress(&progress, &input);
                let mut data = base.data.clone();
                for e in &v.edits {
                    e.apply(&mut data);
                }
                // Reading a module from its file differs from parsing
                // bytes only in how the headers are read.
                let round_trip = matches!(
                    v.category,
                    "truncation" | "ELF header" | "program header" | "random"
                );
                exercise(base, data, &input, round_trip, &mut tally, &mut stats);
                stats.variants += 1;
                *stats.by_category.entry(v.category).or_default() += 1;
            }
            summary.push(format!(
                "  {:<14} {:>9} bytes {:>5} variants {:>7.2?} (seed {seed:#x})",
                base.name,
                base.data.len(),
                vs.len(),
                t0.elapsed()
            ));
        }
        (tally, stats, summary)
    });
    eprintln!(
        "malformed ELF corpus: {} variants in {:.1?}",
        stats.variants,
        started.elapsed()
    );
    for line in &bases {
        eprintln!("{line}");
    }
    for (c, n) in &stats.by_category {
        eprintln!("  {c:<16} {n:>6}");
    }
    eprintln!(
        "  machine-code sweeps (BranchIndex::build): {} run, {} skipped (more than {} KiB of code)",
        stats.swept,
        stats.not_swept,
        SWEEP_LIMIT >> 10
    );
    tally.print_calls();
    let _ = std::fs::remove_file(
        Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("malformed_input")
            .join(format!("variant-{}.elf", std::process::id())),
    );
    tally.assert_no_panics("malformed ELF corpus");
}

// ---------------------------------------------------------------------------
// /proc text and patterns
// ---------------------------------------------------------------------------

/// Characters that confuse line/field parsers: separators, hex digits, signs,
/// whitespace, brackets, and multi-byte UTF-8 (byte offsets that are not
/// char boundaries).
const ALPHABET: &[char] = &[
    '0', '1', '7', '9', 'a', 'f', 'g', 'x', 'F', '-', '+', ':', ' ', ' ', '\t', '\n', '\r', '\0',
    '/', '(', ')', '[', ']', 'r', 'w', 'p', 's', '*', '?', '!', '^', '\\', 'é', '€', '𝄞',
    '\u{feff}', '\u{200b}', '\u{0301}',
];

fn mutate_text(base: &str, rng: &mut Rng) -> String {
    let mut c: Vec<char> = base.chars().collect();
    for _ in 0..=rng.below(6) {
        let n = c.len();
        match rng.below(9) {
            0 | 1 if n > 0 => {
                let i = rng.index(n);
                c[i] = rng.pick(ALPHABET);
            }
            2 => {
                let i = rng.index(n + 1);
                c.insert(i, rng.pick(ALPHABET));
            }
            3 if n > 0 => {
                let i = rng.index(n);
                let j = (i + 1 + rng.index(16)).min(n);
                c.drain(i..j);
            }
            4 if n > 0 => {
                let i = rng.index(n);
                let j = (i + 1 + rng.index(32)).min(n);
                let piece: Vec<char> = c[i..j].to_vec();
                let at = rng.index(n + 1);
                c.splice(at..at, piece);
            }
            5 => {
                let i = rng.index(n + 1);
                let big = rng.pick(&[
                    "ffffffffffffffffffff",
                    "18446744073709551616",
                    "-1",
                    "0x10",
                    "4294967296",
                    " (deleted)",
                    "))",
                    "(",
                    "::",
                    "--",
                ]);
                c.splice(i..i, big.chars());
            }
            6 => {
                let i = rng.index(n + 1);
                c.truncate(i);
            }
            7 if n > 0 => {
                let i = rng.index(n);
                let j = rng.index(n);
                c.swap(i, j);
            }
            _ => {
                let i = rng.index(n + 1);
                let ch = rng.pick(ALPHABET);
                c.splice(i..i, std::iter::repeat(ch).take(1 + rng.index(40)));
            }
        }
    }
    c.into_iter().collect()
}

/// Every prefix of `s` that ends on a char boundary.
fn prefixes(s: &str) -> impl Iterator<Item = &str> {
    (0..=s.len())
        .filter(|&i| s.is_char_boundary(i))
        .map(move |i| &s[..i])
}

fn exercise_maps(text: &str, header: &ElfHeaderInfo, t: &mut Tally) {
    let input = format!("maps text {text:?}");
    let Some(maps) = t.run("maps::parse_maps", &input, || parse_maps(text)) else {
        return;
    };
    t.run("Mapping accessors", &input, || {
        for m in &maps {
            let _ = (
                m.len(),
                m.is_empty(),
                m.contains(m.start),
                m.contains(u64::MAX),
            );
            let _ = (m.perms.to_string(), m.path.file());
        }
        Ok::<_, String>(())
    });
    let nears = [
        0,
        u64::MAX,
        0x7fff_ffff_f000,
        maps.first().map_or(1, |m| m.start),
        maps.last().map_or(2, |m| m.end),
    ];
    for near in nears {
        for (size, dist) in [
            (0x1000, 1 << 31),
            (1, u64::MAX),
            (u64::MAX, u64::MAX),
            (1 << 32, 0),
        ] {
            t.run_opt("maps::free_gap_near", &input, || {
                free_gap_near(&maps, near, size, dist)
            });
        }
    }
    t.run("ElfHeaderInfo::load_bias", &input, || {
        header.load_bias(Path::new("x"), &maps)
    });
}

fn exercise_stat(text: &str, t: &mut Tally) {
    let input = format!("stat text {text:?}");
    t.run_opt("procfs::parse_stat_state", &input, || {
        parse_stat_state(text)
    });
}

fn exercise_pattern(text: &str, names: &[&str], t: &mut Tally) {
    let input = format!("pattern {text:?}");
    t.run("pattern::Glob::new", &input, || {
        Glob::new(text).map(|g| names.iter().filter(|n| g.matches(n)).count())
    });
    if let Some(p) = t.run("pattern::Pattern::parse", &input, || Pattern::parse(text)) {
        t.run_opt("pattern matching", &input, || {
            let mut hits = 0;
            for n in names {
                hits += usize::from(p.matches_function(n));
                hits += usize::from(p.matches_module_name(n, n));
            }
            Some(hits)
        });
        t.run_opt("pattern::suggest", &input, || {
            Some(suggest(p.name().as_str(), names.iter().copied()))
        });
    }
}

#[test]
fn malformed_proc_text_and_patterns_give_errors_not_panics() {
    let started = Instant::now();
    let (tally, counts) = with_deadline("proc-corpus", |progress| {
        let mut t = Tally::default();
        let mut counts = BTreeMap::new();
        let libc = own_libc().unwrap_or_else(|| PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"));
        let bytes = std::fs::read(&libc).expect("read libc");
        let header = ElfHeaderInfo::parse(&libc, &bytes).expect("libc header");

        // /proc/PID/maps: this process's own, and lines at the edges.
        let own = std::fs::read_to_string("/proc/self/maps").expect("own maps");
        let mut seeds: Vec<String> = vec![
            own.clone(),
            "ffffffffffffffff-ffffffffffffffff rwxs ffffffffffffffff ffffffff:ffffffff \
             18446744073709551615 /x (deleted)\n"
                .into(),
            "0-0 ---p 0 0:0 0\n".into(),
            "7f0000000000-7f0000001000 r-xp 00000000 08:01 42                         \
             /usr/lib/a b (deleted) (deleted)\n"
                .into(),
            "7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                          [stack]\n\
             55550000-55560000 rw-p 00000000 00:00 0 [heap]\n"
                .into(),
            "1000-2000 r--p 00000000 08:01 7 /x\n2000-3000 r-xp 00001000 08:01 7 /x\n".into(),
        ];
        seeds.extend(own.lines().take(3).map(|l| format!("{l}\n")));
        set_progress(&progress, "maps prefixes");
        let mut n = 0u64;
        for s in &seeds {
            for p in prefixes(s) {
                exercise_maps(p, &header, &mut t);
                n += 1;
            }
        }
        let mut rng = Rng::new(0x0a11_ce00_0000_0004);
        for i in 0..3000 {
            let s = &seeds[rng.index(seeds.len())];
            let text = mutate_text(s, &mut rng);
            set_progress(&progress, &format!("maps mutation #{i}: {text:?}"));
            exercise_maps(&text, &header, &mut t);
            n += 1;
        }
        counts.insert("maps texts", n);

        // /proc/PID/stat: the state letter follows the last ')'.
        let own = std::fs::read_to_string("/proc/self/stat").expect("own stat");
        let seeds: Vec<String> = vec![
            own,
            "1234 (evil) R (x) Z) t 1 2 3".into(),
            "5 (€) ) é".into(),
            "5 (a\nb) S 1".into(),
            ")".into(),
            "(".into(),
        ];
        let mut n = 0u64;
        for s in &seeds {
            for p in prefixes(s) {
                exercise_stat(p, &mut t);
                n += 1;
            }
        }
        for i in 0..3000 {
            let s = &seeds[rng.index(seeds.len())];
            let text = mutate_text(s, &mut rng);
            set_progress(&progress, &format!("stat mutation #{i}: {text:?}"));
            exercise_stat(&text, &mut t);
            n += 1;
        }
        counts.insert("stat texts", n);

        // Function patterns (user input, matched against names from ELF
        // files).
        let names = [
            "malloc",
            "__libc_malloc",
            "std::vec::Vec<T>::push",
            "work_a",
            "",
            "é€𝄞",
            "libc.so.6",
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab",
        ];
        let seeds = [
            "libc.so.6:mem*",
            "work_[a-c]",
            "a\\*b",
            "[!x-]*",
            "[]]",
            "[^]a-]",
            "std::vec::Vec<T>::push",
            "*:*",
            "*a*a*a*a*a*a*a*a*a*a*a*c",
            "lib*.so:[",
            "\\",
            "é[€-𝄞]?",
        ];
        let mut n = 0u64;
        for s in seeds {
            for p in prefixes(s) {
                exercise_pattern(p, &names, &mut t);
                n += 1;
            }
        }
        for i in 0..3000 {
            let s = seeds[rng.index(seeds.len())];
            let text = mutate_text(s, &mut rng);
            set_progress(&progress, &format!("pattern mutation #{i}: {text:?}"));
            exercise_pattern(&text, &names, &mut t);
            n += 1;
        }
        counts.insert("patterns", n);
        (t, counts)
    });
    eprintln!(
        "malformed /proc text and pattern corpus in {:.1?}: {counts:?}",
        started.elapsed()
    );
    tally.print_calls();
    tally.assert_no_panics("malformed /proc text and pattern corpus");
}
