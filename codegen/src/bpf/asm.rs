//! eBPF instructions and a small assembler with labels.
//!
//! The encoding is the kernel's (`Documentation/bpf/standardization/
//! instruction-set.rst`): eight bytes per instruction, `code`, the
//! destination register in the low nibble and the source in the high one,
//! a signed 16-bit offset and a signed 32-bit immediate; `lddw` takes two.
//! Jumps count instructions from the one after the jump.

use thiserror::Error;

/// A register: `R0` return value, `R1`–`R5` arguments (clobbered by calls),
/// `R6`–`R9` kept across calls, `R10` the read-only frame pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reg(u8);

/// Return value of calls and of the program.
pub const R0: Reg = Reg(0);
/// First argument (the context at program start).
pub const R1: Reg = Reg(1);
/// Second argument.
pub const R2: Reg = Reg(2);
/// Third argument.
pub const R3: Reg = Reg(3);
/// Fourth argument.
pub const R4: Reg = Reg(4);
/// Fifth argument.
pub const R5: Reg = Reg(5);
/// Kept across calls.
pub const R6: Reg = Reg(6);
/// Kept across calls.
pub const R7: Reg = Reg(7);
/// Kept across calls.
pub const R8: Reg = Reg(8);
/// Kept across calls.
pub const R9: Reg = Reg(9);
/// The frame pointer (read only): the stack is the 512 bytes below it.
pub const FP: Reg = Reg(10);

/// One instruction slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    /// Opcode: class, size/source and operation.
    pub code: u8,
    /// `dst | src << 4`.
    pub regs: u8,
    /// Signed offset (memory displacement or jump distance).
    pub off: i16,
    /// Signed immediate.
    pub imm: i32,
}

impl Insn {
    /// The eight bytes the kernel reads.
    pub fn to_bytes(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0] = self.code;
        b[1] = self.regs;
        b[2..4].copy_from_slice(&self.off.to_le_bytes());
        b[4..].copy_from_slice(&self.imm.to_le_bytes());
        b
    }
}

/// Access sizes of loads and stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// 4 bytes.
    W = 0x00,
    /// 2 bytes.
    H = 0x08,
    /// 1 byte.
    B = 0x10,
    /// 8 bytes.
    DW = 0x18,
}

/// Arithmetic operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alu {
    /// `+=`
    Add = 0x00,
    /// `-=`
    Sub = 0x10,
    /// `|=`
    Or = 0x40,
    /// `&=`
    And = 0x50,
    /// `<<=`
    Lsh = 0x60,
    /// `>>=` (logical)
    Rsh = 0x70,
    /// `=`
    Mov = 0xb0,
}

/// Jump conditions (unsigned unless said).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cond {
    /// `==`
    Eq = 0x10,
    /// `>`
    Gt = 0x20,
    /// `>=`
    Ge = 0x30,
    /// `!=`
    Ne = 0x50,
    /// `<`
    Lt = 0xa0,
    /// `<=`
    Le = 0xb0,
}

const CLASS_LD: u8 = 0x00;
const CLASS_LDX: u8 = 0x01;
const CLASS_ST: u8 = 0x02;
const CLASS_STX: u8 = 0x03;
const CLASS_ALU: u8 = 0x04;
const CLASS_JMP: u8 = 0x05;
const CLASS_ALU64: u8 = 0x07;
const MODE_IMM: u8 = 0x00;
const MODE_MEM: u8 = 0x60;
const MODE_ATOMIC: u8 = 0xc0;
const SRC_X: u8 = 0x08;
const JMP_JA: u8 = 0x00;
const JMP_CALL: u8 = 0x80;
const JMP_EXIT: u8 = 0x90;
/// `src` of an `lddw` whose immediate is a map's file descriptor.
const PSEUDO_MAP_FD: u8 = 1;
/// `ld_imm64` source: the kernel variable whose vmlinux BTF id is `imm`.
const PSEUDO_BTF_ID: u8 = 3;

/// A place in the program a jump can go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Label(usize);

/// Why a program could not be assembled.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum AsmError {
    /// A jump to a label never placed.
    #[error("BPF assembler: a jump to a label that was never placed (a weft bug)")]
    Unbound,
    /// A jump farther than a 16-bit offset reaches.
    #[error("BPF assembler: a jump of {0} instructions does not fit its 16-bit offset")]
    TooFar(i64),
}

/// Builds a program instruction by instruction.
#[derive(Default)]
pub struct Asm {
    insns: Vec<Insn>,
    labels: Vec<Option<usize>>,
    fixups: Vec<(usize, Label)>,
}

fn regs(dst: Reg, src: Reg) -> u8 {
    dst.0 | (src.0 << 4)
}

