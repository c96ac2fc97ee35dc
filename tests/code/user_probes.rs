//! User probes through the library API (issue #6): a library of C probe
//! functions loaded into a running target, called at entries with the
//! integer, pointer and floating-point arguments and at exits with the
//! return values, a predicate on an argument, and the target back to normal
//! after removal. Checked from inside the target: the probes write to its
//! own stdout, between the lines the target prints itself.

use crate::support;

use support::*;
use weft::inspect::ProcessImage;
use weft::{Metrics, Pattern, ProbeSpec, Process, UserProbe};
use weft_codegen::Predicate;

/// The target's lines for `run n`, up to `round n done`.
fn run_round(t: &mut Proc, n: u32) -> Vec<String> {
    t.send(&format!("run {n}"));
    let mut lines = Vec::new();
    loop {
        let l = t.expect_stdout("a line of the round", |_| true);
        let done = l == format!("round {n} done");
        lines.push(l);
        if done {
            return lines;
        }
    }
}

/// The target's own lines for round `n` (what it prints without probes).
fn plain_round(n: u32) -> Vec<String> {
    let mut v = Vec::new();
    for i in 1..=n {
        v.push(format!("note {i}"));
        v.push(call_line(i));
    }
    v.push(format!("round {n} done"));
    v
}

/// The target's own line for call `i`.
fn call_line(i: u32) -> String {
    format!(
        "call {i} add3={} scale={:.2} pick={}",
        6 * i,
        2.0 * (f64::from(i) + 0.5),
        if i % 2 == 1 { "odd" } else { "even" }
    )
}

