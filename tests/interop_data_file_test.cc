// SPDX-License-Identifier: Apache-2.0
// qcow2 images with an external data file (incompatible bit 2, the
// `data_file` and `data_file_raw` options of qemu-img create), both ways
// against QEMU 7.2, raw and not raw: images qemu-img creates and qemu-io
// fills read back through us (synchronous calls and an io_uring queue);
// images we write (allocating, copy-on-write inside a cluster, from a
// backing file and into subclusters, write-zeroes, discard, guest cluster
// 0 whose data sits at data file offset 0) read back identically through
// qemu-img, pass `qemu-img check`, and `qemu-img compare` finds them equal
// to a raw reference; with data_file_raw the data file alone is that raw
// image. Also: a chain above a data-file image, a data-file image over a
// backing file, and the malformed cases (a missing data file, the bit
// without a name, the raw bit without the bit), which fail with a clear
// error and leave the files untouched.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "qcow2/image.h"
#include "qcow2/options.h"
#include "qcow2/queue.h"
#include "tests/util/queued_read.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using ::qcow2::testing::CommandResult;
using ::qcow2::testing::Run;
using ::qcow2::testing::TempDir;
using ::testing::HasSubstr;

constexpr uint64_t kSize = 4ull << 20;
constexpr uint64_t kCluster = 65536;

struct Variant {
  bool raw;
  bool extended;
};

std::string Name(const Variant& v) {
  return absl::StrCat(v.raw ? "raw" : "notraw", v.extended ? "-extl2" : "");
}

bool LongTests() {
  const char* v = getenv("QCOW2_LONG_TESTS");
  return v != nullptr && std::string(v) == "1";
}

// Default: not raw with standard L2 entries, raw with extended ones;
// QCOW2_LONG_TESTS=1: all four.
std::vector<Variant> Variants() {
  if (!LongTests()) return {{false, false}, {true, true}};
  return {{false, false}, {true, false}, {false, true}, {true, true}};
}

// Runs `argv` from the directory of its last argument (an image path):
// a relative data file name resolves from there, for QEMU and for us.
CommandResult Qemu(const std::vector<std::string>& argv) {
  const std::string& last = argv.back();
  const size_t slash = last.rfind('/');
  if (slash == std::string::npos) return Run(argv);
  std::string cmd = absl::StrCat("cd '", last.substr(0, slash), "' &&");
  for (const std::string& a : argv) absl::StrAppend(&cmd, " '", a, "'");
  return ::qcow2::testing::RunShell(cmd);
}

// A file's bytes (empty if it cannot be read).
std::vector<uint8_t> ReadFileBytes(const std::string& path) {
  absl::StatusOr<std::vector<uint8_t>> b = ::qcow2::testing::ReadFileBytes(path);
  return b.ok() ? *std::move(b) : std::vector<uint8_t>();
}

CommandResult QemuIo(const std::string& path,
                     const std::vector<std::string>& cmds) {
  std::vector<std::string> argv = {"qemu-io", "-f", "qcow2"};
  for (const std::string& c : cmds) {
    argv.push_back("-c");
    argv.push_back(c);
  }
  argv.push_back(path);
  return Qemu(argv);
}

// qemu-img create -f qcow2 -o data_file=...; `more` adds options.
void QemuCreate(const std::string& path, const std::string& data,
                const Variant& v, const std::string& more = "") {
  // QEMU opens a relative data file name from the working directory:
  // the library's opens here come from the test's, so the name is
  // absolute (the CLI tests below use relative names from the image's).
  const std::string dir = path.substr(0, path.rfind('/'));
  std::string o = absl::StrCat("data_file=",
                               data[0] == '/' ? data : dir + "/" + data);
  if (v.raw) absl::StrAppend(&o, ",data_file_raw=on");
  if (v.extended) absl::StrAppend(&o, ",extended_l2=on");
  if (!more.empty()) absl::StrAppend(&o, ",", more);
  CommandResult r = ::qcow2::testing::RunShell(
      absl::StrCat("cd '", dir, "' && qemu-img create -q -f qcow2 -o '", o,
                   "' '", path, "' ", kSize));
  ASSERT_EQ(r.exit_code, 0) << r.err;
}

void ExpectQemuCheckClean(const std::string& path) {
  CommandResult r = Qemu({"qemu-img", "check", path});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("No errors were found"));
}

