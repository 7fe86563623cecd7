#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A writer killed with SIGKILL leaves no image lock behind (issue 48).

Each round starts a writer on the top of an overlay chain
(base.qcow2 <- mid.qcow2 <- top.qcow2), kills it with SIGKILL at a random
instant, reaps it, and at once (no sleep) opens the top as QEMU would:

  qemu-img info top.qcow2                (shared locks on the whole chain)
  qemu-io -c 'read 0 512' top.qcow2      (read-write: the write lock)

Neither may be refused: a dead process holds no lock. Then
`qemu-img check top.qcow2` must find no errors (leaked clusters are what a
kill leaves, and allowed). The chain carries over from round to round, so
writers also open images a killed writer left behind.

The writer is a command line (--writer), so that a new kind of writer or
server is one more registration (tests/kill_lock.cmake). Placeholders:
{qcowtool} the qcowtool binary, {top} the image, {socket} a Unix socket
path, {data} a file of random bytes (a quarter of the disk) for a client
to copy in. Commands run without a shell. With --client, the writer is a server: once {socket} accepts a
connection the client command (an NBD client writing through it) starts,
and the server is killed in the middle of the client's writes.

  tests/kill_lock_test.py --qcowtool build/qcowtool --rounds 200 \\
      --writer '{qcowtool} bench pattern -q -w -t none -c 100000000 -d 64 \\
                -s 256k {top}'

Prints one line per refusal and a summary ("refused N of M rounds");
exits 1 on any refusal or check error, 77 (skip) when qemu-img, qemu-io,
or what the client needs is missing, or O_DIRECT is refused where a
--direct-needed writer runs. QCOW2_KILL_SEED=N replays a run;
QCOW2_LONG_TESTS=1 runs --long-rounds instead of --rounds.
"""

import argparse
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

SKIP = 77
IMAGE_SIZE = 256 << 20


def run(argv, check=True):
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
    if check and p.returncode != 0:
        sys.exit("kill_lock_test: %s failed (%d): %s"
                 % (" ".join(argv), p.returncode, p.stderr.strip()))
    return p


def make_chain(d):
    """base.qcow2 with data, mid.qcow2 with some more, an empty top."""
    base, mid, top = (os.path.join(d, n)
                      for n in ("base.qcow2", "mid.qcow2", "top.qcow2"))
    run(["qemu-img", "create", "-q", "-f", "qcow2", base, str(IMAGE_SIZE)])
    run(["qemu-io", "-c", "write -P 0x11 0 16M", base])
    run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", "base.qcow2",
         "-F", "qcow2", mid])
    run(["qemu-io", "-c", "write -P 0x22 8M 16M", mid])
    run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", "mid.qcow2",
         "-F", "qcow2", top])
    return top


def direct_io_works(d):
    path = os.path.join(d, "direct-probe")
    try:
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o644)
        os.close(fd)
        return True
    except OSError:
        return False
    finally:
        if os.path.exists(path):
            os.unlink(path)


def wait_listening(path, proc, timeout=10.0):
    """True once `path` accepts a connection; False if `proc` died."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            return False
        if os.path.exists(path):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
                return True
            except OSError:
                pass
            finally:
                s.close()
        time.sleep(0.005)
    return False


