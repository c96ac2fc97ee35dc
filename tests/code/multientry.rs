//! Code shared between entry points: glibc's `__mempcpy_*` jumps three
//! bytes into `__memmove_*` (which memcpy resolves to), right inside the
//! bytes memcpy's patch overwrites. weft sends that jump around the patch
//! through a companion: a mempcpy call is never counted as a memcpy call,
//! and neither function breaks.

use crate::support;

use support::*;

/// Per worker thread: exactly N memcpy and M mempcpy calls counted, for
/// counters and for timers, with both functions instrumented at once
/// (IFUNCs: the implementations the process uses).
#[test]
fn memcpy_and_mempcpy_count_exactly() {
    for metrics in ["calls", "calls,wall"] {
        let ctx = Ctx::new("memcpy_and_mempcpy_count_exactly");
        let dir = scratch_dir(&format!("multientry-{}", metrics.replace(',', "-")));
        let out = dir.join("report.json");
        let exe = multientry().to_str().unwrap().to_string();
        let mut w = ctx.weft(&[
            "run",
            "-f",
            "libc.so.6:memcpy",
            "-f",
            "libc.so.6:mempcpy",
            "-m",
            metrics,
            "--format",
            "json",
            "-o",
            out.to_str().unwrap(),
            "--",
            &exe,
            "--pure",
            "4",
            "3000",
            "1700",
            "2",
        ]);
        w.wait_code(0);
        let text = w.stdout_text();
        let mut workers = Vec::new();
        for line in text.lines().filter(|l| l.starts_with("thread ")) {
            let f: Vec<&str> = line.split_whitespace().collect();
            ctx.check(f.len() == 10 && f[9] == "0", || {
                format!("a worker computed a wrong result: {line}")
            });
            workers.push(f[1].parse::<i64>().unwrap());
        }
        ctx.check(workers.len() == 8, || {
            format!("{} worker lines", workers.len())
        });
        let report = parse_report(&ctx, &std::fs::read_to_string(&out).unwrap());
        for tid in &workers {
            let memcpy = report.counts(*tid, "memcpy");
            let mempcpy = report.counts(*tid, "mempcpy");
            ctx.check(memcpy.calls == 3000 && mempcpy.calls == 1700, || {
                format!(
                    "{metrics}: thread {tid} made 3000 memcpy and 1700 mempcpy calls, weft \
                     counted {} and {}",
                    memcpy.calls, mempcpy.calls
                )
            });
            if metrics.contains("wall") {
                ctx.check(
                    memcpy.exits == Some(3000) && mempcpy.exits == Some(1700),
                    || format!("{metrics}: thread {tid}: exits {memcpy:?} {mempcpy:?}"),
                );
            }
        }
    }
}

const SIX: [&str; 12] = [
    "-f",
    "libc.so.6:malloc",
    "-f",
    "libc.so.6:free",
    "-f",
    "libc.so.6:memcpy",
    "-f",
    "libc.so.6:read",
    "-f",
    "libc.so.6:write",
    "-f",
    "libc.so.6:strlen",
];

/// Runs `program args` alone and under `weft run` with the six functions
/// (calls, wall and CPU time); returns both standard outputs and the
/// report.
fn alone_and_under_weft(
    ctx: &Ctx,
    dir: &std::path::Path,
    program: &str,
    args: &[&str],
) -> (String, String, Report) {
    let mut c = std::process::Command::new(program);
    c.args(args);
    let mut alone = ctx.spawn(program, c, false);
    alone.wait_code(0);
    let out = dir.join(format!(
        "{}.json",
        std::path::Path::new(program)
            .file_name()
            .unwrap()
            .to_string_lossy()
    ));
    let mut all = SIX.to_vec();
    all.extend([
        "--format",
        "json",
        "-o",
        out.to_str().unwrap(),
        "--",
        program,
    ]);
    all.extend_from_slice(args);
    let mut w = ctx.weft(&[&["run"][..], &all].concat());
    w.wait_code(0);
    let report = parse_report(ctx, &std::fs::read_to_string(&out).unwrap());
    (alone.stdout_text(), w.stdout_text(), report)
}

