/* SPDX-License-Identifier: Apache-2.0 */
/* Every call of the C API (include/qcow2/c.h), from C11: a chain (base and
 * an overlay with a backing file), synchronous and vectored I/O, vectored
 * reads across the backing boundary, completions through the queue's
 * eventfd in an epoll loop, block status, counters, and the error paths
 * (missing file, bad option strings, writing a read-only image, a full
 * queue). Then `qemu-img check` must pass on both files and `qemu-img
 * convert -O raw` must give the bytes the test expects. Last, live commit
 * and live stream (cancelled, refused, done) on a chain of their own.
 *
 *   c_api_test DIR      (DIR: an empty scratch directory)
 * Exit 0: pass, 1: fail, 77: qemu-img missing (skipped). */
#define _POSIX_C_SOURCE 200809L /* the test's own POSIX calls; c.h needs none */

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/uio.h>
#include <unistd.h>

#include "qcow2/c.h"
#include "qcow2/version.h"
#include "c_api_check.h"

#define MIB (UINT64_C(1) << 20)
#define SIZE (4 * MIB)
#define CLUSTER 65536u

/* rc must be `want` (a negative errno) with a message containing `part`. */
static void expect_error(int rc, int want, char** err, const char* part,
                         int line) {
  if (rc != want || *err == NULL || strstr(*err, part) == NULL) {
    fprintf(stderr, "line %d: want %d with \"%s\", got %d: %s\n", line, want,
            part, rc, *err != NULL ? *err : "(no message)");
    ++failures;
  }
  qcow2_free(*err);
  *err = NULL;
}
#define EXPECT_ERROR(rc, want, err, part) \
  expect_error((rc), (want), &(err), (part), __LINE__)

static uint8_t pattern(uint64_t pos, unsigned seed) {
  return (uint8_t)((pos * 131u + seed) ^ (pos >> 9));
}

/* What the overlay reads as, kept beside the image. */
static uint8_t* model;

static char base_path[4096], top_path[4096], raw_path[4096], dir_path[4096];

static void test_errors(void) {
  char* err = NULL;
  char missing[4200];
  snprintf(missing, sizeof missing, "%s/missing.qcow2", dir_path);
  CHECK(qcow2_image_open(missing, 0, &err) == NULL);
  CHECK(err != NULL && strstr(err, "missing.qcow2") != NULL);
  /* A stale message is replaced, not leaked. */
  CHECK(qcow2_image_open_opts(missing, "read-only=on", &err) == NULL);
  CHECK(err != NULL && strstr(err, "missing.qcow2") != NULL);
  qcow2_free(err);
  err = NULL;

  char bad[4200];
  snprintf(bad, sizeof bad, "%s/bad.qcow2", dir_path);
  EXPECT_ERROR(qcow2_image_create(bad, NULL, MIB, "cluster_size=1000", &err),
               -EINVAL, err, "cluster_size");
  EXPECT_ERROR(qcow2_image_create(bad, NULL, MIB, "colour=blue", &err),
               -EINVAL, err, "colour");
  EXPECT_ERROR(qcow2_image_create(bad, NULL, MIB, "extended_l2=maybe", &err),
               -EINVAL, err, "extended_l2");
  EXPECT_ERROR(qcow2_image_create(bad, NULL, MIB, "lazy_refcounts", &err),
               -EINVAL, err, "lazy_refcounts");
  CHECK(access(bad, F_OK) != 0); /* nothing created */
  EXPECT_ERROR(qcow2_image_create(base_path, NULL, MIB, NULL, &err), -EEXIST,
               err, "base.qcow2");

  CHECK(qcow2_image_open_opts(base_path, "cache=big", &err) == NULL);
  EXPECT_ERROR(-EINVAL, -EINVAL, err, "cache");
  CHECK(qcow2_image_open_opts(base_path, "read-only=perhaps", &err) == NULL);
  EXPECT_ERROR(-EINVAL, -EINVAL, err, "read-only");
  /* backing-root: the base lies outside /nonexistent-root. */
  CHECK(qcow2_image_open_opts(top_path, "backing-root=/nonexistent-root",
                              &err) == NULL);
  CHECK(err != NULL);
  qcow2_free(err);
  err = NULL;

  /* QEMU's image locks: while one handle writes the base, a second
   * writer is refused naming the lock; force-share opens it read-only
   * anyway, and force-share with read-write is a bad option. */
  {
    qcow2_image_t* writer = qcow2_image_open(base_path, 1, &err);
    CHECK_OK(writer == NULL, err);
    CHECK(qcow2_image_open(base_path, 1, &err) == NULL);
    EXPECT_ERROR(-EBUSY, -EBUSY, err, "locked");
    CHECK(qcow2_image_open_opts(base_path, "read-only=off,force-share=on",
                                &err) == NULL);
    EXPECT_ERROR(-EINVAL, -EINVAL, err, "force");
    CHECK(qcow2_image_open_opts(base_path, "force-share=maybe", &err) == NULL);
    EXPECT_ERROR(-EINVAL, -EINVAL, err, "force-share");
    qcow2_image_t* shared =
        qcow2_image_open_opts(base_path, "force-share=on", &err);
    CHECK_OK(shared == NULL, err);
    qcow2_image_destroy(shared);
    CHECK_OK(qcow2_image_close(writer, &err), err);
  }

  /* Read-only: writes fail, synchronous and queued; reads work. */
  qcow2_image_t* ro = qcow2_image_open(base_path, 0, &err);
  CHECK_OK(ro == NULL, err);
  if (ro == NULL) return;
  CHECK(!qcow2_image_writable(ro));
  uint8_t buf[512];
  memset(buf, 1, sizeof buf);
  EXPECT_ERROR(qcow2_image_write(ro, 0, buf, sizeof buf, &err), -EPERM, err,
               "base.qcow2");
  EXPECT_ERROR(qcow2_image_write_zeroes(ro, 0, 512, 0, &err), -EPERM, err,
               "base.qcow2");
  CHECK_OK(qcow2_image_read(ro, 0, buf, sizeof buf, &err), err);
  EXPECT_ERROR(qcow2_image_read(ro, SIZE - 100, buf, sizeof buf, &err), -EIO,
               err, "past the end");
  qcow2_prepare_io_thread(); /* before this thread's first io_uring call */
  qcow2_queue_t* q = qcow2_queue_create(ro, 4, &err);
  CHECK_OK(q == NULL, err);
  if (q != NULL) {
    struct iovec iov = {buf, sizeof buf};
    EXPECT_ERROR(qcow2_queue_writev(q, 0, &iov, 1, NULL, &err), -EPERM, err,
                 "base.qcow2");
    EXPECT_ERROR(qcow2_queue_readv(q, 0, &iov, -1, NULL, &err), -EINVAL, err,
                 "iovcnt");
    qcow2_completion_t c;
    CHECK(qcow2_queue_poll(q, &c, 1) == 0);
    qcow2_queue_destroy(q);
  }
  CHECK_OK(qcow2_image_close(ro, &err), err);
}

