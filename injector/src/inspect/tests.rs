//! Tests against real processes and files: this test process's own libc,
//! freshly compiled C programs (stripped, static), and a corpus of corrupted
//! ELF files.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::maps::{free_gap_near, parse_maps};
use super::*;

fn own_pid() -> i32 {
    std::process::id() as i32
}

fn dlsym(name: &str) -> u64 {
    let c = CString::new(name).unwrap();
    // SAFETY: dlsym only reads the NUL-terminated name; RTLD_DEFAULT is a
    // valid pseudo-handle.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c.as_ptr()) };
    assert!(!p.is_null(), "dlsym({name}) failed");
    p as u64
}

fn pats(p: &[&str]) -> Vec<Pattern> {
    p.iter().map(|s| Pattern::parse(s).unwrap()).collect()
}

fn find_one(img: &mut ProcessImage, pattern: &str) -> FoundFunction {
    let found = img.find_functions(&pats(&[pattern])).unwrap();
    assert_eq!(found.len(), 1, "{pattern}: {found:#?}");
    found.into_iter().next().unwrap()
}

fn libc_module(img: &ProcessImage) -> &Module {
    img.modules()
        .iter()
        .find(|m| m.name().starts_with("libc.so"))
        .expect("the test process maps libc")
}

#[test]
fn own_process_modules() {
    let img = ProcessImage::open(own_pid()).unwrap();
    let exe = img.executable().expect("main executable identified");
    assert!(std::ptr::eq(exe, &img.modules()[0]));
    let me = std::fs::canonicalize("/proc/self/exe").unwrap();
    assert_eq!(exe.path(), me);
    let here = own_process_modules as *const () as usize as u64;
    assert!(std::ptr::eq(img.module_of(here).unwrap(), exe));
    assert!(exe.is_executable_address(here));
    let libc = libc_module(&img);
    assert!(libc.contains(dlsym("malloc")));
    assert!(libc.executable_ranges().count() >= 1);
    // Every module is an ELF file, mapped once, with a page-aligned bias.
    for m in img.modules() {
        assert_eq!(m.bias() % 4096, 0, "{m:?}");
        assert!(!m.mappings().is_empty());
    }
    let n = img.modules().len();
    assert_eq!(
        img.modules()
            .iter()
            .map(|m| (m.dev(), m.inode()))
            .collect::<std::collections::HashSet<_>>()
            .len(),
        n
    );
    assert!(!img.is_statically_linked());
    assert!(img.module_of(0).is_none());
}

#[test]
fn finds_libc_functions_at_their_runtime_addresses() {
    let mut img = ProcessImage::open(own_pid()).unwrap();
    for (pattern, name) in [
        ("libc.so.6:malloc", "malloc"),
        ("libc:printf", "printf"),
        ("libc.so:free", "free"),
    ] {
        let f = find_one(&mut img, pattern);
        assert_eq!(f.name, name);
        assert_eq!(f.module, "libc.so.6");
        assert_eq!(f.kind, FunctionKind::Plain);
        assert_eq!(f.address, dlsym(name), "{name}");
        assert!(f.size > 0);
        assert!(f.padding <= 64);
    }
    assert_eq!(
        find_one(&mut img, "libc.so.6:malloc").address,
        libc::malloc as *const () as usize as u64
    );
    assert_eq!(
        find_one(&mut img, "libc.so.6:printf").address,
        libc::printf as *const () as usize as u64
    );

    // dlopen lives in libc since glibc 2.34.
    assert_eq!(
        img.symbol_address("libc.so", "dlopen"),
        Some(dlsym("dlopen"))
    );
    assert_eq!(img.symbol_address("libc.so", "mmap"), Some(dlsym("mmap")));
    assert_eq!(
        img.symbol_address("libc.so", "no_such_symbol_anywhere"),
        None
    );
    assert_eq!(img.symbol_address("libnotloaded", "malloc"), None);
}

