//! Constrained metrics (`ProbeSpec::inside`): a shared function counted
//! and timed only under one caller, checked against the target's own
//! account of where each call was made — a helper shared by a hot and a
//! cold caller, a qsort comparator under one of two sorts, recursion
//! through a shared helper, a longjmp out of the constraining frame, and
//! C++ exceptions through it. Built with gcc and clang (g++ and clang++)
//! at -O2 -g; threads with default attributes.

use crate::support;

use std::collections::BTreeMap;
use support::*;
use weft::{Error, Metrics, Pattern, ProbeId, ProbeSpec, Process};

const WORKERS: usize = 3;
const ROUNDS: u32 = 40;

/// One worker's own account of a run.
#[derive(Debug, Default)]
struct Truth {
    spins: u64,
    spin_in_parse: u64,
    spin_in_parse_cpu: u64,
    cmp_in_rebuild: u64,
    step_in_recurse: u64,
    parse: u64,
    throws: u64,
}

fn truths(ctx: &Ctx, text: &str) -> BTreeMap<u32, Truth> {
    let mut all = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("truth ")) {
        let mut tid = 0;
        let mut t = Truth::default();
        for field in line.split_whitespace().skip(1) {
            let (k, v) = field
                .split_once('=')
                .unwrap_or_else(|| ctx.fail(format!("bad truth line {line:?}")));
            let v: u64 = v.parse().unwrap();
            match k {
                "tid" => tid = v as u32,
                "spins" => t.spins = v,
                "spin_in_parse" => t.spin_in_parse = v,
                "spin_in_parse_cpu" => t.spin_in_parse_cpu = v,
                "cmp_in_rebuild" => t.cmp_in_rebuild = v,
                "step_in_recurse" => t.step_in_recurse = v,
                "parse" => t.parse = v,
                "throws" => t.throws = v,
                _ => ctx.fail(format!("unknown field in {line:?}")),
            }
        }
        all.insert(tid, t);
    }
    all
}

fn find(ctx: &Ctx, process: &mut Process, name: &str) -> weft::Function {
    let mut found = process
        .find_functions(&[Pattern::parse(name).unwrap()])
        .unwrap_or_else(|e| ctx.fail(format!("find {name}: {e}")));
    ctx.check(found.len() == 1, || format!("{name}: found {found:?}"));
    found.remove(0)
}

fn insert(ctx: &Ctx, process: &mut Process, specs: &[ProbeSpec]) -> Vec<ProbeId> {
    let mut held = process.hold().unwrap();
    let ids = held
        .insert_probes(specs)
        .unwrap_or_else(|e| ctx.fail(format!("insert: {e}")));
    held.release().unwrap();
    ids
}

#[test]
fn shared_functions_counted_and_timed_only_inside_their_callers() {
    let ctx = Ctx::new("shared_functions_counted_and_timed_only_inside_their_callers");
    for compiler in ["gcc", "clang"] {
        let exe = build_c_target_with(compiler, "constrained", &["-O2", "-g", "-pthread"]);
        check_against_the_targets_account(&ctx, compiler, &exe);
    }
}

