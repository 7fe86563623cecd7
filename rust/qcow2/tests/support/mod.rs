// SPDX-License-Identifier: Apache-2.0
//! Helpers of the integration tests: scratch directories, qemu-img and
//! qemu-io runners, a deterministic random source.
#![allow(dead_code)]
pub mod epoll;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh directory, removed with what it holds on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let base = std::env::var_os("QCOW2_TEST_TMPDIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!(
            "qcow2-rs-{}-{}-{}",
            name,
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        TempDir(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new(program);
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {} ({}): install qemu-utils", program, e));
    if let Some(text) = stdin {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    }
    child.wait_with_output().unwrap()
}

/// Runs qemu-img; panics with its output unless it succeeds.
pub fn qemu_img(args: &[&str]) -> String {
    let out = run("qemu-img", args, None);
    assert!(
        out.status.success(),
        "qemu-img {:?} failed: {}{}",
        args,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs qemu-img; returns whether it succeeded, and its output.
pub fn qemu_img_status(args: &[&str]) -> (bool, String) {
    let out = run("qemu-img", args, None);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// Runs the qemu-io commands `script` (one a line, from stdin) on `image`;
/// panics unless they all succeed.
pub fn qemu_io(image: &Path, script: &str) {
    let path = image.to_str().unwrap();
    let out = run("qemu-io", &["-f", "qcow2", path], Some(script));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && !text.contains("ailed"), "qemu-io on {}: {}", path, text);
}

/// Runs qemu-io with `-c` commands; returns whether it succeeded, and
/// its output (qemu-io exits 0 when a command fails, so both are needed).
pub fn qemu_io_c(image: &Path, commands: &[&str]) -> (bool, String) {
    let mut args = vec!["-f", "qcow2"];
    for c in commands {
        args.push("-c");
        args.push(c);
    }
    args.push(image.to_str().unwrap());
    let out = run("qemu-io", &args, None);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success() && !text.contains("ailed"), text)
}

/// The whole disk of `image` as qemu-img reads it (converted to raw).
pub fn qemu_read_all(image: &Path, scratch: &Path) -> Vec<u8> {
    qemu_img(&["convert", "-O", "raw", image.to_str().unwrap(), scratch.to_str().unwrap()]);
    std::fs::read(scratch).unwrap()
}

/// xorshift64*: the same sequence on every run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(2685821657736338717)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
