// SPDX-License-Identifier: Apache-2.0
//! [`Queue`]: asynchronous requests on an image, completions through an
//! eventfd that drops into epoll, mio or tokio's `AsyncFd`.
use crate::error::{check, errno, ErrPtr, Error, Result};
use crate::image::Image;
use qcow2_sys as sys;
use std::fs::File;
use std::io::{self, IoSlice, IoSliceMut, Read};
use std::mem::{ManuallyDrop, MaybeUninit};
use std::os::raw::c_void;
use std::os::unix::io::{AsFd, AsRawFd, BorrowedFd, FromRawFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::Arc;

/// Memory a queue may hand to the kernel while the owner moves: the bytes
/// stay at the same address however the value is moved, until it is
/// dropped (a heap allocation, or memory that lives for the program).
///
/// # Safety
///
/// `as_ptr()` and `len()` must describe `len()` readable bytes that stay
/// valid and at the same address from the call until the value is dropped
/// or mutably used again, whatever moves the value goes through.
pub unsafe trait IoBuf: 'static {
    /// Start of the bytes.
    fn as_ptr(&self) -> *const u8;
    /// Number of bytes.
    fn len(&self) -> usize;
    /// Whether there are no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An [`IoBuf`] the kernel may also write into (a read's destination).
///
/// # Safety
///
/// As [`IoBuf`], and `as_mut_ptr()` gives `len()` writable bytes that
/// nothing else reads or writes until the value is used again.
pub unsafe trait IoBufMut: IoBuf {
    /// Start of the bytes, for writing.
    fn as_mut_ptr(&mut self) -> *mut u8;
}

// SAFETY: a Vec's elements live in its heap allocation, which a move of
// the Vec does not move.
unsafe impl IoBuf for Vec<u8> {
    fn as_ptr(&self) -> *const u8 {
        <[u8]>::as_ptr(self)
    }
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

// SAFETY: as above; the Vec is owned by the queue while the kernel writes.
unsafe impl IoBufMut for Vec<u8> {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        <[u8]>::as_mut_ptr(self)
    }
}

// SAFETY: static memory never moves nor is freed, and is only read.
unsafe impl IoBuf for &'static [u8] {
    fn as_ptr(&self) -> *const u8 {
        <[u8]>::as_ptr(self)
    }
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}

/// A finished request.
#[derive(Debug)]
pub struct Completion<B = Vec<u8>> {
    /// The user data given at submit.
    pub user_data: u64,
    /// Bytes transferred for reads and writes, 0 for the others, or a
    /// negative errno.
    pub result: i64,
    /// The buffers of a `readv_owned` / `writev_owned`, given back (filled
    /// for a read); empty for the other requests.
    pub buffers: Vec<B>,
}

impl<B> Completion<B> {
    /// `result` as a `Result`: the bytes transferred, or the error.
    pub fn status(&self) -> Result<u64> {
        if self.result >= 0 {
            Ok(self.result as u64)
        } else {
            Err(Error::from_errno((-self.result).min(i32::MAX as i64) as i32))
        }
    }
}

/// A submit the queue refused (e.g. `EAGAIN`: the queue is full), with the
/// buffers it was given back.
#[derive(Debug)]
pub struct Rejected<B> {
    /// Why.
    pub error: Error,
    /// The buffers of the submit, untouched.
    pub buffers: Vec<B>,
}

impl<B> From<Rejected<B>> for Error {
    fn from(r: Rejected<B>) -> Error {
        r.error
    }
}

impl<B> From<Rejected<B>> for io::Error {
    fn from(r: Rejected<B>) -> io::Error {
        r.error.into()
    }
}

/// What a request in flight holds: its user data and owned buffers.
struct Slot<B> {
    user_data: u64,
    buffers: Vec<B>,
}

/// The image a queue runs on: borrowed, or shared through an `Arc`.
enum ImageRef<'img> {
    Borrowed(&'img Image),
    Shared(Arc<Image>),
}

