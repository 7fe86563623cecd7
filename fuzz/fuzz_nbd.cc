// SPDX-License-Identifier: Apache-2.0
// fuzz_nbd: what an NBD client sends to the server (serve/nbd/codec.h),
// from the handshake through the request stream.
//
// Input: byte 0 chooses the export (bit 0 read-only, bit 1 fast zero,
// bit 2 a bitmap offered, bit 3 an export name required, bits 4..5 TLS
// off/on/require with credentials or not) and byte 1 how the stream is cut
// into arrivals (1 to 256 bytes each, or all at once); the rest is the
// client's byte stream.
//
// Checked:
//  - the handshake consumes only bytes it was given, never more than
//    arrived, and always makes progress or waits for more;
//  - every option reply is well formed (magic, length field equal to the
//    data that follows);
//  - in the transmission phase, a request the checks pass lies inside the
//    export, is at most 32 MiB when it carries data, has only the flags its
//    command allows, writes nothing on a read-only export, and a payload is
//    only ever expected for a WRITE of at most 32 MiB;
//  - every reply encoder produces exactly the length its header declares.
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "serve/nbd/codec.h"
#include "serve/nbd/protocol.h"

namespace qcow2::nbd {
namespace {

void Require(bool ok, const char* what) {
  if (!ok) {
    __builtin_trap();  // libFuzzer saves the input
  }
  (void)what;
}

// Walks the option replies appended to `out` since `from`; after
// NBD_OPT_EXPORT_NAME the export's size and flags (and maybe 124 zeros)
// end it instead.
void CheckOptionReplies(const std::string& out, size_t from,
                        bool transmission) {
  size_t p = from;
  const auto* b = reinterpret_cast<const uint8_t*>(out.data());
  while (p < out.size()) {
    const size_t left = out.size() - p;
    if (transmission && (left == 10 || left == 134) &&
        (left < 8 || Get64(b + p) != kOptReplyMagic)) {
      return;
    }
    Require(left >= 20, "short option reply");
    Require(Get64(b + p) == kOptReplyMagic, "option reply magic");
    const uint32_t len = Get32(b + p + 16);
    Require(left - 20 >= len, "option reply length");
    p += 20 + len;
  }
}

void CheckRequestResult(const Request& r, const RequestCheck& c,
                        const ExportConfig& cfg, bool structured) {
  if (c.payload > 0) {
    Require(r.type == kCmdWrite && c.payload == r.length &&
                r.length <= kMaxPayload,
            "payload only for WRITE");
  }
  if (c.error != 0) return;
  Require(r.type <= kCmdBlockStatus, "unknown command accepted");
  if (r.type == kCmdDisc || r.type == kCmdFlush) return;
  Require(r.offset <= cfg.size && r.length <= cfg.size - r.offset,
          "range outside the export accepted");
  if (r.type == kCmdRead || r.type == kCmdWrite) {
    Require(r.length <= kMaxPayload, "over 32 MiB accepted");
  }
  if (cfg.read_only) {
    Require(r.type != kCmdWrite && r.type != kCmdWriteZeroes &&
                r.type != kCmdTrim,
            "write on a read-only export accepted");
  }
  if (r.flags & kCmdFlagDf) Require(structured, "DF without structured");
  uint16_t allowed = 0;
  switch (r.type) {
    case kCmdRead: allowed = kCmdFlagFua | kCmdFlagDf; break;
    case kCmdWrite: case kCmdTrim: allowed = kCmdFlagFua; break;
    case kCmdWriteZeroes:
      allowed = kCmdFlagFua | kCmdFlagNoHole | kCmdFlagFastZero;
      break;
    case kCmdBlockStatus: allowed = kCmdFlagReqOne; break;
    default: break;
  }
  Require((r.flags & ~allowed) == 0, "unknown flag accepted");
}

void CheckEncoders(const Request& r, uint32_t error) {
  std::string out;
  PutSimpleReply(&out, r.cookie, error);
  Require(out.size() == kSimpleReplySize, "simple reply size");
  out.clear();
  const uint64_t off = r.offset;
  PutErrorChunk(&out, r.cookie, error ? error : kEio,
                std::string(r.length % 2000, 'x'), (r.flags & 1) ? &off : nullptr);
  const auto* b = reinterpret_cast<const uint8_t*>(out.data());
  Require(out.size() == kChunkHeaderSize + Get32(b + 16), "error chunk size");
  out.clear();
  std::vector<Extent> ext(r.length % 7, Extent{r.length, r.flags});
  PutBlockStatus(&out, 0, r.cookie, 1, ext);
  b = reinterpret_cast<const uint8_t*>(out.data());
  Require(out.size() == kChunkHeaderSize + Get32(b + 16), "block status size");
}

void Transmission(const uint8_t* data, size_t size, const ExportConfig& cfg,
                  const Handshake& hs) {
  size_t p = 0;
  while (size - p >= kRequestSize) {
    Request r;
    if (!ParseRequest(data + p, &r)) return;  // the server disconnects
    p += kRequestSize;
    const RequestCheck c =
        CheckRequest(r, cfg, hs.structured(), !hs.contexts().empty());
    CheckRequestResult(r, c, cfg, hs.structured());
    CheckEncoders(r, c.error);
    if (c.disconnect) return;
    if (r.type == kCmdDisc && c.error == 0) return;
    if (c.payload > size - p) return;
    p += c.payload;
  }
}

}  // namespace
}  // namespace qcow2::nbd

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qcow2::nbd;
  if (size < 2) return 0;
  ExportConfig cfg;
  cfg.size = 1ull << 30;
  cfg.read_only = data[0] & 1;
  cfg.fast_zero = data[0] & 2;
  cfg.zero_align = 65536;
  if (data[0] & 4) cfg.bitmaps = {"b0"};
  if (data[0] & 8) cfg.name = "disk";
  cfg.tls = static_cast<TlsMode>((data[0] >> 4) % 3);
  const bool tls_available = data[0] & 0x40;
  const size_t step = data[1] == 0 ? size : data[1];
  data += 2;
  size -= 2;

  Handshake hs(&cfg, tls_available);
  std::string out;
  Handshake::Greeting(&out);
  size_t arrived = 0, used = 0;
  while (hs.phase() != Handshake::Phase::kClosed &&
         hs.phase() != Handshake::Phase::kTransmission) {
    if (hs.phase() == Handshake::Phase::kStartTls) hs.TlsStarted();
    arrived = std::min(size, arrived + step);
    const size_t before = out.size();
    const size_t n = hs.Consume(data + used, arrived - used, &out);
    Require(n <= arrived - used, "consumed more than arrived");
    used += n;
    if (before != 0) {
      CheckOptionReplies(out, before,
                         hs.phase() == Handshake::Phase::kTransmission);
    }
    if (n == 0 && arrived == size) break;
  }
  if (hs.phase() == Handshake::Phase::kTransmission) {
    Transmission(data + used, size - used, cfg, hs);
  }
  return 0;
}
