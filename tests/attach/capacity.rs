//! Capacity: 10,000 timed functions, and 100,000 counted on 1,000 threads,
//! exact per thread; the region's memory stays what docs/performance.md
//! says a thread costs (its row grows with the words handed out, not with
//! the row's limit).

use crate::support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use support::*;

/// Functions in the generated target.
const FUNCTIONS: usize = 100_000;
/// Bytes per timed function per thread (`weft_rt::layout::metric::TIMED_LEN`),
/// as documented.
const TIMED_BYTES: u64 = weft_rt::layout::metric::TIMED_LEN as u64;
/// Bytes of a row before its words (`ROW_HEADER_SIZE`), as documented.
const ROW_HEADER: u64 = weft_rt::layout::ROW_HEADER_SIZE as u64;

/// The generated target: `FUNCTIONS` functions `f00000`…, and threads that
/// each call a span of them a known number of times (see `rounds`).
///
/// `capacity THREADS SPAN STRIDE`: thread `t` calls `f[(t*STRIDE + k) %
/// FUNCTIONS]` for `k < SPAN`, `rounds(t)` times each; every thread prints
/// `thread T tid=TID`; then the main thread prints the region's resident
/// size and `done`.
fn target() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("weft-targets-capacity");
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("capacity.c");
        let asm = dir.join("functions.S");
        let exe = dir.join("capacity");
        // The functions in assembly: `as` takes a second for 100,000 of
        // them where gcc takes minutes. Each is a 10-byte leaf with its
        // symbol size, as a compiler would emit.
        let mut s = String::from(".text\n");
        for i in 0..FUNCTIONS {
            s.push_str(&format!(
                ".p2align 4\n.globl f{i:05}\n.type f{i:05},@function\nf{i:05}:\n\
                 mov %rdi, %rax\nadd ${i}, %rax\nret\n.size f{i:05}, .-f{i:05}\n"
            ));
        }
        s.push_str(".section .data.rel.ro,\"aw\"\n.p2align 3\n.globl table\ntable:\n");
        for i in 0..FUNCTIONS {
            s.push_str(&format!(".quad f{i:05}\n"));
        }
        s.push_str(".section .note.GNU-stack,\"\",@progbits\n");
        std::fs::write(&asm, s).unwrap();
        let mut c = String::from(
            "#define _GNU_SOURCE\n#include <pthread.h>\n#include <stdio.h>\n#include <stdlib.h>\n\
             #include <string.h>\n#include <unistd.h>\n#include <sys/syscall.h>\n\
             typedef long (*fn_t)(long);\nextern fn_t table[];\n",
        );
        c.push_str(&format!(
            "#define N {FUNCTIONS}\n\
             static long span, stride;\n\
             static pthread_mutex_t out = PTHREAD_MUTEX_INITIALIZER;\n\
             static void *run(void *a) {{\n\
               long t = (long)a, x = t;\n\
               for (long r = 0; r < t % 3 + 1; r++)\n\
                 for (long k = 0; k < span; k++) x = table[(t * stride + k) % N](x);\n\
               pthread_mutex_lock(&out);\n\
               printf(\"thread %ld tid=%ld\\n\", t, (long)syscall(SYS_gettid));\n\
               pthread_mutex_unlock(&out);\n\
               return (void *)x; }}\n\
             static long region_rss_kb(void) {{\n\
               FILE *f = fopen(\"/proc/self/smaps\", \"r\"); char line[512]; int in = 0; long kb = -1;\n\
               if (!f) return -1;\n\
               while (fgets(line, sizeof line, f)) {{\n\
                 if (strchr(line, '-') && strchr(line, ':') && line[0] != ' ' &&\n\
                     (line[0] >= '0' && line[0] <= '9' || line[0] >= 'a' && line[0] <= 'f'))\n\
                   in = strstr(line, \"weft-shm\") != 0;\n\
                 else if (in && !strncmp(line, \"Rss:\", 4)) {{ kb = atol(line + 4); in = 0; }}\n\
               }}\n\
               fclose(f); return kb; }}\n\
             int main(int argc, char **argv) {{\n\
               if (argc < 4) return 2;\n\
               long threads = atol(argv[1]); span = atol(argv[2]); stride = atol(argv[3]);\n\
               pthread_t *ts = calloc(threads, sizeof *ts);\n\
               pthread_attr_t attr; pthread_attr_init(&attr); pthread_attr_setstacksize(&attr, 256 << 10);\n\
               for (long t = 0; t < threads; t++)\n\
                 if (pthread_create(&ts[t], &attr, run, (void *)t)) {{ perror(\"pthread_create\"); return 1; }}\n\
               for (long t = 0; t < threads; t++) pthread_join(ts[t], 0);\n\
               printf(\"region rss_kb=%ld\\n\", region_rss_kb());\n\
               printf(\"done\\n\"); return 0; }}\n"
        ));
        std::fs::write(&src, c).unwrap();
        let out = Command::new("gcc")
            .args(["-O1", "-pthread", "-o"])
            .arg(&exe)
            .arg(&src)
            .arg(&asm)
            .output()
            .expect("running gcc");
        assert!(
            out.status.success(),
            "building the capacity target: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        exe
    })
    .clone()
}

