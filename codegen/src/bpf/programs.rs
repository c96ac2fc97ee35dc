//! The eBPF programs behind kernel probes: per-thread calls, wall and CPU
//! time of a kernel function or system call, for one process's threads,
//! split by the user function each thread was innermost in.
//!
//! Every program first compares the running thread's tgid with the
//! target's and returns at once for any other process: a tracepoint puts
//! every thread of the machine through it, so that path is three
//! instructions and one helper call.
//!
//! State lives in hash maps keyed by thread id (portable back to kernels
//! without task storage):
//! - the thread's CPU clock ([`clock`]): time on a CPU so far, and since
//!   when it has been on one, kept by the `sched_switch` program;
//! - the open activation per thread and probe ([`open`]): entry time and
//!   CPU clock, nesting depth, the attribution; one slot per thread for
//!   all system calls, which do not nest;
//! - the totals per (thread, probe, user function) ([`stats`]).
//!
//! Entries take their clocks after their own bookkeeping and exits before
//! theirs, so an activation's time holds as little of the probe as it can.

use super::asm::{
    helper, Alu, Asm, AsmError, Cond, Insn, Size, FP, R0, R1, R2, R3, R4, R6, R7, R8, R9,
};

/// The per-thread CPU clock map's value (key: the thread id, u32).
pub mod clock {
    /// Nanoseconds on a CPU before the current stint.
    pub const ON_CPU: i16 = 0;
    /// `bpf_ktime_get_ns` when the thread last went on a CPU; 0 while off.
    pub const SWITCHED_IN: i16 = 8;
    /// Value size.
    pub const SIZE: u32 = 16;
}

/// The open-activation map (key: thread id u32, slot u32).
pub mod open {
    /// Key size.
    pub const KEY_SIZE: u32 = 8;
    /// Wall clock at entry.
    pub const T0: i16 = 0;
    /// The thread's CPU clock at entry.
    pub const C0: i16 = 8;
    /// Open activations of the probe in the thread (recursion).
    pub const DEPTH: i16 = 16;
    /// The attribution (u32): the row offset of the innermost instrumented
    /// user function's metric words, 0 for none.
    pub const ATTR: i16 = 24;
    /// The probe (u32).
    pub const PROBE: i16 = 28;
    /// Value size.
    pub const SIZE: u32 = 32;
}

/// The totals map: key (thread id, probe, attribution, 0) as u32s.
pub mod stats {
    /// Key size.
    pub const KEY_SIZE: u32 = 16;
    /// Calls (entries).
    pub const CALLS: i16 = 0;
    /// Inclusive wall time, ns, of the outermost activations.
    pub const WALL: i16 = 8;
    /// Time on a CPU inside, ns.
    pub const CPU: i16 = 16;
    /// Value size (the last word is padding).
    pub const SIZE: u32 = 32;
}

/// The open-map slot all system calls of a thread share.
pub const SYSCALL_SLOT: u32 = u32::MAX;
/// Entries of the map of traced system calls (indexed by number; the value
/// is `probe + 1`, 0 for not traced).
pub const MAX_SYSCALLS: u32 = 512;

/// File descriptors of the maps the programs share.
#[derive(Clone, Copy, Debug)]
pub struct Maps {
    /// The CPU clock per thread ([`clock`]).
    pub clocks: i32,
    /// Open activations ([`open`]).
    pub open: i32,
    /// Totals ([`stats`]).
    pub stats: i32,
    /// A one-entry array counting updates the full totals map refused.
    pub lost: i32,
}

/// How an entry finds the user function its thread is in: the thread
/// pointer from the task, the runtime's row pointer at a fixed offset from
/// it, the innermost activation cell below the row's `top`.
#[derive(Clone, Copy, Debug)]
pub struct Attribution {
    /// Offset of `thread.fsbase` in `struct task_struct` (from BTF).
    pub task_fsbase: u32,
    /// The runtime's thread-local row pointer, from the thread pointer.
    pub tls_offset: i32,
    /// Offset in a row of its first cell pointer (`top` follows).
    pub row_cells: i16,
    /// Offset of a cell's metric base from the cell's end.
    pub cell_metric_from_end: i16,
}

