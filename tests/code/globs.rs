//! Big globs apply what is safe (issue #13): `-f 'libc.so.6:*'` on a
//! threaded target instruments every function that can be, prints one
//! summary line, lists the refused ones with their reasons under
//! `--explain`, and leaves the target's output unchanged; `--strict`
//! restores all or nothing; a refused function named exactly still fails
//! the request.

use crate::support;

use support::*;

/// The target's output without thread ids (they differ between runs).
fn without_tids(text: &str) -> String {
    text.lines()
        .map(|l| match l.strip_prefix("thread ") {
            Some(rest) => {
                let rest = rest.split_once(' ').map_or("", |(_, r)| r);
                format!("thread {rest}")
            }
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

const ARGS: [&str; 4] = ["4", "2000", "1000", "2"];

fn plain_output(ctx: &Ctx) -> String {
    let mut t = ctx.target(multientry(), &ARGS);
    t.wait_code(0);
    let text = t.stdout_text();
    ctx.check(
        text.contains("round 2 done") && !text.contains(" bad 1"),
        || format!("the target alone failed: {text}"),
    );
    without_tids(&text)
}

fn weft_run(ctx: &Ctx, extra: &[&str]) -> Proc {
    let exe = multientry().to_str().unwrap().to_string();
    let mut args = vec!["run", "-f", "libc.so.6:*", "-m", "calls"];
    args.extend_from_slice(extra);
    args.push("--");
    args.push(&exe);
    args.extend_from_slice(&ARGS);
    ctx.weft(&args)
}

/// The summary line: (instrumented, matched, refused) and whether it
/// points at --explain.
fn summary(ctx: &Ctx, stderr: &str) -> (usize, usize, usize, bool) {
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("functions instrumented"))
        .collect();
    ctx.check(lines.len() == 1, || {
        format!("not one summary line on stderr: {stderr}")
    });
    let number = |s: &str| s.replace(',', "").parse::<usize>().unwrap();
    let f: Vec<&str> = lines[0].split_whitespace().collect();
    // weft: A of B functions instrumented; C refused...
    ctx.check(
        f.len() >= 8 && f[0] == "weft:" && f[2] == "of" && f[7].starts_with("refused"),
        || format!("a summary line not as documented: {}", lines[0]),
    );
    (
        number(f[1]),
        number(f[3]),
        number(f[6]),
        lines[0].ends_with(", see --explain"),
    )
}

#[test]
fn a_glob_over_libc_applies_what_is_safe() {
    let ctx = Ctx::new("a_glob_over_libc_applies_what_is_safe");
    let plain = plain_output(&ctx);

    // Without --explain: one line, pointing at --explain.
    let dir = scratch_dir("a_glob_over_libc_applies_what_is_safe");
    let table = dir.join("report.txt");
    let mut w = weft_run(&ctx, &["-o", table.to_str().unwrap()]);
    w.wait_code(0);
    let (done, matched, refused, points) = summary(&ctx, &w.stderr_text());
    ctx.check(points, || "the summary does not point at --explain".into());
    ctx.check(
        done + refused == matched && done * 100 >= matched * 99,
        || format!("{done} of {matched} instrumented, {refused} refused"),
    );
    ctx.check(without_tids(&w.stdout_text()) == plain, || {
        "the target's output changed with all of libc instrumented".into()
    });
    ctx.check(!w.stderr_text().contains("weft:   `"), || {
        "refusals listed without --explain".into()
    });

    // --explain: the same line, then every refused function and why.
    let out = dir.join("report.json");
    let mut w = weft_run(
        &ctx,
        &["--explain", "--format", "json", "-o", out.to_str().unwrap()],
    );
    w.wait_code(0);
    let err = w.stderr_text();
    let (done2, _, refused2, points) = summary(&ctx, &err);
    ctx.check(!points && (done2, refused2) == (done, refused), || {
        format!("--explain changed the summary: {err}")
    });
    let explained: Vec<&str> = err.lines().filter(|l| l.starts_with("weft:   `")).collect();
    ctx.check(explained.len() == refused, || {
        format!("{refused} refused but {} explained: {err}", explained.len())
    });
    for line in &explained {
        ctx.check(
            line.contains("(libc.so.6, 0x")
                && line.split("): ").nth(1).is_some_and(|r| r.len() > 20),
            || format!("an explanation without a reason: {line}"),
        );
    }
    ctx.check(without_tids(&w.stdout_text()) == plain, || {
        "the target's output changed with all of libc instrumented".into()
    });
    let report = parse_report(&ctx, &std::fs::read_to_string(&out).unwrap());
    // IFUNCs resolving to one implementation (memcpy, memmove), or to one
    // the glob also matches by its own name (with libc's debug file),
    // share its probe: one report entry.
    ctx.check(report.functions.len() * 100 >= done * 95, || {
        format!(
            "{} functions in the report, {done} instrumented",
            report.functions.len()
        )
    });
    ctx.check(
        report.function("memcpy").is_some_and(|f| f.calls > 0),
        || "memcpy not counted".into(),
    );

    if refused > 0 {
        // --strict: all or nothing; the program never runs.
        let mut w = weft_run(&ctx, &["--strict"]);
        let (line, _) = expect_weft_error(&mut w);
        ctx.check(line.contains("nothing was changed"), || {
            format!("--strict did not refuse the request: {line}")
        });
        ctx.check(!w.stdout_text().contains("round"), || {
            "the program ran although --strict refused".into()
        });

        // A refused function named exactly fails the request, glob or not.
        let name = explained[0]
            .trim_start_matches("weft:   `")
            .split('`')
            .next()
            .unwrap()
            .to_string();
        let exact = format!("libc.so.6:{name}");
        let exe = multientry().to_str().unwrap().to_string();
        let mut args = vec![
            "run",
            "-f",
            "libc.so.6:mem*",
            "-f",
            &exact,
            "-m",
            "calls",
            "--",
            &exe,
        ];
        args.extend_from_slice(&ARGS);
        let mut w = ctx.weft(&args);
        let (line, _) = expect_weft_error(&mut w);
        ctx.check(
            line.contains(&format!("`{name}`")) && line.contains("nothing was changed"),
            || format!("the exact name's refusal does not fail the request: {line}"),
        );
        ctx.check(!w.stdout_text().contains("round"), || {
            "the program ran although its exact function was refused".into()
        });
    }
}

/// `weft attach -f 'libc.so.6:*'` to a running threaded target: applies,
/// prints the summary with --explain, the target computes the same.
#[test]
fn attach_with_a_glob_over_libc() {
    let ctx = Ctx::new("attach_with_a_glob_over_libc");
    let mut t = ctx.target(multientry(), &["4", "2000", "1000"]);
    let (pid, _) = wait_ready(&mut t);
    t.send("go");
    t.expect_stdout("round 1", |l| l == "round 1 done");
    let p = pid.to_string();
    let mut w = ctx.weft(&[
        "attach",
        "-p",
        &p,
        "-f",
        "libc.so.6:*",
        "-m",
        "calls",
        "--explain",
        "--format",
        "json",
    ]);
    w.expect_line(Stream::Stderr, "the attached line", |l| {
        l.starts_with("weft: attached")
    });
    let (done, _, refused, _) = summary(&ctx, &w.stderr_text());
    ctx.check(
        w.stderr_text().contains(&format!("functions={done}")),
        || {
            format!(
                "the attached line does not count {done} functions: {}",
                w.stderr_text()
            )
        },
    );
    let explained = w
        .stderr_text()
        .lines()
        .filter(|l| l.starts_with("weft:   `"))
        .count();
    ctx.check(explained == refused, || {
        format!("{refused} refused, {explained} explained")
    });
    for round in 2..=3 {
        t.send("go");
        t.expect_stdout("a round", |l| l == format!("round {round} done"));
    }
    w.signal(nix::sys::signal::Signal::SIGINT);
    w.wait_code(0);
    let report = parse_report(&ctx, &w.stdout_text());
    ctx.check(
        report.function("memcpy").is_some_and(|f| f.calls > 0),
        || "memcpy not counted".into(),
    );
    t.send("go");
    t.expect_stdout("a round", |l| l == "round 4 done");
    let text = t.stdout_text();
    let rounds: Vec<Vec<String>> = (1..=4)
        .map(|r| {
            let end = text.find(&format!("round {r} done")).unwrap();
            let start = if r == 1 {
                0
            } else {
                text.find(&format!("round {} done", r - 1)).unwrap()
            };
            let mut sums: Vec<String> = without_tids(&text[start..end])
                .lines()
                .filter(|l| l.starts_with("thread "))
                .map(String::from)
                .collect();
            sums.sort();
            sums
        })
        .collect();
    for r in 1..4 {
        ctx.check(rounds[r] == rounds[0], || {
            format!(
                "round {} differs from round 1: {:?} {:?}",
                r + 1,
                rounds[r],
                rounds[0]
            )
        });
    }
    ctx.check(!text.contains(" bad 1"), || "a wrong result".into());
    t.send("quit");
    t.wait_code(0);
}

/// All of libc timed (`-m calls,wall`) in a threaded program to its end:
/// its threads exit through timed functions that are still running when
/// the runtime closes their activations at thread exit (`start_thread`,
/// `__call_tls_dtors`), and call timed ones after (`free`). The program
/// behaves as without weft (it died of SIGILL when those calls pushed over
/// the closed activations' return addresses), and every exited thread's
/// figures balance.
#[test]
fn timing_all_of_libc_to_a_threaded_programs_end_harms_nothing() {
    let ctx = Ctx::new("timing_all_of_libc_to_a_threaded_programs_end_harms_nothing");
    let plain = plain_output(&ctx);
    let file = scratch_dir("timing_all_of_libc_to_a_threaded_programs_end_harms_nothing")
        .join("report.json");
    let file_s = file.to_str().unwrap().to_string();
    let exe = multientry().to_str().unwrap().to_string();
    let mut args = vec![
        "run",
        "-f",
        "libc.so.6:*",
        "-m",
        "calls,wall",
        "--format",
        "json",
        "-o",
        &file_s,
        "--",
        &exe,
    ];
    args.extend_from_slice(&ARGS);
    let mut w = ctx.weft(&args);
    w.wait_code(0);
    ctx.check(without_tids(&w.stdout_text()) == plain, || {
        format!(
            "the output under weft differs:\n{}\nwithout weft:\n{plain}",
            w.stdout_text()
        )
    });
    let text = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| ctx.fail(format!("cannot read the report file {file_s}: {e}")));
    let report = parse_report(&ctx, &text);
    // The workers; the main thread ends the process in `_exit`, whose call
    // stays open.
    let workers: Vec<&ReportThread> = report
        .threads
        .iter()
        .filter(|t| t.exited && t.tid != report.pid)
        .collect();
    ctx.check(workers.len() >= 4, || {
        format!(
            "{} exited workers in the report, the program ran 4",
            workers.len()
        )
    });
    for t in workers {
        for (name, c) in &t.functions {
            let (e, u, h) = (
                c.exits.unwrap_or(0),
                c.unwound.unwrap_or(0),
                c.unhooked.unwrap_or(0),
            );
            ctx.check(c.calls == e + u + h, || {
                format!(
                    "exited worker {} {name}: calls {} != exits {e} + unwound {u} + unhooked {h}",
                    t.tid, c.calls
                )
            });
        }
    }
}
