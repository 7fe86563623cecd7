// SPDX-License-Identifier: Apache-2.0
//! Live stream, commit and active commit through the safe API: progress,
//! cancel, guest writes from another thread meanwhile, and QEMU's view
//! afterwards.
mod support;

use qcow2::{errno, LiveControl, LiveOptions, OpenOptions};
use std::sync::atomic::{AtomicU64, Ordering};
use support::{qemu_img, qemu_io, qemu_read_all, TempDir};

/// base <- mid <- top, each with data of its own.
fn make_chain(dir: &TempDir) {
    let p = |n: &str| dir.path(n).to_str().unwrap().to_string();
    qemu_img(&["create", "-q", "-f", "qcow2", &p("base.qcow2"), "8M"]);
    qemu_io(&dir.path("base.qcow2"), "write -P 1 0 3M\n");
    qemu_img(&["create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", &p("mid.qcow2")]);
    qemu_io(&dir.path("mid.qcow2"), "write -P 2 2M 3M\n");
    qemu_img(&["create", "-q", "-f", "qcow2", "-b", "mid.qcow2", "-F", "qcow2", &p("top.qcow2")]);
    qemu_io(&dir.path("top.qcow2"), "write -P 3 4M 1M\n");
}

#[test]
fn cancelled_stream_keeps_the_chain() {
    let dir = TempDir::new("live-cancel");
    make_chain(&dir);
    let image = OpenOptions::new().read_write(true).open(dir.path("top.qcow2")).unwrap();
    let control = LiveControl::new();
    let mut cancel = |_: u64, _: u64| control.cancel();
    let opts = LiveOptions::new().chunk(256 << 10).control(&control).progress(&mut cancel);
    let e = image.live_stream(3, opts).unwrap_err();
    assert_eq!(e.errno(), errno::ECANCELED, "{}", e);
    assert_eq!(image.chain_length(), 3);
    image.close().unwrap();
    qemu_img(&["check", dir.path("top.qcow2").to_str().unwrap()]);
}

#[test]
fn stream_with_guest_writes_and_commit() {
    let dir = TempDir::new("live-stream");
    make_chain(&dir);
    let top = dir.path("top.qcow2");
    let mut model = qemu_read_all(&top, &dir.path("before.raw"));
    let image = OpenOptions::new().read_write(true).open(&top).unwrap();

    // Commit mid into base (the top keeps its data), then stream the rest.
    image.live_commit(2, LiveOptions::new()).unwrap();
    assert_eq!(image.chain_length(), 2);

    let calls = AtomicU64::new(0);
    let last = AtomicU64::new(0);
    let mut progress = |done: u64, total: u64| {
        assert!(done <= total);
        calls.fetch_add(1, Ordering::Relaxed);
        last.store(done, Ordering::Relaxed);
    };
    std::thread::scope(|s| {
        let job = s.spawn(|| {
            let opts = LiveOptions::new().chunk(128 << 10).depth(2).progress(&mut progress);
            image.live_stream(image.chain_length(), opts)
        });
        // The guest keeps writing from this thread meanwhile.
        for i in 0..16u64 {
            image.write_at(&[0xc0 + i as u8; 4096], i * 500_000).unwrap();
        }
        job.join().unwrap().unwrap();
    });
    for i in 0..16u64 {
        let at = (i * 500_000) as usize;
        model[at..at + 4096].fill(0xc0 + i as u8);
    }
    assert_eq!(image.chain_length(), 1);
    assert!(calls.load(Ordering::Relaxed) > 0);
    assert_eq!(last.load(Ordering::Relaxed), image.size());
    image.close().unwrap();

    qemu_img(&["check", top.to_str().unwrap()]);
    let info = qemu_img(&["info", top.to_str().unwrap()]);
    assert!(!info.contains("backing file"), "{}", info);
    assert!(qemu_read_all(&top, &dir.path("after.raw")) == model);
}

#[test]
fn active_commit_with_guest_writes_pivots_to_the_base() {
    let dir = TempDir::new("live-active");
    make_chain(&dir);
    let top = dir.path("top.qcow2");
    let base = dir.path("base.qcow2");
    let mut model = qemu_read_all(&top, &dir.path("before.raw"));
    let image = OpenOptions::new().read_write(true).open(&top).unwrap();

    let last = AtomicU64::new(0);
    let total = AtomicU64::new(0);
    let mut progress = |done: u64, all: u64| {
        assert!(done <= all);
        last.store(done, Ordering::Relaxed);
        total.store(all, Ordering::Relaxed);
    };
    std::thread::scope(|s| {
        let job = s.spawn(|| {
            let opts = LiveOptions::new().chunk(128 << 10).depth(2).progress(&mut progress);
            image.live_commit_active(2, opts)
        });
        // The guest keeps writing from this thread meanwhile.
        for i in 0..16u64 {
            image.write_at(&[0xa0 + i as u8; 4096], i * 500_000 + 7 * 512).unwrap();
        }
        job.join().unwrap().unwrap();
    });
    for i in 0..16u64 {
        let at = (i * 500_000 + 7 * 512) as usize;
        model[at..at + 4096].fill(0xa0 + i as u8);
    }
    // The base is the top now, with no backing file; writes land in it.
    assert_eq!(image.chain_length(), 1);
    assert!(total.load(Ordering::Relaxed) >= image.size());
    assert_eq!(last.load(Ordering::Relaxed), total.load(Ordering::Relaxed));
    image.write_at(&[0x5a; 8192], 6 << 20).unwrap();
    model[6 << 20..(6 << 20) + 8192].fill(0x5a);
    image.close().unwrap();

    qemu_img(&["check", base.to_str().unwrap()]);
    qemu_img(&["check", top.to_str().unwrap()]);
    std::fs::write(dir.path("want.raw"), &model).unwrap();
    qemu_img(&["compare", "-f", "qcow2", "-F", "raw", base.to_str().unwrap(),
               dir.path("want.raw").to_str().unwrap()]);
}

#[test]
fn active_commit_refuses_a_base_outside_the_chain() {
    let dir = TempDir::new("live-active-bad");
    make_chain(&dir);
    let image = OpenOptions::new().read_write(true).open(dir.path("top.qcow2")).unwrap();
    let e = image.live_commit_active(3, LiveOptions::new()).unwrap_err();
    assert_eq!(e.errno(), errno::EINVAL, "{}", e);
    assert_eq!(image.chain_length(), 3);
    image.close().unwrap();
}
