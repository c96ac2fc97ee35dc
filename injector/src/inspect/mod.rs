//! Inspecting a process: its mappings, modules and functions.
//!
//! [`ProcessImage`] is the entry point the injector uses: it reads
//! `/proc/PID/maps` once, groups file mappings into [`Module`]s, and parses a
//! module's symbols only when a [`Pattern`] can select functions in it.
//!
//! A stripped file's names and source lines come from its separate debug
//! file or MiniDebugInfo when one is found (see `docs/debug-files.md` and
//! [`DebugSource`]); [`ProcessImage::take_debug_notes`] tells what was
//! missing or ignored.
//!
//! Addresses come in two flavours: a *file vaddr* is an address in an ELF
//! file's own address space (what `readelf` prints); a *runtime address* is
//! where it lives in the process, `vaddr + bias` ([`Module::bias`]).

pub(crate) mod elf;
pub(crate) mod error;
pub(crate) mod lines;
pub(crate) mod maps;
pub(crate) mod module;
pub mod names;
pub(crate) mod pattern;
pub(crate) mod procfs;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

pub use elf::debugfile::{
    debug_dirs, set_debug_dirs, DebugInfo, DebugSource, LinkKind, DEBUG_DIRS_ENV, DEFAULT_DEBUG_DIR,
};
pub use elf::{
    Binding, ElfHeaderInfo, ElfImage, ElfType, FrameAtEntry, FrameRule, FunctionSymbol,
    NoReturnAddress, SavedAt, Segment, SlotTarget, SymbolKind, SymbolSource,
};
pub use error::InspectError;
pub use lines::SourceLine;
pub(crate) use maps::read_maps;
pub use maps::{Mapping, MappingPath, MapsParseError, Perms};
pub use module::Module;
pub(crate) use pattern::suggest;
pub use pattern::{split_list, Glob, Pattern, PatternError};
pub use procfs::{children_running_the_same_program, command, descendants, pids_of};
pub(crate) use procfs::{process_state, ProcState};

/// What kind of function was found, with its runtime details.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FunctionKind {
    /// An ordinary function: `address` is its code.
    Plain,
    /// A GNU indirect function: `address` (equal to `resolver`) is the
    /// resolver's code, not the implementation. See
    /// [`ProcessImage::ifunc_slots`] to find the implementation in use.
    Ifunc {
        /// Runtime address of the resolver.
        resolver: u64,
    },
}

/// A function selected by a pattern, located in the process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundFunction {
    /// The name (the first one matched at this address).
    pub name: String,
    /// File name of the module, e.g. `libc.so.6`.
    pub module: String,
    /// Path of the module as in `/proc/PID/maps`.
    pub module_path: PathBuf,
    /// Runtime address of the first instruction.
    pub address: u64,
    /// File vaddr of the function in its module.
    pub vaddr: u64,
    /// Size in bytes (0 if unknown).
    pub size: u64,
    /// Plain function or IFUNC.
    pub kind: FunctionKind,
    /// Which table the function came from.
    pub source: SymbolSource,
    /// Bytes after the function that belong to no other function (at most
    /// 64); see [`ElfImage::padding_after`].
    pub padding: u64,
    /// Other names of the same address that also matched.
    pub aliases: Vec<String>,
}

/// Builds the [`FoundFunction`] for symbol `f` of module `m`.
fn found_function(m: &Module, img: &ElfImage, f: &FunctionSymbol) -> FoundFunction {
    let address = m.runtime_address(f.vaddr);
    FoundFunction {
        name: f.name.clone(),
        module: m.name().to_owned(),
        module_path: m.path().to_path_buf(),
        address,
        vaddr: f.vaddr,
        size: f.size,
        kind: match f.kind {
            SymbolKind::Plain => FunctionKind::Plain,
            SymbolKind::Ifunc => FunctionKind::Ifunc { resolver: address },
        },
        source: f.source,
        padding: img.padding_after(f.vaddr, f.size).unwrap_or(0),
        aliases: Vec::new(),
    }
}

