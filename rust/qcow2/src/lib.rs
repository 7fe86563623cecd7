// SPDX-License-Identifier: Apache-2.0
//! Safe Rust API of libqcow2: qcow2 images with backing chains, served
//! asynchronously over io_uring, for virtual machine monitors written in
//! Rust. It wraps the C API (`include/qcow2/c.h`, through the `qcow2-sys`
//! crate) and needs no crate from a registry.
//!
//! - [`Image`]: create ([`CreateOptions`]), open ([`OpenOptions`]),
//!   synchronous `read_at` / `write_at` / `write_zeroes` / `discard` /
//!   `flush` / `block_status` / `stats`, and `close` with its error;
//! - [`Queue`]: vectored requests with `u64` user data, completions
//!   through an eventfd ([`AsRawFd`](std::os::unix::io::AsRawFd)) for
//!   epoll, mio or tokio's `AsyncFd`;
//! - live stream, commit and active commit ([`Image::live_stream`],
//!   [`Image::live_commit_active`], [`LiveControl`]);
//! - persistent dirty bitmaps ([`Image::bitmaps`]), internal snapshots
//!   ([`Image::snapshots`]), and the offline maintenance calls:
//!   [`check_image`], [`CreateOptions::measure`], [`commit`], [`rebase`],
//!   [`stream`];
//! - one [`Error`]: the errno and the library's message, into
//!   [`std::io::Error`].
//!
//! Threads, as docs/embedding.md's contract allows: an [`Image`] is `Send`
//! and `Sync` (any number of threads and queues at once); a [`Queue`] is
//! `Send` but not `Sync` (one thread at a time: give each I/O thread its
//! own); a [`LiveControl`] is `Send` and `Sync` (cancel from anywhere).
//!
//! ```no_run
//! use qcow2::{CreateOptions, Format, OpenOptions, Queue};
//! CreateOptions::new().size(1 << 30).create("base.qcow2")?;
//! CreateOptions::new().backing("base.qcow2", Format::Qcow2).create("top.qcow2")?;
//! let image = OpenOptions::new().read_write(true).open("top.qcow2")?;
//! assert_eq!(image.chain_length(), 2);
//! let mut queue: Queue = image.queue(32)?;
//! queue.writev_owned(0, vec![vec![0x5a; 4096]], 1)?;
//! let mut done = Vec::new();
//! queue.wait(&mut done, 1, 1);
//! assert_eq!(done[0].status()?, 4096);
//! drop(queue);
//! image.close()?;
//! # Ok::<(), qcow2::Error>(())
//! ```
//!
//! A queue cannot be shared between threads:
//!
//! ```compile_fail
//! fn is_sync<T: Sync>() {}
//! is_sync::<qcow2::Queue>();
//! ```
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod error;
mod image;
mod live;
mod maintenance;
mod options;
mod queue;

pub use error::{errno, Error, Result};
pub use image::{BlockStatus, Image, Stats};
pub use live::{LiveControl, LiveOptions, Progress};
pub use maintenance::{
    check_image, commit, rebase, stream, BitmapInfo, BitmapStatus, ChainOptions, CheckReport, Measure, Repair,
    SnapshotInfo,
};
pub use options::{Compat, Compression, CreateOptions, Format, OpenOptions, Preallocation};
pub use queue::{Completion, IoBuf, IoBufMut, Queue, Rejected};

/// The raw C API, for calls this crate does not wrap.
pub use qcow2_sys as sys;

/// For a thread that runs queues beside io_uring rings of its own: call it
/// first thing in the thread, before its first io_uring call, so that
/// buffered writes to one image file from every such thread wait their
/// turn in io_uring instead of contending for the file's lock
/// (`qcow2::PrepareIoThread` in the C++ API). Queues do it themselves on
/// their first I/O.
pub fn prepare_io_thread() {
    // SAFETY: takes no arguments; safe from any thread at any time.
    unsafe { sys::qcow2_prepare_io_thread() }
}

/// The version of libqcow2 loaded at run time, e.g. "0.1.0".
pub fn version() -> &'static str {
    // SAFETY: a static NUL-terminated string the library never frees.
    let s = unsafe { std::ffi::CStr::from_ptr(qcow2_sys::qcow2_version_string()) };
    s.to_str().unwrap_or("unknown")
}