/* The _ex calls return the errno the NULL-returning ones drop: missing
 * file, a second writer (QEMU's lock), a bad option, a bad queue depth;
 * the handle is NULL on each failure, and set on success. */
static void test_open_errnos(void) {
  char* err = NULL;
  char missing[4200];
  snprintf(missing, sizeof missing, "%s/missing.qcow2", dir_path);
  qcow2_image_t* img = (qcow2_image_t*)&err; /* not NULL: must be cleared */
  EXPECT_ERROR(qcow2_image_open_ex(missing, NULL, &img, &err), -ENOENT, err,
               "missing.qcow2");
  CHECK(img == NULL);
  EXPECT_ERROR(qcow2_image_open_ex(base_path, "colour=blue", &img, &err),
               -EINVAL, err, "colour");
  CHECK(img == NULL);
  EXPECT_ERROR(qcow2_image_open_ex(base_path, NULL, NULL, &err), -EINVAL, err,
               "out");

  qcow2_image_t* writer = NULL;
  CHECK_OK(qcow2_image_open_ex(base_path, "read-only=off", &writer, &err),
           err);
  if (writer == NULL) return;
  EXPECT_ERROR(qcow2_image_open_ex(base_path, "read-only=off", &img, &err),
               -EBUSY, err, "locked");
  CHECK(img == NULL);

  qcow2_queue_t* q = (qcow2_queue_t*)&err;
  EXPECT_ERROR(qcow2_queue_create_ex(writer, 0, &q, &err), -EINVAL, err,
               "depth 0");
  CHECK(q == NULL);
  EXPECT_ERROR(qcow2_queue_create_ex(writer, -3, &q, &err), -EINVAL, err,
               "depth -3");
  EXPECT_ERROR(qcow2_queue_create_ex(NULL, 4, &q, &err), -EINVAL, err,
               "image");
  CHECK_OK(qcow2_queue_create_ex(writer, 4, &q, &err), err);
  CHECK(q != NULL);
  qcow2_queue_destroy(q);
  CHECK_OK(qcow2_image_close(writer, &err), err);
}

/* Runs the queue's requests to the end from an epoll loop over its
 * eventfd. Returns the completions seen. */
