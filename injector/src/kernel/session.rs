//! One target's kernel probes: resolved from patterns, loaded, attached,
//! read, and detached when dropped.

use super::btf::Btf;
use super::caps::{self, Capabilities};
use super::sys::{self, Map, ProgType, Program, TracingTarget};
use super::{KernelError, KernelPattern, Mechanism, Target, PROGRAM_PREFIX};
use std::os::fd::OwnedFd;
use weft_codegen::bpf::programs::{
    self as progs, clock, open, stats, Attribution, EntryProgram, ExitProgram, Maps, SwitchProgram,
    Trigger, MAX_SYSCALLS,
};

/// More kernel functions than this in one session is almost surely a
/// pattern too wide (`kernel:*`): each costs two programs and slows every
/// call of it machine-wide.
pub const MAX_FUNCTIONS: usize = 512;

const THREADS: u32 = 16_384;
const OPEN_SLOTS: u32 = 65_536;
const TOTALS: u32 = 65_536;

/// One kernel probe of a session, as reports name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeInfo {
    /// `vfs_read`, `do_filp_open+0x1c`, `openat`.
    pub name: String,
    /// `"kernel"` or `"syscall"`.
    pub module: &'static str,
    /// How it is attached.
    pub mechanism: Mechanism,
    /// Has wall and CPU time (an instruction probe only counts).
    pub timed: bool,
}

/// Totals of one (thread, probe, user function).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelRow {
    /// Kernel thread id.
    pub tid: u32,
    /// Index into [`KernelSnapshot::probes`].
    pub probe: u32,
    /// Row offset of the metric words of the user function the thread was
    /// innermost in at entry; 0 for none.
    pub attribution: u32,
    /// Entries.
    pub calls: u64,
    /// Inclusive wall time of the outermost activations, ns.
    pub wall_ns: u64,
    /// Time on a CPU inside, ns.
    pub cpu_ns: u64,
}

/// What a session has measured so far.
#[derive(Clone, Debug, Default)]
pub struct KernelSnapshot {
    /// The session's probes.
    pub probes: Vec<ProbeInfo>,
    /// Every non-empty total.
    pub rows: Vec<KernelRow>,
    /// CPU times are measured (the `sched_switch` program is attached).
    pub cpu: bool,
    /// Calls lost to a full totals map.
    pub lost: u64,
}

/// A target's loaded and attached kernel probes. Dropping it detaches and
/// unloads them all.
pub struct Session {
    probes: Vec<ProbeInfo>,
    clocks: Map,
    stats: Map,
    lost: Map,
    cpu: bool,
    // Order matters only for clarity: links close before programs and
    // maps, though the kernel keeps each alive while something holds it.
    _links: Vec<OwnedFd>,
    _programs: Vec<Program>,
    _maps: Vec<Map>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("probes", &self.probes)
            .field("cpu", &self.cpu)
            .finish_non_exhaustive()
    }
}

