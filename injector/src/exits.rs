//! Exit hooks and timers, injector side: which metrics a probe measures, the
//! process's exit-hook layout, installing the exit code in the target, and
//! the functions whose exit must never be hooked.
//!
//! The mechanism is in `weft_codegen::exit` (code) and `weft_rt::exits`
//! (call records, per-thread cells); `docs/exits-and-timers.md` explains
//! the choice.

use crate::branches::BranchIndex;
use crate::inspect::names::cold_part_of;
use crate::inspect::{FoundFunction as Function, ProcessImage};
use crate::ptrace::{RemoteArg, RemoteCall, Tid, Tracer};
use crate::trampolines::Pool;
use crate::Error;
use std::collections::HashMap;
use std::path::PathBuf;
use weft_codegen::{
    exit_code, exit_code_len, ActivationRow, CallRecords, CpuClockLayout, ExitHooks, ExitProbes,
    TimerSpec, Timers, WallRead,
};
use weft_rt::layout::{
    RegionHeader, CALL_RECORDS, ROW_ACTIVITY, ROW_CELLS, ROW_CELLS_END, ROW_CPU_CLOCK, ROW_INDEX,
    ROW_STACK_BOUNDS, ROW_TOP,
};

/// Activations one thread can have open at once (deeper ones are counted
/// as `unhooked`: their calls count, their time is inside an outer one).
pub const CAPACITY: u32 = 1024;

/// What a probe measures. Calls are always counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Metrics {
    /// Inclusive wall time of the outermost activation, per thread.
    pub wall: bool,
    /// Inclusive CPU time of the outermost activation, per thread.
    pub cpu: bool,
    /// A latency histogram of the outermost activations' wall time, per
    /// thread ([`weft_codegen::HIST_BUCKETS`] more words per function and
    /// thread); only with `wall`.
    pub histogram: bool,
}

impl Metrics {
    /// Calls only: an entry counter, no exit hook (cheapest).
    pub const CALLS: Metrics = Metrics {
        wall: false,
        cpu: false,
        histogram: false,
    };
    /// Calls, wall time and CPU time.
    pub const ALL: Metrics = Metrics {
        wall: true,
        cpu: true,
        histogram: false,
    };

    /// What one call of a function measured with these metrics costs the
    /// target on this machine, ns (an estimate for overhead figures): a
    /// timed call is its two clock readings (measured here, the same
    /// `rdtsc` the target's code runs) and the rest of the entry and exit
    /// code (a fixed 10 ns, measured by the overhead bench on both
    /// machines this runs on: 5–14 ns above the clock reads); a counted
    /// one about 1 ns (the bench: +0.3–1.1 ns).
    pub fn call_cost_ns(&self) -> f64 {
        if !(self.wall || self.cpu) {
            return 1.0;
        }
        // The fastest of several short batches: one batch timed by the
        // wall clock counts any preemption or stolen vCPU time inside it
        // (a CI run measured 576 ns a call instead of ~70 that way, and
        // the consultant then deferred tests as too costly).
        const READS: u32 = 2_000;
        let per_read = (0..10)
            .map(|_| {
                let start = std::time::Instant::now();
                let mut sum = 0u64;
                for _ in 0..READS {
                    // SAFETY: rdtsc has no preconditions on x86-64.
                    sum = sum.wrapping_add(unsafe { core::arch::x86_64::_rdtsc() });
                }
                std::hint::black_box(sum);
                start.elapsed().as_nanos() as f64 / f64::from(READS)
            })
            .fold(f64::INFINITY, f64::min);
        2.0 * per_read + 10.0
    }

    /// Parses a comma-separated list of `calls`, `wall`, `cpu` (`calls` is
    /// implied; an empty list is an error). `trace` is not a probe's
    /// metric but a session's: see [`Metrics::parse_with_trace`].
    pub fn parse(text: &str) -> Result<Metrics, String> {
        match Metrics::parse_with_trace(text)? {
            (m, false) => Ok(m),
            (_, true) => Err(
                "`trace` records calls for a whole session: parse the list with \
                 Metrics::parse_with_trace and call Held::set_trace_calls"
                    .into(),
            ),
        }
    }

    /// Parses a comma-separated list of `calls`, `wall`, `cpu` and
    /// `trace` (`calls` is implied; an empty list is an error): the
    /// metrics, and whether `trace` was asked (call traces, which
    /// [`crate::Held::set_trace_calls`] turns on for the session).
    pub fn parse_with_trace(text: &str) -> Result<(Metrics, bool), String> {
        let mut m = Metrics::CALLS;
        let mut trace = false;
        let mut any = false;
        for word in text.split(',').map(str::trim) {
            match word {
                "calls" => {}
                "wall" => m.wall = true,
                "cpu" => m.cpu = true,
                "trace" => trace = true,
                "" => continue,
                other => {
                    return Err(format!(
                    "unknown metric `{other}`: choose from calls, wall, cpu, trace (e.g. `calls,wall`)"
                ))
                }
            }
            any = true;
        }
        if !any {
            return Err("no metric given: choose from calls, wall, cpu, trace".into());
        }
        Ok((m, trace))
    }

