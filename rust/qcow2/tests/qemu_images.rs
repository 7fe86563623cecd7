// SPDX-License-Identifier: Apache-2.0
//! Images made by qemu-img (and filled by qemu-io) read back through
//! Image exactly as qemu-img reads them; images written through Image's
//! synchronous calls pass `qemu-img check` and read back through qemu-img.
mod support;

use qcow2::{BlockStatus, CreateOptions, Format, Image, OpenOptions};
use support::{qemu_img, qemu_io, qemu_read_all, TempDir};

const FILL: &str = "write -P 0x5a 0 100k\nwrite -P 0xa5 1M 64k\nwrite -z 1088k 64k\nwrite -P 0x3c 3000k 900k\n";

/// Reads the whole disk through Image in uneven pieces.
fn read_all(image: &Image) -> Vec<u8> {
    let mut out = vec![0u8; image.size() as usize];
    let mut at = 0usize;
    let mut piece = 4096 + 512;
    while at < out.len() {
        let n = piece.min(out.len() - at);
        image.read_at(&mut out[at..at + n], at as u64).unwrap();
        at += n;
        piece = piece * 3 % 300_000 + 512;
    }
    out
}

fn check_reads_like_qemu(dir: &TempDir, name: &str) {
    let path = dir.path(name);
    let want = qemu_read_all(&path, &dir.path("want.raw"));
    let image = Image::open(&path).unwrap();
    assert_eq!(image.size() as usize, want.len(), "{}", name);
    assert!(read_all(&image) == want, "{} reads differently from qemu-img", name);
}

#[test]
fn qemu_img_images_read_back() {
    let dir = TempDir::new("qemu-images");
    let variants: [(&str, &str); 5] = [
        ("default.qcow2", "cluster_size=65536"),
        ("small.qcow2", "cluster_size=4096,refcount_bits=1"),
        ("v2.qcow2", "compat=0.10,cluster_size=512"),
        ("ext.qcow2", "extended_l2=on,cluster_size=128k"),
        ("zstd.qcow2", "compression_type=zstd"),
    ];
    for (name, options) in variants {
        let path = dir.path(name);
        qemu_img(&["create", "-q", "-f", "qcow2", "-o", options, path.to_str().unwrap(), "4M"]);
        qemu_io(&path, FILL);
        check_reads_like_qemu(&dir, name);
    }
    // Compressed clusters, zlib and zstd, made by qemu-img convert -c.
    for (name, ctype) in [("zlib-c.qcow2", "zlib"), ("zstd-c.qcow2", "zstd")] {
        let src = dir.path("default.qcow2");
        let opt = format!("compression_type={}", ctype);
        qemu_img(&["convert", "-c", "-O", "qcow2", "-o", &opt, src.to_str().unwrap(), dir.path(name).to_str().unwrap()]);
        check_reads_like_qemu(&dir, name);
        let image = Image::open(dir.path(name)).unwrap();
        assert!(image.block_status(0, 65536).unwrap().compressed, "{}", name);
    }
}

#[test]
fn qemu_img_chain_reads_back_with_block_status() {
    let dir = TempDir::new("qemu-chain");
    let base = dir.path("base.qcow2");
    let top = dir.path("top.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", base.to_str().unwrap(), "4M"]);
    qemu_io(&base, FILL);
    qemu_img(&["create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", top.to_str().unwrap()]);
    qemu_io(&top, "write -P 0x77 32k 64k\n");
    check_reads_like_qemu(&dir, "top.qcow2");

    let image = Image::open(&top).unwrap();
    assert_eq!(image.chain_length(), 2);
    let from_base: BlockStatus = image.block_status(1 << 20, 4096).unwrap();
    assert!(from_base.allocated && from_base.data && from_base.depth == 1, "{:?}", from_base);
    let from_top = image.block_status(64 << 10, 4096).unwrap();
    assert!(from_top.data && from_top.depth == 0, "{:?}", from_top);
    let hole = image.block_status(2 << 20, 4096).unwrap();
    assert!(!hole.allocated && hole.zero && hole.host_offset.is_none(), "{:?}", hole);
    let opts = OpenOptions::new().backing(false).open(&top).unwrap();
    assert_eq!(opts.chain_length(), 1);
}

