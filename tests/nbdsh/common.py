# SPDX-License-Identifier: Apache-2.0
# Shared by the nbdsh scripts of tests/nbd_nbdsh_test.sh (exec'd first by
# each; nbd_clients_test.py imports per_cluster): how a result is
# printed, so that two servers' outputs can be compared line by line.
import errno
import hashlib
import os

import nbd

URI = os.environ.get("NBD_URI")  # (nbd_clients_test.py imports this file)
MiB = 1 << 20
CLUSTER = 65536
STRICT_ALL = (nbd.STRICT_COMMANDS | nbd.STRICT_FLAGS | nbd.STRICT_BOUNDS |
              nbd.STRICT_ZERO_SIZE | nbd.STRICT_ALIGN)


def errname(e):
    return errno.errorcode.get(e.errnum, str(e.errnum)) if e.errnum else "error"


def attempt(fn):
    """'ok' or the errno name of what the server (or strict libnbd) said."""
    try:
        fn()
        return "ok"
    except nbd.Error as e:
        return errname(e)


def show(name, value):
    print(f"{name}: {value}")


def prescribed(name, value, expected):
    # Where the protocol document prescribes the error (ENOSPC, EPERM) and
    # qemu-nbd 7.2 says EINVAL: the test driver checks ours gives
    # `expected` and qemu-nbd some error, then drops the line.
    print(f"P {name.replace(' ', '-')} {value} {expected}")


def differs(name, value, expected):
    # A known difference from qemu-nbd: ours must give `expected`; qemu-nbd's
    # answer is not compared.
    print(f"D {name.replace(' ', '-')} {value} {expected}")


def digest(data):
    return hashlib.sha256(data).hexdigest()[:16]


def per_cluster(h, context, size):
    """Block status flags of every 64 KiB, whatever the extent sizes."""
    out, pos = [], 0
    while pos < size:
        got = []

        def cb(meta, offset, entries, err):
            if meta == context:
                got.extend(entries)
            return 0
        h.block_status(min(size - pos, 4 * MiB), pos, cb)
        for i in range(0, len(got), 2):
            length = min(got[i], size - pos)
            assert length > 0, "an empty extent"
            out.extend([got[i + 1]] * ((length + CLUSTER - 1) // CLUSTER))
            pos += length
    return out[:size // CLUSTER]