/// sort, gzip and a threaded python3 under `weft run` with malloc, free,
/// memcpy, read, write and strlen: their output is byte for byte what it
/// is without weft, and memcpy's calls are counted.
#[test]
fn real_programs_with_memcpy() {
    let ctx = Ctx::new("real_programs_with_memcpy");
    let dir = scratch_dir("real_programs_with_memcpy");
    let input = dir.join("input.txt");
    let mut text = String::new();
    let mut x = 12345u64;
    for i in 0..40_000 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        text += &format!("{:016x} line {i} {}\n", x, "abc".repeat((x % 7) as usize));
    }
    std::fs::write(&input, &text).unwrap();
    let input = input.to_str().unwrap();

    let check = |what: &str, alone: &str, under: &str, report: &Report| {
        ctx.check(alone == under, || {
            format!("{what}: the output under weft differs from the output alone")
        });
        ctx.check(
            report.function("memcpy").is_some_and(|f| f.calls > 0),
            || format!("{what}: no memcpy call counted: {:?}", report.functions),
        );
    };

    let (alone, under, report) = alone_and_under_weft(&ctx, &dir, "/usr/bin/sort", &[input]);
    ctx.check(alone.len() == text.len(), || {
        "sort printed too little".into()
    });
    check("sort", &alone, &under, &report);

    // gzip's output is binary: compare its files, byte for byte.
    for (suffix, weft) in [(".alone.gz", false), (".weft.gz", true)] {
        let args = ["-n", "-k", "-f", "-S", suffix, input];
        if weft {
            let out = dir.join("gzip.json");
            let mut all = vec!["run"];
            all.extend(SIX);
            all.extend([
                "--format",
                "json",
                "-o",
                out.to_str().unwrap(),
                "--",
                "/usr/bin/gzip",
            ]);
            all.extend(args);
            ctx.weft(&all).wait_code(0);
            let report = parse_report(&ctx, &std::fs::read_to_string(&out).unwrap());
            check("gzip", "", "", &report);
        } else {
            let mut c = std::process::Command::new("/usr/bin/gzip");
            c.args(args);
            ctx.spawn("gzip", c, false).wait_code(0);
        }
    }
    let a = std::fs::read(format!("{input}.alone.gz")).unwrap();
    let b = std::fs::read(format!("{input}.weft.gz")).unwrap();
    ctx.check(a == b && a.len() > 1000, || {
        format!(
            "gzip wrote {} bytes alone and {} under weft, or other bytes",
            a.len(),
            b.len()
        )
    });

    // The real interpreter (not a wrapper script) with threads at work.
    let script = dir.join("threads.py");
    std::fs::write(
        &script,
        "import hashlib, json, sys, threading\n\
         data = open(sys.argv[1], 'rb').read()\n\
         results = [None] * 4\n\
         def work(i):\n\
         \x20   h = hashlib.sha256()\n\
         \x20   for k in range(200):\n\
         \x20       h.update(data[k * 97 % len(data):][:4096] + bytes([i]))\n\
         \x20   words = sorted(set(data.decode().split()))[i::4]\n\
         \x20   results[i] = (h.hexdigest(), len(words), json.dumps(words[:5]))\n\
         ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]\n\
         [t.start() for t in ts]\n\
         [t.join() for t in ts]\n\
         for r in results: print(*r)\n",
    )
    .unwrap();
    let (alone, under, report) = alone_and_under_weft(
        &ctx,
        &dir,
        "/usr/bin/python3.11",
        &[script.to_str().unwrap(), input],
    );
    ctx.check(alone.lines().count() == 4, || {
        format!("python printed {alone}")
    });
    check("python3.11", &alone, &under, &report);
    let threads = report
        .threads
        .iter()
        .filter(|t| t.functions.get("memcpy").is_some_and(|c| c.calls > 0))
        .count();
    ctx.check(threads >= 5, || {
        format!(
            "memcpy counted in {threads} threads of python3.11, expected its 4 workers and main"
        )
    });
}