#[test]
fn memcpy_is_an_ifunc_and_its_got_slots_hold_an_implementation() {
    let mut img = ProcessImage::open(own_pid()).unwrap();
    let f = find_one(&mut img, "libc.so.6:memcpy");
    let FunctionKind::Ifunc { resolver } = f.kind else {
        panic!("memcpy should be an IFUNC in glibc: {f:?}");
    };
    assert_eq!(resolver, f.address);
    // What the resolver picked, as seen through this executable's GOT.
    let chosen = libc::memcpy as *const () as usize as u64;
    assert_ne!(chosen, resolver);

    let libc = libc_module(&img);
    let exec: Vec<_> = libc.executable_ranges().collect();
    let slots = libc
        .image()
        .unwrap()
        .ifunc_got_slots("memcpy", f.vaddr)
        .unwrap();
    assert!(
        !slots.is_empty(),
        "libc has IRELATIVE slots for its own memcpy calls"
    );
    for s in slots {
        let addr = libc.runtime_address(s);
        assert!(libc.contains(addr), "slot {addr:#x} outside libc");
        // SAFETY: the slot is in libc's RELRO/GOT, mapped readable in this
        // very process for as long as libc is loaded (always), and 8-aligned.
        let value = unsafe { std::ptr::read_volatile(addr as *const u64) };
        assert_ne!(value, resolver);
        assert!(
            value == chosen || exec.iter().any(|r| r.contains(&value)),
            "slot {addr:#x} holds {value:#x}, not in libc's code"
        );
    }
    // Across all modules, some slot holds exactly the implementation chosen.
    let all = img.ifunc_slots(&f).unwrap();
    assert!(!all.is_empty());
    let values: Vec<u64> = all
        .iter()
        // SAFETY: as above; every slot is in a loaded module's GOT.
        .map(|&a| unsafe { std::ptr::read_volatile(a as *const u64) })
        .collect();
    assert!(
        values.contains(&chosen),
        "{values:x?} should contain {chosen:#x}"
    );
    assert_eq!(img.resolved_address(&f), Some(chosen));

    // The implementation is not exported; its FDE gives its extent.
    let imp = img
        .function_at(chosen)
        .unwrap()
        .expect("implementation found");
    assert_eq!(imp.address, chosen);
    assert!(imp.size > 0);
    assert_eq!(imp.kind, FunctionKind::Plain);
    let malloc = img.function_at(dlsym("malloc") + 1).unwrap().unwrap();
    assert_eq!(malloc.name, "malloc");
    assert_eq!(img.resolved_address(&malloc), Some(dlsym("malloc")));
    assert!(img.function_at(0).unwrap().is_none());
}

#[test]
fn default_symbol_version_is_chosen() {
    let mut img = ProcessImage::open(own_pid()).unwrap();
    // glibc has pthread_cond_wait@GLIBC_2.2.5 and @@GLIBC_2.3.2.
    let f = find_one(&mut img, "libc.so.6:pthread_cond_wait");
    assert_eq!(f.address, dlsym("pthread_cond_wait"));
    let libc = libc_module(&img);
    let funcs = libc.image().unwrap().functions().unwrap();
    assert_eq!(
        funcs
            .iter()
            .filter(|f| f.name == "pthread_cond_wait")
            .count(),
        1
    );
    // And only one memcpy (the @@GLIBC_2.14 IFUNC, not the old @GLIBC_2.2.5).
    let memcpys: Vec<_> = funcs.iter().filter(|f| f.name == "memcpy").collect();
    assert_eq!(memcpys.len(), 1);
    assert_eq!(memcpys[0].kind, SymbolKind::Ifunc);
    assert!(funcs.iter().all(|f| !f.name.contains('@')));
}

