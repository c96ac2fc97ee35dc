//! A held process: the guard on which every operation that needs the
//! target's threads stopped lives.
//!
//! The tracer (weft's ptrace attachment) exists only inside a [`Held`]:
//! the internals that need it take it as an argument, so none of them can
//! run on a process that is not held. A `Held` borrows its [`Process`]
//! mutably and gives it back only as `&Process` ([`Deref`]): whatever reads
//! stays reachable, and nothing can change the process behind the guard's
//! back or outlive it.

use super::{Error, Function, PointSpec, ProbeId, ProbeSpec, Process, Refused, Replacement};
use crate::exits::Metrics;
use crate::inspect::pattern::Pattern;
use crate::inspect::ProcessImage;
use crate::ptrace::{Registers, Tid, Tracer};
use std::ops::Deref;
use std::time::Duration;

/// A [`Process`] weft holds: attached with ptrace, every thread stopped,
/// from [`Process::hold`] until [`Held::release`] (or until the `Held` is
/// dropped, which releases too, errors ignored: weft never leaves the
/// target stopped). Every change to the target's code happens here, each
/// call in one stop of the world ([`Held::stops`]).
///
/// What only reads — [`Process::report`], [`Process::snapshot`],
/// [`Process::probes`], [`Process::read_memory`]… — is reachable through
/// `Deref<Target = Process>`; the few reading operations that take
/// `&mut Process` (they cache what they parse) have forwarders here
/// ([`Held::find_functions`], [`Held::image`], [`Held::prepare`],
/// [`Held::check_points`], [`Held::harvest`]).
///
/// A launched program that has never run ([`Process::launch`]) is killed
/// and reaped when its `Held` is dropped without release: it must not reach
/// `main` uninstrumented.
///
/// What a process that is not held cannot do does not compile:
///
/// ```compile_fail
/// # fn f(process: &mut weft::Process, functions: &[weft::Function]) {
/// process.insert_counters(functions); // only a Held inserts
/// # }
/// ```
///
/// ```compile_fail
/// # fn f(process: &mut weft::Process) {
/// process.write_memory(0x1000, &[0]); // only a Held writes
/// # }
/// ```
///
/// A `Held` is gone once released, and a process is held once at a time:
///
/// ```compile_fail
/// # fn f(process: &mut weft::Process) -> Result<(), weft::Error> {
/// let mut held = process.hold()?;
/// held.release()?;
/// held.remove_all()?; // released: moved
/// # Ok(()) }
/// ```
///
/// ```compile_fail
/// # fn f(process: &mut weft::Process) -> Result<(), weft::Error> {
/// let first = process.hold()?;
/// let second = process.hold()?; // the first still borrows the process
/// # drop((first, second)); Ok(()) }
/// ```
///
/// ```no_run
/// # fn f(process: &mut weft::Process) -> Result<(), weft::Error> {
/// let mut held = process.hold()?;
/// held.remove_all()?;
/// let report = held.report(); // reading through Deref<Target = Process>
/// held.release()?;
/// let again = process.report(); // and without holding
/// # drop((report, again)); Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "the process stays stopped until the Held is released or dropped"]
pub struct Held<'p> {
    process: &'p mut Process,
    tracer: Tracer,
    /// Set by [`Held::release`]: the drop then has nothing left to do.
    released: bool,
    /// The live threads' rows, by thread ID, looked up once per hold by
    /// the first stack copy (a walk reads hooked return addresses there).
    rows: std::cell::OnceCell<std::collections::HashMap<u32, u32>>,
}

