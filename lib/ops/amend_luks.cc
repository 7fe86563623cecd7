// SPDX-License-Identifier: Apache-2.0
// qemu-img amend's key-slot changes on a LUKS-encrypted image (QEMU 7.2's
// qcrypto_block_luks_amend_options, reached through qcow2_amend_options):
// the secret check that qemu-img's open makes, QEMU's refusals with its
// messages, then the slot writes in a power-cut-safe order.
//
// Why the order is safe: the LUKS header lists the slots; a slot's key
// material is read only while the header enables it. Filling a slot
// writes its material while it is still disabled, then the header; erasing
// one writes the header first, then overwrites the material. A torn header
// write changes only the bytes of the slot being changed (the rest is
// rewritten as it was). So at every cut the slots that opened before and
// are not being changed open still.
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "lib/base/events.h"
#include "lib/base/status_macros.h"
#include "lib/crypto/luks_keys.h"
#include "lib/ops/amend.h"

namespace qcow2::internal {
namespace {

constexpr uint64_t kDefaultIterTimeMs = 2000;  // QEMU's encrypt.iter-time

absl::Span<const uint8_t> AsBytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

size_t ActiveSlots(const LuksHeader& h) {
  size_t n = 0;
  for (const LuksKeySlot& s : h.slots) n += s.enabled();
  return n;
}

absl::Status Refuse(const std::string& message) {
  return absl::InvalidArgumentError(message);
}

// QEMU prints the slot of an add with %u and of an erase with %i, both of
// an int.
std::string SlotText(int64_t slot, bool as_unsigned) {
  const int32_t v = static_cast<int32_t>(slot);
  return as_unsigned ? absl::StrCat(static_cast<uint32_t>(v)) : absl::StrCat(v);
}

absl::StatusOr<KeySlotPlan> CheckAdd(const AmendLuks& l,
                                     const KeySlotAmendment& a, bool force) {
  if (!a.new_secret) {
    return Refuse("'new-secret' is required to activate a keyslot");
  }
  if (a.old_secret) {
    return Refuse("'old-secret' must not be given when activating keyslots");
  }
  KeySlotPlan p;
  if (a.keyslot) {
    if (*a.keyslot < 0 || *a.keyslot >= int64_t{kLuksNumSlots}) {
      return Refuse(absl::StrCat("Invalid keyslot ", SlotText(*a.keyslot, true),
                                 " specified, must be between 0 and 7"));
    }
    p.fill = static_cast<size_t>(*a.keyslot);
  } else {
    for (size_t i = 0; i < kLuksNumSlots && !p.fill; ++i) {
      if (!l.header.slots[i].enabled()) p.fill = i;
    }
    if (!p.fill) return Refuse("Can't add a keyslot - all keyslots are in use");
  }
  if (!force && l.header.slots[*p.fill].enabled()) {
    return Refuse(absl::StrCat("Refusing to overwrite active keyslot ", *p.fill,
                               " - please erase it first"));
  }
  return p;
}

absl::StatusOr<KeySlotPlan> CheckErase(const AmendLuks& l,
                                       const KeySlotAmendment& a, bool force) {
  if (a.new_secret) {
    return Refuse("'new-secret' must not be given when erasing keyslots");
  }
  if (a.iter_time_ms) {
    return Refuse("'iter-time' must not be given when erasing keyslots");
  }
  const LuksHeader& h = l.header;
  KeySlotPlan p;
  if (a.keyslot) {
    const std::string text = SlotText(*a.keyslot, false);
    if (*a.keyslot < 0 || *a.keyslot >= int64_t{kLuksNumSlots}) {
      return Refuse(absl::StrCat("Invalid keyslot ", text,
                                 " specified, must be between 0 and 7"));
    }
    const size_t slot = static_cast<size_t>(*a.keyslot);
    if (a.old_secret) {
      ASSIGN_OR_RETURN(bool opens,
                       SlotOpens(h, l.area, slot, AsBytes(*a.old_secret)));
      if (!opens) {
        return Refuse(absl::StrCat("Given keyslot ", text,
                                   " doesn't contain the given old password "
                                   "for erase operation"));
      }
    }
    if (!force && !h.slots[slot].enabled()) {
      return Refuse(absl::StrCat("Given keyslot ", text,
                                 " is already erased (inactive) "));
    }
    if (!force && ActiveSlots(h) == 1) {
      return Refuse(absl::StrCat(
          "Attempt to erase the only active keyslot ", text,
          " which will erase all the data in the image irreversibly - "
          "refusing operation"));
    }
    p.erase.push_back(slot);
    return p;
  }
  if (!a.old_secret) {
    return Refuse(
        "To erase keyslot(s), either explicit keyslot index or the password "
        "currently contained in them must be given");
  }
  for (size_t i = 0; i < kLuksNumSlots; ++i) {
    ASSIGN_OR_RETURN(bool opens,
                     SlotOpens(h, l.area, i, AsBytes(*a.old_secret)));
    if (opens) p.erase.push_back(i);
  }
  if (p.erase.empty()) {
    return Refuse("No keyslots match given (old) password for erase operation");
  }
  if (!force && p.erase.size() == ActiveSlots(h)) {
    return Refuse(
        "All the active keyslots match the (old) password that was given and "
        "erasing them will erase all the data in the image irreversibly - "
        "refusing operation");
  }
  return p;
}

// Writes area[off, off + len) to the file and makes it durable.
absl::Status WriteArea(AmendTarget* t, const AmendLuks& l, uint64_t off,
                       uint64_t len, const char* event) {
  EmitEvent(event);
  RETURN_IF_ERROR(t->file->WriteAt(
      l.ext.offset + off, absl::MakeConstSpan(l.area).subspan(off, len)));
  return t->file->Flush();
}

absl::Status WriteMaterial(AmendTarget* t, const AmendLuks& l, size_t slot) {
  const LuksKeySlot& s = l.header.slots[slot];
  return WriteArea(t, l, uint64_t{s.key_offset} * kLuksSectorSize,
                   SlotMaterialBytes(l.header, s), "luks-keyslot-write");
}

absl::Status WriteLuksHeader(AmendTarget* t, const AmendLuks& l) {
  return WriteArea(t, l, 0, kLuksHeaderSize, "luks-header-write");
}

// Puts `secret` into the disabled slot `slot`: material, then header.
// `*iterations` 0 measures (and is set to the count used).
absl::Status Fill(AmendTarget* t, AmendLuks* l, size_t slot,
                  const std::string& secret, uint64_t iter_time_ms,
                  uint32_t* iterations) {
  ASSIGN_OR_RETURN(
      size_t used,
      AddKeySlot(l->header, absl::MakeSpan(l->area), l->master_key.span(),
                 AsBytes(secret), slot, static_cast<uint32_t>(iter_time_ms),
                 *iterations));
  *iterations = l->header.slots[used].iterations;
  RETURN_IF_ERROR(WriteMaterial(t, *l, used));
  return WriteLuksHeader(t, *l);
}

// Disables `slot`: header, then its material overwritten with random bytes.
absl::Status Erase(AmendTarget* t, AmendLuks* l, size_t slot) {
  RETURN_IF_ERROR(EraseKeySlot(l->header, absl::MakeSpan(l->area), slot,
                               /*allow_last=*/true));
  RETURN_IF_ERROR(WriteLuksHeader(t, *l));
  return WriteMaterial(t, *l, slot);
}

}  // namespace

absl::StatusOr<std::unique_ptr<AmendLuks>> UnlockForAmend(
    AmendTarget* t, const std::string& secret) {
  const std::string where =
      absl::StrCat("Could not open '", t->file->name(), "'");
  ASSIGN_OR_RETURN(std::optional<CryptoExtension> ext,
                   DecodeCryptoExtension(t->h, t->file_size, t->file->name()));
  if (!ext) {
    if (t->h.crypt_method == kCryptLuks) {
      return absl::DataLossError(
          absl::StrCat(t->file->name(),
                       ": crypt_method 2 without a crypto header extension"));
    }
    return nullptr;
  }
  if (secret.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        where, ": Parameter 'encrypt.key-secret' is required for cipher"));
  }
  auto l = std::make_unique<AmendLuks>();
  l->ext = *ext;
  l->area.resize(ext->length);
  RETURN_IF_ERROR(t->file->ReadAt(ext->offset, absl::MakeSpan(l->area)));
  ASSIGN_OR_RETURN(l->header, DecodeLuksHeader(l->area, t->file->name()));
  ASSIGN_OR_RETURN(l->master_key,
                   UnlockLuks(l->header, l->area, AsBytes(secret), where));
  ASSIGN_OR_RETURN(l->volume,
                   LuksVolume::FromKey(l->header, l->master_key.span()));
  return l;
}