/// Where the time a hypervisor stole from each CPU is: the per-CPU
/// `struct kvm_steal_time` of a KVM guest (`steal_time`), whose `steal`
/// counter (ns) the host advances before the vCPU runs again. A kernel
/// built with `CONFIG_PARAVIRT_TIME_ACCOUNTING` leaves that time out of its
/// threads' CPU time; the programs then leave it out too: their CPU clock
/// is `bpf_ktime_get_ns` less this CPU's steal counter, a difference taken
/// only between two readings on the same CPU (a stint on a CPU, or one
/// program's run: tracepoint, kprobe and trampoline programs do not
/// migrate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Steal {
    /// BTF id of the per-CPU variable.
    pub var: u32,
    /// Offset of the `u64` counter in it.
    pub offset: u32,
}

/// What starts an activation.
#[derive(Clone, Copy, Debug)]
pub enum Trigger {
    /// A kernel function's entry or an instruction in it: this probe.
    Probe(u32),
    /// `sys_enter`: the system calls the array map (fd) marks.
    Syscalls {
        /// Array map fd, [`MAX_SYSCALLS`] u32s.
        wanted: i32,
    },
}

/// An entry program.
#[derive(Clone, Copy, Debug)]
pub struct EntryProgram {
    /// The target's process id.
    pub tgid: u32,
    /// Function or system calls.
    pub trigger: Trigger,
    /// Opens an activation for an exit program to close (else counts only).
    pub timed: bool,
    /// Splits the figures by user function.
    pub attribution: Option<Attribution>,
    /// The shared maps.
    pub maps: Maps,
    /// Stolen time left out of CPU time (as the `sched_switch` program's).
    pub steal: Option<Steal>,
}

/// An exit program.
#[derive(Clone, Copy, Debug)]
pub struct ExitProgram {
    /// The target's process id.
    pub tgid: u32,
    /// Which open slot it closes: a probe's, or the system-call slot.
    pub slot: Option<u32>,
    /// The shared maps.
    pub maps: Maps,
    /// Stolen time left out of CPU time (as the `sched_switch` program's).
    pub steal: Option<Steal>,
}

/// The `sched_switch` program that keeps the threads' CPU clocks.
#[derive(Clone, Copy, Debug)]
pub struct SwitchProgram {
    /// The target's process id.
    pub tgid: u32,
    /// Index of `next` among the raw tracepoint's arguments.
    pub next_arg: u32,
    /// Offset of `pid` (the thread id) in `struct task_struct`.
    pub task_pid: u32,
    /// Offset of `tgid` in `struct task_struct`.
    pub task_tgid: u32,
    /// The CPU clock map.
    pub clocks: i32,
    /// Stolen time left out of CPU time.
    pub steal: Option<Steal>,
}

// The stack frame (offsets from the frame pointer).
const CPU: i16 = -16;
const ATTR: i16 = -24;
const CLOCK_KEY: i16 = -32;
const CLOCK_VALUE: i16 = -48;
const STATS_KEY: i16 = -64;
const STATS_ZERO: i16 = -96;
const OPEN_KEY: i16 = -104;
const OPEN_VALUE: i16 = -136;
const READ_PAIR: i16 = -152;
const READ_ONE: i16 = -160;
const LOST_KEY: i16 = -168;
/// The CPU clock's "now": `bpf_ktime_get_ns` less this CPU's stolen time.
const CPU_NOW: i16 = -176;

const BPF_ANY: i32 = 0;
const BPF_NOEXIST: i32 = 1;

fn offset(value: u32) -> i32 {
    // Kernel structure offsets are a few KiB; a BTF claiming more than
    // 2 GiB is corrupt, and the read then fails harmlessly.
    i32::try_from(value).unwrap_or(i32::MAX)
}

