//! Instruction points through the library API (issue #6): points before
//! and after call sites, counts at an instruction inside a loop, and the
//! targets of indirect calls — a function pointer (`call *%rax`, 2 bytes)
//! and a virtual call (`call *8(%rax)`, 3 bytes) — recorded per thread and
//! checked against the ground truth the target's workers print; refusals
//! that change nothing; the code as it was after removal.

use crate::support;

use std::collections::BTreeMap;
use support::*;
use weft::code::function_code;
use weft::{Function, Held, Pattern, PointSpec, Process, UserProbe};
use weft_codegen::cfg::{CallSite, CallTarget, Flow};

/// A worker's cumulative ground truth, from its line.
#[derive(Debug, Default, Clone)]
struct Truth {
    calls: u64,
    op: [u64; 3],
    sq: u64,
    ci: u64,
}

/// Sends `run n` and collects every worker's line (by tid) up to `round n done`.
fn run_round(t: &mut Proc, n: u32) -> (BTreeMap<u32, Truth>, Vec<String>) {
    t.send(&format!("run {n}"));
    let (mut truth, mut other) = (BTreeMap::new(), Vec::new());
    loop {
        let l = t.expect_stdout("a line of the round", |_| true);
        if l == format!("round {n} done") {
            return (truth, other);
        }
        if !l.starts_with("worker ") || !l.contains("calls=") {
            other.push(l);
            continue;
        }
        let field = |name: &str| -> u64 {
            l.split_whitespace()
                .find_map(|f| f.strip_prefix(name).and_then(|v| v.parse().ok()))
                .unwrap_or_else(|| t.ctx().fail(format!("no {name} in {l:?}")))
        };
        truth.insert(
            field("tid=") as u32,
            Truth {
                calls: field("calls="),
                op: [field("op0="), field("op1="), field("op2=")],
                sq: field("sq="),
                ci: field("ci="),
            },
        );
    }
}

/// The function named `name`, found in the target.
fn find(ctx: &Ctx, p: &mut Process, name: &str) -> Function {
    p.find_functions(&[Pattern::parse(name).unwrap()])
        .unwrap_or_else(|e| ctx.fail(format!("find {name}: {e}")))
        .remove(0)
}

/// `f`'s call sites, statically decoded.
fn calls(ctx: &Ctx, p: &mut Process, f: &Function) -> Vec<CallSite> {
    function_code(p.image(), f)
        .unwrap_or_else(|e| ctx.fail(format!("function_code {}: {e}", f.name)))
        .calls
}

fn indirect_call(ctx: &Ctx, p: &mut Process, f: &Function) -> CallSite {
    let sites = calls(ctx, p, f);
    sites
        .iter()
        .copied()
        .find(|c| matches!(c.target, CallTarget::Indirect { .. }))
        .unwrap_or_else(|| ctx.fail(format!("no indirect call in {}: {sites:?}", f.name)))
}

fn direct_call_to(ctx: &Ctx, p: &mut Process, f: &Function, to: &Function) -> CallSite {
    let sites = calls(ctx, p, f);
    sites
        .iter()
        .copied()
        .find(|c| c.target == CallTarget::Direct(to.address))
        .unwrap_or_else(|| ctx.fail(format!("no call to {} in {}: {sites:?}", to.name, f.name)))
}

