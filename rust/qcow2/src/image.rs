// SPDX-License-Identifier: Apache-2.0
//! [`Image`]: an open image with its backing chain, and its synchronous
//! calls.
use crate::error::{check, Result};
use crate::options::OpenOptions;
use qcow2_sys as sys;
use std::mem;
use std::path::Path;
use std::ptr::NonNull;

/// An open qcow2 (or raw) image with its backing chain.
///
/// Every call takes `&self`: the library allows any number of threads to
/// use one image at once (synchronous calls and any number of
/// [`Queue`](crate::Queue)s), so `Image` is `Send` and `Sync`; share it by
/// reference, with scoped threads, or in an `Arc`. Closing takes the
/// image by value, and a queue borrows (or holds an `Arc` of) its image,
/// so the image cannot close while a queue or a call is still using it.
///
/// ```no_run
/// use qcow2::{CreateOptions, OpenOptions};
/// CreateOptions::new().size(1 << 30).create("disk.qcow2")?;
/// let image = OpenOptions::new().read_write(true).open("disk.qcow2")?;
/// image.write_at(&[0xab; 4096], 1 << 20)?;
/// let mut buf = vec![0; 4096];
/// image.read_at(&mut buf, 1 << 20)?;
/// assert!(buf.iter().all(|&b| b == 0xab));
/// image.close()?; // flushes; reports the final flush's error
/// # Ok::<(), qcow2::Error>(())
/// ```
pub struct Image {
    raw: NonNull<sys::qcow2_image_t>,
}

// SAFETY: c.h: "qcow2_image_t calls may be made from any number of threads
// at once"; close and destroy need exclusive ownership (by value / Drop).
unsafe impl Send for Image {}
unsafe impl Sync for Image {}

/// What one range of the disk reads from, as `qemu-img map` says.
#[derive(Debug, Copy, Clone, PartialEq, Eq)]
pub struct BlockStatus {
    /// Guest offset of the range.
    pub offset: u64,
    /// Bytes with this status (at least 1).
    pub length: u64,
    /// Chain index of the file that decides it (0 = the top).
    pub depth: u32,
    /// Some file of the chain allocates it.
    pub allocated: bool,
    /// Reads as zeros.
    pub zero: bool,
    /// Reads from stored data.
    pub data: bool,
    /// Stored in a compressed cluster.
    pub compressed: bool,
    /// Where the data is in the file at `depth` (uncompressed data only).
    pub host_offset: Option<u64>,
}

/// The I/O counters of an image since it was opened: every queue and the
/// synchronous calls (include/qcow2/stats.h describes each).
pub type Stats = sys::qcow2_stats_t;

impl Image {
    /// Opens `path` read-only (see [`OpenOptions`] for the rest).
    pub fn open(path: impl AsRef<Path>) -> Result<Image> {
        OpenOptions::new().open(path)
    }

    /// Opens `path` for reading and writing.
    pub fn open_rw(path: impl AsRef<Path>) -> Result<Image> {
        OpenOptions::new().read_write(true).open(path)
    }

    pub(crate) fn from_raw(raw: NonNull<sys::qcow2_image_t>) -> Image {
        Image { raw }
    }

    /// The C handle, for calls this crate does not wrap. It stays owned by
    /// the `Image`; c.h's threading contract applies.
    pub fn as_raw(&self) -> *mut sys::qcow2_image_t {
        self.raw.as_ptr()
    }

    /// Virtual disk size in bytes.
    pub fn size(&self) -> u64 {
        // SAFETY: a live handle.
        unsafe { sys::qcow2_image_size(self.raw.as_ptr()) }
    }

    /// Whether the image was opened for writing.
    pub fn writable(&self) -> bool {
        // SAFETY: a live handle.
        unsafe { sys::qcow2_image_writable(self.raw.as_ptr()) != 0 }
    }

    /// Number of files in the chain (1: no backing file).
    pub fn chain_length(&self) -> u32 {
        // SAFETY: a live handle.
        unsafe { sys::qcow2_image_chain_length(self.raw.as_ptr()) as u32 }
    }

