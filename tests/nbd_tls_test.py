#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""TLS on `qcowtool serve`, with qemu-nbd beside it as the reference.

Credentials are made here: PSK with psktool, x509 (a CA and a server
certificate for localhost and 127.0.0.1) with certtool. For each kind,
both servers serve a copy of one qcow2 image with TLS required, and:
  - nbdinfo over nbds:// (PSK: tls-psk-file; x509: tls-certificates over
    TCP on 127.0.0.1) reads the same size and map from both;
  - qemu-img with --object tls-creds-psk|x509 reads the same data from
    both (`qemu-img convert` to raw files, compared byte for byte) and
    writes through ours (qemu-io), which the image then holds;
  - a plain client is refused by both (nbdinfo fails, and our server
    answers NBD_REP_ERR_TLS_REQD: libnbd's message names TLS);
  - with --tls=on, ours serves the plain client too.
Every image must pass `qemu-img check` after its server stops.

Usage: nbd_tls_test.py QCOWTOOL        (exit 77: a tool is missing)
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from nbd_util import wait_listening


def run(*argv, check=True):
    r = subprocess.run(argv, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(argv), r.returncode,
                                                 r.stderr.strip()))
    return r


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def make_x509(d):
    def template(name, text):
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write(text)
        return path
    ca = template("ca.info", "cn = qcow2 test CA\nca\ncert_signing_key\n"
                  "expiration_days = 2\n")
    srv = template("server.info", "organization = qcow2 test\n"
                   "cn = localhost\ndns_name = localhost\n"
                   "ip_address = 127.0.0.1\ntls_www_server\n"
                   "encryption_key\nsigning_key\nexpiration_days = 2\n")
    p = lambda n: os.path.join(d, n)
    run("certtool", "--generate-privkey", "--outfile", p("ca-key.pem"))
    run("certtool", "--generate-self-signed", "--load-privkey",
        p("ca-key.pem"), "--template", ca, "--outfile", p("ca-cert.pem"))
    run("certtool", "--generate-privkey", "--outfile", p("server-key.pem"))
    run("certtool", "--generate-certificate", "--load-ca-certificate",
        p("ca-cert.pem"), "--load-ca-privkey", p("ca-key.pem"),
        "--load-privkey", p("server-key.pem"), "--template", srv,
        "--outfile", p("server-cert.pem"))


class Server:
    def __init__(self, kind, qcowtool, image, tls, work, mode="require"):
        self.image = image
        self.sock = os.path.join(work, "%s-%s.sock" % (kind, tls))
        self.port = free_port() if tls == "x509" else None
        creds = os.path.join(work, tls)
        if kind == "qcowtool":
            argv = [qcowtool, "serve", "--tls=" + mode]
            argv += (["--tls-creds", creds] if tls == "x509" else
                     ["--tls-psk", os.path.join(creds, "keys.psk")])
        else:
            # Ours asks no client certificate; qemu-nbd by default does.
            obj = ("tls-creds-x509,id=tls0,endpoint=server,verify-peer=off,"
                   "dir=" + creds
                   if tls == "x509" else
                   "tls-creds-psk,id=tls0,endpoint=server,dir=" + creds)
            argv = ["qemu-nbd", "-f", "qcow2", "-t", "-e", "4",
                    "--object", obj, "--tls-creds", "tls0"]
        if self.port:
            argv += (["--bind", "127.0.0.1", "--port", str(self.port)]
                     if kind == "qcowtool" else
                     ["-b", "127.0.0.1", "-p", str(self.port)])
        else:
            argv += (["--socket", self.sock] if kind == "qcowtool" else
                     ["-k", self.sock])
        argv.append(image)
        self.proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
        wait_listening(self.proc, None if self.port else self.sock, self.port)

    def stop(self):
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, err


def nbdinfo_uri(srv, tls, work):
    if tls == "x509":
        return "nbds://localhost:%d/?tls-certificates=%s" % (
            srv.port, os.path.join(work, "x509"))
    return "nbds+unix://alice@/?socket=%s&tls-psk-file=%s" % (
        srv.sock, os.path.join(work, "psk", "keys.psk"))


def plain_uri(srv):
    if srv.port:
        return "nbd://127.0.0.1:%d/" % srv.port
    return "nbd+unix:///?socket=" + srv.sock


