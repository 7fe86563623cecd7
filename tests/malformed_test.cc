// SPDX-License-Identifier: Apache-2.0
// The malformed-image corpus (tests/malformed_corpus.py) against the library
// and qcowtool.
//
// For every case the script builds (valid QEMU images with bytes patched),
// this test checks, as the manifest says:
//  - a read-only open fails with the right code and message, or succeeds and
//    every cluster of the disk reads, except the ranges that must fail (each
//    with the right message);
//  - a read-write open and a 4 KiB write at the case's offset fail or
//    succeed as expected;
//  - `qcowtool info`, `info --backing-chain` and `check` exit with the
//    expected codes (never a signal, never a hang);
//  - every error message contains the expected text and names the file;
//  - no byte of any file changes, except where the manifest allows it (the
//    corrupt bit when a write meets an inconsistency; anything when a write
//    is legitimately accepted).
//
// Each case builds only its own files (`--only NAME`, well under a second),
// so every case is its own test. Needs python3, qemu-img and qemu-io; skips
// without them.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest-spi.h"
#include "qcow2/image.h"
#include "tests/util/harden_sha256.h"
#include "tests/util/json_lite.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using testing::CommandResult;
using ::testing::HasSubstr;
using testing::Run;
using testing::TempDir;
namespace json = testing::json;

// Every case of the corpus, in the script's order (`malformed_corpus.py
// --list`; ScriptListsEveryCase keeps the two in step).
constexpr const char* kCases[] = {
    // Header fields and extensions.
    "header_length_huge",
    "header_length_misaligned",
    "header_length_short",
    "cluster_bits_8",
    "cluster_bits_22",
    "ext_length_overflow",
    "ext_length_past_cluster",
    "ext_length_into_backing_name",
    "ext_header_truncated",
    "virtual_size_huge",
    // Tables the header points at.
    "l1_size_overflow",
    "l1_size_too_small",
    "l1_past_eof",
    "l1_overlaps_refcount_table",
    "l1_overlaps_header",
    "l1_unaligned",
    "l1_above_2_56",
    "l1_offset_wraps",
    "refcount_table_past_eof",
    "refcount_table_overlaps_header",
    "refcount_table_clusters_huge",
    "refcount_table_clusters_zero",
    "snapshot_count_huge",
    "snapshot_table_past_eof",
    "snapshot_table_overlaps_l1",
    "truncated_file",
    // Feature bits.
    "incompat_unknown_named",
    "incompat_unknown_unnamed",
    "refcount_order_7",
    "crypt_method_aes",
    "external_data_file_unnamed",
    "compression_type_unknown",
    "corrupt_bit",
    "dirty_bit",
    // Backing files.
    "backing_name_too_long",
    "backing_name_past_cluster",
    "backing_offset_in_header",
    "backing_protocol_nbd",
    "backing_protocol_json",
    "backing_nul_byte",
    "backing_missing",
    "backing_loop_self",
    "backing_loop_pair",
    "backing_loop_symlink",
    "backing_chain_too_deep",
    // L1 and L2 entries.
    "l1_entry_unaligned",
    "l1_entry_past_eof",
    "l1_entry_reserved_bits",
    "l1_entry_points_at_refcount_table",
    "l1_entry_points_at_l1",
    "l2_offset_zero_copied",
    "l2_points_at_l1",
    "l2_points_at_refcount_table",
    "l2_points_at_refcount_block",
    "l2_points_at_own_table",
    "l2_offset_above_2_56",
    "l2_unaligned",
    "l2_past_eof",
    // Compressed clusters.
    "compressed_past_eof",
    "compressed_above_2_56",
    "compressed_in_header",
    "compressed_garbage",
    "compressed_short_stream",
    "compressed_bomb",
    "compressed_zstd_garbage",
    // Extended L2 entries.
    "xl2_alloc_and_zero",
    "xl2_alloc_without_offset",
    "xl2_zero_flag_set",
    "xl2_compressed_with_bitmap",
    // Refcount structure (matters to writers).
    "refcount_block_unaligned",
    "refcount_block_points_at_l1",
    "refcount_block_past_eof",
    "refcounts_zero_for_metadata",
    // Internal snapshot table contents.
    "snapshot_extra_data_huge",
    "snapshot_l1_size_huge",
    // Persistent dirty bitmaps.
    "bitmap_flags_reserved",
    "bitmap_type_2",
    "bitmap_name_size_0",
    "bitmap_table_unaligned",
    "bitmap_table_past_eof",
};