static int serve(qcow2_queue_t* q, int expected, qcow2_completion_t* got) {
  int efd = qcow2_queue_eventfd(q);
  CHECK(efd >= 0);
  CHECK(efd == qcow2_queue_eventfd(q));
  int ep = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event ev;
  memset(&ev, 0, sizeof ev);
  ev.events = EPOLLIN;
  CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, efd, &ev) == 0);
  int n = 0;
  while (n < expected) {
    struct epoll_event out;
    int r = epoll_wait(ep, &out, 1, -1);
    if (r < 0 && errno == EINTR) continue;
    CHECK(r == 1);
    uint64_t v;
    CHECK(read(efd, &v, sizeof v) == (ssize_t)sizeof v);
    int k;
    /* Two at a time: completions beyond `max` wait for the next call. */
    while ((k = qcow2_queue_poll(q, got + n, expected - n < 2 ? expected - n
                                                               : 2)) > 0) {
      n += k;
    }
  }
  close(ep);
  return n;
}

static void test_chain(void) {
  char* err = NULL;
  /* Base: 4 MiB, data in its first half. */
  CHECK_OK(qcow2_image_create(base_path, NULL, SIZE,
                              "cluster_size=64k,compat=1.1,refcount_bits=16,"
                              "compression_type=zlib,lazy_refcounts=off,"
                              "preallocation=off",
                              &err),
           err);
  qcow2_image_t* base = qcow2_image_open(base_path, 1, &err);
  CHECK_OK(base == NULL, err);
  if (base == NULL) return;
  CHECK(qcow2_image_size(base) == SIZE);
  uint8_t* half = malloc(SIZE / 2);
  for (uint64_t i = 0; i < SIZE / 2; ++i) half[i] = pattern(i, 3);
  CHECK_OK(qcow2_image_write(base, 0, half, SIZE / 2, &err), err);
  memcpy(model, half, SIZE / 2);
  free(half);
  CHECK_OK(qcow2_image_flush(base, &err), err);
  CHECK_OK(qcow2_image_close(base, &err), err);

  /* Overlay: the size comes from the backing file. */
  CHECK_OK(qcow2_image_create(top_path, "base.qcow2", 0,
                              "backing_fmt=qcow2,cluster_size=65536,"
                              "extended_l2=off",
                              &err),
           err);
  qcow2_image_t* top =
      qcow2_image_open_opts(top_path, "read-only=off,cache-size=1M,direct=off",
                            &err);
  CHECK_OK(top == NULL, err);
  if (top == NULL) return;
  CHECK(qcow2_image_writable(top));
  CHECK(qcow2_image_chain_length(top) == 2);
  CHECK(qcow2_image_size(top) == SIZE);

  /* Block status: the base's data shows at depth 1. */
  qcow2_block_status_t bs;
  memset(&bs, 0, sizeof bs);
  bs.size = sizeof bs;
  CHECK_OK(qcow2_image_block_status(top, 0, SIZE, &bs, &err), err);
  CHECK(bs.offset == 0 && bs.length == SIZE / 2 && bs.depth == 1 &&
        bs.allocated && bs.data && !bs.zero);

  /* Synchronous write, write-zeroes and discard on the top. */
  uint8_t small[3000];
  for (size_t i = 0; i < sizeof small; ++i) small[i] = (uint8_t)(i * 7 + 1);
  CHECK_OK(qcow2_image_write(top, 100000, small, sizeof small, &err), err);
  memcpy(model + 100000, small, sizeof small);
  CHECK_OK(qcow2_image_write_zeroes(top, 3 * CLUSTER, CLUSTER, 1, &err), err);
  memset(model + 3 * CLUSTER, 0, CLUSTER);
  CHECK_OK(qcow2_image_discard(top, 5 * CLUSTER, 2 * CLUSTER, &err), err);
  memset(model + 5 * CLUSTER, 0, 2 * CLUSTER);
  memset(&bs, 0, sizeof bs);
  bs.size = sizeof bs;
  CHECK_OK(qcow2_image_block_status(top, 3 * CLUSTER, CLUSTER, &bs, &err),
           err);
  CHECK(bs.zero && bs.depth == 0);

  /* A queue: vectored writes, one across the backing boundary. */
  qcow2_queue_t* q = qcow2_queue_create(top, 8, &err);
  CHECK_OK(q == NULL, err);
  if (q == NULL) return;
  enum { kSegs = 5 };
  static uint8_t w[kSegs][10000];
  struct iovec wiov[kSegs];
  for (int s = 0; s < kSegs; ++s) {
    for (size_t i = 0; i < sizeof w[s]; ++i) w[s][i] = pattern(i, 40 + s);
    wiov[s].iov_base = w[s];
    wiov[s].iov_len = 1000 + 2000 * (size_t)s; /* 1000 .. 9000 bytes */
  }
  const uint64_t woff = SIZE / 2 - 7000;
  CHECK_OK(qcow2_queue_writev(q, woff, wiov, kSegs, (void*)1, &err), err);
  uint64_t pos = woff;
  int64_t wtotal = 0;
  for (int s = 0; s < kSegs; ++s) {
    memcpy(model + pos, w[s], wiov[s].iov_len);
    pos += wiov[s].iov_len;
    wtotal += (int64_t)wiov[s].iov_len;
  }
  CHECK_OK(qcow2_queue_write_zeroes(q, 20 * CLUSTER, 4096, 0, (void*)2, &err),
           err);
  memset(model + 20 * CLUSTER, 0, 4096);
  CHECK_OK(qcow2_queue_discard(q, 9 * CLUSTER, CLUSTER, (void*)3, &err), err);
  memset(model + 9 * CLUSTER, 0, CLUSTER);
  qcow2_completion_t got[8];
  CHECK(serve(q, 3, got) == 3);
  int seen = 0;
  for (int i = 0; i < 3; ++i) {
    intptr_t id = (intptr_t)got[i].user_data;
    CHECK(id >= 1 && id <= 3);
    seen |= 1 << id;
    CHECK(got[i].result == (id == 1 ? wtotal : 0));
  }
  CHECK(seen == 0xe);
  CHECK(qcow2_queue_in_flight(q) == 0);

  /* Flush through the queue. */
  CHECK_OK(qcow2_queue_flush(q, (void*)4, &err), err);
  CHECK(serve(q, 1, got) == 1);
  CHECK(got[0].user_data == (void*)4 && got[0].result == 0);

  /* Vectored reads across the backing boundary, uneven segments, and a
   * read of unallocated zeros (finishes inside the submit). */
  enum { kReads = 3 };
  static uint8_t r[kReads][4][40000];
  struct iovec riov[kReads][4];
  const uint64_t roff[kReads] = {SIZE / 2 - 60000, 0, SIZE - 100000};
  for (int k = 0; k < kReads; ++k) {
    for (int s = 0; s < 4; ++s) {
      memset(r[k][s], 0xee, sizeof r[k][s]);
      riov[k][s].iov_base = r[k][s];
      riov[k][s].iov_len = (size_t)(1 + s * 13000); /* 1 .. 39001 */
    }
    CHECK_OK(qcow2_queue_readv(q, roff[k], riov[k], 4, &riov[k], &err), err);
  }
  CHECK(serve(q, kReads, got) == kReads);
  for (int i = 0; i < kReads; ++i) {
    CHECK(got[i].result == 1 + 13001 + 26001 + 39001);
    const struct iovec* iov = got[i].user_data;
    int k = (int)(iov - &riov[0][0]) / 4;
    uint64_t at = roff[k];
    for (int s = 0; s < 4; ++s) {
      if (memcmp(iov[s].iov_base, model + at, iov[s].iov_len) != 0) {
        fprintf(stderr, "readv %d segment %d at %llu differs\n", k, s,
                (unsigned long long)at);
        ++failures;
      }
      at += iov[s].iov_len;
    }
  }

  /* A full queue says EAGAIN. */
  qcow2_queue_t* q1 = qcow2_queue_create(top, 1, &err);
  CHECK_OK(q1 == NULL, err);
  if (q1 != NULL) {
    struct iovec one = {r[0][0], 4096};
    CHECK_OK(qcow2_queue_readv(q1, 0, &one, 1, NULL, &err), err);
    EXPECT_ERROR(qcow2_queue_readv(q1, 0, &one, 1, NULL, &err), -EAGAIN, err,
                 "full");
    CHECK(qcow2_queue_wait(q1, got, 1, 1) == 1);
    CHECK(got[0].result == 4096);
    qcow2_queue_destroy(q1);
  }
  qcow2_queue_destroy(q);

  qcow2_stats_t st;
  memset(&st, 0, sizeof st);
  st.size = sizeof st;
  CHECK_OK(qcow2_image_get_stats(top, &st, &err), err);
  CHECK(st.guest_write_ops >= 2 && st.guest_read_ops >= 4 &&
        st.guest_flush_ops >= 1 && st.guest_zero_ops >= 2 &&
        st.guest_discard_ops >= 2);
  CHECK(st.guest_write_bytes == sizeof small + (uint64_t)wtotal);
  /* An older, smaller struct gets only what fits. */
  struct {
    size_t size;
    uint64_t guest_read_ops;
  } old;
  old.size = sizeof old;
  CHECK_OK(qcow2_image_get_stats(top, (qcow2_stats_t*)(void*)&old, &err), err);
  CHECK(old.guest_read_ops == st.guest_read_ops);
  st.size = 0;
  EXPECT_ERROR(qcow2_image_get_stats(top, &st, &err), -EINVAL, err, "size");

  CHECK_OK(qcow2_image_close(top, &err), err);

  /* A raw image, and qcow2_image_destroy. */
  CHECK_OK(qcow2_image_create(raw_path, NULL, MIB, "format=raw", &err), err);
  qcow2_image_t* raw = qcow2_image_open_opts(
      raw_path, "format=raw,backing=off,read-only=off", &err);
  CHECK_OK(raw == NULL, err);
  CHECK(qcow2_image_size(raw) == MIB);
  if (raw != NULL) {
    /* Vectored I/O on a raw file: one write op, pointed into both
     * segments. */
    qcow2_queue_t* rq = qcow2_queue_create(raw, 2, &err);
    CHECK_OK(rq == NULL, err);
    if (rq != NULL) {
      uint8_t a[1000], b[3000], c2[4000];
      memset(a, 0xa1, sizeof a);
      memset(b, 0xb2, sizeof b);
      struct iovec two[2] = {{a, sizeof a}, {b, sizeof b}};
      CHECK_OK(qcow2_queue_writev(rq, 4096 + 7, two, 2, NULL, &err), err);
      CHECK(qcow2_queue_wait(rq, got, 1, 1) == 1 && got[0].result == 4000);
      struct iovec one = {c2, sizeof c2};
      CHECK_OK(qcow2_queue_readv(rq, 4096 + 7, &one, 1, NULL, &err), err);
      CHECK(qcow2_queue_wait(rq, got, 1, 1) == 1 && got[0].result == 4000);
      CHECK(memcmp(c2, a, sizeof a) == 0 &&
            memcmp(c2 + sizeof a, b, sizeof b) == 0);
      qcow2_queue_destroy(rq);
    }
  }
  qcow2_image_destroy(raw);
}

