//! A function's instructions, basic blocks, call sites and exit points
//! (`weft_codegen::analyze_function`): a hand-built function with every
//! kind of flow, and every function of libc and of this binary, whose
//! decodings must be consistent.
#![cfg(all(target_arch = "x86_64", target_os = "linux"))]

use iced_x86::code_asm::*;
use iced_x86::BlockEncoderOptions;
use weft_codegen::cfg::{CallTarget, ExitKind, Flow};
use weft_codegen::{analyze_function, Disassembly};

const AT: u64 = 0x40_1000;
const OTHER: u64 = 0x50_0000;

/// ```text
/// entry: test edi, edi ; jz .zero
/// .loop: call OTHER ; dec edi ; jnz .loop
///        call [rip + slot] ; ret
/// .zero: cmp esi, 1 ; je OTHER+16 (conditional tail call)
///        test esi, esi ; jnz .tail
///        jmp rax
/// .tail: jmp OTHER+32
/// slot:  (8 bytes, after the code)
/// ```
fn build() -> (Vec<u8>, Vec<u64>) {
    let mut a = CodeAssembler::new(64).unwrap();
    let mut zero = a.create_label();
    let mut lp = a.create_label();
    let mut tail = a.create_label();
    let mut slot = a.create_label();
    let mut marks: Vec<CodeLabel> = (0..6).map(|_| a.create_label()).collect();
    a.test(edi, edi).unwrap();
    a.jz(zero).unwrap();
    a.set_label(&mut lp).unwrap();
    a.call(OTHER).unwrap();
    a.dec(edi).unwrap();
    a.jnz(lp).unwrap();
    a.set_label(&mut marks[1]).unwrap();
    a.call(qword_ptr(slot)).unwrap();
    a.set_label(&mut marks[2]).unwrap();
    a.ret().unwrap();
    a.set_label(&mut zero).unwrap();
    a.cmp(esi, 1).unwrap();
    a.set_label(&mut marks[3]).unwrap();
    a.je(OTHER + 16).unwrap();
    a.test(esi, esi).unwrap();
    a.jnz(tail).unwrap();
    a.set_label(&mut marks[4]).unwrap();
    a.jmp(rax).unwrap();
    a.set_label(&mut tail).unwrap();
    a.jmp(OTHER + 32).unwrap();
    a.set_label(&mut slot).unwrap();
    a.dq(&[0]).unwrap();
    let r = a
        .assemble_options(AT, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)
        .unwrap();
    // (One label per instruction: the loop's and the tail's stand for
    // marks 0 and 5.)
    marks[0] = lp;
    marks[5] = tail;
    let mut addresses: Vec<u64> = marks.iter().map(|m| r.label_ip(m).unwrap()).collect();
    addresses.push(r.label_ip(&slot).unwrap());
    (r.inner.code_buffer, addresses)
}

#[test]
fn blocks_calls_and_exits_of_a_function_with_every_flow() {
    let (bytes, marks) = build();
    let slot = marks[6];
    // The function's extent ends before its data.
    let code = analyze_function(AT, &bytes[..(slot - AT) as usize]);
    let [call_direct, call_slot, ret, jcc_out, jmp_reg, jmp_out] =
        [marks[0], marks[1], marks[2], marks[3], marks[4], marks[5]];
    assert_eq!(
        code.calls
            .iter()
            .map(|c| (c.address, c.target))
            .collect::<Vec<_>>(),
        vec![
            (call_direct, CallTarget::Direct(OTHER)),
            (call_slot, CallTarget::Indirect { slot: Some(slot) }),
        ]
    );
    assert_eq!(
        code.exits
            .iter()
            .map(|e| (e.address, e.kind))
            .collect::<Vec<_>>(),
        vec![
            (ret, ExitKind::Return),
            (jcc_out, ExitKind::TailCall { target: OTHER + 16 }),
            (jmp_reg, ExitKind::IndirectJump { slot: None }),
            (jmp_out, ExitKind::TailCall { target: OTHER + 32 }),
        ]
    );
    // Blocks: entry | loop | after-loop (call slot, ret) | zero (cmp, je)
    // | test, jnz | jmp rax | tail.
    let starts: Vec<u64> = code.blocks.iter().map(|b| b.start).collect();
    assert_eq!(starts.len(), 7, "{:#x?}", code.blocks);
    assert_eq!(starts[0], AT);
    assert_eq!(starts[1], call_direct);
    let lp = &code.blocks[1];
    // The loop's back edge and its fall-through.
    assert_eq!(lp.successors, vec![call_direct, call_slot]);
    assert!(code.blocks[2].successors.is_empty()); // ends in ret
    assert_eq!(code.block_of(ret).unwrap().start, call_slot);
    // A conditional tail call: only the fall-through stays inside.
    let zero = code.block_of(jcc_out).unwrap();
    assert_eq!(zero.successors.len(), 1);
    assert!(code.is_instruction_boundary(jmp_reg));
    assert!(!code.is_instruction_boundary(jmp_reg + 1));
    assert_eq!(
        code.instruction_at(call_slot).unwrap().flow,
        Flow::IndirectCall { slot: Some(slot) }
    );
    check_consistent(&code, bytes.len().min((slot - AT) as usize));
}

/// Invariants of any decoding: instructions tile the bytes, blocks tile
/// the instructions, every successor is a block, every call and exit is an
/// instruction.
fn check_consistent(code: &Disassembly, len: usize) {
    let mut at = code.address;
    for i in &code.instructions {
        assert_eq!(i.address, at, "instructions do not tile the function");
        at += i.len as u64;
    }
    assert_eq!(at, code.address + len as u64);
    let mut next = 0;
    for b in &code.blocks {
        assert_eq!(b.instructions.start, next, "blocks do not tile");
        assert!(b.instructions.end > b.instructions.start);
        next = b.instructions.end;
        for s in &b.successors {
            assert!(
                code.blocks.iter().any(|x| x.start == *s),
                "successor {s:#x} is no block"
            );
        }
    }
    assert_eq!(next, code.instructions.len());
    for a in code
        .calls
        .iter()
        .map(|c| c.address)
        .chain(code.exits.iter().map(|e| e.address))
    {
        assert!(code.is_instruction_boundary(a));
    }
}

/// Every function symbol of libc and of this test binary.
#[test]
fn every_function_of_libc_and_this_binary_decodes_consistently() {
    use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let libc = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("/libc.so"))
        .expect("libc is mapped")
        .to_string();
    for path in [
        std::path::PathBuf::from(libc),
        std::env::current_exe().unwrap(),
    ] {
        let data = std::fs::read(&path).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let (mut functions, mut blocks, mut exits) = (0usize, 0usize, 0usize);
        let mut seen = std::collections::HashSet::new();
        for sym in file.symbols().chain(file.dynamic_symbols()) {
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
            let end = (start + sym.size() as usize).min(bytes.len());
            if start >= end {
                continue;
            }
            let code = analyze_function(sym.address(), &bytes[start..end]);
            check_consistent(&code, end - start);
            functions += 1;
            blocks += code.blocks.len();
            exits += code.exits.len();
        }
        eprintln!(
            "{}: {functions} functions, {blocks} blocks, {exits} exit points",
            path.display()
        );
        assert!(functions > 500 && exits >= functions / 2);
    }
}
