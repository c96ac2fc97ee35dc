//! Go code under weft (issue #12): a cgo-linked Go program whose
//! instrumented function takes its arguments in registers (Go's register
//! ABI, `rbx` included) keeps its output and is counted exactly, while its
//! runtime collects garbage, preempts and walks stacks; timers on Go code
//! are refused with the reason before the program runs, because Go's
//! runtime dies ("unexpected return pc") when it walks a stack through the
//! return address an exit hook replaces.

use crate::support;

use support::*;

const CALLS: u64 = 1_000_000;

/// `weft run ARGS -- gocompute CALLS`, the report to a file when `report`.
fn run(
    ctx: &Ctx,
    test: &str,
    args: &[&str],
    report: bool,
) -> (Proc, std::process::ExitStatus, Option<Report>) {
    let exe = go_compute().to_str().unwrap().to_string();
    let file = scratch_dir(test).join("report.json");
    let file_s = file.to_str().unwrap().to_string();
    let calls = CALLS.to_string();
    let mut all = vec!["run"];
    all.extend_from_slice(args);
    if report {
        all.extend_from_slice(&["--format", "json", "-o", &file_s]);
    }
    all.extend_from_slice(&["--", &exe, &calls]);
    let mut weft = ctx.weft(&all);
    let status = weft.wait_exit();
    let report = report.then(|| {
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| ctx.fail(format!("cannot read the report {file_s}: {e}")));
        parse_report(ctx, &text)
    });
    (weft, status, report)
}

#[test]
fn go_function_counted_exactly_output_unchanged() {
    let ctx = Ctx::new("go_function_counted_exactly_output_unchanged");
    let mut plain = ctx.target(go_compute(), &[&CALLS.to_string()]);
    plain.close_stdin();
    plain.wait_code(0);
    let expected = plain.stdout_text();
    ctx.check(expected.ends_with("c=42 walks=ok\n"), || {
        format!("the Go program alone printed {expected:?}")
    });

    let (mut weft, _, report) = run(
        &ctx,
        "go_function_counted_exactly_output_unchanged",
        &["-m", "calls", "-f", "main.compute"],
        true,
    );
    weft.wait_code(0);
    ctx.check(weft.stdout_text() == expected, || {
        format!(
            "under weft the Go program printed {:?}, alone {expected:?}",
            weft.stdout_text()
        )
    });
    let report = report.unwrap();
    let counted: u64 = report
        .threads
        .iter()
        .map(|t| report.counts(t.tid, "main.compute").calls)
        .sum();
    ctx.check(counted == CALLS, || {
        format!("main.compute counted {counted} times, called {CALLS}: {report:?}")
    });
}

#[test]
fn go_timers_refused_with_the_reason() {
    let ctx = Ctx::new("go_timers_refused_with_the_reason");
    for (metrics, pattern) in [
        ("calls,wall", "main.compute"),
        ("calls,wall,cpu", "main.compute"),
        ("calls,wall", "gocompute:main.*"),
    ] {
        let (weft, status, _) = run(
            &ctx,
            "go_timers_refused_with_the_reason",
            &["-m", metrics, "-f", pattern],
            false,
        );
        let err = weft.stderr_text();
        ctx.check(
            err.contains("`main.compute`")
                && err.contains("is Go code")
                && err.contains("unexpected return pc")
                && err.contains("-m calls"),
            || format!("-m {metrics} -f {pattern}: no refusal naming Go in {err:?}"),
        );
        ctx.check(status.code().is_some_and(|c| c != 0), || {
            format!("-m {metrics} -f {pattern}: weft ended with {status:?} after refusing")
        });
        // Refused before main: the program printed nothing.
        ctx.check(weft.stdout_text().is_empty(), || {
            format!(
                "-m {metrics} -f {pattern}: the program ran: {:?}",
                weft.stdout_text()
            )
        });
    }
}

/// `weft diagnose` on a Go program says what it could not test: Go code
/// cannot be timed, so its tests are given up, and the diagnosis says so
/// (and counts the refusals, with an example reason) instead of a bare
/// "no bottleneck found" (issue 31 §3). The program runs to its end
/// unharmed.
#[test]
fn go_diagnosis_says_what_it_could_not_test() {
    let ctx = Ctx::new("go_diagnosis_says_what_it_could_not_test");
    let exe = go_compute().to_str().unwrap().to_string();
    // About 3 s of calls: the search starts long before the program ends.
    let calls = (600 * CALLS).to_string();
    let mut weft = ctx.weft(&["diagnose", "--duration", "5", "--", &exe, &calls]);
    weft.wait_code(0);
    let out = weft.stdout_text();
    ctx.check(out.contains("c=42 walks=ok"), || {
        format!("the Go program's output under diagnose: {out:?}")
    });
    // Said up front, however far the search got before the program ended
    // (a refusal count follows when tests of Go functions came up).
    ctx.check(out.contains("is Go code, which weft cannot time"), || {
        format!("the diagnosis does not say Go code could not be timed:\n{out}")
    });
}