#[test]
fn aliases_are_merged_and_suggestions_offered() {
    let mut img = ProcessImage::open(own_pid()).unwrap();
    let found = img.find_functions(&pats(&["libc.so.6:*alloc*"])).unwrap();
    let malloc = found.iter().find(|f| f.address == dlsym("malloc")).unwrap();
    // glibc exports malloc and __libc_malloc at the same address; the plain
    // name wins.
    assert_eq!(malloc.name, "malloc");
    assert!(
        malloc.aliases.contains(&"__libc_malloc".to_string()),
        "{malloc:?}"
    );
    let mut seen = std::collections::HashSet::new();
    assert!(found.iter().all(|f| seen.insert(f.address)));

    assert!(img
        .find_functions(&pats(&["libc:wrok_a_typo"]))
        .unwrap()
        .is_empty());
    let names = img.all_function_names(&pats(&["libc:mallco"])).unwrap();
    let s = suggest("mallco", names.iter().map(String::as_str));
    assert!(s.contains(&"malloc".to_string()), "{s:?}");
    // A pattern naming no loaded module touches nothing.
    assert!(img
        .find_functions(&pats(&["libzzz:malloc"]))
        .unwrap()
        .is_empty());
}

#[test]
fn maps_parse_and_free_gap_near_libc() {
    let img = ProcessImage::open(own_pid()).unwrap();
    let libc = libc_module(&img);
    let near = libc.base();
    let gap = free_gap_near(img.maps(), near, 0x10000, 1 << 31).unwrap();
    assert_eq!(gap % 4096, 0);
    assert!(gap.abs_diff(near) < 1 << 31);
    assert!(img
        .maps()
        .iter()
        .all(|m| m.end <= gap || m.start >= gap + 0x10000));
}

// ---------------------------------------------------------------- C programs

const C_SOURCE: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((noinline)) int work_a(int x) { return x * 3 + (int)getpid() % 7; }
__attribute__((noinline)) int work_b(int x) { return work_a(x) ^ 0x55; }
static __attribute__((noinline)) int helper(int x) { return work_b(x) + x / 3; }
int main(int argc, char **argv) {
    int v = helper(argc);
    if (argc > 1) { for (;;) pause(); }
    printf("%d\n", v);
    return 0;
}
"#;

/// A scratch directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("weft-inspect-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn gcc(dir: &Path, out: &str, extra: &[&str]) -> PathBuf {
    let src = dir.join("prog.c");
    std::fs::write(&src, C_SOURCE).unwrap();
    let exe = dir.join(out);
    let status = Command::new("gcc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(extra)
        .status()
        .expect("gcc is installed");
    assert!(status.success(), "gcc {extra:?} failed");
    exe
}

/// A running instance of a compiled program, killed on drop.
struct Running(Child);