static void count_progress(void* data, uint64_t done, uint64_t total) {
  uint64_t* calls = data;
  CHECK(done <= total && total == SIZE);
  ++*calls;
}

/* Live commit and stream on a chain of four files of their own (l0 at the
 * bottom, l3 the top), each written while it was the top: cancelled, then
 * committed down to l0, then streamed whole into the top. */
static void test_live(void) {
  char* err = NULL;
  char path[4][4200];
  uint8_t* want = calloc(SIZE, 1);
  uint8_t* got = malloc(SIZE);
  static uint8_t buf[300000];
  qcow2_image_t* img = NULL;
  for (int i = 0; i < 4; ++i) {
    snprintf(path[i], sizeof path[i], "%s/l%d.qcow2", dir_path, i);
    char backing[16];
    snprintf(backing, sizeof backing, "l%d.qcow2", i - 1);
    CHECK_OK(qcow2_image_create(path[i], i == 0 ? NULL : backing, SIZE,
                                i == 0 ? "" : "backing_fmt=qcow2", &err),
             err);
    img = qcow2_image_open(path[i], 1, &err);
    CHECK_OK(img == NULL, err);
    if (img == NULL) break;
    const uint64_t at = (uint64_t)i * 700000 + 12345;
    for (size_t j = 0; j < sizeof buf; ++j) buf[j] = pattern(j, 60 + i);
    CHECK_OK(qcow2_image_write(img, at, buf, sizeof buf, &err), err);
    memcpy(want + at, buf, sizeof buf);
    if (i < 3) CHECK_OK(qcow2_image_close(img, &err), err);
  }
  if (img != NULL) {
    CHECK(qcow2_image_chain_length(img) == 4);
    qcow2_live_control_t* control = qcow2_live_control_create();
    CHECK(control != NULL);
    qcow2_live_options_t opts;
    memset(&opts, 0, sizeof opts);
    opts.size = sizeof opts;
    opts.chunk = 256 * 1024;
    opts.control = control;
    qcow2_live_control_cancel(control);
    EXPECT_ERROR(qcow2_image_live_stream(img, 4, &opts, &err), -ECANCELED,
                 err, "cancelled");
    CHECK(qcow2_image_chain_length(img) == 4);
    EXPECT_ERROR(qcow2_image_live_commit_active(img, 4, NULL, &err), -EINVAL,
                 err, "base");
    uint64_t calls = 0;
    opts.control = NULL;
    opts.progress = count_progress;
    opts.progress_data = &calls;
    /* l3 <- l2 <- l1 <- l0: l2 streamed into the top, l1 committed into
     * l0, then the top committed into l0, which becomes the top. */
    CHECK_OK(qcow2_image_live_stream(img, 2, NULL, &err), err);
    CHECK(qcow2_image_chain_length(img) == 3);
    CHECK_OK(qcow2_image_live_commit(img, 2, &opts, &err), err);
    CHECK(calls > 0);
    CHECK(qcow2_image_chain_length(img) == 2);
    /* A guest write after the last job, before the active commit. */
    for (size_t j = 0; j < sizeof buf; ++j) buf[j] = pattern(j, 70);
    CHECK_OK(qcow2_image_write(img, 1500000, buf, sizeof buf, &err), err);
    memcpy(want + 1500000, buf, sizeof buf);
    calls = 0;
    CHECK_OK(qcow2_image_live_commit_active(img, 1, &opts, &err), err);
    CHECK(calls > 0);
    CHECK(qcow2_image_chain_length(img) == 1);
    /* The guest writes into l0 now. */
    for (size_t j = 0; j < sizeof buf; ++j) buf[j] = pattern(j, 71);
    CHECK_OK(qcow2_image_write(img, 4096, buf, sizeof buf, &err), err);
    memcpy(want + 4096, buf, sizeof buf);
    CHECK_OK(qcow2_image_read(img, 0, got, SIZE, &err), err);
    CHECK(memcmp(got, want, SIZE) == 0);
    CHECK_OK(qcow2_image_close(img, &err), err);
    qcow2_live_control_destroy(control);
  }
  char cmd[20000];
  snprintf(cmd, sizeof cmd, "qemu-img check -q '%s' && qemu-img check -q '%s'",
           path[3], path[0]);
  CHECK(system(cmd) == 0);
  /* The committed base against the disk as the guest wrote it. */
  char raw[4200];
  snprintf(raw, sizeof raw, "%s/want.raw", dir_path);
  FILE* f = fopen(raw, "wb");
  CHECK(f != NULL);
  if (f != NULL) {
    CHECK(fwrite(want, 1, SIZE, f) == SIZE);
    fclose(f);
  }
  snprintf(cmd, sizeof cmd, "qemu-img compare -q -f qcow2 -F raw '%s' '%s'",
           path[0], raw);
  CHECK(system(cmd) == 0);
  free(want);
  free(got);
}

