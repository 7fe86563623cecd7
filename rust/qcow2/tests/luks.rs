// SPDX-License-Identifier: Apache-2.0
//! LUKS-encrypted images through the crate: created with
//! `CreateOptions::encrypt_luks`, opened with `OpenOptions::key_secret_file`
//! (refused with EACCES without it or with a wrong one), opened for
//! metadata only without it; qemu-io reads what we wrote with the secret.
//! A chain whose images have different secrets opens with
//! `OpenOptions::backing_key_secret_file` and reads as qemu-img reads it.
mod support;

use qcow2::{errno, CreateOptions, Format, OpenOptions};
use support::{qemu_img_status, TempDir};

#[test]
fn encrypted_image_round_trip() {
    let dir = TempDir::new("luks");
    let path = dir.path("enc.qcow2");
    let secret = dir.path("secret");
    let wrong = dir.path("wrong");
    std::fs::write(&secret, "rust-pass").unwrap();
    std::fs::write(&wrong, "not-it").unwrap();
    CreateOptions::new()
        .size(1 << 20)
        .encrypt_luks(&secret)
        .option("encrypt.iterations", "1000")
        .create(&path)
        .unwrap();

    let e = OpenOptions::new().read_write(true).open(&path).unwrap_err();
    assert_eq!(e.errno(), errno::EACCES, "{}", e);
    let e = OpenOptions::new().key_secret_file(&wrong).open(&path).unwrap_err();
    assert_eq!(e.errno(), errno::EACCES, "{}", e);

    let image = OpenOptions::new().read_write(true).key_secret_file(&secret).open(&path).unwrap();
    image.write_at(&[0x5a; 65536], 65536).unwrap();
    let mut back = vec![0; 65536];
    image.read_at(&mut back, 65536).unwrap();
    assert!(back.iter().all(|&b| b == 0x5a));
    image.close().unwrap();

    let meta = OpenOptions::new().metadata_only(true).open(&path).unwrap();
    assert_eq!(meta.size(), 1 << 20);
    let mut buf = vec![0xee; 4096];
    let e = meta.read_at(&mut buf, 65536).unwrap_err();
    assert_eq!(e.errno(), errno::EPERM, "{}", e);
    assert!(buf.iter().all(|&b| b == 0), "a refused read leaves no ciphertext");
    drop(meta);

    let object = format!("secret,id=s0,file={}", secret.display());
    let opts = format!("driver=qcow2,file.filename={},encrypt.key-secret=s0", path.display());
    let out = std::process::Command::new("qemu-io")
        .args(["--object", &object, "--image-opts", &opts, "-c", "read -P 0x5a 64k 64k"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success() && text.contains("read 65536/65536") && !text.contains("ailed"), "{}", text);
    let (ok, text) = qemu_img_status(&["check", "--object", &object, "--image-opts", &opts]);
    assert!(ok, "{}", text);
}

/// Base and top made by the crate with different secrets (c_api_test
/// has a base made by `qemu-img create --object secret`; qemu-img's
/// create measures its PBKDF2 count for seconds, so once is enough), both
/// filled by qemu-io: the
/// top's secret alone is refused (EACCES, naming the base), and with the
/// base's given by depth the whole disk reads as `qemu-img convert`
/// reads it with `backing.encrypt.key-secret`.
#[test]
fn chain_with_a_secret_per_image() {
    let dir = TempDir::new("luks-chain");
    let base = dir.path("base.qcow2");
    let top = dir.path("top.qcow2");
    let (s0, s1) = (dir.path("s0"), dir.path("s1"));
    std::fs::write(&s0, "rust-base-pass").unwrap();
    std::fs::write(&s1, "rust-top-pass").unwrap();
    CreateOptions::new()
        .size(2 << 20)
        .encrypt_luks(&s0)
        .option("encrypt.iterations", "1000")
        .create(&base)
        .unwrap();
    let o0 = format!("secret,id=s0,file={}", s0.display());
    let o1 = format!("secret,id=s1,file={}", s1.display());
    let base_opts = format!("driver=qcow2,file.filename={},encrypt.key-secret=s0", base.display());
    let run = |program: &str, args: &[&str]| {
        let out = std::process::Command::new(program).args(args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && !text.contains("ailed"), "{} {:?}: {}", program, args, text);
    };
    run("qemu-io", &["--object", &o0, "--image-opts", &base_opts, "-c", "write -P 0x5a 0 192k", "-c", "write -P 0x33 1M 64k"]);
    CreateOptions::new()
        .backing(&base, Format::Qcow2)
        .encrypt_luks(&s1)
        .option("encrypt.iterations", "1000")
        .create(&top)
        .unwrap();
    let top_opts = format!("driver=qcow2,file.filename={},encrypt.key-secret=s1,backing.encrypt.key-secret=s0", top.display());
    run("qemu-io", &["--object", &o0, "--object", &o1, "--image-opts", &top_opts, "-c", "write -P 0x61 64k 64k", "-c", "write -z 1M 4k"]);
    let raw = dir.path("qemu.raw");
    let raw_name = raw.to_string_lossy().into_owned();
    run("qemu-img", &["convert", "-O", "raw", "--object", &o0, "--object", &o1, "--image-opts", &top_opts, &raw_name]);

    let e = OpenOptions::new().key_secret_file(&s1).open(&top).unwrap_err();
    assert_eq!(e.errno(), errno::EACCES, "{}", e);
    assert!(e.to_string().contains("base.qcow2"), "{}", e);
    let e = OpenOptions::new().key_secret_file(&s1).backing_key_secret_file(2, &s0).open(&top).unwrap_err();
    assert_eq!(e.errno(), errno::EACCES, "{}", e);
    let image = OpenOptions::new().key_secret_file(&s1).backing_key_secret_file(1, &s0).open(&top).unwrap();
    assert_eq!(image.chain_length(), 2);
    let mut ours = vec![0xee; 2 << 20];
    image.read_at(&mut ours, 0).unwrap();
    let theirs = std::fs::read(&raw).unwrap();
    assert!(ours == theirs, "our read of the chain differs from qemu-img's");
    assert_eq!((ours[0], ours[65536], ours[131072]), (0x5a, 0x61, 0x5a));
    assert_eq!((ours[1 << 20], ours[(1 << 20) + 4096]), (0, 0x33));
}
