// SPDX-License-Identifier: Apache-2.0
//! Typed builders for the option strings of `qcow2_image_create` (qemu-img's
//! `-o` keys) and `qcow2_image_open_opts`.
use crate::error::{c_string, check, errno, Error, Result};
use crate::image::Image;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr;

/// The format of a file: qcow2, or raw (a plain disk file).
#[derive(Debug, Copy, Clone, PartialEq, Eq)]
pub enum Format {
    /// A qcow2 image.
    Qcow2,
    /// A raw disk file.
    Raw,
}

impl Format {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Format::Qcow2 => "qcow2",
            Format::Raw => "raw",
        }
    }
}

/// The qcow2 version written by create (`compat=`).
#[derive(Debug, Copy, Clone, PartialEq, Eq)]
pub enum Compat {
    /// Version 3 (`compat=1.1`), the default.
    V3,
    /// Version 2 (`compat=0.10`): no zero clusters, extended L2 or zstd.
    V2,
}

/// How compressed clusters are compressed (`compression_type=`).
#[derive(Debug, Copy, Clone, PartialEq, Eq)]
pub enum Compression {
    /// Deflate, readable by every QEMU.
    Zlib,
    /// Zstandard (QEMU 5.1 and later).
    Zstd,
}

/// What create allocates up front (`preallocation=`).
#[derive(Debug, Copy, Clone, PartialEq, Eq)]
pub enum Preallocation {
    /// Nothing (the default).
    Off,
    /// The metadata of every cluster.
    Metadata,
    /// Metadata, and the data clusters with fallocate.
    Falloc,
    /// Metadata, and the data clusters written with zeros.
    Full,
}

/// A comma-separated `key=value` list; values holding a comma cannot be
/// expressed (the library splits on every comma), so they are refused.
#[derive(Debug, Clone, Default)]
struct OptionList {
    text: String,
    error: Option<Error>,
}

impl OptionList {
    fn push(&mut self, key: &str, value: &str) {
        if value.contains(',') && self.error.is_none() {
            self.error = Some(Error::new(
                errno::EINVAL,
                format!("option {}='{}': a value cannot contain a comma", key, value),
            ));
        }
        if !self.text.is_empty() {
            self.text.push(',');
        }
        self.text.push_str(key);
        self.text.push('=');
        self.text.push_str(value);
    }

    fn switch(&mut self, key: &str, on: bool) {
        self.push(key, if on { "on" } else { "off" });
    }

    fn to_c_string(&self) -> Result<CString> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        c_string("options", self.text.as_bytes())
    }
}

fn path_c_string(what: &str, path: &Path) -> Result<CString> {
    c_string(what, path.as_os_str().as_bytes())
}

/// How to create an image: qemu-img create's `-o` options, typed.
///
/// ```no_run
/// use qcow2::{Compression, CreateOptions};
/// // qemu-img create -f qcow2 -b base.qcow2 -F qcow2
/// //   -o cluster_size=64k,extended_l2=on,compression_type=zstd top.qcow2
/// CreateOptions::new()
///     .backing("base.qcow2", qcow2::Format::Qcow2)
///     .cluster_size(64 << 10)
///     .extended_l2(true)
///     .compression(Compression::Zstd)
///     .create("top.qcow2")?;
/// # Ok::<(), qcow2::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct CreateOptions {
    size: u64,
    backing: Option<PathBuf>,
    options: OptionList,
}

impl CreateOptions {
    /// The defaults: no backing file, size 0 (set [`size`](Self::size),
    /// or take the backing file's).
    pub fn new() -> CreateOptions {
        CreateOptions::default()
    }

    /// The virtual size in bytes (0: the backing file's).
    pub fn size(mut self, bytes: u64) -> Self {
        self.size = bytes;
        self
    }

    /// The backing file name to store (relative names resolve from the new
    /// image's directory) and its format (`backing_fmt=`).
    pub fn backing(mut self, name: impl AsRef<Path>, format: Format) -> Self {
        self.backing = Some(name.as_ref().to_path_buf());
        self.options.push("backing_fmt", format.name());
        self
    }

    /// `cluster_size=`: a power of two from 512 to 2 MiB (default 64 KiB).
    pub fn cluster_size(mut self, bytes: u32) -> Self {
        self.options.push("cluster_size", &bytes.to_string());
        self
    }

