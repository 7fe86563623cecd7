// SPDX-License-Identifier: Apache-2.0
// Offline block-stream: a safe rebase onto a layer of the top's own chain.
#include <climits>
#include <filesystem>
#include <memory>
#include <system_error>

#include "lib/base/status_macros.h"
#include "lib/ops/rebase_copy.h"

namespace qcow2::ops {
namespace {

// The name the top stores for the layer at `depth`: the one the layer
// above it stores when that layer lies in the top's directory, else its
// absolute path.
std::string NameFromTop(const std::vector<LayerInfo>& chain, int depth) {
  namespace fs = std::filesystem;
  const std::string& stored = chain[depth - 1].backing_file;
  const fs::path top_dir =
      fs::path(CanonicalPath(chain[0].filename)).parent_path();
  const fs::path above_dir =
      fs::path(CanonicalPath(chain[depth - 1].filename)).parent_path();
  if (top_dir == above_dir || (!stored.empty() && stored[0] == '/')) {
    return stored;
  }
  std::error_code ec;
  fs::path abs = fs::absolute(chain[depth].filename, ec);
  return ec ? chain[depth].filename : abs.lexically_normal().string();
}

}  // namespace

}  // namespace qcow2::ops

// --- The public calls (qcow2/maintenance.h).
namespace qcow2 {

using ops::CanonicalPath;
using ops::CopyForRebase;
using ops::FormatName;
using ops::NameFromTop;

absl::Status StreamChain(const StreamSpec& spec, const ChainOpOptions& opts) {
  OpenOptions oo = opts.open;
  oo.read_write = true;
  oo.force_share = false;
  oo.format = spec.format;
  ASSIGN_OR_RETURN(std::unique_ptr<Image> top, Image::Open(spec.image, oo));
  const std::vector<LayerInfo> chain = top->GetChainInfo();
  std::unique_ptr<Image> base;
  int depth = INT_MAX;
  std::string name, format;
  if (!spec.base.empty()) {
    ASSIGN_OR_RETURN(depth, FindInChain(chain, spec.base));
    OpenOptions bo = opts.open;
    bo.read_write = false;
    format = FormatName(chain[depth].format);
    bo.format = format;
    ASSIGN_OR_RETURN(base, Image::Open(chain[depth].filename, bo));
    name = NameFromTop(chain, depth);
  }
  RETURN_IF_ERROR(CopyForRebase(top.get(), base.get(), depth, opts));
  RETURN_IF_ERROR(top->ChangeBackingFile(name, format));
  return top->Close();
}

}  // namespace qcow2
