// SPDX-License-Identifier: Apache-2.0
//! LUKS-encrypted images through the crate: created with
//! `CreateOptions::encrypt_luks`, opened with `OpenOptions::key_secret_file`
//! (refused with EACCES without it or with a wrong one), opened for
//! metadata only without it; qemu-io reads what we wrote with the secret.
mod support;

use qcow2::{errno, CreateOptions, OpenOptions};
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