/// Appends what there is to say about module `m`'s debug information.
fn note_debug_info(m: &Module, notes: &mut Vec<DebugNote>) {
    let Some(img) = m.loaded_image() else {
        return;
    };
    let Ok(debug) = img.debug_info() else {
        return;
    };
    for error in debug.ignored() {
        notes.push(DebugNote::Ignored {
            module: m.name().to_owned(),
            error: Arc::clone(error),
        });
    }
    let from_eh_frame = img
        .functions()
        .is_ok_and(|fs| fs.iter().any(|f| f.source == SymbolSource::EhFrame));
    if *debug.source() == DebugSource::None && from_eh_frame {
        notes.push(DebugNote::NoDebugFile {
            module: m.name().to_owned(),
        });
    }
}

/// A module that was skipped while resolving patterns.
#[derive(Debug)]
pub struct SkippedModule {
    /// Path of the module.
    pub path: PathBuf,
    /// Why its symbols could not be read.
    pub error: InspectError,
}

/// Something worth telling the user about a module's debug information,
/// once per module (see [`ProcessImage::take_debug_notes`]).
#[derive(Debug)]
pub enum DebugNote {
    /// The module is stripped, no debug file was found, and its functions
    /// are the FDEs of `.eh_frame`, named `fun_<hex vaddr>`.
    NoDebugFile {
        /// The module's file name.
        module: String,
    },
    /// A debug file (or MiniDebugInfo) was found but not used.
    Ignored {
        /// The module's file name.
        module: String,
        /// Why ([`InspectError::DebugFileMismatch`],
        /// [`InspectError::DebugFileUnreadable`] or
        /// [`InspectError::MiniDebugInfo`]), shared with
        /// [`DebugInfo::ignored`].
        error: Arc<InspectError>,
    },
}

impl std::fmt::Display for DebugNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DebugNote::NoDebugFile { module } => write!(
                f,
                "{module}: stripped, no debug file found; functions named fun_<addr> from \
                 .eh_frame (install its debug package, or add a directory holding its .build-id/ tree \
                 to the debug directories, set_debug_dirs or {DEBUG_DIRS_ENV})"
            ),
            DebugNote::Ignored { module, error } => write!(f, "{module}: {error}"),
        }
    }
}

/// Where notes go instead of [`ProcessImage::take_debug_notes`], if set.
static NOTE_REPORTER: std::sync::OnceLock<fn(&DebugNote)> = std::sync::OnceLock::new();

/// Sends every [`DebugNote`] to `report` as soon as a search makes it
/// (weft's command line prints them on standard error), instead of keeping
/// it for [`ProcessImage::take_debug_notes`]. Only the first call counts.
pub fn set_debug_note_reporter(report: fn(&DebugNote)) {
    let _ = NOTE_REPORTER.set(report);
}

/// A snapshot of a process's address space: its mappings and modules, with
/// lazily parsed symbol tables.
#[derive(Debug)]
pub struct ProcessImage {
    pid: i32,
    maps: Vec<Mapping>,
    modules: Vec<Module>,
    skipped: Vec<SkippedModule>,
    /// [`ProcessImage::symbol_address`] answers (a symbol table scan each),
    /// until the modules change.
    symbols: std::collections::HashMap<(String, String), Option<u64>>,
    /// Notes not yet taken, and the modules (by path) already noted.
    debug_notes: Vec<DebugNote>,
    noted: std::collections::HashSet<PathBuf>,
}

impl ProcessImage {
    /// Reads `/proc/PID/maps` and finds the modules of `pid`.
    ///
    /// Fails with [`InspectError::NoSuchProcess`], [`InspectError::Zombie`],
    /// [`InspectError::PermissionDenied`] (maps are guarded by the ptrace
    /// access check), or [`InspectError::NoAddressSpace`] for kernel threads.
    pub fn open(pid: i32) -> Result<Self, InspectError> {
        if process_state(pid)? == ProcState::Zombie {
            return Err(InspectError::Zombie(pid));
        }
        let mut image = ProcessImage {
            pid,
            maps: Vec::new(),
            modules: Vec::new(),
            skipped: Vec::new(),
            symbols: Default::default(),
            debug_notes: Vec::new(),
            noted: Default::default(),
        };
        image.refresh()?;
        Ok(image)
    }

