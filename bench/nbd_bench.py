#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""fio through NBD against several servers in one run, side by side.

Servers (each on a Unix socket; each serves a copy of the image of its
own, so that they can all run at once):
  qcowtool         `qcowtool serve --direct` on a qcow2 image (the project's
                   own NBD server, serve/nbd/, O_DIRECT)
  qemu-nbd         `qemu-nbd --aio=io_uring --cache=none` on the same image
  qcowtool-cached  `qcowtool serve` without --direct: through the page
                   cache, as the raw server (qcowtool serve's default)
  qcowtool-nbdkit  (only with --servers) `qcowtool serve --nbdkit --direct`:
                   nbdkit with the libqcow2 plugin, O_DIRECT
  qemu-nbd-cached  `qemu-nbd --aio=io_uring --cache=writeback` on the same
                   image: qemu-nbd through the page cache
  raw              nbdkit's `file` plugin on a raw file with the same bytes:
                   the transport's ceiling (no format at all; page cache)
  raw-nbdkit-direct
                   nbdkit with bench/nbdkit_rawdirect_plugin.cc on the raw
                   file: one O_DIRECT pread or pwrite a request on nbdkit's
                   worker thread, the ceiling of nbdkit's thread-per-request
                   model for the O_DIRECT servers (built next to qcowtool;
                   left out, with a note, when it is not there, unless
                   --servers or --rawdirect-plugin names it)
  raw-direct       (only with --servers) qemu-nbd --cache=none on the raw
                   file: the ceiling for the O_DIRECT servers

Jobs (fio --ioengine=nbd, one NBD connection per fio job):
  CrystalDiskMark rows on the allocated image, read and write:
    SEQ1M Q8T1, SEQ1M Q1T1, RND4K Q32T16, RND4K Q1T1
  ovl-RND4K-Q32T1-write  4 KiB random writes into a fresh overlay (backed by
                         the image; raw: a fresh sparse raw file)
  3img-RND4K-Q32T1-write three writers on three fresh images at once, one
                         server each (the "three VMs" case); summed

Method: the CDM servers run at once and take turns job by job, and the
fresh-image jobs run server after server; --repeat rounds of each, the
order of the servers rotated every round, and the median run of each
(server, job) is shown (--stat best: the fastest). So a change of the
machine's load (shared machines swing by 2x within minutes) lands on
every server alike. The page cache
is part of what the cached servers measure, so it is made alike too:
every server's image is written back and dropped from the cache before
the first job (each image then goes through the same jobs in the same
order), and everything dirty is written back (sync) before every run, so
that no run pays for the write-back of the runs before it. (The shape of
a file's cache matters: 4 KiB random writes leave it in small pages, into
which a 1 MiB write cost up to a quarter more than into the large ones a
sequential read leaves; and 4 KiB random writes into large pages ran at a
quarter of their speed in small ones.)

CPU: the server processes' CPU time (user + system, all their threads,
from /proc/PID/stat) over each run, divided by the requests fio completed
in it: microseconds of server CPU per request, the median over the rounds
(cpu_us_per_req; --stat best: the least) and in a second table.

Output: one JSON object per (server, job) row on stdout or --json FILE,
and a markdown table (--table FILE, default stdout) with MB/s for SEQ rows
and IOPS for RND rows, and the ratios that compare like with like:
qcowtool / qemu-nbd (both O_DIRECT), qcowtool-cached / qemu-nbd-cached
(both through the page cache), qcowtool-cached / raw (both through the
page cache, one nbdkit each: what libqcow2 costs over a raw file),
qcowtool / raw-nbdkit-direct (both O_DIRECT, one nbdkit each), and
qcowtool / raw-direct when that server runs. Every qcow2 image a qcowtool
server wrote is checked with `qemu-img check` afterwards.

  bench/nbd_bench.py --qcowtool build/qcowtool --size 1G --runtime 5
  bench/nbd_bench.py --qcowtool build/qcowtool --small   # CI: 64 MiB, 1 s