fn rounds(t: u64) -> u64 {
    t % 3 + 1
}

/// Runs the target under `weft run` with `pattern` and `metrics`; returns
/// the target's output, the report, and the per-thread TIDs.
fn run(
    ctx: &Ctx,
    test: &str,
    pattern: &str,
    metrics: &str,
    threads: u64,
    span: u64,
    stride: u64,
) -> Run {
    let exe = target();
    let report_path = scratch_dir(test).join("report.json");
    let (threads_s, span_s, stride_s) = (threads.to_string(), span.to_string(), stride.to_string());
    let mut weft = ctx.weft(&[
        "run",
        "-m",
        metrics,
        "--format",
        "json",
        "-o",
        report_path.to_str().unwrap(),
        "-f",
        pattern,
        "--",
        exe.to_str().unwrap(),
        &threads_s,
        &span_s,
        &stride_s,
    ]);
    weft.wait_code(0);
    let out = weft.stdout_text();
    let mut tids = BTreeMap::new();
    let mut rss_kb = None;
    for l in out.lines() {
        if let Some(rest) = l.strip_prefix("thread ") {
            let (t, tid) = rest.split_once(" tid=").expect("thread line");
            tids.insert(t.parse::<u64>().unwrap(), tid.parse::<i64>().unwrap());
        } else if let Some(kb) = l.strip_prefix("region rss_kb=") {
            rss_kb = kb.parse::<i64>().ok();
        }
    }
    ctx.check(tids.len() as u64 == threads, || {
        format!("{} thread lines, wanted {threads}", tids.len())
    });
    let text = std::fs::read_to_string(&report_path).expect("the report file");
    Run {
        report: parse_report(ctx, &text),
        tids,
        rss_kb: rss_kb.unwrap_or_else(|| ctx.fail("no region rss line")),
        stderr: weft.stderr_text(),
    }
}

struct Run {
    report: Report,
    tids: BTreeMap<u64, i64>,
    rss_kb: i64,
    stderr: String,
}

/// Every thread's calls of every function it called are `rounds(t)`, and
/// the totals add up.
fn check_exact(ctx: &Ctx, run: &Run, functions: u64, span: u64, stride: u64, timed: bool) {
    let mut total: BTreeMap<String, u64> = BTreeMap::new();
    for (&t, &tid) in &run.tids {
        let thread = run
            .report
            .thread(tid)
            .unwrap_or_else(|| ctx.fail(format!("thread {t} (tid {tid}) not in the report")));
        let mut expect = BTreeMap::new();
        for k in 0..span {
            let j = (t * stride + k) % FUNCTIONS as u64;
            if j < functions {
                *expect.entry(format!("f{j:05}")).or_insert(0) += rounds(t);
            }
        }
        let mut thread_wall = 0;
        ctx.check(thread.functions.len() == expect.len(), || {
            format!(
                "thread {t}: {} functions in the report, {} called",
                thread.functions.len(),
                expect.len()
            )
        });
        for (name, &calls) in &expect {
            let got = thread.functions.get(name).cloned().unwrap_or_default();
            ctx.check(got.calls == calls, || {
                format!("thread {t}: {name} counted {}, called {calls}", got.calls)
            });
            if timed {
                ctx.check(got.exits == Some(calls), || {
                    format!("thread {t}: {name} exits {:?}, called {calls}", got.exits)
                });
                // A 3-instruction leaf may take less than a nanosecond.
                ctx.check(got.wall_ns.is_some(), || {
                    format!("thread {t}: {name} has no wall time")
                });
                thread_wall += got.wall_ns.unwrap_or(0);
            }
            *total.entry(name.clone()).or_insert(0) += calls;
        }
        ctx.check(!timed || thread_wall > 0, || {
            format!("thread {t}: no wall time in any function")
        });
    }
    ctx.check(run.report.functions.len() as u64 == functions, || {
        format!(
            "{} functions in the report, {functions} instrumented",
            run.report.functions.len()
        )
    });
    for f in &run.report.functions {
        let want = total.get(&f.name).copied().unwrap_or(0);
        ctx.check(f.calls == want, || {
            format!("{}: total {} != {want}", f.name, f.calls)
        });
    }
}

