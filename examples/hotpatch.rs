//! Hot-patching a running server: its `checksum` has a bug (it skips the
//! last byte of every message); this tool loads a library with a fixed
//! version into the running process, redirects every call of `checksum`
//! to it, lets the server work, and checks each worker's sum is now the
//! right one — without restarting or recompiling the server.
//!
//! Run: `cargo run --example hotpatch` (builds examples/c/server.c and
//! examples/c/hotpatch.c with `cc`, starts the server, patches it).

mod common;

use anyhow::{bail, Context, Result};
use common::{build_probes, build_server, work_dir, Server};
use weft::{Pattern, Process};

/// What the fixed checksum gives for a worker's `requests` messages.
fn expected_sum(worker: u64, requests: u64) -> u64 {
    (0..requests)
        .map(|r| {
            format!("request {r} of worker {worker}")
                .bytes()
                .fold(0u32, |sum, b| {
                    sum.wrapping_mul(31).wrapping_add(u32::from(b))
                }) as u64
        })
        .sum()
}

fn main() -> Result<()> {
    let dir = work_dir("hotpatch");
    let server_exe = build_server(&dir);
    let fix = build_probes(&dir, "hotpatch");
    let (workers, requests) = (4, 2000);
    let mut server = Server::start(&server_exe, workers, requests);

    // Attach, load the fix, redirect the buggy function to it.
    let mut process = Process::open(server.pid()).context("opening the server")?;
    let checksum = process
        .find_functions(&[Pattern::parse("checksum")?])?
        .into_iter()
        .next()
        .context("the server has no checksum()")?;
    let mut held = process.hold()?;
    let library = held.load_library(&fix)?;
    let fixed = library
        .symbol(held.image(), "checksum_fixed")
        .context("the fix library has no checksum_fixed")?;
    let patch = held.replace_function(&checksum, fixed)?;
    held.release()?;
    println!(
        "checksum at {:#x} now goes to {fixed:#x} (the original stays at {:#x})",
        checksum.address, patch.original
    );

    server.send("go");
    let lines = server.until_done();
    let mut wrong = 0;
    for w in 0..u64::from(workers) {
        let want = format!("worker {w}: sum {}", expected_sum(w, requests));
        if lines.contains(&want) {
            println!("{want}  (correct)");
        } else {
            println!("worker {w}: expected `{want}`, the server printed {lines:?}");
            wrong += 1;
        }
    }
    // Take the patch out again and leave the server as it was.
    let mut held = process.hold()?;
    held.remove(&[patch.id])?;
    held.release()?;
    let status = server.finish();
    if wrong > 0 || !status.success() {
        bail!("{wrong} workers had a wrong sum; the server ended with {status}");
    }
    println!("hot-patched: every worker's sum is right; patch removed, server exited normally");
    Ok(())
}
