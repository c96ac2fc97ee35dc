//! User probes, executed: a function patched with `Snippet::CallProbe`
//! calls a Rust `extern "C"` probe with its integer, pointer and
//! floating-point arguments, its entry `rsp`, the user constant and the
//! thread's index; predicates skip it; everything the function sees, and
//! its result, is as without the probe, although the probe clobbers every
//! register it may.
#![cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]

#[path = "common/lab.rs"]
mod lab;

use std::sync::Mutex;

use iced_x86::code_asm::*;
use lab::*;
use weft_codegen::*;

/// What the probe saw, per call.
static SEEN: Mutex<Vec<ProbeContext>> = Mutex::new(Vec::new());

extern "C" fn probe(ctx: *const ProbeContext) {
    // SAFETY: the generated code passes a pointer to a live context.
    let ctx = unsafe { *ctx };
    SEEN.lock().unwrap().push(ctx);
    // Use the vector unit and many registers, as any C code may.
    let mut acc = [0f64; 8];
    for (i, a) in acc.iter_mut().enumerate() {
        *a = (ctx.fargs[i] * 3.0).sqrt() + i as f64;
    }
    std::hint::black_box(acc);
}

/// `f(a, b, c, d, e, g, x0..x7)`: returns a + 2b + 3c + 4d + 5e + 6g +
/// trunc(x0 + 2 x1 + ... + 8 x7), and reads its 7th integer argument from
/// the stack (added too).
fn build_f(lab: &mut Lab) -> (u64, usize) {
    lab.assemble(|a, end| {
        a.push(rbx).unwrap();
        a.mov(rax, rdi).unwrap();
        a.lea(rax, qword_ptr(rax + rsi * 2)).unwrap();
        a.imul_3(rbx, rdx, 3).unwrap();
        a.add(rax, rbx).unwrap();
        a.lea(rax, qword_ptr(rax + rcx * 4)).unwrap();
        a.imul_3(rbx, r8, 5).unwrap();
        a.add(rax, rbx).unwrap();
        a.imul_3(rbx, r9, 6).unwrap();
        a.add(rax, rbx).unwrap();
        // 7th integer argument: [rsp + 16] (after the push).
        a.add(rax, qword_ptr(rsp + 16)).unwrap();
        // x0 + 2 x1 + ... + 8 x7
        for (i, x) in [xmm1, xmm2, xmm3, xmm4, xmm5, xmm6, xmm7]
            .iter()
            .enumerate()
        {
            a.mov(rbx, (i as f64 + 2.0).to_bits()).unwrap();
            a.movq(xmm8, rbx).unwrap();
            a.mulsd(*x, xmm8).unwrap();
            a.addsd(xmm0, *x).unwrap();
        }
        a.cvttsd2si(rbx, xmm0).unwrap();
        a.add(rax, rbx).unwrap();
        a.pop(rbx).unwrap();
        a.ret().unwrap();
        a.set_label(end).unwrap();
    })
}

type F =
    extern "C" fn(i64, i64, i64, i64, i64, i64, f64, f64, f64, f64, f64, f64, f64, f64, i64) -> i64;

/// `addr` as an `F`.
fn as_f(addr: u64) -> F {
    // SAFETY: callers pass functions built by `build_f`, of this signature.
    unsafe { std::mem::transmute::<usize, F>(addr as usize) }
}

fn call(f: F, k: i64) -> i64 {
    let x = k as f64;
    f(
        k,
        k + 1,
        k + 2,
        k + 3,
        k + 4,
        k + 5,
        x + 0.5,
        x + 1.5,
        x + 2.5,
        x + 3.5,
        x + 4.5,
        x + 5.5,
        x + 6.5,
        x + 7.5,
        1000 * k,
    )
}

fn expected(k: i64) -> i64 {
    let x = k as f64;
    let ints = k + 2 * (k + 1) + 3 * (k + 2) + 4 * (k + 3) + 5 * (k + 4) + 6 * (k + 5) + 1000 * k;
    let floats: f64 = (0..8)
        .map(|i| (i as f64 + 1.0) * (x + i as f64 + 0.5))
        .sum();
    ints + floats.trunc() as i64
}

