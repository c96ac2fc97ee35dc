//! Choosing the thread that makes remote calls, and stopping, moving and letting go of the target's threads.

use super::*;

impl Process {
    /// The thread that runs remote calls (see [`Process::pick_call_thread`]).
    pub(super) fn call_thread(&mut self, tracer: &mut Tracer) -> Result<Tid, Error> {
        let tid = self.pick_call_thread(tracer)?;
        self.with_return_stub(tracer, tid)
    }

    /// The thread that runs remote calls that are bare system calls
    /// (`mmap` of trampoline areas): any thread will do, since a system call
    /// takes no lock another thread could hold (as in a signal handler), so
    /// the world never runs again to find a better placed one (an
    /// insertion stays one stop of the world on a loaded machine, where
    /// threads are often preempted inside the C library). One that
    /// [`Process::pick_call_thread`] would take is still preferred.
    pub(super) fn syscall_thread(&mut self, tracer: &mut Tracer) -> Result<Tid, Error> {
        let tid = match self.safe_call_thread(tracer)? {
            Some(tid) => tid,
            None => tracer
                .threads()
                .next()
                .ok_or(Error::Trace(TraceError::NoSuchProcess(self.target.pid)))?,
        };
        self.with_return_stub(tracer, tid)
    }

    /// `tid`, once its remote calls return through the return stub.
    pub(super) fn with_return_stub(&mut self, tracer: &mut Tracer, tid: Tid) -> Result<Tid, Error> {
        // Every remote call after the first returns through a stub that puts
        // the thread back by itself should weft die meanwhile.
        let mmap_fn = self
            .image
            .symbol_address("libc.so", "mmap")
            .ok_or(Error::MissingLibc("mmap"))?;
        let cave = self.code_cave(weft_codegen::BOOTSTRAP_LEN);
        let known = self.target.stub_address;
        let stub = tracer.install_return_stub(tid, mmap_fn, cave, known)?;
        self.target.stub_address = Some(stub);
        Ok(tid)
    }

    /// `len` unused bytes (16-aligned) in an executable mapping: after the
    /// end of a module's executable segment, up to the end of its last page,
    /// which the mapping covers but no code or data of the module occupies.
    /// libc first (always there), then the other modules.
    pub(super) fn code_cave(&self, len: u64) -> Option<u64> {
        let mut modules: Vec<&crate::inspect::Module> = self.image.modules().iter().collect();
        modules.sort_by_key(|m| !m.name().starts_with("libc.so"));
        for module in modules {
            for seg in module.header().segments.iter() {
                if !seg.is_load() || !seg.is_executable() || seg.memsz == 0 {
                    continue;
                }
                let end = module.runtime_address(seg.vaddr.saturating_add(seg.memsz));
                let cave = end.div_ceil(16) * 16;
                let page_end = end.div_ceil(4096) * 4096;
                let mapped = module
                    .mappings()
                    .iter()
                    .any(|m| m.perms.exec && m.start < end && page_end <= m.end);
                if mapped && cave + len <= page_end {
                    return Some(cave);
                }
            }
        }
        None
    }

    /// A thread at a point where it holds no lock a remote `dlopen` (or
    /// `malloc` inside the runtime) could need; when none is, the world runs
    /// a little and weft looks again.
    pub(super) fn pick_call_thread(&self, tracer: &mut Tracer) -> Result<Tid, Error> {
        const SAMPLES: u32 = 10;
        for attempt in 0..SAMPLES {
            if let Some(tid) = self.safe_call_thread(tracer)? {
                return Ok(tid);
            }
            if attempt + 1 == SAMPLES {
                break;
            }
            tracer.resume_all()?;
            std::thread::sleep(Duration::from_millis(1 + u64::from(attempt)));
            tracer.stop_all()?;
        }
        // Every thread keeps being inside the C library (a program that
        // lives in malloc): run one until it returns to its own code.
        let threads: Vec<Tid> = tracer.threads().collect();
        for tid in threads {
            let Some(back) = self.return_into_user_code(tracer, tid) else {
                continue;
            };
            if tracer.run_thread_to(tid, back, Duration::from_secs(2))? {
                return Ok(tid);
            }
        }
        Err(Error::NoSafeThread(self.target.pid))
    }

