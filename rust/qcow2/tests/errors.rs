// SPDX-License-Identifier: Apache-2.0
//! One error case each: a missing file, a write to a read-only image, a
//! bad option, a second writer refused by QEMU's lock, a queue of depth 0;
//! each with the errno the library returned (the open and queue calls
//! too: qcow2_image_open_ex, qcow2_queue_create_ex) and a message naming
//! what is wrong.
mod support;

use qcow2::{errno, CreateOptions, Image, OpenOptions};
use support::{qemu_img, qemu_io_c, TempDir};

#[test]
fn missing_file_is_enoent_naming_the_path() {
    let dir = TempDir::new("missing");
    let path = dir.path("nothing-here.qcow2");
    let e = Image::open(&path).unwrap_err();
    eprintln!("{:?}", e);
    assert_eq!(e.errno(), errno::ENOENT);
    assert!(e.message().contains("nothing-here.qcow2"), "{}", e);
    let io: std::io::Error = e.into();
    assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
}

#[test]
fn write_to_read_only_image_is_eperm() {
    let dir = TempDir::new("readonly");
    let path = dir.path("ro.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", path.to_str().unwrap(), "1M"]);
    let image = Image::open(&path).unwrap();
    assert!(!image.writable());
    let e = image.write_at(&[1; 512], 0).unwrap_err();
    eprintln!("{:?}", e);
    assert_eq!(e.errno(), errno::EPERM);
    let mut queue: qcow2::Queue = image.queue(4).unwrap();
    let r = queue.writev_owned(0, vec![vec![1; 512]], 1).unwrap_err();
    assert_eq!(r.error.errno(), errno::EPERM);
    assert_eq!(r.buffers.len(), 1, "a refused submit gives the buffers back");
    assert_eq!(queue.in_flight(), 0);
}

#[test]
fn bad_option_is_einval_naming_it() {
    let dir = TempDir::new("badopt");
    let path = dir.path("bad.qcow2");
    let e = CreateOptions::new().size(1 << 20).cluster_size(3000).create(&path).unwrap_err();
    eprintln!("{:?}", e);
    assert_eq!(e.errno(), errno::EINVAL);
    assert!(e.message().contains("cluster_size") && e.message().contains("3000"), "{}", e);
    assert!(!path.exists(), "no file is left by a refused create");

    qemu_img(&["create", "-q", "-f", "qcow2", path.to_str().unwrap(), "1M"]);
    let e = OpenOptions::new().option("cache-sise", "1M").open(&path).unwrap_err();
    eprintln!("{:?}", e);
    assert_eq!(e.errno(), errno::EINVAL);
    assert!(e.message().contains("cache-sise"), "{}", e);
    let e = OpenOptions::new().backing_root("/a,b").open(&path).unwrap_err();
    assert_eq!(e.errno(), errno::EINVAL);
    assert!(e.message().contains("comma"), "{}", e);
}

#[test]
fn second_writer_is_refused_by_the_lock() {
    let dir = TempDir::new("lock");
    let path = dir.path("locked.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", path.to_str().unwrap(), "1M"]);
    let first = Image::open_rw(&path).unwrap();

    // A second writer in this process, then QEMU itself, are refused.
    let e = Image::open_rw(&path).unwrap_err();
    eprintln!("{:?}", e);
    assert_eq!(e.errno(), errno::EBUSY);
    let (ok, out) = qemu_io_c(&path, &["write 0 512"]);
    assert!(!ok && out.contains("lock"), "qemu-io wrote a locked image: {}", out);

    // Shared reading still works (qemu-img -U), and after close, writing.
    let reader = OpenOptions::new().force_share(true).open(&path).unwrap();
    drop(reader);
    first.close().unwrap();
    let (ok, out) = qemu_io_c(&path, &["write 0 512"]);
    assert!(ok, "{}", out);
}

#[test]
fn queue_of_depth_zero_is_einval() {
    let dir = TempDir::new("depth0");
    let path = dir.path("d.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", path.to_str().unwrap(), "1M"]);
    let image = Image::open(&path).unwrap();
    let refused: qcow2::Result<qcow2::Queue> = image.queue(0);
    let e = refused.map(|_| ()).unwrap_err();
    eprintln!("{:?}", e);
    assert_eq!(e.errno(), errno::EINVAL);
    assert!(e.message().contains("depth 0"), "{}", e);
    let queue: qcow2::Result<qcow2::Queue> = image.queue(1);
    assert!(queue.is_ok());
}