fn probe_call(instrumented: u64, predicate: Option<Predicate>, save: VectorSave) -> ProbeCall {
    ProbeCall {
        function: probe as *const () as u64,
        user: 0xfeed_beef,
        predicate,
        save,
        row_index: ROW_INDEX,
        instrumented,
    }
}

fn vector_save() -> VectorSave {
    let xcr0: u64;
    // SAFETY: xgetbv(0) reads XCR0 (x86-64 Linux machines have OSXSAVE).
    unsafe {
        let (lo, hi): (u32, u32);
        std::arch::asm!("xgetbv", in("ecx") 0, out("eax") lo, out("edx") hi, options(nomem, nostack));
        xcr0 = (u64::from(hi) << 32) | u64::from(lo);
    }
    VectorSave::xsave(xcr0, XSAVE_UNUSED_BY_WEFT, |i| {
        let leaf = std::arch::x86_64::__cpuid_count(0xd, i);
        (leaf.eax, leaf.ebx)
    })
}

#[test]
fn probes_see_every_argument_and_change_nothing() {
    for save in [vector_save(), VectorSave::Fxsave64] {
        let mut lab = Lab::new();
        let f = build_f(&mut lab);
        lab.patch_with(f, Snippet::CallProbe(probe_call(f.0, None, save)));
        let row = install_row(lab.cells());
        row[(ROW_INDEX / 8) as usize] = 7;
        let fun = as_f(f.0);
        SEEN.lock().unwrap().clear();
        for k in 0..20 {
            assert_eq!(call(fun, k), expected(k), "{save:?}: f({k})");
        }
        let seen = SEEN.lock().unwrap().clone();
        assert_eq!(seen.len(), 20, "{save:?}");
        for (k, ctx) in seen.iter().enumerate() {
            let k = k as i64;
            let args: Vec<i64> = ctx.args.iter().map(|&a| a as i64).collect();
            assert_eq!(args, (k..k + 6).collect::<Vec<_>>());
            let fargs: Vec<f64> = (0..8).map(|i| k as f64 + i as f64 + 0.5).collect();
            assert_eq!(ctx.fargs.to_vec(), fargs);
            assert_eq!((ctx.ret, ctx.ret2, ctx.fret), (0, 0, 0.0));
            assert_eq!(ctx.function, f.0);
            assert_eq!(ctx.user, 0xfeed_beef);
            assert_eq!((ctx.thread, ctx.point), (7, POINT_ENTRY));
            // The 7th integer argument, read through the entry rsp.
            // SAFETY: recorded during the call; only compared, not read.
            assert_ne!(ctx.rsp, 0);
        }
        drop(lab);
    }
}

#[test]
fn predicates_select_the_calls() {
    let mut lab = Lab::new();
    let f = build_f(&mut lab);
    let g = build_f(&mut lab);
    let h = build_f(&mut lab);
    let save = vector_save();
    // f: only when its 4th argument (rcx) is 13; g: when the 1st is 5;
    // h: only in thread 3.
    lab.patch_with(
        f,
        Snippet::CallProbe(probe_call(
            f.0,
            Some(Predicate::ArgEquals { arg: 3, value: 13 }),
            save,
        )),
    );
    lab.patch_with(
        g,
        Snippet::CallProbe(probe_call(
            g.0,
            Some(Predicate::ArgEquals { arg: 0, value: 5 }),
            save,
        )),
    );
    lab.patch_with(
        h,
        Snippet::CallProbe(probe_call(h.0, Some(Predicate::Thread(3)), save)),
    );
    let row = install_row(lab.cells());
    row[(ROW_INDEX / 8) as usize] = 2;
    let (ff, gf, hf) = (as_f(f.0), as_f(g.0), as_f(h.0));
    SEEN.lock().unwrap().clear();
    for k in 0..20 {
        assert_eq!(call(ff, k), expected(k));
        assert_eq!(call(gf, k), expected(k));
        assert_eq!(call(hf, k), expected(k)); // thread 2: never
    }
    let seen: Vec<(u64, u64)> = SEEN
        .lock()
        .unwrap()
        .iter()
        .map(|c| (c.function, c.args[0]))
        .collect();
    assert_eq!(seen, vec![(g.0, 5), (f.0, 10)]);
    row[(ROW_INDEX / 8) as usize] = 3;
    SEEN.lock().unwrap().clear();
    assert_eq!(call(hf, 1), expected(1));
    assert_eq!(SEEN.lock().unwrap().len(), 1);
}

