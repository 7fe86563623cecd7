// SPDX-License-Identifier: Apache-2.0
#include "serve/nbd/codec.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "serve/nbd/protocol.h"

namespace qcow2::nbd {
namespace {

constexpr size_t kOptionHeaderSize = 16;

// A bounds-checked reader over one option's payload.
class Reader {
 public:
  Reader(const uint8_t* p, uint32_t len) : p_(p), left_(len) {}
  bool U16(uint16_t* v) {
    if (left_ < 2) return false;
    *v = Get16(p_);
    Skip(2);
    return true;
  }
  bool U32(uint32_t* v) {
    if (left_ < 4) return false;
    *v = Get32(p_);
    Skip(4);
    return true;
  }
  // A u32 length then that many bytes, at most kMaxStringLength.
  bool String(std::string* s) {
    uint32_t n;
    if (!U32(&n) || n > left_ || n > kMaxStringLength) return false;
    s->assign(reinterpret_cast<const char*>(p_), n);
    Skip(n);
    return true;
  }
  uint32_t left() const { return left_; }

 private:
  void Skip(uint32_t n) {
    p_ += n;
    left_ -= n;
  }
  const uint8_t* p_;
  uint32_t left_;
};

}  // namespace

uint16_t TransmissionFlags(const ExportConfig& cfg, bool structured) {
  uint16_t f = kTransHasFlags | kTransSendFlush | kTransSendFua |
               kTransCanMultiConn | kTransSendCache;
  if (cfg.read_only) {
    f |= kTransReadOnly;
  } else {
    f |= kTransSendTrim | kTransSendWriteZeroes;
    if (cfg.fast_zero) f |= kTransSendFastZero;
  }
  if (structured) f |= kTransSendDf;
  return f;
}

void PutOptionReply(std::string* out, uint32_t option, uint32_t type,
                    const std::string& data) {
  Put64(out, kOptReplyMagic);
  Put32(out, option);
  Put32(out, type);
  Put32(out, static_cast<uint32_t>(data.size()));
  out->append(data);
}

Handshake::Handshake(const ExportConfig* cfg, bool tls_available)
    : cfg_(cfg), tls_available_(tls_available) {}

void Handshake::Greeting(std::string* out) {
  Put64(out, kNbdMagic);
  Put64(out, kOptMagic);
  Put16(out, kFlagFixedNewstyle | kFlagNoZeroes);
}

void Handshake::Close(std::string why) {
  phase_ = Phase::kClosed;
  error_ = std::move(why);
}

void Handshake::TlsStarted() {
  tls_active_ = true;
  structured_ = false;
  contexts_.clear();
  phase_ = Phase::kOptions;
}

size_t Handshake::Consume(const uint8_t* data, size_t len, std::string* out) {
  size_t used = 0;
  if (phase_ == Phase::kClientFlags) {
    if (len < 4) return 0;
    const uint32_t flags = Get32(data);
    used = 4;
    if (!(flags & kClientFlagFixedNewstyle)) {
      Close("client did not set NBD_FLAG_C_FIXED_NEWSTYLE");
      return used;
    }
    if (flags & ~(kClientFlagFixedNewstyle | kClientFlagNoZeroes)) {
      Close(absl::StrCat("unknown client flags 0x", absl::Hex(flags)));
      return used;
    }
    no_zeroes_ = flags & kClientFlagNoZeroes;
    phase_ = Phase::kOptions;
  }
  while (phase_ == Phase::kOptions) {
    if (skip_ > 0) {
      const size_t n = std::min<uint64_t>(skip_, len - used);
      used += n;
      skip_ -= n;
      if (skip_ > 0) break;
      PutOptionReply(out, skip_option_, kRepErrTooBig,
                     "option payload over 64 KiB");
      continue;
    }
    if (len - used < kOptionHeaderSize) break;
    const uint8_t* h = data + used;
    if (Get64(h) != kOptMagic) {
      Close("bad option magic");
      return used + kOptionHeaderSize;
    }
    const uint32_t option = Get32(h + 8);
    const uint32_t olen = Get32(h + 12);
    if (olen > kMaxOptionLength) {
      if (option == kOptExportName) {  // no error reply is possible
        Close("NBD_OPT_EXPORT_NAME payload over 64 KiB");
        return used + kOptionHeaderSize;
      }
      used += kOptionHeaderSize;
      skip_ = olen;
      skip_option_ = option;
      continue;
    }
    if (len - used < kOptionHeaderSize + olen) break;
    used += kOptionHeaderSize + olen;
    HandleOption(option, h + kOptionHeaderSize, olen, out);
  }
  return used;
}

void Handshake::HandleOption(uint32_t option, const uint8_t* data,
                             uint32_t len, std::string* out) {
  if (cfg_->tls == TlsMode::kRequire && !tls_active_ &&
      option != kOptStartTls && option != kOptAbort) {
    if (option == kOptExportName) {
      Close("NBD_OPT_EXPORT_NAME without TLS, which is required");
      return;
    }
    PutOptionReply(out, option, kRepErrTlsReqd, "TLS is required");
    return;
  }
  switch (option) {
    case kOptExportName:
      return HandleExportName(data, len, out);
    case kOptAbort:
      PutOptionReply(out, option, kRepAck);
      return Close("");
    case kOptList:
      return HandleList(len, out);
    case kOptStartTls:
      if (len != 0) {
        return PutOptionReply(out, option, kRepErrInvalid,
                              "STARTTLS takes no payload");
      }
      if (tls_active_) {
        return PutOptionReply(out, option, kRepErrInvalid,
                              "TLS is already active");
      }
      if (!tls_available_ || cfg_->tls == TlsMode::kOff) {
        return PutOptionReply(out, option, kRepErrPolicy,
                              "TLS is not configured on this server");
      }
      PutOptionReply(out, option, kRepAck);
      phase_ = Phase::kStartTls;
      return;
    case kOptInfo:
    case kOptGo:
      return HandleInfo(option, data, len, out);
    case kOptStructuredReply:
      if (len != 0) {
        return PutOptionReply(out, option, kRepErrInvalid,
                              "STRUCTURED_REPLY takes no payload");
      }
      if (structured_) {
        return PutOptionReply(out, option, kRepErrInvalid,
                              "structured replies already negotiated");
      }
      structured_ = true;
      return PutOptionReply(out, option, kRepAck);
    case kOptListMetaContext:
    case kOptSetMetaContext:
      return HandleMetaContext(option, data, len, out);
    default:
      return PutOptionReply(out, option, kRepErrUnsup,
                            absl::StrCat("option ", option, " unsupported"));
  }
}

bool Handshake::NameMatches(const std::string& name) const {
  return cfg_->name.empty() || name == cfg_->name;
}

void Handshake::HandleExportName(const uint8_t* data, uint32_t len,
                                 std::string* out) {
  std::string name(reinterpret_cast<const char*>(data), len);
  if (!NameMatches(name)) {
    Close(absl::StrCat("NBD_OPT_EXPORT_NAME: no export named '",
                       name.substr(0, 256), "'"));
    return;
  }
  Put64(out, cfg_->size);
  Put16(out, TransmissionFlags(*cfg_, structured_));
  if (!no_zeroes_) out->append(124, '\0');
  phase_ = Phase::kTransmission;
}

void Handshake::HandleList(uint32_t len, std::string* out) {
  if (len != 0) {
    return PutOptionReply(out, kOptList, kRepErrInvalid,
                          "LIST takes no payload");
  }
  std::string entry;
  Put32(&entry, static_cast<uint32_t>(cfg_->name.size()));
  entry += cfg_->name;
  entry += cfg_->description;
  PutOptionReply(out, kOptList, kRepServer, entry);
  PutOptionReply(out, kOptList, kRepAck);
}

void Handshake::HandleInfo(uint32_t option, const uint8_t* data, uint32_t len,
                           std::string* out) {
  Reader r(data, len);
  std::string name;
  uint16_t count = 0;
  if (!r.String(&name) || !r.U16(&count) || r.left() != 2u * count) {
    return PutOptionReply(out, option, kRepErrInvalid,
                          "malformed INFO/GO payload");
  }
  bool want_name = false, want_description = false;
  for (uint16_t i = 0; i < count; ++i) {
    uint16_t type = 0;  // r.left() was checked: each read succeeds
    r.U16(&type);
    want_name |= type == kInfoName;
    want_description |= type == kInfoDescription;
  }
  if (!NameMatches(name)) {
    return PutOptionReply(out, option, kRepErrUnknown,
                          absl::StrCat("no export named '", name, "'"));
  }
  std::string info;
  Put16(&info, kInfoExport);
  Put64(&info, cfg_->size);
  Put16(&info, TransmissionFlags(*cfg_, structured_));
  PutOptionReply(out, option, kRepInfo, info);
  if (want_name) {
    info.clear();
    Put16(&info, kInfoName);
    info += cfg_->name;
    PutOptionReply(out, option, kRepInfo, info);
  }
  if (want_description && !cfg_->description.empty()) {
    info.clear();
    Put16(&info, kInfoDescription);
    info += cfg_->description;
    PutOptionReply(out, option, kRepInfo, info);
  }
  // Always sent, as qemu-nbd does: clients that did not ask may still use
  // it, and it tells them the 32 MiB limit.
  info.clear();
  Put16(&info, kInfoBlockSize);
  Put32(&info, 1);
  Put32(&info, cfg_->preferred_block);
  Put32(&info, kMaxPayload);
  PutOptionReply(out, option, kRepInfo, info);
  PutOptionReply(out, option, kRepAck);
  if (option == kOptGo) phase_ = Phase::kTransmission;
}

std::string Handshake::ContextName(const ExportConfig& cfg, uint32_t id) {
  if (id == kContextBaseAllocation) return "base:allocation";
  if (id == kContextAllocationDepth) return "qemu:allocation-depth";
  if (id >= kContextFirstBitmap &&
      id - kContextFirstBitmap < cfg.bitmaps.size()) {
    return "qemu:dirty-bitmap:" + cfg.bitmaps[id - kContextFirstBitmap];
  }
  return "";
}

// Adds to `ids` the contexts `query` selects. LIST also takes namespace
// queries ("base:", "qemu:", "qemu:dirty-bitmap:"); SET only leaf names.
void Handshake::MatchQuery(uint32_t option, const std::string& query,
                           std::vector<uint32_t>* ids) const {
  const bool list = option == kOptListMetaContext;
  const uint32_t last =
      kContextFirstBitmap + static_cast<uint32_t>(cfg_->bitmaps.size());
  for (uint32_t id = kContextBaseAllocation; id < last; ++id) {
    const std::string name = ContextName(*cfg_, id);
    bool match = name == query;
    if (list && !match && !query.empty() && query.back() == ':') {
      match = absl::StartsWith(name, query);
    }
    if (match && std::find(ids->begin(), ids->end(), id) == ids->end()) {
      ids->push_back(id);
    }
  }
}

void Handshake::HandleMetaContext(uint32_t option, const uint8_t* data,
                                  uint32_t len, std::string* out) {
  if (!structured_) {
    return PutOptionReply(out, option, kRepErrInvalid,
                          "meta contexts need structured replies first");
  }
  Reader r(data, len);
  std::string name;
  uint32_t count = 0;
  if (!r.String(&name) || !r.U32(&count)) {
    return PutOptionReply(out, option, kRepErrInvalid,
                          "malformed meta context payload");
  }
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < count; ++i) {
    std::string query;
    if (!r.String(&query)) {
      return PutOptionReply(out, option, kRepErrInvalid,
                            "malformed meta context query");
    }
    MatchQuery(option, query, &ids);
  }
  if (r.left() != 0) {
    return PutOptionReply(out, option, kRepErrInvalid,
                          "trailing bytes after the meta context queries");
  }
  if (!NameMatches(name)) {
    return PutOptionReply(out, option, kRepErrUnknown,
                          absl::StrCat("no export named '", name, "'"));
  }
  if (option == kOptListMetaContext && count == 0) {
    MatchQuery(option, "base:", &ids);
    MatchQuery(option, "qemu:", &ids);
  }
  std::sort(ids.begin(), ids.end());
  for (uint32_t id : ids) {
    std::string reply;
    Put32(&reply, option == kOptSetMetaContext ? id : 0);
    reply += ContextName(*cfg_, id);
    PutOptionReply(out, option, kRepMetaContext, reply);
  }
  if (option == kOptSetMetaContext) contexts_ = std::move(ids);
  PutOptionReply(out, option, kRepAck);
}