/// `R7 = tid` if the running thread belongs to `tgid`, else `goto out`.
fn only_target(a: &mut Asm, tgid: u32, out: super::asm::Label) {
    a.call(helper::GET_CURRENT_PID_TGID);
    a.mov(R7, R0);
    a.alu_imm(Alu::Rsh, R0, 32);
    a.jump_imm(Cond::Ne, R0, tgid as i32, out);
    a.mov32(R7, R7);
}

/// `R2 = FP + off`.
fn stack_pointer(a: &mut Asm, reg: super::asm::Reg, off: i16) {
    a.mov(reg, FP);
    a.alu_imm(Alu::Add, reg, i32::from(off));
}

/// `[FP + READ_ONE]` = the kernel's 8 bytes at `R0 + off`, or `goto
/// fail` when they cannot be read. Clobbers `R0`–`R5`.
fn read_kernel_word(a: &mut Asm, off: i32, fail: super::asm::Label) {
    a.mov(R3, R0);
    a.alu_imm(Alu::Add, R3, off);
    stack_pointer(a, R1, READ_ONE);
    a.mov_imm(R2, 8);
    a.call(helper::PROBE_READ_KERNEL);
    a.jump_imm(Cond::Ne, R0, 0, fail);
}

/// `[FP + CPU_NOW]` = `R9` (a `bpf_ktime_get_ns` reading) less the time
/// the hypervisor has stolen from this CPU, or `R9` itself without
/// `steal` (or if the counter cannot be read). Clobbers `R0`–`R5`.
fn cpu_now(a: &mut Asm, steal: Option<Steal>) {
    a.store(Size::DW, FP, CPU_NOW, R9);
    let Some(steal) = steal else { return };
    let done = a.label();
    a.load_kernel_var(R1, steal.var);
    a.call(helper::THIS_CPU_PTR);
    read_kernel_word(a, offset(steal.offset), done);
    a.mov(R1, R9);
    a.load(Size::DW, R2, FP, READ_ONE);
    a.alu(Alu::Sub, R1, R2);
    a.store(Size::DW, FP, CPU_NOW, R1);
    a.bind(done);
}

/// The running thread's CPU clock at `[FP + CPU_NOW]` ([`cpu_now`]) into
/// `[FP + CPU]`; `R7` is its id. A thread seen first is on a CPU now (this
/// program runs on it). Never less than the thread's time on a CPU up to
/// its last switch out.
fn cpu_clock(a: &mut Asm, clocks: i32) {
    let have = a.label();
    let store = a.label();
    let done = a.label();
    a.store(Size::W, FP, CLOCK_KEY, R7);
    a.store_imm(Size::W, FP, CLOCK_KEY + 4, 0);
    a.load_map(R1, clocks);
    stack_pointer(a, R2, CLOCK_KEY);
    a.call(helper::MAP_LOOKUP_ELEM);
    a.jump_imm(Cond::Ne, R0, 0, have);
    a.store_imm(Size::DW, FP, CLOCK_VALUE + clock::ON_CPU, 0);
    a.load(Size::DW, R4, FP, CPU_NOW);
    a.store(Size::DW, FP, CLOCK_VALUE + clock::SWITCHED_IN, R4);
    a.load_map(R1, clocks);
    stack_pointer(a, R2, CLOCK_KEY);
    stack_pointer(a, R3, CLOCK_VALUE);
    a.mov_imm(R4, BPF_NOEXIST);
    a.call(helper::MAP_UPDATE_ELEM);
    a.store_imm(Size::DW, FP, CPU, 0);
    a.goto(done);
    a.bind(have);
    a.load(Size::DW, R1, R0, clock::ON_CPU);
    a.load(Size::DW, R2, R0, clock::SWITCHED_IN);
    a.jump_imm(Cond::Eq, R2, 0, store);
    a.load(Size::DW, R4, FP, CPU_NOW);
    // A program runs preemptibly: switched out after taking `now` and back
    // since, the thread's stint started after `now`, and `ON_CPU` already
    // holds its time up to the switch.
    a.jump_reg(Cond::Gt, R2, R4, store);
    a.mov(R3, R4);
    a.alu(Alu::Sub, R3, R2);
    a.alu(Alu::Add, R1, R3);
    a.bind(store);
    a.store(Size::DW, FP, CPU, R1);
    a.bind(done);
}

