//! Patches real functions in executable memory and runs them: results,
//! counters, registers, flags and vector state must all come out right, on
//! the fast and the slow (first hit of a thread) path, from several threads.
#![cfg(all(target_arch = "x86_64", target_os = "linux"))]

mod common;

use std::arch::asm;
use std::cell::Cell;
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};

use iced_x86::code_asm::*;
use iced_x86::BlockEncoderOptions;
use weft_codegen::*;

const ROW_WORDS: usize = 64;
/// Row word the trampolines bump after counting (the activity word).
const ACTIVITY_WORD: usize = ROW_WORDS - 1;

thread_local! {
    /// This thread's row; the generated code reads it with `mov rcx, fs:[off]`.
    /// A const-initialized, drop-free `thread_local!` is a plain static-TLS
    /// variable in the executable, so its offset from `%fs` is the same in
    /// every thread.
    static ROW: Cell<*mut u64> = const { Cell::new(ptr::null_mut()) };
}

static REGISTRATIONS: AtomicUsize = AtomicUsize::new(0);

/// The registration function the stub calls (stand-in for the runtime's
/// `weft_rt_register_thread`). It deliberately trashes every caller-saved
/// register, the flags and vector registers the stub must restore.
extern "C" fn register_thread() -> *mut u8 {
    // SAFETY: only writes registers declared as clobbered; no memory access.
    unsafe {
        asm!(
            "pcmpeqd xmm0, xmm0", "pcmpeqd xmm1, xmm1", "pcmpeqd xmm7, xmm7", "pcmpeqd xmm15, xmm15",
            "mov rax, -1", "mov rdx, -1", "mov rsi, -1", "mov rdi, -1",
            "mov r8, -1", "mov r9, -1", "mov r10, -1", "mov r11, -1",
            "xor eax, eax", // changes ZF/PF/... too
            out("xmm0") _, out("xmm1") _, out("xmm7") _, out("xmm15") _,
            out("rax") _, out("rdx") _, out("rsi") _, out("rdi") _,
            out("r8") _, out("r9") _, out("r10") _, out("r11") _,
        );
    }
    let row = Box::leak(vec![0u64; ROW_WORDS].into_boxed_slice()).as_mut_ptr();
    ROW.with(|r| r.set(row));
    REGISTRATIONS.fetch_add(1, Ordering::SeqCst);
    row.cast()
}