impl ImageRef<'_> {
    fn get(&self) -> &Image {
        match self {
            ImageRef::Borrowed(i) => i,
            ImageRef::Shared(i) => i,
        }
    }
}

/// Segments up to this count are described on the stack at submit.
const STACK_IOVS: usize = 16;
/// Completions fetched from the library per call.
const BATCH: usize = 64;

/// An asynchronous queue of at most `depth` requests in flight on one
/// image (io_uring when the kernel has it).
///
/// A queue belongs to one thread at a time (it is `Send`, not `Sync`):
/// give each I/O thread its own. Its eventfd ([`AsRawFd`], [`AsFd`]) is
/// readable whenever [`poll`](Self::poll) has something to do: reset it
/// with [`clear_event`](Self::clear_event), then poll until it returns 0.
///
/// Buffers: [`readv_owned`](Self::readv_owned) and
/// [`writev_owned`](Self::writev_owned) take the buffers (any [`IoBuf`],
/// `Vec<u8>` by default) and give them back in the [`Completion`], so no
/// request can outlive its memory; [`readv`](Self::readv) and
/// [`writev`](Self::writev) take borrowed `IoSliceMut`/`IoSlice` (guest
/// memory a VMM maps for its lifetime) and are `unsafe`, with their
/// contract written there. Dropping the queue waits for every request in
/// flight, then frees the buffers it holds.
///
/// ```no_run
/// use qcow2::{OpenOptions, Queue};
/// let image = OpenOptions::new().read_write(true).open("disk.qcow2")?;
/// let mut queue: Queue = image.queue(32)?;
/// queue.writev_owned(0, vec![vec![1u8; 4096], vec![2u8; 4096]], 7)?;
/// queue.readv_owned(0, vec![vec![0u8; 8192]], 8)?;
/// let mut done = Vec::new();
/// while done.len() < 2 {
///     queue.wait(&mut done, 2, 1);
/// }
/// for c in &done {
///     c.status()?;
///     if c.user_data == 8 {
///         assert_eq!(c.buffers[0][4096], 2);
///     }
/// }
/// # Ok::<(), qcow2::Error>(())
/// ```
pub struct Queue<'img, B = Vec<u8>> {
    raw: NonNull<sys::qcow2_queue_t>,
    event_fd: RawFd,
    slots: Vec<Slot<B>>,
    free: Vec<usize>,
    image: ImageRef<'img>,
}

// SAFETY: c.h: "A qcow2_queue_t belongs to one thread at a time", so it may
// move between threads but not be shared; the image it holds is Sync.
unsafe impl<B: Send> Send for Queue<'_, B> {}

impl Image {
    /// A queue of at most `depth` requests in flight on this image
    /// (see [`Queue`]). Any number of queues may run on one image.
    pub fn queue<B: IoBuf>(&self, depth: u32) -> Result<Queue<'_, B>> {
        Queue::create(ImageRef::Borrowed(self), depth)
    }
}

impl<B: IoBuf> Queue<'static, B> {
    /// A queue holding an `Arc` of its image, for threads and tasks that
    /// need a `'static` queue. The image closes when the last `Arc` goes.
    pub fn new_shared(image: Arc<Image>, depth: u32) -> Result<Queue<'static, B>> {
        Queue::create(ImageRef::Shared(image), depth)
    }
}

