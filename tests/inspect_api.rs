//! Inspecting a running process through the library API (issue #6): a
//! function's instructions, blocks, call sites with their resolved targets
//! and exit points, source lines from DWARF, demangled names.

mod support;

use support::*;
use weft::code::{demangle, function_code, LineTable};
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
    let image = p.image();
    let module = image
        .module_of(outer.address)
        .unwrap_or_else(|| ctx.fail("no module for outer"));
    let table = LineTable::for_module(module)
        .unwrap_or_else(|e| ctx.fail(format!("lines: {e}")))
        .unwrap_or_else(|| ctx.fail("no line table in a -g build"));
    let call = code
        .calls
        .iter()
        .find(|c| c.target == CallTarget::Direct(inner.address))
        .unwrap();
    let loc = table
        .lookup(call.address - module.bias())
        .unwrap_or_else(|| ctx.fail("no line for the call"));
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
