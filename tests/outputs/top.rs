//! `weft top`, driven in a real terminal: tmux (its own server, started
//! and ended here) runs a shell, the test types into it (send-keys) and
//! reads the screen (capture-pane).

use crate::support;

use std::process::Command;
use std::time::{Duration, Instant};
use support::*;

/// A tmux server of this test's own (`-L`), ended on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn start(ctx: &Ctx, name: &str) -> Tmux {
        let t = Tmux {
            socket: format!("weft-test-{}-{name}", std::process::id()),
        };
        let out = t.run(&[
            "new-session",
            "-d",
            "-s",
            "main",
            "-x",
            "160",
            "-y",
            "45",
            "bash --norc --noprofile",
        ]);
        ctx.check(out.status.success(), || {
            format!(
                "tmux could not start (Debian package `tmux`; scripts/test installs it): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        t
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("tmux runs")
    }

    /// Types `keys` (tmux key names: "Enter", "q", …).
    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "main"];
        args.extend_from_slice(keys);
        self.run(&args);
    }

    /// Types a line of text and Enter.
    fn line(&self, text: &str) {
        self.run(&["send-keys", "-t", "main", "-l", text]);
        self.keys(&["Enter"]);
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "main"]).stdout).to_string()
    }

    /// Waits until the screen satisfies `pred`; fails with the screen.
    fn wait_for(&self, ctx: &Ctx, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = self.screen();
            if pred(&s) {
                return s;
            }
            if Instant::now() > deadline {
                ctx.fail(format!("timed out waiting for {what}; the screen:\n{s}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn alternate_screen(&self) -> bool {
        let out = self.run(&["display-message", "-p", "-t", "main", "#{alternate_on}"]);
        String::from_utf8_lossy(&out.stdout).trim() == "1"
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        // Our own server only (-L): the shell in it and whatever still runs.
        let _ = self.run(&["kill-server"]);
    }
}

/// The functions view's rows on `screen`: (name, calls, calls/s), top to
/// bottom.
fn function_rows(screen: &str) -> Vec<(String, u64, f64)> {
    screen
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let name = f.next()?;
            if !WORKER_FUNCS.contains(&name) {
                return None;
            }
            let _module = f.next()?;
            let calls = f.next()?.parse().ok()?;
            let rate = f.next()?.parse().ok()?;
            Some((name.to_string(), calls, rate))
        })
        .collect()
}

