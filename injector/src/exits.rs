//! Exit hooks and timers, injector side: which metrics a probe measures, the
//! process's return-slot layout, installing the exit handler in the target,
//! and the functions whose exit must never be hooked.
//!
//! The mechanism is in `weft_codegen::exit` (code) and `weft_rt::exits`
//! (per-thread blocks); `docs/exits-and-timers.md` explains the choice.

use crate::ptrace::{RemoteArg, RemoteCall, Tid, Tracer};
use crate::trampolines::Pool;
use crate::Error;
use weft_codegen::{
    block_eh_frame_with_personality, exit_handler, exit_handler_len, return_block_code,
    ReturnSlots, TimerSpec, Timers,
};
use weft_rt::layout::{RegionHeader, ROW_BLOCK, ROW_CPU_CLOCK, ROW_DEPTH, ROW_STACK_BOUNDS};

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
}

impl Metrics {
    /// Calls only: an entry counter, no exit hook (cheapest).
    pub const CALLS: Metrics = Metrics {
        wall: false,
        cpu: false,
    };
    /// Calls, wall time and CPU time.
    pub const ALL: Metrics = Metrics {
        wall: true,
        cpu: true,
    };

    /// Parses a comma-separated list of `calls`, `wall`, `cpu` (`calls` is
    /// implied; an empty list is an error).
    pub fn parse(text: &str) -> Result<Metrics, String> {
        let mut m = Metrics::CALLS;
        let mut any = false;
        for word in text.split(',').map(str::trim) {
            match word {
                "calls" => {}
                "wall" => m.wall = true,
                "cpu" => m.cpu = true,
                "" => continue,
                other => {
                    return Err(format!(
                    "unknown metric `{other}`: choose from calls, wall, cpu (e.g. -m calls,wall)"
                ))
                }
            }
            any = true;
        }
        if !any {
            return Err("no metric given: choose from calls, wall, cpu".into());
        }
        Ok(m)
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
        }
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
             address would be used after its slot is reused; measure it with -m calls",
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
            "it looks at its caller's address (which a hooked exit replaces); measure it with -m calls",
        );
    }
    if name.starts_with("_Unwind_") || name.starts_with("__gxx_personality") {
        return Some(
            "it is part of the unwinder that walks through hooked frames; measure it with -m calls",
        );
    }
    None
}

/// The process's return-slot layout with `timers`, from the runtime's
/// header (clock addresses) and row layout.
pub fn layout(header: &RegionHeader, timers: Timers) -> Result<ReturnSlots, Error> {
    let internal = |e: weft_codegen::LayoutError| Error::Internal(format!("exit layout: {e}"));
    let slots = ReturnSlots::new(
        CAPACITY,
        ROW_BLOCK as i32,
        ROW_DEPTH as i32,
        Some(ROW_STACK_BOUNDS as i32),
    )
    .map_err(internal)?;
    slots
        .with_timers(TimerSpec {
            timers,
            wall_fn: header.wall_now_fn,
            wall_state: header.wall_address,
            cpu_fn: header.cpu_now_fn,
            cpu_state_row_offset: ROW_CPU_CLOCK as i32,
        })
        .map_err(internal)
}

/// Where the runtime's exports are and how to reach the target.
pub struct Installer<'a> {
    /// The stopped target.
    pub tracer: &'a mut Tracer,
    /// The thread remote calls run on.
    pub tid: Tid,
    /// Trampoline memory (the handler goes there).
    pub pool: &'a mut Pool,
    /// libc's `mmap` in the target.
    pub mmap_fn: u64,
    /// The runtime's load address (the handler's area is placed near it).
    pub rt_base: u64,
    /// Address of `weft_rt_enable_exits` in the target.
    pub enable_fn: u64,
}