/// `R0 =` the totals of the key at `[FP + STATS_KEY]`, created zero if
/// new; on a full map counts the loss and goes to `out`.
fn totals(a: &mut Asm, maps: &Maps, out: super::asm::Label) {
    let got = a.label();
    a.load_map(R1, maps.stats);
    stack_pointer(a, R2, STATS_KEY);
    a.call(helper::MAP_LOOKUP_ELEM);
    a.jump_imm(Cond::Ne, R0, 0, got);
    for word in 0..4 {
        a.store_imm(Size::DW, FP, STATS_ZERO + 8 * word, 0);
    }
    a.load_map(R1, maps.stats);
    stack_pointer(a, R2, STATS_KEY);
    stack_pointer(a, R3, STATS_ZERO);
    a.mov_imm(R4, BPF_NOEXIST);
    a.call(helper::MAP_UPDATE_ELEM);
    a.load_map(R1, maps.stats);
    stack_pointer(a, R2, STATS_KEY);
    a.call(helper::MAP_LOOKUP_ELEM);
    a.jump_imm(Cond::Ne, R0, 0, got);
    // Full: say so rather than lose the call silently.
    a.store_imm(Size::W, FP, LOST_KEY, 0);
    a.load_map(R1, maps.lost);
    stack_pointer(a, R2, LOST_KEY);
    a.call(helper::MAP_LOOKUP_ELEM);
    a.jump_imm(Cond::Eq, R0, 0, out);
    a.mov_imm(R1, 1);
    a.atomic_add(R0, 0, R1);
    a.goto(out);
    a.bind(got);
}

/// `[FP + ATTR]` = the row offset of the metric words of the innermost
/// open activation of the running thread's user code, or 0.
fn attribution(a: &mut Asm, at: &Attribution) {
    let done = a.label();
    a.store_imm(Size::DW, FP, ATTR, 0);
    a.call(helper::GET_CURRENT_TASK);
    read_kernel_word(a, offset(at.task_fsbase), done);
    // The row pointer, in the thread's static TLS.
    a.load(Size::DW, R3, FP, READ_ONE);
    a.jump_imm(Cond::Eq, R3, 0, done);
    a.alu_imm(Alu::Add, R3, at.tls_offset);
    stack_pointer(a, R1, READ_ONE);
    a.mov_imm(R2, 8);
    a.call(helper::PROBE_READ_USER);
    a.jump_imm(Cond::Ne, R0, 0, done);
    // The row's cells and top.
    a.load(Size::DW, R3, FP, READ_ONE);
    a.jump_imm(Cond::Eq, R3, 0, done);
    a.alu_imm(Alu::Add, R3, i32::from(at.row_cells));
    stack_pointer(a, R1, READ_PAIR);
    a.mov_imm(R2, 16);
    a.call(helper::PROBE_READ_USER);
    a.jump_imm(Cond::Ne, R0, 0, done);
    a.load(Size::DW, R1, FP, READ_PAIR);
    a.load(Size::DW, R3, FP, READ_PAIR + 8);
    a.jump_reg(Cond::Le, R3, R1, done);
    // The innermost cell's metric base.
    a.alu_imm(Alu::Add, R3, i32::from(at.cell_metric_from_end));
    stack_pointer(a, R1, READ_ONE);
    a.mov_imm(R2, 4);
    a.call(helper::PROBE_READ_USER);
    a.jump_imm(Cond::Ne, R0, 0, done);
    a.load(Size::W, R1, FP, READ_ONE);
    a.store(Size::DW, FP, ATTR, R1);
    a.bind(done);
}

