//! `weft diagnose` on a target with a planted CPU bottleneck behind a
//! function-pointer table: the search refines down the true path only,
//! resolves the table's targets at run time, finds `hot` in the worker
//! thread with about the share the target measures itself, reports no
//! decoy, and leaves the target running unchanged.

use crate::support;

use std::path::PathBuf;
use support::*;

// One search at a time (support::one_at_a_time, the binary's turn): each
// target keeps a CPU busy, and the planted shares are meant for a machine
// not also running the other test.

fn target() -> PathBuf {
    build_c_target("diagnose_cpu", &["-O1", "-fno-inline"])
}

/// Starts `exe`, waits for its `ready`, runs `weft diagnose` on it (JSON,
/// at most 40 s); returns the running target, the diagnosis and weft's
/// stderr.
fn diagnose(ctx: &Ctx, exe: &std::path::Path) -> (Proc, serde_json::Value, String) {
    diagnose_with(ctx, exe, &[])
}

/// [`diagnose`] with more of weft's options.
fn diagnose_with(
    ctx: &Ctx,
    exe: &std::path::Path,
    more: &[&str],
) -> (Proc, serde_json::Value, String) {
    let mut t = ctx.target(exe, &[]);
    t.expect_stdout("ready", |l| l == "ready");
    let pid = t.pid.to_string();
    let mut args = vec![
        "diagnose",
        "-p",
        &pid,
        "--duration",
        "40",
        "--format",
        "json",
    ];
    args.extend(more);
    let mut w = ctx.weft(&args);
    w.wait_code(0);
    let d = serde_json::from_str(&w.stdout_text())
        .unwrap_or_else(|e| ctx.fail(format!("diagnosis is not JSON: {e}")));
    (t, d, w.stderr_text())
}

/// The target's own latest `share hot=… decoy=…` line.
fn own_shares(text: &str) -> Option<(f64, f64)> {
    let l = text.lines().rev().find(|l| l.starts_with("share "))?;
    let mut it = l.split_whitespace().skip(1).map(|kv| {
        kv.split_once('=')
            .and_then(|(_, v)| v.parse::<f64>().ok())
            .unwrap_or(-1.0)
    });
    Some((it.next()?, it.next()?))
}

#[test]
fn finds_the_cpu_bottleneck_behind_a_function_pointer_table() {
    let _one = one_at_a_time();
    let ctx = Ctx::new("finds_the_cpu_bottleneck_behind_a_function_pointer_table");
    let timeline = scratch_dir("diagnose_timeline").join("timeline.json");
    let (mut t, d, err) =
        diagnose_with(&ctx, &target(), &["--timeline", timeline.to_str().unwrap()]);
    ctx.check(err.contains("the search is exhausted"), || {
        format!("the search did not finish by itself:\n{err}")
    });
    ctx.check(
        err.contains("weft: testing cpu in worker > step > handle > hot"),
        || "no progress line for the test of hot".into(),
    );
    let bottlenecks = d["bottlenecks"].as_array().cloned().unwrap_or_default();
    ctx.check(bottlenecks.len() == 1, || {
        format!("one bottleneck expected: {bottlenecks:?}")
    });
    let b = &bottlenecks[0];
    let path: Vec<&str> = b["path"]
        .as_array()
        .map(|p| p.iter().filter_map(|s| s.as_str()).collect())
        .unwrap_or_default();
    ctx.check(path == ["worker", "step", "handle", "hot"], || {
        format!("bottleneck path {path:?}")
    });
    ctx.check(b["hypothesis"] == "cpu", || {
        format!("hypothesis {}", b["hypothesis"])
    });
    // The worker thread: not the main thread (the target's pid).
    let threads: Vec<u64> = b["threads"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_u64()).collect())
        .unwrap_or_default();
    ctx.check(threads.len() == 1 && threads[0] != t.pid as u64, || {
        format!("threads {threads:?} (target pid {})", t.pid)
    });
    // No decoy: decoy (~15%) tested false.
    let nodes = d["nodes"].as_array().cloned().unwrap_or_default();
    let decoy = nodes
        .iter()
        .find(|n| n["path"].as_array().and_then(|p| p.last()) == Some(&"decoy".into()));
    ctx.check(decoy.is_some_and(|n| n["state"] == "false"), || {
        format!("decoy's test: {decoy:?}")
    });
    // The value agrees with the target's own clocks.
    let (hot, _) = own_shares(&t.stdout_text()).unwrap_or_else(|| ctx.fail("no share line"));
    let value = b["value"].as_f64().unwrap_or(-1.0);
    eprintln!("hot: weft {value:.3}, the target's own clocks {hot:.3}");
    ctx.check((value - hot).abs() <= 0.10, || {
        format!("weft says hot takes {value:.3}, the target {hot:.3}")
    });
    // Bounded instrumentation: fewer functions than the executable has.
    let s = &d["summary"];
    ctx.check(
        s["functions_probed"].as_u64() < s["functions_reachable"].as_u64(),
        || format!("summary {s}"),
    );
    check_timeline(&ctx, &d, &timeline);
    // The target runs on.
    let before = t.stdout_text().lines().count();
    std::thread::sleep(std::time::Duration::from_millis(2500));
    ctx.check(
        t.is_running() && t.stdout_text().lines().count() > before,
        || "the target stopped after the diagnosis".into(),
    );
    t.close_stdin();
    t.wait_exit();
}

