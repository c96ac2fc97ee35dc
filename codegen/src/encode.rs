//! Small helpers around iced's `Encoder` for straight-line code whose layout
//! we control exactly (trampoline head, slow path, registration stub).

use iced_x86::{Encoder, IcedError, Instruction};

/// Appends instructions one after the other, each encoded at the address it
/// will occupy, so that `rel32` operands come out right.
pub(crate) struct Emitter {
    /// Address of `bytes[0]`.
    base: u64,
    bytes: Vec<u8>,
    encoder: Encoder,
}

impl Emitter {
    /// Starts emitting code meant to live at `base`.
    pub(crate) fn new(base: u64) -> Self {
        Self {
            base,
            bytes: Vec::new(),
            // 64 is always a valid bitness.
            encoder: Encoder::new(64),
        }
    }

    /// Address of the next byte to be emitted.
    pub(crate) fn ip(&self) -> u64 {
        self.base.wrapping_add(self.bytes.len() as u64)
    }

    /// Number of bytes emitted so far.
    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Encodes `instruction` at [`Emitter::ip`].
    pub(crate) fn emit(
        &mut self,
        instruction: Result<Instruction, IcedError>,
    ) -> Result<(), IcedError> {
        let instruction = instruction?;
        let ip = self.ip();
        self.encoder.encode(&instruction, ip)?;
        self.bytes.extend_from_slice(&self.encoder.take_buffer());
        Ok(())
    }

    /// Appends already encoded bytes (e.g. a relocated block) verbatim.
    pub(crate) fn raw(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
    }

    /// Returns the emitted bytes.
    pub(crate) fn finish(self) -> Vec<u8> {
        self.bytes
    }
}