absl::StatusOr<KeySlotPlan> CheckKeySlots(const AmendLuks& l,
                                          const KeySlotAmendment& a,
                                          bool force) {
  if (a.state == "active") return CheckAdd(l, a, force);
  if (a.state == "inactive") return CheckErase(l, a, force);
  if (a.state.empty()) return Refuse("Parameter 'state' is missing");
  return Refuse(
      absl::StrCat("Parameter 'state' does not accept value '", a.state, "'"));
}

absl::Status ApplyKeySlots(AmendTarget* t, AmendLuks* l, const KeySlotPlan& p,
                           const KeySlotAmendment& a) {
  for (size_t slot : p.erase) RETURN_IF_ERROR(Erase(t, l, slot));
  if (!p.fill) return absl::OkStatus();
  const size_t slot = *p.fill;
  const uint64_t iter_time = a.iter_time_ms.value_or(kDefaultIterTimeMs);
  uint32_t iterations = a.iterations;
  if (!l->header.slots[slot].enabled()) {
    return Fill(t, l, slot, *a.new_secret, iter_time, &iterations);
  }
  // Overwriting an active slot (force). QEMU writes the new material over
  // the old and then the header: a cut between leaves a slot no secret
  // opens, and if it was the image's only one, an image nothing opens.
  // A free slot holds the new secret meanwhile.
  std::optional<size_t> spare;
  for (size_t i = 0; i < kLuksNumSlots && !spare; ++i) {
    if (!l->header.slots[i].enabled()) spare = i;
  }
  if (spare) {
    RETURN_IF_ERROR(Fill(t, l, *spare, *a.new_secret, iter_time, &iterations));
  }
  RETURN_IF_ERROR(Erase(t, l, slot));
  RETURN_IF_ERROR(Fill(t, l, slot, *a.new_secret, iter_time, &iterations));
  if (spare) RETURN_IF_ERROR(Erase(t, l, *spare));
  return absl::OkStatus();
}

}  // namespace qcow2::internal
