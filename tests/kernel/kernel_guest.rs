//! Kernel functions through fentry/fexit and kprobes, on a stock kernel:
//! Debian 12's 6.1 booted under QEMU (tests/qemu/guest.sh), since this
//! machine's own kernel has no kprobes and refuses BPF trampolines.
//!
//! One boot runs weft four ways on kernel_calls (threads opening and
//! reading from two user functions, timing every call themselves):
//! `do_sys_openat2` and `vfs_read` by fentry/fexit with an instruction
//! inside `do_sys_openat2` by kprobe, while another process makes the same
//! calls; then the same functions by kprobe/kretprobe, the CPU clock
//! reading each CPU's steal counter (`WEFT_KERNEL_STEAL=always`); then a
//! lone SCHED_FIFO worker by each mechanism, a thread nothing preempts,
//! whose CPU times must be within 5% of its own CPU clock. Per thread, the
//! counts equal the target's and split exactly between the user
//! functions; times agree with the target's clocks; the other process is
//! nowhere in the report.

use crate::support;

use serde_json::Value;
use std::collections::BTreeSet;
use std::time::Duration;
use support::kernel_calls::*;
use support::qemu::{guest_unavailable, run_in_guest};
use support::*;

/// The guest's shell script: markers around each output for the host to
/// cut apart.
const SCRIPT: &str = r#"
W=/opt/weft/weft; K=/opt/weft/kernel_calls; D=/opt/weft/cache.data
cd /tmp
# No SCHED_FIFO here: two real-time workers on the guest's two emulated
# CPUs starve the kernel workers a truncation can wait for.
# 8 MiB rewritten: truncating it makes rewrite_file's openat long (ms).
export KERNEL_CALLS_WRITE=8388608
# Each run between host marks: guest.sh notes how long the host kept the
# emulated CPUs waiting at each (the guest's clocks count that time too).
mark() { echo "@@host-mark $1@@"; sleep 1; }
$W doctor
echo ==DOCTOR-END==
# The first offset into do_sys_openat2 the kernel takes a kprobe at (it
# refuses one inside an instruction or inside the ftrace call).
ok=
for off in 4 5 8 9 12 13 16 17; do
  mark r1-start
  $K 2 6 $D > /tmp/other.out 2>&1 &
  other=$!
  if $W run -f open_config,read_cache,rewrite_file,wait_pipe -m wall \
       -f kernel:do_sys_openat2,kernel:vfs_read -f kernel:do_sys_openat2+$off \
       --format json -o /tmp/r1.json -- $K 2 6 $D > /tmp/r1.out 2> /tmp/r1.err; then
    ok=$off; wait $other; break
  fi
  wait $other
  echo "offset $off:"; cat /tmp/r1.err
done
mark r1-end
echo "==OFFSET $ok=="
echo ==R1-OUT==; cat /tmp/r1.out
echo ==R1-ERR==; cat /tmp/r1.err
echo ==R1-JSON==; cat /tmp/r1.json; echo
echo ==OTHER==; cat /tmp/other.out
mark r2-start
WEFT_KERNEL_MECHANISM=kprobe WEFT_KERNEL_STEAL=always $W run -f open_config,read_cache,rewrite_file,wait_pipe -m wall \
  -f kernel:do_sys_openat2,kernel:vfs_read --format json -o /tmp/r2.json \
  -- $K 2 6 $D > /tmp/r2.out 2> /tmp/r2.err
