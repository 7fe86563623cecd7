// SPDX-License-Identifier: Apache-2.0
//! Queue requests other than reads and writes, a full queue, a queue
//! owning an Arc of its image on another thread, and the Send/Sync the
//! threading contract allows.
mod support;

use qcow2::{errno, CreateOptions, Image, LiveControl, OpenOptions, Queue};
use std::sync::Arc;
use support::{qemu_img, qemu_read_all, TempDir};

fn is_send<T: Send>() {}
fn is_sync<T: Sync>() {}

#[test]
fn send_and_sync_as_the_contract_allows() {
    is_send::<Image>();
    is_sync::<Image>();
    is_send::<Queue<'static>>();
    is_send::<LiveControl>();
    is_sync::<LiveControl>();
    is_send::<qcow2::Error>();
    is_sync::<qcow2::Error>();
    // Queue is not Sync: the compile_fail doc test in lib.rs shows it.
}

#[test]
fn full_queue_gives_buffers_back_then_zeroes_discard_flush() {
    let dir = TempDir::new("queue-ops");
    let path = dir.path("q.qcow2");
    CreateOptions::new().size(4 << 20).create(&path).unwrap();
    let image = OpenOptions::new().read_write(true).open(&path).unwrap();
    qcow2::prepare_io_thread(); // harmless here: the test thread has no ring
    let mut queue: Queue = image.queue(2).unwrap();
    queue.writev_owned(0, vec![vec![1; 65536]], 10).unwrap();
    queue.writev_owned(65536, vec![vec![2; 4096], vec![3; 4096]], 11).unwrap();
    let full = queue.writev_owned(1 << 20, vec![vec![4; 512]], 12).unwrap_err();
    assert_eq!(full.error.errno(), errno::EAGAIN, "{}", full.error);
    assert_eq!(full.buffers, vec![vec![4u8; 512]]);

    let mut done = Vec::new();
    while done.len() < 2 {
        queue.wait(&mut done, 2, 1);
    }
    let mut ids: Vec<u64> = done.iter().map(|c| c.user_data).collect();
    ids.sort_unstable();
    assert_eq!(ids, [10, 11]);
    assert!(done.iter().all(|c| c.status().unwrap() == c.buffers.iter().map(|b| b.len() as u64).sum()));
    done.clear();

    queue.write_zeroes(4096, 8192, false, 20).unwrap();
    queue.discard(65536, 4096, 21).unwrap();
    while done.len() < 2 {
        queue.wait(&mut done, 2, 2);
    }
    let past_end = queue.discard(4 << 20, 4096, 99).unwrap_err();
    assert_eq!(past_end.errno(), errno::EIO, "{}", past_end);
    assert_eq!(queue.in_flight(), 0, "a refused submit has no completion to come");
    queue.flush(22).unwrap();
    queue.wait(&mut done, 1, 1);
    assert!(done.iter().all(|c| c.result == 0 && c.buffers.is_empty()), "{:?}", done);
    drop(queue);
    image.close().unwrap();

    qemu_img(&["check", path.to_str().unwrap()]);
    let disk = qemu_read_all(&path, &dir.path("q.raw"));
    assert!(disk[..4096].iter().all(|&b| b == 1));
    assert!(disk[4096..12288].iter().all(|&b| b == 0));
    assert!(disk[12288..65536].iter().all(|&b| b == 1));
    assert!(disk[65536..69632].iter().all(|&b| b == 0));
    assert!(disk[69632..73728].iter().all(|&b| b == 3));
}

#[test]
fn shared_queue_runs_on_another_thread() {
    let dir = TempDir::new("queue-arc");
    let path = dir.path("a.qcow2");
    CreateOptions::new().size(1 << 20).create(&path).unwrap();
    let image = Arc::new(OpenOptions::new().read_write(true).open(&path).unwrap());
    let mut queue: Queue<'static> = Queue::new_shared(Arc::clone(&image), 4).unwrap();
    let worker = std::thread::spawn(move || {
        queue.writev_owned(4096, vec![vec![7; 4096]], 1).unwrap();
        let mut done = Vec::new();
        queue.wait(&mut done, 1, 1);
        done[0].status().unwrap()
    });
    assert_eq!(worker.join().unwrap(), 4096);
    let image = Arc::try_unwrap(image).expect("the queue's Arc is gone with it");
    let mut buf = vec![0; 4096];
    image.read_at(&mut buf, 4096).unwrap();
    assert!(buf.iter().all(|&b| b == 7));
    image.close().unwrap();
}
