// SPDX-License-Identifier: Apache-2.0
//! Live stream and live commit: the chain shortened while queues on other
//! threads keep reading and writing the image.
use crate::error::{check, Result};
use crate::image::Image;
use qcow2_sys as sys;
use std::any::Any;
use std::os::raw::c_void;
use std::panic::{self, AssertUnwindSafe};
use std::ptr::{self, NonNull};

/// Cancels a running live job from any thread: the job returns
/// `ECANCELED` at its next chunk, the chain as it was.
pub struct LiveControl {
    raw: NonNull<sys::qcow2_live_control_t>,
}

// SAFETY: c.h: cancel may be called from any thread; destroy needs
// ownership, and a job borrows the control for its whole run.
unsafe impl Send for LiveControl {}
unsafe impl Sync for LiveControl {}

impl LiveControl {
    /// A new control, not cancelled.
    pub fn new() -> LiveControl {
        // SAFETY: no preconditions; null only when memory is exhausted.
        let raw = unsafe { sys::qcow2_live_control_create() };
        LiveControl { raw: NonNull::new(raw).expect("qcow2_live_control_create: out of memory") }
    }

    pub(crate) fn as_raw(&self) -> *mut sys::qcow2_live_control_t {
        self.raw.as_ptr()
    }

    /// Stops the job using this control at its next chunk.
    pub fn cancel(&self) {
        // SAFETY: a live control; thread-safe.
        unsafe { sys::qcow2_live_control_cancel(self.raw.as_ptr()) }
    }
}

impl Default for LiveControl {
    fn default() -> Self {
        LiveControl::new()
    }
}

impl Drop for LiveControl {
    fn drop(&mut self) {
        // SAFETY: owned, and no job borrows it any more.
        unsafe { sys::qcow2_live_control_destroy(self.raw.as_ptr()) }
    }
}

impl std::fmt::Debug for LiveControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LiveControl")
    }
}

/// The progress callback: bytes of the disk done, and in all. Called on
/// the job's threads, one call at a time.
pub type Progress<'a> = &'a mut (dyn FnMut(u64, u64) + Send);

/// Options of a live stream or commit; the defaults are the library's
/// (1 MiB chunks, 2 in flight, no rate limit).
///
/// ```no_run
/// use qcow2::{LiveControl, LiveOptions, OpenOptions};
/// let image = OpenOptions::new().read_write(true).open("top.qcow2")?;
/// let control = LiveControl::new();
/// let mut report = |done: u64, total: u64| eprintln!("{}/{}", done, total);
/// std::thread::scope(|s| {
///     let job = s.spawn(|| {
///         let opts = LiveOptions::new().rate_limit(100 << 20).control(&control).progress(&mut report);
///         image.live_stream(image.chain_length(), opts) // the whole chain into the top
///     });
///     // control.cancel() from here would stop it with ECANCELED.
///     job.join().unwrap()
/// })?;
/// # Ok::<(), qcow2::Error>(())
/// ```
#[derive(Default)]
pub struct LiveOptions<'a> {
    chunk: u64,
    depth: u32,
    rate_limit: u64,
    control: Option<&'a LiveControl>,
    progress: Option<Progress<'a>>,
}

impl<'a> LiveOptions<'a> {
    /// The library's defaults.
    pub fn new() -> LiveOptions<'a> {
        LiveOptions::default()
    }

    /// Bytes per chunk (a multiple of 512; 0: 1 MiB).
    pub fn chunk(mut self, bytes: u64) -> Self {
        self.chunk = bytes;
        self
    }

    /// Chunks in flight, each on its own thread (0: 2).
    pub fn depth(mut self, chunks: u32) -> Self {
        self.depth = chunks;
        self
    }

    /// Bytes per second (0: no limit).
    pub fn rate_limit(mut self, bytes_per_second: u64) -> Self {
        self.rate_limit = bytes_per_second;
        self
    }

    /// A control to cancel the job from another thread.
    pub fn control(mut self, control: &'a LiveControl) -> Self {
        self.control = Some(control);
        self
    }

    /// A progress callback. A panic inside it stops further calls and
    /// resumes once the job has returned.
    pub fn progress(mut self, f: Progress<'a>) -> Self {
        self.progress = Some(f);
        self
    }
}