#[test]
fn indirect_call_targets_per_thread_match_the_ground_truth() {
    let ctx = Ctx::new("indirect_call_targets_per_thread_match_the_ground_truth");
    let mut t = ctx.target(points(), &["3"]);
    wait_ready(&mut t);
    let fail = |what: &str, e: weft::Error| -> ! { ctx.fail(format!("{what}: {e}")) };
    let mut p = Process::open(t.pid as i32).unwrap_or_else(|e| fail("open", e));
    let (dispatch, area, worker) = (
        find(&ctx, &mut p, "dispatch"),
        find(&ctx, &mut p, "area"),
        find(&ctx, &mut p, "worker"),
    );
    let by_pointer = indirect_call(&ctx, &mut p, &dispatch);
    let by_vtable = indirect_call(&ctx, &mut p, &area);
    let to_dispatch = direct_call_to(&ctx, &mut p, &worker, &dispatch);
    // Calls into libc go through PLT stubs, named by the GOT slot's symbol.
    let imports: Vec<String> = calls(&ctx, &mut p, &worker)
        .iter()
        .filter_map(|c| match c.target {
            CallTarget::Direct(to) => weft::code::plt_import(p.image(), to),
            _ => None,
        })
        .collect();
    ctx.check(
        imports.iter().any(|n| n == "sem_wait") && imports.iter().any(|n| n == "sem_post"),
        || format!("the worker's PLT calls: {imports:?}"),
    );
    // A round before the points: their counts start from zero.
    let (before, _) = run_round(&mut t, 100);
    let mut held = p.hold().unwrap_or_else(|e| fail("hold", e));
    let ids = held
        .insert_points(&[
            // Two slots for three targets: one overflows.
            PointSpec::call_targets(dispatch.clone(), &by_pointer, 2),
            PointSpec::call_targets(area.clone(), &by_vtable, 4),
            // A 5-byte direct call inside the workers' loop, each worker
            // blocked in sem_wait further up the same function.
            PointSpec::before_call(worker.clone(), &to_dispatch),
        ])
        .unwrap_or_else(|e| fail("insert_points", e));
    held.release().unwrap_or_else(|e| fail("release", e));

    let n = 3000;
    let (after, _) = run_round(&mut t, n);
    ctx.check(after.len() == 3, || format!("three workers: {after:?}"));
    let name_of = |p: &mut Process, addr: u64| {
        p.image()
            .function_at(addr)
            .ok()
            .flatten()
            .map_or(format!("{addr:#x}"), |f| f.name)
    };
    let read = |p: &mut Process, id| {
        let rows = p
            .call_targets(id)
            .unwrap_or_else(|e| fail("call_targets", e));
        let mut by_tid = BTreeMap::new();
        for row in rows {
            let named: BTreeMap<String, u64> = row
                .targets
                .iter()
                .map(|&(to, calls)| (name_of(p, to), calls))
                .collect();
            by_tid.insert(row.tid, (named, row.overflow));
        }
        by_tid
    };
    let pointers = read(&mut p, ids[0]);
    let virtuals = read(&mut p, ids[1]);
    let report = p.report();
    let point_name = format!("worker+{:#x}", to_dispatch.address - worker.address);
    for (tid, truth) in &after {
        let old = before.get(tid).cloned().unwrap_or_default();
        let op: Vec<u64> = (0..3).map(|j| truth.op[j] - old.op[j]).collect();
        // Each worker's first two targets fill the slots, in the order it
        // first called them; the third overflows.
        let (named, overflow) = pointers
            .get(tid)
            .unwrap_or_else(|| ctx.fail(format!("no call targets for worker {tid}: {pointers:?}")));
        let calls_to = |name: &str| named.get(name).copied().unwrap_or(0);
        let recorded: u64 = named.values().sum::<u64>() + overflow;
        ctx.check(recorded == truth.calls - old.calls, || {
            format!(
                "worker {tid}: {recorded} calls recorded, {} made",
                truth.calls - old.calls
            )
        });
        ctx.check(named.len() == 2, || format!("two slots used: {named:?}"));
        for (j, name) in ["twice", "square", "negate"].iter().enumerate() {
            let seen = calls_to(name);
            ctx.check(seen == op[j] || (seen == 0 && *overflow == op[j]), || {
                format!(
                    "worker {tid}: {name} {seen} in the table (overflow {overflow}), {} made",
                    op[j]
                )
            });
        }
        let (named, overflow) = virtuals
            .get(tid)
            .unwrap_or_else(|| ctx.fail(format!("no virtual calls for worker {tid}")));
        let expect: BTreeMap<String, u64> = [
            ("square_area".to_string(), truth.sq - old.sq),
            ("circle_area".to_string(), truth.ci - old.ci),
        ]
        .into_iter()
        .filter(|(_, c)| *c > 0)
        .collect();
        ctx.check(*named == expect && *overflow == 0, || {
            format!(
                "worker {tid}: virtual targets {named:?} (overflow {overflow}), made {expect:?}"
            )
        });
        // The point before the call in the loop: once per iteration.
        let counted = report
            .threads
            .iter()
            .find(|r| r.tid == *tid)
            .and_then(|r| r.functions.get(&point_name))
            .map_or(0, |c| c.calls);
        ctx.check(counted == u64::from(n), || {
            format!("worker {tid}: {point_name} counted {counted}, {n} iterations")
        });
    }
    // Nothing for the main thread, which never made those calls.
    ctx.check(pointers.len() == 3 && virtuals.len() == 3, || {
        format!("only the workers: {pointers:?} {virtuals:?}")
    });

    // Removal: the code as it was, the program as before.
    let code = |p: &Process, f: &Function| p.read_memory(f.address, f.size as usize).unwrap();
    let mut held = p.hold().unwrap_or_else(|e| fail("hold", e));
    held.remove(&ids).unwrap_or_else(|e| fail("remove", e));
    let restored: Vec<Vec<u8>> = [&dispatch, &area, &worker]
        .iter()
        .map(|f| code(&held, f))
        .collect();
    held.release().unwrap_or_else(|e| fail("release", e));
    let (again, _) = run_round(&mut t, 100);
    let still = read(&mut p, ids[0]);
    for (tid, truth) in &again {
        ctx.check(truth.calls == after[tid].calls + 100, || {
            format!("worker {tid} runs on: {truth:?}")
        });
        let recorded: u64 = still[tid].0.values().sum::<u64>() + still[tid].1;
        ctx.check(recorded == u64::from(n), || {
            format!("worker {tid}: nothing recorded after removal ({recorded})")
        });
    }
    // The bytes are those of the executable's own text.
    let file = std::fs::read(points()).unwrap();
    let elf = object::File::parse(&*file).unwrap();
    use object::{Object, ObjectSection};
    let text = elf.section_by_name(".text").unwrap();
    let bias = dispatch.address - dispatch.vaddr;
    for (f, now) in [&dispatch, &area, &worker].iter().zip(&restored) {
        let off = (f.address - bias - text.address()) as usize;
        let on_disk = &text.data().unwrap()[off..off + f.size as usize];
        ctx.check(now.as_slice() == on_disk, || format!("{} restored", f.name));
    }
    t.send("quit");
}

