// SPDX-License-Identifier: Apache-2.0
//! What a Rust VMM's virtio-blk device does with libqcow2: serve the
//! guest's requests from a qcow2 chain through a Queue, only ever blocking
//! in epoll_wait on the queue's eventfd.
//!
//!  1. create a chain: base.qcow2 with data, overlay.qcow2 on top;
//!  2. open the overlay and make a queue; put its eventfd in epoll;
//!  3. take random scatter-gather requests (read, write, flush) from a
//!     simulated virtqueue whose buffers are in "guest memory" (one region
//!     mapped for the device's whole life), submit them pointing straight
//!     into that memory, and complete them in the guest's status bytes;
//!  4. check every read against what the disk must hold, and at the end
//!     read the whole disk back.
//!
//!     cargo run --example virtio_blk -- DIR
#[path = "../tests/support/epoll.rs"]
mod epoll;

use qcow2::{CreateOptions, Format, OpenOptions, Queue};
use std::io::{IoSlice, IoSliceMut};
use std::os::unix::io::AsRawFd;

const DISK: u64 = 64 << 20;
const SECTOR: u64 = 512;
const DEPTH: usize = 32;
const MAX_SEGS: usize = 4;
const SLOT_BYTES: usize = MAX_SEGS * 16 * SECTOR as usize;
const REQUESTS: u64 = 2000;
const VIRTIO_BLK_S_OK: u8 = 0;

/// One descriptor chain of the virtqueue: its type, sector and segments
/// (offsets into guest memory), the status byte the device sets, and for
/// reads the bytes the disk held when it was submitted.
#[derive(Default)]
struct Request {
    kind: u8, // 0 read (VIRTIO_BLK_T_IN), 1 write (OUT), 4 flush
    sector: u64,
    segs: Vec<(usize, usize)>,
    expect: Vec<u8>,
    status: u8,
}

/// xorshift64*: the guest's choices, the same on every run.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(2685821657736338717) % n
    }
}

struct Device<'img> {
    queue: Queue<'img>,
    guest: Vec<u8>,
    requests: Vec<Request>,
    free_slots: Vec<usize>,
    model: Vec<u8>,
    rng: Rng,
}

impl Device<'_> {
    /// The guest puts a random request in slot `slot`'s memory; the
    /// device submits it.
    fn submit(&mut self, slot: usize, n: u64) -> qcow2::Result<()> {
        let r = &mut self.requests[slot];
        r.status = 0xff;
        if self.rng.below(16) == 0 {
            r.kind = 4;
            return self.queue.flush(slot as u64);
        }
        r.kind = self.rng.below(2) as u8;
        r.segs.clear();
        let mut at = slot * SLOT_BYTES;
        for _ in 0..1 + self.rng.below(MAX_SEGS as u64) {
            let len = (SECTOR * (1 + self.rng.below(16))) as usize;
            r.segs.push((at, len));
            at += len;
        }
        let total = at - slot * SLOT_BYTES;
        r.sector = self.rng.below((DISK - total as u64) / SECTOR);
        let offset = r.sector * SECTOR;
        let disk = offset as usize..offset as usize + total;
        let mem = slot * SLOT_BYTES..slot * SLOT_BYTES + total;
        if r.kind == 1 {
            let byte = (n % 251) as u8 + 1;
            self.guest[mem.clone()].fill(byte);
            self.model[disk].copy_from_slice(&self.guest[mem]);
            let iov: Vec<IoSlice<'_>> = r.segs.iter().map(|&(a, l)| IoSlice::new(&self.guest[a..a + l])).collect();
            // SAFETY: guest memory lives as long as the device, and slot
            // `slot`'s bytes are not touched until its completion.
            unsafe { self.queue.writev(offset, &iov, slot as u64) }
        } else {
            r.expect.clear();
            r.expect.extend_from_slice(&self.model[disk]);
            let base = self.guest.as_mut_ptr();
            let mut iov: Vec<IoSliceMut<'_>> = r
                .segs
                .iter()
                // SAFETY: disjoint ranges inside guest memory.
                .map(|&(a, l)| IoSliceMut::new(unsafe { std::slice::from_raw_parts_mut(base.add(a), l) }))
                .collect();
            // SAFETY: as for writes; nothing reads the slot until then.
            unsafe { self.queue.readv(offset, &mut iov, slot as u64) }
        }
    }

    /// The device completes slot `slot`: checks a read's bytes and sets
    /// the guest's status byte.
    fn complete(&mut self, slot: usize, result: qcow2::Result<u64>) {
        let r = &mut self.requests[slot];
        result.unwrap_or_else(|e| panic!("request in slot {} failed: {}", slot, e));
        if r.kind == 0 {
            let got: Vec<u8> = r.segs.iter().flat_map(|&(a, l)| self.guest[a..a + l].iter().copied()).collect();
            assert!(got == r.expect, "read at sector {} returned other bytes", r.sector);
        }
        r.status = VIRTIO_BLK_S_OK;
        self.free_slots.push(slot);
    }
}