/// A kernel function's (or a traced system call's) entry: counts the call
/// for (thread, probe, user function) and, when timed, opens the thread's
/// activation (only the outermost of a recursion is timed; a system call
/// replaces any activation left open by one that never returned).
pub fn entry_program(p: &EntryProgram) -> Result<Vec<Insn>, AsmError> {
    let mut a = Asm::new();
    let out = a.label();
    a.mov(R6, R1);
    only_target(&mut a, p.tgid, out);
    match p.trigger {
        Trigger::Probe(probe) => a.mov_imm(R8, probe as i32),
        Trigger::Syscalls { wanted } => {
            // raw_syscalls:sys_enter(regs, id)
            a.load(Size::DW, R1, R6, 8);
            a.jump_imm(Cond::Ge, R1, MAX_SYSCALLS as i32, out);
            a.store(Size::W, FP, READ_ONE, R1);
            a.load_map(R1, wanted);
            stack_pointer(&mut a, R2, READ_ONE);
            a.call(helper::MAP_LOOKUP_ELEM);
            a.jump_imm(Cond::Eq, R0, 0, out);
            a.load(Size::W, R8, R0, 0);
            a.jump_imm(Cond::Eq, R8, 0, out);
            a.alu_imm(Alu::Sub, R8, 1);
        }
    }
    match &p.attribution {
        Some(at) => attribution(&mut a, at),
        None => a.store_imm(Size::DW, FP, ATTR, 0),
    }
    a.store(Size::W, FP, STATS_KEY, R7);
    a.store(Size::W, FP, STATS_KEY + 4, R8);
    a.load(Size::DW, R1, FP, ATTR);
    a.store(Size::W, FP, STATS_KEY + 8, R1);
    a.store_imm(Size::W, FP, STATS_KEY + 12, 0);
    totals(&mut a, &p.maps, out);
    a.load(Size::DW, R1, R0, stats::CALLS);
    a.alu_imm(Alu::Add, R1, 1);
    a.store(Size::DW, R0, stats::CALLS, R1);
    if p.timed {
        let fresh = a.label();
        a.store(Size::W, FP, OPEN_KEY, R7);
        match p.trigger {
            Trigger::Probe(_) => {
                a.store(Size::W, FP, OPEN_KEY + 4, R8);
                a.load_map(R1, p.maps.open);
                stack_pointer(&mut a, R2, OPEN_KEY);
                a.call(helper::MAP_LOOKUP_ELEM);
                a.jump_imm(Cond::Eq, R0, 0, fresh);
                a.load(Size::DW, R1, R0, open::DEPTH);
                a.jump_imm(Cond::Eq, R1, 0, fresh);
                a.alu_imm(Alu::Add, R1, 1);
                a.store(Size::DW, R0, open::DEPTH, R1);
                a.goto(out);
            }
            Trigger::Syscalls { .. } => {
                a.store_imm(Size::W, FP, OPEN_KEY + 4, SYSCALL_SLOT as i32);
            }
        }
        a.bind(fresh);
        a.call(helper::KTIME_GET_NS);
        a.mov(R9, R0);
        cpu_now(&mut a, p.steal);
        cpu_clock(&mut a, p.maps.clocks);
        a.store(Size::DW, FP, OPEN_VALUE + open::T0, R9);
        a.load(Size::DW, R1, FP, CPU);
        a.store(Size::DW, FP, OPEN_VALUE + open::C0, R1);
        a.store_imm(Size::DW, FP, OPEN_VALUE + open::DEPTH, 1);
        a.load(Size::DW, R1, FP, ATTR);
        a.store(Size::W, FP, OPEN_VALUE + open::ATTR, R1);
        a.store(Size::W, FP, OPEN_VALUE + open::PROBE, R8);
        a.load_map(R1, p.maps.open);
        stack_pointer(&mut a, R2, OPEN_KEY);
        stack_pointer(&mut a, R3, OPEN_VALUE);
        a.mov_imm(R4, BPF_ANY);
        a.call(helper::MAP_UPDATE_ELEM);
    }
    a.bind(out);
    a.mov_imm(R0, 0);
    a.exit();
    a.finish()
}