    /// `compat=`: the qcow2 version.
    pub fn compat(mut self, compat: Compat) -> Self {
        self.options.push("compat", if compat == Compat::V3 { "1.1" } else { "0.10" });
        self
    }

    /// `extended_l2=`: subclusters (32 per cluster).
    pub fn extended_l2(mut self, on: bool) -> Self {
        self.options.switch("extended_l2", on);
        self
    }

    /// `lazy_refcounts=`.
    pub fn lazy_refcounts(mut self, on: bool) -> Self {
        self.options.switch("lazy_refcounts", on);
        self
    }

    /// `refcount_bits=`: 1, 2, 4, ..., 64 (default 16).
    pub fn refcount_bits(mut self, bits: u32) -> Self {
        self.options.push("refcount_bits", &bits.to_string());
        self
    }

    /// `compression_type=`.
    pub fn compression(mut self, c: Compression) -> Self {
        self.options.push("compression_type", if c == Compression::Zlib { "zlib" } else { "zstd" });
        self
    }

    /// `preallocation=`.
    pub fn preallocation(mut self, p: Preallocation) -> Self {
        let v = match p {
            Preallocation::Off => "off",
            Preallocation::Metadata => "metadata",
            Preallocation::Falloc => "falloc",
            Preallocation::Full => "full",
        };
        self.options.push("preallocation", v);
        self
    }

    /// `format=raw` makes a raw file instead of a qcow2 image.
    pub fn format(mut self, format: Format) -> Self {
        self.options.push("format", format.name());
        self
    }

    /// `encrypt.format=luks,encrypt.key-secret-file=`: a LUKS-encrypted
    /// image (QEMU's defaults: aes-256, xts, plain64, sha256) whose key
    /// slot 0 opens with the bytes of `secret_file`. Other `encrypt.*`
    /// choices (cipher-alg, cipher-mode, ivgen-alg, hash-alg, iter-time)
    /// go through [`CreateOptions::option`].
    pub fn encrypt_luks(mut self, secret_file: impl AsRef<Path>) -> Self {
        let file = secret_file.as_ref().to_string_lossy().into_owned();
        self.options.push("encrypt.format", "luks");
        self.options.push("encrypt.key-secret-file", &file);
        self
    }

    /// Any other `key=value` of the library's create options (for keys
    /// newer than this crate); checked by the library at create.
    pub fn option(mut self, key: &str, value: &str) -> Self {
        self.options.push(key, value);
        self
    }

    pub(crate) fn options_c_string(&self) -> Result<CString> {
        self.options.to_c_string()
    }

    pub(crate) fn size_bytes(&self) -> u64 {
        self.size
    }

    /// Creates the image at `path` (`EEXIST` if it exists). Thread-safe.
    pub fn create(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path_c_string("path", path.as_ref())?;
        let backing = match &self.backing {
            Some(b) => Some(path_c_string("backing file", b)?),
            None => None,
        };
        let options = self.options.to_c_string()?;
        let backing_ptr = backing.as_ref().map_or(ptr::null(), |b| b.as_ptr());
        check(|err| unsafe {
            // SAFETY: NUL-terminated strings alive for the call.
            qcow2_sys::qcow2_image_create(
                path.as_ptr(),
                backing_ptr,
                self.size,
                options.as_ptr(),
                err,
            )
        })?;
        Ok(())
    }
}

/// How to open an image (`qcow2_image_open_opts`'s keys). The default is
/// read-only with the format probed, QEMU's locks taken.
///
/// ```no_run
/// let image = qcow2::OpenOptions::new()
///     .read_write(true)
///     .cache_size(32 << 20)
///     .backing_root("/var/lib/images")
///     .open("/var/lib/images/vm1.qcow2")?;
/// # Ok::<(), qcow2::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    options: OptionList,
}

impl OpenOptions {
    /// Read-only, format probed, backing files opened, locks taken.
    pub fn new() -> OpenOptions {
        OpenOptions::default()
    }

    /// `read-only=off` when true: open for writing (QEMU's write lock).
    pub fn read_write(mut self, on: bool) -> Self {
        self.options.switch("read-only", !on);
        self
    }

    /// `format=`: the top file's format instead of probing it.
    pub fn format(mut self, format: Format) -> Self {
        self.options.push("format", format.name());
        self
    }