/// `--timeline`: every measured test of the diagnosis is one slice, as
/// the diagnosis says (hypothesis, path, thread, state), on a track of its
/// thread where slices never overlap; a true test has its `true` slice
/// inside; and a real
/// viewer (speedscope, in headless Chromium) imports it, one profile per
/// track.
fn check_timeline(ctx: &Ctx, d: &serde_json::Value, file: &std::path::Path) {
    use std::collections::BTreeMap;
    let text = std::fs::read_to_string(file)
        .unwrap_or_else(|e| ctx.fail(format!("no timeline at {}: {e}", file.display())));
    let trace: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| ctx.fail(format!("the timeline is not JSON: {e}")));
    let events = trace["traceEvents"].as_array().cloned().unwrap_or_default();
    let tracks: BTreeMap<u64, String> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| {
            (
                e["tid"].as_u64().unwrap_or(0),
                e["args"]["name"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let slices: Vec<&serde_json::Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    let (tests, trues): (Vec<&serde_json::Value>, Vec<&serde_json::Value>) = slices
        .iter()
        .copied()
        .partition(|e| !e["name"].as_str().unwrap_or("").ends_with(": true"));
    let span = |e: &serde_json::Value| {
        let ts = e["ts"].as_f64().unwrap_or(-1.0);
        (ts, ts + e["dur"].as_f64().unwrap_or(-1.0))
    };
    let nodes = d["nodes"].as_array().cloned().unwrap_or_default();
    let measured: Vec<&serde_json::Value> =
        nodes.iter().filter(|n| !n["began"].is_null()).collect();
    ctx.check(
        !measured.is_empty() && tests.len() == measured.len(),
        || {
            format!(
                "{} measured tests in the diagnosis, {} test slices on the timeline",
                measured.len(),
                tests.len()
            )
        },
    );
    let slice_of = |n: &serde_json::Value| {
        tests
            .iter()
            .find(|e: &&&serde_json::Value| {
                let a = &e["args"];
                a["path"] == n["path"]
                    && a["hypothesis"] == n["hypothesis"]
                    && a["thread"] == n["thread"]
            })
            .copied()
    };
    for n in &measured {
        let e = slice_of(n)
            .unwrap_or_else(|| ctx.fail(format!("no slice for the test {n} on the timeline")));
        ctx.check(e["args"]["state"] == n["state"], || {
            format!("test {n}: the timeline says {}", e["args"]["state"])
        });
        let track = tracks.get(&e["tid"].as_u64().unwrap_or(0));
        let thread = n["thread"].to_string();
        ctx.check(
            track.is_some_and(|t| t.contains(&format!("({thread})"))),
            || format!("test {n} is on track {track:?}, not one of thread {thread}"),
        );
        let (from, to) = span(e);
        let began = n["began"].as_f64().unwrap_or(-1.0) * 1e6;
        ctx.check((from - began).abs() < 1.0 && to >= from, || {
            format!("test {n}: slice {from}..{to} µs")
        });
        let inner = trues.iter().find(|t| {
            t["tid"] == e["tid"]
                && {
                    let (a, b) = span(t);
                    a >= from && b <= to + 0.001
                }
                && t["name"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with(e["name"].as_str().unwrap_or("?"))
        });
        ctx.check(inner.is_some() != n["true_at"].is_null(), || {
            format!("test {n}: its true slice {inner:?}")
        });
    }
    // Slices of one track never overlap, save a true slice in its test.
    let mut by_track: BTreeMap<u64, Vec<(f64, f64)>> = BTreeMap::new();
    for e in &tests {
        by_track
            .entry(e["tid"].as_u64().unwrap_or(0))
            .or_default()
            .push(span(e));
    }
    for (tid, mut spans) in by_track {
        spans.sort_by(|a, b| a.0.total_cmp(&b.0));
        for w in spans.windows(2) {
            ctx.check(w[0].1 <= w[1].0 + 0.001, || {
                format!("track {tid}: slices {:?} and {:?} overlap", w[0], w[1])
            });
        }
    }
    let index = support::viewers::speedscope(ctx);
    let shown = support::viewers::chromium(
        ctx,
        &["speedscope".as_ref(), index.as_os_str(), file.as_os_str()],
    );
    let profiles = shown["profiles"].as_array().cloned().unwrap_or_default();
    ctx.check(profiles.len() == tracks.len(), || {
        format!(
            "speedscope made {} profiles of {} tracks: {shown}",
            profiles.len(),
            tracks.len()
        )
    });
}

/// The bottleneck of `path` in a diagnosis, if reported.
fn bottleneck<'a>(d: &'a serde_json::Value, path: &[&str]) -> Option<&'a serde_json::Value> {
    d["bottlenecks"].as_array()?.iter().find(|b| {
        b["path"]
            .as_array()
            .is_some_and(|p| p.iter().filter_map(|s| s.as_str()).eq(path.iter().copied()))
    })
}

/// Waits: two workers contending one mutex in `update_shared` are found
/// waiting in `pthread_mutex_lock` under it (sync, both threads); a reader
/// of a slowly filled pipe is found blocked in `read` under
/// `read_records` (io, that thread only).
#[test]
fn finds_lock_contention_and_io_blocking_per_thread() {
    let _one = one_at_a_time();
    let ctx = Ctx::new("finds_lock_contention_and_io_blocking_per_thread");
    let exe = build_c_target("diagnose_wait", &["-O1", "-fno-inline"]);
    let (mut t, d, _) = diagnose(&ctx, &exe);
    let threads = |b: &serde_json::Value| -> Vec<u64> {
        b["threads"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_u64()).collect())
            .unwrap_or_default()
    };
    let sync = bottleneck(
        &d,
        &["worker", "step", "update_shared", "pthread_mutex_lock"],
    )
    .unwrap_or_else(|| ctx.fail(format!("no lock contention found: {}", d["bottlenecks"])));
    ctx.check(
        sync["hypothesis"] == "sync" && threads(sync).len() == 2,
        || format!("the lock's bottleneck: {sync}"),
    );
    let io = bottleneck(&d, &["reader", "read_records", "read"])
        .unwrap_or_else(|| ctx.fail(format!("no blocking read found: {}", d["bottlenecks"])));
    ctx.check(io["hypothesis"] == "io" && threads(io).len() == 1, || {
        format!("the read's bottleneck: {io}")
    });
    ctx.check(
        threads(io).iter().all(|t| !threads(sync).contains(t)),
        || "the reader and the workers are different threads".into(),
    );
    // Nothing is said of the writer, which mostly sleeps in usleep
    // (neither a lock nor I/O).
    let writer = d["bottlenecks"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|b| b["path"][0] == "writer");
    ctx.check(!writer, || {
        format!("the writer reported: {}", d["bottlenecks"])
    });
    // Each wait primitive in one class: no test of read under sync, nor
    // of the mutex under io, and no sleep under either.
    let crossed: Vec<&serde_json::Value> = d["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| {
            let last = n["path"]
                .as_array()
                .and_then(|p| p.last())
                .and_then(|f| f.as_str());
            match (n["hypothesis"].as_str(), last) {
                (Some("sync"), Some(f)) => ["read", "write", "nanosleep", "usleep"].contains(&f),
                (Some("io"), Some(f)) => [
                    "pthread_mutex_lock",
                    "pthread_cond_wait",
                    "nanosleep",
                    "usleep",
                ]
                .contains(&f),
                _ => false,
            }
        })
        .collect();
    ctx.check(crossed.is_empty(), || {
        format!("wait primitives tested under the other class: {crossed:?}")
    });
    // The pool thread waits for work at the top of its loop: idle.
    let pool = |list: &serde_json::Value| {
        list.as_array()
            .into_iter()
            .flatten()
            .any(|b| b["path"][0] == "pool_worker")
    };
    ctx.check(!pool(&d["bottlenecks"]), || {
        format!(
            "the idle pool thread reported as a bottleneck: {}",
            d["bottlenecks"]
        )
    });
    let idle_wait = d["idle"].as_array().into_iter().flatten().any(|b| {
        b["path"] == serde_json::json!(["pool_worker", "pthread_cond_wait"])
            && b["hypothesis"] == "sync"
    });
    ctx.check(idle_wait, || {
        format!("the pool thread's wait not idle: {}", d["idle"])
    });
    // The manager waits one level deeper, in a loop it never leaves: idle
    // too (MariaDB's handle_manager was reported at 100% sync).
    let manager = |list: &serde_json::Value| {
        list.as_array()
            .into_iter()
            .flatten()
            .any(|b| b["path"][0] == "manager")
    };
    ctx.check(!manager(&d["bottlenecks"]), || {
        format!(
            "the idle manager thread reported as a bottleneck: {}",
            d["bottlenecks"]
        )
    });
    let manager_idle = d["idle"].as_array().into_iter().flatten().any(|b| {
        b["path"] == serde_json::json!(["manager", "handle_manager", "pthread_cond_wait"])
    });
    ctx.check(manager_idle, || {
        format!("the manager's wait not idle: {}", d["idle"])
    });
    ctx.check(t.is_running(), || "the target stopped".into());
    t.close_stdin();
    t.wait_exit();
}