/// memcpy's probe with its companion in mempcpy goes in and out as one
/// transaction: made to fail at every step, the insertion leaves the code
/// of both functions, the target's region and the probes as they were; a
/// successful one writes the companion's patch too, and removing memcpy's
/// probe takes it out. The target computes the same throughout.
#[cfg(debug_assertions)]
#[test]
fn companions_are_undone_and_removed_with_their_probe() {
    use weft::internals::Fault;
    use weft::{Metrics, Pattern, Process};
    let ctx = Ctx::new("companions_are_undone_and_removed_with_their_probe");
    let mut t = ctx.target(multientry(), &["3", "500", "500"]);
    let (pid, _) = wait_ready(&mut t);
    t.send("go");
    t.expect_stdout("round 1", |l| l == "round 1 done");
    let mut process = Process::open(pid as i32).unwrap();
    let found = process
        .find_functions(&[
            Pattern::parse("libc.so.6:memcpy").unwrap(),
            Pattern::parse("libc.so.6:mempcpy").unwrap(),
        ])
        .unwrap();
    let mut addresses = Vec::new();
    for f in &found {
        let at = process.image().resolved_address(f).unwrap();
        addresses.push(at);
    }
    // Both implementations, from a little before mempcpy's to past
    // memcpy's first bytes.
    let lo = addresses.iter().min().unwrap() - 64;
    let hi = addresses.iter().max().unwrap() + 64;
    let code = |p: &Process| p.read_memory(lo, (hi - lo) as usize).unwrap();
    let before = code(&process);
    let memcpy = found.iter().find(|f| f.name == "memcpy").unwrap().clone();
    // The runtime in first: the faults then hit the insertion itself.
    {
        let mut held = process.hold().unwrap();
        let ids = held.insert(&found[..0], Metrics::CALLS).unwrap();
        assert!(ids.is_empty());
        held.release().unwrap();
    }
    // A splice fails from its second page of patches on, and memcpy's and
    // its companion's share one page: strlen's patch is on another.
    let strlen = process
        .find_functions(&[Pattern::parse("libc.so.6:strlen").unwrap()])
        .unwrap();
    let mut round = 1;
    for step in Fault::ALL {
        let mut asked = vec![memcpy.clone()];
        if step == Fault::Splice {
            asked.extend(strlen.iter().cloned());
        }
        let mut held = process.hold().unwrap();
        let ledger = held.ledger_state();
        let probes = held.probes().len();
        held.fail_next_insertion_at(step);
        // Timed: every step, the call record included, is taken.
        let result = held.insert(&asked, Metrics::ALL);
        ctx.check(result.is_err(), || {
            format!("{step:?}: the insertion did not fail")
        });
        ctx.check(held.ledger_state() == ledger, || {
            format!("{step:?}: the region's cursors or directory changed")
        });
        ctx.check(
            held.probes().iter().filter(|p| p.active).count() == 0,
            || format!("{step:?}: a probe stayed active ({probes} before)"),
        );
        held.release().unwrap();
        ctx.check(code(&process) == before, || {
            format!("{step:?}: the code of memcpy or mempcpy changed")
        });
        round += 1;
        t.send("go");
        t.expect_stdout("a round", |l| l == format!("round {round} done"));
    }
    let mut held = process.hold().unwrap();
    let ids = held
        .insert(std::slice::from_ref(&memcpy), Metrics::CALLS)
        .unwrap();
    let companions = held
        .probes()
        .iter()
        .filter(|p| p.active && p.companion_of() == Some(ids[0]))
        .count();
    ctx.check(companions >= 1, || "memcpy's probe has no companion".into());
    held.release().unwrap();
    let live = code(&process);
    ctx.check(live != before, || "no patch written".into());
    round += 1;
    t.send("go");
    t.expect_stdout("a round", |l| l == format!("round {round} done"));
    let mut held = process.hold().unwrap();
    held.remove(&ids).unwrap();
    ctx.check(held.probes().iter().all(|p| !p.active), || {
        "a companion stayed in after its probe was removed".into()
    });
    held.release().unwrap();
    ctx.check(code(&process) == before, || {
        "the code was not restored".into()
    });
    round += 1;
    t.send("go");
    t.expect_stdout("a round", |l| l == format!("round {round} done"));
    ctx.check(!t.stdout_text().contains(" bad 1"), || {
        "a wrong result".into()
    });
    t.send("quit");
    t.wait_code(0);
}