    /// Reads `buf.len()` bytes at `offset`, blocking; a range past the end
    /// of the disk is `EIO`.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        check(|err| unsafe {
            // SAFETY: buf is valid for the call only, as c.h requires.
            sys::qcow2_image_read(self.raw.as_ptr(), offset, buf.as_mut_ptr().cast(), buf.len(), err)
        })?;
        Ok(())
    }

    /// Writes `buf` at `offset`, blocking; durable after the next
    /// successful [`flush`](Self::flush). `EPERM` on a read-only image.
    pub fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        check(|err| unsafe {
            // SAFETY: buf is valid for the call only, as c.h requires.
            sys::qcow2_image_write(self.raw.as_ptr(), offset, buf.as_ptr().cast(), buf.len(), err)
        })?;
        Ok(())
    }

    /// Writes one whole guest cluster stored compressed: `offset`
    /// cluster-aligned, `buf` the cluster size (or what is left of the
    /// disk's last cluster). `ENOTSUP` for a raw image.
    pub fn write_compressed_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        check(|err| unsafe {
            // SAFETY: buf is valid for the call only.
            sys::qcow2_image_write_compressed(
                self.raw.as_ptr(),
                offset,
                buf.as_ptr().cast(),
                buf.len(),
                err,
            )
        })?;
        Ok(())
    }

    /// Makes the range read as zeros (never as backing data); with
    /// `unmap`, host clusters may be released.
    pub fn write_zeroes(&self, offset: u64, len: u64, unmap: bool) -> Result<()> {
        check(|err| unsafe {
            // SAFETY: a live handle.
            sys::qcow2_image_write_zeroes(self.raw.as_ptr(), offset, len, unmap as i32, err)
        })?;
        Ok(())
    }

    /// Discards the range: it reads as zeros afterwards; the host clusters
    /// of fully covered clusters are released.
    pub fn discard(&self, offset: u64, len: u64) -> Result<()> {
        // SAFETY: a live handle.
        check(|err| unsafe { sys::qcow2_image_discard(self.raw.as_ptr(), offset, len, err) })?;
        Ok(())
    }

    /// Makes every write completed before the call durable, metadata too.
    pub fn flush(&self) -> Result<()> {
        // SAFETY: a live handle.
        check(|err| unsafe { sys::qcow2_image_flush(self.raw.as_ptr(), err) })?;
        Ok(())
    }

    /// The status of the range at `offset` as long as it stays uniform,
    /// at most `max_len` bytes. Safe beside requests in flight.
    pub fn block_status(&self, offset: u64, max_len: u64) -> Result<BlockStatus> {
        let mut out = sys::qcow2_block_status_t {
            size: mem::size_of::<sys::qcow2_block_status_t>(),
            ..Default::default()
        };
        check(|err| unsafe {
            // SAFETY: out is a sized struct alive for the call.
            sys::qcow2_image_block_status(self.raw.as_ptr(), offset, max_len, &mut out, err)
        })?;
        Ok(BlockStatus {
            offset: out.offset,
            length: out.length,
            depth: out.depth.max(0) as u32,
            allocated: out.allocated != 0,
            zero: out.zero != 0,
            data: out.data != 0,
            compressed: out.compressed != 0,
            host_offset: if out.has_host_offset != 0 { Some(out.host_offset) } else { None },
        })
    }

    /// The image's I/O counters.
    pub fn stats(&self) -> Result<Stats> {
        let mut out = Stats { size: mem::size_of::<Stats>(), ..Default::default() };
        // SAFETY: out is a sized struct alive for the call.
        check(|err| unsafe { sys::qcow2_image_get_stats(self.raw.as_ptr(), &mut out, err) })?;
        Ok(out)
    }

    /// Flushes (when writable), marks the image clean and closes it,
    /// returning the final flush's error. Dropping an `Image` closes it
    /// too, losing that error.
    pub fn close(self) -> Result<()> {
        let raw = self.raw.as_ptr();
        mem::forget(self);
        // SAFETY: we own the handle; it is freed whatever the result.
        check(|err| unsafe { sys::qcow2_image_close(raw, err) })?;
        Ok(())
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        // SAFETY: we own the handle and nothing borrows the image any more.
        unsafe { sys::qcow2_image_destroy(self.raw.as_ptr()) }
    }
}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Image")
            .field("size", &self.size())
            .field("writable", &self.writable())
            .field("chain_length", &self.chain_length())
            .finish()
    }
}
