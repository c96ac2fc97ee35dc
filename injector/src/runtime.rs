//! Loading `weft-rt` into the target and opening its shared region.
//!
//! The runtime's bytes are embedded in weft ([`crate::RT`], or the file named
//! by `WEFT_RT`). They are written into a memfd created *inside the target*
//! (a remote `memfd_create`) and loaded with a remote
//! `dlopen("/proc/self/fd/N")`: no file is ever written to disk, so there is
//! nothing to race on or clean up, and it works whatever user the target
//! runs as. A runtime already loaded by an earlier attach is found by its
//! mapping name and reused.

use crate::inspect::ProcessImage;
use crate::ptrace::{RemoteArg, RemoteCall, RemoteError, Tid, Tracer, World};
use crate::region::{Region, RegionError};
use object::{Object, ObjectSymbol};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use weft_rt::clock::{WallClock, WallPreference};
use weft_rt::layout::{Geometry, MAX_METRIC_WORDS};

/// The memfd name, which shows in `/proc/PID/maps` as `/memfd:weft-rt (deleted)`.
/// Name of the memfd the runtime library is loaded from.
pub const MEMFD_NAME: &str = "weft-rt";

/// What went wrong loading the runtime.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A remote call failed.
    #[error(transparent)]
    Remote(#[from] RemoteError),
    /// The target has no glibc function weft needs.
    #[error("the target has no `{0}` in its C library: weft needs a glibc-based, dynamically linked target")]
    MissingSymbol(&'static str),
    /// The target's `dlopen` failed.
    #[error("the target's dlopen could not load weft's runtime: {0}")]
    Dlopen(String),
    /// A remote libc call returned an error.
    #[error("{call} failed in the target: {error}")]
    Call {
        /// The call.
        call: &'static str,
        /// errno as text.
        error: std::io::Error,
    },
    /// The runtime file named by WEFT_RT could not be read, or is broken.
    #[error("weft runtime library {path}: {why}")]
    Library {
        /// The file.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// Writing the runtime into the target's memfd failed.
    #[error("cannot write weft's runtime into the target's memfd /proc/{pid}/fd/{fd}: {source}")]
    Write {
        /// The target.
        pid: i32,
        /// The memfd.
        fd: i32,
        /// What failed.
        source: std::io::Error,
    },
    /// The target is a forked child of an instrumented process whose
    /// runtime could not make a region of its own at the fork: its only
    /// figures are a private copy of its parent's.
    #[error("process {pid} was forked from an instrumented process and its runtime could not take a region of its own (a memfd or a mapping failed in the child): weft cannot measure it; attach to its parent, or restart it")]
    ForkedCopy {
        /// The target.
        pid: i32,
    },
    /// The target has a weft runtime of another build loaded (an older or
    /// newer weft attached before): its code and its region's layout may
    /// differ from what this weft would call and read.
    #[error("process {pid} has the weft runtime of another weft build loaded: restart the target to load this weft's runtime, or use the weft that loaded it")]
    OtherBuild {
        /// The target.
        pid: i32,
    },
    /// The shared region could not be mapped.
    #[error(transparent)]
    Region(#[from] RegionError),
    /// No region fits the target's address space.
    #[error(transparent)]
    Placement(#[from] crate::placement::PlacementError),
    /// Inspecting the target failed.
    #[error(transparent)]
    Inspect(#[from] crate::inspect::InspectError),
}

/// The runtime library's bytes: `$WEFT_RT` when set, else the embedded copy.
pub fn runtime_bytes() -> Result<std::borrow::Cow<'static, [u8]>, RuntimeError> {
    match std::env::var_os("WEFT_RT") {
        // A Vec<u8> from the system allocator is 16-byte aligned in practice;
        // ELF parsing re-checks and reports a clear error otherwise.
        Some(path) => std::fs::read(&path)
            .map(Into::into)
            .map_err(|e| RuntimeError::Library {
                path: path.to_string_lossy().into_owned(),
                why: format!(
                    "cannot read it ({e}); unset WEFT_RT to use the runtime built into weft"
                ),
            }),
        None => Ok(crate::RT.into()),
    }
}

/// A runtime loaded in the target, with its region mapped here.
#[derive(Debug)]
pub struct Runtime {
    /// Load address of the runtime library in the target.
    pub base: u64,
    /// Our read-only view of the region.
    pub region: Region,
    /// What this load put in the target, when it loaded the runtime (not
    /// an earlier session): what [`unload`] takes out.
    pub loaded: Option<Loaded>,
}

/// The target's handles on a runtime one session loaded.
#[derive(Debug, Clone, Copy)]
pub struct Loaded {
    /// `dlopen`'s handle.
    pub handle: u64,
    /// The descriptor of the memfd the library was loaded from.
    pub library_fd: i32,
    /// The descriptor of the region's memfd.
    pub region_fd: i32,
}

/// Geometry asked of the runtime.
#[derive(Clone, Copy, Debug)]
pub struct RuntimeOptions {
    /// Threads with their own row, at least: a process that has more
    /// threads gets twice as many rows as it has threads.
    pub max_threads: u32,
    /// Metric words per row, at most: fewer under the target's
    /// address-space limit (`ulimit -v`).
    pub metric_words: u32,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            max_threads: crate::placement::MIN_ROWS,
            metric_words: MAX_METRIC_WORDS,
        }
    }
}

/// weft's wall clock, handed to the runtime's first `weft_rt_init`: the
/// TSC's rate is the machine's, so weft measures it (a 10 ms sleep) while
/// the target runs instead of the runtime measuring it in the pause.
static WALL_CLOCK: OnceLock<WallClock> = OnceLock::new();
/// Set once [`warm_up`] has a thread computing [`WALL_CLOCK`].
static WALL_CLOCK_STARTED: AtomicBool = AtomicBool::new(false);

/// weft's wall clock (measuring it now, 10 ms, if no one has yet).
pub fn wall_clock() -> WallClock {
    *WALL_CLOCK.get_or_init(|| WallClock::new(WallPreference::Auto))
}

/// Waits for the wall clock [`warm_up`] is measuring, if it is: called
/// before the world is stopped, so that loading the runtime never waits
/// for it in the pause.
pub fn settle_wall_clock() {
    if WALL_CLOCK_STARTED.load(Ordering::Acquire) {
        wall_clock();
    }
}

/// Does, on a short-lived real-time thread of weft's own, what would
/// otherwise cost the target's pause, and returns at once:
///
/// * The code generator's first use initialises its encoder tables (0.8 ms
///   here); every remote-call stub and trampoline needs it.
/// * With `first_load` (the runtime is not in the target yet): measuring
///   the wall clock the runtime will take ([`wall_clock`], a 10 ms
///   sleep), and opening a perf event. The first task-bound perf event on
///   a machine turns on the scheduler's perf hooks and waits for an RCU
///   grace period (12 ms on the reference machine); they stay on while any
///   such event exists and for a second after the last one closes. The
///   target's threads open one each when they first run a CPU timer:
///   with the hooks on, that is cheap.
pub fn warm_up(first_load: bool) {
    extern "C" fn warm(perf_events: *mut libc::c_void) -> *mut libc::c_void {
        // SAFETY: blocks every signal in this thread only, so that it
        // never takes the SIGCHLD the tracing thread sleeps on.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
        }
        // Pure computation, for its side effect on the encoder's tables.
        let _ = weft_codegen::bootstrap_stub(0x1000_0000);
        if !perf_events.is_null() {
            // type = PERF_TYPE_SOFTWARE, size = 64 (PERF_ATTR_SIZE_VER0),
            // config = PERF_COUNT_SW_TASK_CLOCK; flags: disabled,
            // exclude_kernel, exclude_hv (bits 0, 5, 6).
            let mut attr = [0u64; 8];
            attr[0] = 1 | (64 << 32);
            attr[1] = 1;
            attr[5] = 1 | (1 << 5) | (1 << 6);
            const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
            // SAFETY: a valid 64-byte attribute block, this thread, any
            // CPU; the descriptor returned is closed at once.
            unsafe {
                let fd = libc::syscall(
                    libc::SYS_perf_event_open,
                    attr.as_ptr(),
                    0,
                    -1,
                    -1,
                    PERF_FLAG_FD_CLOEXEC,
                );
                if fd >= 0 {
                    libc::close(fd as i32);
                }
            }
            wall_clock();
        }
        std::ptr::null_mut()
    }
    // Any non-null pointer says "first load"; the thread never reads it.
    let arg = if first_load {
        std::ptr::NonNull::<libc::c_void>::dangling().as_ptr()
    } else {
        std::ptr::null_mut()
    };
    // SAFETY: a detached thread running a function that touches nothing of
    // ours; the attribute object is initialised, used and destroyed here.
    // Real-time (set by pthread_create before it first runs): at normal
    // priority a busy target would keep it from running until long after
    // it could help. It computes for a millisecond and sleeps in the
    // kernel, never spins. A thread that cannot be created (or made
    // real-time) only leaves the attach slower.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_attr_init(&mut attr) != 0 {
            return;
        }
        let fifo = libc::sched_param { sched_priority: 1 };
        let realtime = libc::pthread_attr_setinheritsched(&mut attr, libc::PTHREAD_EXPLICIT_SCHED)
            == 0
            && libc::pthread_attr_setschedpolicy(&mut attr, libc::SCHED_FIFO) == 0
            && libc::pthread_attr_setschedparam(&mut attr, &fifo) == 0;
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        libc::pthread_attr_setstacksize(&mut attr, 256 * 1024);
        let mut thread: libc::pthread_t = 0;
        let mut created = libc::pthread_create(&mut thread, &attr, warm, arg) == 0;
        if !created && realtime {
            // Not permitted to be real-time: try at normal priority.
            libc::pthread_attr_setinheritsched(&mut attr, libc::PTHREAD_INHERIT_SCHED);
            created = libc::pthread_create(&mut thread, &attr, warm, arg) == 0;
        }
        libc::pthread_attr_destroy(&mut attr);
        if created && first_load {
            WALL_CLOCK_STARTED.store(true, Ordering::Release);
        }
    }
}