/// Inserted and removed 40 times while four threads copy through memcpy
/// and mempcpy as fast as they can: threads stopped inside memcpy's patch
/// or its companion's are moved, a companion's trampoline pins its
/// probe's, and every copy stays right (the workers check each one and
/// their sums are those of a round without weft).
#[test]
fn insert_and_remove_while_copying() {
    use weft::{Metrics, Pattern, Process};
    let ctx = Ctx::new("insert_and_remove_while_copying");
    let mut t = ctx.target(multientry(), &["--pure", "4", "10000000", "10000000"]);
    let (pid, _) = wait_ready(&mut t);
    let sums = |t: &Proc, round: usize| -> Vec<String> {
        let text = t.stdout_text();
        let end = text.find(&format!("round {round} done")).unwrap();
        let start = match round {
            1 => 0,
            r => text.find(&format!("round {} done", r - 1)).unwrap(),
        };
        let mut v: Vec<String> = text[start..end]
            .lines()
            .filter(|l| l.starts_with("thread "))
            .map(|l| {
                ctx.check(l.ends_with(" bad 0"), || format!("a wrong copy: {l}"));
                l.split_whitespace().nth(7).unwrap().to_string()
            })
            .collect();
        v.sort();
        v
    };
    t.send("go");
    t.expect_stdout("round 1", |l| l == "round 1 done");
    let expected = sums(&t, 1);
    let mut process = Process::open(pid as i32).unwrap();
    let found = process
        .find_functions(&[
            Pattern::parse("libc.so.6:memcpy").unwrap(),
            Pattern::parse("libc.so.6:mempcpy").unwrap(),
        ])
        .unwrap();
    t.send("go");
    std::thread::sleep(std::time::Duration::from_millis(50));
    for cycle in 0..40 {
        let metrics = if cycle % 2 == 0 {
            Metrics::CALLS
        } else {
            Metrics::ALL
        };
        let mut held = process.hold().unwrap();
        held.insert(&found, metrics)
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: insert: {e}")));
        held.release().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let mut held = process.hold().unwrap();
        held.remove_all()
            .unwrap_or_else(|e| ctx.fail(format!("cycle {cycle}: remove: {e}")));
        held.release().unwrap();
    }
    let still_copying = !t.stdout_text().contains("round 2 done");
    println!(
        "threads moved out of patches: {}; the round still ran after the 40 cycles: \
         {still_copying}",
        process.threads_moved()
    );
    t.expect_stdout("round 2", |l| l == "round 2 done");
    ctx.check(sums(&t, 2) == expected, || {
        "the copies made while weft came and went summed differently".into()
    });
    t.send("quit");
    t.wait_code(0);
}

/// A companion is in the target's probe directory with its probe: another
/// weft asking for memcpy while the first has it is refused with the
/// reason (a probe with companions is not shared), and once the first is
/// killed, the next weft takes out memcpy's patch and the companion's,
/// from the directory, leaving both functions as compiled.
#[test]
fn a_killed_wefts_companion_is_taken_out() {
    use weft::{Metrics, Pattern, Process};
    let ctx = Ctx::new("a_killed_wefts_companion_is_taken_out");
    let mut t = ctx.target(multientry(), &["3", "1000", "1000"]);
    let (pid, _) = wait_ready(&mut t);
    t.send("go");
    t.expect_stdout("round 1", |l| l == "round 1 done");
    let mut process = Process::open(pid as i32).unwrap();
    let patterns = [
        Pattern::parse("libc.so.6:memcpy").unwrap(),
        Pattern::parse("libc.so.6:mempcpy").unwrap(),
    ];
    let found = process.find_functions(&patterns).unwrap();
    let addresses: Vec<u64> = found
        .iter()
        .map(|f| process.image().resolved_address(f).unwrap())
        .collect();
    let lo = addresses.iter().min().unwrap() - 64;
    let hi = addresses.iter().max().unwrap() + 64;
    let code = |p: &Process| p.read_memory(lo, (hi - lo) as usize).unwrap();
    let before = code(&process);

    let p = pid.to_string();
    let mut first = ctx.weft(&["attach", "-p", &p, "-f", "libc.so.6:memcpy", "-m", "calls"]);
    wait_attached(&mut first);
    let live = code(&process);
    // memcpy's patch, and the companion's over mempcpy's jump.
    let changed: Vec<usize> = (0..before.len())
        .filter(|&i| before[i] != live[i])
        .collect();
    let at = |name: &str| {
        let i = found.iter().position(|f| f.name == name).unwrap();
        (addresses[i] - lo) as usize
    };
    let (m, x) = (at("memcpy"), at("mempcpy"));
    ctx.check(
        changed.iter().any(|&i| (m..m + 5).contains(&i))
            && changed.iter().any(|&i| (x..m).contains(&i)),
        || format!("not both patches in place: bytes changed at {changed:?} (memcpy at {m}, mempcpy at {x})"),
    );
    let memcpy = found.iter().find(|f| f.name == "memcpy").unwrap().clone();
    {
        let mut held = process.hold().unwrap();
        match held.insert(std::slice::from_ref(&memcpy), Metrics::CALLS) {
            Err(e) => ctx.check(e.to_string().contains("another weft"), || {
                format!("refused for another reason: {e}")
            }),
            Ok(_) => ctx.fail("a second weft shared a probe with companions"),
        }
        held.release().unwrap();
    }
    first.signal(nix::sys::signal::Signal::SIGKILL);
    first.wait_exit();
    t.send("go");
    t.expect_stdout("round 2", |l| l == "round 2 done");
    // The next change takes out what the killed weft left.
    let strlen = process
        .find_functions(&[Pattern::parse("libc.so.6:strlen").unwrap()])
        .unwrap();
    let mut held = process.hold().unwrap();
    held.insert(&strlen, Metrics::CALLS).unwrap();
    held.release().unwrap();
    ctx.check(code(&process) == before, || {
        "memcpy's patch or its companion's stayed after the weft that put them in was killed".into()
    });
    t.send("go");
    t.expect_stdout("round 3", |l| l == "round 3 done");
    ctx.check(!t.stdout_text().contains(" bad 1"), || {
        "a wrong result".into()
    });
    let mut held = process.hold().unwrap();
    held.remove_all().unwrap();
    held.release().unwrap();
    t.send("quit");
    t.wait_code(0);
}