/// Resolves patterns to probes the running kernel can take.
fn resolve(
    patterns: &[KernelPattern],
    caps: &Capabilities,
    btf: Option<&Btf>,
) -> Result<Vec<(Target, Mechanism)>, KernelError> {
    if let Err(why) = &caps.privileged {
        return Err(KernelError::NotPermitted(why.clone()));
    }
    let choice = chosen_mechanism();
    let mut out: Vec<(Target, Mechanism)> = Vec::new();
    let mut kprobe_names: Option<std::collections::HashSet<String>> = None;
    let mut kprobe_ok = |name: &str| {
        caps.kprobes.is_ok()
            && kprobe_names
                .get_or_insert_with(|| caps::kprobe_candidates().into_iter().collect())
                .contains(name)
    };
    for pattern in patterns {
        let shown = pattern.to_string();
        match pattern {
            KernelPattern::Syscall(glob) => {
                if let Err(why) = &caps.syscalls {
                    return Err(KernelError::Unavailable {
                        pattern: shown,
                        why: format!("syscall tracepoints: {why}"),
                    });
                }
                let found = super::syscalls_matching(glob);
                if found.is_empty() {
                    return Err(KernelError::NoMatch {
                        pattern: shown,
                        what: "system call",
                        suggestions: crate::inspect::pattern::suggest(
                            glob.as_str(),
                            super::syscall_names(),
                        ),
                    });
                }
                for (name, number) in found {
                    out.push((
                        Target::Syscall {
                            name: name.to_string(),
                            number,
                        },
                        Mechanism::SyscallTracepoints,
                    ));
                }
            }
            KernelPattern::Instruction { function, offset } => {
                if !kprobe_ok(function) {
                    return Err(unavailable_or_missing(&shown, function, caps, true));
                }
                out.push((
                    Target::Function {
                        name: function.clone(),
                        offset: Some(*offset),
                    },
                    Mechanism::KprobeOffset,
                ));
            }
            KernelPattern::Function(glob) => {
                let names: Vec<String> = match glob.literal() {
                    Some(name) => vec![name.to_string()],
                    None => super::probeable_functions(caps)
                        .into_iter()
                        .map(|(n, _)| n)
                        .filter(|n| glob.matches(n))
                        .collect(),
                };
                if names.is_empty() {
                    return Err(unavailable_or_missing(&shown, glob.as_str(), caps, false));
                }
                for name in names {
                    let fentry = caps.fentry.is_ok()
                        && choice != Some(Mechanism::Kprobe)
                        && btf.is_some_and(|b| b.function(&name).is_some());
                    let mechanism = if fentry {
                        Mechanism::Fentry
                    } else if choice != Some(Mechanism::Fentry) && kprobe_ok(&name) {
                        Mechanism::Kprobe
                    } else {
                        return Err(unavailable_or_missing(&shown, &name, caps, false));
                    };
                    out.push((Target::Function { name, offset: None }, mechanism));
                }
            }
        }
    }
    out.dedup();
    let functions = out
        .iter()
        .filter(|(t, _)| matches!(t, Target::Function { .. }))
        .count();
    if functions > MAX_FUNCTIONS {
        return Err(KernelError::BadPattern {
            pattern: patterns
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(","),
            why: format!(
                "matches {functions} kernel functions, more than {MAX_FUNCTIONS}: every probe slows each call of its function machine-wide; narrow the pattern"
            ),
        });
    }
    Ok(out)
}

/// `WEFT_KERNEL_MECHANISM=kprobe` (or `fentry`) makes kernel functions use
/// that mechanism only: for a kernel whose BPF trampolines misbehave, and
/// for comparing the two.
fn chosen_mechanism() -> Option<Mechanism> {
    match std::env::var("WEFT_KERNEL_MECHANISM").ok()?.as_str() {
        "kprobe" => Some(Mechanism::Kprobe),
        "fentry" => Some(Mechanism::Fentry),
        _ => None,
    }
}

/// The error for a kernel function that cannot be probed: missing from
/// the kernel, or present and no mechanism available.
fn unavailable_or_missing(
    pattern: &str,
    name: &str,
    caps: &Capabilities,
    offset: bool,
) -> KernelError {
    let known = super::known_functions();
    let glob = crate::inspect::pattern::Glob::new(name).ok();
    let exists = known
        .iter()
        .any(|k| glob.as_ref().map_or(k == name, |g| g.matches(k)));
    if !exists && !known.is_empty() {
        return KernelError::NoMatch {
            pattern: pattern.to_string(),
            what: "kernel function",
            suggestions: crate::inspect::pattern::suggest(name, known.iter().map(String::as_str)),
        };
    }
    let kprobes = match &caps.kprobes {
        Ok(()) => {
            "kprobes: not in the list of traceable functions (inlined, notrace, or blacklisted)"
                .to_string()
        }
        Err(why) => format!("kprobes: {why}"),
    };
    let why = if offset {
        format!("an instruction needs kprobes; {kprobes}")
    } else {
        let fentry = match &caps.fentry {
            Ok(()) => "fentry: not described by BTF".to_string(),
            Err(why) => format!("fentry: {why}"),
        };
        format!("{fentry}; {kprobes}")
    };
    KernelError::Unavailable {
        pattern: pattern.to_string(),
        why,
    }
}

/// Checks that `patterns` resolve to probes this kernel can take, without
/// loading anything: for refusing a command before it touches its target.
pub fn check(patterns: &[KernelPattern], caps: &Capabilities) -> Result<(), KernelError> {
    resolve(patterns, caps, Btf::vmlinux().ok().as_ref()).map(drop)
}

/// Creates a map for a session; its error says what failed.
fn create_map(
    kind: u32,
    name: &str,
    key: u32,
    value: u32,
    entries: u32,
) -> Result<Map, KernelError> {
    Map::create(kind, name, key, value, entries).map_err(|source| KernelError::Map {
        what: "create",
        source,
    })
}