/// The region's resident memory is what docs/performance.md says: per
/// thread row, its header plus the words handed out (rounded to pages),
/// plus the directory's entries, plus the header and ack pages — and at
/// least the words the threads wrote (so the figure is the region's).
fn check_memory(ctx: &Ctx, run: &Run, rows: u64, words_per_thread: u64, probes: u64) {
    let page = 4096u64;
    let row = (ROW_HEADER + words_per_thread).div_ceil(page) * page;
    let directory = (probes * weft_rt::layout::PROBE_ENTRY_SIZE as u64).div_ceil(page) * page;
    // Header page, a page of acks per session slot in use, the scratch
    // and overflow rows' first pages, a page of slack per row for
    // alignment (rows are not page aligned).
    let fixed = 8 * page;
    let most = rows * (row + page) + directory + fixed;
    let least = rows * words_per_thread;
    let rss = run.rss_kb as u64 * 1024;
    eprintln!(
        "region resident {} KiB for {rows} rows of {words_per_thread} B of words and {probes} \
         probes; documented bound {} KiB",
        rss / 1024,
        most / 1024
    );
    ctx.check(run.rss_kb >= 0, || {
        "the target could not read its smaps".into()
    });
    ctx.check(rss <= most, || {
        format!("region resident {rss} B is more than the documented {most} B")
    });
    ctx.check(rss >= least, || {
        format!("region resident {rss} B is less than the words written ({least} B)")
    });
}

/// 10,000 timed functions (every one called by 8 threads): exact counts and
/// exits per thread, and the memory a thread's row is documented to cost.
#[test]
fn ten_thousand_timed_functions() {
    let ctx = Ctx::new("ten_thousand_timed_functions");
    let threads = 8;
    // f00000…f09999: 10,000 of the target's functions.
    let run = run(
        &ctx,
        "ten_thousand_timed_functions",
        "exe:f0????",
        "calls,wall",
        threads,
        10_000,
        0,
    );
    ctx.check(!run.stderr.contains("error"), || {
        format!("weft printed an error: {}", run.stderr)
    });
    check_exact(&ctx, &run, 10_000, 10_000, 0, true);
    // Rows of threads that exited are taken over by later threads (their
    // pages given back first): the rows in use are what costs memory.
    let rows = run.report.runtime.as_ref().map_or(threads, |r| r.rows_used);
    ctx.check((1..=threads).contains(&rows), || {
        format!("{rows} rows used")
    });
    check_memory(&ctx, &run, rows, 10_000 * TIMED_BYTES, 10_000);
}

/// 100,000 counted functions on 1,000 threads, each thread calling its own
/// 100 of them: exact per thread; a thread's row costs the pages it wrote,
/// not the 800 KB the words handed out span.
#[test]
fn hundred_thousand_counted_functions_on_a_thousand_threads() {
    let ctx = Ctx::new("hundred_thousand_counted_functions_on_a_thousand_threads");
    let threads = 1000;
    let run = run(
        &ctx,
        "hundred_thousand_counted_functions_on_a_thousand_threads",
        "exe:f?????",
        "calls",
        threads,
        100,
        100,
    );
    check_exact(&ctx, &run, FUNCTIONS as u64, 100, 100, false);
    // Each thread writes 100 words, two pages at most (its row header's
    // page and the words' page), wherever they lie in its row.
    let page = 4096;
    let rss = run.rss_kb as u64 * 1024;
    let directory =
        (FUNCTIONS as u64 * weft_rt::layout::PROBE_ENTRY_SIZE as u64).div_ceil(page) * page;
    let most = threads * 3 * page + directory + 8 * page;
    eprintln!(
        "region resident {} KiB; bound {} KiB",
        rss / 1024,
        most / 1024
    );
    ctx.check(rss <= most, || {
        format!("region resident {rss} B is more than {most} B: rows are not sparse")
    });
}

/// Past a limit, the error names the table, its limit, what the request
/// asked and what to do; and the target runs on as if weft had not come.
#[test]
fn past_the_limit_the_error_says_which_and_what_to_do() {
    let ctx = Ctx::new("past_the_limit_the_error_says_which_and_what_to_do");
    let exe = target();
    // 100,000 timed functions: more than the runtime's call records.
    let mut weft = ctx.weft(&[
        "run",
        "-m",
        "wall",
        "-f",
        "exe:f?????",
        "--",
        exe.to_str().unwrap(),
        "2",
        "10",
        "0",
    ]);
    let (first, _) = expect_weft_error(&mut weft);
    let records = weft_rt::layout::CALL_RECORDS.to_string();
    for want in ["call records", &records, "100000", "-m calls"] {
        ctx.check(first.contains(want), || {
            format!("the error {first:?} does not say {want:?}")
        });
    }
}

/// 10,000 timed functions on 1,000 threads, each thread calling its own
/// 10: exact per thread, exits and times included.
#[test]
fn ten_thousand_timed_functions_on_a_thousand_threads() {
    let test = "ten_thousand_timed_functions_on_a_thousand_threads";
    let ctx = Ctx::new(test);
    let run = run(&ctx, test, "exe:f0????", "calls,wall", 1000, 10, 10);
    check_exact(&ctx, &run, 10_000, 10, 10, true);
}