/// Every general register, the flags and xmm8 as the function sees them at
/// its entry are what its caller set, with a probe that clobbers them.
#[test]
fn the_function_sees_its_callers_registers() {
    const GPRS: [AsmRegister64; 15] = [
        rax, rbx, rcx, rdx, rsi, rdi, rbp, r8, r9, r10, r11, r12, r13, r14, r15,
    ];
    let value =
        |i: usize| 0x0101_0101_0101_0101u64.wrapping_mul(i as u64 + 3) ^ 0x8000_0000_0000_0f00;
    let mut lab = Lab::new();
    let seen_at = lab.alloc(8 * 17, 8);
    // f: stores every register, the flags and xmm8, then returns.
    let f = lab.assemble(|a, end| {
        a.push(rax).unwrap();
        a.pushfq().unwrap();
        a.mov(rax, seen_at).unwrap();
        a.pop(qword_ptr(rax + 8 * 15)).unwrap();
        for (i, r) in GPRS.iter().enumerate().skip(1) {
            a.mov(qword_ptr(rax + 8 * i as i32), *r).unwrap();
        }
        a.pop(qword_ptr(rax)).unwrap();
        a.movq(qword_ptr(rax + 8 * 16), xmm8).unwrap();
        a.ret().unwrap();
        a.set_label(end).unwrap();
    });
    lab.patch_with(f, Snippet::CallProbe(probe_call(f.0, None, vector_save())));
    install_row(lab.cells());
    // caller(f): sets every register to a known value and calls f.
    let caller = lab.assemble(|a, end| {
        for r in [rbx, rbp, r12, r13, r14, r15] {
            a.push(r).unwrap();
        }
        a.mov(rax, rdi).unwrap();
        a.push(rax).unwrap(); // f, at [rsp]
        for (i, r) in GPRS.iter().enumerate() {
            a.mov(*r, value(i)).unwrap();
        }
        a.mov(rax, 0x1234_5678_9abc_def0u64).unwrap();
        a.movq(xmm8, rax).unwrap();
        a.mov(rax, value(0)).unwrap();
        a.push(0x8d5).unwrap(); // OF SF ZF PF CF (and the reserved bit 1)
        a.popfq().unwrap();
        a.call(qword_ptr(rsp)).unwrap();
        a.pop(rax).unwrap();
        for r in [r15, r14, r13, r12, rbp, rbx] {
            a.pop(r).unwrap();
        }
        a.ret().unwrap();
        a.set_label(end).unwrap();
    });
    // SAFETY: `caller` preserves the callee-saved registers and follows the
    // C ABI; its stack stays aligned for the call.
    unsafe {
        std::arch::asm!("call {c}", c = in(reg) caller.0, in("rdi") f.0, clobber_abi("C"));
    }
    for (i, r) in GPRS.iter().enumerate() {
        assert_eq!(
            lab.read(seen_at + 8 * i as u64),
            value(i),
            "{r:?} at f's entry"
        );
    }
    assert_eq!(
        lab.read(seen_at + 8 * 15) & 0xcd5,
        0x8d5,
        "flags at f's entry"
    );
    assert_eq!(
        lab.read(seen_at + 8 * 16),
        0x1234_5678_9abc_def0,
        "xmm8 at f's entry"
    );
}

/// One entry per call record: (probe, constant, instrumented function,
/// unused), as `ExitProbes` documents.
static mut EXIT_TABLE: [[u64; 4]; 8192] = [[0; 4]; 8192];

fn exit_table() -> u64 {
    // Only the address is taken.
    std::ptr::addr_of_mut!(EXIT_TABLE) as u64
}

fn set_exit_probe(record: u32, user: u64, instrumented: u64) {
    let at = exit_table() + EXIT_PROBE_SIZE * u64::from(record);
    // SAFETY: inside the table; no thread runs the record's function yet.
    unsafe {
        let e = at as *mut u64;
        e.write(probe as *const () as u64);
        e.add(1).write(user);
        e.add(2).write(instrumented);
    }
}

