//! Exit instrumentation, executed: functions patched with
//! `Snippet::CountCallHookExit` run through return slots and the exit
//! handler; results, registers and counters must come out right for multiple
//! `ret`s, tail calls, deep recursion (within and beyond the capacity),
//! longjmp-style unwinding, several threads, and real unwinding (libgcc's
//! `_Unwind_Backtrace` and a Rust panic) through an instrumented frame.
#![cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]

use std::arch::asm;
use std::cell::Cell;
use std::ffi::c_void;
use std::ptr;

use iced_x86::code_asm::*;
use iced_x86::BlockEncoderOptions;
use weft_codegen::*;

/// Row layout used by these tests (byte offsets).
const BLOCK: i32 = 0;
const DEPTH: i32 = 8;
const BOUNDS: i32 = 16; // [lo, hi)
const METRICS: i32 = 64;
const ROW_WORDS: usize = 512;
const CAPACITY: u32 = 1024;

thread_local! {
    /// This thread's row, read by generated code with `mov rcx, fs:[off]`.
    static ROW: Cell<*mut u64> = const { Cell::new(ptr::null_mut()) };
}

fn thread_pointer() -> u64 {
    let tp: u64;
    // SAFETY: reads the TCB self-pointer, always mapped on x86-64 Linux.
    unsafe { asm!("mov {}, fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags)) };
    tp
}

fn tls_offset() -> i32 {
    let var = ROW.with(|r| r as *const Cell<*mut u64> as u64);
    i32::try_from(var.wrapping_sub(thread_pointer()) as i64).unwrap()
}

/// The registration function: these tests install rows themselves, so a
/// thread without one simply is not counted.
extern "C" fn register_thread() -> *mut u8 {
    ptr::null_mut()
}

fn slots() -> ReturnSlots {
    ReturnSlots::new(CAPACITY, BLOCK, DEPTH, Some(BOUNDS)).unwrap()
}

/// Installs a fresh row for this thread using `block` (0: none), with stack
/// bounds covering everything; returns it.
fn install_row(block: u64) -> &'static mut [u64] {
    let row = Box::leak(vec![0u64; ROW_WORDS].into_boxed_slice());
    row[(BLOCK / 8) as usize] = block;
    row[(BOUNDS / 8) as usize + 1] = u64::MAX;
    ROW.with(|r| r.set(row.as_mut_ptr()));
    row
}

fn row_word(off: i32) -> u64 {
    let row = ROW.with(|r| r.get());
    // SAFETY: rows are leaked ROW_WORDS-word allocations written only by this
    // thread (the generated code), which is not running it now.
    unsafe { row.add((off / 8) as usize).read_volatile() }
}

fn set_row_word(off: i32, v: u64) {
    let row = ROW.with(|r| r.get());
    // SAFETY: as in `row_word`.
    unsafe { row.add((off / 8) as usize).write_volatile(v) }
}

fn depth() -> u64 {
    row_word(DEPTH)
}

/// This thread's counters of metric `m`: (entries, exits, unwound, unhooked).
fn counts(m: i32) -> [u64; 4] {
    [
        row_word(m + METRIC_ENTRIES),
        row_word(m + METRIC_EXITS),
        row_word(m + METRIC_UNWOUND),
        row_word(m + METRIC_UNHOOKED),
    ]
}

/// An RWX mapping holding blocks, the exit handler, functions and
/// trampolines, all within rel32 reach of each other.
struct Lab {
    base: *mut u8,
    len: usize,
    used: usize,
    stub: u64,
    handler: u64,
    next_metric: i32,
}

// SAFETY: the mapping is only written before threads run the code in it.
unsafe impl Sync for Lab {}

impl Lab {
    fn new() -> Lab {
        let len = 16 << 20;
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
            handler: 0,
            next_metric: METRICS,
        };
        let save = VectorSave::Fxsave64;
        lab.stub = lab.alloc(register_stub_len(save), 64);
        let stub = register_stub(lab.stub, register_thread as *const () as u64, save).unwrap();
        lab.write(lab.stub, &stub);
        let s = slots();
        lab.handler = lab.alloc(exit_handler_len(tls_offset(), &s), 64);
        let handler = exit_handler(lab.handler, tls_offset(), &s).unwrap();
        lab.write(lab.handler, &handler);
        lab
    }

    fn alloc(&mut self, n: usize, align: usize) -> u64 {
        let at = self.used.next_multiple_of(align);
        assert!(at + n <= self.len);
        self.used = at + n;
        self.base as u64 + at as u64
    }

    fn write(&self, addr: u64, bytes: &[u8]) {
        let off = (addr - self.base as u64) as usize;
        assert!(off + bytes.len() <= self.len);
        // SAFETY: in bounds of our mapping (checked above); nothing executes
        // these bytes while we write them.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(off), bytes.len()) };
    }

    fn read(&self, addr: u64) -> u64 {
        let off = (addr - self.base as u64) as usize;
        assert!(off + 8 <= self.len);
        // SAFETY: in bounds of our mapping.
        unsafe { self.base.add(off).cast::<u64>().read_unaligned() }
    }

    fn bytes(&self, addr: u64, len: usize) -> Vec<u8> {
        let off = (addr - self.base as u64) as usize;
        // SAFETY: in bounds of our mapping, which lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.base.add(off), len) }.to_vec()
    }

    /// A new return-slot block (its data part is zero: fresh mapping).
    fn block(&mut self) -> u64 {
        let s = slots();
        let block = self.alloc(s.block_len() as usize, 4096);
        self.write(block, &return_block_code(&s, self.handler));
        block
    }

    /// Assembles a function; `end` marks the end of its code (data may
    /// follow), then int3 padding.
    fn assemble(&mut self, build: impl FnOnce(&mut CodeAssembler, &mut CodeLabel)) -> (u64, usize) {
        let addr = self.alloc(512, 64);
        let mut a = CodeAssembler::new(64).unwrap();
        let mut end = a.create_label();
        build(&mut a, &mut end);
        a.int3().unwrap(); // `end` labels this padding byte
        let res = a
            .assemble_options(addr, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)
            .unwrap();
        let code_len = (res.label_ip(&end).unwrap() - addr) as usize;
        let bytes = res.inner.code_buffer;
        assert!(bytes.len() <= 480);
        self.write(addr, &[0xcc; 512]);
        self.write(addr, &bytes);
        (addr, code_len)
    }

    /// Patches the function at `addr` with an exit-hooking trampoline;
    /// returns its metric base.
    fn hook(&mut self, (addr, len): (u64, usize)) -> i32 {
        let metric = self.next_metric;
        self.next_metric += METRIC_LEN;
        assert!(metric + METRIC_LEN <= (ROW_WORDS * 8) as i32);
        let code = self.bytes(addr, len);
        let padding = self.bytes(addr + len as u64, 16);
        let site = analyze_entry(&FunctionCode {
            address: addr,
            bytes: &code,
            padding: &padding,
        })
        .unwrap();
        let snippets = [Snippet::CountCallHookExit {
            metric,
            slots: slots(),
        }];
        let t_addr = self.alloc(max_trampoline_len(&site, &snippets), 64);
        let t = build_trampoline(&TrampolineSpec {
            address: t_addr,
            site: &site,
            row: ThreadRow {
                tls_offset: tls_offset(),
                register_stub: self.stub,
            },
            snippets: &snippets,
        })
        .unwrap();
        assert!(t.bytes.len() <= max_trampoline_len(&site, &snippets));
        self.write(t_addr, &t.bytes);
        self.write(
            site.patch_address,
            &jmp_rel32(site.patch_address, t_addr).unwrap(),
        );
        metric
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // SAFETY: our own mapping; every thread using it has been joined.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

fn fn1(addr: u64) -> extern "C" fn(i64) -> i64 {
    // SAFETY: `addr` holds a C-ABI function with this signature.
    unsafe { std::mem::transmute::<usize, extern "C" fn(i64) -> i64>(addr as usize) }
}

/// The instrumented functions shared by the tests.
struct Funcs {
    /// x < 0 → -1, x == 0 → 100, else 2x; three `ret`s.
    multi_ret: u64,
    m_multi_ret: i32,
    /// `tail(x)`: `rax = x + 1; jmp times3` (times3 not instrumented).
    tail: u64,
    m_tail: i32,
    /// `tail_i(x)`: `rax = x + 1; jmp times3_i` (instrumented).
    tail_i: u64,
    m_tail_i: i32,
    m_times3_i: i32,
    /// `rec(n)` = n + (n-1) + ... + 0, recursively.
    rec: u64,
    m_rec: i32,
}

fn build_funcs(lab: &mut Lab) -> Funcs {
    let multi = lab.assemble(|a, end| {
        let mut neg = a.create_label();
        let mut zero = a.create_label();
        a.push(rbx).unwrap();
        a.mov(rbx, rdi).unwrap();
        a.cmp(rdi, 0).unwrap();
        a.jl(neg).unwrap();
        a.je(zero).unwrap();
        a.lea(rax, qword_ptr(rbx + rbx)).unwrap();
        a.pop(rbx).unwrap();
        a.ret().unwrap();
        a.set_label(&mut neg).unwrap();
        a.mov(rax, -1i64).unwrap();
        a.pop(rbx).unwrap();
        a.ret().unwrap();
        a.set_label(&mut zero).unwrap();
        a.mov(eax, 100).unwrap();
        a.pop(rbx).unwrap();
        a.ret().unwrap();
        a.set_label(end).unwrap();
    });
    let m_multi_ret = lab.hook(multi);

    let times3_body = |a: &mut CodeAssembler, end: &mut CodeLabel| {
        a.imul_3(rax, rax, 3).unwrap();
        a.add(rax, 0).unwrap();
        a.ret().unwrap();
        a.set_label(end).unwrap();
    };
    let times3 = lab.assemble(times3_body);
    let times3_i = lab.assemble(times3_body);
    let m_times3_i = lab.hook(times3_i);
    let tail_to = |lab: &mut Lab, target: u64| {
        lab.assemble(|a, end| {
            a.mov(rax, rdi).unwrap();
            a.add(rax, 1).unwrap();
            a.jmp(target).unwrap();
            a.set_label(end).unwrap();
        })
    };
    let tail = tail_to(lab, times3.0);
    let m_tail = lab.hook(tail);
    let tail_i = tail_to(lab, times3_i.0);
    let m_tail_i = lab.hook(tail_i);

    let rec = lab.assemble(|a, end| {
        let mut start = a.create_label();
        let mut base = a.create_label();
        a.set_label(&mut start).unwrap();
        a.push(rbx).unwrap();
        a.mov(rbx, rdi).unwrap();
        a.test(rdi, rdi).unwrap();
        a.jz(base).unwrap();
        a.lea(rdi, qword_ptr(rdi - 1)).unwrap();
        a.call(start).unwrap();
        a.add(rax, rbx).unwrap();
        a.pop(rbx).unwrap();
        a.ret().unwrap();
        a.set_label(&mut base).unwrap();
        a.xor(eax, eax).unwrap();
        a.pop(rbx).unwrap();
        a.ret().unwrap();
        a.set_label(end).unwrap();
    });
    let m_rec = lab.hook(rec);
    Funcs {
        multi_ret: multi.0,
        m_multi_ret,
        tail: tail.0,
        m_tail,
        tail_i: tail_i.0,
        m_tail_i,
        m_times3_i,
        rec: rec.0,
        m_rec,
    }
}

/// Exercises multi_ret, the tail calls and rec(1000) on this thread (whose
/// row uses a block), checking results and counters.
fn exercise(f: &Funcs, rounds: i64) {
    let mr = fn1(f.multi_ret);
    let before = counts(f.m_multi_ret);
    for i in 0..rounds {
        assert_eq!(mr(-5 - i), -1);
        assert_eq!(mr(0), 100);
        assert_eq!(mr(21 + i), 42 + 2 * i);
        assert_eq!(depth(), 0);
    }
    let n = 3 * rounds as u64;
    assert_eq!(counts(f.m_multi_ret), [before[0] + n, before[1] + n, 0, 0]);

    let (t, ti, t3) = (counts(f.m_tail), counts(f.m_tail_i), counts(f.m_times3_i));
    for i in 0..rounds {
        assert_eq!(fn1(f.tail)(i), 3 * (i + 1));
        assert_eq!(fn1(f.tail_i)(i), 3 * (i + 1));
        assert_eq!(depth(), 0);
    }
    let n = rounds as u64;
    // Exactly one exit per call of each instrumented function, the tail
    // called one included (it nests inside the caller's activation).
    assert_eq!(counts(f.m_tail), [t[0] + n, t[1] + n, 0, 0]);
    assert_eq!(counts(f.m_tail_i), [ti[0] + n, ti[1] + n, 0, 0]);
    assert_eq!(counts(f.m_times3_i), [t3[0] + n, t3[1] + n, 0, 0]);

    let r = counts(f.m_rec);
    for _ in 0..rounds {
        assert_eq!(fn1(f.rec)(1000), 500_500);
        assert_eq!(depth(), 0);
    }
    let n = 1001 * rounds as u64;
    assert_eq!(counts(f.m_rec), [r[0] + n, r[1] + n, 0, 0]);
}

#[test]
fn multiple_rets_tail_calls_and_recursion() {
    let mut lab = Lab::new();
    let f = build_funcs(&mut lab);
    let block = lab.block();
    install_row(block);
    exercise(&f, 3);
    // Every slot used by the recursion returned its cell's RA; cell 0 holds
    // the RA of the last outermost call, into this test.
    let s = slots();
    assert_ne!(lab.read(s.cell_address(block, 1000)), 0);
    assert_eq!(lab.read(s.cell_address(block, 1001)), 0);
}

#[test]
fn recursion_beyond_capacity_and_without_block() {
    let mut lab = Lab::new();
    let f = build_funcs(&mut lab);
    let block = lab.block();
    install_row(block);
    assert_eq!(fn1(f.rec)(3000), 3000 * 3001 / 2);
    assert_eq!(depth(), 0);
    let hooked = u64::from(CAPACITY);
    assert_eq!(counts(f.m_rec), [3001, hooked, 0, 3001 - hooked]);
    // Full again after that: still consistent.
    assert_eq!(fn1(f.rec)(10), 55);
    assert_eq!(counts(f.m_rec), [3012, hooked + 11, 0, 3001 - hooked]);

    // No block: every exit unhooked, results unchanged.
    install_row(0);
    assert_eq!(fn1(f.rec)(100), 5050);
    assert_eq!(fn1(f.tail_i)(1), 6);
    assert_eq!(counts(f.m_rec), [101, 0, 0, 101]);
    assert_eq!(counts(f.m_tail_i), [1, 0, 0, 1]);
    assert_eq!(counts(f.m_times3_i), [1, 0, 0, 1]);
}

#[test]
fn several_threads_each_with_its_own_block() {
    let mut lab = Lab::new();
    let f = build_funcs(&mut lab);
    let blocks: Vec<u64> = (0..8).map(|_| lab.block()).collect();
    let f = &f;
    std::thread::scope(|s| {
        for &block in &blocks {
            s.spawn(move || {
                install_row(block);
                exercise(f, 20);
                assert_eq!(counts(f.m_rec)[1], 1001 * 20);
            });
        }
    });
}

#[repr(C)]
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
struct Pair {
    a: u64,
    b: u64,
}

#[test]
fn return_values_and_every_register_survive_the_exit_handler() {
    let mut lab = Lab::new();
    install_row(lab.block());

    // A 128-bit struct in rax:rdx.
    let pair = lab.assemble(|a, end| {
        a.lea(rax, qword_ptr(rdi + rdi)).unwrap();
        a.lea(rdx, qword_ptr(rsi + 1)).unwrap();
        a.ret().unwrap();
        a.set_label(end).unwrap();
    });
    let m_pair = lab.hook(pair);
    // SAFETY: C-ABI function with this signature.
    let pair_fn: extern "C" fn(u64, u64) -> Pair = unsafe { std::mem::transmute(pair.0 as usize) };
    assert_eq!(pair_fn(21, 41), Pair { a: 42, b: 42 });

    // A double in xmm0.
    let dbl = lab.assemble(|a, end| {
        a.movq(xmm0, rdi).unwrap();
        a.addsd(xmm0, xmm0).unwrap();
        a.ret().unwrap();
        a.set_label(end).unwrap();
    });
    let m_dbl = lab.hook(dbl);
    // SAFETY: C-ABI function with this signature.
    let dbl_fn: extern "C" fn(u64) -> f64 = unsafe { std::mem::transmute(dbl.0 as usize) };
    assert_eq!(dbl_fn(1.25f64.to_bits()), 2.5);
    assert_eq!(counts(m_pair), [1, 1, 0, 0]);
    assert_eq!(counts(m_dbl), [1, 1, 0, 0]);

    // Every GPR, xmm0, xmm1, st0 and the flags, set by the function just
    // before its `ret`, as seen by its caller.
    const GPRS: [AsmRegister64; 15] = [
        rax, rbx, rcx, rdx, rsi, rdi, rbp, r8, r9, r10, r11, r12, r13, r14, r15,
    ];
    let value =
        |i: usize| 0x0101_0101_0101_0101u64.wrapping_mul(i as u64 + 1) ^ 0x8000_0000_0000_00f0;
    let regs = lab.assemble(|a, end| {
        for (i, r) in GPRS.iter().enumerate() {
            a.mov(*r, value(i)).unwrap();
        }
        a.mov(rax, 1.5f64.to_bits()).unwrap();
        a.movq(xmm0, rax).unwrap();
        a.mov(rax, (-7.25f64).to_bits()).unwrap();
        a.movq(xmm1, rax).unwrap();
        a.mov(rax, value(0)).unwrap();
        a.fldpi().unwrap();
        a.push(0x8d7).unwrap(); // OF SF ZF AF PF CF
        a.popfq().unwrap();
        a.ret().unwrap();
        a.set_label(end).unwrap();
    });
    let m_regs = lab.hook(regs);
    // probe(out, f): calls f, then stores what it left in every register.
    let probe = lab.assemble(|a, end| {
        for r in [rbx, rbp, r12, r13, r14, r15] {
            a.push(r).unwrap();
        }
        a.push(rdi).unwrap();
        a.call(rsi).unwrap();
        a.pushfq().unwrap();
        a.push(rax).unwrap();
        a.mov(rax, qword_ptr(rsp + 16)).unwrap();
        a.pop(qword_ptr(rax)).unwrap();
        a.pop(qword_ptr(rax + 8 * 15)).unwrap();
        for (i, r) in GPRS.iter().enumerate().skip(1) {
            a.mov(qword_ptr(rax + 8 * i as i32), *r).unwrap();
        }
        a.movq(qword_ptr(rax + 8 * 16), xmm0).unwrap();
        a.movq(qword_ptr(rax + 8 * 17), xmm1).unwrap();
        a.fstp(qword_ptr(rax + 8 * 18)).unwrap();
        a.pop(rdi).unwrap();
        for r in [r15, r14, r13, r12, rbp, rbx] {
            a.pop(r).unwrap();
        }
        a.ret().unwrap();
        a.set_label(end).unwrap();
    });
    let mut out = [0u64; 19];
    // SAFETY: `probe` preserves the callee-saved registers and follows the
    // C ABI; `out` has the 19 words it writes; x87 stack is balanced.
    unsafe {
        asm!("call {p}", p = in(reg) probe.0, in("rdi") out.as_mut_ptr(), in("rsi") regs.0,
             clobber_abi("C"));
    }
    for (i, r) in GPRS.iter().enumerate() {
        assert_eq!(out[i], value(i), "{r:?}");
    }
    assert_eq!(out[15] & 0xcd5, 0x8d5, "flags {:#x}", out[15]);
    assert_eq!(f64::from_bits(out[16]), 1.5);
    assert_eq!(f64::from_bits(out[17]), -7.25);
    assert_eq!(f64::from_bits(out[18]), std::f64::consts::PI);
    assert_eq!(counts(m_regs), [1, 1, 0, 0]);
    assert_eq!(depth(), 0);
}

/// Functions for the longjmp tests: `catcher(jb)` saves rsp and a resume
/// address in `jb`, calls `f1(jb)` → `f2(jb)` → `thrower(jb)`, which restores
/// rsp and jumps to the resume address. With `then_g`, the resume path calls
/// `g` with exactly the rsp f1 was called with; catcher returns 1 on normal
/// return, 2 (+10 from g) after the longjmp.
struct Jmp {
    catcher: u64,
    catcher_no_g: u64,
    outer: u64,
    m_f1: i32,
    m_f2: i32,
    m_g: i32,
    m_outer: i32,
}

fn build_jmp(lab: &mut Lab) -> Jmp {
    let thrower = lab.assemble(|a, end| {
        a.mov(rsp, qword_ptr(rdi)).unwrap();
        a.jmp(qword_ptr(rdi + 8)).unwrap();
        a.set_label(end).unwrap();
    });
    let calls = |lab: &mut Lab, target: u64| {
        lab.assemble(|a, end| {
            a.push(rbx).unwrap();
            a.mov(rbx, rdi).unwrap();
            a.xor(eax, eax).unwrap();
            a.call(target).unwrap();
            a.pop(rbx).unwrap();
            a.ret().unwrap();
            a.set_label(end).unwrap();
        })
    };
    let f2 = calls(lab, thrower.0);
    let m_f2 = lab.hook(f2);
    let f1 = calls(lab, f2.0);
    let m_f1 = lab.hook(f1);
    let g = lab.assemble(|a, end| {
        a.mov(eax, 10).unwrap();
        a.ret().unwrap();
        a.set_label(end).unwrap();
    });
    let m_g = lab.hook(g);
    let catcher = |lab: &mut Lab, then_g: bool| {
        lab.assemble(|a, end| {
            let mut resume = a.create_label();
            let mut out = a.create_label();
            for r in [rbx, rbp, r12, r13, r14, r15] {
                a.push(r).unwrap();
            }
            a.sub(rsp, 8).unwrap();
            a.mov(qword_ptr(rdi), rsp).unwrap();
            a.lea(rax, ptr(resume)).unwrap();
            a.mov(qword_ptr(rdi + 8), rax).unwrap();
            a.call(f1.0).unwrap();
            a.mov(eax, 1).unwrap();
            a.jmp(out).unwrap();
            a.set_label(&mut resume).unwrap();
            if then_g {
                a.call(g.0).unwrap();
            } else {
                a.xor(eax, eax).unwrap();
            }
            a.add(rax, 2).unwrap();
            a.set_label(&mut out).unwrap();
            a.add(rsp, 8).unwrap();
            for r in [r15, r14, r13, r12, rbp, rbx] {
                a.pop(r).unwrap();
            }
            a.ret().unwrap();
            a.set_label(end).unwrap();
        })
    };
    let with_g = catcher(lab, true);
    let no_g = catcher(lab, false);
    let outer = calls(lab, no_g.0);
    let m_outer = lab.hook(outer);
    Jmp {
        catcher: with_g.0,
        catcher_no_g: no_g.0,
        outer: outer.0,
        m_f1,
        m_f2,
        m_g,
        m_outer,
    }
}

fn call_jb(f: u64) -> i64 {
    let mut jb = [0u64; 2];
    fn1(f)(jb.as_mut_ptr() as i64)
}

#[test]
fn longjmp_past_instrumented_frames() {
    let mut lab = Lab::new();
    let j = build_jmp(&mut lab);
    install_row(lab.block());

    // g, entered at the very rsp f1 had (its RA slot is f1's), closes f2
    // (entry rsp below) then f1 (same entry rsp, but the RA there is not
    // f1's slot), then is hooked normally.
    assert_eq!(call_jb(j.catcher), 12);
    assert_eq!(counts(j.m_f1), [1, 0, 1, 0]);
    assert_eq!(counts(j.m_f2), [1, 0, 1, 0]);
    assert_eq!(counts(j.m_g), [1, 1, 0, 0]);
    assert_eq!(depth(), 0);

    // Nothing calls an instrumented function after the longjmp: the two stale
    // activations stay open (depth 2) until the next entry closes them.
    assert_eq!(call_jb(j.catcher_no_g), 2);
    assert_eq!(depth(), 2);
    let g_before = counts(j.m_g);
    assert_eq!(call_jb(j.catcher), 12); // its f1 entry closes the old two
    assert_eq!(counts(j.m_f1), [3, 0, 3, 0]);
    assert_eq!(counts(j.m_f2), [3, 0, 3, 0]);
    assert_eq!(counts(j.m_g)[1], g_before[1] + 1);
    assert_eq!(depth(), 0);

    // An instrumented caller's exit closes what was left above it.
    assert_eq!(call_jb(j.outer), 2);
    assert_eq!(counts(j.m_outer), [1, 1, 0, 0]);
    assert_eq!(counts(j.m_f1), [4, 0, 4, 0]);
    assert_eq!(counts(j.m_f2), [4, 0, 4, 0]);
    assert_eq!(depth(), 0);
}

#[test]
fn entries_off_the_thread_stack_close_nothing() {
    let mut lab = Lab::new();
    let j = build_jmp(&mut lab);
    install_row(lab.block());
    // Unknown stack bounds (as for an rsp on a sigaltstack): entries never
    // close activations by rsp comparison...
    set_row_word(BOUNDS + 8, 0);
    assert_eq!(call_jb(j.catcher), 12);
    assert_eq!(counts(j.m_g), [1, 1, 0, 0]);
    assert_eq!(counts(j.m_f1), [1, 0, 0, 0]);
    assert_eq!(depth(), 2);
    // ...exits still close by slot index.
    assert_eq!(call_jb(j.outer), 2);
    assert_eq!(counts(j.m_outer), [1, 1, 0, 0]);
    assert_eq!(counts(j.m_f1), [2, 0, 1, 0]);
    assert_eq!(depth(), 2);
    // Back on the thread stack: the next entry closes the first two.
    set_row_word(BOUNDS + 8, u64::MAX);
    assert_eq!(call_jb(j.outer), 2);
    assert_eq!(counts(j.m_f1), [3, 0, 3, 0]);
    assert_eq!(counts(j.m_f2), [3, 0, 3, 0]);
    assert_eq!(depth(), 0);
}

// ---- Real unwinding through an instrumented frame (libgcc) ----

extern "C" {
    fn __register_frame(begin: *const u8);
    fn __deregister_frame(begin: *const u8);
    fn _Unwind_Backtrace(
        trace: extern "C" fn(*mut c_void, *mut c_void) -> i32,
        arg: *mut c_void,
    ) -> i32;
    fn _Unwind_GetIP(ctx: *mut c_void) -> usize;
}

extern "C" fn collect_ip(ctx: *mut c_void, arg: *mut c_void) -> i32 {
    // SAFETY: `arg` is the `Vec<u64>` passed by `backtrace_ips`, `ctx` the
    // unwinder's context for this frame.
    unsafe {
        let ips = &mut *arg.cast::<Vec<u64>>();
        ips.push(_Unwind_GetIP(ctx) as u64);
    }
    0 // _URC_NO_REASON: continue
}

fn backtrace_ips() -> Vec<u64> {
    let mut ips: Vec<u64> = Vec::new();
    // SAFETY: the callback only pushes to the Vec we pass.
    unsafe { _Unwind_Backtrace(collect_ip, (&mut ips as *mut Vec<u64>).cast()) };
    ips
}

/// `.eh_frame` for a function `push rbx; ...; call; pop rbx; ret` (CFA =
/// rsp + 16 after the push, rbx at CFA - 16, RA at CFA - 8), absptr FDE.
fn push_rbx_eh_frame(start: u64, len: u64) -> Vec<u8> {
    fn entry(out: &mut Vec<u8>, mut body: Vec<u8>) {
        while (body.len() + 4) % 8 != 0 {
            body.push(0);
        }
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&body);
    }
    let mut out = Vec::new();
    let mut cie = vec![0, 0, 0, 0, 1, b'z', b'R', 0, 1, 0x78, 16, 1, 0x00];
    cie.extend_from_slice(&[0x0c, 7, 8, 0x90, 1]); // def_cfa rsp+8; RA at cfa-8
    entry(&mut out, cie);
    let mut fde = ((out.len() + 4) as u32).to_le_bytes().to_vec();
    fde.extend_from_slice(&start.to_le_bytes());
    fde.extend_from_slice(&len.to_le_bytes());
    fde.push(0);
    // advance_loc 1; def_cfa_offset 16; offset rbx(3) at cfa-16
    fde.extend_from_slice(&[0x41, 0x0e, 16, 0x83, 2]);
    entry(&mut out, fde);
    out.extend_from_slice(&[0, 0, 0, 0]);
    out
}

thread_local! {
    static SEEN: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

extern "C-unwind" fn record_backtrace(_: u64) -> u64 {
    SEEN.with(|s| *s.borrow_mut() = backtrace_ips());
    7
}

extern "C-unwind" fn throw(_: u64) -> u64 {
    std::panic::panic_any(1234u32)
}

#[test]
fn unwinders_walk_through_instrumented_frames() {
    let mut lab = Lab::new();
    let block = lab.block();
    install_row(block);
    let s = slots();
    // f(x) = callee(x) + 0, calling through a pointer set per test.
    let callee_ptr = lab.alloc(8, 8);
    let f = lab.assemble(|a, end| {
        a.push(rbx).unwrap();
        a.mov(rbx, rdi).unwrap();
        a.xor(eax, eax).unwrap();
        a.mov(rax, callee_ptr).unwrap();
        a.call(qword_ptr(rax)).unwrap();
        a.pop(rbx).unwrap();
        a.ret().unwrap();
        a.set_label(end).unwrap();
    });
    let after_call = f.0 + f.1 as u64 - 2; // RA of the call: before pop; ret
    let m_f = lab.hook(f);
    let f_cfi = push_rbx_eh_frame(f.0, f.1 as u64);
    let block_cfi = block_eh_frame(block, &s);
    // SAFETY: both buffers are valid .eh_frame data, kept alive until they
    // are deregistered below.
    unsafe {
        __register_frame(f_cfi.as_ptr());
        __register_frame(block_cfi.as_ptr());
    }
    // SAFETY: f follows the C-unwind ABI with this signature.
    let f_fn: extern "C-unwind" fn(u64) -> u64 = unsafe { std::mem::transmute(f.0 as usize) };

    // 1. A backtrace from inside f's callee: f, then the slot pseudo-frame,
    // then the original caller (the RA saved in cell 0), then onwards.
    lab.write(
        callee_ptr,
        &(record_backtrace as *const () as u64).to_le_bytes(),
    );
    assert_eq!(f_fn(1), 7);
    let ips = SEEN.with(|s| s.borrow().clone());
    let at = ips
        .iter()
        .position(|&ip| ip == after_call)
        .unwrap_or_else(|| panic!("f's frame not in {ips:x?}"));
    let original_ra = lab.read(s.cell_address(block, 0));
    assert_eq!(ips[at + 1], s.slot_return_address(block, 0), "{ips:x?}");
    assert_eq!(ips[at + 2], original_ra, "{ips:x?}");
    assert!(ips.len() > at + 4, "the walk stopped early: {ips:x?}");
    assert_eq!(counts(m_f), [1, 1, 0, 0]);
    assert_eq!(depth(), 0);

    // 2. A Rust panic thrown by f's callee propagates through f and the slot
    // pseudo-frame to the catch_unwind in this frame; rbx is restored.
    lab.write(callee_ptr, &(throw as *const () as u64).to_le_bytes());
    let caught = std::panic::catch_unwind(|| f_fn(2)).expect_err("f must unwind");
    assert_eq!(caught.downcast_ref::<u32>(), Some(&1234));
    assert_eq!(counts(m_f), [2, 1, 0, 0]);
    assert_eq!(depth(), 1); // the activation whose frame the panic discarded
                            // The next entry closes it.
    lab.write(
        callee_ptr,
        &(record_backtrace as *const () as u64).to_le_bytes(),
    );
    assert_eq!(f_fn(3), 7);
    assert_eq!(counts(m_f), [3, 2, 1, 0]);
    assert_eq!(depth(), 0);

    // SAFETY: registered above, no unwinding in progress.
    unsafe {
        __deregister_frame(block_cfi.as_ptr());
        __deregister_frame(f_cfi.as_ptr());
    }
}