impl<'img, B: IoBuf> Queue<'img, B> {
    fn create(image: ImageRef<'img>, depth: u32) -> Result<Queue<'img, B>> {
        let depth = i32::try_from(depth)
            .map_err(|_| Error::new(errno::EINVAL, format!("queue depth {} is too large", depth)))?;
        let mut raw = ptr::null_mut();
        // SAFETY: a live image handle; `raw` is written by the call (the
        // queue, or null on failure).
        check(|err| unsafe { sys::qcow2_queue_create_ex(image.get().as_raw(), depth, &mut raw, err) })?;
        let raw = NonNull::new(raw)
            .ok_or_else(|| Error::new(errno::EIO, "qcow2_queue_create_ex gave no queue"))?;
        // The notifier exists from the start, so that submits go to the
        // kernel at once and the fd can be handed out infallibly.
        // SAFETY: a live queue handle.
        let fd = unsafe { sys::qcow2_queue_eventfd(raw.as_ptr()) };
        if fd < 0 {
            // SAFETY: nothing is in flight on the new queue.
            unsafe { sys::qcow2_queue_destroy(raw.as_ptr()) };
            return Err(Error::new(-fd, "cannot make the queue's eventfd"));
        }
        let cap = depth as usize;
        Ok(Queue {
            raw,
            event_fd: fd,
            slots: Vec::with_capacity(cap),
            free: Vec::with_capacity(cap),
            image,
        })
    }

    /// The image the queue runs on.
    pub fn image(&self) -> &Image {
        self.image.get()
    }

    /// Requests submitted whose completion was not yet returned.
    pub fn in_flight(&self) -> usize {
        // SAFETY: a live queue handle.
        unsafe { sys::qcow2_queue_in_flight(self.raw.as_ptr()).max(0) as usize }
    }

    /// Reads 8 bytes from the eventfd to reset it (nothing to read is
    /// fine). Call it before polling, so that a completion arriving during
    /// the poll leaves the fd readable.
    pub fn clear_event(&self) -> io::Result<()> {
        // SAFETY: the queue owns the fd for its life; ManuallyDrop never
        // closes it.
        let mut file = ManuallyDrop::new(unsafe { File::from_raw_fd(self.event_fd) });
        let mut count = [0u8; 8];
        match file.read(&mut count) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn take_slot(&mut self, user_data: u64) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.slots[i].user_data = user_data;
                i
            }
            None => {
                self.slots.push(Slot { user_data, buffers: Vec::new() });
                self.slots.len() - 1
            }
        }
    }

    /// Runs one submit with slot `i` as the C user data; frees the slot
    /// when the submit fails.
    fn submit(
        &mut self,
        user_data: u64,
        call: impl FnOnce(*mut sys::qcow2_queue_t, *mut c_void, *mut *mut sys::c_char) -> i32,
    ) -> Result<usize> {
        let i = self.take_slot(user_data);
        let mut err = ErrPtr::new();
        let rc = call(self.raw.as_ptr(), i as *mut c_void, err.as_mut_ptr());
        if rc < 0 {
            self.free.push(i);
            return Err(err.into_error(rc));
        }
        Ok(i)
    }

    fn submit_iov(
        &mut self,
        write: bool,
        offset: u64,
        iov: &[sys::iovec],
        user_data: u64,
    ) -> Result<usize> {
        let count = i32::try_from(iov.len())
            .map_err(|_| Error::new(errno::EINVAL, format!("{} segments", iov.len())))?;
        self.submit(user_data, |q, ud, err| unsafe {
            // SAFETY: the caller keeps the segments valid until completion;
            // the iovec array is copied by the library.
            if write {
                sys::qcow2_queue_writev(q, offset, iov.as_ptr(), count, ud, err)
            } else {
                sys::qcow2_queue_readv(q, offset, iov.as_ptr(), count, ud, err)
            }
        })
    }

    /// Describes `buffers` as iovecs (on the stack when few) and submits.
    fn submit_owned(
        &mut self,
        write: bool,
        offset: u64,
        mut buffers: Vec<B>,
        user_data: u64,
        ptr_of: fn(&mut B) -> *mut c_void,
    ) -> std::result::Result<(), Rejected<B>> {
        let mut stack = [sys::iovec { iov_base: ptr::null_mut(), iov_len: 0 }; STACK_IOVS];
        let mut heap = Vec::new();
        let iov: &mut [sys::iovec] = if buffers.len() <= STACK_IOVS {
            &mut stack[..buffers.len()]
        } else {
            heap.resize(buffers.len(), stack[0]);
            &mut heap
        };
        for (v, b) in iov.iter_mut().zip(buffers.iter_mut()) {
            *v = sys::iovec { iov_base: ptr_of(b), iov_len: b.len() };
        }
        match self.submit_iov(write, offset, iov, user_data) {
            Ok(i) => {
                // Moving the Vec<B> leaves each buffer's bytes in place
                // (IoBuf's contract), where the iovecs point.
                self.slots[i].buffers = buffers;
                Ok(())
            }
            Err(error) => Err(Rejected { error, buffers }),
        }
    }

    /// Submits a vectored write of `buffers` at `offset`, in order. The
    /// queue holds them until the completion, which gives them back.
    /// A refused submit (`EAGAIN`: full; `EIO`: past the end; `EPERM`:
    /// read-only) gives them back at once, with no completion to come.
    pub fn writev_owned(
        &mut self,
        offset: u64,
        buffers: Vec<B>,
        user_data: u64,
    ) -> std::result::Result<(), Rejected<B>> {
        self.submit_owned(true, offset, buffers, user_data, |b| b.as_ptr() as *mut c_void)
    }

    /// Submits a vectored read into `buffers` at `offset`; the queue
    /// holds them until the completion, which gives them back filled. A
    /// refused submit gives them back at once.
    pub fn readv_owned(
        &mut self,
        offset: u64,
        buffers: Vec<B>,
        user_data: u64,
    ) -> std::result::Result<(), Rejected<B>>
    where
        B: IoBufMut,
    {
        self.submit_owned(false, offset, buffers, user_data, |b| b.as_mut_ptr().cast())
    }

    /// Submits a vectored read into borrowed segments.
    ///
    /// # Safety
    ///
    /// The memory the segments point to must stay valid, and must be
    /// neither read nor written by anything else, until this request's
    /// completion is returned by [`poll`](Self::poll) or
    /// [`wait`](Self::wait), or the queue is dropped (which waits for it).
    /// Leaking the queue (`mem::forget`) while the request is in flight
    /// leaves the kernel free to write the memory at any later time: it
    /// must then never be freed. The slice of `IoSliceMut` itself may be
    /// reused at once.
    pub unsafe fn readv(
        &mut self,
        offset: u64,
        segments: &mut [IoSliceMut<'_>],
        user_data: u64,
    ) -> Result<()> {
        // IoSliceMut is ABI-compatible with struct iovec on Unix.
        // SAFETY: same layout, same length, borrowed for this call.
        let iov = unsafe { std::slice::from_raw_parts(segments.as_ptr().cast(), segments.len()) };
        self.submit_iov(false, offset, iov, user_data).map(drop)
    }

    /// Submits a vectored write from borrowed segments.
    ///
    /// # Safety
    ///
    /// The memory the segments point to must stay valid and unchanged
    /// until this request's completion is returned by
    /// [`poll`](Self::poll) or [`wait`](Self::wait), or the queue is
    /// dropped (which waits for it). Leaking the queue while the request
    /// is in flight leaves the kernel free to read the memory later. The
    /// slice of `IoSlice` itself may be reused at once.
    pub unsafe fn writev(&mut self, offset: u64, segments: &[IoSlice<'_>], user_data: u64) -> Result<()> {
        // IoSlice is ABI-compatible with struct iovec on Unix.
        // SAFETY: same layout, same length, borrowed for this call.
        let iov = unsafe { std::slice::from_raw_parts(segments.as_ptr().cast(), segments.len()) };
        self.submit_iov(true, offset, iov, user_data).map(drop)
    }

    /// Submits a write-zeroes of `len` bytes at `offset` (the range reads
    /// as zeros, never as backing data; `unmap`: host clusters may go).
    pub fn write_zeroes(&mut self, offset: u64, len: u64, unmap: bool, user_data: u64) -> Result<()> {
        self.submit(user_data, |q, ud, err| unsafe {
            // SAFETY: a live queue; no buffers.
            sys::qcow2_queue_write_zeroes(q, offset, len, unmap as i32, ud, err)
        })
        .map(drop)
    }

    /// Submits a discard of `len` bytes at `offset`.
    pub fn discard(&mut self, offset: u64, len: u64, user_data: u64) -> Result<()> {
        self.submit(user_data, |q, ud, err| unsafe {
            // SAFETY: a live queue; no buffers.
            sys::qcow2_queue_discard(q, offset, len, ud, err)
        })
        .map(drop)
    }

    /// Submits a flush: it completes after every write whose completion
    /// was polled before it is durable.
    pub fn flush(&mut self, user_data: u64) -> Result<()> {
        self.submit(user_data, |q, ud, err| unsafe {
            // SAFETY: a live queue; no buffers.
            sys::qcow2_queue_flush(q, ud, err)
        })
        .map(drop)
    }

    /// Moves requests on and appends up to `max` finished ones to `out`;
    /// never blocks. Returns how many it appended (0: none yet).
    pub fn poll(&mut self, out: &mut Vec<Completion<B>>, max: usize) -> usize {
        self.reap(out, max, 0)
    }

    /// As [`poll`](Self::poll), but blocks until at least `min` are
    /// appended (fewer when fewer requests are in flight).
    pub fn wait(&mut self, out: &mut Vec<Completion<B>>, max: usize, min: usize) -> usize {
        self.reap(out, max, min.min(max))
    }

    fn reap(&mut self, out: &mut Vec<Completion<B>>, max: usize, min: usize) -> usize {
        // Left uninitialised: the library writes the first n entries.
        let mut batch: [MaybeUninit<sys::qcow2_completion_t>; BATCH] =
            // SAFETY: an array of MaybeUninit needs no initialisation.
            unsafe { MaybeUninit::uninit().assume_init() };
        let mut got = 0;
        while got < max {
            let want = (max - got).min(BATCH);
            let need = min.saturating_sub(got).min(want);
            // SAFETY: a live queue; `batch` holds `want` entries.
            let n = unsafe {
                sys::qcow2_queue_wait(self.raw.as_ptr(), batch.as_mut_ptr().cast(), want as i32, need as i32)
            };
            let n = n.max(0) as usize;
            for c in &batch[..n] {
                // SAFETY: the library stored entries 0..n.
                out.push(self.complete(unsafe { c.assume_init_ref() }));
            }
            got += n;
            if n < want {
                break;
            }
        }
        got
    }

    /// The completion of slot `c.user_data`, which is freed.
    fn complete(&mut self, c: &sys::qcow2_completion_t) -> Completion<B> {
        let i = c.user_data as usize;
        self.free.push(i);
        let slot = &mut self.slots[i];
        Completion {
            user_data: slot.user_data,
            result: c.result,
            buffers: std::mem::take(&mut slot.buffers),
        }
    }
}

impl<B> AsRawFd for Queue<'_, B> {
    /// The queue's eventfd (non-blocking, close-on-exec): never close it.
    fn as_raw_fd(&self) -> RawFd {
        self.event_fd
    }
}

impl<B> AsFd for Queue<'_, B> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the fd stays open as long as the queue.
        unsafe { BorrowedFd::borrow_raw(self.event_fd) }
    }
}

impl<B> Drop for Queue<'_, B> {
    fn drop(&mut self) {
        // SAFETY: we own the handle. It waits for every request in flight,
        // so the buffers the slots hold are free to drop afterwards.
        unsafe { sys::qcow2_queue_destroy(self.raw.as_ptr()) }
    }
}

impl<B> std::fmt::Debug for Queue<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").field("event_fd", &self.event_fd).finish()
    }
}