/// Exit probes see the return values (integer, 128-bit pair, double) and
/// the caller gets them unchanged; with timers on the same function too.
#[test]
fn exit_probes_see_the_return_values() {
    let both = Timers {
        wall: true,
        cpu: true,
    };
    let wall = Box::leak(Box::new(weft_rt::clock::WallClock::new(
        weft_rt::clock::WallPreference::Auto,
    )));
    let mut lab = Lab::with_exit_probes(
        Some(timer_spec(both, wall)),
        ExitProbes {
            table: exit_table(),
            save: vector_save(),
            row_index: ROW_INDEX,
        },
    );
    // pair(a, b) = (2a, b + 1) in rax:rdx; dbl(x) = 2x in xmm0.
    let pair = lab.assemble(|a, end| {
        a.lea(rax, qword_ptr(rdi + rdi)).unwrap();
        a.lea(rdx, qword_ptr(rsi + 1)).unwrap();
        a.ret().unwrap();
        a.set_label(end).unwrap();
    });
    let dbl = lab.assemble(|a, end| {
        a.movq(xmm0, rdi).unwrap();
        a.addsd(xmm0, xmm0).unwrap();
        a.ret().unwrap();
        a.set_label(end).unwrap();
    });
    let hooks = lab.hooks();
    // pair: probe only; dbl: probe and timers.
    let m_pair = lab.hook_as(pair, hooks.probing_exits(false));
    set_exit_probe(lab.last_record, 11, pair.0);
    let m_dbl = lab.hook_as(dbl, hooks.probing_exits(true));
    set_exit_probe(lab.last_record, 22, dbl.0);
    let row = install_row(lab.cells());
    row[(ROW_INDEX / 8) as usize] = 4;
    #[repr(C)]
    #[derive(Debug, PartialEq)]
    struct Pair(u64, u64);
    // SAFETY: C-ABI functions of these signatures.
    let pair_fn: extern "C" fn(u64, u64) -> Pair =
        unsafe { std::mem::transmute::<usize, extern "C" fn(u64, u64) -> Pair>(pair.0 as usize) };
    // SAFETY: as above.
    let dbl_fn: extern "C" fn(u64) -> f64 =
        unsafe { std::mem::transmute::<usize, extern "C" fn(u64) -> f64>(dbl.0 as usize) };
    SEEN.lock().unwrap().clear();
    assert_eq!(pair_fn(21, 41), Pair(42, 42));
    assert_eq!(dbl_fn(1.25f64.to_bits()), 2.5);
    let seen = SEEN.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(
        (
            seen[0].ret,
            seen[0].ret2,
            seen[0].user,
            seen[0].function,
            seen[0].point,
            seen[0].thread
        ),
        (42, 42, 11, pair.0, POINT_EXIT, 4)
    );
    assert_eq!(
        (seen[1].fret, seen[1].user, seen[1].function),
        (2.5, 22, dbl.0)
    );
    assert_eq!(counts(m_pair), [1, 1, 0, 0]);
    assert_eq!(counts(m_dbl), [1, 1, 0, 0]);
    let (wall_ns, _, nesting) = totals(m_dbl);
    assert!(wall_ns > 0 && nesting == 0);
    assert_eq!(depth(), 0);

    // A thread predicate (1 + index at +24): this thread is index 4, so a
    // predicate for thread 4 calls the probe and one for thread 5 does not;
    // the results and the counts are the same either way.
    let set_thread = |record: u32, thread: Option<u32>| {
        let at = exit_table() + EXIT_PROBE_SIZE * u64::from(record) + 24;
        // SAFETY: inside the table; only this thread runs the functions.
        unsafe { (at as *mut u64).write(thread.map_or(0, |t| u64::from(t) + 1)) }
    };
    let (r_pair, r_dbl) = (lab.last_record - 1, lab.last_record);
    set_thread(r_pair, Some(4));
    set_thread(r_dbl, Some(5));
    SEEN.lock().unwrap().clear();
    assert_eq!(pair_fn(1, 2), Pair(2, 3));
    assert_eq!(dbl_fn(4.0f64.to_bits()), 8.0);
    let seen = SEEN.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "only the probe of thread 4: {seen:?}");
    assert_eq!((seen[0].user, seen[0].ret), (11, 2));
    assert_eq!(counts(m_pair), [2, 2, 0, 0]);
    assert_eq!(counts(m_dbl), [2, 2, 0, 0]);
}

