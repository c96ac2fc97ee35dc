//! Facts about the CPU weft runs on (which is the target's: weft runs on
//! the target's machine). A leaf: the modules that write code for the
//! target (`trampolines`, `ptrace::remote`) read it, it reads none of them.

use weft_codegen::VectorSave;

/// How the registration stub saves vector state on this machine (weft
/// runs on the target's machine, so the host's CPUID is the target's).
pub(crate) fn vector_save() -> VectorSave {
    // SAFETY: CPUID is available on every x86-64 CPU.
    let leaf1 = core::arch::x86_64::__cpuid(1);
    let xsave = leaf1.ecx & (1 << 26) != 0 && leaf1.ecx & (1 << 27) != 0;
    if !xsave {
        return VectorSave::Fxsave64;
    }
    let xcr0: u64;
    // SAFETY: OSXSAVE is set (checked above), so xgetbv(0) reads XCR0 and
    // touches nothing else.
    unsafe {
        let (lo, hi): (u32, u32);
        core::arch::asm!("xgetbv", in("ecx") 0, out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags));
        xcr0 = (u64::from(hi) << 32) | u64::from(lo);
    }
    // Leaf 0xD sub-leaf i: EAX = size, EBX = offset of component i. The
    // AMX tiles are left out: 8 KiB on the thread's stack for state the
    // runtime never touches.
    VectorSave::xsave(xcr0, weft_codegen::XSAVE_UNUSED_BY_WEFT, |i| {
        let leaf = core::arch::x86_64::__cpuid_count(0xd, i);
        (leaf.eax, leaf.ebx)
    })
}