static int qemu_agrees(void) {
  char cmd[16384];
  snprintf(cmd, sizeof cmd, "qemu-img check -q '%s' && qemu-img check -q '%s'",
           base_path, top_path);
  if (system(cmd) != 0) {
    fprintf(stderr, "qemu-img check failed: %s\n", cmd);
    return 0;
  }
  char out[4200];
  snprintf(out, sizeof out, "%s/qemu.raw", dir_path);
  snprintf(cmd, sizeof cmd, "qemu-img convert -O raw '%s' '%s'", top_path,
           out);
  if (system(cmd) != 0) {
    fprintf(stderr, "failed: %s\n", cmd);
    return 0;
  }
  FILE* f = fopen(out, "rb");
  if (f == NULL) return 0;
  uint8_t* back = malloc(SIZE);
  size_t n = fread(back, 1, SIZE, f);
  fclose(f);
  int same = n == SIZE && memcmp(back, model, SIZE) == 0;
  if (!same) {
    for (size_t i = 0; i < n; ++i) {
      if (back[i] != model[i]) {
        fprintf(stderr, "qemu-img reads 0x%02x at %zu, expected 0x%02x\n",
                back[i], i, model[i]);
        break;
      }
    }
  }
  free(back);
  return same;
}

/* A LUKS-encrypted image: created with the secret in a file, refused
 * without it (-EACCES), written and read with it; qemu-img check with the
 * same secret finds it clean. */
