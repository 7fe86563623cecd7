# SPDX-License-Identifier: Apache-2.0
# nbdsh -u URI against a read-only export: the flags, then writes refused
# by strict libnbd and (strict mode off) by the server; reads and CACHE
# (a prefetch only) still work.
import os
exec(open(os.environ["NBDSH_COMMON"]).read())
for f in ("is_read_only", "can_flush", "can_fua", "can_trim", "can_zero",
          "can_cache"):
    show(f, getattr(h, f)())
for strict in (True, False):
    h.set_strict_mode(STRICT_ALL if strict else 0)
    results = [("write", attempt(lambda: h.pwrite(b"x" * 512, 0))),
               ("zero", attempt(lambda: h.zero(512, 0))),
               ("trim", attempt(lambda: h.trim(512, 0)))]
    for name, r in results:
        if strict:
            show(f"strict {name}", r)
        else:
            prescribed(f"read-only {name}", r, "EPERM")
# qemu-nbd 7.2 refuses CACHE on a read-only export (EPERM: its
# copy-on-read needs a writable node); ours prefetches.
differs("CACHE", attempt(lambda: h.cache(MiB, 0)), "ok")
show("READ", digest(h.pread(MiB, 0)))
h.shutdown()