impl Running {
    fn start(exe: &Path) -> Running {
        let child = Command::new(exe).arg("wait").spawn().unwrap();
        let pid = child.id();
        let running = Running(child);
        // Wait until the dynamic loader is done: `pause` is reached after
        // libc is mapped, and the state goes to S.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let state = process_state(pid as i32).unwrap();
            let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
            if state == ProcState::Sleeping && maps.contains(&*exe.to_string_lossy()) {
                break;
            }
            assert!(Instant::now() < deadline, "child did not start");
            std::thread::sleep(Duration::from_millis(5));
        }
        running
    }

    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn stripped_binary_uses_eh_frame() {
    let dir = TempDir::new("strip");
    let plain = gcc(&dir.0, "plain", &[]);
    let stripped = gcc(&dir.0, "stripped", &["-s"]);

    let plain_img = ElfImage::open(&plain).unwrap();
    assert!(plain_img.is_dynamic() && plain_img.is_executable());
    assert!(plain_img.interpreter().unwrap().contains("ld-linux"));
    let funcs = plain_img.functions().unwrap();
    let main = funcs.iter().find(|f| f.name == "main").unwrap();
    assert_eq!(main.source, SymbolSource::Symtab);
    let work_a = funcs.iter().find(|f| f.name == "work_a").unwrap();
    assert!(funcs
        .iter()
        .any(|f| f.name == "helper" && f.binding == Binding::Local));
    assert!(funcs.iter().all(|f| f.source != SymbolSource::EhFrame));
    assert_eq!(
        plain_img.symbol_vaddr("work_a").unwrap(),
        Some(work_a.vaddr)
    );
    assert_eq!(
        plain_img.symbol_vaddr("printf").unwrap(),
        None,
        "an import is not defined"
    );
    // work_a is followed by alignment padding up to work_b (16-byte aligned).
    let pad = plain_img.padding_after(work_a.vaddr, work_a.size).unwrap();
    assert!(pad <= 64);
    let next = funcs
        .iter()
        .map(|f| f.vaddr)
        .filter(|&v| v > work_a.vaddr)
        .min()
        .unwrap();
    assert_eq!(pad, (next - work_a.vaddr - work_a.size).min(64));

    let img = ElfImage::open(&stripped).unwrap();
    let sfuncs = img.functions().unwrap();
    assert!(!sfuncs.is_empty());
    let eh: Vec<_> = sfuncs
        .iter()
        .filter(|f| f.source == SymbolSource::EhFrame)
        .collect();
    assert!(eh.len() >= 3, "{sfuncs:#?}");
    let m = eh
        .iter()
        .find(|f| f.vaddr == main.vaddr)
        .expect("an FDE starts at main");
    assert_eq!(m.name, format!("fun_{:x}", main.vaddr));
    assert!(eh
        .iter()
        .any(|f| f.vaddr == work_a.vaddr && f.size == work_a.size));

    // In a live process: the stripped program's functions are found, at
    // their runtime addresses.
    let child = Running::start(&stripped);
    let mut pimg = ProcessImage::open(child.pid()).unwrap();
    assert!(!pimg.is_statically_linked());
    let exe = pimg.executable().unwrap();
    assert_eq!(exe.path(), std::fs::canonicalize(&stripped).unwrap());
    let bias = exe.bias();
    let found = pimg.find_functions(&pats(&["stripped:fun_*"])).unwrap();
    assert!(found
        .iter()
        .any(|f| f.address == main.vaddr + bias && f.source == SymbolSource::EhFrame));
    let t = Instant::now();
    let mut fresh = ProcessImage::open(child.pid()).unwrap();
    let all = fresh.find_functions(&pats(&["*"])).unwrap();
    let elapsed = t.elapsed();
    eprintln!(
        "open + find_functions(*) on exe+libc+ld.so: {elapsed:?}, {} functions",
        all.len()
    );
    assert!(all.iter().any(|f| f.name == "malloc"));
    // The budget is 50 ms in release builds; debug builds are ~10x slower.
    let budget = if cfg!(debug_assertions) { 200 } else { 50 };
    assert!(elapsed < Duration::from_millis(budget), "took {elapsed:?}");
}

#[test]
fn running_program_functions_and_refresh() {
    let dir = TempDir::new("run");
    let plain = gcc(&dir.0, "plain", &[]);
    let child = Running::start(&plain);
    let mut img = ProcessImage::open(child.pid()).unwrap();
    let found = img
        .find_functions(&pats(&["work_?", "plain:helper"]))
        .unwrap();
    let names: Vec<&str> = found.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["work_a", "work_b", "helper"]);
    let exe = img.executable().unwrap();
    for f in &found {
        assert!(exe.is_executable_address(f.address));
        assert_eq!(f.module, "plain");
    }
    // The code at the found address is the code in the file.
    let work_a = &found[0];
    let mut live = vec![0u8; work_a.size as usize];
    let mem = std::fs::File::open(format!("/proc/{}/mem", child.pid())).unwrap();
    std::os::unix::fs::FileExt::read_exact_at(&mem, &mut live, work_a.address).unwrap();
    let file = std::fs::read(&plain).unwrap();
    let off = work_a.vaddr as usize; // PIE: text vaddr == file offset with default layout
    let seg = exe
        .header()
        .segments
        .iter()
        .find(|s| s.is_load() && s.vaddr <= work_a.vaddr && work_a.vaddr < s.vaddr + s.filesz)
        .unwrap();
    let off = off - seg.vaddr as usize + seg.offset as usize;
    assert_eq!(live, &file[off..off + live.len()]);

    img.refresh().unwrap();
    assert!(
        img.executable().unwrap().loaded_image().is_some(),
        "refresh keeps parsed images"
    );
    assert_eq!(crate::ptrace::tracer_of(child.pid()), None);
}