    /// Re-reads the mappings (e.g. after a `dlopen`). Parsed symbol tables of
    /// modules still loaded at the same place are kept.
    pub fn refresh(&mut self) -> Result<(), InspectError> {
        let maps = read_maps(self.pid)?;
        if maps.is_empty() {
            // Between exit and reaping the maps are empty too.
            return Err(match process_state(self.pid)? {
                ProcState::Zombie | ProcState::Dead => InspectError::Zombie(self.pid),
                _ => InspectError::NoAddressSpace(self.pid),
            });
        }
        let mut new = module::modules_from_maps(self.pid, &maps);
        let same = new.len() == self.modules.len()
            && new
                .iter()
                .zip(&self.modules)
                .all(|(a, b)| a.path() == b.path() && a.base() == b.base());
        if !same {
            self.symbols.clear();
        }
        module::carry_over_images(&mut new, &mut self.modules);
        self.maps = maps;
        self.modules = new;
        Ok(())
    }

    /// The process ID.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// All mappings, ascending by address.
    pub fn maps(&self) -> &[Mapping] {
        &self.maps
    }

    /// The modules, main executable first.
    pub fn modules(&self) -> &[Module] {
        &self.modules
    }

    /// Whether the process looks like it is still starting: its dynamic
    /// loader is mapped but no C library yet (the loader maps the
    /// program's libraries before `main`).
    pub fn still_loading(&self) -> bool {
        let named = |prefix: &str| self.modules.iter().any(|m| m.name().starts_with(prefix));
        named("ld-linux") && !named("libc.so") && !named("libc-")
    }

    /// The main executable, if it could be identified.
    pub fn executable(&self) -> Option<&Module> {
        self.modules.first().filter(|m| m.is_main_executable())
    }

    /// The module with a file-backed mapping containing `addr`.
    pub fn module_of(&self, addr: u64) -> Option<&Module> {
        self.modules.iter().find(|m| m.contains(addr))
    }

    /// Whether the program is statically linked: the executable has no
    /// `PT_INTERP` and no dynamic loader (`ld-linux*`, `ld-musl*`, `ld.so*`)
    /// is mapped. Such a program cannot `dlopen` weft's runtime.
    pub fn is_statically_linked(&self) -> bool {
        let exe_has_interp = self.executable().is_some_and(|m| m.header().has_interp());
        let loader_mapped = self.modules.iter().any(|m| {
            let n = m.name();
            n.starts_with("ld-linux") || n.starts_with("ld-musl") || n.starts_with("ld.so")
        });
        !exe_has_interp && !loader_mapped
    }

    /// Modules that [`ProcessImage::find_functions`] or
    /// [`ProcessImage::all_function_names`] had to skip during the last call
    /// because their file could not be read.
    pub fn skipped_modules(&self) -> &[SkippedModule] {
        &self.skipped
    }

    /// Loads the images of the modules some pattern can touch. Errors of a
    /// module named explicitly by a pattern, or of the main executable, are
    /// returned; other unreadable modules are recorded in `skipped`.
    fn touched_modules(&mut self, patterns: &[Pattern]) -> Result<Vec<usize>, InspectError> {
        self.skipped.clear();
        let mut touched = Vec::new();
        for (i, m) in self.modules.iter().enumerate() {
            let selecting: Vec<&Pattern> = patterns
                .iter()
                .filter(|p| p.could_match_module(m))
                .collect();
            if selecting.is_empty() {
                continue;
            }
            match m.image().and_then(|img| img.functions().map(|_| ())) {
                Ok(()) => touched.push(i),
                Err(e)
                    if m.is_main_executable() || selecting.iter().any(|p| p.module().is_some()) =>
                {
                    return Err(e)
                }
                Err(error) => self.skipped.push(SkippedModule {
                    path: m.path().to_path_buf(),
                    error,
                }),
            }
        }
        Ok(touched)
    }

    /// What the searches so far learnt about the debug information of the
    /// modules they searched, each module at most once in this image's
    /// life: stripped modules named from `.eh_frame` for want of a debug
    /// file, debug files ignored. A module is noted when a pattern that
    /// searched it names a module (`exe:work`) or found nothing (then also
    /// by [`ProcessImage::all_function_names`]), not when a bare name was
    /// found elsewhere. Taken, so the next call returns only
    /// newer notes. Empty when [`set_debug_note_reporter`] took them.
    pub fn take_debug_notes(&mut self) -> Vec<DebugNote> {
        std::mem::take(&mut self.debug_notes)
    }