    /// The timers these metrics need.
    pub fn timers(&self) -> Timers {
        Timers {
            wall: self.wall,
            cpu: self.cpu,
        }
    }

    /// Whether the probe hooks the function's exit.
    pub fn hooks_exit(&self) -> bool {
        self.wall || self.cpu
    }

    /// The union of two selections.
    pub fn union(self, other: Metrics) -> Metrics {
        Metrics {
            wall: self.wall || other.wall,
            cpu: self.cpu || other.cpu,
            histogram: self.histogram || other.histogram,
        }
    }

    /// The same with a latency histogram when `on` and wall time is
    /// measured (a histogram buckets wall times).
    pub fn with_histogram(self, on: bool) -> Metrics {
        Metrics {
            histogram: on && self.wall,
            ..self
        }
    }

    /// Whether the probe keeps a latency histogram.
    pub fn keeps_histogram(&self) -> bool {
        self.histogram && self.wall
    }

    /// Names, in report order.
    pub fn names(&self) -> Vec<&'static str> {
        let mut v = vec!["calls"];
        if self.wall {
            v.push("wall");
        }
        if self.cpu {
            v.push("cpu");
        }
        v
    }
}

/// Why a function's exit must never be hooked (see `weft_codegen::exit`),
/// or None. Matched on the symbol name without version suffix.
pub fn never_hook_exit(name: &str) -> Option<&'static str> {
    let name = name.split('@').next().unwrap_or(name);
    let returns_twice = [
        "setjmp",
        "_setjmp",
        "__setjmp",
        "sigsetjmp",
        "__sigsetjmp",
        "__sigsetjmp_cancel",
        "savectx",
        "getcontext",
        "swapcontext",
        "vfork",
        "__vfork",
        "clone",
        "__clone",
        "__clone3",
        "clone3",
        "__clone_internal",
    ];
    if returns_twice.contains(&name) {
        return Some(
            "it returns twice or saves its return address for later, and a redirected return \
             address would be used after its slot is reused; count its calls instead",
        );
    }
    let inspects_caller = [
        "dlopen",
        "dlmopen",
        "dlsym",
        "dlvsym",
        "__libc_dlopen_mode",
        "__libc_dlsym",
        "__libc_dlvsym",
        "_dl_sym",
        "_dl_vsym",
        "dladdr",
        "dladdr1",
    ];
    if inspects_caller.contains(&name) {
        return Some(
            "it looks at its caller's address (which a hooked exit replaces); count its calls instead",
        );
    }
    if name == "__restore_rt" {
        return Some(
            "it is the signal trampoline, entered by a signal handler's return on the signal \
             frame, not called; count its calls instead",
        );
    }
    if name.starts_with("_Unwind_") || name.starts_with("__gxx_personality") {
        return Some(
            "it is part of the unwinder that walks through hooked frames; count its calls instead",
        );
    }
    None
}

/// Why `f`'s exit cannot be hooked because code reaches it by a jump with
/// its own frame still live, or None.
///
/// An exit hook replaces the return address a `call` left on top of the
/// stack. Code entered by a `jmp`/`jcc` from a function whose frame is still
/// set up (a `.cold` part, which jumps back into its parent) has no return
/// address there: replacing that stack slot corrupts the parent's frame
/// and the callee-saved register the hook takes (a program then loops
/// forever or computes wrong results). A tail call is also a jump, but its
/// caller's frame is gone and the return address is on top, so a jump
/// alone is no reason: the function's name (`.cold`) or its unwind
/// information (a frame at its first instruction) must say so too.
/// `indexes` are the modules' direct branches (`crate::branches`), by path.
pub fn not_called(
    image: &mut ProcessImage,
    indexes: &HashMap<PathBuf, BranchIndex>,
    f: &Function,
) -> Option<String> {
    let module = image.module_of(f.address)?;
    let jump = indexes
        .get(module.path())
        .and_then(|i| i.jump_to_entry(f.address, f.address + f.size.max(1)));
    let frame = module
        .image()
        .ok()
        .and_then(|elf| elf.frame_at_entry(f.vaddr).ok().flatten());
    let parent = std::iter::once(&f.name)
        .chain(&f.aliases)
        .find_map(|n| cold_part_of(n));
    let evidence = match (parent, frame) {
        (Some(parent), _) => format!(
            "it is a part of `{parent}` the compiler split off, so time `{parent}`, which \
             includes it"
        ),
        (None, Some(frame)) => format!(
            "its unwind information has it start inside a frame set up before it (CFA = \
             {frame} at its first instruction, where a call leaves rsp+8)"
        ),
        (None, None) => return None,
    };
    let from = match jump {
        Some(b) => {
            let name = match image.function_at(b.source) {
                Ok(Some(g)) => format!("{}+{:#x}", g.name, b.source - g.address),
                _ => format!("{:#x}", b.source),
            };
            format!("entered by a jump from {name}")
        }
        None => "entered by a jump".to_string(),
    };
    Some(format!(
        "cannot time it: `{}` is {from}, not called: it can be counted but not timed; {evidence}",
        f.name
    ))
}

