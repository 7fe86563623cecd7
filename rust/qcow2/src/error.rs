// SPDX-License-Identifier: Apache-2.0
//! One error type for every call: the errno to branch on and the
//! library's message to show.
use std::ffi::CStr;
use std::fmt;
use std::io;
use std::os::raw::{c_char, c_int};
use std::ptr;

/// The errno values the library reports (Linux's numbers; the library
/// runs on Linux only).
pub mod errno {
    /// Image read-only, closed, or marked corrupt.
    pub const EPERM: i32 = 1;
    /// A file does not exist.
    pub const ENOENT: i32 = 2;
    /// Request past the end of the disk, malformed image, I/O error.
    pub const EIO: i32 = 5;
    /// Queue full: poll, then submit again.
    pub const EAGAIN: i32 = 11;
    /// The OS refused access.
    pub const EACCES: i32 = 13;
    /// The image is locked by another process (QEMU's locks).
    pub const EBUSY: i32 = 16;
    /// Create: the file exists.
    pub const EEXIST: i32 = 17;
    /// Bad argument or option (unknown key, bad value).
    pub const EINVAL: i32 = 22;
    /// No space left on the host file system.
    pub const ENOSPC: i32 = 28;
    /// A feature the library does not implement.
    pub const ENOTSUP: i32 = 95;
    /// A live stream or commit was cancelled.
    pub const ECANCELED: i32 = 125;
}

/// An error of libqcow2: a positive errno (see [`errno`]) and the message
/// naming what is wrong and where (the path, the guest offset, the option).
///
/// Converts into [`std::io::Error`] with the errno's
/// [`ErrorKind`](io::ErrorKind), keeping this error inside:
///
/// ```
/// let e = qcow2::Image::open("/nonexistent/disk.qcow2").unwrap_err();
/// assert_eq!(e.errno(), qcow2::errno::ENOENT);
/// let io: std::io::Error = e.into();
/// assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    errno: i32,
    message: String,
}

/// The result of every fallible call.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error with `errno` (positive) and `message`.
    pub fn new(errno: i32, message: impl Into<String>) -> Error {
        Error { errno, message: message.into() }
    }

    /// An error from a negative errno the library returned without a
    /// message (queue completions): the message is the OS's text.
    pub fn from_errno(errno: i32) -> Error {
        Error { errno, message: io::Error::from_raw_os_error(errno).to_string() }
    }

    /// The errno (positive), e.g. [`errno::EBUSY`].
    pub fn errno(&self) -> i32 {
        self.errno
    }

    /// The library's message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The [`io::ErrorKind`] of the errno.
    pub fn kind(&self) -> io::ErrorKind {
        io::Error::from_raw_os_error(self.errno).kind()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Error {{ errno: {}, message: {:?} }}", self.errno, self.message)
    }
}

impl std::error::Error for Error {}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        io::Error::new(e.kind(), e)
    }
}

/// The `char** errptr` of one C call: collects the message and frees it.
pub(crate) struct ErrPtr(*mut c_char);

impl ErrPtr {
    pub(crate) fn new() -> ErrPtr {
        ErrPtr(ptr::null_mut())
    }

    pub(crate) fn as_mut_ptr(&mut self) -> *mut *mut c_char {
        &mut self.0
    }

    /// The error for return code `rc` (negative errno), with the message
    /// the call stored, if any.
    pub(crate) fn into_error(self, rc: c_int) -> Error {
        let errno = rc.checked_neg().filter(|e| *e > 0).unwrap_or(errno::EIO);
        if self.0.is_null() {
            return Error::from_errno(errno);
        }
        // SAFETY: the library stores a NUL-terminated string it allocated.
        let message = unsafe { CStr::from_ptr(self.0) }.to_string_lossy().into_owned();
        Error { errno, message }
    }
}

impl Drop for ErrPtr {
    fn drop(&mut self) {
        // Most calls succeed: no call into the library for nothing.
        if !self.0.is_null() {
            // SAFETY: a string the library allocated, freed once.
            unsafe { qcow2_sys::qcow2_free(self.0.cast()) }
        }
    }
}

/// Runs one C call that takes `errptr` last and returns an int: Ok with
/// the value when it is not negative, else its error.
pub(crate) fn check(call: impl FnOnce(*mut *mut c_char) -> c_int) -> Result<c_int> {
    let mut err = ErrPtr::new();
    let rc = call(err.as_mut_ptr());
    if rc >= 0 {
        Ok(rc)
    } else {
        Err(err.into_error(rc))
    }
}

/// A C string of `s` for the library; a NUL inside is an EINVAL naming
/// `what`.
pub(crate) fn c_string(what: &str, s: &[u8]) -> Result<std::ffi::CString> {
    std::ffi::CString::new(s).map_err(|_| {
        Error::new(
            errno::EINVAL,
            format!("{} '{}' contains a NUL byte", what, String::from_utf8_lossy(s)),
        )
    })
}
