# SPDX-License-Identifier: Apache-2.0
# nbdsh -c: every command in strict mode, structured replies on or off
# (NBDSH_STRUCTURED), on the chain of tests/nbd_nbdsh_test.sh (base: 0x11
# at 0-1M, 0x22 at 4M+256k; top: 0x33 at 512k+1M, zeros at 8M+1M, 0x44
# at 12M+64k; 16 MiB).
import os
exec(open(os.environ["NBDSH_COMMON"]).read())
structured = os.environ["NBDSH_STRUCTURED"] == "1"
h.set_request_structured_replies(structured)
if structured:
    h.add_meta_context("base:allocation")
    h.add_meta_context("qemu:allocation-depth")
h.set_strict_mode(STRICT_ALL)
h.connect_uri(URI)
size = h.get_size()
show("structured", h.get_structured_replies_negotiated())
show("READ", digest(h.pread(3 * MiB, 0)))
h.pwrite(b"\x55" * 4096, 2 * MiB, nbd.CMD_FLAG_FUA)
h.pwrite(b"\x66" * 100000, 3 * MiB + 7)
h.zero(CLUSTER, 5 * MiB, nbd.CMD_FLAG_NO_HOLE)
h.zero(2 * CLUSTER, 6 * MiB, nbd.CMD_FLAG_FUA)
show("WRITE_ZEROES FAST_ZERO",
     attempt(lambda: h.zero(CLUSTER, 7 * MiB, nbd.CMD_FLAG_FAST_ZERO)))
h.trim(CLUSTER, 9 * MiB)
# CACHE on backing data (0-512k comes from the base): both servers copy
# it into the top (copy-on-read); allocation-depth shows it below.
h.cache(512 << 10, 0)
h.cache(CLUSTER, 4 * MiB + CLUSTER)
h.flush()
show("READ back", digest(h.pread(size, 0)))
if structured:
    kinds = []

    def cb(buf, off, status, err):
        kinds.append({nbd.READ_DATA: "data", nbd.READ_HOLE: "hole"}
                     .get(status, status))
        return 0
    for off in (12 * MiB, 14 * MiB):
        del kinds[:]
        h.pread_structured(4096, off, cb)
        show(f"chunks at {off}", kinds)
    del kinds[:]
    h.pread_structured(CLUSTER, 12 * MiB - CLUSTER, cb, nbd.CMD_FLAG_DF)
    show("READ DF chunks", kinds)
    show("base:allocation", per_cluster(h, "base:allocation", size))
    show("qemu:allocation-depth",
         per_cluster(h, "qemu:allocation-depth", size))
    one = []
    h.block_status(size, 0, lambda m, o, e, err: one.append((m, len(e))),
                   nbd.CMD_FLAG_REQ_ONE)
    show("BLOCK_STATUS REQ_ONE", sorted(one))
h.shutdown()
show("DISC closed", h.aio_is_closed())
