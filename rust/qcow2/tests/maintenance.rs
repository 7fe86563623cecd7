// SPDX-License-Identifier: Apache-2.0
//! Bitmaps, internal snapshots and the offline maintenance calls through
//! the safe API, each judged by QEMU: qemu-img info / check / measure /
//! compare against qemu-img doing the same on a copy.
mod support;

use qcow2::{check_image, ChainOptions, CreateOptions, Format, OpenOptions, Repair};
use support::{qemu_img, qemu_io, qemu_read_all, TempDir};

#[test]
fn bitmaps_record_writes_and_qemu_sees_them() {
    let dir = TempDir::new("bitmaps");
    let path = dir.path("b.qcow2");
    CreateOptions::new().size(4 << 20).create(&path).unwrap();
    let image = OpenOptions::new().read_write(true).open(&path).unwrap();
    image.bitmap_add("backup", 65536, true).unwrap();
    image.bitmap_add("off", 0, false).unwrap();
    assert_eq!(image.bitmap_add("backup", 0, true).unwrap_err().errno(), qcow2::errno::EEXIST);
    image.write_at(&[1; 4096], 1 << 20).unwrap();
    let list = image.bitmaps().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!((list[0].name.as_str(), list[0].granularity, list[0].enabled), ("backup", 65536, true));
    let dirty = image.bitmap_status("backup", 1 << 20, 1 << 20).unwrap();
    assert!(dirty.dirty && dirty.offset == 1 << 20 && dirty.length == 65536, "{:?}", dirty);
    assert!(!image.bitmap_status("off", 1 << 20, 4096).unwrap().dirty);
    image.bitmap_merge("off", "backup", None).unwrap();
    assert!(image.bitmap_status("off", 1 << 20, 4096).unwrap().dirty);
    image.bitmap_clear("backup").unwrap();
    assert!(!image.bitmap_status("backup", 1 << 20, 4096).unwrap().dirty);
    image.bitmap_disable("backup").unwrap();
    image.bitmap_enable("off").unwrap();
    image.bitmap_remove("off").unwrap();
    let e = image.bitmap_status("off", 0, 4096).unwrap_err();
    assert_eq!(e.errno(), qcow2::errno::ENOENT, "{}", e);
    image.close().unwrap();
    let info = qemu_img(&["info", path.to_str().unwrap()]);
    assert!(info.contains("backup") && !info.contains("name: off"), "{}", info);
    qemu_img(&["check", path.to_str().unwrap()]);
}

#[test]
fn snapshots_revert_the_disk() {
    let dir = TempDir::new("snapshots");
    let path = dir.path("s.qcow2");
    CreateOptions::new().size(1 << 20).create(&path).unwrap();
    let image = OpenOptions::new().read_write(true).open(&path).unwrap();
    image.write_at(&[5; 512], 0).unwrap();
    image.snapshot_create("before", None).unwrap();
    image.write_at(&[6; 512], 0).unwrap();
    let list = image.snapshots().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!((list[0].id.as_str(), list[0].name.as_str(), list[0].disk_size), ("1", "before", 1 << 20));
    image.snapshot_apply("before").unwrap();
    let mut buf = [0u8; 512];
    image.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [5; 512]);
    image.snapshot_create("second", Some("x")).unwrap();
    image.snapshot_delete("1").unwrap();
    assert_eq!(image.snapshot_delete("1").unwrap_err().errno(), qcow2::errno::ENOENT);
    image.close().unwrap();
    let list = qemu_img(&["snapshot", "-l", path.to_str().unwrap()]);
    assert!(list.contains("second") && !list.contains("before"), "{}", list);
    qemu_img(&["check", path.to_str().unwrap()]);
}

#[test]
fn check_and_measure_agree_with_qemu_img() {
    let dir = TempDir::new("check");
    let path = dir.path("c.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", path.to_str().unwrap(), "8M"]);
    qemu_io(&path, "write -P 1 0 3M\n");
    let report = check_image(&path, Repair::None).unwrap();
    assert!(report.is_clean(), "{:?}", report);
    assert_eq!(report.counters.allocated_clusters, 48);
    assert_eq!(check_image(dir.path("none.qcow2"), Repair::None).unwrap_err().errno(), qcow2::errno::ENOENT);

    let source = qcow2::Image::open(&path).unwrap();
    let ours = CreateOptions::new().cluster_size(65536).measure(Some(&source)).unwrap();
    let theirs = qemu_img(&["measure", "-O", "qcow2", "-o", "cluster_size=65536", path.to_str().unwrap()]);
    assert!(theirs.contains(&format!("required size: {}", ours.required)), "{:?} vs {}", ours, theirs);
    assert!(theirs.contains(&format!("fully allocated size: {}", ours.fully_allocated)), "{}", theirs);
}

/// base <- top, each with data, in `dir`.
fn chain(dir: &TempDir) {
    let p = |n: &str| dir.path(n).to_str().unwrap().to_string();
    qemu_img(&["create", "-q", "-f", "qcow2", &p("base.qcow2"), "4M"]);
    qemu_io(&dir.path("base.qcow2"), "write -P 1 0 2M\n");
    qemu_img(&["create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", &p("top.qcow2")]);
    qemu_io(&dir.path("top.qcow2"), "write -P 2 1M 2M\n");
}

#[test]
fn offline_commit_stream_rebase_match_qemu_img() {
    let (ours, theirs) = (TempDir::new("ops-ours"), TempDir::new("ops-qemu"));
    chain(&ours);
    let disk = qemu_read_all(&ours.path("top.qcow2"), &ours.path("disk.raw"));

    // stream: the top holds everything, no backing file.
    chain(&theirs);
    let mut fractions = Vec::new();
    let mut record = |f: f64| fractions.push(f);
    qcow2::stream(ours.path("top.qcow2"), None, ChainOptions { progress: Some(&mut record), ..Default::default() })
        .unwrap();
    assert!(fractions.last().map_or(false, |&f| f >= 1.0), "{:?}", fractions);
    qemu_img(&["rebase", "-q", "-b", "", theirs.path("top.qcow2").to_str().unwrap()]);
    let (a, b) = (ours.path("top.qcow2"), theirs.path("top.qcow2"));
    qemu_img(&["check", a.to_str().unwrap()]);
    assert!(qemu_img(&["compare", a.to_str().unwrap(), b.to_str().unwrap()]).contains("identical"));
    assert!(!qemu_img(&["info", a.to_str().unwrap()]).contains("backing file"));

    // rebase back onto base (unsafe: the name only), then commit into it.
    qcow2::rebase(&a, Some((std::path::Path::new("base.qcow2"), Format::Qcow2)), true, ChainOptions::default())
        .unwrap();
    assert!(qemu_img(&["info", a.to_str().unwrap()]).contains("backing file: base.qcow2"));
    let emptied = qcow2::commit(&a, None, false, ChainOptions::default()).unwrap();
    assert!(emptied);
    qemu_img(&["check", ours.path("base.qcow2").to_str().unwrap()]);
    assert!(qemu_read_all(&ours.path("base.qcow2"), &ours.path("base.raw")) == disk);
    assert!(qemu_read_all(&a, &ours.path("top.raw")) == disk);
}
