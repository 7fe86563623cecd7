// SPDX-License-Identifier: Apache-2.0
// qemu-img's image creation options (-o key=value,...) as qcowtool create
// and measure take them: names, values and the combinations qemu-img
// refuses, turned into a CreateOptions.
#ifndef QCOW2_TOOLS_CREATE_OPTIONS_H_
#define QCOW2_TOOLS_CREATE_OPTIONS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "qcow2/image.h"
#include "qcow2/options.h"

namespace qcow2::tool {

// A create (or measure) request as the options describe it.
struct CreateRequest {
  std::string file;
  CreateOptions opts;
  std::optional<uint64_t> size;  // as asked (before rounding to 512)
  bool unsafe = false;
  bool quiet = false;
  // How to print the options that qemu-img prints only when given.
  std::optional<std::string> preallocation;
  std::optional<std::string> compat;
  // encrypt.key-secret: the id of a --object secret (resolved by the verb).
  std::string key_secret_id;
};

// Sets req->opts.encrypt.key_secret from the secret req->key_secret_id
// names (qemu-img's "No secret with id 'ID'" when none does).
absl::Status ResolveCreateSecret(const std::map<std::string, std::string>& secrets,
                                 CreateRequest* req);

// The "-o help" listing for `format`.
std::string OptionHelp(ImageFormat format);

// Whether an -o list asks for that listing ("help" or "?").
bool IsHelpList(std::string_view list);

// Parses every -o list into key -> value (the last value of a key wins).
absl::Status ParseOptionLists(const std::vector<std::string>& lists,
                              ImageFormat format,
                              std::map<std::string, std::string>* values);

// Applies one parsed -o value. Sizes and numbers are range-checked here;
// combinations in CheckCombinations().
absl::Status ApplyOption(const std::string& key, const std::string& v,
                         CreateRequest* req);

// The checks qemu-img makes on option combinations (qcow2 only).
absl::Status CheckCombinations(const CreateOptions& o);

}  // namespace qcow2::tool

#endif  // QCOW2_TOOLS_CREATE_OPTIONS_H_
