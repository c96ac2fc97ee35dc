//! A fault injector: makes `malloc` fail exactly once in a running,
//! threaded server — at the 1000th call of one of its threads — to see
//! that the server copes, then takes the fault out again. The server's own
//! output says which of its mallocs failed.
//!
//! Run: `cargo run --example faults` (builds examples/c/server.c and
//! examples/c/faults.c with `cc`, starts the server, injects the fault).

mod common;

use anyhow::{bail, Context, Result};
use common::{build_probes, build_server, work_dir, Server};
use weft::{Held, Pattern, Process};

fn main() -> Result<()> {
    let dir = work_dir("faults");
    let server_exe = build_server(&dir);
    let faults = build_probes(&dir, "faults");
    let (workers, requests) = (4, 3000);
    let mut server = Server::start(&server_exe, workers, requests);

    let mut process = Process::open(server.pid()).context("opening the server")?;
    let malloc = process
        .find_functions(&[Pattern::parse("libc.so.6:malloc")?])?
        .into_iter()
        .next()
        .context("the server's libc has no malloc")?;
    let mut held = process.hold()?;
    let library = held.load_library(&faults)?;
    let symbol = |p: &mut Held, name: &str| {
        library
            .symbol(p.image(), name)
            .with_context(|| format!("the fault library has no {name}"))
    };
    let faulty = symbol(&mut held, "malloc_faulty")?;
    let original_slot = symbol(&mut held, "malloc_original")?;
    let injected = symbol(&mut held, "injected")?;
    let fault = held.replace_function(&malloc, faulty)?;
    held.write_memory(original_slot, &fault.original.to_le_bytes())?;
    held.release()?;
    println!("malloc now fails at the 1000th call of the first thread to make that many");

    server.send("go");
    let lines = server.until_done();
    let failures: Vec<&String> = lines.iter().filter(|l| l.contains("failed")).collect();
    for l in &lines {
        println!("server: {l}");
    }
    let was_injected = process.read_memory(injected, 8)?;
    let mut held = process.hold()?;
    held.remove(&[fault.id])?;
    held.release()?;
    let status = server.finish();
    if failures.len() != 1 || !failures[0].ends_with("malloc #1000 failed") {
        bail!("expected exactly one failed malloc, the 1000th of a worker: {failures:?}");
    }
    if was_injected != 1u64.to_le_bytes() {
        bail!("the fault library says it injected nothing");
    }
    if !status.success() {
        bail!("the server ended with {status}");
    }
    println!("one malloc failed where intended, the server carried on; fault removed");
    Ok(())
}
