//! Builds the `weft-rt` cdylib and embeds it in the `weft` library (and so
//! in the `weft` binary, `cli/`), so that a fresh clone's `cargo run
//! --release -- demo` (or an installed `weft`) never has to find a separate
//! `.so` file. Cargo cannot depend on a cdylib artifact on stable, hence a
//! nested `cargo build` with its own target directory (a shared one would
//! deadlock on cargo's build-directory lock).

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let rt_dir = manifest_dir.join("../rt");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target_dir = out_dir.join("rt-target");
    println!("cargo:rerun-if-changed={}", rt_dir.join("src").display());
    println!(
        "cargo:rerun-if-changed={}",
        rt_dir.join("Cargo.toml").display()
    );
    // The runtime compiles the shared layout in: a change there (a new
    // layout::VERSION) must re-embed it, or weft carries a runtime of the
    // old layout.
    println!(
        "cargo:rerun-if-changed={}",
        manifest_dir.join("../abi/src").display()
    );

    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // The runtime is always built optimised: it runs inside the target.
    let mut command = Command::new(cargo);
    command
        .args(["build", "--release", "--lib", "--quiet", "--manifest-path"])
        .arg(rt_dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        // Aborting is never right inside a target, but unwinding out of
        // the runtime's `extern "C"` entry points would be worse.
        .env("CARGO_PROFILE_RELEASE_PANIC", "abort")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
        .env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo");
    for var in [
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET_DIR",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_MAKEFLAGS",
        "MAKEFLAGS",
        "MFLAGS",
    ] {
        command.env_remove(var);
    }
    let status = command
        .status()
        .expect("failed to run cargo to build weft-rt");
    assert!(
        status.success(),
        "building weft-rt failed: see the errors above"
    );
    let built = target_dir.join("release/libweft_rt.so");
    let embedded = out_dir.join("libweft_rt.so");
    std::fs::copy(&built, &embedded).unwrap_or_else(|e| panic!("copying {}: {e}", built.display()));
    println!("cargo:rustc-env=WEFT_RT_EMBEDDED={}", embedded.display());
}
