//! `weft demo`: a bundled threaded "server" (this same binary, run as
//! `weft __demo-target`), instrumented live and checked against its own
//! per-thread counts.

use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use weft::{Pattern, Process};

// The arguments of `Command::Demo` (their help is the variant's, in
// main.rs).
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Worker threads.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Requests each worker serves (more takes longer).
    #[arg(long, default_value_t = 150_000)]
    requests: u64,
}

// The arguments of `Command::DemoTarget` (their help is the variant's, in
// main.rs).
#[derive(clap::Args, Debug)]
pub struct DemoTargetArgs {
    #[arg(long)]
    threads: usize,
    #[arg(long)]
    requests: u64,
}

/// Runs `weft demo`.
pub fn exec(args: DemoArgs) -> Result<ExitCode> {
    demo(args.threads, args.requests)
}

/// Runs `weft __demo-target`, the demo's server.
pub fn exec_target(args: DemoTargetArgs) -> Result<ExitCode> {
    target(args.threads, args.requests)
}

/// The demo server's request handler: the functions `weft demo` counts.
#[no_mangle]
#[inline(never)]
pub extern "C" fn weft_demo_handle_request(id: u64) -> u64 {
    let parsed = weft_demo_parse(id);
    if parsed % 3 == 0 {
        weft_demo_respond(parsed) ^ weft_demo_respond(parsed + 1)
    } else {
        weft_demo_respond(parsed)
    }
}

/// Parses a synthetic request.
#[no_mangle]
#[inline(never)]
pub extern "C" fn weft_demo_parse(id: u64) -> u64 {
    std::hint::black_box(id.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17))
}

/// Builds a synthetic response.
#[no_mangle]
#[inline(never)]
pub extern "C" fn weft_demo_respond(x: u64) -> u64 {
    let mut h = x;
    for _ in 0..32 {
        h = std::hint::black_box(h ^ (h >> 7)).wrapping_mul(31);
    }
    h
}

/// The functions the demo instruments, and the key the target uses for each.
const FUNCTIONS: [(&str, &str); 3] = [
    ("weft_demo_handle_request", "handle_request"),
    ("weft_demo_parse", "parse"),
    ("weft_demo_respond", "respond"),
];

