// SPDX-License-Identifier: Apache-2.0
//! The Rust side of the micro-benchmark (c_queue_bench.c is the C side;
//! run.sh runs both on one image): random 4 KiB reads or writes at depth
//! 32 through `Queue`, completions taken through epoll on its eventfd,
//! the same loop as the C program. Prints the process CPU time per
//! request, and the user-space part of it.
//!
//!   cargo bench --bench queue_bench -- IMAGE read|write REQUESTS owned|borrowed
//!
//! `owned`: the safe path (`readv_owned`/`writev_owned`, the buffers
//! handed back in each completion and reused); `borrowed`: the `unsafe`
//! path over one buffer region, as the C program does.
#[path = "../tests/support/epoll.rs"]
mod epoll;

use qcow2::{OpenOptions, Queue};
use std::io::{IoSlice, IoSliceMut};
use std::os::unix::io::AsRawFd;

const DEPTH: usize = 32;
const BLOCK: usize = 4096;

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

/// `struct rusage`: two timevals, then 14 longs.
#[repr(C)]
struct Rusage {
    utime: Timespec, // a timeval: seconds and microseconds
    stime: Timespec,
    rest: [i64; 14],
}

extern "C" {
    fn clock_gettime(clock: i32, t: *mut Timespec) -> i32;
    fn getrusage(who: i32, usage: *mut Rusage) -> i32;
}

/// User-space CPU time of the process: where the binding's own work goes.
fn user_ns() -> f64 {
    let mut u = Rusage { utime: Timespec { tv_sec: 0, tv_nsec: 0 }, stime: Timespec { tv_sec: 0, tv_nsec: 0 }, rest: [0; 14] };
    // SAFETY: `u` is valid for the call; RUSAGE_SELF is 0.
    unsafe { getrusage(0, &mut u) };
    u.utime.tv_sec as f64 * 1e9 + u.utime.tv_nsec as f64 * 1e3
}

/// CLOCK_PROCESS_CPUTIME_ID: CPU time of every thread of the process.
fn cpu_ns() -> f64 {
    let mut t = Timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is valid for the call.
    unsafe { clock_gettime(2, &mut t) };
    t.tv_sec as f64 * 1e9 + t.tv_nsec as f64
}

/// xorshift64*, as in c_queue_bench.c.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(2685821657736338717)
    }
}

struct Bench<'img> {
    queue: Queue<'img>,
    write: bool,
    owned: bool,
    blocks: u64,
    rng: Rng,
    region: Vec<u8>,
}

impl Bench<'_> {
    fn submit(&mut self, slot: u64, mut buffers: Vec<Vec<u8>>) {
        let offset = (self.rng.next() % self.blocks) * BLOCK as u64;
        if self.owned {
            if buffers.is_empty() {
                buffers.push(vec![0x5a; BLOCK]);
            }
            let r = if self.write {
                self.queue.writev_owned(offset, buffers, slot)
            } else {
                self.queue.readv_owned(offset, buffers, slot)
            };
            r.expect("submit");
            return;
        }
        let at = slot as usize * BLOCK;
        let r = if self.write {
            let iov = [IoSlice::new(&self.region[at..at + BLOCK])];
            // SAFETY: `region` outlives the queue (field order), and slot
            // `slot`'s bytes are not touched until its completion.
            unsafe { self.queue.writev(offset, &iov, slot) }
        } else {
            let mut iov = [IoSliceMut::new(&mut self.region[at..at + BLOCK])];
            // SAFETY: as above.
            unsafe { self.queue.readv(offset, &mut iov, slot) }
        };
        r.expect("submit");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    if args.len() != 4 {
        eprintln!("usage: queue_bench IMAGE read|write REQUESTS owned|borrowed");
        std::process::exit(2);
    }
    let requests: u64 = args[2].parse().expect("REQUESTS");
    let image = OpenOptions::new().read_write(true).open(&args[0]).expect("open");
    let epoll = epoll::Epoll::new().unwrap();
    let mut b = Bench {
        queue: image.queue(DEPTH as u32).expect("queue"),
        write: args[1] == "write",
        owned: args[3] == "owned",
        blocks: image.size() / BLOCK as u64,
        rng: Rng(0x9e3779b97f4a7c15),
        region: vec![0x5a; DEPTH * BLOCK],
    };
    epoll.add(b.queue.as_raw_fd(), 0).unwrap();

    let start = cpu_ns();
    let user_start = user_ns();
    let (mut submitted, mut completed) = (0u64, 0u64);
    while submitted < requests.min(DEPTH as u64) {
        b.submit(submitted, Vec::new());
        submitted += 1;
    }
    let mut done = Vec::with_capacity(32);
    let mut tokens = Vec::new();
    while completed < requests {
        epoll.wait(&mut tokens, -1).unwrap();
        b.queue.clear_event().unwrap();
        while b.queue.poll(&mut done, 32) > 0 {
            for c in done.drain(..) {
                assert_eq!(c.result, BLOCK as i64, "request failed");
                completed += 1;
                if submitted < requests {
                    b.submit(c.user_data, c.buffers);
                    submitted += 1;
                }
            }
        }
    }
    let ns = cpu_ns() - start;
    let user = user_ns() - user_start;
    println!(
        "rust-{} {} {} requests: {:.0} ns CPU per request (user {:.0})",
        args[3],
        args[1],
        requests,
        ns / requests as f64,
        user / requests as f64
    );
    drop(b);
    image.close().expect("close");
}
