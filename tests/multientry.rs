//! Code shared between entry points: glibc's `__mempcpy_*` jumps three
//! bytes into `__memmove_*` (which memcpy resolves to), right inside the
//! bytes memcpy's patch overwrites. weft sends that jump around the patch
//! through a companion: a mempcpy call is never counted as a memcpy call,
//! and neither function breaks.

mod support;

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