/// Why `f`'s exit must never be hooked, whatever its name, or None:
///
/// * Nothing calls it, so the top of the stack at its first instruction
///   is not a return address, and an exit hook would overwrite whatever
///   is there: the program's entry point (`e_entry`, `_start`: the kernel
///   leaves `argc` there, and a hook turned it into an address), code its
///   unwind information calls the outermost frame, and signal trampolines
///   (`__restore_rt`, entered by a handler's return onto the signal frame).
/// * Its module is Go code. Go's runtime walks goroutine stacks with its
///   own tables (garbage collection, stack growth, preemption,
///   `runtime.Callers`, panics) and dies with "unexpected return pc" at a
///   return address outside Go code, which is what a hooked exit leaves on
///   the stack; goroutines also move between threads, and each thread
///   keeps its own activations.
pub fn never_hook_exit_in(image: &ProcessImage, f: &Function) -> Option<String> {
    let module = image.module_of(f.address)?;
    let uncalled = |why: &str| {
        format!(
            "`{}` is {why}, not called: there is no return address on top of its stack to \
             hook; count its calls instead",
            f.name
        )
    };
    if module.header().entry != 0 && module.header().entry == f.vaddr {
        return Some(uncalled(&format!(
            "where the kernel starts {} (its ELF entry point)",
            module.name()
        )));
    }
    let elf = module.image().ok()?;
    match elf.no_return_address_at_entry(f.vaddr) {
        Ok(Some(crate::inspect::NoReturnAddress::Outermost)) => {
            return Some(uncalled(
                "the outermost frame (its unwind information says so: a process's or a \
                 thread's first code)",
            ))
        }
        Ok(Some(crate::inspect::NoReturnAddress::SignalTrampoline)) => {
            return Some(uncalled(
                "a signal trampoline (entered by a signal handler's return, on the signal frame)",
            ))
        }
        Ok(None) | Err(_) => {}
    }
    elf.is_go().then(|| {
        format!(
            "{} is Go code, and Go's runtime aborts (\"unexpected return pc\") when it walks a \
             goroutine's stack (garbage collection, preemption, runtime.Callers) through the \
             return address a timer replaces; count its calls instead",
            module.name()
        )
    })
}

/// The process's exit-hook layout with `timers` and the exit code at
/// `exit_code`, from the runtime's header (record and clock addresses) and
/// row layout.
pub fn hooks(
    header: &RegionHeader,
    exit_code: u64,
    timers: Timers,
    trace: bool,
) -> Result<ExitHooks, Error> {
    let internal = |e: weft_codegen::LayoutError| Error::Internal(format!("exit layout: {e}"));
    let row = ActivationRow {
        cells: ROW_CELLS as i32,
        top: ROW_TOP as i32,
        end: ROW_CELLS_END as i32,
        stack_bounds: Some(ROW_STACK_BOUNDS as i32),
        activity: Some(ROW_ACTIVITY as i32),
    };
    let records = CallRecords {
        first: header.call_records,
        count: CALL_RECORDS as u32,
    };
    let wall = if weft_rt::clock::WallClock::in_region(header).kind == weft_rt::clock::WALL_TSC {
        WallRead::Tsc
    } else {
        WallRead::Call {
            routine: header.wall_raw_fn,
            state: header.wall_address,
        }
    };
    let hooks = ExitHooks::new(row, records, exit_code).map_err(internal)?;
    let hooks = match trace_ring(header, wall) {
        Some(ring) if trace => hooks.with_trace(ring).map_err(internal)?,
        None if trace => {
            return Err(Error::Internal(
                "call traces asked before the trace ring was made".into(),
            ))
        }
        _ => hooks,
    };
    hooks
        .with_exit_probes(ExitProbes {
            table: header.exit_probes,
            save: crate::cpu::vector_save(),
            row_index: ROW_INDEX as i32,
        })
        .map_err(internal)?
        .with_timers(TimerSpec {
            timers,
            wall,
            cpu: CpuClockLayout {
                row_offset: ROW_CPU_CLOCK as i32,
                slow_path: header.cpu_ticks_fn,
                ..CpuClockLayout::WEFT_RT
            },
            ns_per_tick_q32: header.timer_ns_per_tick_q32,
            self_ticks_row: weft_rt::layout::ROW_SELF_TICKS as i32,
        })
        .map_err(internal)
}

