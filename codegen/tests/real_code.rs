//! Real compiler output: the entries of libc functions and of this test
//! binary's own functions, read from this process. Each is either patchable
//! and relocates with identical targets, or refused with a reason.
#![cfg(all(target_arch = "x86_64", target_os = "linux"))]

mod common;

use common::check_relocation;
use weft_codegen::*;

/// Readable address ranges of this process, from `/proc/self/maps`.
fn readable_ranges() -> Vec<(u64, u64)> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (range, perms) = (f.next()?, f.next()?);
            let (a, b) = range.split_once('-')?;
            perms.starts_with('r').then(|| {
                (
                    u64::from_str_radix(a, 16).unwrap(),
                    u64::from_str_radix(b, 16).unwrap(),
                )
            })
        })
        .collect()
}

macro_rules! fns {
    ($($path:path),* $(,)?) => { vec![$((stringify!($path), $path as *const () as u64)),*] };
}

#[test]
fn real_function_entries() {
    let functions = fns![
        libc::malloc,
        libc::free,
        libc::calloc,
        libc::realloc,
        libc::memcpy,
        libc::memmove,
        libc::memset,
        libc::memcmp,
        libc::memchr,
        libc::strlen,
        libc::strcmp,
        libc::strncmp,
        libc::strcpy,
        libc::strchr,
        libc::strrchr,
        libc::strstr,
        libc::strdup,
        libc::strerror,
        libc::printf,
        libc::fprintf,
        libc::snprintf,
        libc::puts,
        libc::fputs,
        libc::fwrite,
        libc::fread,
        libc::fopen,
        libc::fclose,
        libc::fflush,
        libc::open,
        libc::close,
        libc::read,
        libc::write,
        libc::lseek,
        libc::getpid,
        libc::getppid,
        libc::getuid,
        libc::time,
        libc::clock_gettime,
        libc::gettimeofday,
        libc::nanosleep,
        libc::usleep,
        libc::sleep,
        libc::pthread_create,
        libc::pthread_join,
        libc::pthread_mutex_lock,
        libc::pthread_mutex_unlock,
        libc::pthread_self,
        libc::pthread_once,
        libc::atoi,
        libc::strtol,
        libc::strtoul,
        libc::qsort,
        libc::abs,
        libc::rand,
        libc::srand,
        libc::getenv,
        libc::setenv,
        libc::mmap,
        libc::munmap,
        libc::mprotect,
        libc::sigaction,
        libc::signal,
        libc::raise,
        libc::kill,
        libc::abort,
        libc::__errno_location,
        libc::isalpha,
        libc::toupper,
        libc::tolower,
        libc::sched_yield,
        libc::poll,
        libc::socket,
        libc::connect,
        libc::sysconf,
        libc::localtime_r,
        libc::strftime,
        libc::strcasecmp,
        libc::strspn,
        libc::strcspn,
        libc::fgetc,
        libc::fputc,
        libc::putchar,
        libc::dlopen,
        libc::dlsym,
        analyze_entry,
        relocate,
        build_trampoline,
        register_stub,
        jmp_rel32,
        max_trampoline_len,
        common::decode_all,
        common::decode_at,
        check_relocation,
        readable_ranges,
        real_function_entries,
    ];
    let ranges = readable_ranges();
    let (mut ok, mut refused) = (0, Vec::new());
    for (name, address) in &functions {
        // Symbol sizes are unknown here: take up to 128 bytes, within the
        // mapping. Extra bytes from the next function only add refusals.
        let (_, end) = ranges
            .iter()
            .find(|(a, b)| (*a..*b).contains(address))
            .expect("function is mapped");
        let len = (end - address).min(128) as usize;
        // SAFETY: `address..address+len` lies in a readable mapping of this
        // process (checked above), and code is never unmapped while we run.
        let bytes = unsafe { std::slice::from_raw_parts(*address as *const u8, len) };
        match analyze_entry(&FunctionCode {
            address: *address,
            bytes,
            padding: &[],
        }) {
            Ok(site) => {
                for delta in [0x1000_0000i64, -0x1000_0000, 0x1000] {
                    let r = relocate(&site, address.wrapping_add_signed(delta))
                        .unwrap_or_else(|e| panic!("{name}: {e}"));
                    check_relocation(&site, &r);
                }
                ok += 1;
            }
            Err(reason) => {
                assert!(!reason.to_string().is_empty());
                refused.push(format!("{name}: {reason}"));
            }
        }
    }
    eprintln!(
        "{ok} patchable of {}; refused:\n  {}",
        functions.len(),
        refused.join("\n  ")
    );
    assert!(functions.len() >= 50);
    assert!(ok >= functions.len() / 2, "too many refusals: {refused:#?}");
}

/// Every function symbol of libc and of this test binary (Rust code built
/// like weft's own), read from the files: each entry either relocates with
/// identical targets (at three distances) or is refused with a reason.
/// Addresses are the files' own virtual addresses: relocation depends only
/// on the distance between the original and the new place.
#[test]
fn every_function_of_libc_and_this_binary() {
    use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let libc_path = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("/libc.so"))
        .expect("libc is mapped")
        .to_string();
    let me = std::env::current_exe().unwrap();
    for path in [std::path::PathBuf::from(libc_path), me] {
        let data = std::fs::read(&path).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let mut seen = std::collections::HashSet::new();
        let (mut ok, mut refused, mut total) = (0usize, 0usize, 0usize);
        let symbols = file.symbols().chain(file.dynamic_symbols());
        for sym in symbols {
            if sym.kind() != SymbolKind::Text || sym.size() == 0 || !seen.insert(sym.address()) {
                continue;
            }
            let Some(section) = sym
                .section_index()
                .and_then(|i| file.section_by_index(i).ok())
            else {
                continue;
            };
            let Ok(bytes) = section.data() else { continue };
            let start = (sym.address() - section.address()) as usize;
            if start >= bytes.len() {
                continue;
            }
            let end = (start + sym.size() as usize).min(bytes.len());
            let padding = &bytes[end..(end + 32).min(bytes.len())];
            total += 1;
            let name = sym.name().unwrap_or("?");
            match analyze_entry(&FunctionCode {
                address: sym.address(),
                bytes: &bytes[start..end],
                padding,
            }) {
                Ok(site) => {
                    for delta in [0x1000_0000i64, -0x1000_0000, 0x1000] {
                        let r = relocate(&site, sym.address().wrapping_add_signed(delta))
                            .unwrap_or_else(|e| panic!("{}: {name}: {e}", path.display()));
                        check_relocation(&site, &r);
                    }
                    ok += 1;
                }
                Err(reason) => {
                    assert!(!reason.to_string().is_empty(), "{name}: empty reason");
                    refused += 1;
                }
            }
        }
        eprintln!(
            "{}: {total} functions, {ok} relocated and checked, {refused} refused with a reason",
            path.display()
        );
        assert!(total > 500, "{}: only {total} functions", path.display());
        assert!(ok > total / 2, "{}: too many refusals", path.display());
    }
}