impl Asm {
    /// An empty program.
    pub fn new() -> Asm {
        Asm::default()
    }

    fn push(&mut self, code: u8, dst: Reg, src: Reg, off: i16, imm: i32) {
        self.insns.push(Insn {
            code,
            regs: regs(dst, src),
            off,
            imm,
        });
    }

    /// `dst op= imm` on 64 bits.
    pub fn alu_imm(&mut self, op: Alu, dst: Reg, imm: i32) {
        self.push(CLASS_ALU64 | op as u8, dst, R0, 0, imm);
    }

    /// `dst op= src` on 64 bits.
    pub fn alu(&mut self, op: Alu, dst: Reg, src: Reg) {
        self.push(CLASS_ALU64 | op as u8 | SRC_X, dst, src, 0, 0);
    }

    /// `dst = src` on 32 bits (the upper half of `dst` becomes zero).
    pub fn mov32(&mut self, dst: Reg, src: Reg) {
        self.push(CLASS_ALU | Alu::Mov as u8 | SRC_X, dst, src, 0, 0);
    }

    /// `dst = imm` (sign-extended to 64 bits).
    pub fn mov_imm(&mut self, dst: Reg, imm: i32) {
        self.alu_imm(Alu::Mov, dst, imm);
    }

    /// `dst = src`.
    pub fn mov(&mut self, dst: Reg, src: Reg) {
        self.alu(Alu::Mov, dst, src);
    }

    /// `dst = *(size *)(src + off)`, zero-extended.
    pub fn load(&mut self, size: Size, dst: Reg, src: Reg, off: i16) {
        self.push(CLASS_LDX | MODE_MEM | size as u8, dst, src, off, 0);
    }

    /// `*(size *)(dst + off) = src`.
    pub fn store(&mut self, size: Size, dst: Reg, off: i16, src: Reg) {
        self.push(CLASS_STX | MODE_MEM | size as u8, dst, src, off, 0);
    }

    /// `*(size *)(dst + off) = imm`.
    pub fn store_imm(&mut self, size: Size, dst: Reg, off: i16, imm: i32) {
        self.push(CLASS_ST | MODE_MEM | size as u8, dst, R0, off, imm);
    }

    /// `lock *(u64 *)(dst + off) += src`.
    pub fn atomic_add(&mut self, dst: Reg, off: i16, src: Reg) {
        self.push(CLASS_STX | MODE_ATOMIC | Size::DW as u8, dst, src, off, 0);
    }

    /// `dst = the map whose file descriptor is fd` (two slots).
    pub fn load_map(&mut self, dst: Reg, fd: i32) {
        self.push(
            CLASS_LD | MODE_IMM | Size::DW as u8,
            dst,
            Reg(PSEUDO_MAP_FD),
            0,
            fd,
        );
        self.push(0, R0, R0, 0, 0);
    }

    /// `dst =` the address of kernel variable `btf_id` (a `VAR` of the
    /// running kernel's BTF; for a per-CPU one, what `bpf_this_cpu_ptr`
    /// takes). Two slots; the second's `imm` 0 names vmlinux's BTF.
    pub fn load_kernel_var(&mut self, dst: Reg, btf_id: u32) {
        self.push(
            CLASS_LD | MODE_IMM | Size::DW as u8,
            dst,
            Reg(PSEUDO_BTF_ID),
            0,
            btf_id as i32,
        );
        self.push(0, R0, R0, 0, 0);
    }

    /// `dst = imm` for any 64-bit value (two slots).
    pub fn load_imm64(&mut self, dst: Reg, imm: u64) {
        self.push(
            CLASS_LD | MODE_IMM | Size::DW as u8,
            dst,
            R0,
            0,
            imm as u32 as i32,
        );
        self.push(0, R0, R0, 0, (imm >> 32) as u32 as i32);
    }

    /// Calls helper number `helper`; result in `R0`, `R1`–`R5` clobbered.
    pub fn call(&mut self, helper: i32) {
        self.push(CLASS_JMP | JMP_CALL, R0, R0, 0, helper);
    }

    /// Ends the program with `R0` as its value.
    pub fn exit(&mut self) {
        self.push(CLASS_JMP | JMP_EXIT, R0, R0, 0, 0);
    }

