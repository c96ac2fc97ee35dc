//! Real viewers for weft's timelines and flame graphs: speedscope's web
//! app (fetched from npm by tests/viewers/fetch.sh) and Chromium
//! (Debian's chromium-headless-shell), driven by tests/viewers/chromium.py.

use super::{weft_bin, Ctx};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `tests/viewers/chromium.py`, which drives headless Chromium.
pub fn chromium(ctx: &Ctx, args: &[&std::ffi::OsStr]) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/viewers/chromium.py");
    let out = Command::new("python3")
        .arg(&script)
        .args(args)
        .output()
        .unwrap_or_else(|e| ctx.fail(format!("cannot run {}: {e}", script.display())));
    ctx.check(out.status.success(), || {
        format!(
            "{} {args:?} failed (is Debian's chromium-headless-shell installed? scripts/test installs it): {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        ctx.fail(format!(
            "chromium.py's output: {e}: {}",
            String::from_utf8_lossy(&out.stdout)
        ))
    })
}

/// speedscope's web app (tests/viewers/fetch.sh fetches it from npm).
pub fn speedscope(ctx: &Ctx) -> PathBuf {
    let target = Path::new(weft_bin())
        .parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| ctx.fail("weft's binary has no target directory"));
    let index = target.join("viewers/speedscope-1.25.0/dist/release/index.html");
    if !index.exists() {
        let fetch = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/viewers/fetch.sh");
        let out = Command::new("bash")
            .arg(&fetch)
            .env("CARGO_TARGET_DIR", target)
            .output()
            .unwrap_or_else(|e| ctx.fail(format!("cannot run {}: {e}", fetch.display())));
        ctx.check(out.status.success() && index.exists(), || {
            format!(
                "{} could not fetch speedscope (it needs npm): {}",
                fetch.display(),
                String::from_utf8_lossy(&out.stderr)
            )
        });
    }
    index
}