/// A kernel function's return (or `sys_exit`): closes the thread's
/// outermost activation and adds its wall and CPU time to the totals of
/// the user function it was attributed to at entry.
pub fn exit_program(p: &ExitProgram) -> Result<Vec<Insn>, AsmError> {
    let mut a = Asm::new();
    let out = a.label();
    only_target(&mut a, p.tgid, out);
    a.call(helper::KTIME_GET_NS);
    a.mov(R9, R0);
    a.store(Size::W, FP, OPEN_KEY, R7);
    a.store_imm(
        Size::W,
        FP,
        OPEN_KEY + 4,
        p.slot.unwrap_or(SYSCALL_SLOT) as i32,
    );
    a.load_map(R1, p.maps.open);
    stack_pointer(&mut a, R2, OPEN_KEY);
    a.call(helper::MAP_LOOKUP_ELEM);
    a.jump_imm(Cond::Eq, R0, 0, out);
    a.mov(R6, R0);
    a.load(Size::DW, R1, R6, open::DEPTH);
    a.jump_imm(Cond::Eq, R1, 0, out);
    a.alu_imm(Alu::Sub, R1, 1);
    a.store(Size::DW, R6, open::DEPTH, R1);
    a.jump_imm(Cond::Ne, R1, 0, out);
    cpu_now(&mut a, p.steal);
    cpu_clock(&mut a, p.maps.clocks);
    a.store(Size::W, FP, STATS_KEY, R7);
    a.load(Size::W, R1, R6, open::PROBE);
    a.store(Size::W, FP, STATS_KEY + 4, R1);
    a.load(Size::W, R1, R6, open::ATTR);
    a.store(Size::W, FP, STATS_KEY + 8, R1);
    a.store_imm(Size::W, FP, STATS_KEY + 12, 0);
    totals(&mut a, &p.maps, out);
    a.mov(R1, R9);
    a.load(Size::DW, R2, R6, open::T0);
    a.alu(Alu::Sub, R1, R2);
    a.load(Size::DW, R2, R0, stats::WALL);
    a.alu(Alu::Add, R2, R1);
    a.store(Size::DW, R0, stats::WALL, R2);
    a.load(Size::DW, R1, FP, CPU);
    a.load(Size::DW, R2, R6, open::C0);
    a.alu(Alu::Sub, R1, R2);
    a.load(Size::DW, R2, R0, stats::CPU);
    a.alu(Alu::Add, R2, R1);
    a.store(Size::DW, R0, stats::CPU, R2);
    a.bind(out);
    a.mov_imm(R0, 0);
    a.exit();
    a.finish()
}

