// SPDX-License-Identifier: Apache-2.0
//! Finds libqcow2 to link against, in this order:
//!
//! 1. `QCOW2_DIR`: an install prefix (`$QCOW2_DIR/lib`, `lib64` or
//!    `lib/<multiarch>` holds `libqcow2.so`) or a CMake build tree (the
//!    directory itself holds it), so that tests run against `./build`
//!    without installing;
//! 2. the `pkg-config` program (or the one `$PKG_CONFIG` names) and the
//!    installed `qcow2.pc`.
//!
//! It links the shared library (`libqcow2.so.0`), which brings its C++
//! runtime and private dependencies along. The directory it found is
//! passed on to dependent build scripts as `DEP_QCOW2_LIB_DIR`.
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    for var in ["QCOW2_DIR", "PKG_CONFIG", "PKG_CONFIG_PATH", "PKG_CONFIG_LIBDIR"] {
        println!("cargo:rerun-if-env-changed={}", var);
    }
    let lib_dir = match env::var_os("QCOW2_DIR") {
        Some(dir) if !dir.is_empty() => from_dir(Path::new(&dir)),
        _ => from_pkg_config(),
    };
    if let Some(dir) = lib_dir {
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:lib_dir={}", dir.display());
    }
    println!("cargo:rustc-link-lib=dylib=qcow2");
}

/// The directory under `dir` that holds libqcow2.so; panics naming every
/// place looked at when none does.
fn from_dir(dir: &Path) -> Option<PathBuf> {
    let mut candidates = vec![dir.to_path_buf(), dir.join("lib"), dir.join("lib64")];
    if let Some(triple) = multiarch() {
        candidates.push(dir.join("lib").join(triple));
    }
    for c in &candidates {
        if c.join("libqcow2.so").exists() {
            println!("cargo:rerun-if-changed={}", c.join("libqcow2.so").display());
            return Some(c.clone());
        }
    }
    let looked: Vec<String> = candidates.iter().map(|c| c.display().to_string()).collect();
    panic!(
        "QCOW2_DIR={}: no libqcow2.so in {} (QCOW2_DIR names an install prefix or a CMake build tree)",
        dir.display(),
        looked.join(", ")
    );
}

/// Debian's multiarch directory name for the target, e.g.
/// x86_64-linux-gnu for x86_64-unknown-linux-gnu.
fn multiarch() -> Option<String> {
    let arch = env::var("CARGO_CFG_TARGET_ARCH").ok()?;
    let env_ = env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    let arch = match arch.as_str() {
        "x86" => "i386".to_string(),
        "arm" => "arm".to_string(),
        other => other.to_string(),
    };
    let abi = if env_.is_empty() { "gnu".to_string() } else { env_ };
    Some(format!("{}-linux-{}", arch, abi))
}

/// Link flags from `pkg-config --libs qcow2`: emits the -l names other
/// than qcow2 and returns the -L directory.
fn from_pkg_config() -> Option<PathBuf> {
    let program = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());
    let out = Command::new(&program).args(["--libs", "qcow2"]).output();
    let out = match out {
        Ok(out) if out.status.success() => out,
        Ok(out) => panic!(
            "`{} --libs qcow2` failed: {}\nInstall libqcow2 (its qcow2.pc on PKG_CONFIG_PATH), \
             or set QCOW2_DIR to its install prefix or CMake build tree.",
            program,
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => panic!(
            "cannot run `{}` ({}) to find libqcow2: install pkg-config, or set QCOW2_DIR \
             to libqcow2's install prefix or CMake build tree.",
            program, e
        ),
    };
    let flags = String::from_utf8_lossy(&out.stdout).to_string();
    let mut lib_dir = None;
    for flag in flags.split_whitespace() {
        if let Some(dir) = flag.strip_prefix("-L") {
            if lib_dir.is_none() {
                lib_dir = Some(PathBuf::from(dir));
            } else {
                println!("cargo:rustc-link-search=native={}", dir);
            }
        } else if let Some(name) = flag.strip_prefix("-l") {
            if name != "qcow2" {
                println!("cargo:rustc-link-lib={}", name);
            }
        }
    }
    lib_dir
}