/// `weft diagnose -- PROGRAM`: the program starts under weft, its worker
/// thread (started after the search began) is searched too, the
/// diagnosis comes out, and weft waits for the program and exits with its
/// code.
#[test]
fn diagnoses_a_program_it_starts() {
    let _one = one_at_a_time();
    let ctx = Ctx::new("diagnoses_a_program_it_starts");
    let exe = target();
    let file = std::env::temp_dir().join(format!("weft-diagnosis-{}.json", std::process::id()));
    // The threshold is lowered: this test is about starting the program,
    // the planted share (~0.4) is checked by the tests above.
    let pressure = CpuPressure::now();
    let mut w = ctx.weft(&[
        "diagnose",
        "--cpu-threshold",
        "0.2",
        "--format",
        "json",
        "-o",
        file.to_str().unwrap(),
        "--",
        exe.to_str().unwrap(),
        // The search ends by itself in ~10 s on an idle machine; the
        // program lives three times that, so a loaded machine's slower
        // search still reaches `hot` before the program ends (with 12 s, a
        // loaded CI run's search stopped at `worker > step`).
        "30",
    ]);
    w.wait_code(0);
    let out = w.stdout_text();
    ctx.check(out.starts_with("ready\n"), || {
        format!("the program's output: {out:?}")
    });
    let text = std::fs::read_to_string(&file).unwrap_or_default();
    let _ = std::fs::remove_file(&file);
    let d: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| ctx.fail(format!("diagnosis is not JSON: {e}")));
    let found = bottleneck(&d, &["worker", "step", "handle", "hot"]);
    ctx.check(found.is_some_and(|b| b["hypothesis"] == "cpu"), || {
        format!("hot not found in the started program: {}", d["bottlenecks"])
    });
    // The hold at the program's entry (symbols read, the runtime and its
    // exit code loaded before any of it ran) is its start delay, not a
    // stop: the stops are the search's own, each short as for a process
    // weft attached to (25 ms: the acceptance test's bound for a stop the
    // kernel or a hypervisor lengthened; holding the entry took 16-28 ms
    // when it was counted as a stop).
    let s = &d["summary"];
    let held = s["start_held_ms"].as_f64().unwrap_or(0.0);
    let longest = s["longest_stop_ms"].as_f64().unwrap_or(f64::MAX);
    eprintln!(
        "held {held:.1} ms at the start; longest stop {longest:.2} ms ({})",
        s["longest_stop_for"]
    );
    // (Not compared with the hold: on a loaded machine stopping the two
    // running threads alone took 23 ms, longer than the 15 ms hold.)
    ctx.check(held > 0.0, || format!("no start hold reported: {s}"));
    // A stop lasts until every thread was scheduled to enter it: with
    // other programs' tasks waiting for the CPUs most of the time (a load
    // average of 44 on 2 CPUs: stops of 200-222 ms, nearly all of it for
    // the threads to stop), that is the kernel's, not weft's.
    let stalled = pressure.share_since();
    let bound = if stalled < 0.25 { 25.0 } else { 250.0 };
    eprintln!(
        "tasks waited for a CPU {:.0}% of the run: bound {bound} ms",
        stalled * 100.0
    );
    ctx.check(longest < bound, || {
        format!("a stop of the search took {longest} ms: {s}")
    });
    ctx.check(s["longest_stop_for"] != "loading the runtime", || {
        format!("the runtime was loaded in a stop of the running program: {s}")
    });
}