impl Installer<'_> {
    /// Builds the exit handler for `timers`, writes it into the target and
    /// makes it the one every return slot reaches; enables exit hooks in the
    /// runtime on its first call. Checks that the runtime's block code is
    /// exactly what the code generator expects. Returns the layout entry
    /// snippets must be built with.
    pub fn install(&mut self, header: &RegionHeader, timers: Timers) -> Result<ReturnSlots, Error> {
        let slots = layout(header, timers)?;
        let tls_offset = i32::try_from(header.tls_offset)
            .map_err(|_| Error::Internal("TLS offset beyond ±2 GiB".into()))?;
        let len = exit_handler_len(tls_offset, &slots) as u64;
        let (at, _) = self.pool.reserve(
            self.tracer,
            self.tid,
            self.mmap_fn,
            header.register_fn,
            self.rt_base,
            len,
        )?;
        let code = exit_handler(at, tls_offset, &slots)
            .map_err(|e| Error::Internal(format!("exit handler: {e}")))?;
        self.tracer.memory().write(at, &code)?;

        // The unwind template: the FDE's initial location (8 bytes, absolute)
        // is the one field that differs per block; find it by building the
        // template for two addresses.
        let personality = Some(header.personality_fn).filter(|&p| p != 0);
        let a = block_eh_frame_with_personality(0x1111_1111_1111_1111, &slots, personality);
        let b = block_eh_frame_with_personality(0x2222_2222_2222_2222, &slots, personality);
        let pc_offset = (0..a.len())
            .find(|&i| a[i] != b[i])
            .ok_or_else(|| Error::Internal("block .eh_frame has no address field".into()))?;
        let result = self.tracer.call(
            self.tid,
            &RemoteCall::new(
                "weft_rt_enable_exits",
                self.enable_fn,
                vec![
                    RemoteArg::Value(u64::from(CAPACITY)),
                    RemoteArg::Value(at),
                    RemoteArg::Bytes(a.clone()),
                    RemoteArg::Value(a.len() as u64),
                    RemoteArg::Value(pc_offset as u64),
                    RemoteArg::Value(u64::from(timers.any())),
                ],
            ),
            // The runtime's own code: mmap, dlsym on the first call (made
            // right after dlopen, while no thread holds the loader lock
            // inside the runtime).
            false,
        )?;
        if (result as i64) < 0 {
            return Err(Error::Internal(format!(
                "the runtime refused to enable exit hooks: {}",
                std::io::Error::from_raw_os_error(-(result as i64) as i32)
            )));
        }
        let expected = return_block_code(&slots, header.exit_trampoline);
        let found = self.tracer.memory().read_vec(result, expected.len())?;
        if found != expected {
            return Err(Error::Internal(
                "the runtime's return-slot code differs from this weft's code generator".into(),
            ));
        }
        Ok(slots)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_rt::layout::metric;

    #[test]
    fn metrics_parse() {
        assert_eq!(Metrics::parse("calls").unwrap(), Metrics::CALLS);
        assert_eq!(Metrics::parse("calls,wall,cpu").unwrap(), Metrics::ALL);
        assert_eq!(
            Metrics::parse("wall").unwrap(),
            Metrics {
                wall: true,
                cpu: false
            }
        );
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
        assert!(never_hook_exit("malloc").is_none());
    }

    /// The runtime closes activations itself (thread exit): its copy of the
    /// word layout must be the code generator's.
    #[test]
    fn runtime_and_code_generator_agree_on_the_words() {
        use weft_codegen as cg;
        let pairs = [
            (metric::ENTRIES, cg::METRIC_ENTRIES),
            (metric::EXITS, cg::METRIC_EXITS),
            (metric::UNWOUND, cg::METRIC_UNWOUND),
            (metric::UNHOOKED, cg::METRIC_UNHOOKED),
            (metric::NESTING, cg::METRIC_NESTING),
            (metric::SEQ, cg::METRIC_SEQ),
            (metric::WALL_TOTAL, cg::METRIC_WALL_TOTAL),
            (metric::WALL_START, cg::METRIC_WALL_START),
            (metric::CPU_TOTAL, cg::METRIC_CPU_TOTAL),
            (metric::CPU_START, cg::METRIC_CPU_START),
            (metric::TIMED_LEN, cg::TIMER_METRIC_LEN),
            (metric::SLOT_SIZE, cg::SLOT_SIZE as i32),
            (metric::CELL_RETURN_ADDRESS, cg::CELL_RETURN_ADDRESS),
            (metric::CELL_METRIC, cg::CELL_METRIC),
            (metric::SLOT_ENTRY, cg::SLOT_ENTRY as i32),
        ];
        for (rt, cg) in pairs {
            assert_eq!(rt as i64, i64::from(cg));
        }
        let slots = ReturnSlots::new(CAPACITY, 64, 72, Some(80)).unwrap();
        let (delta, len) = weft_rt::block_sizes(CAPACITY);
        assert_eq!(delta as u32, slots.delta());
        assert_eq!(len as u32, slots.block_len());
    }
}
