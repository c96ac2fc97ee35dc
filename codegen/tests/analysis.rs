//! `analyze_entry` and `relocate` on hand-written byte sequences.

mod common;

use common::{check_relocation, decode_all};
use iced_x86::{Code, Register};
use weft_codegen::*;

const A: u64 = 0x0040_1200;
const RET: u8 = 0xc3;

fn f(bytes: &[u8]) -> FunctionCode<'_> {
    FunctionCode {
        address: A,
        bytes,
        padding: &[],
    }
}

fn analyze(bytes: &[u8]) -> Result<PatchSite, Refusal> {
    analyze_entry(&f(bytes))
}

/// `bytes` followed by `n` int3 bytes of filler (a function body that the
/// sweep should decode but that should not matter).
fn body(bytes: &[u8]) -> Vec<u8> {
    let mut v = bytes.to_vec();
    v.extend_from_slice(&[0x48, 0x89, 0xf8, RET]); // mov rax, rdi; ret
    v
}

#[test]
fn endbr64_is_skipped() {
    // endbr64; push rbp; mov rbp, rsp; push r15
    let code = body(&[0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5, 0x41, 0x57]);
    let s = analyze(&code).unwrap();
    assert!(s.skipped_endbr64);
    assert_eq!(s.patch_address, A + 4);
    assert_eq!(s.original, &code[4..10]);
    assert_eq!(s.instructions.len(), 3);
    assert_eq!(s.end(), A + 10);
    assert_eq!(s.borrowed_padding, 0);
    // A branch back to the endbr64 itself is outside the patch.
    let mut code2 = code.clone();
    code2.extend_from_slice(&[0xeb, (-(code.len() as i8) - 2) as u8]); // jmp A
    assert!(analyze(&code2).is_ok());
}

#[test]
fn displaces_whole_instructions() {
    // mov eax, 1 (5 bytes exactly)
    let s = analyze(&body(&[0xb8, 1, 0, 0, 0])).unwrap();
    assert_eq!(s.original.len(), 5);
    assert!(!s.skipped_endbr64);
    // sub rsp, 8 (4); xor eax, eax (2): 6
    let s = analyze(&body(&[0x48, 0x83, 0xec, 0x08, 0x31, 0xc0])).unwrap();
    assert_eq!(s.original, [0x48, 0x83, 0xec, 0x08, 0x31, 0xc0]);
    assert_eq!(s.instructions.len(), 2);
    assert_eq!(s.instructions[1].code(), Code::Xor_rm32_r32);
    // push rbp (1); mov rax, imm64 (10): 11
    let s = analyze(&body(&[0x55, 0x48, 0xb8, 1, 2, 3, 4, 5, 6, 7, 8])).unwrap();
    assert_eq!(s.original.len(), 11);
}

#[test]
fn branch_into_patch_is_refused() {
    // push rbp; mov rbp, rsp; push rbx; ... ; jmp back to A+1
    let mut code = vec![0x55, 0x48, 0x89, 0xe5, 0x53, 0x31, 0xc0];
    let at = code.len() as u64;
    code.extend_from_slice(&[0x75, (1i64 - (at as i64 + 2)) as u8, RET]); // jne A+1
    let err = analyze(&code).unwrap_err();
    assert_eq!(
        err,
        Refusal::BranchIntoPatch {
            from: A + at,
            target: A + 1,
            patch_address: A,
            end: A + 5
        }
    );
    let msg = err.to_string();
    assert!(
        msg.contains("0x401207") && msg.contains("0x401201"),
        "{msg}"
    );

    // The same loop to A itself is fine.
    code[at as usize + 1] = (-(at as i64 + 2)) as u8;
    assert!(analyze(&code).is_ok());
    // A rel32 call to A+4 (the last displaced byte) is refused too.
    let mut code = vec![0x55, 0x48, 0x89, 0xe5, 0x53, 0x31, 0xc0];
    let at = code.len() as i64;
    code.push(0xe8);
    code.extend_from_slice(&((4 - (at + 5)) as i32).to_le_bytes());
    code.push(RET);
    assert!(
        matches!(analyze(&code), Err(Refusal::BranchIntoPatch { target, .. }) if target == A + 4)
    );
    // Branches into the bytes after the patch are fine.
    let mut code = vec![0x55, 0x48, 0x89, 0xe5, 0x53, 0x31, 0xc0];
    let at = code.len() as i64;
    code.extend_from_slice(&[0x75, (5 - (at + 2)) as u8, RET]); // jne A+5
    assert!(analyze(&code).is_ok());
}