#[test]
fn static_binary_is_detected() {
    let dir = TempDir::new("static");
    let exe = gcc(&dir.0, "static", &["-static"]);
    let img = ElfImage::open(&exe).unwrap();
    assert!(!img.is_dynamic());
    assert!(img.interpreter().is_none());
    let child = Running::start(&exe);
    let pimg = ProcessImage::open(child.pid()).unwrap();
    assert!(pimg.is_statically_linked());
}

#[test]
fn errors_for_missing_processes() {
    let e = ProcessImage::open(i32::MAX).unwrap_err();
    assert!(matches!(e, InspectError::NoSuchProcess(_)), "{e}");
    assert!(e.to_string().contains("no such process: PID"));
    // PID 2 is kthreadd on Linux: no address space (or not visible).
    match ProcessImage::open(2) {
        Err(InspectError::NoAddressSpace(2))
        | Err(InspectError::NoSuchProcess(2))
        | Err(InspectError::PermissionDenied { .. }) => {}
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        ElfImage::open("/nonexistent/file"),
        Err(InspectError::Io { .. })
    ));
    let e = ElfImage::open("/proc/self/status").unwrap_err();
    assert!(matches!(e, InspectError::NotElf { .. }), "{e}");
}

// ------------------------------------------------------- malformed ELF corpus

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Calls every method; any result is fine, a panic or hang is not.
fn exercise(data: Vec<u8>) {
    let Ok(img) = ElfImage::from_bytes("corpus", data) else {
        return;
    };
    let _ = img.is_dynamic();
    let _ = img.is_executable();
    let _ = img.interpreter();
    let fake =
        parse_maps("1000-2000 r--p 00000000 08:01 7 /x\n2000-3000 r-xp 00001000 08:01 7 /x\n")
            .unwrap();
    let _ = img.load_bias(&fake);
    if let Ok(funcs) = img.functions() {
        for f in funcs.iter().take(50) {
            let _ = img.padding_after(f.vaddr, f.size);
        }
    }
    let _ = img.padding_after(u64::MAX, u64::MAX);
    let _ = img.ifunc_got_slots("memcpy", 0x1234);
    let _ = img.symbol_vaddr("main");
    let data = img.data();
    let _ = module::read_soname(img.header(), &|b: &mut [u8], o: u64| {
        let Some(rest) = usize::try_from(o).ok().and_then(|o| data.get(o..)) else {
            return Ok(0);
        };
        let n = b.len().min(rest.len());
        b[..n].copy_from_slice(&rest[..n]);
        Ok(n)
    });
}

#[test]
fn malformed_elf_never_panics() {
    let dir = TempDir::new("corpus");
    let plain = std::fs::read(gcc(&dir.0, "plain", &[])).unwrap();
    let stripped = std::fs::read(gcc(&dir.0, "stripped", &["-s"])).unwrap();
    for base in [&plain, &stripped] {
        // Truncations: every length in the headers, then a stride.
        for len in (0..512).chain((512..base.len()).step_by(97)) {
            exercise(base[..len].to_vec());
        }
        // Random byte flips, 1 to 8 per file.
        let mut rng = Rng(0x5eed_1234_abcd_0001);
        for _ in 0..400 {
            let mut d = base.clone();
            for _ in 0..=(rng.next() % 8) {
                let i = (rng.next() % d.len() as u64) as usize;
                d[i] ^= 1 << (rng.next() % 8);
            }
            exercise(d);
        }
        // Whole fields replaced by extreme values in the first 4 KiB
        // (headers, dynsym, versions, relocations, eh_frame_hdr).
        for _ in 0..300 {
            let mut d = base.clone();
            let i = (rng.next() % 4096.min(d.len() as u64 - 8)) as usize;
            let v: u64 = match rng.next() % 3 {
                0 => u64::MAX,
                1 => 0,
                _ => rng.next(),
            };
            d[i..i + 8].copy_from_slice(&v.to_le_bytes());
            exercise(d);
        }
    }
}