    /// The source line of the code at runtime address `addr` (see
    /// [`ElfImage::source_line`]); `None` if `addr` is in no module or no
    /// line table covers it.
    pub fn source_line(&self, addr: u64) -> Result<Option<SourceLine>, InspectError> {
        let Some(m) = self.module_of(addr) else {
            return Ok(None);
        };
        m.image()?.source_line(addr.wrapping_sub(m.bias()))
    }

    /// Makes the debug notes of the modules `patterns` searched, each
    /// module once in this image's life.
    fn note_modules(&mut self, patterns: &[&Pattern]) {
        for m in &self.modules {
            if m.loaded_image().is_none()
                || !patterns.iter().any(|p| p.could_match_module(m))
                || !self.noted.insert(m.path().to_path_buf())
            {
                continue;
            }
            let start = self.debug_notes.len();
            note_debug_info(m, &mut self.debug_notes);
            if let Some(report) = NOTE_REPORTER.get() {
                self.debug_notes.drain(start..).for_each(|n| report(&n));
            }
        }
    }

    /// For each pattern: whether it is an exact name without a `MODULE:`
    /// part that a global or weak function of the `touched` modules
    /// answers to. Such a name means the function the program calls by
    /// it, not the private (local) copies a module may have of the same
    /// name (the dynamic loader's own `strlen`, `memcpy`, ... once its
    /// debug file is read).
    fn exported_names(
        &self,
        patterns: &[Pattern],
        touched: &[usize],
    ) -> Result<Vec<bool>, InspectError> {
        let mut out = vec![false; patterns.len()];
        for (k, p) in patterns.iter().enumerate() {
            if p.module().is_some() || p.name().literal().is_none() {
                continue;
            }
            for &i in touched {
                let m = &self.modules[i];
                let img = m.image()?;
                let mut global = false;
                for (index, f) in img.functions()?.iter().enumerate() {
                    if f.binding == Binding::Local
                        || !m.is_executable_address(m.runtime_address(f.vaddr))
                    {
                        continue;
                    }
                    if p.name().matches(&f.name)
                        || (p.may_match_source_of(&f.name)
                            && p.matches_names(&f.name, img.source_names()?[index].as_ref()))
                    {
                        global = true;
                        break;
                    }
                }
                if global {
                    out[k] = true;
                    break;
                }
            }
        }
        Ok(out)
    }

    /// Finds the functions selected by any of `patterns` (by linkage or
    /// source name, see [`Pattern::matches_names`]; a glob leaves out
    /// `.cold` parts, which are pieces of their parents).
    ///
    /// Only modules a pattern can touch are parsed. Functions whose runtime
    /// address is not in an executable mapping of their module are left out.
    /// An exact name without `MODULE:` (`strlen`) selects only global and
    /// weak functions when there is one: the local functions of that name
    /// (private copies, such as the dynamic loader's own `strlen`) are
    /// reached with `MODULE:NAME` or a glob.
    /// Results are deduplicated by runtime address: the first name matched
    /// (modules in order, then by address, global before weak before local
    /// symbols) is kept and the others become `aliases`.
    pub fn find_functions(
        &mut self,
        patterns: &[Pattern],
    ) -> Result<Vec<FoundFunction>, InspectError> {
        let touched = self.touched_modules(patterns)?;
        let shadowing = self.exported_names(patterns, &touched)?;
        let mut out: Vec<FoundFunction> = Vec::new();
        let mut by_address: HashMap<u64, usize> = HashMap::new();
        let mut matched = vec![false; patterns.len()];
        for i in touched {
            let m = &self.modules[i];
            let selecting: Vec<usize> = (0..patterns.len())
                .filter(|&k| patterns[k].could_match_module(m))
                .collect();
            let img = m.image()?;
            for (index, f) in img.functions()?.iter().enumerate() {
                // A `.cold` part is a piece of its parent, timed with it,
                // not a function a glob selects; naming it selects it.
                let cold = names::cold_part_of(&f.name).is_some();
                let mut hit = false;
                for &k in &selecting {
                    // Demangled only when the linkage name does not match
                    // (`*` never needs it), then once for the module.
                    let p = &patterns[k];
                    let matches = p.name().matches(&f.name)
                        || (p.may_match_source_of(&f.name)
                            && p.matches_names(&f.name, img.source_names()?[index].as_ref()));
                    if !matches
                        || (shadowing[k] && f.binding == Binding::Local)
                        || (cold && !patterns[k].name().is_literal())
                    {
                        continue;
                    }
                    hit = true;
                    if !matched[k] && m.is_executable_address(m.runtime_address(f.vaddr)) {
                        matched[k] = true;
                    }
                }
                if !hit {
                    continue;
                }
                let address = m.runtime_address(f.vaddr);
                if !m.is_executable_address(address) {
                    continue;
                }
                if let Some(&j) = by_address.get(&address) {
                    let found = &mut out[j];
                    if found.name != f.name && !found.aliases.contains(&f.name) {
                        found.aliases.push(f.name.clone());
                    }
                    continue;
                }
                by_address.insert(address, out.len());
                out.push(found_function(m, img, f));
            }
        }
        // A stripped module's names are worth a note where they matter: a
        // pattern named its module, or found nothing (perhaps for want of
        // those names); not when `malloc` was looked for, and found, in
        // libc while the stripped program was searched too.
        let noting: Vec<&Pattern> = patterns
            .iter()
            .zip(&matched)
            .filter(|(p, &found)| p.module().is_some() || !found)
            .map(|(p, _)| p)
            .collect();
        self.note_modules(&noting);
        Ok(out)
    }