void ExpectCompareEqual(const std::string& a, const std::string& fmt_a,
                        const std::string& b) {
  CommandResult r =
      Qemu({"qemu-img", "compare", "-f", fmt_a, "-F", "raw", a, b});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("Images are identical"));
}

std::vector<uint8_t> Pattern(size_t len, uint8_t seed) {
  std::vector<uint8_t> v(len);
  for (size_t i = 0; i < len; ++i) {
    v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 9));
  }
  return v;
}

// The guest's disk as the writes below leave it.
struct Model {
  std::vector<uint8_t> bytes = std::vector<uint8_t>(kSize, 0);
  void Put(uint64_t off, const std::vector<uint8_t>& d) {
    std::copy(d.begin(), d.end(), bytes.begin() + off);
  }
  void Fill(uint64_t off, uint64_t len, uint8_t b) {
    std::fill(bytes.begin() + off, bytes.begin() + off + len, b);
  }
};

void WriteRaw(const std::string& path, const Model& m) {
  FILE* f = fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(fwrite(m.bytes.data(), 1, m.bytes.size(), f), m.bytes.size());
  fclose(f);
}

std::unique_ptr<Image> Open(const std::string& path, bool rw) {
  OpenOptions o;
  o.read_write = rw;
  auto img = Image::Open(path, o);
  EXPECT_TRUE(img.ok()) << img.status();
  return img.ok() ? std::move(img).value() : nullptr;
}

std::vector<uint8_t> ReadAll(Image* img) {
  std::vector<uint8_t> got(kSize, 0xEE);
  EXPECT_TRUE(img->Read(0, absl::MakeSpan(got)).ok());
  return got;
}

// The same through an io_uring queue (depth 8, one cluster per read).
std::vector<uint8_t> ReadAllQueued(Image* img) {
  return ::qcow2::testing::ReadAllQueued(img, kSize, kCluster);
}

// Where `got` first differs from `want`, or -1.
int64_t FirstDifference(const std::vector<uint8_t>& got,
                        const std::vector<uint8_t>& want) {
  if (got.size() != want.size()) return -2;  // not even the size
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      return static_cast<int64_t>(i);
    }
  }
  return -1;
}

// The model equals the image read back through us (both paths).
void ExpectWeRead(const std::string& path, const Model& m) {
  std::unique_ptr<Image> img = Open(path, false);
  ASSERT_NE(img, nullptr);
  EXPECT_EQ(FirstDifference(ReadAll(img.get()), m.bytes), -1);
  EXPECT_EQ(FirstDifference(ReadAllQueued(img.get()), m.bytes), -1);
}

// ---- QEMU writes, we read ---------------------------------------------------