bool ParseRequest(const uint8_t* p, Request* r) {
  if (Get32(p) != kRequestMagic) return false;
  r->flags = Get16(p + 4);
  r->type = Get16(p + 6);
  r->cookie = Get64(p + 8);
  r->offset = Get64(p + 16);
  r->length = Get32(p + 24);
  return true;
}

namespace {

uint16_t AllowedFlags(uint16_t type, bool structured) {
  switch (type) {
    case kCmdRead:
      return kCmdFlagFua | (structured ? kCmdFlagDf : 0);
    case kCmdWrite:
    case kCmdTrim:
      return kCmdFlagFua;
    case kCmdWriteZeroes:
      return kCmdFlagFua | kCmdFlagNoHole | kCmdFlagFastZero;
    case kCmdBlockStatus:
      return kCmdFlagReqOne;
    default:
      return 0;
  }
}

bool KnownCommand(uint16_t type) {
  return type <= kCmdBlockStatus;
}

RequestCheck Fail(RequestCheck c, uint32_t error, const char* why) {
  c.error = error;
  c.why = why;
  return c;
}

}  // namespace

RequestCheck CheckRequest(const Request& r, const ExportConfig& cfg,
                          bool structured, bool have_contexts) {
  RequestCheck c;
  if (r.type == kCmdWrite) {
    c.payload = r.length;
    if (r.length > kMaxPayload) {
      c.disconnect = true;  // skipping up to 4 GiB is not worth it
      c.payload = 0;
      return Fail(c, kEinval, "write payload over 32 MiB");
    }
  }
  if (!KnownCommand(r.type)) return Fail(c, kEinval, "unknown command");
  if (r.flags & ~AllowedFlags(r.type, structured)) {
    return Fail(c, kEinval, "unknown or unexpected command flags");
  }
  if (r.type == kCmdDisc || r.type == kCmdFlush) return c;
  if (r.type == kCmdRead && r.length > kMaxPayload) {
    return Fail(c, kEinval, "read over 32 MiB");
  }
  const bool is_write = r.type == kCmdWrite || r.type == kCmdWriteZeroes;
  if (r.offset > cfg.size || r.length > cfg.size - r.offset) {
    return Fail(c, is_write ? kEnospc : kEinval, "range past the export's end");
  }
  if (cfg.read_only &&
      (is_write || r.type == kCmdTrim)) {
    return Fail(c, kEperm, "the export is read-only");
  }
  if (r.type == kCmdBlockStatus) {
    if (!have_contexts) {
      return Fail(c, kEinval, "BLOCK_STATUS without a meta context selected");
    }
    if (r.length == 0) return Fail(c, kEinval, "BLOCK_STATUS of 0 bytes");
  }
  if (r.flags & kCmdFlagFastZero) {
    // Fast means metadata only: whole (sub)clusters of a version 3 qcow2
    // image, up to the end of the disk. Anything else would write zeros,
    // so the client is told ENOTSUP and may choose another way.
    const uint64_t end = r.offset + r.length;
    const uint32_t a = cfg.zero_align;
    if (!cfg.fast_zero || a == 0 || r.offset % a != 0 ||
        (end % a != 0 && end != cfg.size)) {
      return Fail(c, kEnotsup, "this range cannot be zeroed fast");
    }
  }
  return c;
}

