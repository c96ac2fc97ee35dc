//! Programs nobody here wrote, instrumented on two dozen libc functions
//! with `weft run`: their output is byte-identical to an uninstrumented
//! run, they exit the same way, and weft's report counts their calls.

mod support;

use std::path::PathBuf;
use std::process::Command;
use support::*;

fn scratch() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("weft-real-programs");
    std::fs::create_dir_all(&dir).expect("creating the scratch directory");
    dir
}

const LIBC: &str = "malloc,free,calloc,realloc,strlen,strcmp,memset,read,write,open,close,fstat,\
pthread_mutex_lock,pthread_mutex_unlock,strchr,qsort,fwrite,fread,getc,putc,strcoll,memcmp,\
pthread_create,pthread_join";

/// Runs `program args` plain and under `weft run -f LIBC`, compares, and
/// returns weft's JSON report.
fn compare(ctx: &Ctx, program: &str, args: &[&str], extra: &str) -> serde_json::Value {
    let plain = Command::new(program)
        .args(args)
        .output()
        .expect("running the program");
    let report = scratch().join(format!("{}.json", program.replace('/', "_")));
    let functions = format!("{LIBC}{extra}");
    let mut weft_args = vec![
        "run",
        "--format",
        "json",
        "-o",
        report.to_str().unwrap(),
        "-f",
        &functions,
        "--",
        program,
    ];
    weft_args.extend_from_slice(args);
    let under = Command::new(weft_bin())
        .args(&weft_args)
        .output()
        .expect("running weft");
    ctx.check(under.status.code() == plain.status.code(), || {
        format!(
            "{program}: exit {:?} under weft, {:?} plain; weft said {}",
            under.status.code(),
            plain.status.code(),
            String::from_utf8_lossy(&under.stderr)
        )
    });
    ctx.check(under.stdout == plain.stdout, || {
        format!(
            "{program}: output differs under weft ({} vs {} bytes)",
            under.stdout.len(),
            plain.stdout.len()
        )
    });
    ctx.check(under.stderr == plain.stderr, || {
        format!(
            "{program}: stderr differs: {}",
            String::from_utf8_lossy(&under.stderr)
        )
    });
    let text = std::fs::read_to_string(&report).unwrap_or_default();
    let json: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| ctx.fail(format!("bad report {text:?}: {e}")));
    let total: u64 = json["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["calls"].as_u64().unwrap())
        .sum();
    ctx.check(total > 0, || {
        format!("{program}: weft counted no call at all: {text}")
    });
    json
}

#[test]
fn sort_gzip_and_threaded_python_are_unchanged() {
    let ctx = Ctx::new("sort_gzip_and_threaded_python_are_unchanged");
    // A large input, deterministic.
    let input = scratch().join("input.txt");
    let mut x = 12345u64;
    let lines: String = (0..200_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            format!("{}\n", x % 1_000_003)
        })
        .collect();
    std::fs::write(&input, lines).unwrap();
    let input = input.to_str().unwrap();

    let sorted = compare(&ctx, "sort", &[input], "");
    ctx.check(
        sorted["threads"].as_array().is_some_and(|t| !t.is_empty()),
        || "sort: no thread in the report".into(),
    );
    compare(&ctx, "gzip", &["-c", "-6", input], "");

    // The real interpreter (a `python3` on PATH may be a wrapper script).
    let exe = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3");
    let python = String::from_utf8_lossy(&exe.stdout).trim().to_string();
    let script = "import threading, hashlib\n\
out = []\n\
def work(i):\n    h = hashlib.sha256()\n    for k in range(20000): h.update(str(k * i).encode())\n    out.append(h.hexdigest())\n\
ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]\n\
[t.start() for t in ts]; [t.join() for t in ts]\nprint(sorted(out))\n";
    let report = compare(&ctx, &python, &["-c", script], ",PyObject_Malloc");
    let threads = report["threads"].as_array().map_or(0, |t| t.len());
    ctx.check(threads >= 5, || {
        format!("python: {threads} threads in the report, expected the main thread and 4 workers")
    });
}
