// SPDX-License-Identifier: Apache-2.0
//! Raw declarations of libqcow2's C API, `include/qcow2/c.h`, written by
//! hand (no bindgen) in the header's order. `tests/rust_sys_check.py`
//! checks in CI that every function and struct of c.h is here with the
//! same parameters and fields in the same order.
//!
//! Everything here is `unsafe` and follows c.h's contracts: errors as a
//! negative errno plus a message in `*errptr` (free it with
//! [`qcow2_free`]), the threading rules of docs/embedding.md, and buffers
//! of queued requests kept valid until their completion is polled. The
//! `qcow2` crate wraps it in a safe API.
#![allow(non_camel_case_types)]
#![deny(missing_docs)]

use std::marker::{PhantomData, PhantomPinned};
pub use std::os::raw::{c_char, c_int, c_void};

/// `struct iovec` of `<sys/uio.h>`. `std::io::IoSlice` and `IoSliceMut`
/// are ABI-compatible with it on Unix, so a slice of them may be passed
/// where `*const iovec` is expected.
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct iovec {
    /// Start of the segment.
    pub iov_base: *mut c_void,
    /// Length of the segment in bytes.
    pub iov_len: usize,
}

/// An open image with its backing chain. Opaque.
#[repr(C)]
pub struct qcow2_image_t {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

/// An asynchronous queue of requests on one image. Opaque.
#[repr(C)]
pub struct qcow2_queue_t {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

/// Cancels a running live job from any thread. Opaque.
#[repr(C)]
pub struct qcow2_live_control_t {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

/// What one range of the disk reads from (`qemu-img map`).
#[repr(C)]
#[derive(Debug, Copy, Clone, Default)]
pub struct qcow2_block_status_t {
    /// In: `size_of::<qcow2_block_status_t>()`.
    pub size: usize,
    /// Guest offset of the range.
    pub offset: u64,
    /// Bytes with this status.
    pub length: u64,
    /// Chain index of the deciding file (0 = top).
    pub depth: i32,
    /// Some file of the chain allocates it.
    pub allocated: u8,
    /// Reads as zeros.
    pub zero: u8,
    /// Reads from stored data.
    pub data: u8,
    /// Stored in a compressed cluster.
    pub compressed: u8,
    /// `host_offset` is meaningful.
    pub has_host_offset: u8,
    /// In the file at `depth` (uncompressed data).
    pub host_offset: u64,
}

/// I/O counters (qcow2/stats.h describes each). Fields are only added at
/// the end; the library fills those that fit in `size`.
#[repr(C)]
#[derive(Debug, Copy, Clone, Default)]
pub struct qcow2_stats_t {
    /// In: `size_of::<qcow2_stats_t>()`.
    pub size: usize,
    /// Guest reads submitted.
    pub guest_read_ops: u64,
    /// Bytes of guest reads.
    pub guest_read_bytes: u64,
    /// Guest writes submitted.
    pub guest_write_ops: u64,
    /// Bytes of guest writes.
    pub guest_write_bytes: u64,
    /// Guest write-zeroes submitted.
    pub guest_zero_ops: u64,
    /// Bytes of guest write-zeroes.
    pub guest_zero_bytes: u64,
    /// Guest discards submitted.
    pub guest_discard_ops: u64,
    /// Bytes of guest discards.
    pub guest_discard_bytes: u64,
    /// Guest flushes submitted.
    pub guest_flush_ops: u64,
    /// Host bytes read of stored guest data (any layer).
    pub host_data_read_bytes: u64,
    /// Host bytes written of the guest's own data.
    pub host_data_write_bytes: u64,
    /// Bytes read to fill the rest of a cluster on copy-on-write.
    pub cow_read_bytes: u64,
    /// Bytes written besides the guest's own on copy-on-write.
    pub cow_write_bytes: u64,
    /// Metadata bytes read (L2 tables, refcounts).
    pub metadata_read_bytes: u64,
    /// Metadata bytes written (header, L1, L2, refcounts).
    pub metadata_write_bytes: u64,
    /// Zero-range calls on host files.
    pub host_zero_ops: u64,
    /// Punch-hole calls on host files.
    pub host_discard_ops: u64,
    /// fsync/fdatasync calls.
    pub host_flushes: u64,
    /// Data clusters allocated in the top image.
    pub cluster_allocations: u64,
}

/// One finished request: the user data given at submit and its result
/// (bytes for reads and writes, 0 for the others, or a negative errno).
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct qcow2_completion_t {
    /// As given to the submit.
    pub user_data: *mut c_void,
    /// Bytes transferred, 0, or a negative errno.
    pub result: i64,
}

/// Progress of a live job: bytes of the disk done, and in all. Called on
/// the job's threads, one call at a time.
pub type qcow2_live_progress_fn =
    Option<unsafe extern "C" fn(user_data: *mut c_void, done: u64, total: u64)>;

/// Options of a live stream or commit (zeros keep the defaults).
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct qcow2_live_options_t {
    /// In: `size_of::<qcow2_live_options_t>()`.
    pub size: usize,
    /// Bytes per chunk (512 multiple); 0: 1 MiB.
    pub chunk: u64,
    /// Chunks in flight (threads); 0: 2.
    pub depth: c_int,
    /// Bytes per second; 0: no limit.
    pub rate_limit: u64,
    /// May be `None`.
    pub progress: qcow2_live_progress_fn,
    /// Passed to `progress`.
    pub progress_data: *mut c_void,
    /// May be null.
    pub control: *mut qcow2_live_control_t,
}

/// One persistent dirty bitmap of the top image.
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct qcow2_bitmap_info_t {
    /// In: `size_of::<qcow2_bitmap_info_t>()`.
    pub size: usize,
    /// Malloc'd: free with [`qcow2_free`].
    pub name: *mut c_char,
    /// Bytes per bit.
    pub granularity: u64,
    /// The auto flag: writes set its bits.
    pub enabled: u8,
    /// Inconsistent (found in use): only removable.
    pub in_use: u8,
}

/// The dirty state of a range of a bitmap.
#[repr(C)]
#[derive(Debug, Copy, Clone, Default)]
pub struct qcow2_bitmap_status_t {
    /// In: `size_of::<qcow2_bitmap_status_t>()`.
    pub size: usize,
    /// Guest offset of the range.
    pub offset: u64,
    /// Bytes with this state.
    pub length: u64,
    /// Written since the bitmap was cleared.
    pub dirty: u8,
}

/// One internal snapshot.
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct qcow2_snapshot_info_t {
    /// In: `size_of::<qcow2_snapshot_info_t>()`.
    pub size: usize,
    /// Malloc'd: free with [`qcow2_free`].
    pub id: *mut c_char,
    /// Malloc'd: free with [`qcow2_free`].
    pub name: *mut c_char,
    /// Bytes of VM state (0: disk only).
    pub vm_state_size: u64,
    /// Creation time, seconds.
    pub date_sec: u32,
    /// Creation time, nanoseconds.
    pub date_nsec: u32,
    /// Guest clock at creation.
    pub vm_clock_nsec: u64,
    /// Virtual size of the disk it holds.
    pub disk_size: u64,
    /// `icount` is meaningful.
    pub has_icount: u8,
    /// Instruction count at creation.
    pub icount: u64,
}

/// qemu-img check's report.
#[repr(C)]
#[derive(Debug, Copy, Clone, Default)]
pub struct qcow2_check_report_t {
    /// In: `size_of::<qcow2_check_report_t>()`.
    pub size: usize,
    /// Corruptions found.
    pub corruptions: u64,
    /// Leaked clusters found.
    pub leaks: u64,
    /// Errors that stopped parts of the check.
    pub check_errors: u64,
    /// Corruptions repaired.
    pub corruptions_fixed: u64,
    /// Leaks repaired.
    pub leaks_fixed: u64,
    /// End of the image's data in its file.
    pub image_end_offset: u64,
    /// Clusters of the disk.
    pub total_clusters: u64,
    /// Clusters allocated.
    pub allocated_clusters: u64,
    /// Clusters not contiguous with the one before.
    pub fragmented_clusters: u64,
    /// Compressed clusters.
    pub compressed_clusters: u64,
    /// qemu-img check's exit status: 0 clean, 1 failed, 2 corrupt, 3 leaks.
    pub verdict: i32,
    /// Repaired, then checked again (these counters).
    pub rechecked: u8,
}

/// `repair` of [`qcow2_check`]: report only.
pub const QCOW2_REPAIR_NONE: c_int = 0;
/// `repair` of [`qcow2_check`]: repair leaked clusters.
pub const QCOW2_REPAIR_LEAKS: c_int = 1;
/// `repair` of [`qcow2_check`]: repair everything.
pub const QCOW2_REPAIR_ALL: c_int = 2;

/// qemu-img measure's answer: the bytes a new image needs.
#[repr(C)]
#[derive(Debug, Copy, Clone, Default)]
pub struct qcow2_measure_t {
    /// In: `size_of::<qcow2_measure_t>()`.
    pub size: usize,
    /// Bytes the image needs for its data and metadata.
    pub required: u64,
    /// Bytes when fully allocated.
    pub fully_allocated: u64,
    /// Both sides carry persistent bitmaps.
    pub has_bitmaps: u8,
    /// Bytes of the bitmaps' metadata and data.
    pub bitmaps: u64,
}

/// Progress of an offline chain operation: the fraction done (0..1).
pub type qcow2_progress_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, fraction: f64)>;

/// Options of an offline commit, rebase or stream (zeros: defaults).
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct qcow2_chain_op_options_t {
    /// In: `size_of::<qcow2_chain_op_options_t>()`.
    pub size: usize,
    /// `qcow2_image_open_opts`'s string, or null.
    pub open_options: *const c_char,
    /// Chunks in flight; 0: 16.
    pub depth: c_int,
    /// Bytes per chunk (512 multiple); 0: 1 MiB.
    pub chunk: u64,
    /// May be `None`.
    pub progress: qcow2_progress_fn,
    /// Passed to `progress`.
    pub progress_data: *mut c_void,
    /// Cancels with `-ECANCELED`; may be null.
    pub control: *mut qcow2_live_control_t,
}

extern "C" {
    // ---- library
    /// The version of the library loaded at run time (static storage).
    pub fn qcow2_version_string() -> *const c_char;
    /// Frees a string the library returned (an error message); null is fine.
    pub fn qcow2_free(ptr: *mut c_void);

    // ---- images
    /// Creates an image at `path` (`-EEXIST` if it exists) with qemu-img's `-o` options.
    pub fn qcow2_image_create(
        path: *const c_char,
        backing: *const c_char,
        size: u64,
        options: *const c_char,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// Opens `path` and its chain, read-write when `read_write` is non-zero; null on failure.
    pub fn qcow2_image_open(
        path: *const c_char,
        read_write: c_int,
        errptr: *mut *mut c_char,
    ) -> *mut qcow2_image_t;
    /// Opens `path` with `key=value` options (read-only=, format=, direct= ...); null on failure.
    pub fn qcow2_image_open_opts(
        path: *const c_char,
        options: *const c_char,
        errptr: *mut *mut c_char,
    ) -> *mut qcow2_image_t;
    /// As `qcow2_image_open_opts`, returning 0 or the negative errno; `*out` is the handle or null.
    pub fn qcow2_image_open_ex(
        path: *const c_char,
        options: *const c_char,
        out: *mut *mut qcow2_image_t,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// Flushes, marks clean and frees the handle, failed or not; returns the flush error.
    pub fn qcow2_image_close(img: *mut qcow2_image_t, errptr: *mut *mut c_char) -> c_int;
    /// Frees the handle with no error report; null is a no-op.
    pub fn qcow2_image_destroy(img: *mut qcow2_image_t);
    /// Virtual disk size in bytes.
    pub fn qcow2_image_size(img: *const qcow2_image_t) -> u64;
    /// Non-zero when the image was opened for writing.
    pub fn qcow2_image_writable(img: *const qcow2_image_t) -> c_int;
    /// Number of files in the chain (1: no backing file).
    pub fn qcow2_image_chain_length(img: *const qcow2_image_t) -> c_int;
    /// Reads `len` bytes at `offset`, blocking.
    pub fn qcow2_image_read(
        img: *mut qcow2_image_t,
        offset: u64,
        buf: *mut c_void,
        len: usize,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// Writes `len` bytes at `offset`, blocking.
    pub fn qcow2_image_write(
        img: *mut qcow2_image_t,
        offset: u64,
        buf: *const c_void,
        len: usize,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// Writes one whole guest cluster stored compressed.
    pub fn qcow2_image_write_compressed(
        img: *mut qcow2_image_t,
        offset: u64,
        buf: *const c_void,
        len: usize,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// Makes the range read as zeros; `unmap` non-zero may release host clusters.
    pub fn qcow2_image_write_zeroes(
        img: *mut qcow2_image_t,
        offset: u64,
        len: u64,
        unmap: c_int,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// Discards the range: it reads as zeros afterwards.
    pub fn qcow2_image_discard(
        img: *mut qcow2_image_t,
        offset: u64,
        len: u64,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// Makes every write completed before the call durable.
    pub fn qcow2_image_flush(img: *mut qcow2_image_t, errptr: *mut *mut c_char) -> c_int;
    /// The status of the range at `offset` (at most `max_len` bytes); set `out.size` first.
    pub fn qcow2_image_block_status(
        img: *mut qcow2_image_t,
        offset: u64,
        max_len: u64,
        out: *mut qcow2_block_status_t,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// Counters of every request on the image; set `out.size` first.
    pub fn qcow2_image_get_stats(
        img: *const qcow2_image_t,
        out: *mut qcow2_stats_t,
        errptr: *mut *mut c_char,
    ) -> c_int;

    // ---- queues
    /// A queue of at most `depth` requests in flight; null on failure.
    pub fn qcow2_queue_create(
        img: *mut qcow2_image_t,
        depth: c_int,
        errptr: *mut *mut c_char,
    ) -> *mut qcow2_queue_t;
    /// As `qcow2_queue_create`, returning 0 or the negative errno; `*out` is the queue or null.
    pub fn qcow2_queue_create_ex(
        img: *mut qcow2_image_t,
        depth: c_int,
        out: *mut *mut qcow2_queue_t,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// Waits for every request in flight and frees the queue; null is a no-op.
    pub fn qcow2_queue_destroy(q: *mut qcow2_queue_t);
    /// The queue's eventfd (never close it), or a negative errno.
    pub fn qcow2_queue_eventfd(q: *mut qcow2_queue_t) -> c_int;
    /// Submits a vectored read; the segments must stay valid until its completion.
    pub fn qcow2_queue_readv(
        q: *mut qcow2_queue_t,
        offset: u64,
        iov: *const iovec,
        iovcnt: c_int,
        user_data: *mut c_void,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// Submits a vectored write; the segments must stay valid until its completion.
    pub fn qcow2_queue_writev(
        q: *mut qcow2_queue_t,
        offset: u64,
        iov: *const iovec,
        iovcnt: c_int,
        user_data: *mut c_void,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// Submits a write-zeroes.
    pub fn qcow2_queue_write_zeroes(
        q: *mut qcow2_queue_t,
        offset: u64,
        len: u64,
        unmap: c_int,
        user_data: *mut c_void,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// Submits a discard.
    pub fn qcow2_queue_discard(
        q: *mut qcow2_queue_t,
        offset: u64,
        len: u64,
        user_data: *mut c_void,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// Submits a flush of every write whose completion was polled before it.
    pub fn qcow2_queue_flush(
        q: *mut qcow2_queue_t,
        user_data: *mut c_void,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// Stores up to `max` completions in `out`; never blocks; returns how many.
    pub fn qcow2_queue_poll(q: *mut qcow2_queue_t, out: *mut qcow2_completion_t, max: c_int)
        -> c_int;
    /// As `qcow2_queue_poll`, blocking until at least `min` completions are stored.
    pub fn qcow2_queue_wait(
        q: *mut qcow2_queue_t,
        out: *mut qcow2_completion_t,
        max: c_int,
        min: c_int,
    ) -> c_int;
    /// Requests submitted whose completion was not yet returned.
    pub fn qcow2_queue_in_flight(q: *const qcow2_queue_t) -> c_int;
    /// First thing in a thread that runs queues beside io_uring rings of its own.
    pub fn qcow2_prepare_io_thread();

    // ---- live stream and commit
    /// A control to cancel a live job from any thread.
    pub fn qcow2_live_control_create() -> *mut qcow2_live_control_t;
    /// Makes the job using `c` return `-ECANCELED` at its next chunk.
    pub fn qcow2_live_control_cancel(c: *mut qcow2_live_control_t);
    /// Frees a control (not while a job uses it); null is a no-op.
    pub fn qcow2_live_control_destroy(c: *mut qcow2_live_control_t);
    /// Pulls layers 1..base-1 into the top while queues keep running; blocks until done.
    pub fn qcow2_image_live_stream(
        img: *mut qcow2_image_t,
        base: c_int,
        opts: *const qcow2_live_options_t,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// Writes layers 1..base-1 into the layer at `base`; blocks until done.
    pub fn qcow2_image_live_commit(
        img: *mut qcow2_image_t,
        base: c_int,
        opts: *const qcow2_live_options_t,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// Active commit: writes layers 0..base-1 into the layer at `base`
    /// while queues keep running, then makes it the top; blocks until done.
    pub fn qcow2_image_live_commit_active(
        img: *mut qcow2_image_t,
        base: c_int,
        opts: *const qcow2_live_options_t,
        errptr: *mut *mut c_char,
    ) -> c_int;

    // ---- persistent dirty bitmaps
    /// The number of bitmaps of the top image, or a negative errno.
    pub fn qcow2_image_bitmap_count(img: *mut qcow2_image_t, errptr: *mut *mut c_char) -> c_int;
    /// Bitmap number `index`; `-ENOENT` past the last. Set `out.size` first.
    pub fn qcow2_image_bitmap_info(
        img: *mut qcow2_image_t,
        index: c_int,
        out: *mut qcow2_bitmap_info_t,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// The dirty state of bitmap `name` at `offset`, at most `max_len` bytes.
    pub fn qcow2_image_bitmap_status(
        img: *mut qcow2_image_t,
        name: *const c_char,
        offset: u64,
        max_len: u64,
        out: *mut qcow2_bitmap_status_t,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// Creates bitmap `name` (granularity 0: the cluster size, at least 4 KiB).
    pub fn qcow2_image_bitmap_add(
        img: *mut qcow2_image_t,
        name: *const c_char,
        granularity: u64,
        enabled: c_int,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// Removes bitmap `name`.
    pub fn qcow2_image_bitmap_remove(img: *mut qcow2_image_t, name: *const c_char, errptr: *mut *mut c_char)
        -> c_int;
    /// Clears every bit of bitmap `name`.
    pub fn qcow2_image_bitmap_clear(img: *mut qcow2_image_t, name: *const c_char, errptr: *mut *mut c_char)
        -> c_int;
    /// Makes bitmap `name` record writes.
    pub fn qcow2_image_bitmap_enable(img: *mut qcow2_image_t, name: *const c_char, errptr: *mut *mut c_char)
        -> c_int;
    /// Stops bitmap `name` recording writes.
    pub fn qcow2_image_bitmap_disable(
        img: *mut qcow2_image_t,
        name: *const c_char,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// Marks dirty in `target` what `source` (of `source_img`, null: `img`) has dirty.
    pub fn qcow2_image_bitmap_merge(
        img: *mut qcow2_image_t,
        target: *const c_char,
        source: *const c_char,
        source_img: *mut qcow2_image_t,
        errptr: *mut *mut c_char,
    ) -> c_int;

    // ---- internal snapshots
    /// The number of internal snapshots, or a negative errno.
    pub fn qcow2_image_snapshot_count(img: *mut qcow2_image_t, errptr: *mut *mut c_char) -> c_int;
    /// Snapshot number `index` in table order; `-ENOENT` past the last.
    pub fn qcow2_image_snapshot_info(
        img: *mut qcow2_image_t,
        index: c_int,
        out: *mut qcow2_snapshot_info_t,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// Creates a snapshot (`id` null or "": the next numeric id).
    pub fn qcow2_image_snapshot_create(
        img: *mut qcow2_image_t,
        name: *const c_char,
        id: *const c_char,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// Reverts the disk to a snapshot, by id or else by name.
    pub fn qcow2_image_snapshot_apply(
        img: *mut qcow2_image_t,
        name_or_id: *const c_char,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// Deletes a snapshot, by id or else by name.
    pub fn qcow2_image_snapshot_delete(
        img: *mut qcow2_image_t,
        name_or_id: *const c_char,
        errptr: *mut *mut c_char,
    ) -> c_int;

    // ---- offline maintenance
    /// qemu-img check (and repair) of the image at `path`.
    pub fn qcow2_check(
        path: *const c_char,
        repair: c_int,
        out: *mut qcow2_check_report_t,
        messages: *mut *mut c_char,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// qemu-img measure.
    pub fn qcow2_measure(
        options: *const c_char,
        size: u64,
        source: *mut qcow2_image_t,
        out: *mut qcow2_measure_t,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// qemu-img commit of the image at `path` into `base`.
    pub fn qcow2_commit(
        path: *const c_char,
        base: *const c_char,
        keep_top: c_int,
        opts: *const qcow2_chain_op_options_t,
        emptied: *mut c_int,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// qemu-img rebase (`unsafe_` non-zero: only rewrite the name, -u).
    pub fn qcow2_rebase(
        path: *const c_char,
        backing: *const c_char,
        backing_format: *const c_char,
        unsafe_: c_int,
        opts: *const qcow2_chain_op_options_t,
        errptr: *mut *mut c_char,
    ) -> c_int;
    /// Offline block-stream into the top of what lies above `base`.
    pub fn qcow2_stream(
        path: *const c_char,
        base: *const c_char,
        opts: *const qcow2_chain_op_options_t,
        errptr: *mut *mut c_char,
    ) -> c_int;
}