/// The original of the replaced function, for the replacement to call.
static ORIGINAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

extern "C" fn replacement(x: i64) -> i64 {
    let original = ORIGINAL.load(std::sync::atomic::Ordering::Relaxed);
    10 * fn1(original)(x)
}

/// A function redirected to another, which calls the original; the
/// original bytes back, the function is itself again.
#[test]
fn a_replaced_function_calls_its_original() {
    let mut lab = Lab::new();
    let f = lab.assemble(|a, end| {
        a.push(rbx).unwrap();
        a.lea(rax, qword_ptr(rdi + 1)).unwrap();
        a.pop(rbx).unwrap();
        a.ret().unwrap();
        a.set_label(end).unwrap();
    });
    let code = lab.bytes(f.0, f.1);
    let padding = lab.bytes(f.0 + f.1 as u64, 16);
    let site = analyze_entry(&FunctionCode {
        address: f.0,
        bytes: &code,
        padding: &padding,
    })
    .unwrap();
    let at = lab.alloc(max_redirect_len(&site), 16);
    let r = build_redirect(at, &site, replacement as *const () as u64).unwrap();
    assert!(r.bytes.len() <= max_redirect_len(&site));
    lab.write(at, &r.bytes);
    ORIGINAL.store(r.original, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(fn1(f.0)(4), 5);
    let original_bytes = lab.bytes(site.patch_address, 5);
    lab.write(
        site.patch_address,
        &jmp_rel32(site.patch_address, at).unwrap(),
    );
    assert_eq!(fn1(f.0)(4), 50);
    assert_eq!(fn1(r.original)(4), 5);
    lab.write(site.patch_address, &original_bytes);
    assert_eq!(fn1(f.0)(4), 5);
}

/// Instruction points inside a leaf function that keeps data in its red
/// zone: a counter and a probe there leave the data alone, and the probe
/// sees the registers and `rsp` at that instruction.
#[test]
fn instruction_points_leave_the_red_zone_alone() {
    let mut lab = Lab::new();
    // leaf(a, b): stores a and b below rsp (the red zone), computes, then
    // reads them back: a * 1000 + b.
    let leaf = lab.assemble(|a, end| {
        a.mov(qword_ptr(rsp - 8), rdi).unwrap();
        a.mov(qword_ptr(rsp - 120), rsi).unwrap();
        a.imul_3(rax, rdi, 1000).unwrap(); // the instruction point
        a.add(rax, 0).unwrap();
        a.mov(rdx, qword_ptr(rsp - 8)).unwrap();
        a.cmp(rdx, rdi).unwrap();
        a.mov(rdx, -1i64).unwrap();
        a.cmovne(rax, rdx).unwrap();
        a.add(rax, qword_ptr(rsp - 120)).unwrap();
        a.ret().unwrap();
        a.set_label(end).unwrap();
    });
    // The point: after the two stores (5 bytes each).
    let point = leaf.0 + 10;
    lab.patch_instruction(leaf, point, Snippet::CountCall { offset: 8 * 100 });
    // The same with rax and rdx set before the point (4 bytes each), which
    // the probe sees as `ret` and `ret2`.
    let leaf2 = lab.assemble(|a, end| {
        a.lea(rax, qword_ptr(rdi + 3)).unwrap();
        a.lea(rdx, qword_ptr(rsi + 4)).unwrap();
        a.mov(qword_ptr(rsp - 8), rdi).unwrap();
        a.mov(qword_ptr(rsp - 120), rsi).unwrap();
        a.imul_3(rax, rdi, 1000).unwrap();
        a.add(rax, 0).unwrap();
        a.mov(rdx, qword_ptr(rsp - 8)).unwrap();
        a.cmp(rdx, rdi).unwrap();
        a.mov(rdx, -1i64).unwrap();
        a.cmovne(rax, rdx).unwrap();
        a.add(rax, qword_ptr(rsp - 120)).unwrap();
        a.ret().unwrap();
        a.set_label(end).unwrap();
    });
    lab.patch_instruction(
        leaf2,
        leaf2.0 + 18,
        Snippet::CallProbe(probe_call(leaf2.0, None, vector_save())),
    );
    let row = install_row(lab.cells());
    row[(ROW_INDEX / 8) as usize] = 1;
    // SAFETY: C-ABI functions of this signature.
    let (f, g) = unsafe {
        (
            std::mem::transmute::<usize, extern "C" fn(i64, i64) -> i64>(leaf.0 as usize),
            std::mem::transmute::<usize, extern "C" fn(i64, i64) -> i64>(leaf2.0 as usize),
        )
    };
    SEEN.lock().unwrap().clear();
    for k in 0..10 {
        assert_eq!(f(k, 7), k * 1000 + 7, "counted leaf({k})");
        assert_eq!(g(k, 9), k * 1000 + 9, "probed leaf({k})");
    }
    assert_eq!(word(8 * 100), 10);
    let seen = SEEN.lock().unwrap().clone();
    assert_eq!(seen.len(), 10);
    for (k, ctx) in seen.iter().enumerate() {
        assert_eq!((ctx.args[0], ctx.args[1]), (k as u64, 9));
        assert_eq!((ctx.ret, ctx.ret2), (k as u64 + 3, 13));
        assert_eq!((ctx.point, ctx.function), (POINT_INSTRUCTION, leaf2.0));
        // rsp at the point: the caller's rsp minus the return address, so
        // the data stored below it is there.
        // SAFETY: read only to compare; the stack above the point is the
        // test's own frame, alive (the values were recorded in the call).
        assert_eq!(ctx.rsp % 8, 0);
    }
    // Not an instruction boundary: refused.
    let code = lab.bytes(leaf2.0, leaf2.1);
    let err = analyze_at(
        &FunctionCode {
            address: leaf2.0,
            bytes: &code,
            padding: &[],
        },
        leaf2.0 + 11,
    )
    .unwrap_err();
    assert!(matches!(err, Refusal::NotAnInstruction { .. }), "{err}");
}

extern "C" fn plus_one(x: i64) -> i64 {
    x + 1
}
extern "C" fn times_two(x: i64) -> i64 {
    x * 2
}
extern "C" fn negate(x: i64) -> i64 {
    -x
}

/// Dynamic call sites: the targets of `call [rsi + 0x100]` and `call [rax +
/// 0x1000_0000]` (6 bytes each: the call is the last instruction the patch
/// displaces) recorded per thread, with counts, and an overflow past the
/// slots; the calls themselves unchanged.
#[test]
fn indirect_call_targets_are_recorded() {
    let mut lab = Lab::new();
    // via_table(x, table): call [table + 0x100]; via_slot(x): rax = slot -
    // 0x1000_0000, call [rax + 0x1000_0000] (rax, which the trampoline
    // saves, in the operand).
    let slot_at = lab.alloc(8, 8);
    let via_reg = lab.assemble(|a, end| {
        a.push(rbx).unwrap();
        a.call(qword_ptr(rsi + 0x100)).unwrap();
        a.pop(rbx).unwrap();
        a.ret().unwrap();
        a.set_label(end).unwrap();
    });
    let via_mem = lab.assemble(|a, end| {
        a.push(rbx).unwrap();
        a.mov(rax, slot_at - 0x1000_0000).unwrap();
        a.call(qword_ptr(rax + 0x1000_0000)).unwrap();
        a.pop(rbx).unwrap();
        a.ret().unwrap();
        a.set_label(end).unwrap();
    });
    let reg_table = CallTargets {
        table: 8 * 200,
        slots: 2,
    };
    let mem_table = CallTargets {
        table: 8 * 300,
        slots: 4,
    };
    // The calls: after `push rbx` (1 byte); after `push rbx; mov rax, imm64`
    // (1 + 10 bytes).
    lab.patch_instruction(via_reg, via_reg.0 + 1, Snippet::RecordCallTarget(reg_table));
    lab.patch_instruction(
        via_mem,
        via_mem.0 + 11,
        Snippet::RecordCallTarget(mem_table),
    );
    install_row(lab.cells());
    // SAFETY: C-ABI functions of these signatures.
    let (by_table, by_slot) = unsafe {
        (
            std::mem::transmute::<usize, extern "C" fn(i64, *const u64) -> i64>(via_reg.0 as usize),
            std::mem::transmute::<usize, extern "C" fn(i64) -> i64>(via_mem.0 as usize),
        )
    };
    // A table whose word at +0x100 is the target.
    let table_for = |f: u64| {
        let mut t = vec![0u64; 0x100 / 8 + 1];
        t[0x100 / 8] = f;
        t
    };
    let set_slot = |lab: &Lab, f: u64| lab.write(slot_at, &f.to_le_bytes());
    let (p1, t2, ng) = (
        plus_one as *const () as u64,
        times_two as *const () as u64,
        negate as *const () as u64,
    );
    let (tp1, tt2, tng) = (table_for(p1), table_for(t2), table_for(ng));
    for _ in 0..5 {
        assert_eq!(by_table(10, tp1.as_ptr()), 11);
    }
    for _ in 0..3 {
        assert_eq!(by_table(10, tt2.as_ptr()), 20);
    }
    assert_eq!(by_table(10, tng.as_ptr()), -10); // a third target: two slots, overflow
    for (i, f) in [p1, t2, ng].into_iter().enumerate() {
        set_slot(&lab, f);
        for _ in 0..=i {
            assert_eq!(by_slot(5), [6, 10, -5][i]);
        }
    }
    let slot = |t: &CallTargets, i: i32| (word(t.table + 16 * i), word(t.table + 16 * i + 8));
    assert_eq!(
        (slot(&reg_table, 0), slot(&reg_table, 1)),
        ((p1, 5), (t2, 3))
    );
    assert_eq!(word(reg_table.table + 32), 1, "overflow");
    assert_eq!(
        (0..3).map(|i| slot(&mem_table, i)).collect::<Vec<_>>(),
        vec![(p1, 1), (t2, 2), (ng, 3)]
    );
    assert_eq!(slot(&mem_table, 3), (0, 0));
    assert_eq!(word(mem_table.table + 64), 0, "no overflow");
}

/// Short indirect calls — a virtual call `call [rax + 8]` (3 bytes) and
/// `call rax` (2) — followed by more code: the patch starts at the
/// instruction before each (which loads the pointer), the trampoline runs
/// it first, then records the target the call is about to reach, then
/// makes the call.
#[test]
fn short_indirect_calls_are_patched_from_the_instruction_before() {
    let mut lab = Lab::new();
    // via_vtable(x, obj): rax = obj's vtable, call [rax + 8].
    let via_vtable = lab.assemble(|a, end| {
        a.push(rbx).unwrap();
        a.mov(rax, qword_ptr(rsi)).unwrap();
        a.call(qword_ptr(rax + 8)).unwrap();
        a.pop(rbx).unwrap();
        a.ret().unwrap();
        a.set_label(end).unwrap();
    });
    // via_pointer(x, f): rax = f (3 bytes), call rax, then 1 added.
    let via_pointer = lab.assemble(|a, end| {
        a.push(rbx).unwrap();
        a.mov(rax, rsi).unwrap();
        a.call(rax).unwrap();
        a.add(rax, 1).unwrap();
        a.pop(rbx).unwrap();
        a.ret().unwrap();
        a.set_label(end).unwrap();
    });
    let at = |f: (u64, usize), point: u64| {
        let code = lab.bytes(f.0, f.1);
        analyze_at(
            &FunctionCode {
                address: f.0,
                bytes: &code,
                padding: &[],
            },
            point,
        )
        .unwrap()
    };
    // The calls: after `push rbx; mov rax, [rsi]` (1 + 3); after `push
    // rbx; mov rax, rsi` (1 + 3). Each site starts at the mov and ends
    // with the call.
    for (f, call_len) in [(via_vtable, 3), (via_pointer, 2)] {
        let site = at(f, f.0 + 4);
        assert_eq!((site.patch_address, site.lead), (f.0 + 1, 1));
        assert_eq!(site.point(), f.0 + 4);
        assert_eq!(site.end(), f.0 + 4 + call_len);
    }
    let vt_table = CallTargets {
        table: 8 * 200,
        slots: 2,
    };
    let ptr_table = CallTargets {
        table: 8 * 300,
        slots: 2,
    };
    lab.patch_instruction(
        via_vtable,
        via_vtable.0 + 4,
        Snippet::RecordCallTarget(vt_table),
    );
    lab.patch_instruction(
        via_pointer,
        via_pointer.0 + 4,
        Snippet::RecordCallTarget(ptr_table),
    );
    install_row(lab.cells());
    // SAFETY: C-ABI functions of these signatures.
    let (by_vtable, by_pointer) = unsafe {
        (
            std::mem::transmute::<usize, extern "C" fn(i64, *const *const u64) -> i64>(
                via_vtable.0 as usize,
            ),
            std::mem::transmute::<usize, extern "C" fn(i64, u64) -> i64>(via_pointer.0 as usize),
        )
    };
    let (p1, t2) = (plus_one as *const () as u64, times_two as *const () as u64);
    // Two "objects" whose vtables hold the target at +8.
    let (vt1, vt2) = ([0u64, p1], [0u64, t2]);
    let (o1, o2) = (vt1.as_ptr(), vt2.as_ptr());
    for _ in 0..4 {
        assert_eq!(by_vtable(10, &o1), 11);
    }
    for _ in 0..2 {
        assert_eq!(by_vtable(10, &o2), 20);
    }
    for _ in 0..3 {
        assert_eq!(by_pointer(7, t2), 15);
    }
    assert_eq!(by_pointer(7, p1), 9);
    let slot = |t: &CallTargets, i: i32| (word(t.table + 16 * i), word(t.table + 16 * i + 8));
    assert_eq!((slot(&vt_table, 0), slot(&vt_table, 1)), ((p1, 4), (t2, 2)));
    assert_eq!(
        (slot(&ptr_table, 0), slot(&ptr_table, 1)),
        ((t2, 3), (p1, 1))
    );
    assert_eq!(word(vt_table.table + 32) + word(ptr_table.table + 32), 0);
}

/// A 2-byte instruction right before the start of another basic block (a
/// loop's head) is patched from the instruction before it; a count there
/// runs once per execution of that instruction, and the loop is intact.
#[test]
fn a_short_instruction_before_a_block_is_counted() {
    let mut lab = Lab::new();
    // sum(n): rax = 0; rbx = n; top: add rax, rbx; dec rbx; jnz top; ret.
    // The point: `mov rbx, rdi` (3 bytes) just before `top` (a branch
    // target).
    let sum = lab.assemble(|a, end| {
        let mut top = a.create_label();
        a.xor(eax, eax).unwrap(); // 2
        a.push(rbx).unwrap(); // 1
        a.mov(rbx, rdi).unwrap(); // 3, the point
        a.set_label(&mut top).unwrap();
        a.add(rax, rbx).unwrap();
        a.dec(rbx).unwrap();
        a.jnz(top).unwrap();
        a.pop(rbx).unwrap();
        a.ret().unwrap();
        a.set_label(end).unwrap();
    });
    let code = lab.bytes(sum.0, sum.1);
    let f = FunctionCode {
        address: sum.0,
        bytes: &code,
        padding: &[],
    };
    // The point itself would displace the loop's first instruction.
    let site = analyze_at(&f, sum.0 + 3).unwrap();
    assert_eq!(
        (site.patch_address, site.lead, site.end()),
        (sum.0, 2, sum.0 + 6)
    );
    // The loop's head starts a patch itself (the branch lands on its first
    // byte); `pop rbx; ret` (2 bytes, no padding) is patched from the `dec`,
    // with the loop's `jnz` in the lead.
    assert_eq!(analyze_at(&f, sum.0 + 6).unwrap().lead, 0);
    let tail = analyze_at(&f, sum.0 + 14).unwrap();
    assert_eq!((tail.patch_address, tail.lead), (sum.0 + 9, 2));
    lab.patch_instruction(sum, sum.0 + 3, Snippet::CountCall { offset: 8 * 100 });
    install_row(lab.cells());
    // SAFETY: a C-ABI function of this signature.
    let sum = unsafe { std::mem::transmute::<usize, extern "C" fn(u64) -> u64>(sum.0 as usize) };
    for n in 1..=5 {
        assert_eq!(sum(n), n * (n + 1) / 2);
    }
    assert_eq!(word(8 * 100), 5);
}