    /// The source names of `f` (demangled, or a clone's source name; see
    /// [`names::source_names`]), from its module's cache when its symbols
    /// were read, else worked out; `None` when its linkage name is its
    /// only name.
    pub fn source_names_of(&self, f: &FoundFunction) -> Option<names::SourceNames> {
        let cached = self.module_of(f.address).and_then(|m| {
            let img = m.loaded_image()?;
            let funcs = img.functions().ok()?;
            let first = funcs.partition_point(|g| g.vaddr < f.vaddr);
            let i = (first..funcs.len())
                .take_while(|&i| funcs[i].vaddr == f.vaddr)
                .find(|&i| funcs[i].name == f.name)?;
            Some(img.source_names().ok()?[i].clone())
        });
        match cached {
            Some(names) => names,
            None => names::source_names(&f.name),
        }
    }

    /// The names of all functions in the modules `patterns` can touch
    /// (ignoring the name part), sorted and deduplicated: candidates for
    /// [`suggest`] when a pattern matches nothing.
    pub fn all_function_names(
        &mut self,
        patterns: &[Pattern],
    ) -> Result<Vec<String>, InspectError> {
        let touched = self.touched_modules(patterns)?;
        // Names wanted for suggestions: a pattern found nothing.
        self.note_modules(&patterns.iter().collect::<Vec<_>>());
        let mut names: Vec<String> = Vec::new();
        for i in touched {
            let img = self.modules[i].image()?;
            for (f, source) in img.functions()?.iter().zip(img.source_names()?) {
                names.push(f.name.clone());
                // Suggestions in the names people write too.
                if let Some(s) = source {
                    names.push(s.short.clone());
                }
            }
        }
        names.sort_unstable();
        names.dedup();
        Ok(names)
    }

    /// Runtime address of the defined symbol `symbol` in the first module
    /// whose file name starts with `module_name_prefix` and defines it, e.g.
    /// `("libc.so", "dlopen")`. For an IFUNC, the resolver's address.
    pub fn symbol_address(&mut self, module_name_prefix: &str, symbol: &str) -> Option<u64> {
        let key = (module_name_prefix.to_string(), symbol.to_string());
        if let Some(&known) = self.symbols.get(&key) {
            return known;
        }
        let found = self
            .modules
            .iter()
            .filter(|m| m.name().starts_with(module_name_prefix))
            .find_map(|m| {
                let vaddr = m.image().ok()?.symbol_vaddr(symbol).ok()??;
                Some(m.runtime_address(vaddr))
            });
        self.symbols.insert(key, found);
        found
    }