TEST(DataFileTest, QemuWritesWeRead) {
  for (const Variant& v : Variants()) {
    SCOPED_TRACE(Name(v));
    TempDir dir;
    const std::string path = dir.File("q.qcow2");
    QemuCreate(path, "q.data", v);
    // Whole clusters from guest 0, a partial cluster, zeroes with and
    // without unmap, a discard, sectors apart.
    CommandResult r = QemuIo(
        path, {"write -P 0x11 0 192k", "write -P 0x22 300k 3k",
               "write -z 64k 64k", "write -z -u 128k 8k", "discard 1m 64k",
               "write -P 0x33 1m 512", "write -P 0x44 4095k 1k"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    Model m;
    m.Fill(0, 192 * 1024, 0x11);
    m.Fill(300 * 1024, 3 * 1024, 0x22);
    m.Fill(64 * 1024, 64 * 1024, 0);
    m.Fill(128 * 1024, 8 * 1024, 0);
    m.Fill(1 << 20, 512, 0x33);
    m.Fill(4095 * 1024, 1024, 0x44);
    ExpectWeRead(path, m);
    if (v.raw) {
      // And QEMU's raw data file is that disk (our reference agrees).
      const std::string ref = dir.File("ref.raw");
      WriteRaw(ref, m);
      ExpectCompareEqual(dir.File("q.data"), "raw", ref);
    }
  }
}

// ---- we write, QEMU reads ---------------------------------------------------

// Writes through the library that exercise every data path, mirrored in
// `m`: in place, allocating (guest cluster 0 too), copy-on-write inside a
// cluster, zeroes (partial and whole, unmapping), discard, a queue.
void OurWrites(const std::string& path, Model* m) {
  std::unique_ptr<Image> img = Open(path, true);
  ASSERT_NE(img, nullptr);
  auto put = [&](uint64_t off, size_t len, uint8_t seed) {
    std::vector<uint8_t> d = Pattern(len, seed);
    ASSERT_TRUE(img->Write(off, d).ok()) << off;
    m->Put(off, d);
  };
  put(0, 4096, 1);                 // guest cluster 0: data file offset 0
  put(70 * 1024, 5000, 2);         // inside a cluster, unaligned
  put(256 * 1024, 192 * 1024, 3);  // whole clusters
  put(300 * 1024, 1000, 4);        // in place
  put(2 * 1024 * 1024 - 512, 1024, 5);  // across clusters
  ASSERT_TRUE(img->WriteZeroes(256 * 1024, 64 * 1024).ok());
  m->Fill(256 * 1024, 64 * 1024, 0);
  ASSERT_TRUE(img->WriteZeroes(400 * 1024, 10 * 1024).ok());
  m->Fill(400 * 1024, 10 * 1024, 0);
  ASSERT_TRUE(img->Discard(384 * 1024, 0).ok());
  ASSERT_TRUE(img->Flush().ok());
  {
    // A queue: allocating writes and a flush on the ring.
    QueueOptions qo;
    qo.depth = 4;
    auto q = img->CreateQueue(qo);
    ASSERT_TRUE(q.ok()) << q.status();
    std::vector<std::vector<uint8_t>> bufs;
    int failed = 0;
    for (int i = 0; i < 8; ++i) {
      const uint64_t off = (3ull << 20) + i * 36 * 1024;
      bufs.push_back(Pattern(8192, static_cast<uint8_t>(40 + i)));
      m->Put(off, bufs.back());
    }
    for (int i = 0; i < 8; ++i) {
      while ((*q)->in_flight() >= 4) (*q)->Poll(1);
      const uint64_t off = (3ull << 20) + i * 36 * 1024;
      ASSERT_TRUE((*q)->SubmitWrite(off, bufs[i], [&failed](absl::Status s) {
                           failed += !s.ok();
                         })
                      .ok());
    }
    while ((*q)->in_flight() > 0) (*q)->Poll(1);
    ASSERT_TRUE((*q)->SubmitFlush([&failed](absl::Status s) {
                       failed += !s.ok();
                     })
                    .ok());
    while ((*q)->in_flight() > 0) (*q)->Poll(1);
    EXPECT_EQ(failed, 0);
  }
  ASSERT_TRUE(img->Discard(3ull << 20, 64 * 1024).ok());
  m->Fill(3ull << 20, 64 * 1024, 0);
  ASSERT_TRUE(img->Close().ok());
}

void ExpectQemuAgrees(const TempDir& dir, const std::string& path,
                      const Model& m, bool raw) {
  ExpectQemuCheckClean(path);
  const std::string ref = dir.File("ref.raw");
  WriteRaw(ref, m);
  ExpectCompareEqual(path, "qcow2", ref);
  ExpectWeRead(path, m);
  if (raw) ExpectCompareEqual(dir.File("d.data"), "raw", ref);
}

TEST(DataFileTest, WeWriteQemuReads) {
  for (const Variant& v : Variants()) {
    SCOPED_TRACE(Name(v));
    TempDir dir;
    const std::string path = dir.File("w.qcow2");
    QemuCreate(path, "d.data", v);
    Model m;
    OurWrites(path, &m);
    ExpectQemuAgrees(dir, path, m, v.raw);
  }
}

// What QEMU wrote before, then ours over it: in-place writes into QEMU's
// clusters, zeroes over them.
TEST(DataFileTest, WeWriteOverQemusData) {
  for (const Variant& v : Variants()) {
    SCOPED_TRACE(Name(v));
    TempDir dir;
    const std::string path = dir.File("w.qcow2");
    QemuCreate(path, "d.data", v);
    ASSERT_EQ(QemuIo(path, {"write -P 0x5a 0 1m"}).exit_code, 0);
    Model m;
    m.Fill(0, 1 << 20, 0x5a);
    OurWrites(path, &m);
    ExpectQemuAgrees(dir, path, m, v.raw);
  }
}

// ---- chains ----------------------------------------------------------------

// An overlay whose backing file has a data file: our copy-on-write reads
// the backing file's data file.
TEST(DataFileTest, OverlayAboveDataFileImage) {
  for (const Variant& v : Variants()) {
    SCOPED_TRACE(Name(v));
    TempDir dir;
    const std::string base = dir.File("base.qcow2");
    QemuCreate(base, "base.data", v);
    ASSERT_EQ(QemuIo(base, {"write -P 0x66 0 2m"}).exit_code, 0);
    const std::string top = dir.File("top.qcow2");
    ASSERT_EQ(Qemu({"qemu-img", "create", "-q", "-f", "qcow2", "-b",
                    "base.qcow2", "-F", "qcow2", top})
                  .exit_code,
              0);
    Model m;
    m.Fill(0, 2 << 20, 0x66);
    {
      std::unique_ptr<Image> img = Open(top, true);
      ASSERT_NE(img, nullptr);
      std::vector<uint8_t> d = Pattern(3000, 9);
      ASSERT_TRUE(img->Write(100 * 1024, d).ok());
      m.Put(100 * 1024, d);
      ASSERT_TRUE(img->Close().ok());
    }
    ExpectQemuCheckClean(top);
    const std::string ref = dir.File("ref.raw");
    WriteRaw(ref, m);
    ExpectCompareEqual(top, "qcow2", ref);
    ExpectWeRead(top, m);
  }
}

// A data-file image over a backing file: copy-on-write from the backing
// file into the data file.
TEST(DataFileTest, DataFileImageOverBackingFile) {
  for (bool extended : {false, true}) {
    SCOPED_TRACE(extended);
    TempDir dir;
    const std::string base = dir.File("base.qcow2");
    ASSERT_EQ(Qemu({"qemu-img", "create", "-q", "-f", "qcow2", base,
                    absl::StrCat(kSize)})
                  .exit_code,
              0);
    ASSERT_EQ(QemuIo(base, {"write -P 0x77 0 4m"}).exit_code, 0);
    const std::string path = dir.File("d.qcow2");
    QemuCreate(path, "d.data", {false, extended},
               "backing_file=base.qcow2,backing_fmt=qcow2");
    Model m;
    m.Fill(0, kSize, 0x77);
    {
      std::unique_ptr<Image> img = Open(path, true);
      ASSERT_NE(img, nullptr);
      std::vector<uint8_t> d = Pattern(5000, 3);
      ASSERT_TRUE(img->Write(0, d).ok());
      m.Put(0, d);
      d = Pattern(4096, 4);
      ASSERT_TRUE(img->Write(1000 * 1024, d).ok());
      m.Put(1000 * 1024, d);
      ASSERT_TRUE(img->WriteZeroes(2 << 20, 64 * 1024).ok());
      m.Fill(2 << 20, 64 * 1024, 0);
      ASSERT_TRUE(img->Close().ok());
    }
    ExpectQemuCheckClean(path);
    const std::string ref = dir.File("ref.raw");
    WriteRaw(ref, m);
    ExpectCompareEqual(path, "qcow2", ref);
    ExpectWeRead(path, m);
  }
}

// ---- refusals ----------------------------------------------------------------

TEST(DataFileTest, MissingDataFileFailsUntouched) {
  TempDir dir;
  const std::string path = dir.File("m.qcow2");
  QemuCreate(path, "m.data", {false, false});
  ASSERT_EQ(QemuIo(path, {"write -P 1 0 64k"}).exit_code, 0);
  ASSERT_EQ(std::rename(dir.File("m.data").c_str(),
                        dir.File("gone").c_str()),
            0);
  const std::vector<uint8_t> before = ReadFileBytes(path);
  OpenOptions o;
  o.read_write = true;
  auto img = Image::Open(path, o);
  ASSERT_FALSE(img.ok());
  EXPECT_THAT(std::string(img.status().message()),
              HasSubstr("cannot open its external data file"));
  EXPECT_TRUE(ReadFileBytes(path) == before);
  // The data-file option names it elsewhere, as QEMU's data-file does.
  o.data_file = dir.File("gone");
  auto again = Image::Open(path, o);
  ASSERT_TRUE(again.ok()) << again.status();
  std::vector<uint8_t> buf(65536);
  ASSERT_TRUE((*again)->Read(0, absl::MakeSpan(buf)).ok());
  EXPECT_EQ(buf[0], 1);
  EXPECT_EQ(buf[65535], 1);
}

// Flips header bits of a fresh image: byte offsets of the v3 header.
void SetU64(const std::string& path, long at, uint64_t v) {
  FILE* f = fopen(path.c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (56 - 8 * i));
  ASSERT_EQ(fseek(f, at, SEEK_SET), 0);
  ASSERT_EQ(fwrite(b, 1, 8, f), 8u);
  fclose(f);
}

TEST(DataFileTest, InconsistentBitsRefused) {
  TempDir dir;
  // The raw bit without the data-file bit (and no name).
  const std::string a = dir.File("a.qcow2");
  ASSERT_EQ(Qemu({"qemu-img", "create", "-q", "-f", "qcow2", a, "1M"})
                .exit_code,
            0);
  SetU64(a, 88, 2);  // autoclear: raw external data
  std::vector<uint8_t> before = ReadFileBytes(a);
  OpenOptions o;
  o.read_write = true;
  auto img = Image::Open(a, o);
  ASSERT_FALSE(img.ok());
  EXPECT_THAT(std::string(img.status().message()),
              HasSubstr("raw external data bit is set"));
  EXPECT_TRUE(ReadFileBytes(a) == before);
  CommandResult q = QemuIo(a, {"read 0 512"});
  EXPECT_NE(q.exit_code, 0);  // QEMU refuses it too

  // The data-file bit without a name.
  const std::string b = dir.File("b.qcow2");
  ASSERT_EQ(Qemu({"qemu-img", "create", "-q", "-f", "qcow2", b, "1M"})
                .exit_code,
            0);
  SetU64(b, 72, 4);  // incompatible: external data file
  before = ReadFileBytes(b);
  img = Image::Open(b, o);
  ASSERT_FALSE(img.ok());
  EXPECT_THAT(std::string(img.status().message()),
              HasSubstr("names no data file"));
  EXPECT_TRUE(ReadFileBytes(b) == before);
  q = QemuIo(b, {"read 0 512"});
  EXPECT_NE(q.exit_code, 0);
}

// Compressed writes and data files do not mix (QEMU refuses them too).
TEST(DataFileTest, CompressedWriteRefused) {
  TempDir dir;
  const std::string path = dir.File("c.qcow2");
  QemuCreate(path, "c.data", {false, false});
  std::unique_ptr<Image> img = Open(path, true);
  ASSERT_NE(img, nullptr);
  std::vector<uint8_t> d(kCluster, 7);
  absl::Status s = img->WriteCompressed(0, d);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("external data file"));
}

// The data file is locked as QEMU locks it: while we write the image,
// QEMU can open neither the image nor the data file for writing.
TEST(DataFileTest, DataFileLocked) {
  TempDir dir;
  const std::string path = dir.File("l.qcow2");
  QemuCreate(path, "l.data", {true, false});
  std::unique_ptr<Image> img = Open(path, true);
  ASSERT_NE(img, nullptr);
  CommandResult r = Qemu({"qemu-io", "-f", "raw", "-c", "write 0 512",
                         dir.File("l.data")});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("lock"));
  r = Qemu({"qemu-io", "-r", "-U", "-f", "raw", "-c", "read 0 512",
           dir.File("l.data")});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// ---- qcowtool beside qemu-img ---------------------------------------------

std::string Tool() { return QCOWTOOL_BIN; }

// Runs `argv` from `dir` (relative names, as an operator types them).
CommandResult RunIn(const TempDir& dir, const std::vector<std::string>& argv) {
  std::string cmd = absl::StrCat("cd '", dir.File(""), "' &&");
  for (const std::string& a : argv) absl::StrAppend(&cmd, " '", a, "'");
  return ::qcow2::testing::RunShell(cmd);
}

// The same verb through both tools prints the same bytes.
void ExpectSameOutput(const TempDir& dir, std::vector<std::string> args) {
  std::vector<std::string> ours = {Tool()}, theirs = {"qemu-img"};
  ours.insert(ours.end(), args.begin(), args.end());
  theirs.insert(theirs.end(), args.begin(), args.end());
  CommandResult a = RunIn(dir, ours), b = RunIn(dir, theirs);
  EXPECT_EQ(a.exit_code, b.exit_code) << args[0] << "\n" << a.err << b.err;
  EXPECT_EQ(a.out, b.out) << args[0];
}

TEST(DataFileTest, CliMatchesQemuImg) {
  for (bool raw : LongTests() ? std::vector<bool>{false, true}
                              : std::vector<bool>{true}) {
    SCOPED_TRACE(raw);
    TempDir dir;
    // qcowtool creates one, qemu-img the other, alike.
    std::string o = raw ? "data_file=w.data,data_file_raw=on" : "data_file=w.data";
    CommandResult c = RunIn(dir, {Tool(), "create", "-f", "qcow2", "-o", o,
                                  "w.qcow2", "4M"});
    ASSERT_EQ(c.exit_code, 0) << c.err;
    CommandResult q = RunIn(dir, {"qemu-img", "create", "-f", "qcow2", "-o",
                                  raw ? "data_file=q.data,data_file_raw=on"
                                      : "data_file=q.data",
                                  "q.qcow2", "4M"});
    ASSERT_EQ(q.exit_code, 0) << q.err;
    // The "Formatting" line, file names aside.
    std::string ours = c.out, theirs = q.out;
    for (std::string* line : {&ours, &theirs}) {
      for (const char* n : {"w.qcow2", "q.qcow2"}) {
        size_t at = line->find(n);
        if (at != std::string::npos) line->replace(at, 7, "x.qcow2");
      }
      for (const char* n : {"w.data", "q.data"}) {
        size_t at = line->find(n);
        if (at != std::string::npos) line->replace(at, 6, "x.data");
      }
    }
    EXPECT_EQ(ours, theirs);
    EXPECT_EQ(ReadFileBytes(dir.File("w.data")).size(), 4u << 20);
    ExpectQemuCheckClean(dir.File("w.qcow2"));
    for (const char* img : {"w.qcow2", "q.qcow2"}) {
      ASSERT_EQ(QemuIo(dir.File(img), {"write -P 0x21 0 128k",
                                       "write -P 0x22 1m 4k",
                                       "write -z 2m 64k"})
                    .exit_code,
                0);
      ExpectSameOutput(dir, {"info", img});
      ExpectSameOutput(dir, {"info", "--output=json", img});
      ExpectSameOutput(dir, {"check", img});
      ExpectSameOutput(dir, {"check", "--output=json", img});
      ExpectSameOutput(dir, {"map", img});
      ExpectSameOutput(dir, {"map", "--output=json", img});
    }
  }
}

// The data regions of a file (SEEK_DATA/SEEK_HOLE), as offset pairs.
std::vector<std::pair<off_t, off_t>> DataRegions(const std::string& path) {
  std::vector<std::pair<off_t, off_t>> v;
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return v;
  const off_t end = lseek(fd, 0, SEEK_END);
  for (off_t at = 0; at < end;) {
    const off_t data = lseek(fd, at, SEEK_DATA);
    if (data < 0) break;
    const off_t hole = lseek(fd, data, SEEK_HOLE);
    v.push_back({data, hole});
    at = hole;
  }
  close(fd);
  return v;
}

// A discard, and write-zeroes with unmap, let the data file's clusters go
// (holes punched) when it is not raw, as QEMU 7.2 does: the same steps by
// qemu-io and by `qcowtool io` on two alike images leave the same holes
// (and the same image file); write-zeroes without unmap and part
// of a cluster keep theirs; a cluster written again after its punch keeps
// its new data.
TEST(DataFileTest, DiscardPunchesNotRawDataFile) {
  SKIP_WITHOUT_QEMU();
  TempDir q, w;  // alike names: the image files compare byte for byte
  const std::vector<std::string> steps = {
      "write -P 1 0 4m",  "discard 0 2m",        "write -z -u 2m 1m",
      "write -z 3m 512k", "discard 3584k 100k",  "write -P 2 0 64k",
      "discard 0 64k",    "write -P 3 1m 64k",   "discard 1028k 60k"};
  for (const TempDir* dir : {&q, &w}) {
    CommandResult c =
        RunIn(*dir, {"qemu-img", "create", "-q", "-f", "qcow2", "-o",
                     "data_file=x.data", "x.qcow2", "8M"});
    ASSERT_EQ(c.exit_code, 0) << c.err;
    std::vector<std::string> argv = {"qemu-io"};
    if (dir == &w) argv = {Tool(), "io"};
    for (const std::string& st : steps) {
      argv.push_back("-c");
      argv.push_back(st);
    }
    argv.push_back("x.qcow2");
    c = RunIn(*dir, argv);
    ASSERT_EQ(c.exit_code, 0) << c.err;
  }
  // QEMU's holes (what `du` of the lead's steps showed), and ours alike.
  const auto theirs = DataRegions(q.File("x.data"));
  const std::vector<std::pair<off_t, off_t>> want = {
      {1 << 20, (1 << 20) + 65536}, {3 << 20, 3584 << 10}, {3648 << 10, 4 << 20}};
  EXPECT_EQ(theirs, want);
  EXPECT_EQ(DataRegions(w.File("x.data")), theirs);
  // (The data files' bytes differ where part of a cluster was discarded:
  // QEMU leaves those bytes, we zero them, as Image::Discard promises.)
  EXPECT_TRUE(ReadFileBytes(w.File("x.qcow2")) ==
              ReadFileBytes(q.File("x.qcow2")));
  ExpectQemuCheckClean(w.File("x.qcow2"));
  CommandResult r = QemuIo(w.File("x.qcow2"),
                           {"read -P 0 0 1m", "read -P 3 1m 4k",
                            "read -P 0 1088k 1984k", "read -P 0 3m 576k",
                            "read -P 1 3712k 384k"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("Pattern verification failed")));
}

// qemu-img map names the data file in its file column.
TEST(DataFileTest, MapNamesDataFile) {
  TempDir dir;
  ASSERT_EQ(RunIn(dir, {"qemu-img", "create", "-q", "-f", "qcow2", "-o",
                        "data_file=m.data", "m.qcow2", "4M"})
                .exit_code,
            0);
  ASSERT_EQ(QemuIo(dir.File("m.qcow2"), {"write -P 0x21 0 128k"}).exit_code, 0);
  CommandResult r = RunIn(dir, {Tool(), "map", "m.qcow2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("0               0x20000         0               m.data"));
}

// convert into and out of a data-file image, resize, and commit of an
// overlay into one, each judged by qemu-img.
TEST(DataFileTest, ConvertResizeCommit) {
  TempDir dir;
  QemuCreate(dir.File("src.qcow2"), "src.data", {false, false});
  ASSERT_EQ(QemuIo(dir.File("src.qcow2"),
                   {"write -P 0x31 0 256k", "write -P 0x32 3m 4k"})
                .exit_code,
            0);
  CommandResult r = RunIn(dir, {Tool(), "convert", "-O", "qcow2", "-o",
                                "data_file=dst.data", "src.qcow2",
                                "dst.qcow2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ExpectQemuCheckClean(dir.File("dst.qcow2"));
  r = Qemu({"qemu-img", "compare", dir.File("src.qcow2"),
            dir.File("dst.qcow2")});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  r = RunIn(dir, {Tool(), "convert", "-O", "raw", "dst.qcow2", "out.raw"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Qemu({"qemu-img", "compare", "-F", "raw", dir.File("src.qcow2"),
            dir.File("out.raw")});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;

  // Resize: the data file follows the disk's size, both ways.
  r = RunIn(dir, {Tool(), "resize", "dst.qcow2", "8M"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ReadFileBytes(dir.File("dst.data")).size(), 8u << 20);
  ExpectQemuCheckClean(dir.File("dst.qcow2"));
  r = RunIn(dir, {Tool(), "resize", "--shrink", "dst.qcow2", "2M"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ReadFileBytes(dir.File("dst.data")).size(), 2u << 20);
  ExpectQemuCheckClean(dir.File("dst.qcow2"));

  // Commit an overlay into a data-file image.
  ASSERT_EQ(Qemu({"qemu-img", "create", "-q", "-f", "qcow2", "-b",
                  "dst.qcow2", "-F", "qcow2", dir.File("top.qcow2")})
                .exit_code,
            0);
  ASSERT_EQ(QemuIo(dir.File("top.qcow2"), {"write -P 0x41 4k 70k"}).exit_code,
            0);
  Model m;
  m.Fill(0, 256 * 1024, 0x31);
  m.Fill(4096, 70 * 1024, 0x41);
  m.bytes.resize(2u << 20);
  r = RunIn(dir, {Tool(), "commit", "top.qcow2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ExpectQemuCheckClean(dir.File("dst.qcow2"));
  const std::string ref = dir.File("ref.raw");
  FILE* f = fopen(ref.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  fwrite(m.bytes.data(), 1, m.bytes.size(), f);
  fclose(f);
  ExpectCompareEqual(dir.File("dst.qcow2"), "qcow2", ref);
}

}  // namespace
}  // namespace qcow2