#[test]
fn rip_relative_operand_into_patch_is_refused() {
    // push rbp; mov rbp,rsp; push rbx; lea rax, [rip - (A+2)]
    let mut code = vec![0x55, 0x48, 0x89, 0xe5, 0x53];
    let at = code.len() as i64;
    code.extend_from_slice(&[0x48, 0x8d, 0x05]);
    code.extend_from_slice(&((2 - (at + 7)) as i32).to_le_bytes());
    code.push(RET);
    assert!(
        matches!(analyze(&code), Err(Refusal::OperandIntoPatch { target, .. }) if target == A + 2)
    );
}

#[test]
fn call_not_last_is_refused() {
    // call rax; xor eax, eax; ret  -> call is displaced but not last.
    let code = [0xff, 0xd0, 0x31, 0xc0, 0x48, 0x89, 0xc7, RET];
    assert_eq!(analyze(&code), Err(Refusal::CallNotLast { address: A }));
    assert!(Refusal::CallNotLast { address: A }
        .to_string()
        .contains("return into the middle"));
    // xor eax, eax; nop; call rel32: call last is fine.
    let code = body(&[0x31, 0xc0, 0xe8, 0, 0, 0, 0]);
    let s = analyze(&code).unwrap();
    assert_eq!(s.instructions.last().unwrap().code(), Code::Call_rel32_64);
}

#[test]
fn short_function_borrows_padding() {
    let code = [0x31, 0xc0, RET]; // xor eax, eax; ret
    for padding in [
        &[0xcc, 0xcc, 0xcc, 0xcc][..],
        &[0x90, 0x90],
        &[0x66, 0x90],
        &[0x0f, 0x1f, 0x40, 0x00],
        &[0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0],
    ] {
        let s = analyze_entry(&FunctionCode {
            address: A,
            bytes: &code,
            padding,
        })
        .unwrap();
        assert_eq!(s.borrowed_padding, 2);
        assert_eq!(s.original[..3], code);
        assert_eq!(s.original[3..], padding[..2]);
        assert_eq!(s.end(), A + 5);
        assert_eq!(s.instructions.len(), 2);
        assert_eq!(s.instructions_len(), 3);
        let r = relocate(&s, A + 0x1000).unwrap();
        assert!(!r.jumps_back);
        check_relocation(&s, &r);
    }
    // A lone `ret` borrows four bytes; `jmp rel8` as the last instruction counts too.
    let s = analyze_entry(&FunctionCode {
        address: A,
        bytes: &[RET],
        padding: &[0xcc; 8],
    })
    .unwrap();
    assert_eq!(s.original, [RET, 0xcc, 0xcc, 0xcc, 0xcc]);
    let s = analyze_entry(&FunctionCode {
        address: A,
        bytes: &[0xeb, 0x10],
        padding: &[0xcc; 8],
    })
    .unwrap();
    assert_eq!(s.borrowed_padding, 3);
}

#[test]
fn short_function_without_usable_padding_is_refused() {
    let code = [0x31, 0xc0, RET];
    let short = |padding: &[u8]| {
        analyze_entry(&FunctionCode {
            address: A,
            bytes: &code,
            padding,
        })
    };
    match short(&[0xcc]) {
        Err(Refusal::TooShort {
            patch_address: A,
            available: 3,
            reason:
                ShortReason::NotEnoughPadding {
                    available: 1,
                    needed: 2,
                },
        }) => {}
        other => panic!("{other:?}"),
    }
    // Padding that is actually the next function.
    match short(&[0x55, 0x48, 0x89, 0xe5]) {
        Err(Refusal::TooShort {
            reason: ShortReason::NotPadding { address },
            ..
        }) => assert_eq!(address, A + 3),
        other => panic!("{other:?}"),
    }
    // int3 then code: the second borrowed byte is not padding.
    assert!(matches!(
        short(&[0xcc, 0x55]),
        Err(Refusal::TooShort {
            reason: ShortReason::NotPadding { .. },
            ..
        })
    ));
    // The last instruction falls through (call, not a terminator).
    let code = [0xff, 0xd0]; // call rax
    let err = analyze_entry(&FunctionCode {
        address: A,
        bytes: &code,
        padding: &[0xcc; 8],
    })
    .unwrap_err();
    assert_eq!(
        err,
        Refusal::TooShort {
            patch_address: A,
            available: 2,
            reason: ShortReason::FallsThrough { last: A }
        }
    );
    assert!(err.to_string().contains("continue past the end"), "{err}");
    // Empty function; endbr64 alone.
    assert!(matches!(
        analyze(&[]),
        Err(Refusal::TooShort {
            reason: ShortReason::Empty,
            ..
        })
    ));
    assert!(
        matches!(analyze(&[0xf3, 0x0f, 0x1e, 0xfa]), Err(Refusal::TooShort { reason: ShortReason::Empty, patch_address, .. }) if patch_address == A + 4)
    );
}