impl std::fmt::Debug for LiveOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveOptions")
            .field("chunk", &self.chunk)
            .field("depth", &self.depth)
            .field("rate_limit", &self.rate_limit)
            .finish()
    }
}

/// What the C progress trampoline reaches: the callback, and a panic it
/// raised.
struct ProgressState<'a> {
    f: Progress<'a>,
    panic: Option<Box<dyn Any + Send>>,
}

unsafe extern "C" fn progress_trampoline(data: *mut c_void, done: u64, total: u64) {
    // SAFETY: `data` is the ProgressState the job borrows; the library
    // makes one call at a time, so this is the only reference meanwhile.
    let state = unsafe { &mut *(data as *mut ProgressState<'_>) };
    if state.panic.is_some() {
        return;
    }
    let f = &mut state.f;
    // Unwinding into C is undefined: keep the panic for after the job.
    if let Err(p) = panic::catch_unwind(AssertUnwindSafe(|| f(done, total))) {
        state.panic = Some(p);
    }
}

impl Image {
    /// Live stream: pulls into the top what layers 1..base-1 allocate (and
    /// the top does not); the layer at depth `base` becomes the top's
    /// backing file, or none when `base` is [`chain_length`](Self::chain_length).
    /// Blocks this thread until done; queues on other threads keep running.
    pub fn live_stream(&self, base: u32, opts: LiveOptions<'_>) -> Result<()> {
        self.live_job(base, opts, sys::qcow2_image_live_stream)
    }

    /// Live commit: writes what layers 1..base-1 allocate into the layer at
    /// depth `base` (2 <= base < chain length), which becomes the top's
    /// backing file. Base 1 is [`live_commit_active`](Self::live_commit_active)`(1, ..)`.
    pub fn live_commit(&self, base: u32, opts: LiveOptions<'_>) -> Result<()> {
        self.live_job(base, opts, sys::qcow2_image_live_commit)
    }

    /// Active commit with its pivot (`virsh blockcommit --active --pivot`):
    /// writes what layers 0..base-1 (the top included) allocate into the
    /// layer at depth `base` (1 <= base < chain length) while the guest
    /// keeps writing, copying again what the guest changes, then makes that
    /// layer the top: writes land in it from then on, and layers 0..base-1
    /// leave the chain. The progress total grows with each pass.
    /// `ECANCELED`: the chain as it was. `ENOTSUP` for a base whose size is
    /// not the disk's.
    pub fn live_commit_active(&self, base: u32, opts: LiveOptions<'_>) -> Result<()> {
        self.live_job(base, opts, sys::qcow2_image_live_commit_active)
    }

    fn live_job(
        &self,
        base: u32,
        opts: LiveOptions<'_>,
        job: unsafe extern "C" fn(
            *mut sys::qcow2_image_t,
            i32,
            *const sys::qcow2_live_options_t,
            *mut *mut sys::c_char,
        ) -> i32,
    ) -> Result<()> {
        let mut state = opts.progress.map(|f| ProgressState { f, panic: None });
        let c = sys::qcow2_live_options_t {
            size: std::mem::size_of::<sys::qcow2_live_options_t>(),
            chunk: opts.chunk,
            depth: opts.depth.min(i32::MAX as u32) as i32,
            rate_limit: opts.rate_limit,
            progress: state.as_ref().map(|_| progress_trampoline as _),
            progress_data: state.as_mut().map_or(ptr::null_mut(), |s| s as *mut ProgressState<'_> as *mut c_void),
            control: opts.control.map_or(ptr::null_mut(), |c| c.raw.as_ptr()),
        };
        let base = base.min(i32::MAX as u32) as i32;
        // SAFETY: the options, the progress state and the control outlive
        // the call, which blocks until the job has ended.
        let rc = check(|err| unsafe { job(self.as_raw(), base, &c, err) });
        if let Some(p) = state.and_then(|s| s.panic) {
            panic::resume_unwind(p);
        }
        rc.map(drop)
    }
}
