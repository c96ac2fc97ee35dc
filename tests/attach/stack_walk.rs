//! Walking the stacks of a stopped process's threads (`Held::stack`):
//! from the blocking call out to each thread's start, through code built
//! without frame pointers, and leaving the target running unchanged.

use crate::support;

use support::*;
use weft::Process;

/// The names of the functions on thread `tid`'s stack, innermost first.
fn names(held: &mut weft::Held<'_>, tid: weft::Tid) -> Vec<String> {
    let frames = held.stack(tid, 64).expect("walk the stack");
    frames
        .iter()
        .enumerate()
        .map(|(i, f)| {
            held.image()
                .function_at(f.lookup_address(i == 0))
                .ok()
                .flatten()
                .map(|f| f.name)
                .unwrap_or_else(|| format!("{:#x}", f.pc))
        })
        .collect()
}

/// Whether `want` appears in `names` in this order (others between).
fn in_order(names: &[String], want: &[&str]) -> bool {
    let mut it = names.iter();
    want.iter().all(|w| it.any(|n| n == w))
}

#[test]
fn names_every_frame_of_each_thread_from_its_cfi() {
    let ctx = Ctx::new("names_every_frame_of_each_thread_from_its_cfi");
    // Without frame pointers (CFA from rsp), and with them (from rbp,
    // which frames that do not save it leave as it was).
    for flags in [
        &["-O2", "-fomit-frame-pointer"][..],
        &["-O0", "-fno-omit-frame-pointer"][..],
    ] {
        let mut all = flags.to_vec();
        all.extend(["-fno-optimize-sibling-calls", "-pthread"]);
        let exe = build_c_target("stackwalk", &all);
        walk_and_check(&ctx, &exe);
    }
}

fn walk_and_check(ctx: &Ctx, exe: &std::path::Path) {
    let mut t = ctx.target(exe, &[]);
    t.expect_stdout("ready", |l| l == "ready");
    // Both threads reach their read.
    std::thread::sleep(std::time::Duration::from_millis(100));
    let pid = t.pid as i32;
    let mut process = Process::open(pid).expect("open the target");
    let mut held = process.hold().expect("hold");
    let threads = held.threads();
    ctx.check(threads.len() == 2, || format!("threads {threads:?}"));
    for tid in threads {
        let stack = names(&mut held, tid);
        let want: &[&str] = if tid == pid {
            &[
                "read",
                "inner",
                "middle",
                "outer",
                "main",
                "__libc_start_main",
            ]
        } else {
            &[
                "read",
                "wait_here",
                "worker_loop",
                "worker_main",
                "start_thread",
            ]
        };
        ctx.check(in_order(&stack, want), || {
            format!("thread {tid}: stack {stack:?}, wanted {want:?} in order")
        });
        // The walk ends at the outermost frame, not in the middle.
        let last = stack.last().cloned().unwrap_or_default();
        ctx.check(
            ["_start", "clone3", "__clone", "clone", "__libc_start_main"]
                .iter()
                .any(|o| last.contains(o)),
            || format!("thread {tid}: the walk stopped at {last} ({stack:?})"),
        );
    }
    held.release().expect("release");
    drop(process);
    t.close_stdin();
    t.expect_stdout("done", |l| l.starts_with("done "));
    t.wait_exit();
}

/// A thread asleep inside a timed function: the exit hook replaced the
/// return address on its stack, and the walk reads through it (from the
/// runtime's activation cells) to the caller and the thread's start, not
/// into weft's exit code (a CPython thread's path once began at
/// `weft_rt_call_records`).
#[test]
fn walks_through_a_frame_whose_exit_is_hooked() {
    let ctx = Ctx::new("walks_through_a_frame_whose_exit_is_hooked");
    for compiler in ["gcc", "clang"] {
        let exe = build_c_target_with(compiler, "stackwalk_hooked", &["-O2", "-g", "-pthread"]);
        walk_through_hooked_nap(&ctx, &exe);
    }
}

fn walk_through_hooked_nap(ctx: &Ctx, exe: &std::path::Path) {
    let mut t = ctx.target(exe, &[]);
    t.expect_stdout("ready", |l| l == "ready");
    let pid = t.pid as i32;
    let mut process = Process::open(pid).expect("open the target");
    let mut held = process.hold().expect("hold");
    let nap = held
        .find_functions(&[weft::Pattern::parse("nap").unwrap()])
        .expect("find nap");
    let ids = held.insert(&nap, weft::Metrics::ALL).expect("time nap");
    held.release().expect("release");
    // Several naps begin under the hook; the walks catch one asleep.
    std::thread::sleep(std::time::Duration::from_millis(100));
    let mut checked = 0;
    for _ in 0..5 {
        let mut held = process.hold().expect("hold");
        let worker = held.threads().into_iter().find(|&tid| tid != pid);
        if let Some(tid) = worker {
            let stack = names(&mut held, tid);
            if stack.iter().any(|n| n == "nap") {
                ctx.check(
                    in_order(&stack, &["nap", "tick", "worker_main", "start_thread"]),
                    || {
                        format!(
                            "{}: the walk through nap's hooked exit: {stack:?}",
                            exe.display()
                        )
                    },
                );
                ctx.check(!stack.iter().any(|n| n.contains("weft_rt")), || {
                    format!("the walk went into weft's runtime: {stack:?}")
                });
                checked += 1;
            }
        }
        held.release().expect("release");
        std::thread::sleep(std::time::Duration::from_millis(30));
    }
    ctx.check(checked > 0, || "no walk found the worker inside nap".into());
    let mut held = process.hold().expect("hold");
    held.remove(&ids).expect("remove");
    held.release().expect("release");
    drop(process);
    t.close_stdin();
    t.expect_stdout("done", |l| l.starts_with("done "));
    t.wait_exit();
}