static void test_luks(void) {
  char* err = NULL;
  char path[4200], secret[4200], opts[9000], cmd[20000];
  snprintf(path, sizeof path, "%s/luks.qcow2", dir_path);
  snprintf(secret, sizeof secret, "%s/secret", dir_path);
  FILE* f = fopen(secret, "wb");
  CHECK(f != NULL);
  if (f == NULL) return;
  fputs("c-api-pass", f);
  fclose(f);
  snprintf(opts, sizeof opts,
           "encrypt.format=luks,encrypt.key-secret-file=%s,"
           "encrypt.cipher-alg=aes-128,encrypt.iterations=1000", secret);
  CHECK_OK(qcow2_image_create(path, NULL, MIB, opts, &err), err);
  qcow2_image_t* img = NULL;
  EXPECT_ERROR(qcow2_image_open_ex(path, "read-only=off", &img, &err), -EACCES,
               err, "key secret");
  snprintf(opts, sizeof opts, "read-only=off,key-secret-file=%s", secret);
  CHECK_OK(qcow2_image_open_ex(path, opts, &img, &err), err);
  if (img == NULL) return;
  uint8_t buf[8192], back[8192];
  for (unsigned i = 0; i < sizeof buf; ++i) buf[i] = pattern(i, 5);
  CHECK_OK(qcow2_image_write(img, 65536 + 4096, buf, sizeof buf, &err), err);
  CHECK_OK(qcow2_image_read(img, 65536 + 4096, back, sizeof back, &err), err);
  CHECK(memcmp(buf, back, sizeof buf) == 0);
  CHECK_OK(qcow2_image_close(img, &err), err);
  snprintf(cmd, sizeof cmd,
           "qemu-img check -q --object secret,id=s,file=%s --image-opts "
           "driver=qcow2,file.filename=%s,encrypt.key-secret=s",
           secret, path);
  CHECK(system(cmd) == 0);
  /* metadata-only: opens without the secret, its data refused (zeroed). */
  CHECK_OK(qcow2_image_open_ex(path, "metadata-only=on", &img, &err), err);
  if (img == NULL) return;
  CHECK(qcow2_image_size(img) == MIB);
  memset(back, 0xee, sizeof back);
  EXPECT_ERROR(qcow2_image_read(img, 65536 + 4096, back, sizeof back, &err),
               -EPERM, err, "metadata only");
  CHECK(back[0] == 0 && back[sizeof back - 1] == 0);
  qcow2_image_destroy(img);
  EXPECT_ERROR(
      qcow2_image_open_ex(path, "read-only=off,metadata-only=on", &img, &err),
      -EINVAL, err, "metadata_only");
}

