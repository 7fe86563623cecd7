// SPDX-License-Identifier: Apache-2.0
// Options for opening and creating images. Every field has a default, so
// `OpenOptions{}` opens an image read-only with sensible caches.
#ifndef QCOW2_OPTIONS_H_
#define QCOW2_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace qcow2 {

class FileOpener;

enum class ImageFormat {
  kQcow2,
  kRaw,
};

enum class CompressionType : uint8_t {
  kZlib = 0,  // raw deflate, no zlib header
  kZstd = 1,
};

struct OpenOptions {
  // Open the top image for writing. Backing files are always read-only.
  // Default: false.
  bool read_write = false;

  // Bypass the host page cache (O_DIRECT) for every file in the chain.
  // Default: false.
  bool direct_io = false;

  // Format of the top image; empty probes it (qcow2 magic, else raw).
  // An image probed as raw refuses writes to its first 512 bytes that
  // would make it probe as another format (kPermissionDenied), as QEMU
  // does: a guest must not turn its disk into a qcow2 image naming a host
  // file as backing. Name "raw" to allow such writes. Default: probe.
  std::string format;

  // Bytes of L2 table cache per qcow2 image. The default maps a 256 GiB
  // image with 64 KiB clusters (standard L2 entries) entirely.
  // Default: 32 MiB.
  uint64_t l2_cache_bytes = 32ull << 20;

  // Size of one L2 cache slice, in bytes (a power of two, at least 512;
  // clamped to the cluster size). Default: 4 KiB.
  uint32_t l2_slice_bytes = 4096;

  // Bytes of refcount block cache per qcow2 image. Default: 1 MiB.
  uint64_t refcount_cache_bytes = 1ull << 20;

  // Deepest backing chain accepted (the top image is depth 0). Default: 64.
  int max_chain_depth = 64;

  // Open backing files at all. When false, unallocated ranges read as zero.
  // Default: true.
  bool open_backing = true;

  // When not empty, every backing file must resolve to a path inside this
  // directory (symbolic links resolved), else the open fails with
  // kPermissionDenied. Set it to the directory that holds an untrusted
  // image, e.g. `opts.backing_root = "/var/lib/images";`. Default: empty
  // (no restriction: a backing name may point anywhere the process can
  // read; see docs/security.md).
  std::string backing_root;

  // Take QEMU's image locks on the files of the chain (see FileOptions::
  // lock): the top read-write or read-only, backing files read-only.
  // Default: true.
  bool lock = true;

  // Open read-only even while another process (QEMU, qcowtool) writes the
  // image: take only the shared read lock, as `qemu-img -U` does. The data
  // read may be inconsistent. Only with read_write false, else the open
  // fails with kInvalidArgument. Default: false.
  bool force_share = false;

  // Flushes of the top image make nothing durable (FileOptions::no_flush,
  // QEMU's cache.no-flush, qemu-img -t unsafe): for a scratch image, or a
  // conversion whose target is synced or discarded as a whole. A power cut
  // may lose or tear anything written since the image was opened.
  // Default: false.
  bool no_flush = false;

  // The top image's external data file (QEMU's data-file option),
  // instead of the name the image stores: used as given (not checked
  // against backing_root). Only for a top whose incompatible bit 2 is
  // set. Default: empty: the stored name, refused with a protocol prefix
  // as a backing name is, kept under backing_root, and opened as QEMU
  // opens it (a relative name from the working directory, not the
  // image's).
  std::string data_file;

  // Opens the files. nullptr means DefaultFileOpener(). Not owned; must
  // outlive the image.
  FileOpener* opener = nullptr;

  // The secret (passphrase bytes) of a LUKS-encrypted image (qcow2
  // crypt_method 2, QEMU's encrypt.key-secret), tried on every encrypted
  // image of the chain that backing_key_secrets gives no secret of its
  // own. An encrypted image opened without it, or with one
  // no key slot accepts, fails with kPermissionDenied and is not written.
  // The library wipes its own copies once the key slots are unlocked (the
  // caller's string is the caller's to wipe; docs/security.md). Legacy
  // AES (crypt_method 1) is refused, as QEMU 7.2's emulators refuse it.
  // Default: empty.
  std::string key_secret;

