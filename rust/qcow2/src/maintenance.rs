// SPDX-License-Identifier: Apache-2.0
//! Persistent dirty bitmaps, internal snapshots, and the offline
//! maintenance calls (check, measure, commit, rebase, stream) of c.h.
use crate::error::{c_string, check, Result};
use crate::image::Image;
use crate::live::LiveControl;
use crate::options::{CreateOptions, Format, OpenOptions};
use qcow2_sys as sys;
use std::ffi::{CStr, CString};
use std::mem;
use std::os::raw::{c_char, c_void};
use std::os::unix::ffi::OsStrExt;
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::ptr;

/// Takes a string the library allocated, freeing it.
fn take_string(p: *mut c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: a NUL-terminated string the library allocated, freed once.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    unsafe { sys::qcow2_free(p.cast()) };
    s
}

fn name_c(name: &str) -> Result<CString> {
    c_string("name", name.as_bytes())
}

fn path_c(path: &Path) -> Result<CString> {
    c_string("path", path.as_os_str().as_bytes())
}

fn opt_path_c(path: Option<&Path>) -> Result<Option<CString>> {
    path.map(path_c).transpose()
}

fn ptr_of(s: &Option<CString>) -> *const c_char {
    s.as_ref().map_or(ptr::null(), |s| s.as_ptr())
}

/// One persistent dirty bitmap of the top image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BitmapInfo {
    /// Its name.
    pub name: String,
    /// Bytes per bit.
    pub granularity: u64,
    /// Writes set its bits.
    pub enabled: bool,
    /// Found in use (inconsistent): it can only be removed.
    pub in_use: bool,
}

/// The dirty state of a range of a bitmap.
#[derive(Debug, Copy, Clone, PartialEq, Eq)]
pub struct BitmapStatus {
    /// Guest offset of the range.
    pub offset: u64,
    /// Bytes with this state.
    pub length: u64,
    /// Written since the bitmap was cleared.
    pub dirty: bool,
}

/// One internal snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Its id ("1", "2" ... unless given).
    pub id: String,
    /// Its name.
    pub name: String,
    /// Bytes of VM state (0: disk only).
    pub vm_state_size: u64,
    /// Creation time: seconds and nanoseconds since the epoch.
    pub date: (u32, u32),
    /// Guest clock at creation, nanoseconds.
    pub vm_clock_nsec: u64,
    /// Virtual size of the disk it holds.
    pub disk_size: u64,
    /// Instruction count at creation, when recorded.
    pub icount: Option<u64>,
}

impl Image {
    /// The persistent dirty bitmaps of the top image, in directory order.
    /// Safe beside requests in flight.
    pub fn bitmaps(&self) -> Result<Vec<BitmapInfo>> {
        // SAFETY: a live handle.
        let n = check(|err| unsafe { sys::qcow2_image_bitmap_count(self.as_raw(), err) })?;
        (0..n).map(|i| self.bitmap_info(i)).collect()
    }

    fn bitmap_info(&self, index: i32) -> Result<BitmapInfo> {
        let mut out = sys::qcow2_bitmap_info_t {
            size: mem::size_of::<sys::qcow2_bitmap_info_t>(),
            name: ptr::null_mut(),
            granularity: 0,
            enabled: 0,
            in_use: 0,
        };
        // SAFETY: a sized struct alive for the call.
        check(|err| unsafe { sys::qcow2_image_bitmap_info(self.as_raw(), index, &mut out, err) })?;
        Ok(BitmapInfo {
            name: take_string(out.name),
            granularity: out.granularity,
            enabled: out.enabled != 0,
            in_use: out.in_use != 0,
        })
    }

    /// The dirty state of bitmap `name` at `offset`, as long as it stays
    /// uniform, at most `max_len` bytes. `ENOENT` if there is no such bitmap.
    pub fn bitmap_status(&self, name: &str, offset: u64, max_len: u64) -> Result<BitmapStatus> {
        let name = name_c(name)?;
        let mut out = sys::qcow2_bitmap_status_t {
            size: mem::size_of::<sys::qcow2_bitmap_status_t>(),
            ..Default::default()
        };
        check(|err| unsafe {
            // SAFETY: a sized struct and a C string alive for the call.
            sys::qcow2_image_bitmap_status(self.as_raw(), name.as_ptr(), offset, max_len, &mut out, err)
        })?;
        Ok(BitmapStatus { offset: out.offset, length: out.length, dirty: out.dirty != 0 })
    }