std::string ScriptPath() {
  return std::string(QCOW2_SOURCE_DIR) + "/tests/malformed_corpus.py";
}

std::string Python() {
  return access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
}

bool HavePython() {
  static const bool have = Run({Python(), "--version"}).exit_code == 0;
  return have;
}

#define SKIP_WITHOUT_TOOLS()                         \
  do {                                               \
    SKIP_WITHOUT_QEMU();                             \
    if (!HavePython()) GTEST_SKIP() << "no python3"; \
  } while (0)

// Runs the script into `dir` (only `only` when not empty) and returns the
// parsed manifest.
absl::StatusOr<json::Value> BuildCorpus(const std::string& dir,
                                        const std::string& only) {
  std::vector<std::string> argv = {Python(), ScriptPath(), dir};
  if (!only.empty()) {
    argv.push_back("--only");
    argv.push_back(only);
  }
  CommandResult r = Run(argv);
  if (r.exit_code != 0) {
    return absl::InternalError(absl::StrCat("malformed_corpus.py failed (exit ",
                                            r.exit_code, "): ", r.out, r.err));
  }
  absl::StatusOr<std::vector<uint8_t>> text =
      testing::ReadFileBytes(dir + "/manifest.json");
  if (!text.ok()) return text.status();
  return json::Parse(std::string(text->begin(), text->end()));
}

