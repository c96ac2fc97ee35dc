//! A dynamic call graph of a running program, per thread: every call site
//! of the functions asked for gets an instruction point — a direct call is
//! counted where it is, an indirect call (a function pointer, a virtual
//! call) records which functions it actually reaches — and the graph is
//! printed with each edge's calls, in total and per thread. This is how a
//! bottleneck search completes the call graph that the code alone leaves
//! open at every indirect call.
//!
//! Run: `cargo run --example callgraph` (builds examples/c/plugins.c, a
//! server whose requests go through a handler table and a codec's vtable,
//! starts it, instruments every call site of its executable, and checks
//! the graph against the counts its threads keep themselves).

mod common;

use anyhow::{bail, Context, Result};
use common::{build_program, work_dir, Server};
use std::collections::BTreeMap;
use weft::code::{function_code, CallTarget};
use weft::{Pattern, PointSpec, Process};

/// Targets one indirect call site keeps per thread (more are overflow).
const SLOTS: u32 = 8;

/// One edge of the graph: caller, callee, indirect or not.
type Edge = (String, String, bool);

fn main() -> Result<()> {
    let dir = work_dir("callgraph");
    let exe = build_program(&dir, "plugins");
    let (workers, requests) = (3, 3000);
    let mut server = Server::start(&exe, workers, requests);
    let mut process = Process::open(server.pid()).context("opening the server")?;

    // Every call site of every function of the executable.
    let functions = process.find_functions(&[Pattern::parse("plugins:*")?])?;
    let mut specs = Vec::new();
    for f in &functions {
        let Ok(code) = function_code(process.image(), f) else {
            continue;
        };
        for site in &code.calls {
            specs.push(match site.target {
                CallTarget::Direct(_) => PointSpec::before_call(f.clone(), site),
                CallTarget::Indirect { .. } => PointSpec::call_targets(f.clone(), site, SLOTS),
            });
        }
    }
    // Some sites cannot be patched safely (too close to a branch target, in
    // a function with a jump table...): keep the others, in one batch.
    let verdicts = process.check_points(&specs);
    let refused = verdicts.iter().filter(|v| v.is_some()).count();
    for (spec, why) in specs.iter().zip(&verdicts) {
        if let Some(why) = why {
            eprintln!("callgraph: skipping the call at {:#x}: {why}", spec.address);
        }
    }
    let specs: Vec<PointSpec> = specs
        .into_iter()
        .zip(verdicts)
        .filter_map(|(s, v)| v.is_none().then_some(s))
        .collect();
    let mut held = process.hold()?;
    let ids = held.insert_points(&specs)?;
    held.release()?;

    server.send("go");
    let lines = server.until_done();

    // The graph: edge -> per-thread calls.
    let mut graph: BTreeMap<Edge, BTreeMap<u32, u64>> = BTreeMap::new();
    let report = process.report();
    // A callee by name: a PLT stub by the function it calls.
    let name_at = |p: &mut Process, addr: u64| {
        if let Some(import) = weft::code::plt_import(p.image(), addr) {
            return format!("{import}@plt");
        }
        p.image()
            .function_at(addr)
            .ok()
            .flatten()
            .map_or_else(|| format!("{addr:#x}"), |f| f.name)
    };
    for (spec, id) in specs.iter().zip(&ids) {
        let caller = spec.function.name.clone();
        if spec.call_targets.is_some() {
            for row in process.call_targets(*id)? {
                for (to, calls) in row.targets {
                    let callee = name_at(&mut process, to);
                    *graph
                        .entry((caller.clone(), callee, true))
                        .or_default()
                        .entry(row.tid)
                        .or_default() += calls;
                }
                if row.overflow > 0 {
                    let edge = (caller.clone(), "(more targets)".into(), true);
                    *graph.entry(edge).or_default().entry(row.tid).or_default() += row.overflow;
                }
            }
        } else {
            let code = function_code(process.image(), &spec.function)?;
            let Some(CallTarget::Direct(to)) = code
                .calls
                .iter()
                .find(|c| c.address == spec.address)
                .map(|c| c.target)
            else {
                continue;
            };
            let callee = name_at(&mut process, to);
            let point = format!(
                "{}+{:#x}",
                spec.function.name,
                spec.address - spec.function.address
            );
            for thread in &report.threads {
                let calls = thread
                    .functions
                    .iter()
                    .find(|(name, _)| name.ends_with(&point))
                    .map_or(0, |(_, c)| c.calls);
                if calls > 0 {
                    *graph
                        .entry((caller.clone(), callee.clone(), false))
                        .or_default()
                        .entry(thread.tid)
                        .or_default() += calls;
                }
            }
        }
    }

    println!(
        "call graph of pid {} ({workers} workers, {requests} requests each): {} call sites \
         instrumented, {refused} skipped",
        server.pid(),
        specs.len()
    );
    println!(
        "{:>8}  {:<34} per thread",
        "calls", "caller -> callee (=> indirect)"
    );
    let mut edges: Vec<(&Edge, &BTreeMap<u32, u64>)> = graph.iter().collect();
    edges.sort_by_key(|(e, t)| (std::cmp::Reverse(t.values().sum::<u64>()), (*e).clone()));
    for ((caller, callee, indirect), threads) in &edges {
        let arrow = if *indirect { "=>" } else { "->" };
        let per: Vec<String> = threads
            .iter()
            .map(|(tid, n)| format!("{tid}:{n}"))
            .collect();
        println!(
            "{:>8}  {:<34} {}",
            threads.values().sum::<u64>(),
            format!("{caller} {arrow} {callee}"),
            per.join(" ")
        );
    }

    // Each worker's own counts must be the graph's edges for its thread.
    let mut checked = 0;
    for line in lines.iter().filter(|l| l.starts_with("worker ")) {
        let field = |name: &str| -> Result<String> {
            line.split_whitespace()
                .find_map(|f| f.strip_prefix(name))
                .map(|v| v.trim_end_matches(':').to_string())
                .with_context(|| format!("no {name} in {line:?}"))
        };
        let tid: u32 = field("tid=")?.parse()?;
        let count = |name: &str| -> Result<u64> { Ok(field(name)?.parse()?) };
        let encode = format!("{}_encode", field("codec=")?);
        let edge = |caller: &str, callee: &str, indirect: bool| {
            graph
                .get(&(caller.to_string(), callee.to_string(), indirect))
                .and_then(|t| t.get(&tid))
                .copied()
                .unwrap_or(0)
        };
        let expected = [
            ("worker", "serve", false, requests),
            ("serve", "validate", false, count("validate=")?),
            ("serve", "on_get", true, count("get=")?),
            ("serve", "on_put", true, count("put=")?),
            ("serve", "on_del", true, count("del=")?),
            ("on_get", encode.as_str(), true, count("get=")?),
            ("on_put", encode.as_str(), true, count("put=")?),
            ("on_del", encode.as_str(), true, count("del=")?),
        ];
        for (caller, callee, indirect, want) in expected {
            let got = edge(caller, callee, indirect);
            if got != want {
                bail!("thread {tid}: {caller} -> {callee}: the graph says {got}, the thread made {want}");
            }
            checked += 1;
        }
    }
    if checked != 8 * workers as usize {
        bail!("expected {workers} worker lines, got {lines:?}");
    }

    let mut held = process.hold()?;
    held.remove(&ids)?;
    held.release()?;
    let status = server.finish();
    if !status.success() {
        bail!("the server exited with {status}");
    }
    println!("callgraph: every edge matches the threads' own counts ({checked} checked)");
    Ok(())
}
