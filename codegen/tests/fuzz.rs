//! Property test: random byte sequences as functions. Analysis and
//! relocation never panic, and whenever they succeed the relocated code keeps
//! every branch target and RIP-relative address; trampolines stay within
//! their advertised maximum length.

mod common;

use common::check_relocation;
use weft_codegen::*;

/// xorshift64*: a tiny deterministic PRNG (no dependency needed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

/// Instruction starts that are common at function entries, so random
/// functions exercise interesting forms and not only junk.
const SEEDS: &[&[u8]] = &[
    &[0xf3, 0x0f, 0x1e, 0xfa], // endbr64
    &[0x48, 0x8b, 0x05],       // mov rax, [rip+d32]
    &[0x48, 0x8d, 0x3d],       // lea rdi, [rip+d32]
    &[0x83, 0x3d],             // cmp dword [rip+d32], imm8
    &[0xff, 0x25],             // jmp [rip+d32]
    &[0xff, 0x15],             // call [rip+d32]
    &[0xe8],                   // call rel32
    &[0xe9],                   // jmp rel32
    &[0x74],                   // je rel8
    &[0x0f, 0x85],             // jne rel32
    &[0xe3],                   // jrcxz
    &[0xe2],                   // loop
    &[0xc7, 0xf8],             // xbegin
    &[0x55],                   // push rbp
    &[0x48, 0x89, 0xe5],       // mov rbp, rsp
    &[0x31, 0xc0],             // xor eax, eax
    &[0xc3],                   // ret
    &[0xcc],                   // int3
    &[0xff, 0x54, 0x24],       // call [rsp+d8]
    &[0xc5, 0xf9, 0x6f, 0x05], // vmovdqa xmm0, [rip+d32]
    &[0x66, 0x0f, 0x1f, 0x44], // nop word [...]
];

fn random_function(rng: &mut Rng) -> Vec<u8> {
    let mut bytes = Vec::new();
    let len = 1 + rng.below(40) as usize;
    while bytes.len() < len {
        if rng.below(3) == 0 {
            bytes.extend_from_slice(SEEDS[rng.below(SEEDS.len() as u64) as usize]);
        } else {
            bytes.push(rng.byte());
        }
    }
    bytes
}

#[test]
fn random_functions_never_break_relocation() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut analyzed, mut relocated, mut out_of_reach) = (0, 0, 0);
    let (mut points, mut leads) = (0, 0);
    for _ in 0..100_000 {
        let bytes = random_function(&mut rng);
        let padding: Vec<u8> = match rng.below(3) {
            0 => vec![0xcc; 8],
            1 => (0..8).map(|_| rng.byte()).collect(),
            _ => vec![],
        };
        let address = 0x7f00_1234_0000 + rng.below(1 << 20);
        let Ok(site) = analyze_entry(&FunctionCode {
            address,
            bytes: &bytes,
            padding: &padding,
        }) else {
            continue;
        };
        analyzed += 1;
        assert!(site.original.len() >= JMP_REL32_LEN);
        assert_eq!(
            site.instructions.iter().map(|i| i.len()).sum::<usize>(),
            site.instructions_len()
        );
        let delta: i64 = match rng.below(4) {
            0 => 0x1000,
            1 => -(1 << 30),
            2 => 1 << 30,
            _ => 1 << 36,
        };
        let new_ip = address.wrapping_add_signed(delta);
        match relocate(&site, new_ip) {
            Ok(r) => {
                relocated += 1;
                assert!(r.bytes.len() <= max_relocated_len(&site));
                check_relocation(&site, &r);
            }
            Err(RelocError::RipRelativeOutOfRange { .. } | RelocError::BranchOutOfRange { .. }) => {
                out_of_reach += 1
            }
            Err(e) => panic!("{e} for {bytes:02x?} at {address:#x}"),
        }
        let snippets = [Snippet::CountCall { offset: 8 }];
        let row = ThreadRow {
            tls_offset: -16,
            register_stub: new_ip + 0x10_0000,
            activity: None,
        };
        if let Ok(t) = build_trampoline(&TrampolineSpec {
            address: new_ip,
            site: &site,
            row,
            snippets: &snippets,
        }) {
            assert!(t.bytes.len() <= max_trampoline_len(&site, &snippets));
        }
        // An instruction point at a random instruction of the function.
        let starts: Vec<u64> = common::decode_all(&bytes, address)
            .iter()
            .filter(|i| i.code() != iced_x86::Code::INVALID)
            .map(|i| i.ip())
            .collect();
        let point = starts[rng.below(starts.len() as u64) as usize];
        let code = FunctionCode {
            address,
            bytes: &bytes,
            padding: &padding,
        };
        if let Ok(site) = analyze_at(&code, point) {
            points += 1;
            leads += usize::from(site.lead > 0);
            assert_eq!(site.point(), point, "{bytes:02x?}");
            assert!(site.patch_address <= point && point < site.end());
            assert!(site.original.len() >= JMP_REL32_LEN);
            let mut at = site.patch_address;
            for i in &site.instructions {
                assert_eq!(i.ip(), at, "contiguous");
                at = i.next_ip();
            }
            if let Ok(t) = build_instruction_trampoline(&TrampolineSpec {
                address: new_ip,
                site: &site,
                row,
                snippets: &snippets,
            }) {
                assert!(t.bytes.len() <= max_trampoline_len(&site, &snippets));
            }
        }
    }
    eprintln!(
        "analyzed {analyzed}, relocated {relocated}, rip-relative out of reach {out_of_reach}; \
         instruction points {points}, {leads} of them with a lead"
    );
    assert!(leads > 100, "points with a lead: {leads} of {points}");
    assert!(
        analyzed > 10_000 && relocated > 8_000,
        "the generator is too weak: {analyzed} {relocated}"
    );
}