#[test]
fn probes_see_arguments_and_results_and_leave_nothing_behind() {
    let ctx = Ctx::new("probes_see_arguments_and_results_and_leave_nothing_behind");
    let mut t = ctx.target(probed(), &[]);
    let (pid, _) = wait_ready(&mut t);
    let fail = |what: &str, e: weft::Error| -> ! { ctx.fail(format!("{what}: {e}")) };
    let mut p = Process::open(pid as i32).unwrap_or_else(|e| fail("open", e));
    let find = |p: &mut Process, name: &str| {
        p.find_functions(&[Pattern::parse(name).unwrap()])
            .unwrap_or_else(|e| ctx.fail(format!("find {name}: {e}")))
            .remove(0)
    };
    let (add3, scale, pick) = (
        find(&mut p, "add3"),
        find(&mut p, "scale"),
        find(&mut p, "pick"),
    );
    let mut held = p.hold().unwrap_or_else(|e| fail("hold", e));
    let lib = held
        .load_library(probe_lib())
        .unwrap_or_else(|e| fail("load_library", e));
    let sym = |image: &mut ProcessImage, name: &str| {
        lib.symbol(image, name)
            .unwrap_or_else(|| ctx.fail(format!("{name} not found in {}", lib.path.display())))
    };
    let probe = |image: &mut ProcessImage, name: &str, user: u64| UserProbe {
        function: sym(image, name),
        user,
        predicate: None,
    };
    let specs = vec![
        ProbeSpec {
            on_entry: Some(probe(held.image(), "on_add3", 7)),
            on_exit: Some(probe(held.image(), "on_add3_exit", 0)),
            ..ProbeSpec::measure(add3.clone(), Metrics::CALLS)
        },
        ProbeSpec {
            on_entry: Some(probe(held.image(), "on_scale", 0)),
            on_exit: Some(probe(held.image(), "on_scale_exit", 0)),
            // Timers and an exit probe on one function.
            ..ProbeSpec::measure(scale.clone(), Metrics::ALL)
        },
        ProbeSpec {
            on_exit: Some(probe(held.image(), "on_pick_exit", 0)),
            ..ProbeSpec::measure(pick.clone(), Metrics::CALLS)
        },
    ];
    let ids = held
        .insert_probes(&specs)
        .unwrap_or_else(|e| fail("insert_probes", e));
    held.release().unwrap_or_else(|e| fail("release", e));

    let lines = run_round(&mut t, 3);
    let thread = lines
        .first()
        .and_then(|l| l.split("thread=").nth(1))
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| ctx.fail(format!("no probe line first: {lines:?}")))
        .to_string();
    let mut expected = Vec::new();
    for i in 1..=3u32 {
        let x = f64::from(i) + 0.5;
        expected.push(format!(
            "probe entry add3 {i} {} {} user=7 thread={thread} point=0",
            2 * i,
            3 * i
        ));
        expected.push(format!("probe exit add3 ret={} point=1", 6 * i));
        expected.push(format!("probe entry scale {x:.2} k=2.00"));
        expected.push(format!("probe exit scale {:.2}", 2.0 * x));
        expected.push(format!(
            "probe exit pick {}",
            if i % 2 == 1 { "odd" } else { "even" }
        ));
        expected.push(format!("note {i}"));
        expected.push(call_line(i));
    }
    expected.push("round 3 done".into());
    ctx.check(lines == expected, || {
        format!("with probes, round 3 printed\n{lines:#?}\nexpected\n{expected:#?}")
    });
    let report = p.report();
    ctx.check(report.functions.iter().all(|f| f.calls == 3), || {
        format!("every instrumented function was called 3 times: {report:?}")
    });

    // Out again: the target prints only its own lines.
    let mut held = p.hold().unwrap_or_else(|e| fail("hold", e));
    held.remove(&ids).unwrap_or_else(|e| fail("remove", e));
    held.release().unwrap_or_else(|e| fail("release", e));
    let lines = run_round(&mut t, 2);
    ctx.check(lines == plain_round(2), || {
        format!("after removal, round 2 printed {lines:#?}")
    });

    // A predicate: add3's entry probe only when its first argument is 2.
    let mut held = p.hold().unwrap_or_else(|e| fail("hold", e));
    let only_two = UserProbe {
        predicate: Some(Predicate::ArgEquals { arg: 0, value: 2 }),
        ..probe(held.image(), "on_add3", 9)
    };
    held.insert_probes(&[ProbeSpec {
        on_entry: Some(only_two),
        ..ProbeSpec::measure(add3.clone(), Metrics::CALLS)
    }])
    .unwrap_or_else(|e| fail("insert with a predicate", e));
    held.release().unwrap_or_else(|e| fail("release", e));
    let lines = run_round(&mut t, 3);
    let mut expected = plain_round(3);
    // Before call 2's lines ("note 2", "call 2 ...").
    expected.insert(
        2,
        format!("probe entry add3 2 4 6 user=9 thread={thread} point=0"),
    );
    ctx.check(lines == expected, || {
        format!("with the predicate, round 3 printed {lines:#?}")
    });
    let mut held = p.hold().unwrap_or_else(|e| fail("hold", e));
    held.remove_all().unwrap_or_else(|e| fail("remove_all", e));

    // Thread predicates on exit probes: pick's for the target's thread
    // runs, scale's for another index never does; an argument predicate at
    // an exit is refused, changing nothing.
    let thread_index: u32 = thread.parse().unwrap();
    let on_thread = |image: &mut ProcessImage, name: &str, t: u32| UserProbe {
        predicate: Some(Predicate::Thread(t)),
        ..probe(image, name, 0)
    };
    let by_argument = UserProbe {
        predicate: Some(Predicate::ArgEquals { arg: 0, value: 1 }),
        ..probe(held.image(), "on_pick_exit", 0)
    };
    let refused = held.insert_probes(&[ProbeSpec {
        on_exit: Some(by_argument),
        ..ProbeSpec::measure(pick.clone(), Metrics::CALLS)
    }]);
    ctx.check(
        matches!(&refused, Err(weft::Error::Refused(r)) if r[0].reason.contains("only name a thread")),
        || format!("an argument predicate at an exit: {refused:?}"),
    );
    let specs = [
        ProbeSpec {
            on_exit: Some(on_thread(held.image(), "on_pick_exit", thread_index)),
            ..ProbeSpec::measure(pick.clone(), Metrics::CALLS)
        },
        ProbeSpec {
            on_exit: Some(on_thread(held.image(), "on_scale_exit", thread_index + 1)),
            ..ProbeSpec::measure(scale.clone(), Metrics::CALLS)
        },
    ];
    held.insert_probes(&specs)
        .unwrap_or_else(|e| fail("insert exit probes with thread predicates", e));
    held.release().unwrap_or_else(|e| fail("release", e));
    let lines = run_round(&mut t, 2);
    let mut expected = plain_round(2);
    expected.insert(0, "probe exit pick odd".into());
    expected.insert(3, "probe exit pick even".into());
    ctx.check(lines == expected, || {
        format!("with thread predicates at exits, round 2 printed {lines:#?}")
    });
    let mut held = p.hold().unwrap_or_else(|e| fail("hold", e));
    held.remove_all().unwrap_or_else(|e| fail("remove_all", e));
    held.release().unwrap_or_else(|e| fail("release", e));
    t.send("quit");
    t.wait_code(0);
}

