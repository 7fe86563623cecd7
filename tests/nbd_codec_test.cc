// SPDX-License-Identifier: Apache-2.0
// The NBD server's protocol codec (serve/nbd/codec.h) byte by byte: the
// handshake as a client drives it, and the checks every request passes.
#include "serve/nbd/codec.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "serve/nbd/protocol.h"

namespace qcow2::nbd {
namespace {

std::string Option(uint32_t code, const std::string& data) {
  std::string s;
  Put64(&s, kOptMagic);
  Put32(&s, code);
  Put32(&s, static_cast<uint32_t>(data.size()));
  return s + data;
}

std::string Flags(uint32_t f) {
  std::string s;
  Put32(&s, f);
  return s;
}

std::string GoData(const std::string& name) {
  std::string s;
  Put32(&s, static_cast<uint32_t>(name.size()));
  s += name;
  Put16(&s, 0);
  return s;
}

struct Reply {
  uint32_t option, type;
  std::string data;
};

// Splits option replies; stops at anything else.
std::vector<Reply> Replies(const std::string& out) {
  std::vector<Reply> r;
  const auto* b = reinterpret_cast<const uint8_t*>(out.data());
  size_t p = 0;
  while (out.size() - p >= 20 && Get64(b + p) == kOptReplyMagic) {
    const uint32_t len = Get32(b + p + 16);
    r.push_back({Get32(b + p + 8), Get32(b + p + 12), out.substr(p + 20, len)});
    p += 20 + len;
  }
  return r;
}

class HandshakeTest : public ::testing::Test {
 protected:
  size_t Feed(const std::string& bytes) {
    return hs_.Consume(reinterpret_cast<const uint8_t*>(bytes.data()),
                       bytes.size(), &out_);
  }
  ExportConfig cfg_{.name = "disk", .size = 1 << 20};
  Handshake hs_{&cfg_, false};
  std::string out_;
};

TEST(GreetingTest, FixedNewstyleNoZeroes) {
  std::string g;
  Handshake::Greeting(&g);
  ASSERT_EQ(g.size(), 18u);
  const auto* b = reinterpret_cast<const uint8_t*>(g.data());
  EXPECT_EQ(Get64(b), kNbdMagic);
  EXPECT_EQ(Get64(b + 8), kOptMagic);
  EXPECT_EQ(Get16(b + 16), kFlagFixedNewstyle | kFlagNoZeroes);
}

TEST_F(HandshakeTest, OldstyleClientIsClosed) {
  Feed(Flags(0));
  EXPECT_EQ(hs_.phase(), Handshake::Phase::kClosed);
  EXPECT_NE(hs_.error().find("FIXED_NEWSTYLE"), std::string::npos);
}

TEST_F(HandshakeTest, PartialOptionWaits) {
  const std::string msg = Flags(3) + Option(kOptGo, GoData("disk"));
  EXPECT_EQ(Feed(msg.substr(0, 10)), 4u);  // flags only
  EXPECT_EQ(hs_.phase(), Handshake::Phase::kOptions);
  EXPECT_EQ(Feed(msg.substr(4)), msg.size() - 4);
  EXPECT_EQ(hs_.phase(), Handshake::Phase::kTransmission);
  std::vector<Reply> r = Replies(out_);
  ASSERT_GE(r.size(), 3u);
  EXPECT_EQ(r.front().type, kRepInfo);  // NBD_INFO_EXPORT first
  EXPECT_EQ(r.back().type, kRepAck);
}

TEST_F(HandshakeTest, UnknownExportAndOptionAreErrors) {
  Feed(Flags(1) + Option(kOptGo, GoData("other")) + Option(77, "x") +
       Option(kOptStartTls, ""));
  std::vector<Reply> r = Replies(out_);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].type, kRepErrUnknown);
  EXPECT_EQ(r[1].type, kRepErrUnsup);
  EXPECT_EQ(r[2].type, kRepErrPolicy);  // no TLS configured
  EXPECT_EQ(hs_.phase(), Handshake::Phase::kOptions);
}