    /// `direct=`: O_DIRECT for every file of the chain.
    pub fn direct(mut self, on: bool) -> Self {
        self.options.switch("direct", on);
        self
    }

    /// `cache-size=`: bytes of L2 table cache per qcow2 file.
    pub fn cache_size(mut self, bytes: u64) -> Self {
        self.options.push("cache-size", &bytes.to_string());
        self
    }

    /// `refcount-cache-size=`: bytes of refcount block cache per file.
    pub fn refcount_cache_size(mut self, bytes: u64) -> Self {
        self.options.push("refcount-cache-size", &bytes.to_string());
        self
    }

    /// `backing=off` when false: no backing files (unallocated reads zero).
    pub fn backing(mut self, on: bool) -> Self {
        self.options.switch("backing", on);
        self
    }

    /// `backing-root=`: refuse backing files that resolve outside `dir`.
    pub fn backing_root(mut self, dir: impl AsRef<Path>) -> Self {
        let dir = dir.as_ref().to_string_lossy().into_owned();
        self.options.push("backing-root", &dir);
        self
    }

    /// `force-share=`: read-only only; open even while another process
    /// writes the image (qemu-img -U).
    pub fn force_share(mut self, on: bool) -> Self {
        self.options.switch("force-share", on);
        self
    }

    /// `locking=`: take QEMU's image locks (default on).
    pub fn locking(mut self, on: bool) -> Self {
        self.options.switch("locking", on);
        self
    }

    /// `no-flush=`: flushes make nothing durable (qemu-img -t unsafe).
    pub fn no_flush(mut self, on: bool) -> Self {
        self.options.switch("no-flush", on);
        self
    }

    /// `key-secret-file=`: the secret of LUKS-encrypted images (the
    /// file's bytes); without it, or a wrong one, the open fails with
    /// `EACCES` and nothing is written.
    pub fn key_secret_file(mut self, file: impl AsRef<Path>) -> Self {
        let file = file.as_ref().to_string_lossy().into_owned();
        self.options.push("key-secret-file", &file);
        self
    }

    /// `backing.key-secret-file=`, `backing.backing.key-secret-file=` ...:
    /// the secret of the encrypted image `depth` files below the top (1:
    /// its backing file; 0: the top, as `key_secret_file`), for chains
    /// whose images have different secrets (QEMU's
    /// `backing.encrypt.key-secret`). An image given none uses
    /// `key_secret_file`'s.
    pub fn backing_key_secret_file(mut self, depth: u32, file: impl AsRef<Path>) -> Self {
        let file = file.as_ref().to_string_lossy().into_owned();
        let key = format!("{}key-secret-file", "backing.".repeat(depth as usize));
        self.options.push(&key, &file);
        self
    }

    /// `metadata-only=`: read-only only; open an encrypted image without
    /// its secret for its metadata (size, chain), as `qemu-img info`
    /// does. Reads of its data then fail with `EPERM` (the buffer zeroed).
    pub fn metadata_only(mut self, on: bool) -> Self {
        self.options.switch("metadata-only", on);
        self
    }

    /// `max-chain=`: the deepest backing file accepted (the top image is
    /// depth 0, its backing file 1 ...; default 64).
    pub fn max_chain(mut self, depth: u32) -> Self {
        self.options.push("max-chain", &depth.to_string());
        self
    }

    /// Any other `key=value` of the library's open options (for keys
    /// newer than this crate); checked by the library at open.
    pub fn option(mut self, key: &str, value: &str) -> Self {
        self.options.push(key, value);
        self
    }

    pub(crate) fn options_c_string(&self) -> Result<CString> {
        self.options.to_c_string()
    }

    /// Opens `path` and its backing chain.
    pub fn open(&self, path: impl AsRef<Path>) -> Result<Image> {
        let path = path_c_string("path", path.as_ref())?;
        let options = self.options.to_c_string()?;
        let mut raw = ptr::null_mut();
        // SAFETY: NUL-terminated strings alive for the call; `raw` is
        // written by it (the handle, or null on failure).
        check(|err| unsafe {
            qcow2_sys::qcow2_image_open_ex(path.as_ptr(), options.as_ptr(), &mut raw, err)
        })?;
        let raw = std::ptr::NonNull::new(raw)
            .ok_or_else(|| Error::new(errno::EIO, "qcow2_image_open_ex gave no handle"))?;
        Ok(Image::from_raw(raw))
    }
}