    /// Runtime addresses of the GOT slots that hold the implementation chosen
    /// for the IFUNC `f`: `R_X86_64_IRELATIVE` slots of its own module whose
    /// addend is its resolver, and `JUMP_SLOT`/`GLOB_DAT` slots naming it in
    /// every module (parsing all of them). Read them from the live process
    /// to learn the implementation. A lazily bound `JUMP_SLOT` holds a PLT
    /// address until the first call, and a slot in another module may be
    /// bound to an interposed definition; the caller should check that the
    /// value lies in `f`'s module. Unreadable modules are skipped.
    pub fn ifunc_slots(&mut self, f: &FoundFunction) -> Result<Vec<u64>, InspectError> {
        let mut out = Vec::new();
        for m in &self.modules {
            let own = m.path() == f.module_path;
            let Ok(img) = m.image() else {
                if own {
                    m.image()?;
                }
                continue;
            };
            // For other modules no IRELATIVE addend can match: use an
            // impossible resolver value.
            let resolver = if own { f.vaddr } else { u64::MAX };
            out.extend(
                img.ifunc_got_slots(&f.name, resolver)?
                    .into_iter()
                    .map(|v| m.runtime_address(v)),
            );
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// Near names for a pattern that matched nothing (up to 5, see
    /// [`suggest`]). If the pattern's `MODULE:` part selects no module,
    /// module names are suggested instead, as `module:name`.
    pub fn suggest(&mut self, pattern: &Pattern) -> Result<Vec<String>, InspectError> {
        if let Some(module) = pattern.module() {
            if !self.modules.iter().any(|m| pattern.could_match_module(m)) {
                // Every name a module answers to (file name, soname, the
                // name it was started as, `exe`), paths left out.
                let names: Vec<&str> = self
                    .modules
                    .iter()
                    .flat_map(Module::names)
                    .filter(|n| !n.contains('/'))
                    .collect();
                return Ok(suggest(module.as_str(), names.into_iter())
                    .into_iter()
                    .map(|m| format!("{m}:{}", pattern.name()))
                    .collect());
            }
        }
        let names = self.all_function_names(std::slice::from_ref(pattern))?;
        Ok(suggest(
            pattern.name().as_str(),
            names.iter().map(String::as_str),
        ))
    }

    /// The function containing runtime address `addr`: a symbol whose
    /// `[start, start + size)` contains it (the one starting at `addr`
    /// preferred), else an `.eh_frame` FDE (named `fun_<hex vaddr>`, e.g. for
    /// the non-exported IFUNC implementations of a libc without `.symtab`).
    /// `None` if `addr` is in no module or no function covers it.
    pub fn function_at(&mut self, addr: u64) -> Result<Option<FoundFunction>, InspectError> {
        let Some(m) = self.module_of(addr) else {
            return Ok(None);
        };
        let img = m.image()?;
        let vaddr = addr.wrapping_sub(m.bias());
        let covers =
            |f: &&FunctionSymbol| f.vaddr <= vaddr && vaddr < f.vaddr.saturating_add(f.size.max(1));
        let funcs = img.functions()?;
        let hit = funcs
            .iter()
            .find(|f| f.vaddr == vaddr)
            .or_else(|| funcs.iter().filter(covers).min_by_key(|f| f.size));
        if let Some(f) = hit {
            return Ok(Some(found_function(m, img, f)));
        }
        Ok(img
            .fde_functions()?
            .iter()
            .find(covers)
            .map(|f| found_function(m, img, f)))
    }

    /// Where a call to `f` really goes: its address for a plain function;
    /// for an IFUNC, the implementation read from one of its GOT slots in the
    /// live process (a value inside `f`'s module other than the resolver).
    /// `None` if no slot holds one yet (lazy binding) or memory cannot be
    /// read.
    pub fn resolved_address(&mut self, f: &FoundFunction) -> Option<u64> {
        let FunctionKind::Ifunc { resolver } = f.kind else {
            return Some(f.address);
        };
        let slots = self.ifunc_slots(f).ok()?;
        let mem = std::fs::File::open(crate::inspect::procfs::pid_file(self.pid, "mem")).ok()?;
        let module = self.modules.iter().find(|m| m.path() == f.module_path)?;
        slots.into_iter().find_map(|slot| {
            let mut buf = [0u8; 8];
            std::os::unix::fs::FileExt::read_exact_at(&mem, &mut buf, slot).ok()?;
            let value = u64::from_le_bytes(buf);
            (value != resolver && module.is_executable_address(value)).then_some(value)
        })
    }
}