/// `sched_switch(preempt, prev, next, …)`: stops the CPU clock of a target
/// thread going off a CPU (it is the running one) and starts that of a
/// target thread coming on (read from `next`).
pub fn switch_program(p: &SwitchProgram) -> Result<Vec<Insn>, AsmError> {
    let mut a = Asm::new();
    let next = a.label();
    let insert_off = a.label();
    let insert_on = a.label();
    let out = a.label();
    a.mov(R6, R1);
    a.call(helper::KTIME_GET_NS);
    a.mov(R9, R0);
    only_target(&mut a, p.tgid, next);
    cpu_now(&mut a, p.steal);
    a.store(Size::W, FP, CLOCK_KEY, R7);
    a.store_imm(Size::W, FP, CLOCK_KEY + 4, 0);
    a.load_map(R1, p.clocks);
    stack_pointer(&mut a, R2, CLOCK_KEY);
    a.call(helper::MAP_LOOKUP_ELEM);
    a.jump_imm(Cond::Eq, R0, 0, insert_off);
    a.load(Size::DW, R1, R0, clock::SWITCHED_IN);
    a.jump_imm(Cond::Eq, R1, 0, next);
    a.load(Size::DW, R2, FP, CPU_NOW);
    a.alu(Alu::Sub, R2, R1);
    a.load(Size::DW, R1, R0, clock::ON_CPU);
    a.alu(Alu::Add, R1, R2);
    a.store(Size::DW, R0, clock::ON_CPU, R1);
    a.store_imm(Size::DW, R0, clock::SWITCHED_IN, 0);
    a.goto(next);
    a.bind(insert_off);
    a.store_imm(Size::DW, FP, CLOCK_VALUE + clock::ON_CPU, 0);
    a.store_imm(Size::DW, FP, CLOCK_VALUE + clock::SWITCHED_IN, 0);
    a.load_map(R1, p.clocks);
    stack_pointer(&mut a, R2, CLOCK_KEY);
    stack_pointer(&mut a, R3, CLOCK_VALUE);
    a.mov_imm(R4, BPF_NOEXIST);
    a.call(helper::MAP_UPDATE_ELEM);
    a.bind(next);
    let arg = i16::try_from(8 * p.next_arg).unwrap_or(i16::MAX);
    a.load(Size::DW, R8, R6, arg);
    a.mov(R3, R8);
    a.alu_imm(Alu::Add, R3, offset(p.task_tgid));
    stack_pointer(&mut a, R1, READ_ONE);
    a.mov_imm(R2, 4);
    a.call(helper::PROBE_READ_KERNEL);
    a.jump_imm(Cond::Ne, R0, 0, out);
    a.load(Size::W, R1, FP, READ_ONE);
    a.jump_imm(Cond::Ne, R1, p.tgid as i32, out);
    a.mov(R3, R8);
    a.alu_imm(Alu::Add, R3, offset(p.task_pid));
    stack_pointer(&mut a, R1, READ_ONE);
    a.mov_imm(R2, 4);
    a.call(helper::PROBE_READ_KERNEL);
    a.jump_imm(Cond::Ne, R0, 0, out);
    a.load(Size::W, R1, FP, READ_ONE);
    a.store(Size::W, FP, CLOCK_KEY, R1);
    a.store_imm(Size::W, FP, CLOCK_KEY + 4, 0);
    // (Again: the thread going off may not have been the target's.)
    cpu_now(&mut a, p.steal);
    a.load_map(R1, p.clocks);
    stack_pointer(&mut a, R2, CLOCK_KEY);
    a.call(helper::MAP_LOOKUP_ELEM);
    a.load(Size::DW, R1, FP, CPU_NOW);
    a.jump_imm(Cond::Eq, R0, 0, insert_on);
    a.store(Size::DW, R0, clock::SWITCHED_IN, R1);
    a.goto(out);
    a.bind(insert_on);
    a.store_imm(Size::DW, FP, CLOCK_VALUE + clock::ON_CPU, 0);
    a.store(Size::DW, FP, CLOCK_VALUE + clock::SWITCHED_IN, R1);
    a.load_map(R1, p.clocks);
    stack_pointer(&mut a, R2, CLOCK_KEY);
    stack_pointer(&mut a, R3, CLOCK_VALUE);
    a.mov_imm(R4, BPF_NOEXIST);
    a.call(helper::MAP_UPDATE_ELEM);
    a.bind(out);
    a.mov_imm(R0, 0);
    a.exit();
    a.finish()
}

/// A program that only reads this CPU's stolen time, as the clocks do:
/// loaded once to learn whether the running kernel accepts that read.
pub fn steal_probe_program(steal: Steal) -> Result<Vec<Insn>, AsmError> {
    let mut a = Asm::new();
    a.call(helper::KTIME_GET_NS);
    a.mov(R9, R0);
    cpu_now(&mut a, Some(steal));
    a.mov_imm(R0, 0);
    a.exit();
    a.finish()
}

