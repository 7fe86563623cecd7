# SPDX-License-Identifier: Apache-2.0
# nbdsh -c: the error paths. Strict mode first (libnbd refuses them
# itself, from what the server advertised), then with strict mode off so
# that the server gets them: offsets past the end, unknown flags, block
# status with a meta context the server did not know, and the connection
# still serving afterwards.
import os
exec(open(os.environ["NBDSH_COMMON"]).read())
h.add_meta_context("nope:thing")
h.set_strict_mode(STRICT_ALL)
h.connect_uri(URI)
size = h.get_size()
show("unknown context negotiated", h.can_meta_context("nope:thing"))
for strict in (True, False):
    tag = "strict" if strict else "server"
    h.set_strict_mode(STRICT_ALL if strict else 0)
    show(f"{tag} read past end", attempt(lambda: h.pread(4096, size)))
    show(f"{tag} read across end",
         attempt(lambda: h.pread(8192, size - 4096)))
    show(f"{tag} read unknown flag", attempt(lambda: h.pread(512, 0, 1 << 7)))
    show(f"{tag} write unknown flag",
         attempt(lambda: h.pwrite(b"x" * 512, 0, 1 << 7)))
    show(f"{tag} block status, unknown context",
         attempt(lambda: h.block_status(512, 0, lambda *a: 0)))
    show(f"{tag} cache past end", attempt(lambda: h.cache(512, size)))
    w = attempt(lambda: h.pwrite(b"x" * 512, size))
    z = attempt(lambda: h.zero(512, size))
    if strict:
        show(f"{tag} write past end", w)
        show(f"{tag} zero past end", z)
    else:
        prescribed("write past end", w, "ENOSPC")
        prescribed("zero past end", z, "ENOSPC")
show("still serving", digest(h.pread(4096, 0)))
h.shutdown()