    /// A label to place later with [`Asm::bind`].
    pub fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }

    /// Places `label` at the next instruction.
    pub fn bind(&mut self, label: Label) {
        self.labels[label.0] = Some(self.insns.len());
    }

    fn jump(&mut self, code: u8, dst: Reg, src: Reg, imm: i32, to: Label) {
        self.fixups.push((self.insns.len(), to));
        self.push(code, dst, src, 0, imm);
    }

    /// `if reg cond imm goto to` (64-bit compare, `imm` sign-extended).
    pub fn jump_imm(&mut self, cond: Cond, reg: Reg, imm: i32, to: Label) {
        self.jump(CLASS_JMP | cond as u8, reg, R0, imm, to);
    }

    /// `if a cond b goto to` (64-bit compare).
    pub fn jump_reg(&mut self, cond: Cond, a: Reg, b: Reg, to: Label) {
        self.jump(CLASS_JMP | cond as u8 | SRC_X, a, b, 0, to);
    }

    /// `goto to`.
    pub fn goto(&mut self, to: Label) {
        self.jump(CLASS_JMP | JMP_JA, R0, R0, 0, to);
    }

    /// The program, every jump resolved.
    pub fn finish(mut self) -> Result<Vec<Insn>, AsmError> {
        for &(at, label) in &self.fixups {
            let target = self.labels[label.0].ok_or(AsmError::Unbound)?;
            let distance = target as i64 - at as i64 - 1;
            self.insns[at].off = i16::try_from(distance).map_err(|_| AsmError::TooFar(distance))?;
        }
        Ok(self.insns)
    }
}

/// The kernel helpers weft's programs call (`enum bpf_func_id`).
pub mod helper {
    /// `void *bpf_map_lookup_elem(map, key)`.
    pub const MAP_LOOKUP_ELEM: i32 = 1;
    /// `long bpf_map_update_elem(map, key, value, flags)`.
    pub const MAP_UPDATE_ELEM: i32 = 2;
    /// `u64 bpf_ktime_get_ns(void)`: `CLOCK_MONOTONIC`.
    pub const KTIME_GET_NS: i32 = 5;
    /// `u64 bpf_get_current_pid_tgid(void)`: `tgid << 32 | tid`.
    pub const GET_CURRENT_PID_TGID: i32 = 14;
    /// `u64 bpf_get_current_task(void)`: the running `task_struct`.
    pub const GET_CURRENT_TASK: i32 = 35;
    /// `long bpf_probe_read_user(dst, size, user_ptr)`.
    pub const PROBE_READ_USER: i32 = 112;
    /// `long bpf_probe_read_kernel(dst, size, kernel_ptr)`.
    pub const PROBE_READ_KERNEL: i32 = 113;
    /// `void *bpf_this_cpu_ptr(percpu_var)`: this CPU's instance.
    pub const THIS_CPU_PTR: i32 = 154;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_as_the_kernel_documents() {
        let mut a = Asm::new();
        a.mov_imm(R0, 0);
        a.load(Size::DW, R1, R6, 8);
        a.store_imm(Size::W, FP, -4, -1);
        a.atomic_add(R0, 16, R1);
        a.load_map(R1, 7);
        a.call(helper::MAP_LOOKUP_ELEM);
        a.exit();
        let p = a.finish().unwrap();
        let bytes: Vec<[u8; 8]> = p.iter().map(|i| i.to_bytes()).collect();
        // r0 = 0
        assert_eq!(bytes[0], [0xb7, 0x00, 0, 0, 0, 0, 0, 0]);
        // r1 = *(u64 *)(r6 + 8)
        assert_eq!(bytes[1], [0x79, 0x61, 8, 0, 0, 0, 0, 0]);
        // *(u32 *)(r10 - 4) = -1
        assert_eq!(bytes[2], [0x62, 0x0a, 0xfc, 0xff, 0xff, 0xff, 0xff, 0xff]);
        // lock *(u64 *)(r0 + 16) += r1
        assert_eq!(bytes[3], [0xdb, 0x10, 16, 0, 0, 0, 0, 0]);
        // r1 = map fd 7 (two slots)
        assert_eq!(bytes[4], [0x18, 0x11, 0, 0, 7, 0, 0, 0]);
        assert_eq!(bytes[5], [0; 8]);
        assert_eq!(bytes[6], [0x85, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(bytes[7], [0x95, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn jumps_count_from_the_next_instruction() {
        let mut a = Asm::new();
        let out = a.label();
        let back = a.label();
        a.bind(back);
        a.jump_imm(Cond::Ne, R0, 3, out); // 0
        a.mov_imm(R0, 1); // 1
        a.goto(back); // 2
        a.bind(out);
        a.exit(); // 3
        let p = a.finish().unwrap();
        assert_eq!(p[0].off, 2);
        assert_eq!(p[0].code, 0x55);
        assert_eq!(p[2].off, -3);
    }

    #[test]
    fn an_unplaced_label_is_an_error() {
        let mut a = Asm::new();
        let nowhere = a.label();
        a.goto(nowhere);
        assert_eq!(a.finish(), Err(AsmError::Unbound));
    }
}