    /// Creates bitmap `name` (granularity 0: the cluster size, at least
    /// 4 KiB), recording writes when `enabled`. `EEXIST` if it exists.
    pub fn bitmap_add(&self, name: &str, granularity: u64, enabled: bool) -> Result<()> {
        let name = name_c(name)?;
        check(|err| unsafe {
            // SAFETY: a C string alive for the call.
            sys::qcow2_image_bitmap_add(self.as_raw(), name.as_ptr(), granularity, enabled as i32, err)
        })
        .map(drop)
    }

    fn bitmap_edit(
        &self,
        name: &str,
        f: unsafe extern "C" fn(*mut sys::qcow2_image_t, *const c_char, *mut *mut c_char) -> i32,
    ) -> Result<()> {
        let name = name_c(name)?;
        // SAFETY: a C string alive for the call.
        check(|err| unsafe { f(self.as_raw(), name.as_ptr(), err) }).map(drop)
    }

    /// Removes bitmap `name`.
    pub fn bitmap_remove(&self, name: &str) -> Result<()> {
        self.bitmap_edit(name, sys::qcow2_image_bitmap_remove)
    }

    /// Clears every bit of bitmap `name`.
    pub fn bitmap_clear(&self, name: &str) -> Result<()> {
        self.bitmap_edit(name, sys::qcow2_image_bitmap_clear)
    }

    /// Makes bitmap `name` record writes.
    pub fn bitmap_enable(&self, name: &str) -> Result<()> {
        self.bitmap_edit(name, sys::qcow2_image_bitmap_enable)
    }

    /// Stops bitmap `name` recording writes.
    pub fn bitmap_disable(&self, name: &str) -> Result<()> {
        self.bitmap_edit(name, sys::qcow2_image_bitmap_disable)
    }

    /// Marks dirty in bitmap `target` every granule that bitmap `source`
    /// of `source_image` (`None`: this image) has dirty.
    pub fn bitmap_merge(&self, target: &str, source: &str, source_image: Option<&Image>) -> Result<()> {
        let (target, source) = (name_c(target)?, name_c(source)?);
        let src = source_image.map_or(ptr::null_mut(), |i| i.as_raw());
        check(|err| unsafe {
            // SAFETY: C strings and handles alive for the call.
            sys::qcow2_image_bitmap_merge(self.as_raw(), target.as_ptr(), source.as_ptr(), src, err)
        })
        .map(drop)
    }

    /// The internal snapshots of the top image, in table order.
    pub fn snapshots(&self) -> Result<Vec<SnapshotInfo>> {
        // SAFETY: a live handle.
        let n = check(|err| unsafe { sys::qcow2_image_snapshot_count(self.as_raw(), err) })?;
        (0..n).map(|i| self.snapshot_info(i)).collect()
    }

    fn snapshot_info(&self, index: i32) -> Result<SnapshotInfo> {
        let mut out = sys::qcow2_snapshot_info_t {
            size: mem::size_of::<sys::qcow2_snapshot_info_t>(),
            id: ptr::null_mut(),
            name: ptr::null_mut(),
            vm_state_size: 0,
            date_sec: 0,
            date_nsec: 0,
            vm_clock_nsec: 0,
            disk_size: 0,
            has_icount: 0,
            icount: 0,
        };
        // SAFETY: a sized struct alive for the call.
        check(|err| unsafe { sys::qcow2_image_snapshot_info(self.as_raw(), index, &mut out, err) })?;
        Ok(SnapshotInfo {
            id: take_string(out.id),
            name: take_string(out.name),
            vm_state_size: out.vm_state_size,
            date: (out.date_sec, out.date_nsec),
            vm_clock_nsec: out.vm_clock_nsec,
            disk_size: out.disk_size,
            icount: if out.has_icount != 0 { Some(out.icount) } else { None },
        })
    }

    /// Creates internal snapshot `name` (`id` `None`: the next numeric
    /// id). Needs a writable image with no queue open (`EPERM`).
    pub fn snapshot_create(&self, name: &str, id: Option<&str>) -> Result<()> {
        let name = name_c(name)?;
        let id = id.map(name_c).transpose()?;
        check(|err| unsafe {
            // SAFETY: C strings alive for the call.
            sys::qcow2_image_snapshot_create(self.as_raw(), name.as_ptr(), ptr_of(&id), err)
        })
        .map(drop)
    }