#[test]
fn probes_before_and_after_a_call_see_its_arguments_and_result() {
    let ctx = Ctx::new("probes_before_and_after_a_call_see_its_arguments_and_result");
    let mut t = ctx.target(points(), &["1"]);
    wait_ready(&mut t);
    let fail = |what: &str, e: weft::Error| -> ! { ctx.fail(format!("{what}: {e}")) };
    let mut p = Process::open(t.pid as i32).unwrap_or_else(|e| fail("open", e));
    let dispatch = find(&ctx, &mut p, "dispatch");
    let site = indirect_call(&ctx, &mut p, &dispatch);
    let mut held = p.hold().unwrap_or_else(|e| fail("hold", e));
    let lib = held
        .load_library(probe_lib())
        .unwrap_or_else(|e| fail("load_library", e));
    let on_point = lib
        .symbol(held.image(), "on_point")
        .unwrap_or_else(|| ctx.fail("on_point not in the probe library"));
    let probe = |user| UserProbe {
        function: on_point,
        user,
        predicate: None,
    };
    let ids = held
        .insert_points(&[
            PointSpec::before_call(dispatch.clone(), &site).with_probe(probe(1)),
            PointSpec::after_call(dispatch.clone(), &site).with_probe(probe(2)),
        ])
        .unwrap_or_else(|e| fail("insert_points", e));
    held.release().unwrap_or_else(|e| fail("release", e));
    // Worker 0: i = 0..5, op j = i % 3 (twice, square, negate).
    let (_, lines) = run_round(&mut t, 6);
    let mut expected = Vec::new();
    for i in 0..6i64 {
        let r = [2 * i, i * i, -i][(i % 3) as usize];
        // Before `call *%rax`: the argument in rdi (the op in rax).
        expected.push(format!("user=1 arg0={i} point=2 at={:#x}", site.address));
        // After it: the op's result in rax.
        expected.push(format!(
            "user=2 ret={r} point=2 at={:#x}",
            site.address + site.len as u64
        ));
    }
    let seen: Vec<String> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("probe point "))
        .map(|l| {
            let keep = |f: &&str| {
                let user1 = l.starts_with("user=1");
                f.starts_with("user=")
                    || f.starts_with("point=")
                    || f.starts_with("at=")
                    || (user1 && f.starts_with("arg0="))
                    || (!user1 && f.starts_with("ret="))
            };
            l.split_whitespace()
                .filter(keep)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    ctx.check(seen == expected, || {
        format!("probe lines {seen:#?}, expected {expected:#?} (all lines {lines:#?})")
    });
    let mut held = p.hold().unwrap_or_else(|e| fail("hold", e));
    held.remove(&ids).unwrap_or_else(|e| fail("remove", e));
    held.release().unwrap_or_else(|e| fail("release", e));
    let (_, lines) = run_round(&mut t, 3);
    ctx.check(lines.iter().all(|l| !l.starts_with("probe")), || {
        format!("no probe after removal: {lines:?}")
    });
    t.send("quit");
}

#[test]
fn bad_points_are_refused_and_change_nothing() {
    let ctx = Ctx::new("bad_points_are_refused_and_change_nothing");
    let mut t = ctx.target(points(), &["1"]);
    wait_ready(&mut t);
    let fail = |what: &str, e: weft::Error| -> ! { ctx.fail(format!("{what}: {e}")) };
    let mut p = Process::open(t.pid as i32).unwrap_or_else(|e| fail("open", e));
    let (dispatch, worker) = (find(&ctx, &mut p, "dispatch"), find(&ctx, &mut p, "worker"));
    let site = indirect_call(&ctx, &mut p, &dispatch);
    let direct = direct_call_to(&ctx, &mut p, &worker, &dispatch);
    let before = p
        .read_memory(dispatch.address, dispatch.size as usize)
        .unwrap();
    // Checking a batch, not held: each point's verdict, in order (the
    // third overlaps the first, which passes), and nothing changed.
    let verdicts = p.check_points(&[
        PointSpec::before_call(worker.clone(), &direct),
        PointSpec::at(worker.clone(), direct.address + 1),
        PointSpec::at(worker.clone(), direct.address),
    ]);
    let says = |k: usize, what: &str| verdicts[k].as_deref().is_some_and(|r| r.contains(what));
    ctx.check(
        verdicts.len() == 3
            && verdicts[0].is_none()
            && says(1, "not the start of an instruction")
            && says(2, "same batch"),
        || format!("check_points: {verdicts:?}"),
    );
    ctx.check(p.probes().is_empty(), || {
        "check_points changed something".into()
    });
    let mut held = p.hold().unwrap_or_else(|e| fail("hold", e));
    let refused = |p: &mut Held, specs: &[PointSpec], why: &str| match p.insert_points(specs) {
        Err(weft::Error::Refused(r)) => {
            let text = r
                .iter()
                .map(|r| r.reason.clone())
                .collect::<Vec<_>>()
                .join("; ");
            ctx.check(text.contains(why), || {
                format!("refusal {text:?} should say {why:?}")
            });
        }
        other => ctx.fail(format!("expected a refusal ({why}), got {other:?}")),
    };
    // The middle of the 5-byte call: no instruction starts there.
    refused(
        &mut held,
        &[PointSpec::at(worker.clone(), direct.address + 1)],
        "not the start of an instruction",
    );
    // Outside the function.
    refused(
        &mut held,
        &[PointSpec::at(
            dispatch.clone(),
            dispatch.address + dispatch.size,
        )],
        "outside the function",
    );
    // Call targets at a direct call.
    refused(
        &mut held,
        &[PointSpec::call_targets(worker.clone(), &direct, 2)],
        "recorded at an indirect call",
    );
    // A good point and a bad one in one batch: neither goes in.
    refused(
        &mut held,
        &[
            PointSpec::call_targets(dispatch.clone(), &site, 0),
            PointSpec::before_call(worker.clone(), &direct),
        ],
        "1 to 64 slots",
    );
    // Two points whose patches overlap: the short call's is patched from
    // the instruction before it, which is the other point.
    let code = function_code(held.image(), &dispatch).unwrap();
    let previous = code
        .instructions
        .iter()
        .find(|i| i.address + i.len as u64 == site.address)
        .unwrap_or_else(|| ctx.fail("no instruction before the call"))
        .address;
    refused(
        &mut held,
        &[
            PointSpec::before_call(dispatch.clone(), &site),
            PointSpec::at(dispatch.clone(), previous),
        ],
        "overlaps",
    );
    // A point on the function's second instruction, then the entry probe,
    // whose patch covers it.
    let second = code.instructions[1].address;
    let id = held
        .insert_points(&[PointSpec::at(dispatch.clone(), second)])
        .unwrap_or_else(|e| fail("insert_points", e));
    match held.insert_counters(std::slice::from_ref(&dispatch)) {
        Err(weft::Error::Refused(r)) => ctx.check(r[0].reason.contains("overlaps"), || {
            format!("entry over a point: {}", r[0].reason)
        }),
        other => ctx.fail(format!("an entry probe over a point: {other:?}")),
    }
    held.remove(&id).unwrap_or_else(|e| fail("remove", e));
    let after = held
        .read_memory(dispatch.address, dispatch.size as usize)
        .unwrap();
    ctx.check(before == after, || "dispatch unchanged".into());
    // Side by side, the entry probe and a point after it both count.
    let mut ids = held
        .insert_points(&[PointSpec::at(dispatch.clone(), previous)])
        .unwrap_or_else(|e| fail("insert_points", e));
    ids.extend(
        held.insert_counters(std::slice::from_ref(&dispatch))
            .unwrap_or_else(|e| fail("insert_counters beside a point", e)),
    );
    held.release().unwrap_or_else(|e| fail("release", e));
    let (truth, _) = run_round(&mut t, 10);
    ctx.check(truth.values().all(|w| w.calls == 10), || {
        format!("the target runs as before: {truth:?}")
    });
    let report = p.report();
    let point = format!("dispatch+{:#x}", previous - dispatch.address);
    let count = |name: &str| {
        report
            .functions
            .iter()
            .find(|f| f.name == name)
            .map_or(0, |f| f.calls)
    };
    ctx.check(count("dispatch") == 10 && count(&point) == 10, || {
        format!("entry and {point} 10 each: {:?}", report.functions)
    });
    let mut held = p.hold().unwrap_or_else(|e| fail("hold", e));
    held.remove(&ids).unwrap_or_else(|e| fail("remove", e));
    let after = held
        .read_memory(dispatch.address, dispatch.size as usize)
        .unwrap();
    ctx.check(before == after, || "dispatch restored".into());
    held.release().unwrap_or_else(|e| fail("release", e));
    t.send("quit");
}

/// Points inserted and removed 200 times while two threads spin through
/// them (a call site in the loop, an instruction inside the callee): the
/// target's results never change, both points count, and per thread they
/// agree to within one call per insertion and removal (a thread between
/// the two when the world stopped).
#[test]
fn points_come_and_go_under_load() {
    let ctx = Ctx::new("points_come_and_go_under_load");
    let mut t = ctx.target(cycles(), &[]);
    wait_ready(&mut t);
    let fail = |what: &str, e: weft::Error| -> ! { ctx.fail(format!("{what}: {e}")) };
    let mut p = Process::open(t.pid as i32).unwrap_or_else(|e| fail("open", e));
    let (run, hot) = (find(&ctx, &mut p, "run"), find(&ctx, &mut p, "hot"));
    let call = direct_call_to(&ctx, &mut p, &run, &hot);
    let inside = function_code(p.image(), &hot).unwrap().instructions[1].address;
    const CYCLES: u64 = 200;
    for cycle in 0..CYCLES {
        let mut held = p.hold().unwrap_or_else(|e| fail("hold", e));
        let ids = held
            .insert_points(&[
                PointSpec::before_call(run.clone(), &call),
                PointSpec::at(hot.clone(), inside),
            ])
            .unwrap_or_else(|e| fail(&format!("cycle {cycle}: insert_points"), e));
        held.release().unwrap_or_else(|e| fail("release", e));
        std::thread::sleep(std::time::Duration::from_micros(200));
        let mut held = p.hold().unwrap_or_else(|e| fail("hold", e));
        held.remove(&ids)
            .unwrap_or_else(|e| fail(&format!("cycle {cycle}: remove"), e));
        held.release().unwrap_or_else(|e| fail("release", e));
    }
    // Every cycle's points have words of their own; the report adds up
    // the probes of one point.
    let report = p.report();
    let at_call = format!("run+{:#x}", call.address - run.address);
    let in_hot = format!("hot+{:#x}", inside - hot.address);
    let mut total = 0;
    for thread in &report.threads {
        let get = |n: &str| thread.functions.get(n).map_or(0, |c| c.calls);
        let (a, b) = (get(&at_call), get(&in_hot));
        total += a;
        ctx.check(a.abs_diff(b) <= 2 * CYCLES, || {
            format!("thread {}: {at_call} {a}, {in_hot} {b}", thread.tid)
        });
    }
    ctx.check(total > CYCLES, || {
        format!("the points counted {total} calls over {CYCLES} windows: {report:?}")
    });
    stop_cycles(&mut t, 2, "after 200 point cycles");
}

/// Where calls through a PLT stub really go: a point at the stub's
/// `jmp [rip + slot]` records, per thread, the library function each
/// thread reached through it (`sem_post`: once a round in each worker, a
/// round's worth of times in the main thread, which starts the workers).
#[test]
fn a_plt_stub_records_the_function_it_reaches() {
    let ctx = Ctx::new("a_plt_stub_records_the_function_it_reaches");
    let workers = 2u64;
    let mut t = ctx.target(points(), &["2"]);
    wait_ready(&mut t);
    let fail = |what: &str, e: weft::Error| -> ! { ctx.fail(format!("{what}: {e}")) };
    let mut p = Process::open(t.pid as i32).unwrap_or_else(|e| fail("open", e));
    let worker = find(&ctx, &mut p, "worker");
    // The worker's call to sem_post goes to a PLT stub.
    let stub = calls(&ctx, &mut p, &worker)
        .iter()
        .find_map(|c| match c.target {
            CallTarget::Direct(to)
                if weft::code::plt_import(p.image(), to).as_deref() == Some("sem_post") =>
            {
                Some(to)
            }
            _ => None,
        })
        .unwrap_or_else(|| ctx.fail("no call to sem_post@plt in worker"));
    // The stub's code: the PLT (an unwind entry covers it) decoded.
    let plt = p
        .image()
        .function_at(stub)
        .ok()
        .flatten()
        .unwrap_or_else(|| ctx.fail(format!("no function covers the PLT stub at {stub:#x}")));
    let jump = function_code(p.image(), &plt)
        .unwrap_or_else(|e| ctx.fail(format!("function_code of the PLT: {e}")))
        .instructions
        .iter()
        .find(|i| i.address >= stub && matches!(i.flow, Flow::IndirectJump { .. }))
        .unwrap_or_else(|| ctx.fail("no jmp [rip + slot] in the stub"))
        .address;
    let mut held = p.hold().unwrap_or_else(|e| fail("hold", e));
    let ids = held
        .insert_points(&[PointSpec::targets_at(plt, jump, 2)])
        .unwrap_or_else(|e| fail("insert_points at the PLT stub", e));
    held.release().unwrap_or_else(|e| fail("release", e));
    let rounds = 5u64;
    let mut tids = Vec::new();
    for _ in 0..rounds {
        let (truth, _) = run_round(&mut t, 10);
        tids = truth.keys().copied().collect();
    }
    let sem_post = p
        .find_functions(&[Pattern::parse("libc.so.6:sem_post").unwrap()])
        .unwrap_or_else(|e| fail("find libc's sem_post", e))
        .remove(0);
    let rows = p
        .call_targets(ids[0])
        .unwrap_or_else(|e| fail("call_targets", e));
    for row in &rows {
        let expected = if tids.contains(&row.tid) {
            rounds // a worker: one sem_post(&done) a round
        } else {
            rounds * workers // main: one sem_post(&go) per worker a round
        };
        ctx.check(
            row.targets == vec![(sem_post.address, expected)] && row.overflow == 0,
            || {
                format!(
                    "thread {}: reached {:x?} through the stub, expected sem_post at {:#x} x{expected}",
                    row.tid, row.targets, sem_post.address
                )
            },
        );
    }
    ctx.check(rows.len() as u64 == workers + 1, || {
        format!("every thread went through the stub: {rows:?}")
    });
    let mut held = p.hold().unwrap_or_else(|e| fail("hold", e));
    held.remove(&ids).unwrap_or_else(|e| fail("remove", e));
    held.release().unwrap_or_else(|e| fail("release", e));
    let (truth, _) = run_round(&mut t, 10);
    ctx.check(truth.len() as u64 == workers, || {
        format!("the target runs on: {truth:?}")
    });
    t.send("quit");
}