std::string Basename(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool Contains(const json::Value& list, int64_t v) {
  for (const json::Value& e : list.array()) {
    if (e.as_int64() == v) return true;
  }
  return false;
}

// The status must be an error with the expected code, text and file name.
// Returns whether it is.
bool ExpectError(const absl::Status& s, const json::Value& spec,
                 const std::string& where) {
  if (s.ok()) {
    ADD_FAILURE() << where << ": expected an error containing '"
                  << spec["message"].as_string() << "', got success";
    return false;
  }
  const std::string msg(s.message());
  const std::string code = absl::StatusCodeToString(s.code());
  bool ok = true;
  if (code != spec["code"].as_string()) {
    ok = false;
    ADD_FAILURE() << where << ": expected code " << spec["code"].as_string()
                  << ", got " << s;
  }
  if (!absl::StrContains(msg, spec["message"].as_string())) {
    ok = false;
    ADD_FAILURE() << where << ": the error does not say '"
                  << spec["message"].as_string() << "': " << s;
  }
  if (!absl::StrContains(msg, spec["names"].as_string())) {
    ok = false;
    ADD_FAILURE() << where << ": the error does not name "
                  << spec["names"].as_string() << ": " << s;
  }
  return ok;
}

// The whole state of a case's files: bytes (for diagnostics) and digests.
struct Snapshot {
  std::map<std::string, std::vector<uint8_t>> bytes;
  std::map<std::string, std::string> sha256;
};

absl::StatusOr<Snapshot> TakeSnapshot(const std::vector<std::string>& files) {
  Snapshot snap;
  for (const std::string& f : files) {
    absl::StatusOr<std::vector<uint8_t>> b = testing::ReadFileBytes(f);
    if (!b.ok()) return b.status();
    snap.sha256[f] = testing::Sha256Hex(*b);
    snap.bytes[f] = std::move(*b);
  }
  return snap;
}

// How two byte strings differ, for messages: size and the first and last
// differing offsets in the common part.
std::string Difference(const std::vector<uint8_t>& a,
                       const std::vector<uint8_t>& b) {
  std::string out;
  if (a.size() != b.size()) {
    out = absl::StrCat("size ", a.size(), " -> ", b.size(), "; ");
  }
  const size_t common = std::min(a.size(), b.size());
  size_t n = 0, first = 0, last = 0;
  for (size_t i = 0; i < common; ++i) {
    if (a[i] != b[i]) {
      if (n++ == 0) first = i;
      last = i;
    }
  }
  if (n == 0) return absl::StrCat(out, "common bytes equal");
  return absl::StrCat(out, n, " bytes differ in [0x", absl::Hex(first), ", 0x",
                      absl::Hex(last + 1), ")");
}

// `allow`: "no" (nothing may change), "corrupt-bit" (only the corrupt bit
// of `image`'s header may become set), "yes" (anything).
void ExpectUnchanged(const Snapshot& before, const std::string& image,
                     const std::string& allow, const std::string& where) {
  if (allow == "yes") return;
  for (const auto& [path, old_bytes] : before.bytes) {
    // A write far past the end leaves a huge sparse file: compare sizes
    // before reading it.
    struct stat st;
    ASSERT_EQ(stat(path.c_str(), &st), 0) << path;
    if (static_cast<uint64_t>(st.st_size) != old_bytes.size() &&
        static_cast<uint64_t>(st.st_size) > (256u << 20)) {
      ADD_FAILURE() << where << ": " << Basename(path) << " grew from "
                    << old_bytes.size() << " to " << st.st_size << " bytes";
      continue;
    }
    absl::StatusOr<std::vector<uint8_t>> now = testing::ReadFileBytes(path);
    ASSERT_TRUE(now.ok()) << now.status();
    if (testing::Sha256Hex(*now) == before.sha256.at(path)) continue;
    if (allow == "corrupt-bit" && path == image &&
        now->size() == old_bytes.size() && now->size() > 79) {
      std::vector<uint8_t> masked = *now;
      // Incompatible features are bytes 72..79, big endian: bit 1 (corrupt)
      // lives in byte 79.
      masked[79] =
          static_cast<uint8_t>((masked[79] & ~2) | (old_bytes[79] & 2));
      if (masked == old_bytes) continue;
      ADD_FAILURE() << where << ": " << Basename(path)
                    << " changed beyond the corrupt bit ("
                    << Difference(old_bytes, masked) << ")";
      continue;
    }
    ADD_FAILURE() << where << ": " << Basename(path) << " was modified ("
                  << Difference(old_bytes, *now) << ")";
  }
}

// Reads the whole disk a cluster at a time; reads overlapping an error
// range must fail as `ro` says, every other read must succeed.
void ReadEverything(Image& img, const json::Value& ro,
                    const std::string& where) {
  std::vector<LayerInfo> info = img.GetChainInfo();
  uint64_t chunk =
      info.empty() || info[0].cluster_size == 0 ? 65536 : info[0].cluster_size;
  const uint64_t size = std::min<uint64_t>(img.size(), 64ull << 20);
  std::vector<uint8_t> buf(chunk);
  int unexpected_ok = 0, unexpected_err = 0;
  std::string first_problem;
  for (uint64_t off = 0; off < size; off += chunk) {
    const uint64_t n = std::min(chunk, size - off);
    bool in_error = false;
    for (const json::Value& r : ro["errors"].array()) {
      const uint64_t start = r[0].as_uint64(), len = r[1].as_uint64();
      if (off < start + len && start < off + n) in_error = true;
    }
    absl::Status s = img.Read(off, absl::MakeSpan(buf.data(), n));
    const std::string at = absl::StrCat(where, ", read at 0x", absl::Hex(off));
    if (in_error) {
      if (s.ok()) {
        if (unexpected_ok++ == 0) first_problem = at + " succeeded";
        continue;
      }
      if (!ExpectError(s, ro, at)) return;  // one report is enough
    } else if (!s.ok()) {
      if (unexpected_err++ == 0) {
        first_problem = absl::StrCat(at, ": ", s.ToString());
      }
    }
  }
  EXPECT_EQ(unexpected_ok + unexpected_err, 0)
      << where << ": " << unexpected_ok << " reads that should fail succeeded, "
      << unexpected_err
      << " reads that should succeed failed; first: " << first_problem;
  if (const json::Value* data = ro.Find("data")) {
    const uint64_t off = (*data)[0].as_uint64(), len = (*data)[1].as_uint64();
    const uint8_t byte = static_cast<uint8_t>((*data)[2].as_uint64());
    std::vector<uint8_t> got(len);
    ASSERT_OK(img.Read(off, absl::MakeSpan(got)));
    EXPECT_EQ(got, std::vector<uint8_t>(len, byte))
        << where << ": unexpected contents at " << off;
  }
}

// Runs qcowtool with a watchdog: a hang is killed and shows as a signal.
CommandResult Qcowtool(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"timeout", "-s", "KILL", "120",
                                   testing::QcowtoolPath()};
  argv.insert(argv.end(), args.begin(), args.end());
  // A child killed by `timeout` shows as exit 128 + 9.
  return Run(argv);
}