/// Whether the runtime is loaded in process `pid` (a mapping of its memfd
/// in `/proc/PID/maps`); false when that cannot be read.
pub fn is_loaded(pid: i32) -> bool {
    let wanted = format!("/memfd:{MEMFD_NAME}");
    std::fs::read_to_string(crate::inspect::procfs::pid_file(pid, "maps"))
        .is_ok_and(|maps| maps.lines().any(|l| l.contains(&wanted)))
}

/// Load address of an already loaded runtime: the offset-0 mapping of the
/// memfd it was loaded from (its first PT_LOAD has vaddr 0).
fn runtime_module_base(image: &mut ProcessImage) -> Result<Option<u64>, RuntimeError> {
    image.refresh()?;
    let wanted = format!("/memfd:{MEMFD_NAME}");
    Ok(image
        .maps()
        .iter()
        .find(|m| {
            m.offset == 0
                && m.path
                    .file()
                    .is_some_and(|p| p.to_string_lossy().starts_with(&wanted))
        })
        .map(|m| m.start))
}

/// Looks up, while the target still runs, the C library's functions a
/// first load calls: the lookup parses the library (and its debug file)
/// once, which would otherwise happen in the stop.
pub fn look_up_symbols(image: &mut ProcessImage) {
    for name in [
        "memfd_create",
        "close",
        "dlopen",
        "__libc_dlopen_mode",
        "dlerror",
        "__errno_location",
        "mmap",
    ] {
        let _ = libc_symbol(image, name);
    }
}

