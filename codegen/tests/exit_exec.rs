//! Exit instrumentation, executed: functions patched with
//! `Snippet::CountCallHookExit` are called through the runtime's call
//! records (weft-rt is linked into this test) and return through the exit
//! handler; results, registers and counters must come out right for
//! multiple `ret`s, tail calls, deep recursion (within and beyond the
//! capacity), longjmp-style unwinding, several threads, and real unwinding
//! (libgcc's `_Unwind_Backtrace` and a Rust panic, through the records'
//! own unwind information) through an instrumented frame.
#![cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]

#[path = "common/lab.rs"]
mod lab;

use std::arch::asm;
use std::ffi::c_void;

use iced_x86::code_asm::*;
use lab::*;
use weft_codegen::*;

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
    let cells = lab.cells();
    install_row(cells);
    exercise(&f, 3);
    // The activity word moved after every entry and every hooked exit.
    let moves: u64 = [f.m_multi_ret, f.m_tail, f.m_tail_i, f.m_times3_i, f.m_rec]
        .iter()
        .map(|&m| counts(m)[0] + counts(m)[1])
        .sum();
    assert_eq!(word(ACTIVITY), moves);
    // The recursion used 1,001 cells and no more; cell 0 holds the RA of
    // the last outermost call, into this test.
    assert_ne!(lab.read(cell(1000) + CELL_RETURN_ADDRESS as u64), 0);
    assert_eq!(lab.read(cell(1001) + CELL_RETURN_ADDRESS as u64), 0);
}

#[test]
fn recursion_beyond_capacity_and_without_block() {
    let mut lab = Lab::new();
    let f = build_funcs(&mut lab);
    let cells = lab.cells();
    install_row(cells);
    assert_eq!(fn1(f.rec)(3000), 3000 * 3001 / 2);
    assert_eq!(depth(), 0);
    let hooked = u64::from(CAPACITY);
    assert_eq!(counts(f.m_rec), [3001, hooked, 0, 3001 - hooked]);
    // Full again after that: still consistent.
    assert_eq!(fn1(f.rec)(10), 55);
    assert_eq!(counts(f.m_rec), [3012, hooked + 11, 0, 3001 - hooked]);

    // No cells: every exit unhooked, results unchanged.
    install_row(0);
    assert_eq!(fn1(f.rec)(100), 5050);
    assert_eq!(fn1(f.tail_i)(1), 6);
    assert_eq!(counts(f.m_rec), [101, 0, 0, 101]);
    assert_eq!(counts(f.m_tail_i), [1, 0, 0, 1]);
    assert_eq!(counts(f.m_times3_i), [1, 0, 0, 1]);
}

#[test]
fn several_threads_each_with_its_own_cells() {
    let mut lab = Lab::new();
    let f = build_funcs(&mut lab);
    let cells: Vec<u64> = (0..8).map(|_| lab.cells()).collect();
    let f = &f;
    std::thread::scope(|s| {
        for &cells in &cells {
            s.spawn(move || {
                install_row(cells);
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
    install_row(lab.cells());

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
    install_row(lab.cells());

    // g, entered at the very rsp f1 had, closes f2 (entry rsp below) then
    // f1 (same entry rsp, but the RA there is not a record's return
    // point), then is hooked normally.
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
    install_row(lab.cells());
    // Unknown stack bounds (as for an rsp on a sigaltstack): entries never
    // close activations by rsp comparison...
    set_word(BOUNDS + 8, 0);
    assert_eq!(call_jb(j.catcher), 12);
    assert_eq!(counts(j.m_g), [1, 1, 0, 0]);
    assert_eq!(counts(j.m_f1), [1, 0, 0, 0]);
    assert_eq!(depth(), 2);
    // ...exits still close what is above their own cell.
    assert_eq!(call_jb(j.outer), 2);
    assert_eq!(counts(j.m_outer), [1, 1, 0, 0]);
    assert_eq!(counts(j.m_f1), [2, 0, 1, 0]);
    assert_eq!(depth(), 2);
    // Back on the thread stack: the next entry closes the first two.
    set_word(BOUNDS + 8, u64::MAX);
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
    install_row(lab.cells());
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
    let record = lab.last_record;
    // The records' unwind information is in this binary (weft-rt's); only
    // f's own, in the lab, needs registering.
    let f_cfi = push_rbx_eh_frame(f.0, f.1 as u64);
    // SAFETY: valid .eh_frame data, kept alive until deregistered below.
    unsafe { __register_frame(f_cfi.as_ptr()) };
    // SAFETY: f follows the C-unwind ABI with this signature.
    let f_fn: extern "C-unwind" fn(u64) -> u64 = unsafe { std::mem::transmute(f.0 as usize) };

    // 1. A backtrace from inside f's callee: f, then the record
    // pseudo-frame, then the original caller (the RA saved in cell 0), then
    // onwards.
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
    let original_ra = lab.read(cell(0) + CELL_RETURN_ADDRESS as u64);
    assert_eq!(ips[at + 1], records().return_point(record), "{ips:x?}");
    assert_eq!(ips[at + 2], original_ra, "{ips:x?}");
    assert!(ips.len() > at + 4, "the walk stopped early: {ips:x?}");
    assert_eq!(counts(m_f), [1, 1, 0, 0]);
    assert_eq!(depth(), 0);

    // 2. A Rust panic thrown by f's callee propagates through f and the
    // record pseudo-frame to the catch_unwind in this frame; rbx is restored.
    // (The records' personality routine finds no runtime region in this
    // test, so it leaves the activation open.)
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
    unsafe { __deregister_frame(f_cfi.as_ptr()) };
}
