//! The QEMU guest harness (tests/qemu/guest.sh, tests/support/qemu.rs): one
//! boot of Debian 12's stock kernel checks that it has what the kernel-side
//! tests need (BTF, the kprobe PMU, kernel 6.1, kprobes that fire under TCG)
//! and that a program built on the host runs in it with its arguments,
//! environment, output and exit status passed intact.
//!
//! Without QEMU (or without network for the first download) the test says
//! why and passes, unless `CI` is set: CI must have the guest.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use support::qemu::{guest_unavailable, run_in_guest};

/// A dynamically linked C program: prints its arguments and an environment
/// variable, a line on stderr, and exits with 3.
const HELLO_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    printf("hello from the guest, argc=%d\n", argc);
    for (int i = 1; i < argc; i++)
        printf("arg %d: [%s]\n", i, argv[i]);
    const char *v = getenv("WEFT_GUEST_TEST");
    printf("env: [%s]\n", v ? v : "(unset)");
    fflush(stdout);
    fprintf(stderr, "to stderr\n");
    return 3;
}
"#;

/// Arguments that a careless quoting would split, expand or unquote.
const ARGS: [&str; 5] = [
    "two words",
    "it's \"quoted\"",
    "",
    "$HOME `id` *",
    "back\\slash\nnewline",
];

const ENV_VALUE: &str = "a value with spaces and 'quotes'";

#[test]
fn guest_runs_host_programs_on_debian_kernel() {
    // QEMU keeps a CPU busy, and the other tests here time calls.
    let _alone = support::one_at_a_time();
    if let Some(why) = guest_unavailable() {
        if std::env::var_os("CI").is_some() {
            panic!("CI is set, but the QEMU guest is unavailable: {why}");
        }
        eprintln!("skipped: the QEMU guest is unavailable: {why}");
        return;
    }

    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("qemu-guest-test");
    std::fs::create_dir_all(&dir).expect("create build dir");
    let src = dir.join("hello.c");
    let exe = dir.join("hello");
    std::fs::write(&src, HELLO_C).expect("write hello.c");
    let out = Command::new("gcc")
        .args(["-O1", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("run gcc");
    assert!(
        out.status.success(),
        "gcc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // One boot: a shell prints what the kernel has (and that a kprobe set
    // through tracefs fires under TCG), then runs the program with the
    // shell's own arguments ("$@"), whose status it exits with.
    let script = "\
        test -e /sys/kernel/btf/vmlinux && echo btf: yes; \
        echo kprobe pmu: $(cat /sys/bus/event_source/devices/kprobe/type); \
        echo release: $(uname -r); \
        t=/sys/kernel/tracing; e=$t/events/kprobes/weft_guest_test/enable; \
        echo p:weft_guest_test do_sys_openat2 >$t/kprobe_events && echo 1 >$e \
            && cat /proc/version >/dev/null && echo 0 >$e \
            && echo kprobe hits: $(grep -c weft_guest_test $t/trace) \
            || echo kprobe hits: none, the kprobe could not be set; \
        exec /opt/weft-test/hello \"$@\"";
    let mut command = vec!["sh", "-c", script, "sh"];
    command.extend(ARGS);
    let started = Instant::now();
    let got = run_in_guest(
        &[(&exe, "/opt/weft-test/hello")],
        &[("WEFT_GUEST_TEST", ENV_VALUE)],
        &command,
        Duration::from_secs(300),
    );
    eprintln!(
        "guest boot and run: {:.1} s\n--- stdout ---\n{}--- stderr ---\n{}",
        started.elapsed().as_secs_f64(),
        got.stdout,
        got.stderr
    );

    assert_eq!(got.status, 3, "exit status (guest.sh said: {})", got.stderr);
    let mut lines = got.stdout.lines();
    assert_eq!(lines.next(), Some("btf: yes"), "/sys/kernel/btf/vmlinux");
    let pmu = lines.next().unwrap_or_default();
    let pmu_type = pmu.strip_prefix("kprobe pmu: ").unwrap_or_default();
    assert!(
        pmu_type.parse::<u32>().is_ok(),
        "/sys/bus/event_source/devices/kprobe/type: {pmu:?}"
    );
    let release = lines.next().unwrap_or_default();
    assert!(
        release.starts_with("release: 6.1."),
        "uname -r: {release:?}"
    );
    let hits = lines.next().unwrap_or_default();
    assert!(
        hits.strip_prefix("kprobe hits: ")
            .and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|n| n > 0),
        "a kprobe on do_sys_openat2: {hits:?}"
    );
    let rest: Vec<&str> = lines.collect();
    let mut expected = vec![format!("hello from the guest, argc={}", ARGS.len() + 1)];
    for (i, arg) in ARGS.iter().enumerate() {
        expected.push(format!("arg {}: [{arg}]", i + 1));
    }
    expected.push(format!("env: [{ENV_VALUE}]"));
    expected.push("to stderr".to_string());
    let expected = expected.join("\n");
    assert_eq!(rest.join("\n"), expected, "the program's output");
}