#[test]
fn top_shows_the_targets_own_counts_sorts_quits_and_restores_the_terminal() {
    let ctx = Ctx::new("top_shows_the_targets_own_counts_sorts_quits_and_restores_the_terminal");
    let _turn = one_at_a_time();
    let mut t = ctx.target(workers_c(), &["--threads", "3", "--phases", "2"]);
    t.expect_stdout("ready", |l| l.starts_with("ready"));
    let tmux = Tmux::start(&ctx, "top");
    tmux.line(&format!(
        "{} top -p {} -f work_a,work_b,lib_work -m calls,wall,cpu --interval 0.3; echo WEFT_EXIT=$?",
        weft_bin(),
        t.pid
    ));
    tmux.wait_for(&ctx, "the functions view", |s| {
        s.contains("FUNCTION") && s.contains("sort: calls/s")
    });
    ctx.check(tmux.alternate_screen(), || {
        "weft top is not on the alternate screen".into()
    });

    t.send("go");
    t.expect_stdout("phase 1 done", |l| l == "phase 1 done");
    let own = check_worker_phase(&ctx, &t.stdout_text(), 1, 3);
    let total = |f: &str| own.iter().map(|l| l.count(f)).sum::<u64>();
    // Every function's calls on screen equal the target's own, summed over
    // its threads; once the phase is over, a reading later, every rate is
    // 0 and rows fall back to name order.
    let screen = tmux.wait_for(&ctx, "the target's counts, idle", |s| {
        let rows = function_rows(s);
        rows.len() == 3
            && rows
                .iter()
                .all(|(f, c, rate)| *c == total(f) && *rate == 0.0)
    });
    let by_rate: Vec<String> = function_rows(&screen).into_iter().map(|r| r.0).collect();
    ctx.check(by_rate == ["lib_work", "work_a", "work_b"], || {
        format!("rows by rate (all 0: by name): {by_rate:?}\n{screen}")
    });

    // `s`: sorted by calls, most first.
    tmux.keys(&["s"]);
    let screen = tmux.wait_for(&ctx, "sort by calls", |s| s.contains("sort: calls "));
    let by_calls: Vec<String> = function_rows(&screen).into_iter().map(|r| r.0).collect();
    let mut want: Vec<&str> = WORKER_FUNCS.to_vec();
    want.sort_by_key(|f| std::cmp::Reverse(total(f)));
    ctx.check(by_calls == want, || {
        format!("rows by calls: {by_calls:?}, want {want:?}\n{screen}")
    });

    // `t`: the threads view, each worker with its own calls.
    tmux.keys(&["t"]);
    let screen = tmux.wait_for(&ctx, "the threads view", |s| s.contains("BUSIEST FUNCTION"));
    for line in &own {
        let calls = line.work_a + line.work_b + line.lib_work;
        let row = screen
            .lines()
            .find(|l| l.split_whitespace().next() == Some(line.tid.to_string().as_str()));
        ctx.check(
            row.is_some_and(|r| r.split_whitespace().any(|w| w == calls.to_string())),
            || format!("thread {} ({calls} calls): {row:?}\n{screen}", line.tid),
        );
    }

    // `t` back, then `]` until a worker is shown alone: its own figures.
    tmux.keys(&["t"]);
    let mut shown = None;
    for _ in 0..8 {
        let before = tmux.screen();
        tmux.keys(&["]"]);
        let screen = tmux.wait_for(&ctx, "the next thread filter", |s| {
            s != before && s.contains("FUNCTION")
        });
        let tid: Option<i64> = screen
            .split("  thread ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|t| t.parse().ok());
        if let Some(mine) = own.iter().find(|l| Some(l.tid) == tid) {
            let rows = function_rows(&screen);
            ctx.check(
                rows.len() == 3 && rows.iter().all(|(f, c, _)| *c == mine.count(f)),
                || {
                    format!(
                        "thread {}'s rows {rows:?}, its own {mine:?}\n{screen}",
                        mine.tid
                    )
                },
            );
            shown = Some(mine.tid);
            break;
        }
    }
    ctx.check(shown.is_some(), || {
        format!("`]` never showed a worker alone:\n{}", tmux.screen())
    });

    // `q`: weft detaches, exits 0, and the terminal is as it was.
    tmux.keys(&["q"]);
    // The line echo prints, not the command line that names it.
    let exit_line = |s: &str| {
        s.lines()
            .find(|l| l.starts_with("WEFT_EXIT="))
            .map(str::to_string)
    };
    let screen = tmux.wait_for(&ctx, "weft's exit", |s| exit_line(s).is_some());
    ctx.check(exit_line(&screen).as_deref() == Some("WEFT_EXIT=0"), || {
        screen.clone()
    });
    ctx.check(screen.contains("weft: detached from"), || screen.clone());
    ctx.check(!tmux.alternate_screen(), || {
        "still on the alternate screen".into()
    });
    // The marker is computed so that the typed command does not match.
    tmux.line(
        "stty -a | tr ' ;' '\\n\\n' | grep -x -e icanon -e echo | tr '\\n' ' '; echo STTY_$((6*7))",
    );
    let screen = tmux.wait_for(&ctx, "stty", |s| s.contains("STTY_42"));
    ctx.check(screen.contains("icanon echo STTY_42"), || {
        format!("the terminal is not back in canonical mode with echo:\n{screen}")
    });

    // The target is unharmed and uninstrumented: phase 2 counts right.
    t.send("go");
    t.expect_stdout("phase 2 done", |l| l == "phase 2 done");
    check_worker_phase(&ctx, &t.stdout_text(), 2, 3);
    t.wait_code(0);
}

#[test]
fn top_without_a_terminal_prints_plain_tables_and_detaches_on_sigterm() {
    let ctx = Ctx::new("top_without_a_terminal_prints_plain_tables_and_detaches_on_sigterm");
    let _turn = one_at_a_time();
    let mut t = ctx.target(workers_c(), &["--threads", "2", "--phases", "2"]);
    t.expect_stdout("ready", |l| l.starts_with("ready"));
    let mut w = ctx.weft(&[
        "top",
        "-p",
        &t.pid_str(),
        "-f",
        "work_a",
        "-m",
        "calls",
        "--interval",
        "0.2",
    ]);
    w.expect_line(Stream::Stderr, "attached", |l| l.contains("attached"));
    t.send("go");
    t.expect_stdout("phase 1 done", |l| l == "phase 1 done");
    let own = check_worker_phase(&ctx, &t.stdout_text(), 1, 2);
    let total: u64 = own.iter().map(|l| l.work_a).sum();
    // A table after the phase shows its total.
    w.wait_stdout_holds(
        &thousands(total),
        &format!("a table with {total} calls of work_a"),
    );
    ctx.check(w.stdout_text().contains("weft top: pid"), || {
        w.stdout_text()
    });
    w.signal(nix::sys::signal::Signal::SIGTERM);
    w.wait_code(0);
    t.send("go");
    t.expect_stdout("phase 2 done", |l| l == "phase 2 done");
    check_worker_phase(&ctx, &t.stdout_text(), 2, 2);
    t.wait_code(0);
}

/// One line of the shares target (tests/targets/shares.c): sums over its
/// threads.
#[derive(serde::Deserialize, Debug, Clone, Copy)]
struct ShareLine {
    t_ns: u64,
    elapsed_ns: u64,
    wall_ns: u64,
    cpu_ns: u64,
}

fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// (WALL%, CPU%) of `function`'s row on `screen`.
fn shares_on(screen: &str, function: &str) -> Option<(f64, f64)> {
    screen.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.first() != Some(&function) || f.len() < 6 {
            return None;
        }
        Some((f[4].parse().ok()?, f[5].parse().ok()?))
    })
}