/// Bad input gives errors that say what to do, and changes nothing.
#[test]
fn loading_what_is_not_a_library_fails_clearly() {
    let ctx = Ctx::new("loading_what_is_not_a_library_fails_clearly");
    let mut t = ctx.target(probed(), &[]);
    let (pid, _) = wait_ready(&mut t);
    let mut p = Process::open(pid as i32).unwrap_or_else(|e| ctx.fail(format!("open: {e}")));
    let mut held = p.hold().unwrap_or_else(|e| ctx.fail(format!("hold: {e}")));
    let missing = held
        .load_library("/nonexistent/libnothing.so")
        .unwrap_err()
        .to_string();
    ctx.check(
        missing.contains("/nonexistent/libnothing.so") && missing.contains("-shared"),
        || format!("missing library: {missing}"),
    );
    let not_elf = held
        .load_library(src_path("probed.c"))
        .unwrap_err()
        .to_string();
    ctx.check(not_elf.contains("dlopen refused"), || {
        format!("a C source: {not_elf}")
    });
    held.release()
        .unwrap_or_else(|e| ctx.fail(format!("release: {e}")));
    let lines = run_round(&mut t, 1);
    ctx.check(lines == plain_round(1), || {
        format!("the target after the refusals: {lines:?}")
    });
    t.send("quit");
    t.wait_code(0);
}

fn src_path(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/targets")
        .join(name)
}

/// A function redirected to one from a loaded library, which calls the
/// original; removing the replacement puts the original back.
#[test]
fn a_replaced_function_and_back() {
    let ctx = Ctx::new("a_replaced_function_and_back");
    let mut t = ctx.target(probed(), &[]);
    let (pid, _) = wait_ready(&mut t);
    let fail = |what: &str, e: weft::Error| -> ! { ctx.fail(format!("{what}: {e}")) };
    let mut p = Process::open(pid as i32).unwrap_or_else(|e| fail("open", e));
    let add3 = p
        .find_functions(&[Pattern::parse("add3").unwrap()])
        .unwrap_or_else(|e| fail("find", e))
        .remove(0);
    let mut held = p.hold().unwrap_or_else(|e| fail("hold", e));
    let lib = held
        .load_library(probe_lib())
        .unwrap_or_else(|e| fail("load_library", e));
    let with = lib
        .symbol(held.image(), "add3_times10")
        .unwrap_or_else(|| ctx.fail("no add3_times10"));
    let slot = lib
        .symbol(held.image(), "add3_original")
        .unwrap_or_else(|| ctx.fail("no add3_original"));
    let r = held
        .replace_function(&add3, with)
        .unwrap_or_else(|e| fail("replace_function", e));
    held.write_memory(slot, &r.original.to_le_bytes())
        .unwrap_or_else(|e| fail("write the original's address", e));
    // A second probe on a replaced function is refused, nothing changed.
    let again = held.insert(std::slice::from_ref(&add3), Metrics::CALLS);
    ctx.check(again.is_ok_and(|ids| ids.is_empty()), || {
        "instrumenting a replaced function must be skipped".into()
    });
    held.release().unwrap_or_else(|e| fail("release", e));
    let lines = run_round(&mut t, 2);
    let mut expected = plain_round(2);
    expected[1] = expected[1].replace("add3=6", "add3=60");
    expected[3] = expected[3].replace("add3=12", "add3=120");
    ctx.check(lines == expected, || format!("replaced: {lines:#?}"));
    let mut held = p.hold().unwrap_or_else(|e| fail("hold", e));
    held.remove(&[r.id]).unwrap_or_else(|e| fail("remove", e));
    held.release().unwrap_or_else(|e| fail("release", e));
    let lines = run_round(&mut t, 2);
    ctx.check(lines == plain_round(2), || format!("restored: {lines:#?}"));
    t.send("quit");
    t.wait_code(0);
}