/// Bounded perturbation: `tick`, called ten million times a second under
/// the true `crunch`, is taken out with the reason instead of being
/// tested; the search still names `crunch`, and what the instrumentation
/// cost over the search stays under the bound.
#[test]
fn a_function_too_costly_to_time_is_skipped() {
    let _one = one_at_a_time();
    let ctx = Ctx::new("a_function_too_costly_to_time_is_skipped");
    let exe = build_c_target("diagnose_costly", &["-O1", "-fno-inline"]);
    let steal_before = steal_ticks();
    let (mut t, d, err) = diagnose(&ctx, &exe);
    let stolen = machine_steal_share(steal_before, steal_ticks());
    ctx.check(err.contains("weft: tick: taken out"), || {
        format!("tick was not taken out:\n{err}")
    });
    // Its other tests (the other worker, the path through polish) are
    // skipped, not probed again.
    let taken_out = err.matches("weft: tick: taken out").count();
    ctx.check(taken_out == 1, || {
        format!("tick was probed and taken out {taken_out} times:\n{err}")
    });
    let crunch = bottleneck(&d, &["worker", "crunch"]);
    ctx.check(crunch.is_some_and(|b| b["hypothesis"] == "cpu"), || {
        format!("crunch not the bottleneck: {}", d["bottlenecks"])
    });
    let overhead = d["summary"]["overhead"].as_f64().unwrap_or(1.0);
    eprintln!(
        "overhead {:.4}, a timed call {:.1} ns, {:.1} % of the machine stolen",
        overhead,
        d["summary"]["cost_per_call_ns"].as_f64().unwrap_or(0.0),
        100.0 * stolen
    );
    // `tick` costs its first look (20 ms and the stops around it) before
    // it can be judged: over a search of two seconds that is most of the
    // figure (0.7 % here), and a host that takes the vCPUs stretches it
    // (5.1 % once in CI, an event's switch calibrated at 4.8 µs against
    // 2.4). Compared only on a quiet machine.
    if stolen <= crate::diagnose_acceptance::STEAL_QUIET {
        ctx.check(overhead < 0.05, || format!("overhead {overhead} over 5%"));
    }
    ctx.check(t.is_running(), || "the target stopped".into());
    t.close_stdin();
    t.wait_exit();
}