fn libc_symbol(image: &mut ProcessImage, name: &'static str) -> Option<u64> {
    image.symbol_address("libc.so", name)
}

fn negative_errno(call: &'static str, value: u64) -> Result<u64, RuntimeError> {
    let signed = value as i64;
    if (-4095..0).contains(&signed) {
        Err(RuntimeError::Call {
            call,
            error: std::io::Error::from_raw_os_error(-signed as i32),
        })
    } else {
        Ok(value)
    }
}

/// Loads (or finds) the runtime in the target and starts a session whose
/// first `reset_words` metric words are zeroed. The world must be stopped.
/// Every remote call runs with the other threads stopped but `dlopen`,
/// which takes the loader's and malloc's locks (a stopped thread may hold
/// one): `dlopen_world` says what the others do meanwhile
/// ([`World::WhenWaiting`]: run while it waits in a system call;
/// [`World::Running`]: run all along). The others are bare system calls
/// or the runtime's own code.
pub fn load(
    tracer: &mut Tracer,
    image: &mut ProcessImage,
    tid: Tid,
    options: RuntimeOptions,
    reset_words: u32,
    dlopen_world: World,
) -> Result<Runtime, RuntimeError> {
    let bytes = runtime_bytes()?;
    let init_offset = symbol_offset(&bytes, "weft_rt_init")?;
    let pid = tracer.pid();

    // A runtime loaded by an earlier session has its clock and its region
    // already.
    let mut wall = None;
    let mut placement = None;
    let mut loaded = None;
    let base = match runtime_module_base(image)? {
        Some(base) => {
            same_build(pid, base, &bytes)?;
            base
        }
        None => {
            // Decided before anything changes in the target: a region that
            // cannot fit refuses the attach with nothing to undo.
            let maps = crate::inspect::read_maps(pid)?;
            placement = Some(crate::placement::place(
                Geometry {
                    max_rows: options.max_threads,
                    metric_words: options.metric_words,
                },
                crate::placement::AddressSpace::of(pid, tracer.thread_count()),
                &maps,
            )?);
            wall = Some(wall_clock());
            let memfd_create = libc_symbol(image, "memfd_create")
                .ok_or(RuntimeError::MissingSymbol("memfd_create"))?;
            let close = libc_symbol(image, "close").ok_or(RuntimeError::MissingSymbol("close"))?;

            let name = format!("{MEMFD_NAME}\0").into_bytes();
            let fd = tracer.call(
                tid,
                &RemoteCall::new(
                    "memfd_create",
                    memfd_create,
                    vec![
                        RemoteArg::Bytes(name),
                        RemoteArg::Value(libc::MFD_CLOEXEC as u64),
                    ],
                ),
                // A bare system call: no lock another thread could hold.
                false,
            )?;
            let fd = negative_errno_libc(tracer, image, tid, "memfd_create", fd)? as i32;
            let written = std::fs::OpenOptions::new()
                .write(true)
                .open(crate::inspect::procfs::fd_file(pid, fd))
                .and_then(|mut f| f.write_all(&bytes));
            // The path the loader records for the library (its link_map
            // name) is what debuggers open to read its symbols. Not
            // /proc/self/...: in gdb's process that names one of gdb's own
            // descriptors (gdb hangs reading its own pipe). The PID as the
            // target sees it, and the descriptor stays open, so the path
            // keeps naming the library.
            let own_pid = crate::inspect::procfs::own_view_pid(pid).unwrap_or(pid);
            let handle = match written {
                // It takes the loader's and malloc's locks, which a stopped
                // thread may hold: the others run whenever it waits.
                Ok(()) => crate::library::call_dlopen(
                    tracer,
                    image,
                    tid,
                    format!("{}\0", crate::inspect::procfs::fd_file(own_pid, fd)).into_bytes(),
                    dlopen_world,
                ),
                Err(_) => Ok(Some(Ok(0))),
            };
            // Kept open when loaded: debuggers read the library through it.
            if written.is_err() || !matches!(handle, Ok(Some(Ok(h))) if h != 0) {
                let _ = tracer.call(
                    tid,
                    &RemoteCall::new("close", close, vec![RemoteArg::Value(fd as u64)]),
                    false,
                );
            }
            if let Err(source) = written {
                return Err(RuntimeError::Write { pid, fd, source });
            }
            match handle? {
                Some(Ok(h)) => loaded = Some((h, fd)),
                Some(Err(message)) => return Err(RuntimeError::Dlopen(message)),
                None => return Err(RuntimeError::MissingSymbol("dlopen")),
            }
            runtime_module_base(image)?.ok_or_else(|| {
                RuntimeError::Dlopen("dlopen succeeded but the library is not mapped".into())
            })?
        }
    };

    // Only system calls and the runtime's own memory: no lock, so the
    // others may stay stopped. A runtime this call just loaded is code no
    // other thread can be in yet: when the caller wants the others to run
    // through the load, they run through its start too.
    let init_world = match (wall, dlopen_world) {
        (Some(_), World::Running) => World::Running,
        _ => World::Stopped,
    };
    let init = tracer.call_in(
        tid,
        &RemoteCall::new(
            "weft_rt_init",
            base + init_offset,
            vec![
                RemoteArg::Value(placement.map_or(1, |p| p.geometry.max_rows) as u64),
                RemoteArg::Value(placement.map_or(1, |p| p.geometry.metric_words) as u64),
                RemoteArg::Value(reset_words as u64),
                match wall {
                    Some(wall) => RemoteArg::Bytes(wall.to_bytes().to_vec()),
                    None => RemoteArg::Value(0),
                },
                RemoteArg::Value(placement.map_or(0, |p| p.at)),
            ],
        ),
        init_world,
    )?;
    if init as i64 == -i64::from(libc::EXDEV) {
        return Err(RuntimeError::ForkedCopy { pid });
    }
    let region_fd = negative_errno("weft_rt_init", init)? as i32;
    let region = Region::open(pid, region_fd)?;
    Ok(Runtime {
        base,
        region,
        loaded: loaded.map(|(handle, library_fd)| Loaded {
            handle,
            library_fd,
            region_fd,
        }),
    })
}

