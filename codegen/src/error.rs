//! Why generated code could not be built.

use iced_x86::IcedError;

use crate::relocate::RelocError;
use crate::OutOfRange;

/// Why a trampoline or stub could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The displaced instructions cannot be relocated into the trampoline.
    #[error(transparent)]
    Relocate(#[from] RelocError),
    /// The trampoline cannot call the registration stub with `call rel32`.
    #[error(
        "the trampoline at {trampoline:#x} cannot call the registration stub at {stub:#x}: {source}"
    )]
    StubOutOfReach {
        /// Address of the trampoline.
        trampoline: u64,
        /// Address of the registration stub.
        stub: u64,
        /// The failed `call rel32`.
        source: OutOfRange,
    },
    /// The XSAVE area size is smaller than the architectural minimum.
    #[error(
        "an XSAVE area of {area_size} bytes is too small: it must hold at least the 512-byte \
         legacy region and the 64-byte header (576 bytes; use CPUID leaf 0xd for the real size)"
    )]
    XsaveAreaTooSmall {
        /// The size given.
        area_size: u32,
    },
    /// A probe's constraint cannot be tested (see [`Inside`](crate::Inside)).
    #[error("a probe's constraint cannot be built: {0}")]
    Constraint(String),
    /// The encoder rejected generated code; this is a bug in weft.
    #[error("internal error: cannot encode generated code: {0}")]
    Encode(String),
}

impl From<IcedError> for BuildError {
    fn from(e: IcedError) -> Self {
        BuildError::Encode(e.to_string())
    }
}