    /// The innermost return address on `tid`'s stack that leads back into
    /// code outside libc, the dynamic loader and weft's runtime: a word in
    /// such a module's executable mapping right after a `call`. The thread
    /// is there once it has returned from the C library.
    pub(super) fn return_into_user_code(&self, tracer: &Tracer, tid: Tid) -> Option<u64> {
        const SCAN: u64 = 64 * 1024;
        let rsp = tracer.registers(tid).ok()?.rsp & !7;
        let maps = crate::inspect::read_maps(self.target.pid).ok()?;
        let stack = maps.iter().find(|m| m.start <= rsp && rsp < m.end)?;
        let words = tracer
            .memory()
            .read_vec(rsp, (stack.end - rsp).min(SCAN) as usize)
            .ok()?;
        words.chunks_exact(8).find_map(|w| {
            let at = u64::from_le_bytes(w.try_into().ok()?);
            let module = self.image.module_of(at)?;
            let name = module.name();
            if name.starts_with("libc.so")
                || name.starts_with("ld-linux")
                || name.contains(runtime::MEMFD_NAME)
                || !module.is_executable_address(at)
            {
                return None;
            }
            let before = tracer.memory().read_vec(at.checked_sub(7)?, 7).ok()?;
            // call rel32 (e8), or call r/m64 (ff /2) of 2 to 7 bytes.
            let is_call = before[2] == 0xe8
                || (2..=7).any(|k| before[7 - k] == 0xff && (before[8 - k] >> 3) & 7 == 2);
            is_call.then_some(at)
        })
    }

    /// Safe: a thread blocked in a system call made outside the dynamic
    /// loader, other than those the allocator or `fork` make while holding
    /// their locks; else a thread running code outside libc and the loader.
    pub(super) fn safe_call_thread(&self, tracer: &Tracer) -> Result<Option<Tid>, Error> {
        // mmap, mprotect, munmap, brk, mremap, madvise (malloc holds an arena
        // lock around them), clone, clone3 (fork holds every arena lock and
        // the loader's).
        const LOCKED_SYSCALLS: [i64; 8] = [
            libc::SYS_mmap,
            libc::SYS_mprotect,
            libc::SYS_munmap,
            libc::SYS_brk,
            libc::SYS_mremap,
            libc::SYS_madvise,
            libc::SYS_clone,
            libc::SYS_clone3,
        ];
        let mut outside = None;
        let mut alive = false;
        for tid in tracer.threads() {
            let Ok(regs) = tracer.registers(tid) else {
                continue;
            };
            alive = true;
            let module = self.image.module_of(regs.rip);
            let in_loader = module.is_some_and(|m| m.name().starts_with("ld-linux"));
            let in_libc = module.is_some_and(|m| m.name().starts_with("libc.so"));
            let syscall = regs.orig_rax as i64;
            if syscall >= 0 {
                if !in_loader && !LOCKED_SYSCALLS.contains(&syscall) {
                    return Ok(Some(tid));
                }
            } else if !in_libc && !in_loader {
                outside.get_or_insert(tid);
            }
        }
        if !alive {
            return Err(Error::Trace(TraceError::NoSuchProcess(self.target.pid)));
        }
        Ok(outside)
    }