    /// Reverts the disk to the snapshot with this id, or else this name.
    pub fn snapshot_apply(&self, name_or_id: &str) -> Result<()> {
        self.bitmap_edit(name_or_id, sys::qcow2_image_snapshot_apply)
    }

    /// Deletes the snapshot with this id, or else this name.
    pub fn snapshot_delete(&self, name_or_id: &str) -> Result<()> {
        self.bitmap_edit(name_or_id, sys::qcow2_image_snapshot_delete)
    }
}

/// What [`check_image`] repairs.
#[derive(Debug, Copy, Clone, PartialEq, Eq)]
pub enum Repair {
    /// Nothing: report only (the image is opened read-only).
    None,
    /// Leaked clusters (qemu-img check -r leaks).
    Leaks,
    /// Everything (qemu-img check -r all).
    All,
}

/// qemu-img check's report.
#[derive(Debug, Clone)]
pub struct CheckReport {
    /// The raw counters, as c.h fills them.
    pub counters: sys::qcow2_check_report_t,
    /// The lines qemu-img would print to stderr, each ending in '\n'.
    pub messages: String,
}

impl CheckReport {
    /// qemu-img check's exit status: 0 clean, 1 the check failed, 2
    /// corruptions, 3 leaked clusters only.
    pub fn verdict(&self) -> i32 {
        self.counters.verdict
    }

    /// Neither corruptions, nor leaks, nor check errors.
    pub fn is_clean(&self) -> bool {
        self.counters.verdict == 0
    }
}

/// Checks the qcow2 image at `path` as qemu-img check does, repairing as
/// `repair` says. Problems found are in the report; the call fails only
/// when the image cannot be checked at all (`ENOENT`, `EINVAL` not
/// qcow2, `EIO`, `ENOTSUP`, `EBUSY` locked).
pub fn check_image(path: impl AsRef<Path>, repair: Repair) -> Result<CheckReport> {
    let path = path_c(path.as_ref())?;
    let repair = match repair {
        Repair::None => sys::QCOW2_REPAIR_NONE,
        Repair::Leaks => sys::QCOW2_REPAIR_LEAKS,
        Repair::All => sys::QCOW2_REPAIR_ALL,
    };
    let mut out = sys::qcow2_check_report_t {
        size: mem::size_of::<sys::qcow2_check_report_t>(),
        ..Default::default()
    };
    let mut messages: *mut c_char = ptr::null_mut();
    let rc = check(|err| unsafe {
        // SAFETY: a sized struct, a C string and an out pointer alive for the call.
        sys::qcow2_check(path.as_ptr(), repair, &mut out, &mut messages, err)
    });
    let messages = take_string(messages);
    rc.map(|_| CheckReport { counters: out, messages })
}

/// qemu-img measure's answer: the bytes a new image needs.
#[derive(Debug, Copy, Clone, PartialEq, Eq)]
pub struct Measure {
    /// Bytes for its data and metadata.
    pub required: u64,
    /// Bytes when fully allocated.
    pub fully_allocated: u64,
    /// Bytes of persistent bitmaps, when both sides carry them.
    pub bitmaps: Option<u64>,
}

impl CreateOptions {
    /// qemu-img measure: the bytes an image created with these options
    /// needs, empty (its [`size`](Self::size)) or holding `source`'s data.
    pub fn measure(&self, source: Option<&Image>) -> Result<Measure> {
        let options = self.options_c_string()?;
        let mut out = sys::qcow2_measure_t { size: mem::size_of::<sys::qcow2_measure_t>(), ..Default::default() };
        let src = source.map_or(ptr::null_mut(), |i| i.as_raw());
        check(|err| unsafe {
            // SAFETY: a sized struct, a C string and a handle alive for the call.
            sys::qcow2_measure(options.as_ptr(), self.size_bytes(), src, &mut out, err)
        })?;
        Ok(Measure {
            required: out.required,
            fully_allocated: out.fully_allocated,
            bitmaps: if out.has_bitmaps != 0 { Some(out.bitmaps) } else { None },
        })
    }
}

/// Options of the offline chain operations ([`commit`], [`rebase`],
/// [`stream`]); the defaults are the library's.
#[derive(Default)]
pub struct ChainOptions<'a> {
    /// How to open the images (`None`: read-write defaults).
    pub open: Option<OpenOptions>,
    /// Chunks in flight (0: 16).
    pub depth: u32,
    /// Bytes per chunk (0: 1 MiB).
    pub chunk: u64,
    /// Cancels the operation (`ECANCELED`) from another thread.
    pub control: Option<&'a LiveControl>,
    /// Progress: the fraction done, 0 to 1.
    pub progress: Option<&'a mut (dyn FnMut(f64) + Send)>,
}