  // The secrets of the backing images, by depth, for chains whose
  // encrypted images have different secrets (QEMU's
  // backing.encrypt.key-secret, backing.backing.encrypt.key-secret, ...):
  // [0] is the top's backing file, [1] the backing file of that, and so
  // on. An empty or missing entry means key_secret. Wiped as key_secret
  // is. Default: empty.
  std::vector<std::string> backing_key_secrets;

  // Open for the image's metadata only, as `qemu-img info` does (QEMU's
  // BDRV_O_NO_IO): an encrypted image of the chain opens without
  // key_secret (its LUKS header is read, its key slots are not), and
  // then no guest data of that image is read or written: reads that
  // reach it fail with kFailedPrecondition (the caller's buffer zeroed).
  // Unencrypted images and images whose secret is given read as usual.
  // Only with read_write false, else the open fails with
  // kInvalidArgument. Default: false.
  bool metadata_only = false;
};

// LUKS encryption of a new qcow2 image, as `qemu-img create -o
// encrypt.format=luks,encrypt.*` makes it (QEMU 7.2's names and
// defaults).
struct EncryptionOptions {
  // "luks" encrypts; empty: no encryption. ("aes", legacy, is refused.)
  std::string format;
  std::string key_secret;            // the passphrase of key slot 0
  std::string cipher_alg = "aes-256";  // aes-128/192/256, cast5-128,
                                       // serpent-*, twofish-*
  std::string cipher_mode = "xts";   // xts, cbc, ecb, ctr
  std::string ivgen_alg = "plain64"; // plain, plain64, essiv
  std::string ivgen_hash_alg;        // essiv's hash; empty: QEMU's default
  std::string hash_alg = "sha256";   // PBKDF2 and AF hash
  uint32_t iter_time_ms = 2000;      // encrypt.iter-time
  // Fixed PBKDF2 iteration counts (at least 1000) for the key slot and
  // the master-key digest instead of measuring iter_time_ms (which costs
  // about a second of CPU, as in QEMU). 0: measure. Default: 0.
  uint32_t iterations = 0;
};

enum class Preallocation {
  kOff,
  kMetadata,
  kFalloc,
  kFull,
};

struct CreateOptions {
  ImageFormat format = ImageFormat::kQcow2;

  // Virtual size in bytes. 0 means the backing file's size.
  uint64_t size = 0;

  // "0.10" (version 2) or "1.1" (version 3). Default: "1.1".
  std::string compat = "1.1";

  // Power of two from 512 B to 2 MiB. Default: 64 KiB.
  uint32_t cluster_size = 64 * 1024;

  // Extended L2 entries with 32 subclusters per cluster (needs compat 1.1
  // and cluster_size >= 16 KiB; QEMU >= 5.2 opens such images).
  // Default: false.
  bool extended_l2 = false;

  CompressionType compression_type = CompressionType::kZlib;

  // Power of two from 1 to 64. Default: 16.
  uint32_t refcount_bits = 16;

  bool lazy_refcounts = false;

  Preallocation preallocation = Preallocation::kOff;

  // Backing file name as stored in the header (relative names are resolved
  // against the new image's directory). Empty: no backing file.
  std::string backing_file;

  // "qcow2", "raw" or empty (not recorded; probed when opened).
  std::string backing_format;

  // Opens the files. nullptr means DefaultFileOpener(). Not owned.
  FileOpener* opener = nullptr;

  // LUKS encryption (qcow2 only); default: none.
  EncryptionOptions encrypt;

  // An external data file for the guest data (qemu-img's data_file): the
  // name stored in the image. As qemu-img does, the file is created (or
  // truncated) at that name as given, a relative one from the working
  // directory, and sized to the disk; opening the image later resolves a
  // relative name against the image's directory. Needs compat 1.1.
  // Default: empty (none).
  std::string data_file;
  // The data file stays a valid raw image of the disk (data_file_raw):
  // needs data_file and no backing file; implies at least metadata
  // preallocation. Default: false.
  bool data_file_raw = false;
};

}  // namespace qcow2

#endif  // QCOW2_OPTIONS_H_