/// A program that does nothing: what capability probes load.
pub fn empty_program() -> Vec<Insn> {
    let mut a = Asm::new();
    a.mov_imm(R0, 0);
    a.exit();
    a.finish().expect("no jumps")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn maps() -> Maps {
        Maps {
            clocks: 3,
            open: 4,
            stats: 5,
            lost: 6,
        }
    }

    #[test]
    fn every_program_assembles_and_filters_the_target_first() {
        let attribution = Some(Attribution {
            task_fsbase: 0x1234,
            tls_offset: -64,
            row_cells: 64,
            cell_metric_from_end: -8,
        });
        let programs = [
            entry_program(&EntryProgram {
                tgid: 42,
                trigger: Trigger::Probe(3),
                timed: true,
                attribution,
                maps: maps(),
                steal: None,
            })
            .unwrap(),
            entry_program(&EntryProgram {
                tgid: 42,
                trigger: Trigger::Syscalls { wanted: 7 },
                timed: true,
                attribution: None,
                maps: maps(),
                steal: Some(STEAL),
            })
            .unwrap(),
            exit_program(&ExitProgram {
                tgid: 42,
                slot: None,
                maps: maps(),
                steal: Some(STEAL),
            })
            .unwrap(),
        ];
        for p in &programs {
            assert!(p.len() < 4096);
            // The first call is bpf_get_current_pid_tgid and a compare with
            // the tgid follows within four instructions.
            let call = p.iter().position(|i| i.code == 0x85).unwrap();
            assert_eq!(p[call].imm, helper::GET_CURRENT_PID_TGID);
            assert!(p[call..call + 4]
                .iter()
                .any(|i| i.code == 0x55 && i.imm == 42));
            assert_eq!(p.last().unwrap().code, 0x95);
        }
        let switch = switch_program(&SwitchProgram {
            tgid: 42,
            next_arg: 2,
            task_pid: 0x900,
            task_tgid: 0x904,
            clocks: 3,
            steal: None,
        })
        .unwrap();
        // `next` is read from the third argument.
        assert!(switch.iter().any(|i| i.code == 0x79 && i.off == 16));
    }

    const STEAL: Steal = Steal {
        var: 9240,
        offset: 0,
    };

    /// Where `steal` is given, every clock of a CPU stint reads this CPU's
    /// steal counter (the variable's address, `bpf_this_cpu_ptr`) and
    /// subtracts it; without, none does.
    #[test]
    fn stolen_time_is_read_only_where_asked() {
        let kernel_var = |i: &Insn| i.code == 0x18 && i.regs >> 4 == 3 && i.imm == 9240;
        let this_cpu = |i: &Insn| i.code == 0x85 && i.imm == helper::THIS_CPU_PTR;
        for steal in [None, Some(STEAL)] {
            let programs = [
                switch_program(&SwitchProgram {
                    tgid: 42,
                    next_arg: 2,
                    task_pid: 0x900,
                    task_tgid: 0x904,
                    clocks: 3,
                    steal,
                })
                .unwrap(),
                entry_program(&EntryProgram {
                    tgid: 42,
                    trigger: Trigger::Probe(1),
                    timed: true,
                    attribution: None,
                    maps: maps(),
                    steal,
                })
                .unwrap(),
                exit_program(&ExitProgram {
                    tgid: 42,
                    slot: Some(1),
                    maps: maps(),
                    steal,
                })
                .unwrap(),
            ];
            for (i, p) in programs.iter().enumerate() {
                let reads = p.iter().filter(|i| kernel_var(i)).count();
                let calls = p.iter().filter(|i| this_cpu(i)).count();
                // The switch program reads it for the thread going off and
                // the one coming on; the others once.
                let want = match (steal, i) {
                    (None, _) => 0,
                    (Some(_), 0) => 2,
                    (Some(_), _) => 1,
                };
                assert_eq!((reads, calls), (want, want), "program {i}, {steal:?}");
                // Never before the target filter: other processes' threads
                // do not pay for it.
                if let Some(first) = p.iter().position(kernel_var) {
                    let filter = p.iter().position(|i| i.code == 0x55 && i.imm == 42);
                    assert!(filter.is_some_and(|f| f < first));
                }
            }
        }
    }

    #[test]
    fn stack_slots_do_not_overlap() {
        let slots = [
            (CPU, 8),
            (ATTR, 8),
            (CLOCK_KEY, 8),
            (CLOCK_VALUE, 16),
            (STATS_KEY, 16),
            (STATS_ZERO, 32),
            (OPEN_KEY, 8),
            (OPEN_VALUE, 32),
            (READ_PAIR, 16),
            (READ_ONE, 8),
            (LOST_KEY, 8),
            (CPU_NOW, 8),
        ];
        for (i, &(a, la)) in slots.iter().enumerate() {
            assert!(a >= -512 && a + la <= 0);
            for &(b, lb) in &slots[i + 1..] {
                assert!(a + la <= b || b + lb <= a, "{a} and {b} overlap");
            }
        }
    }
}
