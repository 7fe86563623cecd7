// SPDX-License-Identifier: Apache-2.0
// MetadataCache write-back writes only the aligned blocks of an entry that
// changed since it was last written.
#include <memory>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "lib/meta/metadata_cache.h"
#include "testing/memory_file.h"
#include "tests/util/test_util.h"

namespace qcow2 {
namespace {

using internal::MemoryFile;
using internal::MemoryStore;
using internal::MetadataCache;

constexpr uint32_t kEntry = 65536;

class MetadataCacheWriteTest : public ::testing::Test {
 protected:
  MetadataCacheWriteTest()
      : store_(std::make_shared<MemoryStore>()),
        file_("mem", store_, false),
        cache_(&file_, kEntry, 4, "refcount block") {
    store_->bytes.assign(3 * kEntry, 0);
    cache_.set_write_hook([this](uint64_t offset, uint32_t size) {
      writes_.push_back({offset, size});
    });
  }

  // Sets `len` bytes at `at` in the entry at kEntry and records the change.
  void Change(const MetadataCache::Handle& e, uint32_t at, uint32_t len,
              uint8_t value) {
    std::fill_n(e->data.begin() + at, len, value);
    e->MarkDirty(at, len);
  }

  uint8_t OnDisk(uint64_t offset) { return store_->bytes[offset]; }

  std::shared_ptr<MemoryStore> store_;
  MemoryFile file_;
  MetadataCache cache_;
  std::vector<std::pair<uint64_t, uint32_t>> writes_;
};

TEST_F(MetadataCacheWriteTest, WritesOnlyTheChangedBlock) {
  ASSERT_OK_AND_ASSIGN(MetadataCache::Handle e, cache_.Get(kEntry));
  Change(e, 40000, 8, 0xab);
  ASSERT_OK(cache_.Flush());
  ASSERT_EQ(writes_.size(), 1u);
  EXPECT_EQ(writes_[0], std::make_pair(uint64_t{kEntry} + 36864, 4096u));
  EXPECT_EQ(OnDisk(kEntry + 40000), 0xab);
  EXPECT_EQ(OnDisk(kEntry + 40007), 0xab);
  EXPECT_FALSE(e->dirty);

  // Clean now: the next change is written alone, wherever it is.
  writes_.clear();
  Change(e, 100, 2, 0xcd);
  ASSERT_OK(cache_.Flush());
  ASSERT_EQ(writes_.size(), 1u);
  EXPECT_EQ(writes_[0], std::make_pair(uint64_t{kEntry}, 4096u));
  EXPECT_EQ(OnDisk(kEntry + 100), 0xcd);
}

TEST_F(MetadataCacheWriteTest, ChangesFarApartWriteTheSpanBetween) {
  ASSERT_OK_AND_ASSIGN(MetadataCache::Handle e, cache_.Get(kEntry));
  Change(e, 50000, 8, 1);
  Change(e, 5000, 8, 2);  // the range grows down as well as up
  ASSERT_OK(cache_.Flush());
  ASSERT_EQ(writes_.size(), 1u);
  EXPECT_EQ(writes_[0], std::make_pair(uint64_t{kEntry} + 4096, 49152u));
  EXPECT_EQ(OnDisk(kEntry + 5000), 2);
  EXPECT_EQ(OnDisk(kEntry + 50007), 1);
}

TEST_F(MetadataCacheWriteTest, NewAndWhollyDirtyEntriesAreWrittenWhole) {
  ASSERT_OK_AND_ASSIGN(MetadataCache::Handle n, cache_.GetNew(2 * kEntry));
  n->data[kEntry - 1] = 7;  // a new entry is dirty whole already
  ASSERT_OK_AND_ASSIGN(MetadataCache::Handle e, cache_.Get(kEntry));
  Change(e, 300, 8, 3);
  e->data[60000] = 4;
  e->MarkAllDirty();  // a change without a range: all of it
  ASSERT_OK(cache_.Flush());
  ASSERT_EQ(writes_.size(), 2u);
  EXPECT_EQ(writes_[0], std::make_pair(uint64_t{kEntry}, kEntry));
  EXPECT_EQ(writes_[1], std::make_pair(uint64_t{2} * kEntry, kEntry));
  EXPECT_EQ(OnDisk(kEntry + 60000), 4);
  EXPECT_EQ(OnDisk(3 * kEntry - 1), 7);
}

TEST(MetadataCacheSmallEntryTest, EntriesUnderTheAlignmentAreWrittenWhole) {
  auto store = std::make_shared<MemoryStore>();
  store->bytes.assign(4096, 0);
  MemoryFile file("mem", store, false);
  MetadataCache cache(&file, 512, 4, "L2 table");
  std::vector<std::pair<uint64_t, uint32_t>> writes;
  cache.set_write_hook([&](uint64_t offset, uint32_t size) {
    writes.push_back({offset, size});
  });
  ASSERT_OK_AND_ASSIGN(MetadataCache::Handle e, cache.Get(1024));
  e->data[500] = 9;
  e->MarkDirty(500, 1);
  ASSERT_OK(cache.Flush());
  ASSERT_EQ(writes.size(), 1u);
  EXPECT_EQ(writes[0], std::make_pair(uint64_t{1024}, 512u));
  EXPECT_EQ(store->bytes[1524], 9);
}

}  // namespace
}  // namespace qcow2
