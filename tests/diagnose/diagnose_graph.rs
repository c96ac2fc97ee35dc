//! The diagnose search's code axis on a real process: direct callees,
//! library functions named through their PLT stubs (or, built with
//! `-fno-plt`, their GOT slots), indirect call sites left open until their
//! targets are learnt at run time.

use crate::support;

use std::path::PathBuf;
use support::*;
use weft::diagnose::{CallGraph, StaticCallGraph};
use weft::{Pattern, Process};

fn target(flags: &[&str]) -> PathBuf {
    let mut all = vec!["-O1", "-fno-inline"];
    all.extend(flags);
    build_c_target("callgraph_small", &all)
}

#[test]
fn callees_from_code_and_indirect_targets_learnt() {
    callees_of("callees_from_code_and_indirect_targets_learnt", target(&[]));
}

/// `-fno-plt` code calls libraries through their GOT slots (`call [rip +
/// slot]`): the calls are named as through stubs, and only the function
/// pointer table stays an indirect site.
#[test]
fn calls_through_got_slots_are_named_callees() {
    callees_of(
        "calls_through_got_slots_are_named_callees",
        target(&["-fno-plt"]),
    );
}

fn callees_of(name: &str, exe: PathBuf) {
    // Not beside the other files' searches, which measure shares of the
    // machine (the binary's turn).
    let _one = one_at_a_time();
    let ctx = Ctx::new(name);
    let mut t = ctx.target(&exe, &[]);
    t.expect_stdout("ready", |l| l == "ready");
    let mut process = Process::open(t.pid as i32).expect("open the target");
    let serve = process
        .find_functions(&[Pattern::parse("exe:serve").unwrap()])
        .expect("serve")
        .remove(0);
    let mut graph = StaticCallGraph::new();
    let calls = graph.explore(process.image(), &serve).clone();
    let direct: Vec<&str> = calls.direct.iter().map(String::as_str).collect();
    for want in ["wait_lock", "read_input"] {
        ctx.check(direct.contains(&want), || {
            format!("serve's direct callees {direct:?} lack {want}")
        });
    }
    ctx.check(!direct.contains(&"handle_get"), || {
        "handle_get is reached only through the table".into()
    });
    ctx.check(calls.indirect_sites.len() == 1, || {
        format!(
            "serve has one indirect call, found {:?}",
            calls.indirect_sites
        )
    });

    // Library functions through their stubs are named.
    let wait_lock = graph.function("wait_lock").cloned().expect("met wait_lock");
    let lock_calls = graph.explore(process.image(), &wait_lock).clone();
    ctx.check(lock_calls.direct.contains("pthread_mutex_lock"), || {
        format!("wait_lock's callees {:?}", lock_calls.direct)
    });
    let read_input = graph
        .function("read_input")
        .cloned()
        .expect("met read_input");
    let read_calls = graph.explore(process.image(), &read_input).clone();
    ctx.check(read_calls.direct.contains("read"), || {
        format!("read_input's callees {:?}", read_calls.direct)
    });

    // A target learnt at run time joins the callees the search refines.
    let handle = process
        .find_functions(&[Pattern::parse("exe:handle_get").unwrap()])
        .expect("handle_get")
        .remove(0);
    graph.learn("serve", handle);
    let callees = graph.callees("serve");
    ctx.check(callees.contains(&"handle_get".to_string()), || {
        format!("after learning, serve's callees are {callees:?}")
    });
    drop(process);
    t.close_stdin();
    t.wait_exit();
}
