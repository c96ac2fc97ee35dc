//! A per-thread latency histogram of one function of a running server:
//! probes in a small C library time every call of `handle` (entry and exit)
//! into per-thread log2 histograms kept in the target's memory; this tool
//! reads them out while the server runs and prints one histogram per
//! thread, checked against weft's own per-thread call counts.
//!
//! Run: `cargo run --example latency` (builds examples/c/server.c and
//! examples/c/latency.c with `cc`, starts the server, instruments it).

mod common;

use anyhow::{bail, Context, Result};
use common::{build_probes, build_server, work_dir, Server};
use weft::{Held, Metrics, Pattern, ProbeSpec, Process, Sampler, UserProbe};

const THREADS: usize = 256;
const BUCKETS: usize = 32;

fn main() -> Result<()> {
    let dir = work_dir("latency");
    let server_exe = build_server(&dir);
    let probes = build_probes(&dir, "latency");
    let (workers, requests) = (3, 4000);
    let mut server = Server::start(&server_exe, workers, requests);

    let mut process = Process::open(server.pid()).context("opening the server")?;
    let handle = process
        .find_functions(&[Pattern::parse("handle")?])?
        .into_iter()
        .next()
        .context("the server has no handle()")?;
    let mut held = process.hold()?;
    let library = held.load_library(&probes)?;
    let symbol = |p: &mut Held, name: &str| {
        library
            .symbol(p.image(), name)
            .with_context(|| format!("the probe library has no {name}"))
    };
    let probe = |p: &mut Held, name: &str| -> Result<UserProbe> {
        Ok(UserProbe {
            function: symbol(p, name)?,
            user: 0,
            predicate: None,
        })
    };
    let spec = ProbeSpec {
        on_entry: Some(probe(&mut held, "on_entry")?),
        on_exit: Some(probe(&mut held, "on_exit")?),
        ..ProbeSpec::measure(handle, Metrics::CALLS)
    };
    let hist_at = symbol(&mut held, "hist")?;
    let ids = held.insert_probes(&[spec])?;
    held.release()?;

    server.send("go");
    server.until_done();
    // Read the histograms and weft's own counts while the server waits.
    let bytes = process.read_memory(hist_at, THREADS * BUCKETS * 8)?;
    let hist: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let mut sampler = Sampler::new();
    let mut checked = 0;
    for thread in sampler.sample(&process) {
        let row = thread.row as usize;
        let calls = thread.values[0].calls;
        if calls == 0 || row >= THREADS {
            continue;
        }
        let buckets = &hist[row * BUCKETS..(row + 1) * BUCKETS];
        let total: u64 = buckets.iter().sum();
        println!("thread {} ({} calls of handle):", thread.tid, calls);
        let widest = buckets.iter().copied().max().unwrap_or(1).max(1);
        for (b, &n) in buckets.iter().enumerate().filter(|(_, &n)| n > 0) {
            let bar = "#".repeat(((n * 40).div_ceil(widest)) as usize);
            println!("  {:>10} ns  {n:>6}  {bar}", 1u64 << b);
        }
        if total != calls {
            bail!(
                "thread {}: the histogram holds {total} calls, weft counted {calls}",
                thread.tid
            );
        }
        checked += 1;
    }
    let mut held = process.hold()?;
    held.remove(&ids)?;
    held.release()?;
    let status = server.finish();
    if checked != workers as usize {
        bail!("{checked} threads had histograms, {workers} workers ran");
    }
    if !status.success() {
        bail!("the server ended with {status}");
    }
    println!("{checked} threads, every call of handle in its thread's histogram");
    Ok(())
}