/// Takes a runtime this session loaded back out of the target (after its
/// first change failed, so that a failed attach leaves nothing behind):
/// `dlclose`, then, once the library is really gone, the region's mapping
/// and both descriptors. Only while no thread has run the runtime's code
/// (no row taken: `rows_used` is 0) and no probe is in; the caller checks.
/// Returns whether the library went: glibc keeps one whose thread-local
/// destructors are pending, and then the region stays with it (as after a
/// detach).
pub fn unload(
    tracer: &mut Tracer,
    image: &mut ProcessImage,
    tid: Tid,
    loaded: Loaded,
    world: World,
) -> Result<bool, RuntimeError> {
    let dlclose = libc_symbol(image, "dlclose").ok_or(RuntimeError::MissingSymbol("dlclose"))?;
    let close = libc_symbol(image, "close").ok_or(RuntimeError::MissingSymbol("close"))?;
    let munmap = libc_symbol(image, "munmap").ok_or(RuntimeError::MissingSymbol("munmap"))?;
    // The loader's lock, which a stopped thread may hold: as dlopen.
    tracer.call_in(
        tid,
        &RemoteCall::new("dlclose", dlclose, vec![RemoteArg::Value(loaded.handle)]),
        world,
    )?;
    if runtime_module_base(image)?.is_some() {
        return Ok(false);
    }
    let name = weft_rt::layout::REGION_MEMFD_NAME
        .to_str()
        .unwrap_or("weft-shm");
    let region = format!("/memfd:{name}");
    let mappings: Vec<(u64, u64)> = image
        .maps()
        .iter()
        .filter(|m| {
            m.path
                .file()
                .is_some_and(|p| p.to_string_lossy().starts_with(&region))
        })
        .map(|m| (m.start, m.end - m.start))
        .collect();
    for (start, len) in mappings {
        tracer.call(
            tid,
            &RemoteCall::new(
                "munmap",
                munmap,
                vec![RemoteArg::Value(start), RemoteArg::Value(len)],
            ),
            false,
        )?;
    }
    for fd in [loaded.region_fd, loaded.library_fd] {
        tracer.call(
            tid,
            &RemoteCall::new("close", close, vec![RemoteArg::Value(fd as u64)]),
            false,
        )?;
    }
    Ok(true)
}