#[test]
fn sync_writes_pass_qemu_img_check() {
    let dir = TempDir::new("sync-writes");
    let path = dir.path("w.qcow2");
    CreateOptions::new().size(8 << 20).extended_l2(true).create(&path).unwrap();
    let e = CreateOptions::new().size(1 << 20).create(&path).unwrap_err();
    assert_eq!(e.errno(), qcow2::errno::EEXIST);

    let image = OpenOptions::new().read_write(true).format(Format::Qcow2).open(&path).unwrap();
    let mut model = vec![0u8; 8 << 20];
    for (i, off) in [0u64, 70_000, 1 << 20, 5_000_000].iter().enumerate() {
        let data = vec![i as u8 + 1; 200_000];
        image.write_at(&data, *off).unwrap();
        model[*off as usize..*off as usize + data.len()].copy_from_slice(&data);
    }
    image.write_zeroes(100_000, 50_000, false).unwrap();
    model[100_000..150_000].fill(0);
    image.discard(1 << 20, 128 << 10).unwrap();
    model[1 << 20..(1 << 20) + (128 << 10)].fill(0);
    image.write_compressed_at(&vec![9u8; 65536], 6 << 20).unwrap();
    model[6 << 20..(6 << 20) + 65536].fill(9);
    image.flush().unwrap();
    let e = image.write_at(&[1], 8 << 20).unwrap_err();
    assert_eq!(e.errno(), qcow2::errno::EIO, "past the end: {}", e);
    let stats = image.stats().unwrap();
    assert_eq!(stats.guest_write_ops, 5);
    assert!(read_all(&image) == model);
    image.close().unwrap();

    qemu_img(&["check", path.to_str().unwrap()]);
    assert!(qemu_read_all(&path, &dir.path("w.raw")) == model, "qemu-img reads other bytes");
}

/// Every OpenOptions and CreateOptions key is one the library knows (a
/// misspelt key would be refused with EINVAL), and the checks they ask
/// for happen.
#[test]
fn every_builder_option_reaches_the_library() {
    use qcow2::{Compat, Compression, Preallocation};
    let dir = TempDir::new("options");
    let base = dir.path("base.qcow2");
    CreateOptions::new()
        .size(2 << 20)
        .cluster_size(4096)
        .compat(Compat::V3)
        .extended_l2(false)
        .lazy_refcounts(true)
        .refcount_bits(16)
        .compression(Compression::Zlib)
        .preallocation(Preallocation::Metadata)
        .create(&base)
        .unwrap();
    CreateOptions::new().backing("base.qcow2", Format::Qcow2).create(dir.path("top.qcow2")).unwrap();
    CreateOptions::new().size(1 << 20).format(Format::Raw).create(dir.path("disk.raw")).unwrap();
    qemu_img(&["check", base.to_str().unwrap()]);

    let top = dir.path("top.qcow2");
    let image = OpenOptions::new()
        .read_write(false)
        .format(Format::Qcow2)
        .direct(false) // the key; O_DIRECT itself depends on the file system
        .cache_size(1 << 20)
        .refcount_cache_size(256 << 10)
        .backing(true)
        .backing_root(dir.path(""))
        .force_share(true)
        .locking(false)
        .no_flush(true)
        .max_chain(1)
        .open(&top)
        .unwrap();
    assert_eq!(image.chain_length(), 2);
    let raw = OpenOptions::new().format(Format::Raw).open(dir.path("disk.raw")).unwrap();
    assert_eq!(raw.size(), 1 << 20);

    let e = OpenOptions::new().max_chain(0).open(&top).unwrap_err();
    assert!(e.message().contains("base.qcow2") || e.message().contains("chain"), "{}", e);
    let elsewhere = TempDir::new("options-root");
    let e = OpenOptions::new().backing_root(elsewhere.path("")).open(&top).unwrap_err();
    assert!(e.message().contains("base.qcow2"), "{}", e);
}