/// The threads' trace ring as the region's header names it, if made.
fn trace_ring(header: &RegionHeader, wall: WallRead) -> Option<weft_codegen::TraceRing> {
    use std::sync::atomic::Ordering;
    let first = header.trace_ring.load(Ordering::Acquire).checked_sub(1)?;
    Some(weft_codegen::TraceRing {
        offset: i32::try_from(weft_rt::layout::Geometry::metric_offset(first)).ok()?,
        capacity: header.trace_capacity.load(Ordering::Acquire),
        wall,
    })
}

/// Where the runtime's exports are and how to reach the target.
pub struct Installer<'a> {
    /// The stopped target.
    pub tracer: &'a mut Tracer,
    /// The thread remote calls run on.
    pub tid: Tid,
    /// Trampoline memory (the exit code goes there).
    pub pool: &'a mut Pool,
    /// libc's `mmap` in the target.
    pub mmap_fn: u64,
    /// The runtime's load address (the exit code's area is placed near it
    /// where there is room, anywhere otherwise).
    pub rt_base: u64,
    /// Address of `weft_rt_enable_exits` in the target.
    pub enable_fn: u64,
}

impl Installer<'_> {
    /// Builds the exit code for `timers`, writes it into the target and
    /// makes its handler the one every call record reaches; enables exit
    /// hooks in the runtime on its first call. Returns the layout entry
    /// snippets must be built with.
    pub fn install(
        &mut self,
        header: &RegionHeader,
        timers: Timers,
        trace: bool,
    ) -> Result<ExitHooks, Error> {
        let tls_offset = i32::try_from(header.tls_offset)
            .map_err(|_| Error::Internal("TLS offset beyond ±2 GiB".into()))?;
        // The code's length does not depend on its address.
        let len = exit_code_len(tls_offset, &hooks(header, 0x1000, timers, trace)?) as u64;
        let (at, _) = self.pool.reserve_preferably_near(
            self.tracer,
            self.tid,
            self.mmap_fn,
            header.register_fn,
            self.rt_base,
            len,
        )?;
        let hooks = hooks(header, at, timers, trace)?;
        let code = exit_code(tls_offset, &hooks)
            .map_err(|e| Error::Internal(format!("exit code: {e}")))?;
        self.tracer.memory().write(at, &code.bytes)?;
        let result = self.tracer.call(
            self.tid,
            &RemoteCall::new(
                "weft_rt_enable_exits",
                self.enable_fn,
                vec![
                    RemoteArg::Value(u64::from(CAPACITY)),
                    RemoteArg::Value(code.handler),
                ],
            ),
            // Two stores in the runtime: no lock, no system call.
            false,
        )?;
        if (result as i64) < 0 {
            return Err(Error::Internal(format!(
                "the runtime refused to enable exit hooks: {}",
                std::io::Error::from_raw_os_error(-(result as i64) as i32)
            )));
        }
        Ok(hooks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_parse() {
        assert_eq!(Metrics::parse("calls").unwrap(), Metrics::CALLS);
        assert_eq!(Metrics::parse("calls,wall,cpu").unwrap(), Metrics::ALL);
        assert_eq!(
            Metrics::parse("wall").unwrap(),
            Metrics {
                wall: true,
                cpu: false,
                histogram: false,
            }
        );
        assert_eq!(
            Metrics::parse_with_trace("calls,trace").unwrap(),
            (Metrics::CALLS, true)
        );
        assert!(Metrics::parse("calls,trace").is_err());
        assert!(Metrics::parse("calls,walltime")
            .unwrap_err()
            .contains("walltime"));
        assert!(Metrics::parse("").is_err());
        assert_eq!(Metrics::ALL.names(), ["calls", "wall", "cpu"]);
    }

    #[test]
    fn refusals() {
        assert!(never_hook_exit("setjmp").is_some());
        assert!(never_hook_exit("_setjmp@GLIBC_2.2.5").is_some());
        assert!(never_hook_exit("dlopen").is_some());
        assert!(never_hook_exit("_Unwind_RaiseException").is_some());
        assert!(never_hook_exit("__restore_rt").is_some());
        assert!(never_hook_exit("malloc").is_none());
    }
}