impl<'p> Held<'p> {
    pub(super) fn new(process: &'p mut Process, tracer: Tracer) -> Held<'p> {
        Held {
            process,
            tracer,
            released: false,
            rows: std::cell::OnceCell::new(),
        }
    }

    /// Detaches: the process runs on, probes keep counting, weft is no
    /// longer attached (its signals, clones and exits never wait for weft).
    /// The error is the detach's; the process is let go of either way.
    pub fn release(mut self) -> Result<(), Error> {
        self.released = true;
        self.process.let_go(&mut self.tracer)
    }

    /// Runs `change` as a transaction (see `Process::transaction`).
    fn transaction<T>(
        &mut self,
        change: impl FnOnce(&mut Process, &mut Tracer) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.process.transaction(&mut self.tracer, change)
    }

    /// Splices a per-thread call counter into each function's entry.
    /// Functions that cannot be patched safely are returned in the error,
    /// and nothing at all is changed then.
    pub fn insert_counters(&mut self, functions: &[Function]) -> Result<Vec<ProbeId>, Error> {
        self.insert(functions, Metrics::CALLS)
    }

    /// Splices probes measuring `metrics` into each function: an entry
    /// counter for calls only; with wall or CPU time, an entry counter that
    /// also hooks the function's exit and times its outermost activation
    /// per thread. Functions that cannot be patched safely (or whose exit
    /// must not be hooked, when timing) are returned in the error, and
    /// nothing at all is changed then.
    pub fn insert(
        &mut self,
        functions: &[Function],
        metrics: Metrics,
    ) -> Result<Vec<ProbeId>, Error> {
        let specs: Vec<ProbeSpec> = functions
            .iter()
            .map(|f| ProbeSpec::measure(f.clone(), metrics))
            .collect();
        self.insert_probes(&specs)
    }

    /// Splices every probe of `specs` in, in one stop of the world:
    /// counters, timers, user probes at entries and exits. All or nothing:
    /// functions that cannot be patched safely (or whose exit must not be
    /// hooked) are returned in the error, and nothing is changed then. One
    /// probe per function: a function already instrumented is skipped.
    pub fn insert_probes(&mut self, specs: &[ProbeSpec]) -> Result<Vec<ProbeId>, Error> {
        self.transaction(|process, tracer| process.insert_probes_now(tracer, specs, &|_| true))
            .map(|applied| applied.ids)
    }

    /// Splices in every probe of `specs` that can be planned safely, in
    /// one stop of the world, and leaves the others alone: what a glob
    /// over a whole library wants (`weft -f 'libc.so.6:*'`). The functions
    /// refused while planning — before anything is written — are in
    /// [`Applied::refused`] with their reasons, unless `required` holds for
    /// one of them (a function the user named exactly, say): then nothing
    /// is changed and [`Error::Refused`] names every required function
    /// refused. A failure while writing (after planning) still undoes the
    /// whole insertion, as [`Held::insert_probes`] does.
    pub fn insert_what_is_safe(
        &mut self,
        specs: &[ProbeSpec],
        required: impl Fn(&Function) -> bool,
    ) -> Result<Applied, Error> {
        self.transaction(|process, tracer| process.insert_probes_now(tracer, specs, &required))
    }

    /// Inserts instruction points, all in one stop of the world. Each point
    /// is planned from the function's original code and refused, with
    /// nothing changed, when it is not an instruction boundary, when it
    /// cannot be patched safely (a branch or a jump table may enter the
    /// bytes the patch overwrites, a call would return into them...), when
    /// it overlaps another probe's patch, or when call targets are asked
    /// for at an instruction that is not an indirect call.
    /// [`Held::remove`] takes a point out like any probe.
    ///
    /// # Errors
    ///
    /// [`Error::Refused`] naming every point refused and why; the errors of
    /// loading the runtime.
    pub fn insert_points(&mut self, specs: &[PointSpec]) -> Result<Vec<ProbeId>, Error> {
        self.transaction(|process, tracer| process.insert_points_now(tracer, specs))
    }

    /// Redirects every call of `f` to `with` (a function of the same
    /// signature in the target, e.g. from [`Held::load_library`]), in one
    /// stop of the world. The returned [`Replacement`] says where the
    /// original is, for `with` to call; [`Held::remove`] with its id puts
    /// the original back. Refused, and nothing changed, when `f` cannot be
    /// patched safely or is already instrumented.
    pub fn replace_function(&mut self, f: &Function, with: u64) -> Result<Replacement, Error> {
        self.transaction(|process, tracer| process.replace_function_now(tracer, f, with))
    }

    /// Makes the `call rel32` at `site` (inside a function of the target,
    /// e.g. from [`crate::code::function_code`]'s call sites) call `to`
    /// instead, in one stop of the world. The callee returns where the
    /// original would have. [`Held::remove`] with the id puts the original
    /// call back.
    pub fn redirect_call(&mut self, site: u64, to: u64) -> Result<ProbeId, Error> {
        self.transaction(|process, tracer| process.redirect_call_now(tracer, site, to))
    }

    /// Takes the `call rel32` at `site` out (a 5-byte `nop` instead), in one
    /// stop of the world: the caller goes on as if the callee had returned
    /// at once, with the registers as they were (a result the caller uses
    /// is then whatever was in `rax`). [`Held::remove`] with the id puts
    /// the call back.
    pub fn remove_call(&mut self, site: u64) -> Result<ProbeId, Error> {
        self.transaction(|process, tracer| process.remove_call_now(tracer, site))
    }

    /// Restores every active probe's original bytes. Threads inside a
    /// trampoline finish it normally; its memory is reused only once none
    /// can be in it.
    pub fn remove_all(&mut self) -> Result<(), Error> {
        let ids: Vec<ProbeId> = self
            .process
            .probes
            .iter()
            .filter(|p| p.active)
            .map(|p| p.id)
            .collect();
        self.remove(&ids)
    }

    /// Removes the given probes (see [`Held::remove_all`]); removing one
    /// twice does nothing. A probe's companions go with it, and so do
    /// probes tied to it (a sibling entry point whose trampoline leads
    /// into its: docs/design.md, "Code shared between entry points").
    pub fn remove(&mut self, ids: &[ProbeId]) -> Result<(), Error> {
        self.process.remove_now(&mut self.tracer, ids)
    }

    /// Loads the shared library at `path` into the target with the target's
    /// own `dlopen` (its constructors run; the other threads run
    /// meanwhile, so a lock one of them holds cannot deadlock the loader).
    /// Loading it again returns the same library (dlopen counts
    /// references). Look its probe functions up with
    /// [`Library::symbol`](crate::library::Library::symbol).
    pub fn load_library(
        &mut self,
        path: impl AsRef<std::path::Path>,
    ) -> Result<crate::library::Library, Error> {
        self.process
            .load_library_now(&mut self.tracer, path.as_ref())
    }

    /// The kernel thread IDs of the threads weft holds.
    pub fn threads(&self) -> Vec<Tid> {
        self.tracer.threads().collect()
    }

    /// The general registers of thread `tid`, stopped.
    pub fn registers(&self, tid: Tid) -> Result<Registers, Error> {
        Ok(self.tracer.registers(tid)?)
    }

    /// Thread `tid`'s registers and the top of its stack, copied for a
    /// walk after the stop ([`crate::stack::StackCopy::walk`]).
    pub fn copy_stack(&self, tid: Tid) -> Result<crate::stack::StackCopy, Error> {
        let regs = self.registers(tid)?;
        let memory = crate::memory::ProcessMemory::open_read_only(self.process.pid())?;
        let rows = self.rows.get_or_init(|| self.process.live_rows());
        let hooked = rows
            .get(&(tid as u32))
            .map(|&row| self.process.hooked_returns(&memory, row))
            .unwrap_or_default();
        Ok(crate::stack::StackCopy::take(&memory, regs).with_hooked(hooked))
    }

    /// The functions thread `tid` is inside of now, innermost first: its
    /// stack walked with the modules' call frame information (at most
    /// `max` frames; see [`crate::stack`] for where a walk stops).
    pub fn stack(&mut self, tid: Tid, max: usize) -> Result<Vec<crate::stack::Frame>, Error> {
        let copy = self.copy_stack(tid)?;
        Ok(copy.walk(self.process.image(), max))
    }

    /// Sets the general registers of thread `tid`, stopped; they take
    /// effect when it runs again.
    pub fn set_registers(&mut self, tid: Tid, registers: &Registers) -> Result<(), Error> {
        Ok(self.tracer.set_registers(tid, registers)?)
    }

    /// Writes `bytes` into the target's memory at `address`, read-only
    /// mappings (code) included, as a debugger does. Only while held:
    /// writing code a running thread executes is not safe (weft's own
    /// patches check where every thread is; this does not).
    pub fn write_memory(&mut self, address: u64, bytes: &[u8]) -> Result<(), Error> {
        Ok(self.tracer.memory().write(address, bytes)?)
    }

    /// [`Process::stops`], this hold's stops included.
    pub fn stops(&self) -> u64 {
        self.process.target.stops_before + self.tracer.stop_count()
    }

    /// The longest time the target's threads were all stopped at once
    /// during this hold so far.
    pub fn longest_stop(&self) -> Duration {
        self.tracer.longest_stop()
    }

    /// [`Process::image`], while held.
    pub fn image(&mut self) -> &mut ProcessImage {
        self.process.image()
    }

    /// [`Process::find_functions`], while held.
    pub fn find_functions(&mut self, patterns: &[Pattern]) -> Result<Vec<Function>, Error> {
        self.process.find_functions(patterns)
    }

    /// [`Process::prepare`], while held (the planning then adds to the
    /// pause: do it before [`Process::hold`] when you can).
    pub fn prepare(&mut self, functions: &[Function]) -> Result<(), Error> {
        self.process.prepare(functions)
    }

    /// [`Process::check_points`], while held.
    pub fn check_points(&mut self, specs: &[PointSpec]) -> Vec<Option<String>> {
        self.process.check_points(specs)
    }

    /// [`Process::harvest`], while held.
    pub fn harvest(&mut self) -> usize {
        self.process.harvest()
    }

    /// [`Process::set_trace_calls`], while held.
    pub fn set_trace_calls(&mut self, on: bool) {
        self.process.set_trace_calls(on)
    }

    /// Gets the runtime ready without inserting anything, a step per
    /// stop, for a tool that promises short stops: the first call loads
    /// the runtime into a process that has none (and does nothing else);
    /// a call once it is loaded installs the exit code serving `metrics`.
    /// Call it twice to have both before a first insertion, which is then
    /// as short as any other (insertions do both themselves otherwise).
    pub fn load_runtime(&mut self, metrics: Metrics) -> Result<(), Error> {
        if self.process.runtime.is_none() {
            return self.process.load_runtime_alone(&mut self.tracer);
        }
        let trace = self.process.trace_calls;
        self.process
            .ensure_exits(&mut self.tracer, metrics, trace)?;
        Ok(())
    }

    /// The runtime's region header, writable (for the words weft sets
    /// there), loading the runtime first if need be.
    pub(crate) fn region_header(&mut self) -> Result<&weft_rt::layout::RegionHeader, Error> {
        self.process.ensure_runtime(&mut self.tracer)?;
        Ok(self.process.rt()?.region.control())
    }

    /// Leaves probe `id` (weft's own, not the user's) out of reports.
    pub(crate) fn leave_out_of_reports(&mut self, id: ProbeId) {
        self.process.leave_out_of_reports(id);
    }

    /// Makes the next insertion fail at `step` (debug builds only: a test's
    /// hook to show that every step is undone).
    #[cfg(debug_assertions)]
    #[doc(hidden)]
    pub fn fail_next_insertion_at(&mut self, step: super::undo::Fault) {
        self.process.fail_next_insertion_at(step);
    }
}

/// What [`Held::insert_what_is_safe`] did.
#[derive(Debug, Clone, Default)]
#[must_use = "the refused functions were not instrumented"]
pub struct Applied {
    /// The probes inserted (or shared with another weft), one per function
    /// instrumented.
    pub ids: Vec<ProbeId>,
    /// The functions left alone, with the reasons.
    pub refused: Vec<Refused>,
}

/// Only `&Process`: a `DerefMut` would let `hold` be called again, or
/// the process be replaced, behind the guard.
impl Deref for Held<'_> {
    type Target = Process;

    fn deref(&self) -> &Process {
        self.process
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        if self.process.target.launched && !self.process.target.ever_released {
            // Stopped at its entry and never run: running it now would run
            // it uninstrumented, which the user did not ask for.
            crate::launch::kill_traced(self.process.target.pid, &mut self.tracer);
            self.process.target.exit = Some(crate::ptrace::ProcessExit::Signal(libc::SIGKILL));
            self.process.target.boost = None;
            return;
        }
        let _ = self.process.let_go(&mut self.tracer);
    }
}
