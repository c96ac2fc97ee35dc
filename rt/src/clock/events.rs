//! A clock's perf event over its life: let go by the last session out
//! (`weft_rt_release_cpu_clocks`, every thread stopped) or by its owner
//! at the injector's request (a diagnosis choosing clocks thread by
//! thread), and made again by its owner when a CPU timer asks for one. The
//! assembly reader does the owner's part in `readers.rs` too.

use super::*;

impl ThreadCpuClock {
    /// Lets the perf event go, for good: the clock reads a system call
    /// from now on, and its page becomes a private zero page (freed with
    /// the clock at thread exit). Another thread may do this while the
    /// owner is stopped (the injector stops them all): the owner's readers
    /// check the anchor's age against `max_age_tsc` (now 0) before they
    /// touch the page, so they take the slow path, which reads `mode`
    /// (now syscall); one caught between those loads reads the zero page,
    /// whose `lock` differs from `anchor_lock`: the slow path again, never
    /// a fault (one caught right after its comparison finishes that one
    /// reading with the old anchor). Returns whether the event was let go.
    ///
    /// # Safety
    ///
    /// The owning thread must not be running, and `page` must be this
    /// clock's perf mapping (the injector checks the process's maps: in a
    /// forked child, rows of the parent's other threads hold pages the
    /// child does not have).
    pub unsafe fn release_event(&mut self) -> bool {
        if self.page.is_null() || self.mode == CPU_SYSCALL {
            return false;
        }
        self.max_age_tsc = 0;
        self.anchor_lock = LOCK_INVALID;
        self.mode = CPU_SYSCALL;
        compiler_fence(Ordering::SeqCst);
        if self.why == WHY_CPU_ON_TABLE {
            // No event: the slot goes back; the table itself goes when
            // every clock is off it (`release_table`).
            self.leave_table_slot();
            self.why = WHY_CPU_RELEASED;
            return true;
        }
        // SAFETY: `page` is our perf mapping (the caller's promise), one
        // page long; a private anonymous page replaces it in one step, so
        // a reader never finds the address unmapped. The last reference to
        // the event goes with the old mapping (its fd is closed below, or
        // was already).
        let replaced = unsafe {
            libc::mmap(
                self.page as *mut libc::c_void,
                page_size(),
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if replaced == libc::MAP_FAILED {
            // The event stays (and costs its switches); the clock still
            // reads the system call, which is right.
            self.why = WHY_CPU_RELEASED;
            return false;
        }
        if self.fd >= 0 {
            // SAFETY: the fd is this clock's (see close_fd).
            unsafe { libc::close(self.fd) };
            self.fd = -1;
        }
        self.owns_page = 1;
        self.why = WHY_CPU_RELEASED;
        true
    }

    /// Asks the clock for a perf event: its owner makes one at its next
    /// read (see `ThreadCpuClock::arm_self`). What the injector writes
    /// into a row's clock, through the region, for a thread that reads a
    /// system call for want of an event when a CPU timer is installed
    /// again; here for tests.
    pub fn ask_for_event(&mut self) {
        if self.mode == CPU_SYSCALL && (self.why == WHY_CPU_RELEASED || self.why == WHY_CPU_UNASKED)
        {
            self.why = WHY_CPU_ARM_ASKED;
        }
    }

    /// Asks the clock to let its perf event go at its owner's next read
    /// ([`WHY_CPU_DROP_ASKED`], then a zero age limit): what the injector
    /// writes into a row's clock, through the region, for a thread whose
    /// switches cost more with the event than its readings cost without
    /// it; here for tests. Only a clock with an event of its own is asked.
    pub fn ask_to_drop_event(&mut self) {
        if (self.mode == CPU_ANCHOR || self.mode == CPU_PERF_TIME)
            && self.why == 0
            && self.owns_page != 0
        {
            self.why = WHY_CPU_DROP_ASKED;
            compiler_fence(Ordering::SeqCst);
            self.max_age_tsc = 0;
        }
    }

    /// Gives a clock asked for an event ([`WHY_CPU_ARM_ASKED`]) one, in
    /// anchor mode, on the owner (the assembly reader does the same on
    /// its system-call path): a CPU timer is installed again, and a system
    /// call on every read costs a timed call more than the event costs.
    /// One try: on failure the clock reads the system call as before. A
    /// released clock's zero page is replaced in place. The caller
    /// re-anchors (the anchor is invalid).
    pub(super) fn arm_self(&mut self) -> bool {
        self.why = WHY_CPU_UNASKED;
        if self.mult == 0 {
            return false;
        }
        if self.take_table_slot() {
            return true;
        }
        let at = (!self.page.is_null() && self.owns_page != 0).then_some(self.page);
        let event = match PerfTaskClock::open_at(at) {
            Ok(event) => event,
            Err(_) => {
                if at.is_some() {
                    // A failed fixed mapping may have taken the old one.
                    self.page = ptr::null();
                    self.owns_page = 0;
                }
                return false;
            }
        };
        self.page = event.page;
        // SAFETY: the event's fd is ours; its mapping keeps the event.
        unsafe { libc::close(event.fd) };
        core::mem::forget(event);
        self.fd = -1;
        self.owns_page = 1;
        self.anchor_lock = LOCK_INVALID;
        self.max_age_tsc = ns_to_ticks(MAX_ANCHOR_AGE_NS, self.mult, self.shift);
        self.why = 0;
        compiler_fence(Ordering::SeqCst);
        self.mode = CPU_ANCHOR;
        true
    }
}