def qemu_args(srv, tls, work):
    creds = os.path.join(work, tls)
    obj = ("tls-creds-x509,id=tls0,endpoint=client,dir=" + creds
           if tls == "x509" else
           "tls-creds-psk,id=tls0,endpoint=client,username=alice,dir=" + creds)
    where = ("server.type=inet,server.host=localhost,server.port=%d" %
             srv.port if srv.port else
             "server.type=unix,server.path=" + srv.sock)
    return ["--object", obj, "--image-opts",
            "driver=nbd,%s,tls-creds=tls0" % where]


def one_kind(tls, qcowtool, work, src):
    out = {}
    problems = []
    for kind in ("qcowtool", "qemu-nbd"):
        image = os.path.join(work, "%s-%s.qcow2" % (kind, tls))
        shutil.copy(src, image)
        srv = Server(kind, qcowtool, image, tls, work)
        try:
            uri = nbdinfo_uri(srv, tls, work)
            size = run("nbdinfo", "--size", uri).stdout.strip()
            mp = run("nbdinfo", "--map", uri).stdout
            raw = os.path.join(work, "%s-%s.raw" % (kind, tls))
            run("qemu-img", "convert", "-O", "raw", *qemu_args(srv, tls, work)[:2],
                "--image-opts", qemu_args(srv, tls, work)[3], raw)
            plain = run("nbdinfo", "--size", plain_uri(srv), check=False)
            out[kind] = (size, mp, open(raw, "rb").read())
            if plain.returncode == 0:
                problems.append("%s %s: a plain client was served" % (kind, tls))
            if kind == "qcowtool":
                if "TLS" not in plain.stderr:
                    problems.append("%s: the refusal does not name TLS: %s" %
                                    (tls, plain.stderr.strip()))
                w = run("qemu-io", "-c", "write -P 0x5c 1M 64k", "-c", "flush",
                        *qemu_args(srv, tls, work), check=False)
                if w.returncode != 0:
                    problems.append("%s: qemu-io write over TLS: %s" %
                                    (tls, w.stderr.strip()))
        finally:
            rc, err = srv.stop()
        if kind == "qcowtool":
            if rc != 0:
                problems.append("%s: qcowtool serve exited %d: %s" %
                                (tls, rc, err))
            r = run("qemu-io", "-f", "qcow2", "-c", "read -P 0x5c 1M 64k",
                    image, check=False)
            if r.returncode != 0 or "fail" in r.stdout:
                problems.append("%s: the TLS write is not in the image" % tls)
        check = run("qemu-img", "check", image, check=False)
        if check.returncode != 0:
            problems.append("%s: qemu-img check %s: %s" %
                            (tls, image, check.stdout))
    if out.get("qcowtool") != out.get("qemu-nbd"):
        problems.append("%s: size, map or data differ from qemu-nbd's" % tls)
    # --tls=on: TLS offered, plain clients served too.
    image = os.path.join(work, "on-%s.qcow2" % tls)
    shutil.copy(src, image)
    srv = Server("qcowtool", qcowtool, image, tls, work, mode="on")
    try:
        plain = run("nbdinfo", "--size", plain_uri(srv), check=False)
        secure = run("nbdinfo", "--size", nbdinfo_uri(srv, tls, work),
                     check=False)
        if plain.returncode != 0 or secure.returncode != 0:
            problems.append("%s --tls=on: plain %d, TLS %d" % (
                tls, plain.returncode, secure.returncode))
    finally:
        srv.stop()
    return problems


def main():
    qcowtool = sys.argv[1]
    for tool in ("qemu-nbd", "qemu-img", "qemu-io", "nbdinfo", "certtool",
                 "psktool"):
        if shutil.which(tool) is None:
            print("%s is not installed: skipped" % tool)
            return 77
    work = tempfile.mkdtemp(prefix="qcow2-nbdtls-")
    try:
        os.makedirs(os.path.join(work, "psk"))
        os.makedirs(os.path.join(work, "x509"))
        run("psktool", "-u", "alice", "-p",
            os.path.join(work, "psk", "keys.psk"))
        make_x509(os.path.join(work, "x509"))
        src = os.path.join(work, "src.qcow2")
        run("qemu-img", "create", "-q", "-f", "qcow2", src, "8M")
        run("qemu-io", "-f", "qcow2", "-c", "write -P 0x61 0 2M",
            "-c", "write -z 4M 1M", src)
        problems = []
        for tls in ("psk", "x509"):
            problems += one_kind(tls, qcowtool, work, src)
            print("%s: done" % tls)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for p in problems:
        print("FAILED:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