/// The device's life: requests served from epoll until REQUESTS are done.
/// Returns how many, and what the disk must now hold.
fn serve(image: &qcow2::Image, model: Vec<u8>) -> Result<(u64, Vec<u8>), Box<dyn std::error::Error>> {
    let epoll = epoll::Epoll::new()?;
    let mut dev = Device {
        queue: image.queue(DEPTH as u32)?,
        guest: vec![0u8; DEPTH * SLOT_BYTES],
        requests: (0..DEPTH).map(|_| Request::default()).collect(),
        free_slots: (0..DEPTH).rev().collect(),
        model,
        rng: Rng(0x9e3779b97f4a7c15),
    };
    epoll.add(dev.queue.as_raw_fd(), 0)?;

    let (mut submitted, mut completed) = (0u64, 0u64);
    let mut done = Vec::new();
    let mut tokens = Vec::new();
    while completed < REQUESTS {
        while submitted < REQUESTS {
            let slot = match dev.free_slots.pop() {
                Some(s) => s,
                None => break,
            };
            dev.submit(slot, submitted)?;
            submitted += 1;
        }
        epoll.wait(&mut tokens, -1)?;
        dev.queue.clear_event()?; // reset first, then reap everything
        while dev.queue.poll(&mut done, 32) > 0 {}
        for c in done.drain(..) {
            dev.complete(c.user_data as usize, c.status());
            completed += 1;
        }
    }
    // Fields drop in order: the queue (nothing in flight) before the
    // guest memory.
    Ok((completed, std::mem::take(&mut dev.model)))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::path::PathBuf::from(std::env::args().nth(1).ok_or("usage: virtio_blk DIR")?);
    let base = dir.join("base.qcow2");
    let overlay = dir.join("overlay.qcow2");
    CreateOptions::new().size(DISK).create(&base)?;
    let mut model = vec![0u8; DISK as usize];
    {
        let image = OpenOptions::new().read_write(true).open(&base)?;
        for i in 0..64u64 {
            let data = vec![0x80 | i as u8; 256 << 10];
            image.write_at(&data, i << 20)?;
            model[(i << 20) as usize..][..data.len()].copy_from_slice(&data);
        }
        image.close()?;
    }
    CreateOptions::new().backing("base.qcow2", Format::Qcow2).extended_l2(true).create(&overlay)?;

    let image = OpenOptions::new().read_write(true).open(&overlay)?;
    let (completed, model) = serve(&image, model)?;

    let mut disk = vec![0u8; DISK as usize];
    image.read_at(&mut disk, 0)?;
    if disk != model {
        return Err("the disk differs from what the guest wrote".into());
    }
    let stats = image.stats()?;
    image.close()?;
    println!(
        "virtio_blk: {} requests ({} reads, {} writes, {} flushes) served from epoll; disk verified",
        completed, stats.guest_read_ops, stats.guest_write_ops, stats.guest_flush_ops
    );
    Ok(())
}