    /// Moves every thread stopped inside the bytes of a patch just written
    /// to the equivalent place of its trampoline (as Dyninst and Frida do),
    /// instead of letting the world run until none is there, which a hot
    /// function under many threads may never give. A thread at an
    /// instruction boundary goes on at that instruction's copy; one stopped
    /// in a system call whose restart steps back over a displaced `syscall`
    /// goes on after its copy, so that the restart lands on the copy.
    /// Returns how many threads moved.
    pub(super) fn move_threads_out(
        &mut self,
        tracer: &mut Tracer,
        moves: &[Resume],
    ) -> Result<usize, Error> {
        if moves.is_empty() {
            return Ok(0);
        }
        let mut sorted = moves.to_vec();
        sorted.sort_unstable_by_key(|m| m.at);
        let find = |pc: u64| {
            let k = sorted.partition_point(|m| m.at <= pc);
            sorted[..k].last().filter(|m| m.at == pc).copied()
        };
        let mut moved = 0;
        for tid in tracer.threads().collect::<Vec<_>>() {
            let Ok(mut regs) = tracer.registers(tid) else {
                continue; // gone
            };
            // Stopped in a system call made by a displaced 2-byte
            // `syscall`: after its copy (a restart steps back onto it).
            let in_syscall = regs.orig_rax as i64 >= 0;
            let target = in_syscall
                .then(|| find(regs.rip.wrapping_sub(2)))
                .flatten()
                .filter(|m| m.len == 2)
                .map(|m| m.copy + 2)
                .or_else(|| find(regs.rip).filter(|m| !m.first).map(|m| m.resume));
            if let Some(rip) = target {
                self.pending.moved.push((tid, regs.rip));
                regs.rip = rip;
                tracer.set_registers(tid, &regs)?;
                moved += 1;
            }
        }
        self.target.threads_moved += moved as u64;
        Ok(moved)
    }

    /// Stops the world with no thread at a PC for which `inside` holds,
    /// letting it run a little between attempts.
    pub(super) fn wait_until_outside(
        &mut self,
        tracer: &mut Tracer,
        inside: impl Fn(u64) -> bool,
        what: &str,
    ) -> Result<(), Error> {
        self.try_to_get_outside(tracer, inside, what, MOVE_ON_ATTEMPTS, true)
    }

    /// [`Process::wait_until_outside`] for code that only *prefers* no
    /// thread inside (a trampoline whose patch is gone: threads in it finish
    /// it normally): a few attempts, then on regardless. Many threads
    /// spinning through a hot function may never all be out at once.
    pub(super) fn prefer_outside(
        &mut self,
        tracer: &mut Tracer,
        inside: impl Fn(u64) -> bool,
    ) -> Result<(), Error> {
        self.try_to_get_outside(tracer, inside, "", 5, false)
    }

    pub(super) fn try_to_get_outside(
        &self,
        tracer: &mut Tracer,
        inside: impl Fn(u64) -> bool,
        what: &str,
        attempts: u32,
        required: bool,
    ) -> Result<(), Error> {
        for attempt in 0..=attempts {
            let mut blocked = None;
            for tid in tracer.threads().collect::<Vec<_>>() {
                let Ok(regs) = tracer.registers(tid) else {
                    continue;
                };
                // A thread stopped in a system call restarts it by moving
                // back over the 2-byte `syscall` instruction.
                let restart = (regs.orig_rax as i64 >= 0).then(|| regs.rip.wrapping_sub(2));
                if inside(regs.rip) || restart.is_some_and(&inside) {
                    blocked = Some(tid);
                    break;
                }
            }
            let Some(tid) = blocked else { return Ok(()) };
            if attempt == attempts {
                if !required {
                    return Ok(());
                }
                return Err(Error::ThreadStuck {
                    tid,
                    what: what.to_string(),
                });
            }
            tracer.resume_all()?;
            std::thread::sleep(Duration::from_millis(1 + attempt as u64));
            tracer.stop_all()?;
        }
        Ok(())
    }

