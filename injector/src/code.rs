//! A function's code and source as a tool sees them: its instructions,
//! basic blocks, call sites and exit points ([`function_code`]), the source
//! line of an address from DWARF, the module's or its debug file's ([`source_line`]),
//! and readable names of mangled Rust and C++ symbols ([`demangle`]).
//!
//! Code is decoded from the module's *file*, so it shows the function as
//! built, whatever weft (or a debugger) has patched in memory since.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSegment};

/// What [`function_code`] returns, so that a tool needs no direct
/// dependency on `weft-codegen`.
pub use weft_codegen::cfg::{
    BasicBlock, CallSite, CallTarget, Disassembly, ExitKind, ExitPoint, Flow, Instruction,
};

use crate::inspect::{FoundFunction, Module, ProcessImage, SlotTarget};

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
    match elf.pointer_slot(slot)? {
        SlotTarget::Symbol(name) => Some(name.clone()),
        SlotTarget::Address(_) => None,
    }
}

/// Where a call through the pointer slot at `slot` (runtime) goes, when
/// the files say so
/// ([`ElfImage::pointer_slot`](crate::inspect::ElfImage::pointer_slot)):
/// a function by name, or a runtime address. None for a pointer the
/// program may change.
pub fn slot_call_target(image: &ProcessImage, slot: u64) -> Option<SlotCall> {
    let module = image.module_of(slot)?;
    let elf = module.image().ok()?;
    Some(match elf.pointer_slot(slot.wrapping_sub(module.bias()))? {
        SlotTarget::Symbol(name) => SlotCall::Named(name.clone()),
        SlotTarget::Address(vaddr) => SlotCall::At(vaddr.wrapping_add(module.bias())),
    })
}

/// [`slot_call_target`]'s answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlotCall {
    /// The function of this name (another library's, or this module's own
    /// exported one).
    Named(String),
    /// The function at this runtime address.
    At(u64),
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

/// Where the code at an address comes from: the source file and line, from
/// the module's DWARF or its separate debug file (`docs/debug-files.md`).
pub use crate::inspect::SourceLine;

/// The source line of the code at runtime address `address`, or None when
/// no line information covers it (no `-g`, no debug file found).
///
/// # Errors
///
/// [`CodeError`] when the module file cannot be read.
pub fn source_line(image: &ProcessImage, address: u64) -> Result<Option<SourceLine>, CodeError> {
    let Some(module) = image.module_of(address) else {
        return Ok(None);
    };
    image.source_line(address).map_err(|e| CodeError::File {
        path: module.path().to_path_buf(),
        reason: e.to_string(),
    })
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
    fn source_line_of_this_test_binary_finds_this_function() {
        let here = source_line_of_this_test_binary_finds_this_function as *const () as u64;
        let image = crate::inspect::ProcessImage::open(std::process::id() as i32).unwrap();
        let loc = source_line(&image, here)
            .unwrap()
            .expect("a line for this function (cargo's dev profile has debug info)");
        assert!(loc.file.ends_with("code.rs"), "{loc:?}");
        assert!(loc.line > 200, "{loc:?}");
    }
}