TEST_F(HandshakeTest, OversizedOptionIsSkipped) {
  Feed(Flags(1) + Option(kOptList, std::string(70000, 'x')) +
       Option(kOptList, ""));
  std::vector<Reply> r = Replies(out_);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].type, kRepErrTooBig);
  EXPECT_EQ(r[1].type, kRepServer);
  EXPECT_EQ(r[2].type, kRepAck);
}

TEST_F(HandshakeTest, TlsRequiredRefusesPlainOptions) {
  cfg_.tls = TlsMode::kRequire;
  Feed(Flags(1) + Option(kOptList, ""));
  std::vector<Reply> r = Replies(out_);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].type, kRepErrTlsReqd);
  Feed(Option(kOptExportName, "disk"));
  EXPECT_EQ(hs_.phase(), Handshake::Phase::kClosed);
}

TEST_F(HandshakeTest, MetaContexts) {
  cfg_.bitmaps = {"b0", "b1"};
  std::string q;
  Put32(&q, 4);
  q += "disk";
  Put32(&q, 1);
  Put32(&q, 18);
  q += "qemu:dirty-bitmap:";
  Feed(Flags(1) + Option(kOptListMetaContext, q));  // before STRUCTURED
  ASSERT_EQ(Replies(out_).back().type, kRepErrInvalid);
  out_.clear();
  Feed(Option(kOptStructuredReply, "") + Option(kOptListMetaContext, q));
  std::vector<Reply> r = Replies(out_);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[1].data.substr(4), "qemu:dirty-bitmap:b0");
  EXPECT_EQ(r[2].data.substr(4), "qemu:dirty-bitmap:b1");
  out_.clear();
  std::string set;
  Put32(&set, 4);
  set += "disk";
  Put32(&set, 2);
  Put32(&set, 15);
  set += "base:allocation";
  Put32(&set, 20);
  set += "qemu:dirty-bitmap:b1";
  Feed(Option(kOptSetMetaContext, set));
  EXPECT_EQ(hs_.contexts(),
            (std::vector<uint32_t>{kContextBaseAllocation,
                                   kContextFirstBitmap + 1}));
}

TEST(CheckRequestTest, EveryField) {
  ExportConfig cfg{.size = 1 << 20, .fast_zero = true, .zero_align = 65536};
  auto check = [&](uint16_t type, uint16_t flags, uint64_t off, uint32_t len,
                   bool structured = true) {
    return CheckRequest(Request{flags, type, 1, off, len}, cfg, structured,
                        true);
  };
  EXPECT_EQ(check(kCmdRead, 0, 0, 4096).error, 0u);
  EXPECT_EQ(check(kCmdRead, 0, 1 << 20, 1).error, kEinval);
  EXPECT_EQ(check(kCmdRead, 0, ~0ull, 2).error, kEinval);  // wraps
  EXPECT_EQ(check(kCmdWrite, 0, (1 << 20) - 1, 2).error, kEnospc);
  EXPECT_EQ(check(kCmdRead, 1 << 7, 0, 1).error, kEinval);
  EXPECT_EQ(check(kCmdRead, kCmdFlagDf, 0, 1, false).error, kEinval);
  EXPECT_EQ(check(kCmdRead, kCmdFlagDf, 0, 1).error, 0u);
  EXPECT_EQ(check(99, 0, 0, 0).error, kEinval);
  RequestCheck big = check(kCmdWrite, 0, 0, kMaxPayload + 1);
  EXPECT_TRUE(big.disconnect);
  EXPECT_EQ(big.payload, 0u);
  EXPECT_EQ(check(kCmdWrite, 0, 0, 512).payload, 512u);
  EXPECT_EQ(check(kCmdWriteZeroes, kCmdFlagFastZero, 65536, 65536).error, 0u);
  EXPECT_EQ(check(kCmdWriteZeroes, kCmdFlagFastZero, 512, 65536).error,
            kEnotsup);
  cfg.read_only = true;
  EXPECT_EQ(check(kCmdTrim, 0, 0, 512).error, kEperm);
  EXPECT_EQ(CheckRequest(Request{0, kCmdBlockStatus, 1, 0, 512}, cfg, true,
                         false).error,
            kEinval);
}

}  // namespace
}  // namespace qcow2::nbd
