//! Inspecting a running process through the library API (issue #6): a
//! function's instructions, blocks, call sites with their resolved targets
//! and exit points, source lines from DWARF, demangled names.

use crate::support;

use support::*;
use weft::code::{demangle, function_code, source_line};
use weft::{Pattern, Process};
use weft_codegen::cfg::{CallTarget, ExitKind};

#[test]
fn a_functions_code_calls_exits_and_source_lines() {
    let ctx = Ctx::new("a_functions_code_calls_exits_and_source_lines");
    let mut t = ctx.target(gdbwait(), &[]);
    let (pid, _) = wait_ready(&mut t);
    let mut p = Process::open(pid as i32).unwrap_or_else(|e| ctx.fail(format!("open: {e}")));
    let found = p
        .find_functions(&[
            Pattern::parse("outer").unwrap(),
            Pattern::parse("inner").unwrap(),
        ])
        .unwrap_or_else(|e| ctx.fail(format!("find: {e}")));
    let outer = found.iter().find(|f| f.name == "outer").unwrap().clone();
    let inner = found.iter().find(|f| f.name == "inner").unwrap().clone();
    let code = function_code(p.image(), &outer)
        .unwrap_or_else(|e| ctx.fail(format!("function_code: {e}")));
    ctx.check(
        code.address == outer.address && !code.blocks.is_empty(),
        || format!("outer decoded at {:#x}: {code:#x?}", code.address),
    );
    // outer calls inner directly, and returns.
    ctx.check(
        code.calls
            .iter()
            .any(|c| c.target == CallTarget::Direct(inner.address)),
        || {
            format!(
                "outer's calls {:#x?} do not reach inner at {:#x}",
                code.calls, inner.address
            )
        },
    );
    ctx.check(
        code.exits.iter().any(|e| e.kind == ExitKind::Return),
        || format!("outer has no ret: {:#x?}", code.exits),
    );
    // The instructions tile the symbol.
    let len: usize = code.instructions.iter().map(|i| i.len).sum();
    ctx.check(len as u64 == outer.size, || {
        format!("{len} bytes decoded of outer's {}", outer.size)
    });
    // Source lines (the target is built with -g).
    let call = code
        .calls
        .iter()
        .find(|c| c.target == CallTarget::Direct(inner.address))
        .unwrap();
    let loc = source_line(p.image(), call.address)
        .unwrap_or_else(|e| ctx.fail(format!("lines: {e}")))
        .unwrap_or_else(|| ctx.fail("no line for the call in a -g build"));
    // `int r = inner(x + 1);` is line 34 of gdbwait.c.
    ctx.check(loc.file.ends_with("gdbwait.c") && loc.line == 34, || {
        format!("the call to inner is at {loc:?}, not gdbwait.c:34")
    });
    t.send("go");
    t.expect_stdout("`inside`", |l| l == "inside");
    t.send("end");
    t.expect_stdout("`done`", |l| l.starts_with("done"));
    t.wait_code(0);
}

/// The C++ target's own symbols, as a tool lists them.
#[test]
fn cpp_names_demangle() {
    let ctx = Ctx::new("cpp_names_demangle");
    let elf = weft::inspect::ElfImage::open(exceptions())
        .unwrap_or_else(|e| ctx.fail(format!("open: {e}")));
    let names: Vec<String> = elf
        .functions()
        .unwrap_or_else(|e| ctx.fail(format!("symbols: {e}")))
        .iter()
        .map(|f| demangle(&f.name).into_owned())
        .collect();
    // tests/targets/exceptions.cpp: `outer` and `worker` are C++ functions
    // (`thrower` and `middle` are extern "C").
    for want in [
        "outer(int, long*)",
        "worker(void*)",
        "std::__cxx11::to_string(int)",
    ] {
        ctx.check(names.iter().any(|n| n == want), || {
            format!("no `{want}` among the demangled names {names:?}")
        });
    }
}