/// One call site of `main` redirected to another function, another taken
/// out; both back after removal. The sites come from the code inspection
/// API (main's direct calls to `scale` and `note`).
#[test]
fn call_sites_redirected_and_removed_and_back() {
    let ctx = Ctx::new("call_sites_redirected_and_removed_and_back");
    let mut t = ctx.target(probed(), &[]);
    let (pid, _) = wait_ready(&mut t);
    let fail = |what: &str, e: weft::Error| -> ! { ctx.fail(format!("{what}: {e}")) };
    let mut p = Process::open(pid as i32).unwrap_or_else(|e| fail("open", e));
    let find = |p: &mut Process, name: &str| {
        p.find_functions(&[Pattern::parse(name).unwrap()])
            .unwrap_or_else(|e| ctx.fail(format!("find {name}: {e}")))
            .remove(0)
    };
    let (main, scale, note) = (
        find(&mut p, "main"),
        find(&mut p, "scale"),
        find(&mut p, "note"),
    );
    let code = weft::code::function_code(p.image(), &main)
        .unwrap_or_else(|e| ctx.fail(format!("main's code: {e}")));
    let site_of = |target: u64| {
        code.calls
            .iter()
            .find(|c| c.target == weft_codegen::cfg::CallTarget::Direct(target))
            .map(|c| c.address)
            .unwrap_or_else(|| ctx.fail(format!("main has no direct call to {target:#x}")))
    };
    let (scale_site, note_site) = (site_of(scale.address), site_of(note.address));
    let mut held = p.hold().unwrap_or_else(|e| fail("hold", e));
    let lib = held
        .load_library(probe_lib())
        .unwrap_or_else(|e| fail("load_library", e));
    let negated = lib
        .symbol(held.image(), "scale_negated")
        .unwrap_or_else(|| ctx.fail("no scale_negated"));
    let a = held
        .redirect_call(scale_site, negated)
        .unwrap_or_else(|e| fail("redirect_call", e));
    let b = held
        .remove_call(note_site)
        .unwrap_or_else(|e| fail("remove_call", e));
    // Not a call: refused, with the reason.
    let refused = held.remove_call(main.address).unwrap_err().to_string();
    ctx.check(refused.contains("not a direct call"), || {
        format!("refusal: {refused}")
    });
    held.release().unwrap_or_else(|e| fail("release", e));
    let lines = run_round(&mut t, 2);
    let expected: Vec<String> = vec![
        call_line(1).replace("scale=3.00", "scale=-3.00"),
        call_line(2).replace("scale=5.00", "scale=-5.00"),
        "round 2 done".into(),
    ];
    ctx.check(lines == expected, || {
        format!("changed call sites: {lines:#?}")
    });
    let mut held = p.hold().unwrap_or_else(|e| fail("hold", e));
    held.remove(&[a, b]).unwrap_or_else(|e| fail("remove", e));
    held.release().unwrap_or_else(|e| fail("release", e));
    let lines = run_round(&mut t, 2);
    ctx.check(lines == plain_round(2), || format!("restored: {lines:#?}"));
    t.send("quit");
    t.wait_code(0);
}