Exit status: 0 done, 77 a tool is missing (nbdkit, qemu-nbd, fio with the
nbd engine), 1 a server or fio failed.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

CDM_JOBS = [
    # name, rw, bs, iodepth, numjobs
    ("SEQ1M-Q8T1", "read", "1M", 8, 1),
    ("SEQ1M-Q8T1", "write", "1M", 8, 1),
    ("SEQ1M-Q1T1", "read", "1M", 1, 1),
    ("SEQ1M-Q1T1", "write", "1M", 1, 1),
    ("RND4K-Q32T16", "randread", "4k", 32, 16),
    ("RND4K-Q32T16", "randwrite", "4k", 32, 16),
    ("RND4K-Q1T1", "randread", "4k", 1, 1),
    ("RND4K-Q1T1", "randwrite", "4k", 1, 1),
]
SERVERS = ["qcowtool", "qemu-nbd", "qcowtool-cached", "qemu-nbd-cached",
           "raw", "raw-nbdkit-direct"]
# Optional (--servers): the raw file through qemu-nbd with O_DIRECT, the
# ceiling for O_DIRECT servers (nbdkit's file plugin goes through the page
# cache).
EXTRA_SERVERS = ["raw-direct", "qcowtool-nbdkit"]
# The ratios the table prints: (server, against), each pair in the same
# cache mode (O_DIRECT against O_DIRECT, page cache against page cache).
RATIOS = [("qcowtool", "qemu-nbd"), ("qcowtool-cached", "qemu-nbd-cached"),
          ("qcowtool-nbdkit", "qemu-nbd"),
          ("qcowtool-cached", "raw"), ("qcowtool", "raw-nbdkit-direct"),
          ("qcowtool", "raw-direct")]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(argv, **kw):
    r = subprocess.run(argv, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise RuntimeError("%s failed (exit %d): %s" %
                           (" ".join(argv), r.returncode, r.stderr.strip()))
    return r.stdout


def wait_socket(path, proc_check, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return
        except OSError:
            pass
        finally:
            s.close()
        proc_check()
        time.sleep(0.02)
    raise RuntimeError("no server listening on %s after %d s" % (path, timeout))


class Server:
    """One NBD server process in the foreground, on a Unix socket."""

    count = 0

    def __init__(self, kind, image, sock, args):
        # A fresh socket name per server: nbdkit may leave its socket file.
        Server.count += 1
        sock = "%s.%d" % (sock, Server.count)
        if os.path.exists(sock):
            os.unlink(sock)  # left by an earlier run in the same --dir
        self.sock = sock
        self.uri = "nbd+unix:///?socket=" + sock
        if kind in ("qcowtool", "qcowtool-cached", "qcowtool-nbdkit"):
            direct = {"qcowtool": ["--direct"], "qcowtool-cached": [],
                      "qcowtool-nbdkit": ["--nbdkit", "--direct"]}[kind]
            argv = ([args.qcowtool, "serve", "--socket", sock] + direct +
                    args.serve_args.split() + [image])
        elif kind in ("qemu-nbd", "qemu-nbd-cached"):
            cache = "none" if kind == "qemu-nbd" else "writeback"
            argv = ["qemu-nbd", "-k", sock, "-f", "qcow2", "--aio=io_uring",
                    "--cache=" + cache, "--shared=64", "--persistent", image]
        elif kind == "raw-nbdkit-direct":
            argv = ["nbdkit", "--foreground", "--unix", sock,
                    args.rawdirect_plugin, image]
        elif kind == "raw-direct":
            argv = ["qemu-nbd", "-k", sock, "-f", "raw", "--aio=io_uring",
                    "--cache=none", "--shared=64", "--persistent", image]
        else:
            argv = ["nbdkit", "--foreground", "--unix", sock, "file", image]
        self.argv = argv
        self.errlog = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                     stderr=self.errlog)
        wait_socket(sock, self.check)

    def cpu(self):
        """CPU seconds (user + system) of the server process so far."""
        with open("/proc/%d/stat" % self.proc.pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def check(self):
        if self.proc.poll() is not None:
            self.errlog.seek(0)
            raise RuntimeError("%s exited %d: %s" % (
                " ".join(self.argv), self.proc.returncode,
                self.errlog.read().decode(errors="replace").strip()))

    def stop(self):
        self.check()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            # qemu-nbd sometimes ignores SIGTERM right after the readiness
            # probe's connection.
            log("nbd_bench: %s ignored SIGTERM for 60 s: killed" %
                self.argv[0])
            self.proc.kill()
            self.proc.wait()


def fio(jobs, runtime, size):
    """Runs fio with `jobs` (dicts: uri, rw, bs, iodepth, numjobs), all at
    once; returns (iops, MB/s, mean latency us, requests done) summed over
    them."""
    argv = ["fio", "--output-format=json", "--ioengine=nbd",
            "--time_based", "--runtime=%d" % runtime, "--ramp_time=0",
            "--group_reporting"]
    for i, j in enumerate(jobs):
        argv += ["--name=j%d" % i, "--uri=" + j["uri"], "--rw=" + j["rw"],
                 "--bs=" + j["bs"], "--iodepth=%d" % j["iodepth"],
                 "--numjobs=%d" % j["numjobs"], "--size=%d" % size,
                 "--randrepeat=0", "--norandommap"]
    text = run(argv)
    # The nbd engine prints "fio: connected to NBD server" lines first.
    out = json.loads(text[text.index("{"):])
    iops = bw = lat_weighted = 0.0
    ios = 0
    for job in out["jobs"]:
        for d in ("read", "write"):
            st = job[d]
            if st["io_bytes"] == 0:
                continue
            iops += st["iops"]
            ios += st["total_ios"]
            bw += st["bw_bytes"] / 1e6
            lat_weighted += st["lat_ns"]["mean"] / 1000 * st["iops"]
    return iops, bw, (lat_weighted / iops if iops else 0.0), ios


def measured(servers, jobs, runtime, size):
    """fio with `jobs` while `servers` serve them; adds the servers' CPU
    microseconds per request to fio's numbers."""
    before = sum(s.cpu() for s in servers)
    iops, bw, lat, ios = fio(jobs, runtime, size)
    cpu = sum(s.cpu() for s in servers) - before
    return iops, bw, lat, (cpu * 1e6 / ios if ios else 0.0)


def make_data_file(path, size):
    """A raw file of `size` bytes of incompressible data, no holes."""
    chunk = 4 << 20
    with open("/dev/urandom", "rb") as rnd, open(path, "wb") as f:
        left = size
        block = rnd.read(chunk)
        n = 0
        while left > 0:
            part = min(left, chunk)
            # Vary each chunk a little so no two are equal.
            f.write(n.to_bytes(8, "little") + block[8:part])
            left -= part
            n += 1


def drop_cache(path):
    """Writes `path` back and drops it from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def server_image(kind, work):
    """The allocated image a CDM server serves: a copy of its own, so that
    every server runs at once without sharing a lock or a page cache."""
    base = "image.raw" if kind.startswith("raw") else "image.qcow2"
    path = os.path.join(work, "%s-%s" % (kind, base))
    if not os.path.exists(path):
        shutil.copyfile(os.path.join(work, base), path)
    return path


def bench_cdm(kinds, work, args, size, best):
    """Every CDM job against every server, the servers running at once and
    taking turns job by job (the order rotated each round), so that a change
    of the machine's load lands on all of them alike."""
    cdm = [j for j in CDM_JOBS if not args.jobs or j[0] in args.jobs.split(",")]
    if not cdm:
        return
    servers = {}
    try:
        for kind in kinds:
            drop_cache(server_image(kind, work))
            servers[kind] = Server(kind, server_image(kind, work),
                                   os.path.join(work, kind + ".sock"), args)
        for name, rw, bs, qd, nj in cdm:
            for rep in range(args.repeat):
                for kind in rotated(kinds, rep):
                    os.sync()
                    iops, bw, lat, cpu = measured(
                        [servers[kind]],
                        [dict(uri=servers[kind].uri, rw=rw, bs=bs,
                              iodepth=qd, numjobs=nj)], args.runtime, size)
                    keep(best, kind, name, rw, iops, bw, lat, cpu)
    finally:
        for srv in servers.values():
            srv.stop()


def rotated(kinds, rep):
    k = rep % len(kinds)
    return kinds[k:] + kinds[:k]


def bench_overlay(kind, work, args, size, best):
    # 4 KiB random writes into a fresh overlay of a base no server writes
    # (raw servers: a fresh sparse raw file).
    base = os.path.join(work, "image.qcow2")
    os.sync()  # no write-back of earlier runs during this one
    fresh = fresh_image(kind, work, "ovl", base, size)
    srv = Server(kind, fresh, os.path.join(work, kind + "-ovl.sock"), args)
    try:
        iops, bw, lat, cpu = measured(
            [srv], [dict(uri=srv.uri, rw="randwrite", bs="4k", iodepth=32,
                         numjobs=1)], args.runtime, size)
        keep(best, kind, "ovl-RND4K-Q32T1", "randwrite", iops, bw, lat, cpu)
    finally:
        srv.stop()


def bench_three(kind, work, args, size, best):
    """Three writers, three fresh images, three servers, at once."""
    servers, jobs = [], []
    os.sync()  # no write-back of earlier runs during this one
    try:
        for i in range(3):
            img = fresh_image(kind, work, "w%d" % i, None, size)
            s3 = os.path.join(work, "%s-%d.sock" % (kind, i))
            servers.append(Server(kind, img, s3, args))
            jobs.append(dict(uri=servers[-1].uri, rw="randwrite",
                             bs="4k", iodepth=32, numjobs=1))
        iops, bw, lat, cpu = measured(servers, jobs, args.runtime, size)
        keep(best, kind, "3img-RND4K-Q32T1", "randwrite", iops, bw, lat, cpu)
    finally:
        for s in servers:
            s.stop()


def bench_fresh(kinds, work, args, size, best):
    """The fresh-image jobs, round by round, every server in each round."""
    wanted = args.jobs.split(",") if args.jobs else None
    for rep in range(args.repeat):
        for kind in rotated(kinds, rep):
            if wanted is None or "ovl-RND4K-Q32T1" in wanted:
                bench_overlay(kind, work, args, size, best)
            if wanted is None or "3img-RND4K-Q32T1" in wanted:
                bench_three(kind, work, args, size, best)


def fresh_image(kind, work, tag, backing, size):
    if kind.startswith("raw"):
        path = os.path.join(work, "%s-%s.raw" % (kind, tag))
        if os.path.exists(path):
            os.unlink(path)
        with open(path, "wb") as f:
            f.truncate(size)
        return path
    path = os.path.join(work, "%s-%s.qcow2" % (kind, tag))
    if os.path.exists(path):
        os.unlink(path)
    argv = ["qemu-img", "create", "-q", "-f", "qcow2"]
    if backing:
        argv += ["-b", backing, "-F", "qcow2", path]
    else:
        argv += [path, str(size)]
    run(argv)
    return path


JOB_ORDER = [j[0] + "/" + j[1] for j in CDM_JOBS] + [
    "ovl-RND4K-Q32T1/randwrite", "3img-RND4K-Q32T1/randwrite"]


def row_order(key):
    server, job, rw = key
    all_servers = SERVERS + EXTRA_SERVERS
    return (all_servers.index(server), JOB_ORDER.index(job + "/" + rw))


def keep(runs, server, job, rw, iops, bw, lat, cpu):
    """Records one run of a (server, job, rw)."""
    row = dict(server=server, job=job, rw=rw, iops=round(iops, 1),
               mbps=round(bw, 1), lat_us=round(lat, 1),
               cpu_us_per_req=round(cpu, 2))
    log("  %-17s %-18s %-9s %10.0f IOPS %9.1f MB/s %9.1f us %7.2f us CPU/req"
        % (server, job, rw, iops, bw, lat, cpu))
    runs.setdefault((server, job, rw), []).append(row)


def pick(rows, stat):
    """The run that stands for a (server, job, rw): the one of median IOPS
    (of an even count, the faster of the middle two), or the fastest; its
    CPU per request is the median (or least) of all its runs, since a
    loaded machine inflates CPU time too."""
    by_iops = sorted(rows, key=lambda r: r["iops"])
    cpus = sorted(r["cpu_us_per_req"] for r in rows)
    if stat == "best":
        row, cpu = dict(by_iops[-1]), cpus[0]
    else:
        row, cpu = dict(by_iops[len(rows) // 2]), cpus[(len(rows) - 1) // 2]
    row["cpu_us_per_req"] = cpu
    row["runs"] = len(rows)
    return row


def table(rows):
    by = {(r["server"], r["job"], r["rw"]): r for r in rows}
    servers = [s for s in SERVERS + EXTRA_SERVERS
               if any(r["server"] == s for r in rows)]
    pairs = [(a, b) for a, b in RATIOS if a in servers and b in servers]
    keys = []
    for r in rows:
        k = (r["job"], r["rw"])
        if k not in keys:
            keys.append(k)
    lines = ["| job | rw | unit | " + " | ".join(servers) + " | " +
             " | ".join("%s / %s" % p for p in pairs) + " |",
             "|---|---|---|" + "---:|" * (len(servers) + len(pairs))]
    for job, rw in keys:
        unit = "MB/s" if job.startswith("SEQ") else "IOPS"
        field = "mbps" if unit == "MB/s" else "iops"
        val = {s: by.get((s, job, rw), {}).get(field) for s in servers}
        cells = ["%.0f" % val[s] if val[s] is not None else "-"
                 for s in servers]
        ratios = ["%.2f" % (val[a] / val[b]) if val[a] is not None and val[b]
                  else "-" for a, b in pairs]
        lines.append("| %s | %s | %s | " % (job, rw, unit) +
                     " | ".join(cells + ratios) + " |")
    lines += ["", "Server CPU time per request (us, user + system):", "",
              "| job | rw | " + " | ".join(servers) + " | " +
              " | ".join("%s / %s" % p for p in pairs) + " |",
              "|---|---|" + "---:|" * (len(servers) + len(pairs))]
    for job, rw in keys:
        val = {s: by.get((s, job, rw), {}).get("cpu_us_per_req")
               for s in servers}
        cells = ["%.1f" % val[s] if val[s] is not None else "-"
                 for s in servers]
        ratios = ["%.2f" % (val[a] / val[b]) if val[a] is not None and val[b]
                  else "-" for a, b in pairs]
        lines.append("| %s | %s | " % (job, rw) + " | ".join(cells + ratios)
                     + " |")
    return "\n".join(lines) + "\n"


def parse_size(text):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower()
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(t)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--qcowtool", default=shutil.which("qcowtool") or
                    "build/qcowtool")
    ap.add_argument("--size", default="1G", help="image size (default 1G)")
    ap.add_argument("--runtime", type=int, default=5,
                    help="seconds per job (default 5)")
    ap.add_argument("--dir", help="work directory (default: a new one under "
                    "$TMPDIR, removed afterwards)")
    ap.add_argument("--servers", default="",
                    help="comma-separated subset of " + ",".join(SERVERS) +
                    " (default: all of them)")
    ap.add_argument("--rawdirect-plugin",
                    help="nbdkit-rawdirect-plugin.so for the "
                    "raw-nbdkit-direct server (default: next to qcowtool)")
    ap.add_argument("--serve-args", default="",
                    help="more options for qcowtool serve (e.g. "
                    "'--threads 4')")
    ap.add_argument("--jobs", default="",
                    help="comma-separated job names to run (default: all)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="rounds of every job (default 3)")
    ap.add_argument("--stat", choices=("median", "best"), default="median",
                    help="which run of the rounds the table shows: the "
                    "median (default) or the fastest")
    ap.add_argument("--small", action="store_true",
                    help="CI mode: 64 MiB, 1 s per job, one round")
    ap.add_argument("--json", help="write the JSON rows here (one per line)")
    ap.add_argument("--table", help="write the markdown table here")
    args = ap.parse_args()
    if args.small:
        args.size, args.runtime, args.repeat = "64M", 1, 1
    size = parse_size(args.size)

    for tool in ("nbdkit", "qemu-nbd", "qemu-img", "fio"):
        if shutil.which(tool) is None:
            log("nbd_bench: %s is not installed: skipped" % tool)
            return 77
    if " nbd" not in run(["fio", "--enghelp"]).replace("\t", " "):
        log("nbd_bench: this fio has no nbd engine: skipped")
        return 77
    if not os.access(args.qcowtool, os.X_OK):
        log("nbd_bench: no qcowtool at %s (--qcowtool)" % args.qcowtool)
        return 1
    args.qcowtool = os.path.abspath(args.qcowtool)
    plugin_named = args.rawdirect_plugin is not None
    if not plugin_named:
        args.rawdirect_plugin = os.path.join(os.path.dirname(args.qcowtool),
                                             "nbdkit-rawdirect-plugin.so")
    kinds = args.servers.split(",") if args.servers else list(SERVERS)
    for kind in kinds:
        if kind not in SERVERS + EXTRA_SERVERS:
            log("nbd_bench: unknown server '%s' (--servers)" % kind)
            return 1
    if ("raw-nbdkit-direct" in kinds and
            not os.path.exists(args.rawdirect_plugin)):
        if args.servers or plugin_named:
            log("nbd_bench: no %s (--rawdirect-plugin) for the "
                "raw-nbdkit-direct server" % args.rawdirect_plugin)
            return 1
        log("nbd_bench: no %s: the raw-nbdkit-direct server is left out" %
            args.rawdirect_plugin)
        kinds.remove("raw-nbdkit-direct")

    work = args.dir or tempfile.mkdtemp(prefix="nbd_bench.")
    os.makedirs(work, exist_ok=True)
    rows = []
    try:
        raw = os.path.join(work, "image.raw")
        qcow = os.path.join(work, "image.qcow2")
        log("nbd_bench: %s image, %d s per job, in %s, load %s" % (
            args.size, args.runtime, work,
            " ".join("%.2f" % x for x in os.getloadavg())))
        make_data_file(raw, size)
        run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, qcow])
        runs = {}
        bench_cdm(kinds, work, args, size, runs)
        bench_fresh(kinds, work, args, size, runs)
        rows = [pick(runs[k], args.stat) for k in sorted(runs, key=row_order)]
        # Every qcow2 image a qcowtool server wrote must pass qemu-img check.
        for name in sorted(os.listdir(work)):
            if name.startswith("qcowtool") and name.endswith(".qcow2"):
                path = os.path.join(work, name)
                check = subprocess.run(["qemu-img", "check", path],
                                       capture_output=True, text=True)
                if check.returncode != 0:
                    log("nbd_bench: qemu-img check %s after the run:\n%s" % (
                        path, check.stdout + check.stderr))
                    return 1
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        log("nbd_bench: %s" % e)
        return 1
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    log("nbd_bench: load after the run %s" %
        " ".join("%.2f" % x for x in os.getloadavg()))
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    t = table(rows)
    if args.table:
        with open(args.table, "w") as f:
            f.write(t)
    else:
        sys.stdout.write(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