/// Checks that the runtime loaded at `base` is `bytes` before anything
/// calls into it: `weft_rt_init`'s offset comes from `bytes`, and the
/// region's layout (`layout::VERSION`) is only checked after that call. The
/// first page (ELF header, program headers, the build-id note, the start of
/// the dynamic symbols) differs between any two builds.
fn same_build(pid: i32, base: u64, bytes: &[u8]) -> Result<(), RuntimeError> {
    let len = bytes.len().min(4096);
    let loaded = crate::memory::ProcessMemory::open_read_only(pid)
        .and_then(|m| m.read_vec(base, len))
        .map_err(|_| RuntimeError::OtherBuild { pid })?;
    if loaded != bytes[..len] {
        return Err(RuntimeError::OtherBuild { pid });
    }
    Ok(())
}

/// libc functions return -1 and set errno; read errno with a second call
/// (`__errno_location`) when that happens.
fn negative_errno_libc(
    tracer: &mut Tracer,
    image: &mut ProcessImage,
    tid: Tid,
    call: &'static str,
    value: u64,
) -> Result<u64, RuntimeError> {
    if value as i64 != -1 {
        return Ok(value);
    }
    let errno = match libc_symbol(image, "__errno_location") {
        Some(f) => {
            let at = tracer.call(tid, &RemoteCall::new("__errno_location", f, vec![]), false)?;
            let mut buf = [0u8; 4];
            tracer
                .memory()
                .read(at, &mut buf)
                .map(|_| i32::from_le_bytes(buf))
                .unwrap_or(libc::EIO)
        }
        None => libc::EIO,
    };
    Err(RuntimeError::Call {
        call,
        error: std::io::Error::from_raw_os_error(errno),
    })
}

