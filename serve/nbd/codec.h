// SPDX-License-Identifier: Apache-2.0
// The NBD protocol without I/O: the fixed newstyle handshake as a state
// machine fed with received bytes, request parsing and checking, and reply
// encoding. Nothing here touches a socket or the image, so the whole
// client-facing parser can be fuzzed (fuzz/fuzz_nbd.cc) and unit-tested.
#ifndef QCOW2_SERVE_NBD_CODEC_H_
#define QCOW2_SERVE_NBD_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace qcow2::nbd {

enum class TlsMode { kOff, kOn, kRequire };

// What the server exports; fixed for the server's lifetime.
struct ExportConfig {
  // Clients must ask for this name; empty accepts any name.
  std::string name;
  std::string description;
  uint64_t size = 0;
  bool read_only = false;
  // WRITE_ZEROES with FAST_ZERO may be honoured at all (qcow2 v3).
  bool fast_zero = false;
  // The granularity of fast zeroing (cluster or subcluster size).
  uint32_t zero_align = 0;
  uint32_t preferred_block = 4096;
  // Names offered as qemu:dirty-bitmap:NAME.
  std::vector<std::string> bitmaps;
  TlsMode tls = TlsMode::kOff;
};

// Meta context ids: fixed for the first two, then one per bitmap.
constexpr uint32_t kContextBaseAllocation = 1;
constexpr uint32_t kContextAllocationDepth = 2;
constexpr uint32_t kContextFirstBitmap = 3;

// Transmission flags the export advertises once negotiation ends.
uint16_t TransmissionFlags(const ExportConfig& cfg, bool structured);

// The server side of the handshake, from the greeting to the transmission
// phase. Feed it whatever bytes arrived; it consumes whole messages,
// appends its replies to `out`, and stops at every phase change.
class Handshake {
 public:
  enum class Phase {
    kClientFlags,   // waiting for the client's 32-bit flags
    kOptions,       // option haggling
    kStartTls,      // STARTTLS acknowledged: run the TLS handshake now
    kTransmission,  // GO or EXPORT_NAME succeeded
    kClosed,        // ABORT, or a protocol error (see error())
  };

  // `tls_available`: credentials were loaded, so STARTTLS can succeed.
  Handshake(const ExportConfig* cfg, bool tls_available);

  // The server's first 18 bytes.
  static void Greeting(std::string* out);

  // Returns how many bytes of `data` were consumed; the rest must be
  // offered again (with more appended) on the next call.
  size_t Consume(const uint8_t* data, size_t len, std::string* out);

  // The TLS session is up after kStartTls: haggling starts over (the
  // protocol forgets what was negotiated in the clear).
  void TlsStarted();

  Phase phase() const { return phase_; }
  bool tls_active() const { return tls_active_; }
  bool structured() const { return structured_; }
  // Meta contexts selected by the last SET_META_CONTEXT, by id.
  const std::vector<uint32_t>& contexts() const { return contexts_; }
  // Why the phase is kClosed (empty after ABORT).
  const std::string& error() const { return error_; }

  // The name of a meta context id, or "" for an unknown id.
  static std::string ContextName(const ExportConfig& cfg, uint32_t id);

 private:
  void Close(std::string why);
  void HandleOption(uint32_t option, const uint8_t* data, uint32_t len,
                    std::string* out);
  void HandleExportName(const uint8_t* data, uint32_t len, std::string* out);
  void HandleList(uint32_t len, std::string* out);
  void HandleInfo(uint32_t option, const uint8_t* data, uint32_t len,
                  std::string* out);
  void HandleMetaContext(uint32_t option, const uint8_t* data, uint32_t len,
                         std::string* out);
  void MatchQuery(uint32_t option, const std::string& query,
                  std::vector<uint32_t>* ids) const;
  bool NameMatches(const std::string& name) const;

  const ExportConfig* cfg_;
  bool tls_available_;
  Phase phase_ = Phase::kClientFlags;
  bool no_zeroes_ = false;
  bool tls_active_ = false;
  bool structured_ = false;
  std::vector<uint32_t> contexts_;
  uint64_t skip_ = 0;  // bytes left of an oversized option being dropped
  uint32_t skip_option_ = 0;
  std::string error_;
};

// Appends an option reply.
void PutOptionReply(std::string* out, uint32_t option, uint32_t type,
                    const std::string& data = "");

struct Request {
  uint16_t flags = 0;
  uint16_t type = 0;
  uint64_t cookie = 0;
  uint64_t offset = 0;
  uint32_t length = 0;
};

// Parses kRequestSize bytes; false when the magic is wrong (the stream is
// lost: disconnect).
bool ParseRequest(const uint8_t* p, Request* r);

// What the server must do with a parsed request before running it.
struct RequestCheck {
  uint32_t error = 0;       // 0: run it; else reply with this error
  bool disconnect = false;  // the stream cannot go on (after replying)
  uint32_t payload = 0;     // bytes that follow the header (WRITE)
  const char* why = "";     // for the log and the error chunk's message
};

// Every field of `r` against the export and what was negotiated.
RequestCheck CheckRequest(const Request& r, const ExportConfig& cfg,
                          bool structured, bool have_contexts);

// Reply encoders (header bytes only; payloads travel as their own iovecs).
void PutSimpleReply(std::string* out, uint64_t cookie, uint32_t error);
void PutChunkHeader(std::string* out, uint16_t flags, uint16_t type,
                    uint64_t cookie, uint32_t length);
// OFFSET_DATA's header and offset; `data_len` payload bytes follow.
void PutOffsetDataHeader(std::string* out, uint16_t flags, uint64_t cookie,
                         uint64_t offset, uint32_t data_len);
void PutOffsetHole(std::string* out, uint16_t flags, uint64_t cookie,
                   uint64_t offset, uint32_t length);
// ERROR (with DONE), or ERROR_OFFSET when `offset` is given.
void PutErrorChunk(std::string* out, uint64_t cookie, uint32_t error,
                   const std::string& message, const uint64_t* offset);
struct Extent {
  uint32_t length;
  uint32_t flags;
};
void PutBlockStatus(std::string* out, uint16_t flags, uint64_t cookie,
                    uint32_t context, const std::vector<Extent>& extents);

}  // namespace qcow2::nbd

#endif  // QCOW2_SERVE_NBD_CODEC_H_
