//! weft's figures against the targets' own account: the workers targets'
//! per-thread lines and the counts they imply, checked against a report
//! thread by thread; the exits and exceptions targets' `tid` lines; the
//! cycles target's results.

use super::process::{Ctx, Proc};
use super::report::{parse_hex, Report, ReportFunction};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// The instrumented functions of the workers targets, as `-f` patterns.
pub const WORKER_PATTERNS: &str = "work_a,work_b,libwork.so:lib_work";

/// The function names these patterns resolve to.
pub const WORKER_FUNCS: [&str; 3] = ["work_a", "work_b", "lib_work"];

/// Stops a `cycles` target (tests/targets/cycles.c): sends `stop`, waits
/// for its exit and checks that each of its `workers` reported results
/// unchanged by instrumentation (`"ok":true`). `what` names the moment in
/// the failure message.
pub fn stop_cycles(t: &mut Proc, workers: usize, what: &str) {
    t.send("stop");
    t.expect_stdout("`done`", |l| l == "done");
    t.wait_code(0);
    let out = t.stdout_text();
    let ok = out
        .lines()
        .filter(|l| l.starts_with("{\"worker\"") && l.contains("\"ok\":true"))
        .count();
    t.ctx().check(ok == workers, || {
        format!("{what}: {ok} of {workers} workers' results unchanged:\n{out}")
    });
}

/// Lines `tid role=ROLE index=I tid=T [key=value...]` a target printed on
/// stderr (the exits and exceptions targets): `(role, index) -> fields`.
pub fn tid_lines(text: &str) -> BTreeMap<(String, u64), BTreeMap<String, String>> {
    let mut m = BTreeMap::new();
    for l in text.lines() {
        let Some(rest) = l.strip_prefix("tid ") else {
            continue;
        };
        let kv: BTreeMap<String, String> = rest
            .split_whitespace()
            .filter_map(|f| f.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if let (Some(role), Some(index)) = (kv.get("role"), kv.get("index")) {
            if let Ok(i) = index.parse() {
                m.insert((role.clone(), i), kv);
            }
        }
    }
    m
}

/// One per-thread line of the workers targets.
#[derive(Deserialize, Debug, Clone)]
pub struct WorkerLine {
    pub phase: u64,
    pub index: u64,
    pub tid: i64,
    pub name: String,
    pub work_a: u64,
    pub work_b: u64,
    pub lib_work: u64,
    pub ok: bool,
}

impl WorkerLine {
    pub fn count(&self, func: &str) -> u64 {
        match func {
            "work_a" => self.work_a,
            "work_b" => self.work_b,
            "lib_work" => self.lib_work,
            _ => panic!("unknown function {func}"),
        }
    }
}

/// Calls thread `index` makes in phase `p`: (work_a, work_b, lib_work).
pub fn expected_counts(index: u64, p: u64) -> (u64, u64, u64) {
    (
        1000 * (index + 1) + 37 * p,
        500 * (index + 1) + 11 * p,
        250 * (index + 1) + 3 * p,
    )
}

#[track_caller]
pub fn worker_lines(ctx: &Ctx, text: &str) -> Vec<WorkerLine> {
    text.lines()
        .filter(|l| l.starts_with("{\"phase\""))
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| ctx.fail(format!("bad target line {l:?}: {e}")))
        })
        .collect()
}

/// Checks the target's own view of phase `phase`: `nthreads` threads, each
/// with the exact expected counts, results ok, distinct TIDs; no FAIL lines.
#[track_caller]
pub fn check_worker_phase(ctx: &Ctx, text: &str, phase: u64, nthreads: u64) -> Vec<WorkerLine> {
    ctx.check(!text.lines().any(|l| l.starts_with("FAIL")), || {
        "the target reported FAIL".into()
    });
    let lines: Vec<WorkerLine> = worker_lines(ctx, text)
        .into_iter()
        .filter(|l| l.phase == phase)
        .collect();
    ctx.check(lines.len() as u64 == nthreads, || {
        format!(
            "phase {phase}: {} thread lines, expected {nthreads}",
            lines.len()
        )
    });
    let mut tids = std::collections::BTreeSet::new();
    for (i, l) in lines.iter().enumerate() {
        let (a, b, lw) = expected_counts(l.index, phase);
        ctx.check(l.index == i as u64, || {
            format!("phase {phase}: unexpected index order {l:?}")
        });
        ctx.check(l.ok, || {
            format!(
                "phase {phase}: thread {} computed wrong results: {l:?}",
                l.index
            )
        });
        ctx.check((l.work_a, l.work_b, l.lib_work) == (a, b, lw), || {
            format!(
                "phase {phase}: thread {} counted {l:?}, expected ({a},{b},{lw})",
                l.index
            )
        });
        ctx.check(l.tid > 0 && tids.insert(l.tid), || {
            format!("bad or repeated tid in {l:?}")
        });
    }
    lines
}

