//! Parses the return-slot block's `.eh_frame` back with gimli and evaluates
//! its rules against a fake stack: unwinding through an instrumented frame
//! must yield the original return address and the caller's `rsp`.

use std::collections::HashMap;

use gimli::{
    BaseAddresses, CfaRule, EhFrame, Evaluation, EvaluationResult, LittleEndian, Location,
    RegisterRule, UnwindContext, UnwindSection, Value, X86_64,
};
use weft_codegen::*;

#[test]
fn block_cfi_yields_the_original_return_address() {
    let slots = ReturnSlots::new(1024, 0, 8, None).unwrap();
    let block = 0x7f12_3456_0000u64;
    let bytes = block_eh_frame(block, &slots);
    let eh = EhFrame::new(&bytes, LittleEndian);
    let bases = BaseAddresses::default();
    let mut ctx = UnwindContext::new();

    for k in [0u32, 1, 517, 1023] {
        // The instrumented function returned through slot k: unwinding out of
        // it gave pc = R (the redirected RA) and rsp = its CFA, whose
        // `[rsp - 8]` still holds R. Cell k holds the original RA.
        let r = slots.slot_return_address(block, k);
        let cfa_f = 0x7ffd_0000_1238u64;
        let original_ra = 0x5555_0000_1000 + u64::from(k);
        let memory: HashMap<u64, u64> =
            [(cfa_f - 8, r), (slots.cell_address(block, k), original_ra)].into();

        // Unwinders look up `pc - 1` for a non-signal frame, `pc` for a
        // signal frame: both must find the block's FDE with the same rules.
        for pc in [r - 1, r] {
            let row = eh
                .unwind_info_for_address(&bases, &mut ctx, pc, EhFrame::cie_from_offset)
                .unwrap_or_else(|e| panic!("no CFI for {pc:#x}: {e}"));
            assert_eq!(
                *row.cfa(),
                CfaRule::RegisterAndOffset {
                    register: X86_64::RSP,
                    offset: 8
                }
            );
            // The caller's rsp is the pseudo-frame's rsp, CFA_f, as after `ret`.
            let cfa = cfa_f + 8;
            assert_eq!(row.register(X86_64::RSP), RegisterRule::ValOffset(-8));
            let RegisterRule::ValExpression(expr) = row.register(X86_64::RA) else {
                panic!("RA rule is {:?}", row.register(X86_64::RA));
            };
            let expr = expr.get(&eh).unwrap();
            let mut eval = Evaluation::new(
                expr.0,
                gimli::Encoding {
                    address_size: 8,
                    format: gimli::Format::Dwarf32,
                    version: 4,
                },
            );
            eval.set_initial_value(cfa);
            let mut state = eval.evaluate().unwrap();
            loop {
                state = match state {
                    EvaluationResult::Complete => break,
                    EvaluationResult::RequiresRegister { register, .. } => {
                        assert_eq!(register, X86_64::RSP);
                        eval.resume_with_register(Value::Generic(cfa_f)).unwrap()
                    }
                    EvaluationResult::RequiresMemory { address, size, .. } => {
                        assert_eq!(size, 8);
                        let v = *memory
                            .get(&address)
                            .unwrap_or_else(|| panic!("read of unexpected {address:#x}"));
                        eval.resume_with_memory(Value::Generic(v)).unwrap()
                    }
                    other => panic!("unexpected {other:?}"),
                };
            }
            let pieces = eval.result();
            assert_eq!(pieces.len(), 1);
            let Location::Address { address } = pieces[0].location else {
                panic!("{:?}", pieces[0].location);
            };
            assert_eq!(address, original_ra, "slot {k}");
            // No rule for other registers: unwinders (libgcc) keep their values.
            assert_eq!(row.register(X86_64::RBX), RegisterRule::Undefined);
        }
    }

    // Nothing outside the slots is covered (not the handler pointer).
    let end = block + u64::from(slots.handler_pointer_offset());
    assert!(eh
        .unwind_info_for_address(&bases, &mut ctx, end, EhFrame::cie_from_offset)
        .is_err());
    assert!(eh
        .unwind_info_for_address(&bases, &mut ctx, block - 1, EhFrame::cie_from_offset)
        .is_err());
}