/// A C++ exception caught inside the constraining function leaves it
/// open; one thrown out of it closes it only when the unwind leaves its
/// frame, after its landing pad (a destructor that calls the helper) ran
/// inside it; the caller's handler is outside.
#[test]
fn exceptions_close_a_constraint_when_they_leave_its_frame() {
    let ctx = Ctx::new("exceptions_close_a_constraint_when_they_leave_its_frame");
    for compiler in ["g++", "clang++"] {
        let exe = build_c_target_with(compiler, "constrained_throw", &["-O2", "-g"]);
        let workers = WORKERS.to_string();
        let mut t = ctx.target(&exe, &[&workers]);
        let (pid, _) = wait_ready(&mut t);
        let mut process = Process::open(pid as i32).unwrap();
        let [parse, spin] = ["parse_request", "spin_for"].map(|n| find(&ctx, &mut process, n));
        let outer = insert(
            &ctx,
            &mut process,
            &[ProbeSpec::measure(parse, Metrics::ALL)],
        );
        let inner = insert(
            &ctx,
            &mut process,
            &[ProbeSpec::measure(spin, Metrics::ALL).inside(&[outer[0]])],
        );
        for round in 0..2 {
            let before = values(&process);
            let (truth, after) = run(&ctx, &mut t, &process);
            for (tid, want) in &truth {
                ctx.check(want.throws > 0, || {
                    format!("{compiler} {tid}: nothing thrown")
                });
                let Some(got) = after.get(tid) else {
                    ctx.fail(format!("{compiler}: no row for worker {tid}"));
                };
                let was = |id: ProbeId| before.get(tid).map_or(Default::default(), |v| v[&id]);
                let [parse, spin] = [outer[0], inner[0]].map(|id| {
                    let (now, then) = (got[&id], was(id));
                    (now.calls - then.calls, now.cpu_ns - then.cpu_ns)
                });
                ctx.check(
                    parse.0 == want.parse && spin.0 == want.spin_in_parse,
                    || {
                        format!(
                            "{compiler} {tid} run {round}: parse_request {} calls and spin_for {} \
                         inside it; the target made {} and {} ({} thrown out)",
                            parse.0, spin.0, want.parse, want.spin_in_parse, want.throws
                        )
                    },
                );
                let own = want.spin_in_parse_cpu;
                ctx.check(spin.1.abs_diff(own) <= own * 3 / 100 + 500_000, || {
                    format!(
                        "{compiler} {tid} run {round}: spin_for inside parse_request {} ns of \
                         CPU, the target's own clock {own} ns",
                        spin.1
                    )
                });
            }
        }
        let mut held = process.hold().unwrap();
        held.remove(&[inner, outer].concat())
            .unwrap_or_else(|e| ctx.fail(format!("{compiler}: remove: {e}")));
        held.release().unwrap();
        drop(process);
        t.send("quit");
        t.wait_code(0);
    }
}