/// How the programs find the instrumented user function a thread is
/// innermost in: the runtime's thread-local row pointer (`tls_offset`)
/// read through the task's `fsbase` (BTF tells where); `None` without
/// either.
fn attribution(tls_offset: Option<i64>, btf: Option<&Btf>) -> Option<Attribution> {
    match (tls_offset, btf) {
        (Some(tls), Some(btf)) => {
            match (
                btf.offset_of("task_struct", &["thread", "fsbase"]),
                i32::try_from(tls),
            ) {
                (Some(task_fsbase), Ok(tls_offset)) => Some(Attribution {
                    task_fsbase,
                    tls_offset,
                    row_cells: weft_rt::layout::ROW_CELLS as i16,
                    cell_metric_from_end: (weft_codegen::CELL_METRIC
                        - weft_codegen::CELL_SIZE as i32)
                        as i16,
                }),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The error of attaching `what`.
fn attach_err(what: &str) -> impl FnOnce(std::io::Error) -> KernelError {
    let what = what.to_string();
    move |source| KernelError::Attach { what, source }
}

/// What a session has loaded and attached so far, and what its programs
/// are built with. Dropped on an error, it detaches the links, then
/// unloads the programs (fields drop in order).
struct Loader {
    tgid: u32,
    attribution: Option<Attribution>,
    maps: Maps,
    steal: Option<progs::Steal>,
    links: Vec<OwnedFd>,
    programs: Vec<Program>,
}

impl Loader {
    /// Loads a program of `kind` named for this session and `short`;
    /// `what` names it in errors.
    fn load(
        &self,
        kind: ProgType,
        short: &str,
        what: &str,
        insns: Result<Vec<weft_codegen::bpf::asm::Insn>, weft_codegen::bpf::asm::AsmError>,
        tracing: Option<TracingTarget>,
    ) -> Result<Program, KernelError> {
        let insns = insns.map_err(|e| KernelError::Load {
            what: what.to_string(),
            source: std::io::Error::other(e.to_string()),
            log: String::new(),
        })?;
        let name = format!("{PROGRAM_PREFIX}{}_{short}", self.tgid);
        Program::load(kind, &name, &insns, tracing).map_err(|e| KernelError::Load {
            what: what.to_string(),
            source: e.error,
            log: e.log,
        })
    }

    /// Counts the target's threads' CPU time from the scheduler's
    /// switches, when BTF tells where the fields are; whether it does.
    fn count_switches(&mut self, btf: &Btf) -> Result<bool, KernelError> {
        let offsets = (
            btf.tracepoint_arg("sched_switch", "next"),
            btf.offset_of("task_struct", &["pid"]),
            btf.offset_of("task_struct", &["tgid"]),
        );
        let (Some(next_arg), Some(task_pid), Some(task_tgid)) = offsets else {
            return Ok(false);
        };
        let p = self.load(
            ProgType::RawTracepoint,
            "sw",
            "sched_switch",
            progs::switch_program(&SwitchProgram {
                tgid: self.tgid,
                next_arg,
                task_pid,
                task_tgid,
                clocks: self.maps.clocks,
                steal: self.steal,
            }),
            None,
        )?;
        self.links.push(
            sys::raw_tracepoint_open(&p, Some("sched_switch"))
                .map_err(attach_err("sched_switch"))?,
        );
        self.programs.push(p);
        Ok(true)
    }

    /// Probes the system calls `syscalls` (name, number) with one pair of
    /// programs on `sys_enter`/`sys_exit`, adding their probes to
    /// `probes`; returns the table of the calls wanted.
    fn probe_syscalls(
        &mut self,
        syscalls: &[(&String, u32)],
        probes: &mut Vec<ProbeInfo>,
    ) -> Result<Map, KernelError> {
        let wanted = create_map(sys::MAP_ARRAY, "weft_syscalls", 4, 4, MAX_SYSCALLS)?;
        for (name, number) in syscalls {
            let probe = probes.len() as u32;
            wanted
                .update(&number.to_ne_bytes(), &(probe + 1).to_ne_bytes())
                .map_err(|source| KernelError::Map {
                    what: "update",
                    source,
                })?;
            probes.push(ProbeInfo {
                name: name.to_string(),
                module: "syscall",
                mechanism: Mechanism::SyscallTracepoints,
                timed: true,
            });
        }
        let enter = self.load(
            ProgType::RawTracepoint,
            "se",
            "sys_enter",
            progs::entry_program(&EntryProgram {
                tgid: self.tgid,
                trigger: Trigger::Syscalls {
                    wanted: wanted.raw(),
                },
                timed: true,
                attribution: self.attribution,
                maps: self.maps,
                steal: self.steal,
            }),
            None,
        )?;
        let exit = self.load(
            ProgType::RawTracepoint,
            "sx",
            "sys_exit",
            progs::exit_program(&ExitProgram {
                tgid: self.tgid,
                slot: None,
                maps: self.maps,
                steal: self.steal,
            }),
            None,
        )?;
        // The exit first: an entry without its exit would leave open
        // activations behind.
        self.links.push(
            sys::raw_tracepoint_open(&exit, Some("sys_exit")).map_err(attach_err("sys_exit"))?,
        );
        self.links.push(
            sys::raw_tracepoint_open(&enter, Some("sys_enter")).map_err(attach_err("sys_enter"))?,
        );
        self.programs.extend([enter, exit]);
        Ok(wanted)
    }

    /// Probes kernel function `name` (at `offset` into it, if any) as
    /// probe number `probe`, by `mechanism`; returns what the report says
    /// of it.
    fn probe_function(
        &mut self,
        name: &String,
        offset: Option<u64>,
        mechanism: Mechanism,
        probe: u32,
        btf: Option<&Btf>,
    ) -> Result<ProbeInfo, KernelError> {
        let shown = match offset {
            Some(o) => format!("{name}+{o:#x}"),
            None => name.clone(),
        };
        let timed = mechanism != Mechanism::KprobeOffset;
        let entry = progs::entry_program(&EntryProgram {
            tgid: self.tgid,
            trigger: Trigger::Probe(probe),
            timed,
            attribution: self.attribution,
            maps: self.maps,
            steal: self.steal,
        });
        let exit = progs::exit_program(&ExitProgram {
            tgid: self.tgid,
            slot: Some(probe),
            maps: self.maps,
            steal: self.steal,
        });
        let what = format!("kernel:{shown}");
        match mechanism {
            Mechanism::Fentry => {
                let id = btf
                    .and_then(|b| b.function(name))
                    .expect("resolve chose fentry from BTF");
                let target = |attach_type| {
                    Some(TracingTarget {
                        attach_type,
                        btf_id: id,
                    })
                };
                let x = self.load(
                    ProgType::Tracing,
                    "fx",
                    &what,
                    exit,
                    target(sys::ATTACH_FEXIT),
                )?;
                let e = self.load(
                    ProgType::Tracing,
                    "fe",
                    &what,
                    entry,
                    target(sys::ATTACH_FENTRY),
                )?;
                self.links
                    .push(sys::raw_tracepoint_open(&x, None).map_err(attach_err(&what))?);
                self.links
                    .push(sys::raw_tracepoint_open(&e, None).map_err(attach_err(&what))?);
                self.programs.extend([e, x]);
            }
            Mechanism::Kprobe => {
                let x = self.load(ProgType::Kprobe, "kx", &what, exit, None)?;
                let e = self.load(ProgType::Kprobe, "ke", &what, entry, None)?;
                self.links
                    .push(sys::attach_kprobe(&x, name, 0, true).map_err(attach_err(&what))?);
                self.links
                    .push(sys::attach_kprobe(&e, name, 0, false).map_err(attach_err(&what))?);
                self.programs.extend([e, x]);
            }
            Mechanism::KprobeOffset => {
                let e = self.load(ProgType::Kprobe, "ko", &what, entry, None)?;
                self.links.push(
                    sys::attach_kprobe(&e, name, offset.unwrap_or(0), false).map_err(|source| {
                        match source.raw_os_error() {
                            Some(libc::EILSEQ) => KernelError::NotAnInstruction {
                                pattern: what.clone(),
                            },
                            _ => KernelError::Attach {
                                what: what.clone(),
                                source,
                            },
                        }
                    })?,
                );
                self.programs.push(e);
            }
            Mechanism::SyscallTracepoints => unreachable!("functions are not system calls"),
        }
        Ok(ProbeInfo {
            name: shown,
            module: "kernel",
            mechanism,
            timed,
        })
    }
}

impl Session {
    /// Resolves `patterns`, then loads and attaches the programs for the
    /// threads of process `tgid`. With `tls_offset` (the runtime's
    /// thread-local row pointer, when weft's runtime is loaded in the
    /// target) each call is attributed to the instrumented user function
    /// its thread is innermost in. On any failure nothing stays attached.
    pub fn start(
        tgid: i32,
        patterns: &[KernelPattern],
        caps: &Capabilities,
        tls_offset: Option<i64>,
    ) -> Result<Session, KernelError> {
        caps::raise_memlock();
        let btf = Btf::vmlinux().ok();
        let targets = resolve(patterns, caps, btf.as_ref())?;
        let tgid = tgid as u32;
        let clocks = create_map(sys::MAP_HASH, "weft_clocks", 4, clock::SIZE, THREADS)?;
        let open_map = create_map(
            sys::MAP_HASH,
            "weft_open",
            open::KEY_SIZE,
            open::SIZE,
            OPEN_SLOTS,
        )?;
        let stats_map = create_map(
            sys::MAP_HASH,
            "weft_totals",
            stats::KEY_SIZE,
            stats::SIZE,
            TOTALS,
        )?;
        let lost = create_map(sys::MAP_ARRAY, "weft_lost", 4, 8, 1)?;
        let maps = Maps {
            clocks: clocks.raw(),
            open: open_map.raw(),
            stats: stats_map.raw(),
            lost: lost.raw(),
        };
        let any_timed = targets.iter().any(|(_, m)| *m != Mechanism::KprobeOffset);
        let mut loader = Loader {
            tgid,
            attribution: attribution(tls_offset, btf.as_ref()),
            maps,
            // Stolen time out of CPU time where the kernel leaves it out of
            // its threads' (the capability says whether the read loads here).
            steal: match (&caps.steal, btf.as_ref()) {
                (Ok(()), Some(btf)) => caps::steal_counter(btf).ok(),
                _ => None,
            },
            links: Vec::new(),
            programs: Vec::new(),
        };
        let mut probes = Vec::new();
        // CPU time: the scheduler's switches of the target's threads.
        let cpu = match (any_timed, &caps.sched_switch, btf.as_ref()) {
            (true, Ok(()), Some(btf)) => loader.count_switches(btf)?,
            _ => false,
        };
        // System calls: one pair of programs for all, a table says which.
        let syscalls: Vec<(&String, u32)> = targets
            .iter()
            .filter_map(|(t, _)| match t {
                Target::Syscall { name, number } => Some((name, *number)),
                _ => None,
            })
            .collect();
        let mut wanted_map = None;
        if !syscalls.is_empty() {
            wanted_map = Some(loader.probe_syscalls(&syscalls, &mut probes)?);
        }
        for (target, mechanism) in &targets {
            let Target::Function { name, offset } = target else {
                continue;
            };
            let probe = probes.len() as u32;
            let info = loader.probe_function(name, *offset, *mechanism, probe, btf.as_ref())?;
            probes.push(info);
        }
        let Loader {
            links, programs, ..
        } = loader;
        let mut kept = vec![open_map];
        kept.extend(wanted_map);
        Ok(Session {
            probes,
            clocks,
            stats: stats_map,
            lost,
            cpu,
            _links: links,
            _programs: programs,
            _maps: kept,
        })
    }

    /// Thread `tid`'s time on a CPU as the `sched_switch` program has
    /// counted it (up to its last switch out), ns; `None` before weft has
    /// seen the thread switch or enter a probe.
    pub fn on_cpu_ns(&self, tid: u32) -> Option<u64> {
        let v = self.clocks.lookup(&tid.to_ne_bytes()).ok()??;
        Some(u64::from_ne_bytes(v[..8].try_into().ok()?))
    }

    /// The session's probes.
    pub fn probes(&self) -> &[ProbeInfo] {
        &self.probes
    }

    /// Reads the totals (live: the programs keep running).
    pub fn snapshot(&self) -> Result<KernelSnapshot, KernelError> {
        let entries = self.stats.entries().map_err(|source| KernelError::Map {
            what: "read",
            source,
        })?;
        let word = |b: &[u8], at: usize| u64::from_ne_bytes(b[at..at + 8].try_into().expect("8"));
        let half = |b: &[u8], at: usize| u32::from_ne_bytes(b[at..at + 4].try_into().expect("4"));
        let mut rows: Vec<KernelRow> = entries
            .iter()
            .map(|(k, v)| KernelRow {
                tid: half(k, 0),
                probe: half(k, 4),
                attribution: half(k, 8),
                calls: word(v, stats::CALLS as usize),
                wall_ns: word(v, stats::WALL as usize),
                cpu_ns: word(v, stats::CPU as usize),
            })
            .filter(|r| (r.probe as usize) < self.probes.len())
            .collect();
        rows.sort_by_key(|r| (r.probe, r.tid, r.attribution));
        let lost = self
            .lost
            .lookup(&0u32.to_ne_bytes())
            .ok()
            .flatten()
            .map_or(0, |v| word(&v, 0));
        Ok(KernelSnapshot {
            probes: self.probes.clone(),
            rows,
            cpu: self.cpu,
            lost,
        })
    }
}