/// What a thread should show in weft's report.
#[derive(Debug, Clone, Default)]
pub struct ExpThread {
    pub name: String,
    pub calls: BTreeMap<String, u64>,
}

/// Expected per-TID counts from worker lines (summed over the given lines).
pub fn expect_from_workers<'a>(
    lines: impl IntoIterator<Item = &'a WorkerLine>,
    funcs: &[&str],
) -> BTreeMap<i64, ExpThread> {
    let mut m: BTreeMap<i64, ExpThread> = BTreeMap::new();
    for l in lines {
        let e = m.entry(l.tid).or_default();
        e.name = l.name.clone();
        for f in funcs {
            *e.calls.entry(f.to_string()).or_default() += l.count(f);
        }
    }
    m
}

/// Checks weft's report against the target's own counts: every expected
/// thread appears exactly once (matched by TID) with exactly the expected
/// calls per function and the expected name; any other thread has zero calls;
/// `functions[]` has each function once with the total over threads.
#[track_caller]
pub fn check_report_counts(
    ctx: &Ctx,
    report: &Report,
    exp: &BTreeMap<i64, ExpThread>,
    funcs: &[&str],
) {
    let show = || format!("report: {report:#?}\nexpected: {exp:#?}");
    let mut seen = std::collections::BTreeSet::new();
    for t in &report.threads {
        ctx.check(seen.insert(t.tid), || {
            format!("tid {} appears twice in the report\n{}", t.tid, show())
        });
        let calls = |f: &str| t.functions.get(f).map(|c| c.calls).unwrap_or(0);
        match exp.get(&t.tid) {
            Some(e) => {
                for f in funcs {
                    let want = e.calls.get(*f).copied().unwrap_or(0);
                    ctx.check(calls(f) == want, || {
                        format!(
                            "tid {} ({}): weft counted {} calls of {f}, the target made {want}\n{}",
                            t.tid,
                            e.name,
                            calls(f),
                            show()
                        )
                    });
                }
                ctx.check(t.name == e.name, || {
                    format!(
                        "tid {}: weft says thread name {:?}, the target named it {:?}",
                        t.tid, t.name, e.name
                    )
                });
            }
            None => {
                for f in funcs {
                    ctx.check(calls(f) == 0, || {
                        format!(
                            "tid {} made no calls of {f} per the target, weft counted {}\n{}",
                            t.tid,
                            calls(f),
                            show()
                        )
                    });
                }
            }
        }
    }
    for (tid, e) in exp {
        if e.calls.values().any(|&c| c > 0) {
            ctx.check(seen.contains(tid), || {
                format!(
                    "tid {tid} ({}) is missing from the report\n{}",
                    e.name,
                    show()
                )
            });
        }
    }
    for f in funcs {
        let entries: Vec<&ReportFunction> =
            report.functions.iter().filter(|x| x.name == *f).collect();
        ctx.check(entries.len() == 1, || {
            format!(
                "function {f} appears {} times in functions[]\n{}",
                entries.len(),
                show()
            )
        });
        let total: u64 = exp
            .values()
            .map(|e| e.calls.get(*f).copied().unwrap_or(0))
            .sum();
        ctx.check(entries[0].calls == total, || {
            format!(
                "functions[] says {f} was called {} times, expected total {total}\n{}",
                entries[0].calls,
                show()
            )
        });
        parse_hex(ctx, &entries[0].address);
    }
}

/// Checks `functions[]` modules: `(name, module basename)`.
#[track_caller]
pub fn check_report_modules(ctx: &Ctx, report: &Report, want: &[(&str, &str)]) {
    for (name, module) in want {
        let f = report.functions.iter().find(|f| f.name == *name);
        ctx.check(f.map(|f| f.module.as_str()) == Some(*module), || {
            format!("function {name}: expected module {module:?}, report has {f:?}")
        });
    }
}

/// Checks a report in which no instrumented function ran.
#[track_caller]
pub fn check_report_zero(ctx: &Ctx, report: &Report, funcs: &[&str]) {
    check_report_counts(ctx, report, &BTreeMap::new(), funcs)
}

pub fn worker_modules(exe: &Path) -> Vec<(&'static str, String)> {
    let base = exe.file_name().unwrap().to_string_lossy().into_owned();
    vec![
        ("work_a", base.clone()),
        ("work_b", base),
        ("lib_work", "libwork.so".to_string()),
    ]
}