fn check_against_the_targets_account(ctx: &Ctx, compiler: &str, exe: &std::path::Path) {
    let workers = WORKERS.to_string();
    let mut t = ctx.target(exe, &[&workers]);
    let (pid, _) = wait_ready(&mut t);
    let mut process = Process::open(pid as i32).unwrap();
    let [parse, rebuild, recurse, spin, cmp, step] = [
        "parse_request",
        "rebuild_index",
        "recurse",
        "spin_for",
        "cmp_keys",
        "step",
    ]
    .map(|n| find(ctx, &mut process, n));
    let spin_code = process.read_memory(spin.address, 16).unwrap();

    // A constraint must be a live timed probe of this session, inserted
    // before: asked in one batch, the constrained probe is refused.
    let early = {
        let mut held = process.hold().unwrap();
        let r = held.insert_probes(&[
            ProbeSpec::measure(spin.clone(), Metrics::ALL).inside(&[ProbeId(u32::MAX)])
        ]);
        held.release().unwrap();
        r
    };
    ctx.check(
        matches!(&early, Err(Error::Refused(r)) if r[0].reason.contains("not one of this session's")),
        || format!("{compiler}: a constraint that is no probe: {early:?}"),
    );

    let outer = insert(
        ctx,
        &mut process,
        &[
            ProbeSpec::measure(parse, Metrics::ALL),
            ProbeSpec::measure(rebuild, Metrics::ALL),
            ProbeSpec::measure(recurse, Metrics::ALL),
        ],
    );
    let inner = insert(
        ctx,
        &mut process,
        &[
            ProbeSpec::measure(spin.clone(), Metrics::ALL).inside(&[outer[0]]),
            ProbeSpec::measure(cmp, Metrics::ALL).inside(&[outer[1]]),
            ProbeSpec::measure(step, Metrics::ALL).inside(&[outer[2]]),
        ],
    );
    let (truth, sampled) = run(ctx, &mut t, &process);
    let [c_parse, c_spin, c_cmp, c_step] = [outer[0], inner[0], inner[1], inner[2]];
    for (tid, want) in &truth {
        let Some(got) = sampled.get(tid) else {
            ctx.fail(format!("{compiler}: no row for worker {tid}"));
        };
        let calls = |id: ProbeId| got[&id].calls;
        // Exact: only the calls made inside the constraint (a longjmp out
        // of parse_request ends it at once); parse_request unconstrained.
        for (id, made, what) in [
            (c_parse, want.parse, "parse_request"),
            (c_spin, want.spin_in_parse, "spin_for inside parse_request"),
            (c_cmp, want.cmp_in_rebuild, "cmp_keys inside rebuild_index"),
            (c_step, want.step_in_recurse, "step inside recurse"),
        ] {
            ctx.check(calls(id) == made, || {
                format!(
                    "{compiler} {tid}: {what} {} calls, the target made {made}",
                    calls(id)
                )
            });
        }
        // The constrained CPU time against the target's own clock around
        // its spins (weft's includes a few instructions more, and reads
        // the thread's CPU clock from the TSC between context switches).
        let cpu = got[&c_spin].cpu_ns;
        let own = want.spin_in_parse_cpu;
        ctx.check(cpu.abs_diff(own) <= own * 3 / 100 + 500_000, || {
            format!("{compiler} {tid}: spin_for inside parse_request {cpu} ns of CPU, the target's own clock {own} ns")
        });
    }

    // A constraint goes with or after what it constrains.
    let mut held = process.hold().unwrap();
    let early = held.remove(&outer[..1]);
    held.release().unwrap();
    ctx.check(
        matches!(&early, Err(Error::ConstraintInUse { function, by }) if function == "parse_request" && by == &["spin_for"]),
        || format!("{compiler}: removing a constraint in use: {early:?}"),
    );

    // Every call of spin_for too, beside the constrained probe: the new
    // probe goes over it, and each counts its own calls.
    let all = insert(
        ctx,
        &mut process,
        &[ProbeSpec::measure(spin.clone(), Metrics::ALL)],
    )[0];
    let before = values(&process);
    let (truth, after) = run(ctx, &mut t, &process);
    for (tid, want) in &truth {
        let delta =
            |id: ProbeId| after[tid][&id].calls - before.get(tid).map_or(0, |v| v[&id].calls);
        ctx.check(
            delta(all) == want.spins && delta(inner[0]) == want.spin_in_parse,
            || {
                format!(
                    "{compiler} {tid}: spin_for {} calls in all and {} inside parse_request; the \
                     target made {} and {}",
                    delta(all),
                    delta(inner[0]),
                    want.spins,
                    want.spin_in_parse
                )
            },
        );
    }
    // The constrained probe, under the other, leaves first: the other
    // still counts every call.
    let mut held = process.hold().unwrap();
    held.remove(&inner[..1])
        .unwrap_or_else(|e| ctx.fail(format!("remove the constrained probe: {e}")));
    held.release().unwrap();
    let before = after;
    let (truth, after) = run(ctx, &mut t, &process);
    for (tid, want) in &truth {
        let delta = after[tid][&all].calls - before[tid][&all].calls;
        ctx.check(delta == want.spins, || {
            format!(
                "{compiler} {tid}: spin_for {delta} calls, the target made {}",
                want.spins
            )
        });
    }

    let mut held = process.hold().unwrap();
    held.remove(&[outer.clone(), inner.clone(), vec![all]].concat())
        .unwrap_or_else(|e| ctx.fail(format!("remove: {e}")));
    held.release().unwrap();
    // The function's own bytes are back, and the target still runs right.
    let now = process.read_memory(spin.address, 16).unwrap();
    ctx.check(now == spin_code, || {
        format!("{compiler}: spin_for's code after removal {now:x?}, before {spin_code:x?}")
    });
    drop(process);
    t.send(&format!("go {ROUNDS}"));
    t.expect_stdout("`done`", |l| l == "done");
    t.send("quit");
    t.wait_code(0);
}

type Values = BTreeMap<u32, BTreeMap<ProbeId, weft::sample::Value>>;

/// Every probe's values on every thread, by TID and probe.
fn values(process: &Process) -> Values {
    let ids: Vec<ProbeId> = process
        .probes()
        .iter()
        .filter(|p| p.calls_word().is_some())
        .map(|p| p.id)
        .collect();
    let mut sampler = weft::sample::Sampler::new();
    sampler
        .sample(process)
        .map(|t| {
            (
                t.tid,
                ids.iter().copied().zip(t.values.iter().copied()).collect(),
            )
        })
        .collect()
}

/// One run of the workers: their own account, and weft's values after it.
fn run(ctx: &Ctx, t: &mut Proc, process: &Process) -> (BTreeMap<u32, Truth>, Values) {
    let before = t.stdout_text().len();
    t.send(&format!("go {ROUNDS}"));
    t.expect_stdout("`done`", |l| l == "done");
    let truth = truths(ctx, &t.stdout_text()[before..]);
    ctx.check(truth.len() == WORKERS, || {
        format!("{} truth lines", truth.len())
    });
    (truth, values(process))
}