impl std::fmt::Debug for ChainOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChainOptions").field("depth", &self.depth).field("chunk", &self.chunk).finish()
    }
}

struct ChainProgress<'a> {
    f: &'a mut (dyn FnMut(f64) + Send),
    panic: Option<Box<dyn std::any::Any + Send>>,
}

unsafe extern "C" fn chain_progress(data: *mut c_void, fraction: f64) {
    // SAFETY: the ChainProgress the call borrows, one call at a time.
    let state = unsafe { &mut *(data as *mut ChainProgress<'_>) };
    if state.panic.is_none() {
        let f = &mut state.f;
        if let Err(p) = panic::catch_unwind(AssertUnwindSafe(|| f(fraction))) {
            state.panic = Some(p);
        }
    }
}

/// Runs one chain operation with `opts` made into C options.
fn with_chain_options(
    opts: ChainOptions<'_>,
    call: impl FnOnce(*const sys::qcow2_chain_op_options_t) -> Result<i32>,
) -> Result<i32> {
    let open = opts.open.as_ref().map(|o| o.options_c_string()).transpose()?;
    let mut state = opts.progress.map(|f| ChainProgress { f, panic: None });
    let c = sys::qcow2_chain_op_options_t {
        size: mem::size_of::<sys::qcow2_chain_op_options_t>(),
        open_options: ptr_of(&open),
        depth: opts.depth.min(i32::MAX as u32) as i32,
        chunk: opts.chunk,
        progress: state.as_ref().map(|_| chain_progress as _),
        progress_data: state.as_mut().map_or(ptr::null_mut(), |s| s as *mut ChainProgress<'_> as *mut c_void),
        control: opts.control.map_or(ptr::null_mut(), |c| c.as_raw()),
    };
    let rc = call(&c);
    if let Some(p) = state.and_then(|s| s.panic) {
        panic::resume_unwind(p);
    }
    rc
}

/// qemu-img commit of the image at `path` into `base` (`None`: its
/// backing file). With `keep_top` false the top is emptied afterwards;
/// returns whether it was.
pub fn commit(path: impl AsRef<Path>, base: Option<&Path>, keep_top: bool, opts: ChainOptions<'_>) -> Result<bool> {
    let path = path_c(path.as_ref())?;
    let base = opt_path_c(base)?;
    let mut emptied = 0;
    with_chain_options(opts, |o| {
        check(|err| unsafe {
            // SAFETY: C strings and options alive for the call.
            sys::qcow2_commit(path.as_ptr(), ptr_of(&base), keep_top as i32, o, &mut emptied, err)
        })
    })?;
    Ok(emptied != 0)
}

/// qemu-img rebase of the image at `path` onto `backing` (`None`: no
/// backing file). `unsafe_names_only` rewrites the name only (-u).
pub fn rebase(
    path: impl AsRef<Path>,
    backing: Option<(&Path, Format)>,
    unsafe_names_only: bool,
    opts: ChainOptions<'_>,
) -> Result<()> {
    let path = path_c(path.as_ref())?;
    let name = opt_path_c(backing.map(|b| b.0))?;
    let format = backing.map(|b| CString::new(b.1.name()).expect("no NUL"));
    with_chain_options(opts, |o| {
        check(|err| unsafe {
            // SAFETY: C strings and options alive for the call.
            sys::qcow2_rebase(path.as_ptr(), ptr_of(&name), ptr_of(&format), unsafe_names_only as i32, o, err)
        })
    })
    .map(drop)
}

/// Offline block-stream: pulls into the image at `path` what lies above
/// `base` in its chain (`None`: the whole chain), and makes `base` its
/// backing file.
pub fn stream(path: impl AsRef<Path>, base: Option<&Path>, opts: ChainOptions<'_>) -> Result<()> {
    let path = path_c(path.as_ref())?;
    let base = opt_path_c(base)?;
    with_chain_options(opts, |o| {
        check(|err| unsafe {
            // SAFETY: C strings and options alive for the call.
            sys::qcow2_stream(path.as_ptr(), ptr_of(&base), o, err)
        })
    })
    .map(drop)
}