/// `WALL%` and `CPU%` are shares of the threads' time: three threads that
/// each spend a known part of their time in `work()` (spinning 400 µs,
/// then sleeping 600 µs, measured by the threads' own clocks) show, on
/// screen, that share within 5 points (and never above 100); before, the
/// share was of one thread's time (three threads always in a function
/// showed 300 %). The threads view's header names its own order, `s`
/// changes it, and `]` shows one thread alone.
#[test]
fn top_shares_are_the_threads_own_and_the_threads_view_sorts_and_filters() {
    let ctx = Ctx::new("top_shares_are_the_threads_own_and_the_threads_view_sorts_and_filters");
    let _turn = one_at_a_time();
    let exe = build_c_target("shares", &["-O2", "-g"]);
    let mut t = ctx.target(&exe, &["3", "400", "600", "90"]);
    t.expect_stdout("ready", |l| l == "ready");
    let tmux = Tmux::start(&ctx, "shares");
    let interval = 1.0;
    tmux.line(&format!(
        "{} top -p {} -f work -m calls,wall,cpu --interval {interval}; echo WEFT_EXIT=$?",
        weft_bin(),
        t.pid
    ));
    tmux.wait_for(&ctx, "the shares of work", |s| {
        shares_on(s, "work").is_some()
    });
    let lines = |t: &Proc| -> Vec<ShareLine> {
        t.stdout_text()
            .lines()
            .filter(|l| l.starts_with('{'))
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let mut compared = 0;
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(1300));
        let screen = tmux.screen();
        let at = monotonic_ns();
        let Some((wall, cpu)) = shares_on(&screen, "work") else {
            ctx.fail(format!("no shares of work on screen:\n{screen}"));
        };
        // The screen's interval ended within the last interval (+ a
        // redraw): the target's share over each 1 s window that ends then.
        std::thread::sleep(Duration::from_millis(150));
        let own = lines(&t);
        let span = (interval * 1e9) as u64;
        let windows: Vec<(f64, f64)> = own
            .iter()
            .filter(|e| e.t_ns <= at && e.t_ns + span + 200_000_000 >= at)
            .filter_map(|e| {
                let s = own
                    .iter()
                    .rev()
                    .find(|s| s.t_ns + span <= e.t_ns + 50_000_000)?;
                let elapsed = e.elapsed_ns.checked_sub(s.elapsed_ns)? as f64;
                Some((
                    (e.wall_ns - s.wall_ns) as f64 / elapsed * 100.0,
                    (e.cpu_ns - s.cpu_ns) as f64 / elapsed * 100.0,
                ))
            })
            .collect();
        ctx.check(!windows.is_empty(), || {
            format!("no target lines around the screen's reading: {own:?}")
        });
        let range = |f: fn(&(f64, f64)) -> f64| {
            let v: Vec<f64> = windows.iter().map(f).collect();
            (
                v.iter().copied().fold(f64::MAX, f64::min),
                v.iter().copied().fold(f64::MIN, f64::max),
            )
        };
        let (wall_lo, wall_hi) = range(|w| w.0);
        let (cpu_lo, cpu_hi) = range(|w| w.1);
        let figures = format!(
            "screen WALL% {wall} CPU% {cpu}; the threads' own share of time in work over the \
             possible windows: wall {wall_lo:.1}–{wall_hi:.1} %, cpu {cpu_lo:.1}–{cpu_hi:.1} %\n\
             {screen}"
        );
        eprintln!("{figures}");
        ctx.check(wall <= 100.0 && cpu <= 100.0, || figures.clone());
        ctx.check(wall >= wall_lo - 5.0 && wall <= wall_hi + 5.0, || {
            format!("WALL% is not the threads' share within 5 points: {figures}")
        });
        ctx.check(cpu >= cpu_lo - 5.0 && cpu <= cpu_hi + 5.0, || {
            format!("CPU% is not the threads' share within 5 points: {figures}")
        });
        compared += 1;
    }
    ctx.check(compared == 4, || {
        "compared fewer screens than planned".into()
    });

    // The threads view: its header names its order, `s` changes it.
    let thread_rows = |s: &str| -> Vec<(u64, u64)> {
        s.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                if f.len() < 5 || !f[1].starts_with("share-") {
                    return None;
                }
                Some((f[0].parse().ok()?, f[3].parse().ok()?))
            })
            .collect()
    };
    tmux.keys(&["t"]);
    tmux.wait_for(&ctx, "the threads view by calls/s", |s| {
        s.contains("BUSIEST FUNCTION") && s.contains("sort: calls/s") && thread_rows(s).len() == 3
    });
    tmux.keys(&["s"]);
    let screen = tmux.wait_for(&ctx, "the threads view by calls", |s| {
        s.contains("sort: calls ") && thread_rows(s).len() == 3
    });
    let calls: Vec<u64> = thread_rows(&screen).iter().map(|r| r.1).collect();
    ctx.check(calls.windows(2).all(|w| w[0] >= w[1]), || {
        format!("the threads view says it is by calls, its rows are not:\n{screen}")
    });
    tmux.keys(&["s"]);
    let screen = tmux.wait_for(&ctx, "the threads view by tid", |s| {
        s.contains("sort: tid ") && thread_rows(s).len() == 3
    });
    let tids: Vec<u64> = thread_rows(&screen).iter().map(|r| r.0).collect();
    ctx.check(tids.windows(2).all(|w| w[0] < w[1]), || {
        format!("the threads view says it is by tid, its rows are not:\n{screen}")
    });
    // `]`: one thread alone, the one the header names.
    tmux.keys(&["]"]);
    let screen = tmux.wait_for(&ctx, "one thread in the threads view", |s| {
        s.contains("  thread ") && thread_rows(s).len() == 1
    });
    let named: Option<u64> = screen
        .split("  thread ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|t| t.parse().ok());
    ctx.check(named == Some(thread_rows(&screen)[0].0), || {
        format!("`]` shows another thread than the header names:\n{screen}")
    });

    tmux.keys(&["q"]);
    let screen = tmux.wait_for(&ctx, "weft's exit", |s| {
        s.lines().any(|l| l.starts_with("WEFT_EXIT="))
    });
    ctx.check(screen.lines().any(|l| l == "WEFT_EXIT=0"), || {
        screen.clone()
    });
    ctx.check(t.is_running(), || "the target died".into());
}