/// Memory and registers of a held process: the target's constant changed
/// through `write_memory` changes what it computes; a blocked thread's
/// registers show the system call it waits in, and setting them back
/// unchanged leaves it working.
#[test]
fn memory_and_registers_of_a_held_process() {
    let ctx = Ctx::new("memory_and_registers_of_a_held_process");
    let mut t = ctx.target(probed(), &[]);
    let (pid, _) = wait_ready(&mut t);
    let mut p = Process::open(pid as i32).unwrap_or_else(|e| ctx.fail(format!("open: {e}")));
    let exe = p
        .image()
        .executable()
        .unwrap_or_else(|| ctx.fail("no executable module"));
    let factor = exe
        .image()
        .ok()
        .and_then(|elf| elf.symbol_vaddr("factor").ok().flatten())
        .map(|v| exe.runtime_address(v))
        .unwrap_or_else(|| ctx.fail("no symbol `factor`"));
    let bytes = p
        .read_memory(factor, 8)
        .unwrap_or_else(|e| ctx.fail(format!("read: {e}")));
    ctx.check(bytes == 2.0f64.to_le_bytes(), || {
        format!("factor reads {bytes:?}")
    });
    // The ready line can reach us before the target's write(2) returns:
    // wait until the kernel reports it blocked in read(2).
    wait_blocked_in_read(&ctx, pid as i32);
    let mut held = p.hold().unwrap_or_else(|e| ctx.fail(format!("hold: {e}")));
    let tid = held.threads()[0];
    let regs = held
        .registers(tid)
        .unwrap_or_else(|e| ctx.fail(format!("registers: {e}")));
    // Blocked in read(0, ...) for the next command.
    ctx.check(
        regs.orig_rax == libc::SYS_read as u64 && regs.rdi == 0,
        || {
            format!(
                "the thread waits in syscall {} with rdi {}",
                regs.orig_rax, regs.rdi
            )
        },
    );
    held.set_registers(tid, &regs)
        .unwrap_or_else(|e| ctx.fail(format!("set_registers: {e}")));
    held.write_memory(factor, &3.0f64.to_le_bytes())
        .unwrap_or_else(|e| ctx.fail(format!("write: {e}")));
    held.release()
        .unwrap_or_else(|e| ctx.fail(format!("release: {e}")));
    t.send("run 1");
    t.expect_stdout("the call with factor 3", |l| {
        l == "call 1 add3=6 scale=4.50 pick=odd"
    });
    t.expect_stdout("the end of the round", |l| l == "round 1 done");
    // write_memory on a process weft does not hold does not compile
    // (`Process` has none: the compile_fail examples of `weft::Held`).
    t.send("quit");
    t.wait_code(0);
}

/// Waits until the target's only thread is blocked in `read(2)`, as
/// `/proc/PID/syscall` shows it (its first field is the system call).
fn wait_blocked_in_read(ctx: &Ctx, pid: i32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let now = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
        if now.split_whitespace().next() == Some(&libc::SYS_read.to_string()) {
            return;
        }
        if std::time::Instant::now() > deadline {
            ctx.fail(format!("the target never blocked in read(2): {now:?}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A process still in its dynamic loader (stopped at its `exec`, before
/// the loader maps libc): finding `malloc` fails saying the process is
/// probably still starting, not only that nothing matches.
#[test]
fn a_process_still_starting_is_said_to_be() {
    use std::os::unix::process::CommandExt;
    let ctx = Ctx::new("a_process_still_starting_is_said_to_be");
    let mut cmd = std::process::Command::new(gdbwait());
    // SAFETY: only async-signal-safe calls between fork and exec: the child
    // asks to be traced by the test, so the kernel stops it at its exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let t = ctx.spawn("gdbwait at its exec", cmd, false);
    // The exec stop: the loader is mapped, libc not yet.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let stat = format!("/proc/{}/stat", t.pid);
    while !std::fs::read_to_string(&stat).is_ok_and(|s| s.contains(") t ")) {
        ctx.check(std::time::Instant::now() < deadline, || {
            "the child never stopped at its exec".into()
        });
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let mut p = Process::open(t.pid as i32).unwrap_or_else(|e| ctx.fail(format!("open: {e}")));
    ctx.check(p.image().still_loading(), || "still_loading at exec".into());
    let err = p
        .find_functions(&[Pattern::parse("malloc").unwrap()])
        .unwrap_err()
        .to_string();
    ctx.check(
        err.contains("no function matches `malloc`") && err.contains("still starting"),
        || format!("the error: {err}"),
    );
}