/// Address in the target of the runtime's export `name`, the runtime being
/// loaded at `base`.
pub fn export_address(base: u64, name: &str) -> Result<u64, RuntimeError> {
    Ok(base + symbol_offset(&runtime_bytes()?, name)?)
}

/// Offset of an exported function in the runtime library.
fn symbol_offset(bytes: &[u8], name: &str) -> Result<u64, RuntimeError> {
    let broken = |why: String| RuntimeError::Library {
        path: "(runtime)".into(),
        why,
    };
    let file = object::File::parse(bytes)
        .map_err(|e| broken(format!("not a valid ELF shared library: {e}")))?;
    file.dynamic_symbols()
        .find(|s| s.name() == Ok(name) && s.is_definition())
        .map(|s| s.address())
        .ok_or_else(|| broken(format!("does not export {name}: is it weft's runtime?")))
}

#[cfg(test)]
mod tests {
    use object::{Object, ObjectSymbol};

    /// The runtime lives in other people's processes: it exports exactly
    /// its documented entry points (docs/security.md), nothing else that
    /// could collide with or be called by the target's own symbols.
    #[test]
    fn runtime_exports_only_its_documented_symbols() {
        let bytes = super::runtime_bytes().unwrap();
        let file = object::File::parse(&*bytes).unwrap();
        let mut exported: Vec<String> = file
            .dynamic_symbols()
            .filter(|s| s.is_definition() && s.is_global())
            .filter_map(|s| s.name().ok().map(str::to_string))
            .collect();
        exported.sort();
        assert_eq!(
            exported,
            [
                "weft_rt_cpu_table_fd",
                "weft_rt_enable_exits",
                "weft_rt_init",
                "weft_rt_map_cpu_table",
                "weft_rt_personality",
                "weft_rt_register_thread",
                "weft_rt_release_cpu_clocks",
                "weft_rt_tls_offset",
            ]
        );
    }
}