void PutSimpleReply(std::string* out, uint64_t cookie, uint32_t error) {
  Put32(out, kSimpleReplyMagic);
  Put32(out, error);
  Put64(out, cookie);
}

void PutChunkHeader(std::string* out, uint16_t flags, uint16_t type,
                    uint64_t cookie, uint32_t length) {
  Put32(out, kStructuredReplyMagic);
  Put16(out, flags);
  Put16(out, type);
  Put64(out, cookie);
  Put32(out, length);
}

void PutOffsetDataHeader(std::string* out, uint16_t flags, uint64_t cookie,
                         uint64_t offset, uint32_t data_len) {
  PutChunkHeader(out, flags, kReplyOffsetData, cookie, 8 + data_len);
  Put64(out, offset);
}

void PutOffsetHole(std::string* out, uint16_t flags, uint64_t cookie,
                   uint64_t offset, uint32_t length) {
  PutChunkHeader(out, flags, kReplyOffsetHole, cookie, 12);
  Put64(out, offset);
  Put32(out, length);
}

void PutErrorChunk(std::string* out, uint64_t cookie, uint32_t error,
                   const std::string& message, const uint64_t* offset) {
  const std::string msg = message.substr(0, 1024);
  const uint32_t len = 6 + static_cast<uint32_t>(msg.size()) +
                       (offset != nullptr ? 8 : 0);
  PutChunkHeader(out, kReplyFlagDone,
                 offset != nullptr ? kReplyErrorOffset : kReplyError, cookie,
                 len);
  Put32(out, error);
  Put16(out, static_cast<uint16_t>(msg.size()));
  out->append(msg);
  if (offset != nullptr) Put64(out, *offset);
}

void PutBlockStatus(std::string* out, uint16_t flags, uint64_t cookie,
                    uint32_t context, const std::vector<Extent>& extents) {
  PutChunkHeader(out, flags, kReplyBlockStatus, cookie,
                 4 + 8 * static_cast<uint32_t>(extents.size()));
  Put32(out, context);
  for (const Extent& e : extents) {
    Put32(out, e.length);
    Put32(out, e.flags);
  }
}

}  // namespace qcow2::nbd