    /// Detaches `tracer` ([`Held::release`]): the process runs on, probes
    /// keep counting, weft is no longer attached (its signals, clones and
    /// exits never wait for weft).
    pub(super) fn let_go(&mut self, tracer: &mut Tracer) -> Result<(), Error> {
        // A session ending (nothing of its own in place) gives back the
        // CPU clocks it paused.
        if !self.probes.iter().any(|p| p.active) {
            self.resume_cpu_clocks();
        }
        // The last session out lets go of the threads' perf events (a
        // failure leaves them as they were: working, and costly; the
        // target's maps still show them).
        self.target.clocks_released += self.release_cpu_clocks_if_last(tracer).unwrap_or(0);
        self.target.stops_before += tracer.stop_count();
        self.target.stops_given_up += tracer.stops_given_up();
        let detached = tracer.detach();
        self.target.longest_stop = self.target.longest_stop.max(tracer.longest_stop_time());
        // Normal priority again, whatever happened.
        self.target.boost = None;
        // A session with nothing in place gives its slot back: its acks
        // then hold no row, and the slot is free for another weft.
        if !self.probes.iter().any(|p| p.active) {
            if let (Some(slot), Some(rt)) = (self.session.slot.take(), &self.runtime) {
                crate::ledger::leave(&rt.region, slot);
            }
        }
        detached?;
        self.target.ever_released = true;
        Ok(())
    }

    /// Attaches (again) and stops every thread, for as long as the
    /// returned [`Held`] lives: everything that changes the target's code
    /// or needs its threads stopped is a method of [`Held`]. It ends with
    /// [`Held::release`], or when the `Held` is dropped (which releases,
    /// errors ignored): weft never leaves the target stopped.
    ///
    /// A launched program's first hold is the stop at its entry
    /// ([`Process::launch`]). When another weft holds the process, waits up
    /// to 3 s for it to let go ([`Error::HeldByOtherWeft`]).
    pub fn hold(&mut self) -> Result<Held<'_>, Error> {
        if let Some(tracer) = self.target.entry_stop.take() {
            return Ok(Held::new(self, tracer));
        }
        if self.target.boost.is_none() {
            self.target.boost = RealtimeGuard::raise();
        }
        self.target.longest_stop = StopTime::default();
        // While the target still runs: what an insertion of the functions
        // `prepare` planned would otherwise build in the pause, and the
        // wall clock a first load of the runtime hands over.
        self.stage_prepared();
        if self.runtime.is_none() {
            runtime::settle_wall_clock();
            runtime::look_up_symbols(&mut self.image);
        }
        let attached = preflight(self.target.pid).and_then(|()| self.attach_waiting_for_weft());
        let tracer = match attached {
            Ok(tracer) => tracer,
            Err(e) => {
                self.target.boost = None;
                return Err(e);
            }
        };
        if self.target.threads_at_attach == 0 {
            self.target.threads_at_attach = tracer.thread_count();
        }
        Ok(Held::new(self, tracer))
    }

    /// Seizes the process; when another weft holds it (only one tracer
    /// can), waits for that one's change to end — a weft holds a process
    /// for milliseconds at a time — rather than proceed blind, and says so
    /// if it does not let go within [`WAIT_FOR_OTHER_WEFT`]. Any other
    /// tracer (a debugger, strace) is an error at once.
    pub(super) fn attach_waiting_for_weft(&self) -> Result<Tracer, Error> {
        let since = Instant::now();
        loop {
            match Tracer::attach(self.target.pid) {
                Err(TraceError::AlreadyTraced { pid, tracer })
                    if self.is_weft_session(tracer as u32) =>
                {
                    if since.elapsed() >= WAIT_FOR_OTHER_WEFT {
                        return Err(Error::HeldByOtherWeft {
                            pid,
                            weft: tracer,
                            waited: since.elapsed(),
                        });
                    }
                    // (Sleeping: weft may run at real-time priority here.)
                    std::thread::sleep(Duration::from_millis(2));
                }
                other => return Ok(other?),
            }
        }
    }

    /// Whether `pid` is a weft: named so, or in the target's session table.
    pub(super) fn is_weft_session(&self, pid: u32) -> bool {
        let named = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|comm| comm.trim_end() == "weft");
        let registered = self.runtime.as_ref().is_some_and(|rt| {
            rt.region
                .header()
                .sessions
                .iter()
                .any(|s| s.pid.load(std::sync::atomic::Ordering::Acquire) == pid)
        });
        named || registered
    }
}