/// The pid on a threads-view row of several processes (PID first).
fn pid_tid_calls(line: &str) -> Option<(u32, i64, u64)> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 6 || !matches!(f[3], "live" | "exited") {
        return None;
    }
    Some((f[0].parse().ok()?, f[1].parse().ok()?, f[4].parse().ok()?))
}

/// `weft top -p A,B`: the functions view holds both processes' calls
/// (each function's sum of the two targets' own counts), `}` shows one
/// process alone with its own counts, the threads view names each
/// thread's process; `q` detaches from both, which then count on
/// uninstrumented. Without a terminal, `--pid-of` prints each process's
/// table and the totals.
#[test]
fn top_of_several_processes_merges_and_shows_each_alone() {
    let ctx = Ctx::new("top_of_several_processes_merges_and_shows_each_alone");
    let _turn = one_at_a_time();
    let mut a = ctx.target(workers_c(), &["--threads", "2", "--phases", "2"]);
    let mut b = ctx.target(workers_c(), &["--threads", "3", "--phases", "2"]);
    for t in [&mut a, &mut b] {
        t.expect_stdout("ready", |l| l.starts_with("ready"));
    }
    let tmux = Tmux::start(&ctx, "several");
    tmux.line(&format!(
        "{} top -p {},{} -f work_a,work_b,lib_work -m calls --interval 0.3; echo WEFT_EXIT=$?",
        weft_bin(),
        a.pid,
        b.pid
    ));
    tmux.wait_for(&ctx, "the functions view of two processes", |s| {
        s.contains("FUNCTION") && s.contains("2 processes") && s.contains("all processes")
    });
    let mut own = Vec::new();
    for (t, threads) in [(&mut a, 2), (&mut b, 3)] {
        t.send("go");
        t.expect_stdout("phase 1 done", |l| l == "phase 1 done");
        own.push(check_worker_phase(&ctx, &t.stdout_text(), 1, threads));
    }
    let count = |i: usize, f: &str| own[i].iter().map(|l| l.count(f)).sum::<u64>();
    tmux.wait_for(&ctx, "both processes' calls, merged", |s| {
        let rows = function_rows(s);
        rows.len() == 3 && rows.iter().all(|(f, c, _)| *c == count(0, f) + count(1, f))
    });
    // `}` twice: the second process alone, its own counts.
    tmux.keys(&["}"]);
    tmux.wait_for(&ctx, "the first process alone", |s| {
        s.contains(&format!("pid {} (", a.pid))
    });
    tmux.keys(&["}"]);
    let screen = tmux.wait_for(&ctx, "the second process alone", |s| {
        s.contains(&format!("pid {} (", b.pid))
            && function_rows(s).iter().all(|(f, c, _)| *c == count(1, f))
    });
    ctx.check(function_rows(&screen).len() == 3, || screen.clone());
    // `}` back to all, then the threads view: every worker of both, with
    // its process and its own calls.
    tmux.keys(&["}", "t"]);
    let screen = tmux.wait_for(&ctx, "the threads view of both", |s| {
        s.contains("BUSIEST FUNCTION")
            && s.lines().filter_map(pid_tid_calls).count() == 5
            && s.contains("all processes")
    });
    for (i, t) in [&a, &b].iter().enumerate() {
        for line in &own[i] {
            let calls = line.work_a + line.work_b + line.lib_work;
            ctx.check(
                screen
                    .lines()
                    .filter_map(pid_tid_calls)
                    .any(|r| r == (t.pid, line.tid, calls)),
                || {
                    format!(
                        "no row for pid {} thread {} with {calls} calls:\n{screen}",
                        t.pid, line.tid
                    )
                },
            );
        }
    }
    tmux.keys(&["q"]);
    let screen = tmux.wait_for(&ctx, "weft's exit", |s| {
        s.lines().any(|l| l.starts_with("WEFT_EXIT="))
    });
    ctx.check(screen.contains("WEFT_EXIT=0"), || screen.clone());
    ctx.check(
        screen.contains(&format!("weft: detached from {},{}", a.pid, b.pid)),
        || screen.clone(),
    );
    for (t, threads) in [(&mut a, 2), (&mut b, 3)] {
        t.send("go");
        t.expect_stdout("phase 2 done", |l| l == "phase 2 done");
        check_worker_phase(&ctx, &t.stdout_text(), 2, threads);
        t.wait_code(0);
    }

    // No terminal: --pid-of a copy named for the test, each process's
    // table and the totals.
    let name = format!("wtop{}", std::process::id());
    let copy = workers_c().with_file_name(&name);
    std::fs::copy(workers_c(), &copy).unwrap();
    let mut a = ctx.target(&copy, &["--threads", "1", "--phases", "2"]);
    let mut b = ctx.target(&copy, &["--threads", "2", "--phases", "2"]);
    for t in [&mut a, &mut b] {
        t.expect_stdout("ready", |l| l.starts_with("ready"));
    }
    let mut w = ctx.weft(&[
        "top",
        "--pid-of",
        &name,
        "-f",
        "work_a",
        "-m",
        "calls",
        "--interval",
        "0.2",
    ]);
    for _ in 0..2 {
        w.expect_line(Stream::Stderr, "attached", |l| l.contains("attached"));
    }
    let mut made = 0;
    for (t, threads) in [(&mut a, 1), (&mut b, 2)] {
        t.send("go");
        t.expect_stdout("phase 1 done", |l| l == "phase 1 done");
        made += check_worker_phase(&ctx, &t.stdout_text(), 1, threads)
            .iter()
            .map(|l| l.work_a)
            .sum::<u64>();
    }
    w.wait_stdout_holds(
        &thousands(made),
        &format!("a table with the total {made} of work_a"),
    );
    let text = w.stdout_text();
    let header = format!("weft top: pids {},{}", a.pid, b.pid);
    let header2 = format!("weft top: pids {},{}", b.pid, a.pid);
    ctx.check(text.contains(&header) || text.contains(&header2), || {
        text.clone()
    });
    // weft ends when both have.
    for t in [&mut a, &mut b] {
        t.send("go");
        t.wait_code(0);
    }
    w.wait_code(0);
    let _ = std::fs::remove_file(&copy);
}

