//! Code that nothing calls (found on a real program: timing every
//! function of Debian's stripped `zstd` crashed it in `main`, because its
//! entry point was timed too, and the exit hook wrote a return address
//! over the `argc` the kernel leaves on top of the stack). An exit hook is
//! only sound where a `call` left a return address, so weft refuses to
//! time, with the reason, the program's ELF entry point, code whose
//! unwind information calls it the outermost frame, and signal
//! trampolines (tests/targets/uncalled.c has one of each, its own restorer
//! installed with the raw `rt_sigaction`); it still counts them, exactly.
//! Named and stripped (`fun_<addr>` from `.eh_frame`) alike.

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use support::*;

/// What tests/targets/uncalled.c prints given `one two`, as it does
/// without weft.
const OUTPUT: &str = "argc=3\nargv[1]=one\nargv[2]=two\nsignals=2000\noutermost=45\n";

/// The three functions nothing calls, with the words of their refusal.
const UNCALLED: [(&str, &str); 3] = [
    ("_start", "its ELF entry point"),
    ("weft_test_restorer", "a signal trampoline"),
    ("outermost_marker", "the outermost frame"),
];

struct Built {
    named: PathBuf,
    stripped: PathBuf,
    /// `nm`'s lines for the named binary.
    symbols: String,
}

impl Built {
    /// `fun_<addr>`: what weft calls function `name` in the stripped binary.
    fn stripped_name(&self, name: &str) -> String {
        let address = symbol_address(&self.symbols, name).unwrap_or_else(|| {
            panic!("no `{name}` in {}:\n{}", self.named.display(), self.symbols)
        });
        format!("fun_{address:x}")
    }
}

fn built() -> &'static Built {
    static B: OnceLock<Built> = OnceLock::new();
    B.get_or_init(|| {
        let named = build_c_target("uncalled", &["-O2"]);
        let stripped = named.with_file_name("uncalled-stripped");
        let symbols = strip_copy(&named, &stripped);
        Built {
            named,
            stripped,
            symbols,
        }
    })
}

/// The executable's file name: the module name of its patterns.
fn module(exe: &Path) -> &str {
    exe.file_name().unwrap().to_str().unwrap()
}

/// `weft run` on `exe one two`; the report in a file, so stdout is the
/// program's alone. Returns (stdout, stderr, report).
fn run(ctx: &Ctx, exe: &Path, weft_args: &[&str], test: &str) -> (String, String, Report) {
    let file = scratch_dir(test).join("report.json");
    let mut args = vec!["run"];
    args.extend(weft_args);
    args.extend(["--format", "json", "-o", file.to_str().unwrap(), "--"]);
    args.extend([exe.to_str().unwrap(), "one", "two"]);
    let mut weft = ctx.weft(&args);
    weft.wait_code(0);
    let report = parse_report(ctx, &std::fs::read_to_string(&file).unwrap_or_default());
    (weft.stdout_text(), weft.stderr_text(), report)
}

/// Timing every function of the program: the three are refused with their
/// reasons, everything else is timed, and the program's arguments,
/// signals and results are what they are without weft.
#[test]
fn timing_every_function_spares_code_nothing_calls() {
    let ctx = Ctx::new("timing_every_function_spares_code_nothing_calls");
    let b = built();
    for (exe, stripped) in [(&b.named, false), (&b.stripped, true)] {
        let name_of = |name: &str| {
            if stripped {
                b.stripped_name(name)
            } else {
                name.to_string()
            }
        };
        let pattern = format!("{}:*", module(exe));
        let (out, err, report) = run(
            &ctx,
            exe,
            &["-m", "calls,wall", "--explain", "-f", &pattern],
            "uncalled_timing",
        );
        ctx.check(out == OUTPUT, || {
            format!(
                "{}'s output under weft:\n{out}\nwithout:\n{OUTPUT}",
                exe.display()
            )
        });
        for (name, reason) in UNCALLED {
            let name = name_of(name);
            let refusal = err
                .lines()
                .find(|l| l.contains(&format!("`{name}`")) && l.contains("cannot time it"));
            ctx.check(refusal.is_some_and(|l| l.contains(reason)), || {
                format!("no refusal of `{name}` as {reason:?} on stderr:\n{err}")
            });
            ctx.check(report.function(&name).is_none(), || {
                format!("`{name}` was timed: it is in the report")
            });
        }
        // The rest was timed: the signal handler, 2,000 times.
        let handler = report.function(&name_of("on_usr1"));
        let timed = handler.map(|f| (f.calls, f.wall_ns.is_some()));
        ctx.check(timed == Some((2000, true)), || {
            format!("the handler: (calls, timed) {timed:?}, (2000, true) expected")
        });
    }
}

/// Counting them (`-m calls`) works, exactly: one `_start`, one call of
/// the outermost-marked function, a restorer run per signal.
#[test]
fn counting_code_nothing_calls_is_exact() {
    let ctx = Ctx::new("counting_code_nothing_calls_is_exact");
    let b = built();
    let patterns: Vec<String> = UNCALLED
        .iter()
        .map(|(n, _)| format!("{}:{n}", module(&b.named)))
        .collect();
    let mut args = vec!["-m", "calls"];
    for p in &patterns {
        args.extend(["-f", p.as_str()]);
    }
    let (out, err, report) = run(&ctx, &b.named, &args, "uncalled_counting");
    ctx.check(out == OUTPUT, || {
        format!("output under weft:\n{out}\nwithout:\n{OUTPUT}\nweft said:\n{err}")
    });
    for (name, want) in [
        ("_start", 1),
        ("weft_test_restorer", 2000),
        ("outermost_marker", 1),
    ] {
        let calls = report.function(name).map(|f| f.calls);
        ctx.check(calls == Some(want), || {
            format!("`{name}`: {calls:?} calls counted, {want} made")
        });
    }
}