#[test]
fn int3_and_undecodable_are_refused() {
    assert_eq!(
        analyze(&body(&[0xcc, 0x48, 0x89, 0xe5, 0x90])),
        Err(Refusal::Breakpoint { address: A })
    );
    assert_eq!(
        analyze(&body(&[0x55, 0x53, 0xcc, 0x90, 0x90])),
        Err(Refusal::Breakpoint { address: A + 2 })
    );
    // 0x06 (push es) does not exist in 64-bit mode.
    assert_eq!(
        analyze(&body(&[0x55, 0x06, 0x90, 0x90, 0x90])),
        Err(Refusal::Undecodable { address: A + 1 })
    );
    // A truncated instruction at the end of the bytes.
    assert_eq!(
        analyze(&[0x55, 0x48, 0xb8, 1, 2]),
        Err(Refusal::Undecodable { address: A + 1 })
    );
    // Undecodable bytes after the displaced instructions are tolerated.
    assert!(analyze(&[0xb8, 1, 0, 0, 0, RET, 0x06, 0x07, 0xff, 0xff]).is_ok());
    // Far calls cannot be relocated.
    let err = analyze(&body(&[0xff, 0x18, 0x90, 0x90, 0x90])).unwrap_err(); // call far [rax]
    assert!(
        matches!(err, Refusal::Unsupported { address: A, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("near calls"), "{err}");
}

/// Builds a one-instruction-plus-ret function from `first`, analyzes it and
/// relocates it `delta` bytes away, checking the result.
fn relocate_checked(first: &[u8], delta: i64) -> (PatchSite, Relocated) {
    let code = body(first);
    let s = analyze(&code).unwrap();
    let r = relocate(&s, A.wrapping_add_signed(delta)).unwrap();
    check_relocation(&s, &r);
    (s, r)
}

const GIB: i64 = 1 << 30;

#[test]
fn rip_relative_operands_keep_their_targets() {
    let d = 0x1234_5678u32.to_le_bytes();
    for (bytes, target) in [
        (
            vec![0x48, 0x8b, 0x05, d[0], d[1], d[2], d[3]],
            A + 7 + 0x1234_5678,
        ), // mov rax, [rip+x]
        (
            vec![0x48, 0x8d, 0x3d, d[0], d[1], d[2], d[3]],
            A + 7 + 0x1234_5678,
        ), // lea rdi, [rip+x]
        (
            vec![0x83, 0x3d, d[0], d[1], d[2], d[3], 0x05],
            A + 7 + 0x1234_5678,
        ), // cmp dword [rip+x], 5
        (
            vec![0x48, 0x81, 0x3d, d[0], d[1], d[2], d[3], 1, 2, 3, 4],
            A + 11 + 0x1234_5678,
        ), // cmp qword [rip+x], imm32
        (
            vec![0x66, 0x0f, 0x6f, 0x05, d[0], d[1], d[2], d[3]],
            A + 8 + 0x1234_5678,
        ), // movdqa xmm0, [rip+x]
    ] {
        for delta in [GIB, -GIB, 0x1000] {
            let (s, r) = relocate_checked(&bytes, delta);
            assert!(s.instructions[0].is_ip_rel_memory_operand());
            let moved = &decode_all(&r.bytes, r.address)[0];
            assert_eq!(moved.ip_rel_memory_address(), target);
            assert!(r.jumps_back);
        }
    }
}

#[test]
fn rip_relative_out_of_reach_is_an_error() {
    const A: u64 = 0x7f12_0000_0000;
    let code = body(&[0x48, 0x8b, 0x05, 0, 0, 0, 0x70]); // mov rax, [rip+0x70000000]
    let s = analyze_entry(&FunctionCode {
        address: A,
        bytes: &code,
        padding: &[],
    })
    .unwrap();
    let err = relocate(&s, A + 0x1_8000_0000).unwrap_err();
    assert_eq!(
        err,
        RelocError::RipRelativeOutOfRange {
            instruction: A,
            target: A + 7 + 0x7000_0000,
            new_ip: A + 0x1_8000_0000
        }
    );
    // Below 4 GiB the encoder may use `[eip+disp32]`, which reaches it from anywhere.
    let low = analyze(&code).unwrap();
    let r = relocate(&low, 0x7f00_0000_0000).unwrap();
    assert_eq!(
        decode_all(&r.bytes, r.address)[0].ip_rel_memory_address(),
        low.instructions[0].ip_rel_memory_address()
    );
    assert!(err.to_string().contains("±2 GiB"), "{err}");
    let t = build_trampoline(&TrampolineSpec {
        address: A + 0x1_8000_0000,
        site: &s,
        row: ThreadRow {
            tls_offset: -8,
            register_stub: A + 0x1_8000_0000,
            activity: None,
        },
        snippets: &[],
    });
    assert!(matches!(t, Err(BuildError::Relocate(_))));
}

#[test]
fn short_jcc_grows_and_keeps_its_target() {
    // test edi, edi; je +0x10; ...
    let (s, r) = relocate_checked(&[0x85, 0xff, 0x74, 0x10, 0x90], GIB);
    assert_eq!(s.instructions[1].near_branch_target(), A + 4 + 0x10);
    let moved = decode_all(&r.bytes, r.address);
    assert_eq!(moved[1].code(), Code::Je_rel32_64);
    assert_eq!(moved[1].near_branch_target(), A + 0x14);
    // jrcxz / loop cannot grow; the encoder rewrites them around a jmp.
    relocate_checked(&[0xe3, 0x10, 0x90, 0x90, 0x90], GIB);
    relocate_checked(&[0xe2, 0x10, 0x90, 0x90, 0x90], -GIB);
    // Beyond ±2 GiB a jcc goes through a slot.
    relocate_checked(&[0x85, 0xff, 0x74, 0x10, 0x90], 8 * GIB);
    // xbegin rel32
    relocate_checked(&[0xc7, 0xf8, 0x10, 0, 0, 0], GIB);
}

#[test]
fn branch_to_patch_address_goes_to_relocated_copy() {
    // xor eax,eax; dec eax; jnz A  (a loop at the very entry)
    let code = [0x31, 0xc0, 0xff, 0xc8, 0x75, 0xfa, RET];
    let s = analyze(&code).unwrap();
    let r = relocate(&s, A + GIB as u64).unwrap();
    check_relocation(&s, &r);
    let moved = decode_all(&r.bytes, r.address);
    assert_eq!(
        moved[2].near_branch_target(),
        r.address,
        "the loop must stay in the trampoline"
    );
}

#[test]
fn final_call_pushes_the_original_return_address() {
    let far = 0x4000_0000u32.to_le_bytes();
    // xor eax, eax; call rel32
    let (s, r) = relocate_checked(&[0x31, 0xc0, 0xe8, far[0], far[1], far[2], far[3]], GIB);
    assert!(!r.jumps_back);
    assert_eq!(s.end(), A + 7);
    let moved = decode_all(&r.bytes, r.address);
    assert_eq!(moved[4].near_branch_target(), A + 7 + 0x4000_0000);
    // call rel32 moved out of rel32 reach: via a slot.
    relocate_checked(&[0xe8, far[0], far[1], far[2], far[3]], 16 * GIB);
    // call [rip+x] (GOT), moved by +1 GiB: same slot address.
    let (_, r) = relocate_checked(&[0xff, 0x15, 0x10, 0, 0, 0], GIB);
    let moved = decode_all(&r.bytes, r.address);
    assert_eq!(moved[3].code(), Code::Jmp_rm64);
    assert_eq!(moved[3].ip_rel_memory_address(), A + 6 + 0x10);
    // call rax; call [rsp+8] (the +8 compensates our push); call [rbx+rcx*8+0x7c]
    relocate_checked(&[0x90, 0x90, 0x90, 0xff, 0xd0], GIB);
    let (_, r) = relocate_checked(&[0x90, 0xff, 0x54, 0x24, 0x08], GIB);
    assert_eq!(
        decode_all(&r.bytes, r.address)[4].memory_displacement64(),
        0x10
    );
    let (_, r) = relocate_checked(&[0x90, 0xff, 0x54, 0x24, 0x7c], 0);
    assert_eq!(
        decode_all(&r.bytes, r.address)[4].memory_displacement64(),
        0x84
    ); // disp8 grew
    relocate_checked(&[0x90, 0xff, 0x54, 0xcb, 0x7c], 0); // call [rbx+rcx*8+0x7c]
    let (_, r) = relocate_checked(&[0x90, 0x90, 0x90, 0xff, 0x14, 0x24], 0); // call [rsp]
    let j = decode_all(&r.bytes, r.address)[6];
    assert_eq!(
        (j.memory_base(), j.memory_displacement64()),
        (Register::RSP, 8)
    );
    // `call rsp` is refused.
    assert!(matches!(
        analyze(&body(&[0x90, 0x90, 0x90, 0xff, 0xd4])),
        Err(Refusal::Unsupported { .. })
    ));
}

#[test]
fn final_call_followed_by_call_is_fine_but_not_last_is_refused() {
    // call rel32 at the end of the displaced range is last even if the function continues with calls.
    let s = analyze(&[0xe8, 0, 0, 0, 0, 0xe8, 0, 0, 0, 0, RET]).unwrap();
    assert_eq!(s.instructions.len(), 1);
}

#[test]
fn jmp_rip_relative_relocated_far() {
    // jmp [rip+0x100]: a PLT-like tail jump.
    let (s, r) = relocate_checked(&[0xff, 0x25, 0, 1, 0, 0], GIB);
    assert!(!r.jumps_back);
    let moved = decode_all(&r.bytes, r.address);
    assert_eq!(
        moved[0].ip_rel_memory_address(),
        s.instructions[0].ip_rel_memory_address()
    );
    // jmp rel32 moved far away
    relocate_checked(&[0xe9, 0, 1, 0, 0], 100 * GIB);
}

#[test]
fn trampoline_layout() {
    let code = body(&[0x55, 0x48, 0x89, 0xe5, 0x53]);
    let s = analyze(&code).unwrap();
    let snippets = [
        Snippet::CountCall { offset: 64 },
        Snippet::CountCall { offset: 4096 },
    ];
    let addr = A + 0x10_0000;
    let stub = addr + 0x800;
    let t = build_trampoline(&TrampolineSpec {
        address: addr,
        site: &s,
        row: ThreadRow {
            tls_offset: -0x58,
            register_stub: stub,
            activity: None,
        },
        snippets: &snippets,
    })
    .unwrap();
    assert!(t.bytes.len() <= max_trampoline_len(&s, &snippets));
    let i = decode_all(&t.bytes, addr);
    let codes: Vec<Code> = i.iter().map(|i| i.code()).collect();
    assert_eq!(
        codes[..13],
        [
            Code::Push_r64,
            Code::Push_r64,
            Code::Seto_rm8,
            Code::Lahf,
            Code::Mov_r64_rm64,
            Code::Test_rm64_r64,
            Code::Je_rel32_64,
            Code::Inc_rm64,
            Code::Inc_rm64,
            Code::Add_AL_imm8,
            Code::Sahf,
            Code::Pop_r64,
            Code::Pop_r64
        ]
    );
    // mov rcx, fs:[-0x58] -- absolute, not rip-relative.
    assert_eq!(
        (
            i[4].segment_prefix(),
            i[4].memory_base(),
            i[4].memory_displacement64() as i64
        ),
        (Register::FS, Register::None, -0x58)
    );
    assert_eq!(
        (i[7].memory_base(), i[7].memory_displacement64()),
        (Register::RCX, 64)
    );
    assert_eq!(
        (i[8].memory_base(), i[8].memory_displacement64()),
        (Register::RCX, 4096)
    );
    assert_eq!(i[10 + 3].ip(), addr + t.relocated_offset as u64);
    assert_eq!(i[6].near_branch_target(), addr + t.slow_path_offset as u64);
    let slow: Vec<_> = decode_all(
        &t.bytes[t.slow_path_offset..],
        addr + t.slow_path_offset as u64,
    );
    assert_eq!(slow[0].code(), Code::Call_rel32_64);
    assert_eq!(slow[0].near_branch_target(), stub);
    assert_eq!(slow[2].near_branch_target(), i[9].ip(), "jz .done");
    assert_eq!(slow[3].near_branch_target(), i[7].ip(), "jmp .have");
    assert_eq!(t.slow_path_offset + 19, t.bytes.len());
    // The relocated part ends with the jump back.
    let reloc = &t.bytes[t.relocated_offset..t.relocated_offset + t.relocated_len];
    let back = decode_all(reloc, addr + t.relocated_offset as u64)
        .pop()
        .unwrap();
    assert_eq!(back.near_branch_target(), s.end());

    // Stub out of reach.
    let far = ThreadRow {
        tls_offset: -8,
        register_stub: addr + 3 * GIB as u64,
        activity: None,
    };
    let err = build_trampoline(&TrampolineSpec {
        address: addr,
        site: &s,
        row: far,
        snippets: &snippets,
    })
    .unwrap_err();
    assert!(matches!(err, BuildError::StubOutOfReach { .. }));
    assert!(err.to_string().contains("registration stub"), "{err}");
}

#[test]
fn register_stub_shape() {
    for save in [
        VectorSave::Fxsave64,
        VectorSave::Xsave {
            area_size: 2696,
            mask: u64::MAX,
        },
    ] {
        let stub = register_stub(0x7000_0000, 0x7fff_1234_5678, save).unwrap();
        assert_eq!(stub.len(), register_stub_len(save));
        let i = decode_all(&stub, 0x7000_0000);
        assert_eq!(i[0].code(), Code::Pushfq);
        assert_eq!(i.last().unwrap().code(), Code::Retnq);
        assert!(i.iter().all(|i| i.code() != Code::INVALID));
        assert!(i
            .iter()
            .any(|i| i.code() == Code::Mov_r64_imm64 && i.immediate64() == 0x7fff_1234_5678));
        let (s, r) = match save {
            VectorSave::Fxsave64 => (Code::Fxsave64_m512byte, Code::Fxrstor64_m512byte),
            VectorSave::Xsave { .. } => (Code::Xsave64_mem, Code::Xrstor64_mem),
        };
        assert!(i.iter().any(|i| i.code() == s) && i.iter().any(|i| i.code() == r));
        // pushes and pops balance
        let pushes = i.iter().filter(|i| i.code() == Code::Push_r64).count();
        let pops = i.iter().filter(|i| i.code() == Code::Pop_r64).count();
        assert_eq!(pushes, pops);
    }
    assert_eq!(
        register_stub(
            0,
            0,
            VectorSave::Xsave {
                area_size: 512,
                mask: u64::MAX,
            }
        ),
        Err(BuildError::XsaveAreaTooSmall { area_size: 512 })
    );
}

#[test]
fn instruction_points_beside_a_jump_table_displace_one_instruction_only() {
    // mov eax, 1 (5); sub rsp, 8 (4); xor eax, eax (2); jmp rax (2); ret
    let code = [
        0xb8, 1, 0, 0, 0, 0x48, 0x83, 0xec, 0x08, 0x31, 0xc0, 0xff, 0xe0, RET,
    ];
    let at = |address| analyze_at(&f(&code), address);
    // One 5-byte instruction: a table jumping to it lands on the patch's
    // first byte, which is fine.
    assert_eq!(at(A).unwrap().instructions.len(), 1);
    // sub + xor: the table could reach the xor, inside the patch.
    match at(A + 5).unwrap_err() {
        Refusal::IndirectJumpMayEnter {
            patch_address,
            displaced,
            from,
        } => assert_eq!((patch_address, displaced, from), (A + 5, 2, A + 11)),
        other => panic!("{other}"),
    }
    // A tail call through a GOT slot (`jmp [rip + 0]`) is no table.
    let mut got = code;
    got[11..13].copy_from_slice(&[0xeb, 0x00]); // jmp short +0 (a direct jump)
    let mut got = got.to_vec();
    got.extend_from_slice(&[0xff, 0x25, 0, 0, 0, 0]);
    assert_eq!(analyze_at(&f(&got), A + 5).unwrap().instructions.len(), 2);
}
