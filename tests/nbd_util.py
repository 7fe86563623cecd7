# SPDX-License-Identifier: Apache-2.0
"""Helpers shared by the NBD client tests (nbd_*_test.py)."""
import socket
import time


def wait_listening(proc, sock=None, port=None):
    """Waits (up to a minute on a loaded machine; not a timing assertion)
    until the server `proc` accepts on Unix socket `sock` or TCP `port` of
    127.0.0.1; raises if it exits first."""
    for _ in range(6000):
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError("server exited with %d: %s" %
                               (proc.returncode, err))
        try:
            if sock:
                s = socket.socket(socket.AF_UNIX)
                s.connect(sock)
            else:
                s = socket.create_connection(("127.0.0.1", port))
            s.close()
            return
        except OSError:
            time.sleep(0.01)
    raise RuntimeError("server did not listen")