/* Writes `text` to `path`; non-zero on success. */
static int write_file(const char* path, const char* text) {
  FILE* f = fopen(path, "wb");
  CHECK(f != NULL);
  if (f == NULL) return 0;
  fputs(text, f);
  fclose(f);
  return 1;
}

/* Runs the shell command `cmd`, a QEMU command that makes a LUKS key slot,
 * again (9 tries at most) while it fails only because Debian 12's QEMU could
 * not time PBKDF2 ("Unable to get accurate CPU usage": its thread's CPU
 * clock read 0 ms, as it moves only at a scheduler tick). */
static int system_key_timing(const char* cmd) {
  char errpath[4200], full[80000], text[4096];
  snprintf(errpath, sizeof errpath, "%s/key-timing.err", dir_path);
  snprintf(full, sizeof full, "{ %s ; } 2>'%s'", cmd, errpath);
  int rc = -1;
  for (int i = 0; i < 9; ++i) {
    rc = system(full);
    size_t n = 0;
    FILE* f = fopen(errpath, "rb");
    if (f != NULL) {
      n = fread(text, 1, sizeof text - 1, f);
      fclose(f);
    }
    text[n] = '\0';
    if (rc == 0 || strstr(text, "Unable to get accurate CPU usage") == NULL) {
      fputs(text, stderr);
      break;
    }
  }
  return rc;
}

/* A chain whose base and top are encrypted with different secrets: the
 * base made by qemu-img (--object secret), the top by
 * qcow2_image_create (a low PBKDF2 count: qemu-img's create measures
 * its count for seconds), both filled by qemu-io. The top's secret alone
 * is refused (-EACCES); backing.key-secret-file= gives the base's, and
 * then every byte of the disk reads as `qemu-img convert` reads it with
 * QEMU's backing.encrypt.key-secret. */
