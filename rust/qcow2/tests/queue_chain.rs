// SPDX-License-Identifier: Apache-2.0
//! A backing chain written through a Queue: 1,000 vectored requests
//! (writes, write-zeroes, reads checked against a model) over a base whose
//! data the overlay's clusters must copy on write, completions taken
//! through epoll on the queue's eventfd. Then QEMU judges: `qemu-img
//! check` clean, and `qemu-img compare` equal to the same writes done by
//! qemu-io on a copy of the chain.
mod support;

use qcow2::{CreateOptions, Format, OpenOptions, Queue};
use std::collections::HashMap;
use std::fmt::Write as _;
use support::epoll::Epoll;
use support::{qemu_img, qemu_io, qemu_read_all, Rng, TempDir};

const DISK: u64 = 16 << 20;
const SECTOR: u64 = 512;
const DEPTH: usize = 32;
const REQUESTS: u64 = 1000;

/// The base: data in some ranges (written by qemu-io), holes elsewhere.
fn make_chain(dir: &TempDir) {
    let base = dir.path("base.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", "-o", "cluster_size=65536", base.to_str().unwrap(), "16M"]);
    qemu_io(&base, "write -P 0x11 0 3M\nwrite -P 0x22 5M 1536k\nwrite -P 0x33 10000k 2M\n");
    CreateOptions::new()
        .backing("base.qcow2", Format::Qcow2)
        .cluster_size(65536)
        .create(dir.path("top.qcow2"))
        .unwrap();
}

/// One request of the run, as submitted.
enum Request {
    Write { offset: u64, lens: Vec<usize>, pattern: u8 },
    Zero { offset: u64, len: u64 },
    Read { offset: u64, lens: Vec<usize> },
}

fn random_request(rng: &mut Rng, i: u64) -> Request {
    let lens: Vec<usize> = (0..1 + rng.below(4)).map(|_| (SECTOR * (1 + rng.below(24))) as usize).collect();
    let total: u64 = lens.iter().map(|&l| l as u64).sum();
    let offset = rng.below((DISK - total) / SECTOR) * SECTOR;
    match rng.below(10) {
        0 => Request::Zero { offset, len: total },
        1..=3 => Request::Read { offset, lens },
        _ => Request::Write { offset, lens, pattern: (i % 250) as u8 + 1 },
    }
}

#[test]
fn thousand_vectored_requests_across_the_backing_boundary() {
    let ours = TempDir::new("chain-ours");
    let theirs = TempDir::new("chain-qemu");
    make_chain(&ours);
    for f in ["base.qcow2", "top.qcow2"] {
        std::fs::copy(ours.path(f), theirs.path(f)).unwrap();
    }
    let mut model = qemu_read_all(&ours.path("top.qcow2"), &ours.path("before.raw"));
    assert_eq!(model.len() as u64, DISK);

    let image = OpenOptions::new().read_write(true).open(ours.path("top.qcow2")).unwrap();
    assert_eq!(image.chain_length(), 2);
    let mut queue: Queue = image.queue(DEPTH as u32).unwrap();
    let epoll = Epoll::new().unwrap();
    epoll.add(std::os::unix::io::AsRawFd::as_raw_fd(&queue), 1).unwrap();

    let mut rng = Rng::new(0x5eed_0045);
    let mut script = String::new();
    let mut expected_reads: HashMap<u64, Vec<u8>> = HashMap::new();
    let (mut submitted, mut completed, mut reads_checked) = (0u64, 0u64, 0u64);
    let mut done = Vec::new();
    let mut tokens = Vec::new();
    while completed < REQUESTS {
        while submitted < REQUESTS && queue.in_flight() < DEPTH {
            let i = submitted;
            match random_request(&mut rng, i) {
                Request::Write { offset, lens, pattern } => {
                    let bufs: Vec<Vec<u8>> = lens.iter().map(|&l| vec![pattern; l]).collect();
                    let total: usize = lens.iter().sum();
                    model[offset as usize..offset as usize + total].fill(pattern);
                    let lens_text: Vec<String> = lens.iter().map(|l| l.to_string()).collect();
                    writeln!(script, "writev -P {} {} {}", pattern, offset, lens_text.join(" ")).unwrap();
                    queue.writev_owned(offset, bufs, i).unwrap();
                }
                Request::Zero { offset, len } => {
                    model[offset as usize..(offset + len) as usize].fill(0);
                    writeln!(script, "write -z {} {}", offset, len).unwrap();
                    queue.write_zeroes(offset, len, false, i).unwrap();
                }
                Request::Read { offset, lens } => {
                    let total: usize = lens.iter().sum();
                    expected_reads.insert(i, model[offset as usize..offset as usize + total].to_vec());
                    queue.readv_owned(offset, lens.iter().map(|&l| vec![0xee; l]).collect(), i).unwrap();
                }
            }
            submitted += 1;
        }
        // Block only in epoll_wait, as a VMM's loop does.
        epoll.wait(&mut tokens, 10_000).unwrap();
        queue.clear_event().unwrap();
        while queue.poll(&mut done, 16) > 0 {}
        for c in done.drain(..) {
            assert!(c.status().is_ok(), "request {}: {:?}", c.user_data, c.status());
            if let Some(want) = expected_reads.remove(&c.user_data) {
                let got: Vec<u8> = c.buffers.concat();
                assert_eq!(c.status().unwrap(), want.len() as u64);
                assert!(got == want, "read {} returned other bytes than the model", c.user_data);
                reads_checked += 1;
            }
            completed += 1;
        }
    }
    assert!(reads_checked > 100, "only {} reads", reads_checked);
    let stats = image.stats().unwrap();
    assert!(stats.cow_read_bytes > 0, "no copy-on-write from the backing file: {:?}", stats);
    drop(queue);
    image.close().unwrap();

    let top = ours.path("top.qcow2");
    qemu_img(&["check", top.to_str().unwrap()]);
    qemu_io(&theirs.path("top.qcow2"), &script);
    let out = qemu_img(&["compare", top.to_str().unwrap(), theirs.path("top.qcow2").to_str().unwrap()]);
    assert!(out.contains("identical"), "{}", out);
    assert!(qemu_read_all(&top, &ours.path("after.raw")) == model, "the disk differs from the model");
}