/// The thread pointer (`%fs` base); glibc keeps a self-pointer at `fs:0`.
fn thread_pointer() -> u64 {
    let tp: u64;
    // SAFETY: reads the TCB self-pointer, always mapped on x86-64 Linux.
    unsafe { asm!("mov {}, fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags)) };
    tp
}

fn tls_offset() -> i32 {
    let var = ROW.with(|r| r as *const Cell<*mut u64> as u64);
    i32::try_from(var.wrapping_sub(thread_pointer()) as i64)
        .expect("static TLS within ±2 GiB of fs")
}

/// This thread's counter `i` (0 before the thread's first hit).
fn counter(i: usize) -> u64 {
    let row = ROW.with(|r| r.get());
    if row.is_null() {
        return 0;
    }
    // SAFETY: rows are leaked `ROW_WORDS`-word allocations, written only by
    // this thread (the generated `inc`), which is not running it now.
    unsafe { row.add(i).read_volatile() }
}

/// An RWX mapping holding functions, trampolines and the stub, all within
/// `rel32` reach of each other.
struct Lab {
    base: *mut u8,
    len: usize,
    used: usize,
    stub: u64,
    next_counter: usize,
}

impl Lab {
    fn new(save: VectorSave) -> Lab {
        let len = 1 << 20;
        // SAFETY: a fresh anonymous mapping; no existing memory is affected.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let mut lab = Lab {
            base: base.cast(),
            len,
            used: 0,
            stub: 0,
            next_counter: 0,
        };
        let stub_addr = lab.alloc(register_stub_len(save));
        let stub = register_stub(stub_addr, register_thread as *const () as u64, save).unwrap();
        lab.write(stub_addr, &stub);
        lab.stub = stub_addr;
        lab
    }

    fn alloc(&mut self, n: usize) -> u64 {
        let at = self.used.next_multiple_of(64);
        assert!(at + n <= self.len);
        self.used = at + n;
        self.base as u64 + at as u64
    }

    fn write(&mut self, addr: u64, bytes: &[u8]) {
        let off = (addr - self.base as u64) as usize;
        assert!(off + bytes.len() <= self.len);
        // SAFETY: in bounds of our mapping (checked above), and no thread
        // executes these bytes while we write (patching happens before calls).
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(off), bytes.len()) };
    }

    fn bytes(&self, addr: u64, len: usize) -> &[u8] {
        let off = (addr - self.base as u64) as usize;
        // SAFETY: in bounds of our mapping, which lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.base.add(off), len) }
    }

    /// Assembles a function with `build`, whose `end` label marks the end of
    /// its code (data may follow), followed by int3 padding.
    fn assemble(&mut self, build: impl FnOnce(&mut CodeAssembler, &mut CodeLabel)) -> (u64, usize) {
        let addr = self.alloc(256);
        let mut a = CodeAssembler::new(64).unwrap();
        let mut end = a.create_label();
        build(&mut a, &mut end);
        let res = a
            .assemble_options(addr, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)
            .unwrap();
        let code_len = (res.label_ip(&end).unwrap() - addr) as usize;
        let bytes = res.inner.code_buffer;
        assert!(bytes.len() <= 240);
        self.write(addr, &[0xcc; 256]);
        self.write(addr, &bytes);
        (addr, code_len)
    }

    /// Patches the function at `addr` (`len` code bytes) with a counting
    /// trampoline; returns the counter index.
    fn patch(&mut self, addr: u64, len: usize) -> (usize, PatchSite) {
        let idx = self.next_counter;
        self.next_counter += 1;
        assert!(idx < ACTIVITY_WORD);
        let code = self.bytes(addr, len).to_vec();
        let padding = self.bytes(addr + len as u64, 16).to_vec();
        let site = analyze_entry(&FunctionCode {
            address: addr,
            bytes: &code,
            padding: &padding,
        })
        .unwrap();
        let snippets = [Snippet::CountCall {
            offset: 8 * idx as i32,
        }];
        let t_addr = self.alloc(max_trampoline_len(&site, &snippets));
        let row = ThreadRow {
            tls_offset: tls_offset(),
            register_stub: self.stub,
            activity: Some(8 * ACTIVITY_WORD as i32),
        };
        let t = build_trampoline(&TrampolineSpec {
            address: t_addr,
            site: &site,
            row,
            snippets: &snippets,
        })
        .unwrap();
        self.write(t_addr, &t.bytes);
        let jmp = jmp_rel32(site.patch_address, t_addr).unwrap();
        self.write(site.patch_address, &jmp);
        (idx, site)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // SAFETY: our own mapping; all threads using it have been joined.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

type Fn1 = extern "C" fn(u64) -> u64;

/// A patched function, how to call it and what it must return.
struct Probe {
    name: &'static str,
    counter: usize,
    call: Box<dyn Fn() -> (u64, u64) + Send + Sync>,
}

fn fn1(addr: u64) -> Fn1 {
    // SAFETY: `addr` holds a function following the C ABI with this signature.
    unsafe { std::mem::transmute::<usize, Fn1>(addr as usize) }
}

/// Calls `f` with the arithmetic flags set to `flags` and returns what it
/// returns (the flags functions return `rflags` as seen on their entry).
fn call_with_flags(f: u64, flags: u64) -> u64 {
    let out: u64;
    // SAFETY: `f` is a patched `pushfq; pop rax; ret`-style function that
    // follows the C ABI; DF is kept clear as the ABI requires.
    unsafe {
        asm!("push {fl}", "popfq", "call {f}", fl = in(reg) flags, f = in(reg) f, out("rax") out, clobber_abi("C"));
    }
    out
}

const ARITH_FLAGS: u64 = 0x8d5; // OF SF ZF AF PF CF

/// Builds the set of patched functions in `lab`.
fn probes(lab: &mut Lab) -> Vec<Probe> {
    let mut out = Vec::new();
    let mut add = |lab: &mut Lab,
                   name,
                   build: &dyn Fn(&mut CodeAssembler, &mut CodeLabel),
                   check: Box<dyn Fn(u64) -> (u64, u64) + Send + Sync>| {
        let (addr, len) = lab.assemble(|a, end| build(a, end));
        let (counter, site) = lab.patch(addr, len);
        let _ = site;
        let call = Box::new(move || check(addr));
        out.push(Probe {
            name,
            counter,
            call,
        });
    };

    // lea rax, [rip+data] first.
    add(
        lab,
        "lea_rip",
        &|a, end| {
            let data = *end; // the data starts where the code ends
            a.lea(rax, ptr(data)).unwrap();
            a.mov(rax, qword_ptr(rax)).unwrap();
            a.add(rax, rdi).unwrap();
            a.ret().unwrap();
            a.set_label(end).unwrap();
            a.dq(&[1000]).unwrap();
        },
        Box::new(|f| (fn1(f)(5), 1005)),
    );

    // mov rax, [rip+data] first.
    add(
        lab,
        "mov_rip",
        &|a, end| {
            let data = *end;
            a.mov(rax, qword_ptr(data)).unwrap();
            a.add(rax, rdi).unwrap();
            a.ret().unwrap();
            a.set_label(end).unwrap();
            a.dq(&[2000]).unwrap();
        },
        Box::new(|f| (fn1(f)(6), 2006)),
    );

    // A short jcc among the displaced instructions.
    add(
        lab,
        "jcc_short",
        &|a, end| {
            let mut zero = a.create_label();
            a.test(rdi, rdi).unwrap();
            a.je(zero).unwrap();
            a.lea(rax, qword_ptr(rdi + 1)).unwrap();
            a.ret().unwrap();
            a.set_label(&mut zero).unwrap();
            a.mov(eax, 42).unwrap();
            a.ret().unwrap();
            a.set_label(end).unwrap();
            a.nop().unwrap();
        },
        Box::new(|f| (fn1(f)(0) * 1000 + fn1(f)(9), 42_010)),
    );

    // endbr64, then ordinary code.
    add(
        lab,
        "endbr64",
        &|a, end| {
            a.endbr64().unwrap();
            a.push(rbx).unwrap();
            a.mov(rbx, rdi).unwrap();
            a.lea(rax, qword_ptr(rbx + 3)).unwrap();
            a.pop(rbx).unwrap();
            a.ret().unwrap();
            a.set_label(end).unwrap();
            a.nop().unwrap();
        },
        Box::new(|f| (fn1(f)(1), 4)),
    );

    // A helper returning its own return address.
    let (helper, _) = lab.assemble(|a, end| {
        a.mov(rax, qword_ptr(rsp)).unwrap();
        a.ret().unwrap();
        a.set_label(end).unwrap();
        a.nop().unwrap();
    });

    // call rel32 as the only displaced instruction: the callee must see the
    // ORIGINAL return address.
    add(
        lab,
        "call_first",
        &move |a, end| {
            a.call(helper).unwrap();
            a.ret().unwrap();
            a.set_label(end).unwrap();
            a.nop().unwrap();
        },
        Box::new(|f| (fn1(f)(0), f + 5)),
    );

    // call [rip+slot], GOT style.
    add(
        lab,
        "call_got",
        &move |a, end| {
            let slot = *end;
            a.call(qword_ptr(slot)).unwrap();
            a.ret().unwrap();
            a.set_label(end).unwrap();
            a.dq(&[helper]).unwrap();
        },
        Box::new(|f| (fn1(f)(0), f + 6)),
    );

    // Six integer arguments (rcx is one of them and is used by the trampoline).
    add(
        lab,
        "six_args",
        &|a, end| {
            a.lea(rax, qword_ptr(rdi + rsi)).unwrap();
            a.add(rax, rdx).unwrap();
            a.add(rax, rcx).unwrap();
            a.add(rax, r8).unwrap();
            a.add(rax, r9).unwrap();
            a.ret().unwrap();
            a.set_label(end).unwrap();
            a.nop().unwrap();
        },
        Box::new(|f| {
            // SAFETY: the function follows the C ABI with this signature.
            let g: extern "C" fn(u64, u64, u64, u64, u64, u64) -> u64 =
                unsafe { std::mem::transmute(f as usize) };
            (g(1, 20, 300, 4000, 50_000, 600_000), 654_321)
        }),
    );

    // Reads xmm0 in its displaced instruction.
    add(
        lab,
        "xmm_arg",
        &|a, end| {
            a.movq(rax, xmm0).unwrap();
            a.ret().unwrap();
            a.set_label(end).unwrap();
            a.nop().unwrap();
        },
        Box::new(|f| {
            // SAFETY: the function follows the C ABI with this signature.
            let g: extern "C" fn(f64) -> u64 = unsafe { std::mem::transmute(f as usize) };
            (g(1.5), 1.5f64.to_bits())
        }),
    );

    // Too short for the patch: borrows the int3 padding after it.
    add(
        lab,
        "short",
        &|a, end| {
            a.mov(eax, edi).unwrap();
            a.ret().unwrap();
            a.set_label(end).unwrap();
            a.int3().unwrap();
        },
        Box::new(|f| (fn1(f)(7), 7)),
    );

    // Flags as seen by the displaced `pushfq` (after a 4-byte nop).
    for (name, flags) in [
        ("flags_all", ARITH_FLAGS),
        ("flags_none", 0),
        ("flags_some", 0x801),
        ("flags_other", 0xd4),
    ] {
        add(
            lab,
            name,
            &|a, end| {
                a.db(&[0x0f, 0x1f, 0x40, 0x00]).unwrap();
                a.pushfq().unwrap();
                a.pop(rax).unwrap();
                a.ret().unwrap();
                a.set_label(end).unwrap();
                a.nop().unwrap();
            },
            Box::new(move |f| (call_with_flags(f, flags | 2) & ARITH_FLAGS, flags)),
        );
    }
    out
}

/// Calls every probe `rounds` times in this thread, checking results and
/// this thread's counters.
fn exercise(probes: &[Probe], rounds: u64) {
    let before: Vec<u64> = probes.iter().map(|p| counter(p.counter)).collect();
    let activity = counter(ACTIVITY_WORD);
    for _ in 0..rounds {
        for p in probes {
            let (got, want) = (p.call)();
            assert_eq!(
                got, want,
                "{} returned {got:#x}, expected {want:#x}",
                p.name
            );
        }
    }
    let mut calls = 0;
    for (p, b) in probes.iter().zip(before) {
        // jcc_short calls its function twice per round.
        let per_round = if p.name == "jcc_short" { 2 } else { 1 };
        assert_eq!(
            counter(p.counter) - b,
            rounds * per_round,
            "counter of {}",
            p.name
        );
        calls += rounds * per_round;
    }
    // The activity word moved once per counted call.
    assert_eq!(counter(ACTIVITY_WORD) - activity, calls, "activity word");
}

fn run_lab(save: VectorSave) {
    let mut lab = Lab::new(save);
    let probes = probes(&mut lab);
    let regs = REGISTRATIONS.load(Ordering::SeqCst);
    std::thread::scope(|s| {
        // One thread per probe, each taking the slow path (registration,
        // which trashes registers) first through a different probe.
        for t in 0..probes.len() {
            let probes = &probes;
            s.spawn(move || {
                assert_eq!(counter(0), 0);
                // Rotate which probe takes the slow path first.
                let (first, rest) = probes.split_at(t);
                exercise(rest, 1);
                exercise(first, 1);
                exercise(probes, 200);
                assert_eq!(tls_offset(), tls_offset_main());
            });
        }
    });
    assert!(REGISTRATIONS.load(Ordering::SeqCst) >= regs + probes.len());
    drop(lab);
}

fn tls_offset_main() -> i32 {
    static OFF: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    *OFF.get_or_init(tls_offset)
}

fn xsave_area_size() -> Option<u32> {
    let leaf1 = std::arch::x86_64::__cpuid(1);
    // CPUID.1:ECX.OSXSAVE[bit 27]: XSAVE enabled by the OS.
    if leaf1.ecx & (1 << 27) == 0 {
        return None;
    }
    Some(std::arch::x86_64::__cpuid_count(0xd, 0).ebx)
}

#[test]
fn patched_functions_run_with_xsave() {
    let Some(area_size) = xsave_area_size() else {
        eprintln!("no XSAVE: skipped");
        return;
    };
    run_lab(VectorSave::Xsave {
        area_size,
        mask: u64::MAX,
    });
}

/// The registration stub as weft builds it: every component but AMX's.
#[test]
fn patched_functions_run_with_xsave_without_amx() {
    if xsave_area_size().is_none() {
        eprintln!("no XSAVE: skipped");
        return;
    }
    let xcr0: u64;
    // SAFETY: XSAVE/OSXSAVE are supported (checked above); xgetbv(0) only
    // reads XCR0.
    unsafe {
        let (lo, hi): (u32, u32);
        std::arch::asm!("xgetbv", in("ecx") 0, out("eax") lo, out("edx") hi, options(nomem, nostack));
        xcr0 = (u64::from(hi) << 32) | u64::from(lo);
    }
    let save = VectorSave::xsave(xcr0, XSAVE_UNUSED_BY_WEFT, |i| {
        let leaf = std::arch::x86_64::__cpuid_count(0xd, i);
        (leaf.eax, leaf.ebx)
    });
    run_lab(save);
}

#[test]
fn patched_functions_run_with_fxsave() {
    run_lab(VectorSave::Fxsave64);
}