#define CHAIN_SIZE (2 * MIB)
static void test_luks_chain(void) {
  char* err = NULL;
  char base[4200], top[4200], s0[4200], s1[4200], raw[4200];
  char opts[17000], cmd[70000];
  snprintf(base, sizeof base, "%s/lbase.qcow2", dir_path);
  snprintf(top, sizeof top, "%s/ltop.qcow2", dir_path);
  snprintf(s0, sizeof s0, "%s/s0", dir_path);
  snprintf(s1, sizeof s1, "%s/s1", dir_path);
  snprintf(raw, sizeof raw, "%s/lchain.raw", dir_path);
  if (!write_file(s0, "base-pass") || !write_file(s1, "top-pass")) return;
  snprintf(cmd, sizeof cmd,
           "qemu-img create -q -f qcow2 --object secret,id=s0,file=%s "
           "-o encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=10 "
           "'%s' 2M",
           s0, base);
  CHECK(system_key_timing(cmd) == 0);
  snprintf(cmd, sizeof cmd,
           "qemu-io --object secret,id=s0,file=%s --image-opts "
           "driver=qcow2,file.filename=%s,encrypt.key-secret=s0 "
           "-c 'write -P 0x5a 0 192k' -c 'write -P 0x33 1M 64k' >/dev/null",
           s0, base);
  CHECK(system(cmd) == 0);
  snprintf(opts, sizeof opts,
           "encrypt.format=luks,encrypt.key-secret-file=%s,"
           "encrypt.iterations=1000,backing_fmt=qcow2", s1);
  CHECK_OK(qcow2_image_create(top, base, 0, opts, &err), err);
  snprintf(cmd, sizeof cmd,
           "qemu-io --object secret,id=s0,file=%s --object secret,id=s1,file=%s "
           "--image-opts driver=qcow2,file.filename=%s,encrypt.key-secret=s1,"
           "backing.encrypt.key-secret=s0 -c 'write -P 0x61 64k 64k' "
           "-c 'write -z 1M 4k' >/dev/null && "
           "qemu-img convert -O raw --object secret,id=s0,file=%s "
           "--object secret,id=s1,file=%s --image-opts "
           "driver=qcow2,file.filename=%s,encrypt.key-secret=s1,"
           "backing.encrypt.key-secret=s0 '%s'",
           s0, s1, top, s0, s1, top, raw);
  CHECK(system(cmd) == 0);
  qcow2_image_t* img = NULL;
  snprintf(opts, sizeof opts, "key-secret-file=%s", s1);
  EXPECT_ERROR(qcow2_image_open_ex(top, opts, &img, &err), -EACCES, err,
               "lbase.qcow2");
  snprintf(opts, sizeof opts, "key-secret-file=%s,backing.backing.key-secret-file=%s",
           s1, s0);
  EXPECT_ERROR(qcow2_image_open_ex(top, opts, &img, &err), -EACCES, err,
               "lbase.qcow2");
  snprintf(opts, sizeof opts, "key-secret-file=%s,backing.key-secret-file=%s",
           s1, s0);
  CHECK_OK(qcow2_image_open_ex(top, opts, &img, &err), err);
  if (img == NULL) return;
  CHECK(qcow2_image_chain_length(img) == 2);
  uint8_t* ours = malloc(CHAIN_SIZE);
  uint8_t* theirs = malloc(CHAIN_SIZE);
  FILE* f = fopen(raw, "rb");
  CHECK(ours != NULL && theirs != NULL && f != NULL);
  if (ours != NULL && theirs != NULL && f != NULL) {
    CHECK(fread(theirs, 1, CHAIN_SIZE, f) == CHAIN_SIZE);
    CHECK_OK(qcow2_image_read(img, 0, ours, CHAIN_SIZE, &err), err);
    CHECK(memcmp(ours, theirs, CHAIN_SIZE) == 0);
    /* Not vacuous: the base's, the top's and the zeroed data differ. */
    CHECK(ours[0] == 0x5a && ours[65536] == 0x61 && ours[131072] == 0x5a);
    CHECK(ours[MIB] == 0 && ours[MIB + 4096] == 0x33);
  }
  if (f != NULL) fclose(f);
  free(ours);
  free(theirs);
  qcow2_image_destroy(img);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s SCRATCH_DIR\n", argv[0]);
    return 2;
  }
  if (system("qemu-img --version >/dev/null 2>&1") != 0) {
    fprintf(stderr, "qemu-img missing: skipped\n");
    return 77;
  }
  snprintf(dir_path, sizeof dir_path, "%s", argv[1]);
  snprintf(base_path, sizeof base_path, "%s/base.qcow2", argv[1]);
  snprintf(top_path, sizeof top_path, "%s/top.qcow2", argv[1]);
  snprintf(raw_path, sizeof raw_path, "%s/disk.raw", argv[1]);
  unlink(base_path);
  unlink(top_path);
  unlink(raw_path);
  CHECK(strcmp(qcow2_version_string(), QCOW2_VERSION_STRING) == 0);
  qcow2_free(NULL);
  model = calloc(SIZE, 1);
  test_chain();
  test_errors();
  test_open_errnos();
  test_luks();
  test_luks_chain();
  CHECK(qemu_agrees());
  test_live();
  free(model);
  if (failures != 0) {
    fprintf(stderr, "c_api_test: %d failure(s)\n", failures);
    return 1;
  }
  printf("c_api_test: every C call passed; qemu-img agrees\n");
  return 0;
}