void ExpectToolExit(const CommandResult& r, const json::Value& allowed,
                    const std::string& what) {
  EXPECT_LT(r.exit_code, 128)
      << what << " died of signal " << r.exit_code - 128 << "\n"
      << r.err;
  EXPECT_TRUE(r.exit_code >= 0 && r.exit_code <= 3)
      << what << " exit " << r.exit_code << "\n"
      << r.err;
  EXPECT_TRUE(Contains(allowed, r.exit_code))
      << what << " exit " << r.exit_code << ", expected one of "
      << allowed.ToString() << "\nstdout: " << r.out << "\nstderr: " << r.err;
}

// Every check of one case (its files are in `dir`).
void RunCase(const json::Value& c, const TempDir& dir) {
  const std::string name = c["name"].as_string();
  const std::string image = dir.path() + "/" + c["image"].as_string();
  const json::Value& ro = c["ro"];
  const json::Value& rw = c["rw"];
  std::vector<std::string> files;
  for (const json::Value& f : c["files"].array()) {
    files.push_back(dir.path() + "/" + f.as_string());
  }
  ASSERT_FALSE(files.empty());
  const std::string where =
      absl::StrCat(name, " (", c["what"].as_string(), ")");
  SCOPED_TRACE(
      absl::StrCat("case ", name, ": expect ", c["expect"].as_string()));
  ASSERT_OK_AND_ASSIGN(Snapshot before, TakeSnapshot(files));

  // 1. Read-only open, then every cluster.
  {
    OpenOptions opts;
    auto img = Image::Open(image, opts);
    if (ro["open"].as_string() == "error") {
      ExpectError(img.status(), ro, where + ", read-only open");
    } else {
      ASSERT_TRUE(img.ok()) << where << ", read-only open: " << img.status();
      ReadEverything(**img, ro, where);
      EXPECT_OK((*img)->Close());
    }
  }
  ExpectUnchanged(before, image, "no", where + ", after the read-only open");

  // 2. qcowtool info, info --backing-chain, check: exit codes, messages,
  // no signal.
  {
    CommandResult info = Qcowtool({"info", image});
    ExpectToolExit(info, c["info_exit"], where + ": qcowtool info");
    CommandResult chain = Qcowtool({"info", "--backing-chain", image});
    ExpectToolExit(chain, c["info_chain_exit"],
                   where + ": qcowtool info --backing-chain");
    for (const CommandResult* r : {&info, &chain}) {
      if (r->exit_code == 1 && ro["open"].as_string() == "error") {
        EXPECT_THAT(r->err, HasSubstr(ro["message"].as_string())) << where;
        EXPECT_THAT(r->err, HasSubstr(ro["names"].as_string())) << where;
      }
    }
    CommandResult check = Qcowtool({"check", image});
    ExpectToolExit(check, c["check_exit"], where + ": qcowtool check");
    if (c["check_message"].is_string()) {
      EXPECT_THAT(check.out + check.err,
                  HasSubstr(c["check_message"].as_string()))
          << where << ": qcowtool check";
    }
  }
  ExpectUnchanged(before, image, "no", where + ", after qcowtool");

  // 3. Read-write open and one write.
  {
    OpenOptions opts;
    opts.read_write = true;
    auto img = Image::Open(image, opts);
    if (rw["open"].as_string() == "error") {
      ExpectError(img.status(), rw, where + ", read-write open");
    } else {
      ASSERT_TRUE(img.ok()) << where << ", read-write open: " << img.status();
      const uint64_t size = (*img)->size();
      ASSERT_GE(size, 4096u);
      const uint64_t at = std::min(rw["write_at"].as_uint64(), size - 4096);
      std::vector<uint8_t> data(4096, 0x5a);
      absl::Status s = (*img)->Write(at, data);
      const std::string w = absl::StrCat(where, ", write at 0x", absl::Hex(at));
      if (rw["write"].as_string() == "error") {
        ExpectError(s, rw, w);
        // The image stays usable for reads of what is intact.
        (*img)->Close().IgnoreError();
      } else {
        EXPECT_TRUE(s.ok()) << w << ": " << s;
        std::vector<uint8_t> back(4096);
        EXPECT_OK((*img)->Read(at, absl::MakeSpan(back)));
        EXPECT_EQ(back, data) << w << ": read back differs";
        EXPECT_OK((*img)->Close());
      }
    }
  }
  ExpectUnchanged(before, image, rw["modifies"].as_string(),
                  where + ", after the read-write step");
}