/// A tool's own hypothesis through the library: "the worker spends too
/// much time in `pool_get`" is refined to the caller that makes it true.
#[test]
fn a_custom_hypothesis_through_the_library() {
    use weft::diagnose::{Consultant, CustomHypothesis, Measure, Options};
    let _one = one_at_a_time();
    let ctx = Ctx::new("a_custom_hypothesis_through_the_library");
    let exe = build_c_target("diagnose_custom", &["-O1", "-fno-inline", "-pthread"]);
    let mut t = ctx.target(&exe, &[]);
    let line = t.expect_stdout("threads", |l| l.starts_with("threads "));
    let worker: u32 = line["threads ".len()..]
        .trim()
        .parse()
        .unwrap_or_else(|_| ctx.fail(format!("bad line {line:?}")));
    t.expect_stdout("ready", |l| l == "ready");
    let mut process = weft::Process::open(t.pid as i32).expect("open the target");
    let options = Options {
        hypotheses: Vec::new(),
        custom: vec![CustomHypothesis {
            name: "pool".into(),
            functions: vec!["pool_get".into()],
            measure: Measure::Wall,
            threshold: 0.20,
        }],
        ..Options::default()
    };
    let mut consultant = Consultant::new(&mut process, options).expect("start the search");
    let started = std::time::Instant::now();
    while !consultant.exhausted() && started.elapsed() < std::time::Duration::from_secs(40) {
        consultant.step(&mut process).expect("a step");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let d = consultant.diagnosis();
    consultant
        .finish(&mut process)
        .expect("take the probes out");
    drop(process);
    ctx.check(d.summary.exhausted, || "the search did not finish".into());
    let want = ["serve", "handle_big", "pool_get"];
    let found = d
        .bottlenecks
        .iter()
        .find(|b| b.hypothesis == "pool" && b.path.ends_with(&want.map(String::from)));
    let Some(b) = found else {
        ctx.fail(format!(
            "no pool bottleneck at {want:?}: {:?}",
            d.bottlenecks
        ));
    };
    ctx.check(b.threads == vec![worker], || {
        format!("threads {:?}", b.threads)
    });
    // Within the worker's own shares over the search (each half second's),
    // give or take 5 points: the search's value is an average over its
    // test's readings.
    let own: Vec<f64> = t
        .stdout_text()
        .lines()
        .filter_map(|l| l.strip_prefix("share pool="))
        .filter_map(|v| v.parse().ok())
        .collect();
    let lo = own.iter().copied().fold(f64::MAX, f64::min) - 0.05;
    let hi = own.iter().copied().fold(f64::MIN, f64::max) + 0.05;
    ctx.check(!own.is_empty() && (lo..=hi).contains(&b.value), || {
        format!(
            "pool_get under handle_big: {:.3} of the worker's time; its own shares {own:?}",
            b.value
        )
    });
    // The same sleep elsewhere (cache_get) is not the pool's, and no other
    // hypothesis was tested.
    ctx.check(
        d.bottlenecks
            .iter()
            .all(|b| b.hypothesis == "pool" && b.function == "pool_get"),
        || format!("only the pool was asked about: {:?}", d.bottlenecks),
    );
    t.close_stdin();
    t.wait_exit();
}

#[test]
fn a_bad_hypothesis_is_refused_with_what_to_write() {
    let ctx = Ctx::new("a_bad_hypothesis_is_refused_with_what_to_write");
    for (spec, says) in [
        ("pool", "NAME=FUNCTION"),
        ("pool=pool_get:fast", "not wall, cpu or offcpu"),
        ("pool=pool_get@2", "not a share between 0 and 1"),
        ("cpu=spin", "built-in hypothesis"),
    ] {
        let mut w = ctx.weft(&["diagnose", "-p", "1", "--hypothesis", spec]);
        w.wait_code(1);
        let err = w.stderr_text();
        ctx.check(err.contains(says), || {
            format!("--hypothesis {spec}: stderr {err:?} lacks {says:?}")
        });
    }
}