def wait_first_write(path, mtime0, procs, timeout=10.0):
    """Waits until `path` is written (its mtime moves). A writer or client
    that exits first, or no write in `timeout` seconds, fails the test: a
    kill that lands before anything was written proves nothing."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if os.stat(path).st_mtime_ns != mtime0:
            return None
        for p in procs:
            if p.poll() is not None:
                return "%s exited (%d) before the first write: %s" % (
                    p.args[0], p.returncode, p.stderr.read().strip())
        time.sleep(0.001)
    return "nothing written to the top in %.0f s" % timeout


def kill_and_reap(proc):
    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def spawn(cmd):
    # No shell: the process waited for must be the writer itself, not a
    # shell whose child would still be dying when the shell is reaped. A
    # process group of its own all the same, so that anything it starts
    # dies with it.
    return subprocess.Popen(shlex.split(cmd), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True,
                            text=True)


def refused(p):
    return p.returncode != 0 and "lock" in p.stderr


def one_round(args, top, sock, data, rng, n):
    """Runs one round; returns a list of refusal messages."""
    fmt = {"qcowtool": shlex.quote(args.qcowtool), "top": shlex.quote(top),
           "socket": shlex.quote(sock), "data": shlex.quote(data)}
    if os.path.exists(sock):
        os.unlink(sock)
    mtime0 = os.stat(top).st_mtime_ns
    writer = spawn(args.writer.format(**fmt))
    client = None
    if args.client:
        if not wait_listening(sock, writer):
            err = writer.stderr.read() if writer.poll() is not None else ""
            kill_and_reap(writer)
            sys.exit("kill_lock_test: round %d: the server did not listen: %s"
                     % (n, err.strip()))
        client = spawn(args.client.format(**fmt))
    # The kill lands while the writer writes, not while it starts up.
    late = wait_first_write(top, mtime0, [p for p in (writer, client) if p])
    if late:
        kill_and_reap(writer)
        kill_and_reap(client)
        sys.exit("kill_lock_test: round %d: %s" % (n, late))
    time.sleep(rng.uniform(args.min_delay, args.max_delay))
    # The writer first: the client may notice and exit, but the writer
    # must die in the middle of its work.
    os.killpg(writer.pid, signal.SIGKILL)
    writer.wait()
    # At once: no sleep between the reap and the openers.
    info = run(["qemu-img", "info", top], check=False)
    rw = run(["qemu-io", "-c", "read 0 512", top], check=False)
    kill_and_reap(client)
    problems = []
    for what, p in (("qemu-img info", info), ("qemu-io (read-write)", rw)):
        if refused(p):
            problems.append("round %d: %s refused: %s"
                            % (n, what, p.stderr.strip().splitlines()[0]))
        elif p.returncode != 0:
            sys.exit("kill_lock_test: round %d: %s failed: %s"
                     % (n, what, p.stderr.strip()))
    if problems:
        # Let the dead writer's locks go, then check what it left.
        for _ in range(200):
            if not refused(run(["qemu-img", "info", top], check=False)):
                break
            time.sleep(0.01)
    chk = run(["qemu-img", "check", top], check=False)
    # 0: clean; 3: leaked clusters only (what a kill leaves).
    if chk.returncode not in (0, 3):
        sys.exit("kill_lock_test: round %d: qemu-img check found errors (%d):"
                 "\n%s%s" % (n, chk.returncode, chk.stdout, chk.stderr))
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--qcowtool", required=True)
    ap.add_argument("--writer", required=True,
                    help="the writer's command line (see the placeholders)")
    ap.add_argument("--client", default="",
                    help="with a server as --writer: the NBD client that "
                         "writes through {socket}")
    ap.add_argument("--name", default="writer")
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--long-rounds", type=int, default=200)
    ap.add_argument("--min-delay", type=float, default=0.0,
                    help="seconds after the writer's first write to the "
                         "image at which the kill may come, at the earliest")
    ap.add_argument("--max-delay", type=float, default=0.2)
    ap.add_argument("--needs-direct", action="store_true",
                    help="skip where the temporary directory refuses "
                         "O_DIRECT")
    ap.add_argument("--needs", action="append", default=[],
                    help="a program the writer or client runs (skip without)")
    ap.add_argument("--keep-going", action="store_true",
                    help="run every round even after a refusal (to count)")
    args = ap.parse_args()

    for prog in ["qemu-img", "qemu-io"] + args.needs:
        if shutil.which(prog) is None:
            print("kill_lock_test: %s not found: skipped" % prog)
            return SKIP
    rounds = args.rounds
    if os.environ.get("QCOW2_LONG_TESTS"):
        rounds = args.long_rounds
    seed = int(os.environ.get("QCOW2_KILL_SEED", random.randrange(1 << 31)))
    rng = random.Random(seed)
    print("kill_lock_test %s: %d rounds, seed %d (QCOW2_KILL_SEED)"
          % (args.name, rounds, seed), flush=True)

    with tempfile.TemporaryDirectory(prefix="kill_lock.") as d:
        if args.needs_direct and not direct_io_works(d):
            print("kill_lock_test: %s refuses O_DIRECT: skipped" % d)
            return SKIP
        # Short: a Unix socket path has a 108-byte limit.
        sockdir = tempfile.mkdtemp(prefix="kl.", dir="/tmp")
        sock = os.path.join(sockdir, "s")
        try:
            top = make_chain(d)
            # A source for clients that copy data in (nbdcopy).
            data = os.path.join(d, "data.raw")
            with open(data, "wb") as f:
                f.write(os.urandom(IMAGE_SIZE // 4))
            refusals = []
            start = time.monotonic()
            for n in range(1, rounds + 1):
                problems = one_round(args, top, sock, data, rng, n)
                for p in problems:
                    print(p, flush=True)
                refusals += problems
                if problems and not args.keep_going:
                    break
                # A fresh chain now and then: writers also meet an image
                # that has grown under many kills, and a clean one.
                if n % 50 == 0 and n < rounds:
                    for f in os.listdir(d):
                        if f.endswith(".qcow2"):
                            os.unlink(os.path.join(d, f))
                    top = make_chain(d)
            bad_rounds = len({p.split(":")[0] for p in refusals})
            print("kill_lock_test %s: refused in %d of %d rounds (%.1f s)"
                  % (args.name, bad_rounds, n, time.monotonic() - start))
        finally:
            shutil.rmtree(sockdir, ignore_errors=True)
    return 1 if refusals else 0


if __name__ == "__main__":
    sys.exit(main())
