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