// QCOW2_STRICT_CORPUS=1: known defects fail like any other case.
bool Strict() { return getenv("QCOW2_STRICT_CORPUS") != nullptr; }

class MalformedCaseTest : public ::testing::TestWithParam<const char*> {};

TEST_P(MalformedCaseTest, BehavesAsTheManifestSays) {
  SKIP_WITHOUT_TOOLS();
  const std::string name = GetParam();
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(json::Value manifest, BuildCorpus(dir.path(), name));
  ASSERT_EQ(manifest["cases"].size(), 1u);
  const json::Value& c = manifest["cases"][0];
  ASSERT_EQ(c["name"].as_string(), name);
  if (!c["defect"].is_string() || Strict()) {
    RunCase(c, dir);
    return;
  }
  // A known library defect (DEFECTS in malformed_corpus.py): run every
  // check, report the unmet expectations as a skip, and fail once they are
  // all met so that the entry gets removed.
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::
            INTERCEPT_ONLY_CURRENT_THREAD,
        &results);
    RunCase(c, dir);
  }
  if (results.size() == 0) {
    FAIL() << name << " now behaves as expected: delete its entry from "
           << "DEFECTS in tests/malformed_corpus.py";
  }
  std::string unmet;
  for (int i = 0; i < std::min(results.size(), 4); ++i) {
    absl::StrAppend(&unmet, "\n  - ", results.GetTestPartResult(i).message());
  }
  GTEST_SKIP() << "KNOWN LIBRARY DEFECT in case " << name << ": "
               << c["defect"].as_string() << "\n"
               << results.size()
               << " unmet expectation(s) (QCOW2_STRICT_CORPUS=1 makes them "
               << "fail):" << unmet;
}

INSTANTIATE_TEST_SUITE_P(Corpus, MalformedCaseTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

// The script and kCases name the same cases, and there are enough of them.
TEST(MalformedCorpusTest, ScriptListsEveryCase) {
  if (!HavePython()) GTEST_SKIP() << "no python3";
  CommandResult r = testing::Run({Python(), ScriptPath(), "--list"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> listed =
      absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  std::vector<std::string> ours(std::begin(kCases), std::end(kCases));
  EXPECT_EQ(listed, ours);
  EXPECT_GE(ours.size(), 30u);
}

// The whole corpus builds in one run and its manifest is complete: every
// case has the fields the per-case test reads, and its files exist.
TEST(MalformedCorpusTest, WholeCorpusBuilds) {
  SKIP_WITHOUT_TOOLS();
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(json::Value m, BuildCorpus(dir.path(), ""));
  ASSERT_EQ(m["cases"].size(), std::size(kCases));
  for (const json::Value& c : m["cases"].array()) {
    SCOPED_TRACE(c["name"].as_string());
    for (const char* key : {"image", "files", "what", "expect", "ro", "rw",
                            "info_exit", "info_chain_exit", "check_exit"}) {
      EXPECT_NE(c.Find(key), nullptr) << key;
    }
    for (const char* key : {"open", "message", "code", "names"}) {
      if (c["ro"]["open"].as_string() == "error" ||
          std::string(key) == "open") {
        EXPECT_TRUE(c["ro"][key].is_string()) << "ro." << key;
      }
    }
    EXPECT_EQ(access((dir.path() + "/" + c["image"].as_string()).c_str(), R_OK),
              0);
    for (const json::Value& f : c["files"].array()) {
      EXPECT_EQ(access((dir.path() + "/" + f.as_string()).c_str(), R_OK), 0)
          << f.as_string();
    }
  }
}

TEST(Sha256Test, KnownVectors) {
  auto hex = [](const std::string& s) {
    return testing::Sha256Hex(absl::MakeConstSpan(
        reinterpret_cast<const uint8_t*>(s.data()), s.size()));
  };
  EXPECT_EQ(hex(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // One million 'a', fed in uneven pieces.
  testing::Sha256 s;
  std::string chunk(997, 'a');
  size_t left = 1000000;
  while (left > 0) {
    size_t n = std::min(left, chunk.size() - left % 7);
    s.Update(
        absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(chunk.data()), n));
    left -= n;
  }
  std::string got;
  for (uint8_t b : s.Finish()) got += absl::StrFormat("%02x", b);
  EXPECT_EQ(got,
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

}  // namespace
}  // namespace qcow2