status=$?
mark r2-end
echo "==R2-STATUS $status=="
echo ==R2-OUT==; cat /tmp/r2.out
echo ==R2-ERR==; cat /tmp/r2.err
echo ==R2-JSON==; cat /tmp/r2.json; echo
echo ==R2-JSON-END==
# One worker alone on the two CPUs, SCHED_FIFO (one real-time thread
# leaves a CPU to the kernel's workers), by each mechanism: a thread
# nothing preempts, whose own CPU clock is the reference for CPU time.
# A real-time kernel thread can still preempt it (a CI run saw one
# involuntary switch; a loaded host, two): up to five runs, until one whose worker was not
# preempted (its `P TID 0` line); the host checks the last.
for mech in fentry kprobe; do
  for attempt in 1 2 3 4 5; do
    mark alone-$mech-start
    KERNEL_CALLS_FIFO=1 WEFT_KERNEL_MECHANISM=$mech $W run -f open_config,read_cache,rewrite_file,wait_pipe -m wall \
      -f kernel:do_sys_openat2,kernel:vfs_read --format json -o /tmp/alone.json \
      -- $K 1 6 $D > /tmp/alone.out 2> /tmp/alone.err
    status=$?
    [ $status -ne 0 ] && break
    grep -q '^P [0-9]* 0$' /tmp/alone.out && break
    echo "lone $mech run $attempt: the worker was preempted"
  done
  mark alone-$mech-end
  echo "==ALONE-$mech-STATUS $status=="
  echo "==ALONE-$mech-OUT=="; cat /tmp/alone.out
  echo "==ALONE-$mech-ERR=="; cat /tmp/alone.err
  echo "==ALONE-$mech-JSON=="; cat /tmp/alone.json; echo
  echo "==ALONE-$mech-END=="
done
# Killed outright while attached (fentry, then kprobes): nothing stays.
for mech in fentry kprobe; do
  rm -f /tmp/k.err
  sleep 600 & s=$!
  WEFT_KERNEL_MECHANISM=$mech $W attach -p $s -f kernel:vfs_read -f kernel:do_sys_openat2+$ok 2> /tmp/k.err &
  a=$!
  n=0
  while ! grep -q attached /tmp/k.err; do
    n=$((n + 1))
    if ! kill -0 $a 2>/dev/null || [ $n -gt 600 ]; then cat /tmp/k.err; break; fi
    sleep 0.1
  done
  echo "==LOADED-$mech $($W doctor | grep '^weft programs')=="
  kill -9 $a; wait $a 2>/dev/null
  sleep 1
  echo "==AFTER-KILL-$mech $($W doctor | grep '^weft programs')=="
  kill $s
done
echo ==END==
"#;

fn section<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let from = text
        .find(start)
        .map(|i| i + start.len())
        .unwrap_or_else(|| panic!("no {start} in the guest's output:\n{text}"));
    let to = text[from..].find(end).map_or(text.len(), |i| from + i);
    &text[from..to]
}