/// `weft __demo-target`: waits for `go`, serves requests on worker threads,
/// prints each worker's own counts as JSON lines, then `done`, and waits for
/// `exit` (or end of input).
fn target(threads: usize, requests: u64) -> Result<ExitCode> {
    let stdin = std::io::stdin();
    let mut line = String::new();
    println!("ready pid={}", std::process::id());
    std::io::stdout().flush()?;
    stdin.lock().read_line(&mut line)?;
    let workers: Vec<_> = (0..threads)
        .map(|i| {
            std::thread::Builder::new()
                .name(format!("worker-{i}"))
                .spawn(move || {
                    // SAFETY: gettid has no preconditions.
                    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
                    let mine = requests + requests * i as u64 / 4;
                    let (mut handled, mut parsed, mut responded) = (0u64, 0u64, 0u64);
                    for r in 0..mine {
                        weft_demo_handle_request(r);
                        handled += 1;
                        parsed += 1;
                        responded += if weft_demo_parse(r) % 3 == 0 { 2 } else { 1 };
                        if r % 512 == 511 {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                    }
                    // The check above calls parse once more per request.
                    parsed += mine;
                    serde_json::json!({"tid": tid, "handle_request": handled, "parse": parsed, "respond": responded})
                })
                .expect("spawning a worker thread")
        })
        .collect();
    for w in workers {
        let counts = w.join().map_err(|_| anyhow::anyhow!("a worker panicked"))?;
        println!("{counts}");
    }
    println!("done");
    std::io::stdout().flush()?;
    line.clear();
    let _ = stdin.lock().read_line(&mut line);
    Ok(ExitCode::SUCCESS)
}

/// Kills and reaps the demo target whatever happens.
struct TargetGuard(Child);

impl Drop for TargetGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `weft demo`.
fn demo(threads: usize, requests: u64) -> Result<ExitCode> {
    if threads == 0 || threads > 512 {
        bail!("--threads must be between 1 and 512");
    }
    let exe = std::env::current_exe().context("finding weft's own executable")?;
    let child = std::process::Command::new(exe)
        .args([
            "__demo-target",
            "--threads",
            &threads.to_string(),
            "--requests",
            &requests.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the demo target")?;
    let mut guard = TargetGuard(child);
    let pid = guard.0.id() as i32;
    let stdout = guard.0.stdout.take().context("demo target stdout")?;
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = rx
        .recv_timeout(Duration::from_secs(10))
        .context("the demo target did not start")?;
    if !first.starts_with("ready") {
        bail!("unexpected first line from the demo target: {first}");
    }
    println!("demo: started a server with {threads} worker threads (pid {pid}); attaching...");

    let started = Instant::now();
    let mut process = Process::open(pid)?;
    let patterns: Vec<Pattern> = FUNCTIONS
        .iter()
        .map(|(f, _)| Pattern::parse(f))
        .collect::<Result<_, _>>()?;
    let found = process.find_functions(&patterns)?;
    process.prepare(&found)?;
    let mut held = process.hold()?;
    held.insert_counters(&found)?;
    let attach_time = started.elapsed();
    held.release()?;
    println!(
        "demo: instrumented {} functions in {:.1} ms; the server runs on while weft reads its counters live",
        found.len(),
        attach_time.as_secs_f64() * 1e3
    );
    let stdin = guard.0.stdin.as_mut().context("demo target stdin")?;
    writeln!(stdin, "go")?;
    stdin.flush()?;

    let mut own = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut next_table = Instant::now() + Duration::from_secs(1);
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(line) if line == "done" => break,
            Ok(line) => own.push(
                serde_json::from_str::<serde_json::Value>(&line)
                    .with_context(|| format!("demo target said: {line}"))?,
            ),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                bail!("the demo target exited unexpectedly")
            }
        }
        if Instant::now() > deadline {
            bail!("the demo target did not finish within 2 minutes");
        }
        process.harvest();
        if Instant::now() >= next_table {
            println!("\n--- live, {:.1} s ---", started.elapsed().as_secs_f64());
            print!(
                "{}",
                process
                    .report()
                    .to_table_with(&crate::hints::table_options())
            );
            next_table += Duration::from_secs(1);
        }
    }

    let mut held = process.hold()?;
    held.remove_all()?;
    let report = held.report();
    held.release()?;
    println!("\n--- final (instrumentation removed, weft detached) ---");
    print!("{}", report.to_table_with(&crate::hints::table_options()));

    let mut mismatches = 0;
    let mut total = 0u64;
    for line in &own {
        let tid = line["tid"].as_u64().unwrap_or(0) as u32;
        let thread = report.threads.iter().find(|t| t.tid == tid);
        for (function, key) in FUNCTIONS {
            let expected = line[key].as_u64().unwrap_or(0);
            let got = thread
                .and_then(|t| t.functions.get(function))
                .map_or(0, |c| c.calls);
            total += expected;
            if expected != got {
                mismatches += 1;
                println!(
                    "demo: MISMATCH thread {tid} {function}: server counted {expected}, weft {got}"
                );
            }
        }
    }
    if let Some(stdin) = guard.0.stdin.as_mut() {
        let _ = writeln!(stdin, "exit");
    }
    let status = guard.0.wait()?;
    if mismatches > 0 || own.len() != threads {
        println!(
            "demo: FAILED: {mismatches} mismatches, {} of {threads} workers reported",
            own.len()
        );
        return Ok(ExitCode::from(1));
    }
    println!(
        "demo: OK: weft's per-thread counts equal the server's own for all {threads} workers ({} calls); the server exited with {status}",
        weft::report::group_digits(total)
    );
    Ok(ExitCode::SUCCESS)
}
