//! Saving the vector (x87/SSE/AVX...) state around calls into code weft
//! does not control: the registration stub's, a user probe's.

use iced_x86::code_asm::*;

use crate::error::BuildError;

/// How the registration stub saves the vector (x87/SSE/AVX...) state around
/// the runtime's registration function, which may use any of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VectorSave {
    /// `fxsave64`/`fxrstor64`: x87, MMX, SSE and `mxcsr` only (512 bytes). For
    /// CPUs without XSAVE.
    Fxsave64,
    /// `xsave64`/`xrstor64` of the components in `mask` (`edx:eax`),
    /// standard (non-compacted) format.
    Xsave {
        /// Size of the XSAVE area for those components: the end of the
        /// last one (`CPUID.(EAX=0DH,ECX=i)`: offset EBX + size EAX), at
        /// least 576. [`VectorSave::xsave`] computes it.
        area_size: u32,
        /// The requested-feature bitmap (`u64::MAX`: everything XCR0
        /// enables).
        mask: u64,
    },
}

/// XSAVE components the registration stub leaves alone: AMX tile
/// configuration and data (bits 17, 18: 8 KiB of state no code weft runs
/// uses, which would otherwise go on the thread's stack at its first
/// instrumented call).
pub const XSAVE_UNUSED_BY_WEFT: u64 = (1 << 17) | (1 << 18);

impl VectorSave {
    /// XSAVE of the components enabled in `xcr0` except `excluded`, with
    /// `component(i)` = `(size, offset)` of component `i` (`CPUID.(EAX=0DH,
    /// ECX=i)`: EAX, EBX). Components 0 and 1 (x87, SSE) live in the legacy
    /// area; the result's area ends after the last saved component.
    pub fn xsave(xcr0: u64, excluded: u64, component: impl Fn(u32) -> (u32, u32)) -> VectorSave {
        let mask = xcr0 & !excluded;
        let end = (2..64)
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| {
                let (size, offset) = component(i);
                offset.saturating_add(size)
            })
            .max()
            .unwrap_or(0)
            .max(576);
        VectorSave::Xsave {
            area_size: end,
            mask,
        }
    }
}

/// The save-area size for `save`, rounded up to the 64 bytes that XSAVE's
/// alignment requires (so the area keeps `rsp` aligned).
pub(crate) fn area_len(save: VectorSave) -> Result<u32, BuildError> {
    let raw = match save {
        VectorSave::Fxsave64 => 512,
        VectorSave::Xsave { area_size, .. } if area_size < 576 => {
            return Err(BuildError::XsaveAreaTooSmall { area_size });
        }
        VectorSave::Xsave { area_size, .. } => area_size,
    };
    Ok(raw.div_ceil(64) * 64)
}

/// `and rsp, -64 ; sub rsp, area ; zero header ; xsave/fxsave [rsp]`
/// (`rax` and `rdx` free: they are saved).
pub(crate) fn save_vector(a: &mut CodeAssembler, save: VectorSave) -> Result<(), IcedError> {
    let area = area_len(save).unwrap_or(512) as i32;
    a.and(rsp, -64)?;
    a.sub(rsp, area)?;
    match save {
        VectorSave::Fxsave64 => a.fxsave64(ptr(rsp)),
        VectorSave::Xsave { mask, .. } => {
            a.xor(eax, eax)?;
            for i in 0..8 {
                a.mov(qword_ptr(rsp + (512 + 8 * i)), rax)?;
            }
            a.mov(eax, mask as u32)?;
            a.mov(edx, (mask >> 32) as u32)?;
            a.xsave64(ptr(rsp))
        }
    }
}

/// `xrstor/fxrstor [rsp]` (`rax`, `rdx` free); the caller restores `rsp`.
pub(crate) fn restore_vector(a: &mut CodeAssembler, save: VectorSave) -> Result<(), IcedError> {
    match save {
        VectorSave::Fxsave64 => a.fxrstor64(ptr(rsp)),
        VectorSave::Xsave { mask, .. } => {
            a.mov(eax, mask as u32)?;
            a.mov(edx, (mask >> 32) as u32)?;
            a.xrstor64(ptr(rsp))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout of a Sapphire Rapids with AVX-512 and AMX (XCR0 0x602e7):
    /// (size, offset) per component.
    fn spr(i: u32) -> (u32, u32) {
        match i {
            2 => (256, 576),
            5 => (64, 1088),
            6 => (512, 1152),
            7 => (1024, 1664),
            9 => (8, 2688),
            17 => (64, 2752),
            18 => (8192, 2816),
            _ => (0, 0),
        }
    }

    #[test]
    fn xsave_areas_follow_the_components_saved() {
        let all = VectorSave::xsave(0x602e7, 0, spr);
        assert_eq!(
            all,
            VectorSave::Xsave {
                area_size: 11_008,
                mask: 0x602e7
            }
        );
        let weft = VectorSave::xsave(0x602e7, XSAVE_UNUSED_BY_WEFT, spr);
        assert_eq!(
            weft,
            VectorSave::Xsave {
                area_size: 2_696,
                mask: 0x2e7
            }
        );
        // x87 and SSE only: the legacy area and the header.
        assert_eq!(
            VectorSave::xsave(0x3, 0, spr),
            VectorSave::Xsave {
                area_size: 576,
                mask: 0x3
            }
        );
    }
}