/// `top --children` (no terminal): the master's worker at the start, and
/// one forked later, followed from its fork (300 calls made at once, then
/// 2,000): the totals hold every call of both.
#[test]
fn top_with_children_follows_a_worker_forked_later() {
    let ctx = Ctx::new("top_with_children_follows_a_worker_forked_later");
    let _turn = one_at_a_time();
    let exe = build_c_target_with("gcc", "forker", &["-O2", "-g"]);
    let mut t = ctx.target(&exe, &["1"]);
    t.expect_stdout("ready", |l| l.starts_with("ready pid="));
    let mut w = ctx.weft(&[
        "top",
        "-p",
        &t.pid_str(),
        "--children",
        "-f",
        "handle",
        "-m",
        "calls",
        "--interval",
        "0.2",
    ]);
    for _ in 0..2 {
        w.expect_line(Stream::Stderr, "attached", |l| l.contains("attached pid="));
    }
    t.send("spawn 300");
    let spawned = t.expect_stdout("spawned", |l| l.starts_with("spawned "));
    let late = spawned.trim_start_matches("spawned ").to_string();
    w.expect_line(Stream::Stderr, "the late worker followed", |l| {
        l.contains(&format!("following pid={late} "))
    });
    t.send("go");
    t.expect_stdout("`done`", |l| l == "done");
    let total = thousands(4300);
    w.wait_stdout_holds(&total, &format!("a table with {total} calls of handle"));
    t.send("quit");
    t.wait_code(0);
    w.wait_code(0);
}