/// A sibling only 5 bytes long (`mov; jmp` into short_shared+3): its own
/// entry patch displaces the jump. Asked for together, its trampoline's
/// copy of the jump goes to short_shared's copy of the target, and the two
/// probes are tied: each counts exactly, and removing one takes both out.
/// Asked for later, after short_shared's companion took the jump, the
/// sibling is refused with the reason.
#[test]
fn a_sibling_that_displaces_its_own_jump() {
    use weft::{Metrics, Pattern, Process};
    let ctx = Ctx::new("a_sibling_that_displaces_its_own_jump");
    let dir = scratch_dir("a_sibling_that_displaces_its_own_jump");
    let out = dir.join("report.json");
    let exe = multientry().to_str().unwrap().to_string();
    let mut w = ctx.weft(&[
        "run",
        "-f",
        "short_shared,short_sibling",
        "-m",
        "calls,wall",
        "--format",
        "json",
        "-o",
        out.to_str().unwrap(),
        "--",
        &exe,
        "--pure",
        "3",
        "1500",
        "900",
        "1",
    ]);
    w.wait_code(0);
    let report = parse_report(&ctx, &std::fs::read_to_string(&out).unwrap());
    let workers: Vec<i64> = w
        .stdout_text()
        .lines()
        .filter(|l| l.starts_with("thread ") && l.ends_with(" bad 0"))
        .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
        .collect();
    ctx.check(workers.len() == 3, || "not three good workers".into());
    for tid in workers {
        let (shared, sibling) = (
            report.counts(tid, "short_shared"),
            report.counts(tid, "short_sibling"),
        );
        ctx.check(
            shared.calls == 1500
                && sibling.calls == 900
                && shared.exits == Some(1500)
                && sibling.exits == Some(900),
            || format!("thread {tid}: {shared:?} {sibling:?}"),
        );
    }

    let mut t = ctx.target(multientry(), &["2", "100", "100"]);
    let (pid, _) = wait_ready(&mut t);
    let mut process = Process::open(pid as i32).unwrap();
    let shared = process
        .find_functions(&[Pattern::parse("short_shared").unwrap()])
        .unwrap();
    let sibling = process
        .find_functions(&[Pattern::parse("short_sibling").unwrap()])
        .unwrap();
    let lo = sibling[0].address;
    let code = |p: &Process| p.read_memory(lo, 64).unwrap();
    let before = code(&process);
    let both = [shared.clone(), sibling.clone()].concat();
    let mut held = process.hold().unwrap();
    let ids = held.insert(&both, Metrics::CALLS).unwrap();
    ctx.check(
        held.probes().iter().all(|p| p.companion_of().is_none()),
        || "a companion where the sibling's own trampoline carries the jump".into(),
    );
    held.release().unwrap();
    t.send("go");
    t.expect_stdout("round 1", |l| l == "round 1 done");
    let mut held = process.hold().unwrap();
    held.remove(&ids[..1]).unwrap();
    ctx.check(held.probes().iter().all(|p| !p.active), || {
        "removing one of two tied probes left the other in".into()
    });
    held.release().unwrap();
    ctx.check(code(&process) == before, || {
        "the code was not restored".into()
    });

    // One, then the other: the companion holds the sibling's jump.
    let mut held = process.hold().unwrap();
    held.insert(&shared, Metrics::CALLS).unwrap();
    match held.insert(&sibling, Metrics::CALLS) {
        Err(e) => ctx.check(e.to_string().contains("overlaps the probe"), || {
            format!("refused for another reason: {e}")
        }),
        Ok(_) => ctx.fail("the sibling went in over short_shared's companion"),
    }
    held.release().unwrap();
    t.send("go");
    t.expect_stdout("round 2", |l| l == "round 2 done");
    ctx.check(!t.stdout_text().contains(" bad 1"), || {
        "a wrong result".into()
    });
    let mut held = process.hold().unwrap();
    held.remove_all().unwrap();
    held.release().unwrap();
    ctx.check(code(&process) == before, || {
        "the code was not restored".into()
    });
    t.send("quit");
    t.wait_code(0);
}