fn mechanism(report: &Value, name: &str) -> String {
    report["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == name)
        .map_or("(absent)".to_string(), |f| {
            f["mechanism"].as_str().unwrap_or("-").to_string()
        })
}

#[test]
fn kernel_functions_by_fentry_and_kprobe_on_a_stock_kernel() {
    // QEMU keeps a CPU busy, and the host's tests time calls.
    let _alone = one_at_a_time();
    let ctx = Ctx::new("kernel_functions_on_a_stock_kernel");
    if let Some(why) = guest_unavailable() {
        if std::env::var_os("CI").is_some() {
            panic!("CI is set, but the QEMU guest is unavailable: {why}");
        }
        eprintln!("skipped: the QEMU guest is unavailable: {why}");
        return;
    }
    let exe = kernel_calls();
    let data = data_file("kernel_guest");
    let weft = std::path::Path::new(weft_bin());
    let out = run_in_guest(
        &[
            (weft, "/opt/weft/weft"),
            (&exe, "/opt/weft/kernel_calls"),
            (&*data, "/opt/weft/cache.data"),
        ],
        &[],
        &["sh", "-c", SCRIPT],
        Duration::from_secs(600),
    );
    let text = &out.stdout;
    eprintln!("{text}");
    ctx.check(out.status == 0 && text.contains("==END=="), || {
        format!("the guest failed (status {}): {}", out.status, out.stderr)
    });
    let doctor = section(text, "", "==DOCTOR-END==");
    for name in [
        "fentry/fexit",
        "kprobes",
        "syscall tracepoints",
        "sched_switch",
    ] {
        ctx.check(
            doctor
                .lines()
                .any(|l| l.starts_with(name) && l.contains(" yes ")),
            || format!("the stock kernel should allow {name}: {doctor}"),
        );
    }
    let offset = section(text, "==OFFSET ", "==");
    ctx.check(!offset.is_empty(), || {
        format!("no offset into do_sys_openat2 took a kprobe: {text}")
    });
    let offset: u64 = offset.parse().unwrap();

    // fentry/fexit, and an instruction by kprobe.
    let r1: Value = serde_json::from_str(section(text, "==R1-JSON==", "==OTHER==").trim())
        .unwrap_or_else(|e| ctx.fail(format!("run 1's report: {e}")));
    let r1_out = section(text, "==R1-OUT==", "==R1-ERR==");
    let truth1 = truth(r1_out);
    let preempted1 = preempted(r1_out);
    ctx.check(truth1.len() == 2 * 10, || {
        format!("target output: {r1_out}")
    });
    let at = format!("kernel:do_sys_openat2+{offset:#x}");
    for (name, want) in [
        ("kernel:do_sys_openat2", "fentry/fexit"),
        ("kernel:vfs_read", "fentry/fexit"),
        (at.as_str(), "kprobe at offset"),
    ] {
        let got = mechanism(&r1, name);
        ctx.check(got == want, || {
            format!("{name}: mechanism {got}, expected {want}")
        });
    }
    let run1 = Observed {
        report: &r1,
        truth: &truth1,
        preempted: &preempted1,
        long_call_ns: LONG_CALL_NS_TCG,
        cpu_tolerance: 0.05,
        pipe_sleeps: false,
        steal: 0.0,
        host_delay_ns: out.host_delay_ns("r1-start", "r1-end"),
    };
    eprintln!(
        "run 1: the host delayed the guest {} ns",
        run1.host_delay_ns
    );
    // rewrite_file's openat truncates 8 MiB: long enough to compare times.
    let opens = check_against_truth(&ctx, &run1, "kernel:do_sys_openat2", "openat", true);
    ctx.check(opens.wall >= 2, || {
        format!(
            "only {} long do_sys_openat2 calls to compare times on",
            opens.wall
        )
    });
    let reads = check_against_truth(&ctx, &run1, "kernel:vfs_read", "read", true);
    check_against_truth(&ctx, &run1, &at, "openat", false);
    let (long, cpu) = (opens.wall + reads.wall, opens.cpu + reads.cpu);
    ctx.check(long >= 4, || format!("only {long} long calls compared"));
    eprintln!("fentry: {long} long calls compared, {cpu} by CPU time");
    // The other process's threads are not in the report.
    let others: BTreeSet<u64> = truth(section(text, "==OTHER==", "==R2-STATUS"))
        .keys()
        .map(|k| k.0)
        .collect();
    ctx.check(!others.is_empty(), || {
        "the other process printed nothing".into()
    });
    for t in r1["threads"].as_array().unwrap() {
        let tid = t["tid"].as_u64().unwrap();
        ctx.check(!others.contains(&tid), || {
            format!("thread {tid} of the other process is in the report")
        });
    }

    // kprobe/kretprobe.
    ctx.check(text.contains("==R2-STATUS 0=="), || {
        format!(
            "run 2 failed: {}",
            section(text, "==R2-ERR==", "==R2-JSON==")
        )
    });
    let r2: Value = serde_json::from_str(section(text, "==R2-JSON==", "==R2-JSON-END==").trim())
        .unwrap_or_else(|e| ctx.fail(format!("run 2's report: {e}")));
    let r2_out = section(text, "==R2-OUT==", "==R2-ERR==");
    let truth2 = truth(r2_out);
    let preempted2 = preempted(r2_out);
    let run2 = Observed {
        report: &r2,
        truth: &truth2,
        preempted: &preempted2,
        long_call_ns: LONG_CALL_NS_TCG,
        cpu_tolerance: 0.05,
        pipe_sleeps: false,
        steal: 0.0,
        host_delay_ns: out.host_delay_ns("r2-start", "r2-end"),
    };
    eprintln!(
        "run 2: the host delayed the guest {} ns",
        run2.host_delay_ns
    );
    // Run 2 reads each CPU's steal counter as a kernel that leaves stolen
    // time out of CPU time needs (this one does not, and under TCG nothing
    // is stolen): its programs load and their figures hold as run 1's.
    let r2_err = section(text, "==R2-ERR==", "==R2-JSON==");
    ctx.check(r2_err.contains("steal accounting yes"), || {
        format!("run 2 did not read the steal counter: {r2_err}")
    });
    for name in ["kernel:do_sys_openat2", "kernel:vfs_read"] {
        let got = mechanism(&r2, name);
        ctx.check(got == "kprobe/kretprobe", || {
            format!("{name}: mechanism {got} with WEFT_KERNEL_MECHANISM=kprobe")
        });
    }
    let opens = check_against_truth(&ctx, &run2, "kernel:do_sys_openat2", "openat", true);
    let reads = check_against_truth(&ctx, &run2, "kernel:vfs_read", "read", true);
    let (long, cpu) = (opens.wall + reads.wall, opens.cpu + reads.cpu);
    ctx.check(long >= 4, || {
        format!("kprobes: only {long} long calls compared")
    });
    eprintln!("kprobes: {long} long calls compared, {cpu} by CPU time");

    // A thread alone, by each mechanism: CPU times compared within 5%.
    for mech in ["fentry", "kprobe"] {
        let tag = |part: &str| format!("==ALONE-{mech}-{part}==");
        let tag_mark = |part: &str| format!("alone-{mech}-{part}");
        ctx.check(text.contains(&format!("==ALONE-{mech}-STATUS 0==")), || {
            format!(
                "the lone {mech} run failed: {}",
                section(text, &tag("ERR"), &tag("JSON"))
            )
        });
        let lone_out = section(text, &tag("OUT"), &tag("ERR"));
        let report: Value = serde_json::from_str(section(text, &tag("JSON"), &tag("END")).trim())
            .unwrap_or_else(|e| ctx.fail(format!("the lone {mech} run's report: {e}")));
        let (truth, preempted) = (truth(lone_out), preempted(lone_out));
        let run = Observed {
            report: &report,
            truth: &truth,
            preempted: &preempted,
            long_call_ns: LONG_CALL_NS_TCG,
            cpu_tolerance: 0.05,
            pipe_sleeps: false,
            steal: 0.0,
            host_delay_ns: out.host_delay_ns(&tag_mark("start"), &tag_mark("end")),
        };
        eprintln!(
            "{mech}, one thread: the host delayed the guest {} ns",
            run.host_delay_ns
        );
        let opens = check_against_truth(&ctx, &run, "kernel:do_sys_openat2", "openat", true);
        let reads = check_against_truth(&ctx, &run, "kernel:vfs_read", "read", true);
        let cpu = opens.cpu + reads.cpu;
        eprintln!(
            "{mech}, one thread: {cpu} long calls compared by CPU time; preempted {preempted:?}"
        );
        ctx.check(cpu >= 2, || {
            format!("{mech}: only {cpu} long calls of an unpreempted thread to compare CPU times on (preempted: {preempted:?})")
        });
    }

    // kill -9 of an attached weft leaves no program (nor link: a link
    // holds its program) behind, for either mechanism.
    for mech in ["fentry", "kprobe"] {
        let loaded = section(text, &format!("==LOADED-{mech} "), "==");
        let after = section(text, &format!("==AFTER-KILL-{mech} "), "==");
        let count = |line: &str| -> u64 {
            line.split_whitespace()
                .nth(2)
                .and_then(|n| n.parse().ok())
                .unwrap_or(u64::MAX)
        };
        ctx.check(count(loaded) >= 2 && count(loaded) != u64::MAX, || {
            format!("{mech}: weft's programs should show while it runs: {loaded:?}")
        });
        ctx.check(count(after) == 0, || {
            format!("{mech}: programs left after kill -9: {after:?}")
        });
    }
}