#[test]
fn corrupted_libc_never_panics() {
    let img = ProcessImage::open(own_pid()).unwrap();
    let libc = std::fs::read(libc_module(&img).image().unwrap().path()).unwrap();
    let mut rng = Rng(42);
    for _ in 0..40 {
        let mut d = libc.clone();
        for _ in 0..16 {
            let i = (rng.next() % d.len() as u64) as usize;
            d[i] = rng.next() as u8;
        }
        exercise(d);
    }
    // Truncated in the middle of the section headers, .dynsym, .eh_frame.
    for frac in [1, 3, 10, 50, 90, 99, 100] {
        exercise(libc[..libc.len() * frac / 100].to_vec());
    }
}

/// A library whose file name (`libfoo.so.1.2.3`) is not its soname
/// (`libfoo.so.1`), and a program linked against it, started through a
/// symlink `mytool`: the module answers to its soname, the executable to
/// `exe` and to the name it was started as.
#[test]
fn modules_answer_to_soname_started_name_and_exe() {
    let dir = TempDir::new("modnames");
    let d = &dir.0;
    std::fs::write(d.join("foo.c"), "int foo(int x) { return x * 3; }\n").unwrap();
    std::fs::write(
        d.join("main.c"),
        "#include <unistd.h>\nint foo(int);\n\
         __attribute__((noinline)) int work_a(int x) { return foo(x) + 1; }\n\
         int main(void) { volatile int r = work_a(2); (void)r; pause(); return 0; }\n",
    )
    .unwrap();
    let run = |args: &[&str]| {
        let st = Command::new("gcc")
            .current_dir(d)
            .args(args)
            .status()
            .unwrap();
        assert!(st.success(), "gcc {args:?}");
    };
    run(&[
        "-shared",
        "-fPIC",
        "-Wl,-soname,libfoo.so.1",
        "-o",
        "libfoo.so.1.2.3",
        "foo.c",
    ]);
    std::os::unix::fs::symlink("libfoo.so.1.2.3", d.join("libfoo.so.1")).unwrap();
    std::os::unix::fs::symlink("libfoo.so.1.2.3", d.join("libfoo.so")).unwrap();
    run(&[
        "-O1",
        "-o",
        "realprog",
        "main.c",
        "-L.",
        "-lfoo",
        "-Wl,-rpath,$ORIGIN",
    ]);
    std::os::unix::fs::symlink("realprog", d.join("mytool")).unwrap();

    let child = Command::new(d.join("mytool")).spawn().unwrap();
    let pid = child.id() as i32;
    let child = Running(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(process_state(pid).unwrap() == ProcState::Sleeping
        && std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .unwrap_or_default()
            .contains("libfoo.so.1.2.3"))
    {
        assert!(Instant::now() < deadline, "child did not start");
        std::thread::sleep(Duration::from_millis(5));
    }

    let mut img = ProcessImage::open(child.pid()).unwrap();
    let exe = img.executable().unwrap();
    assert_eq!(exe.name(), "realprog");
    assert!(
        exe.started_as().iter().any(|n| n == "mytool"),
        "{:?}",
        exe.started_as()
    );
    let names: Vec<&str> = exe.names().collect();
    assert!(names.contains(&"exe"), "{names:?}");
    let lib = img
        .modules()
        .iter()
        .find(|m| m.name() == "libfoo.so.1.2.3")
        .unwrap();
    assert_eq!(lib.soname(), Some("libfoo.so.1"));
    assert!(lib.started_as().is_empty());
    assert!(!lib.names().any(|n| n == "exe"));

    for (pattern, module) in [
        ("exe:work_a", "realprog"),
        ("mytool:work_a", "realprog"),
        ("realprog:work_a", "realprog"),
        ("libfoo.so.1:foo", "libfoo.so.1.2.3"),
        ("libfoo.so.1.2.3:foo", "libfoo.so.1.2.3"),
        ("libfoo:foo", "libfoo.so.1.2.3"),
    ] {
        let f = find_one(&mut img, pattern);
        assert_eq!(f.module, module, "{pattern}");
    }
    assert!(img.find_functions(&pats(&["exe:foo"])).unwrap().is_empty());

    // Misspelled modules: near names among all of them.
    let s = img
        .suggest(&Pattern::parse("mytol:work_a").unwrap())
        .unwrap();
    assert!(s.contains(&"mytool:work_a".to_string()), "{s:?}");
    let s = img
        .suggest(&Pattern::parse("libfoo.so.2:foo").unwrap())
        .unwrap();
    assert!(s.contains(&"libfoo.so.1:foo".to_string()), "{s:?}");
    let s = img.suggest(&Pattern::parse("exx:work_a").unwrap()).unwrap();
    assert!(s.contains(&"exe:work_a".to_string()), "{s:?}");
}

/// Runs objcopy with `args`.
fn objcopy(args: &[&std::ffi::OsStr]) {
    let status = Command::new("objcopy")
        .args(args)
        .status()
        .expect("objcopy is installed");
    assert!(status.success(), "objcopy {args:?} failed");
}

#[test]
fn debug_file_by_build_id_is_used_only_when_it_belongs() {
    use super::elf::debugfile::{find, Origin, Stripped};
    use std::ffi::OsStr;
    let dir = TempDir::new("debugfile");
    let exe = gcc(&dir.0, "prog", &["-g", "-Wl,--build-id"]);
    let other = gcc(&dir.0, "other", &["-g", "-Wl,--build-id", "-O0"]);
    let id = super::elf::debugfile::build_id(&std::fs::read(&exe).unwrap()).unwrap();
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let place = dir
        .0
        .join("dbg/.build-id")
        .join(&hex[..2])
        .join(format!("{}.debug", &hex[2..]));
    std::fs::create_dir_all(place.parent().unwrap()).unwrap();
    let keep = |from: &Path| {
        objcopy(&[
            OsStr::new("--only-keep-debug"),
            from.as_os_str(),
            place.as_os_str(),
        ])
    };
    keep(&exe);
    objcopy(&[OsStr::new("--strip-all"), exe.as_os_str()]);

    let data = std::fs::read(&exe).unwrap();
    let origin = Origin {
        path: Some(exe.clone()),
        dir: Some(dir.0.clone()),
    };
    let stripped = Stripped {
        path: &exe,
        opened: Some(&exe),
        data: &data,
        origin: &origin,
    };
    let dirs = [dir.0.join("nothing-here"), dir.0.join("dbg")];
    let info = find(&stripped, &dirs);
    assert_eq!(
        *info.source(),
        DebugSource::File {
            path: place.clone(),
            kind: LinkKind::BuildId
        }
    );
    assert!(info.ignored().is_empty(), "{:?}", info.ignored());
    // The debug file's `.text` is SHT_NOBITS: its symbols still name the
    // stripped file's code, with sizes.
    let dbg = info.image().unwrap();
    let funcs = dbg.functions().unwrap();
    let work_a = funcs.iter().find(|f| f.name == "work_a").unwrap();
    assert!(work_a.size > 0);
    let line = dbg.source_line(work_a.vaddr).unwrap().unwrap();
    assert!(line.file.ends_with("prog.c"), "{line}");

    // Another build's debug file at that place: ignored, with the reason.
    keep(&other);
    let info = find(&stripped, &dirs);
    assert_eq!(*info.source(), DebugSource::None);
    assert!(
        matches!(
            &*info.ignored()[0],
            InspectError::DebugFileMismatch { debug_file, .. } if *debug_file == place
        ),
        "{:?}",
        info.ignored()
    );
}
