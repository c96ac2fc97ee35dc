//! The `sched_switch` program behind the threads' CPU clocks: when a
//! thread of the target comes on a CPU, it writes into the thread's slot
//! of the CPU-time table (`weft_abi::clock::table`) the thread's time on a
//! CPU so far and the moment, and bumps the slot's switch count. The
//! thread reads its slot from user space: while the count has not moved,
//! it has run without a break since that moment.
//!
//! It runs for every switch of the machine, so a switch to another
//! process's thread costs three reads of `next` and a compare.

use weft_abi::clock::table;

use super::asm::{helper, Alu, Asm, AsmError, Cond, Insn, Size, FP, R0, R1, R2, R3, R7, R8, R9};

/// What the program is built from.
#[derive(Clone, Copy, Debug)]
pub struct CpuTableProgram {
    /// The target process.
    pub tgid: u32,
    /// Index of `next` among the raw tracepoint's arguments.
    pub next_arg: u32,
    /// Offset of `pid` (the thread id) in `task_struct`.
    pub task_pid: u32,
    /// Offset of `tgid` in `task_struct`.
    pub task_tgid: u32,
    /// Offset of `se.sum_exec_runtime` in `task_struct`.
    pub task_sum_exec: u32,
    /// File descriptor of the table (an array of `table::SLOTS` values of
    /// `table::SLOT_SIZE` bytes).
    pub table: i32,
    /// A `tp_btf` program, whose `next` is a pointer the verifier knows
    /// the type of: its fields are plain loads. Otherwise (a raw
    /// tracepoint) each is a `bpf_probe_read_kernel` call.
    pub typed: bool,
}

const READ: i16 = -8;
const SUM: i16 = -16;
const KEY: i16 = -24;

fn offset(value: u32) -> i32 {
    // Kernel structure offsets are a few KiB; a BTF claiming more than
    // 2 GiB is corrupt, and the read then fails harmlessly.
    i32::try_from(value).unwrap_or(i32::MAX)
}

/// `[FP + at]` = `size` bytes of the kernel's at `R8 + off`, or `goto
/// fail`. Clobbers `R0`–`R5`.
fn read_next(
    a: &mut Asm,
    p: &CpuTableProgram,
    off: u32,
    at: i16,
    size: i32,
    fail: super::asm::Label,
) {
    if p.typed {
        let size = if size == 8 { Size::DW } else { Size::W };
        a.load(size, R1, R8, i16::try_from(off).unwrap_or(i16::MAX));
        a.store(size, FP, at, R1);
        return;
    }
    a.mov(R3, R8);
    a.alu_imm(Alu::Add, R3, offset(off));
    a.mov(R1, FP);
    a.alu_imm(Alu::Add, R1, i32::from(at));
    a.mov_imm(R2, size);
    a.call(helper::PROBE_READ_KERNEL);
    a.jump_imm(Cond::Ne, R0, 0, fail);
}

/// The raw `sched_switch(preempt, prev, next, …)` program.
pub fn cpu_table_program(p: &CpuTableProgram) -> Result<Vec<Insn>, AsmError> {
    let mut a = Asm::new();
    let found = a.label();
    let out = a.label();
    let arg = i16::try_from(8 * p.next_arg).unwrap_or(i16::MAX);
    a.load(Size::DW, R8, R1, arg);
    read_next(&mut a, p, p.task_tgid, READ, 4, out);
    a.load(Size::W, R1, FP, READ);
    a.jump_imm(Cond::Ne, R1, p.tgid as i32, out);
    read_next(&mut a, p, p.task_pid, READ, 4, out);
    a.load(Size::W, R7, FP, READ);
    read_next(&mut a, p, p.task_sum_exec, SUM, 8, out);
    a.call(helper::KTIME_GET_NS);
    a.mov(R9, R0);
    // Open addressing, unrolled: the verifier sees a straight line.
    for i in 0..table::PROBES {
        a.mov(R1, R7);
        a.alu_imm(Alu::Add, R1, i as i32);
        a.alu_imm(Alu::And, R1, (table::SLOTS - 1) as i32);
        a.store(Size::W, FP, KEY, R1);
        a.load_map(R1, p.table);
        a.mov(R2, FP);
        a.alu_imm(Alu::Add, R2, i32::from(KEY));
        a.call(helper::MAP_LOOKUP_ELEM);
        a.jump_imm(Cond::Eq, R0, 0, out);
        a.load(Size::W, R1, R0, table::TID as i16);
        a.jump_reg(Cond::Eq, R1, R7, found);
        a.jump_imm(Cond::Eq, R1, table::FREE as i32, out);
    }
    a.goto(out);
    a.bind(found);
    a.load(Size::DW, R1, FP, SUM);
    a.store(Size::DW, R0, table::SUM as i16, R1);
    a.store(Size::DW, R0, table::SWITCHED_IN as i16, R9);
    a.load(Size::W, R1, R0, table::SEQ as i16);
    a.alu_imm(Alu::Add, R1, 2);
    a.store(Size::W, R0, table::SEQ as i16, R1);
    a.bind(out);
    a.mov_imm(R0, 0);
    a.exit();
    a.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(typed: bool) -> Vec<Insn> {
        cpu_table_program(&CpuTableProgram {
            tgid: 42,
            next_arg: 2,
            task_pid: 0x900,
            task_tgid: 0x904,
            task_sum_exec: 0x180,
            table: 7,
            typed,
        })
        .unwrap()
    }

    /// Typed, the fields of `next` are loads from it, and no helper but
    /// the clock's and the lookups' is called.
    #[test]
    fn a_typed_program_loads_the_fields_itself() {
        let p = program(true);
        assert!(p.iter().any(|i| i.code == 0x61 && i.off == 0x904));
        assert!(p.iter().any(|i| i.code == 0x79 && i.off == 0x180));
        assert!(!p
            .iter()
            .any(|i| i.code == 0x85 && i.imm == helper::PROBE_READ_KERNEL));
        let compare = p
            .iter()
            .position(|i| i.code == 0x55 && i.imm == 42)
            .unwrap();
        assert!(compare < 5);
    }

    /// `next` comes from the third argument, the process is compared
    /// before anything else is read, and every probe of the slots is
    /// there, each masked into the table.
    #[test]
    fn reads_next_compares_the_process_and_probes_every_slot() {
        let p = program(false);
        assert_eq!((p[0].code, p[0].off), (0x79, 16));
        let first_call = p.iter().position(|i| i.code == 0x85).unwrap();
        assert_eq!(p[first_call].imm, helper::PROBE_READ_KERNEL);
        let compare = p
            .iter()
            .position(|i| i.code == 0x55 && i.imm == 42)
            .unwrap();
        assert!(compare < first_call + 4);
        let lookups = p
            .iter()
            .filter(|i| i.code == 0x85 && i.imm == helper::MAP_LOOKUP_ELEM)
            .count();
        assert_eq!(lookups, table::PROBES as usize);
        let masks = p
            .iter()
            .filter(|i| i.code == 0x57 && i.imm == (table::SLOTS - 1) as i32)
            .count();
        assert_eq!(masks, table::PROBES as usize);
        assert_eq!(p.last().unwrap().code, 0x95);
    }
}
