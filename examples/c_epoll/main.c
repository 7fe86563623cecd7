/* SPDX-License-Identifier: Apache-2.0 */
/* What a C virtual machine monitor would write to serve a virtio-blk disk
 * from a qcow2 chain with libqcow2's C API (qcow2/c.h):
 *
 *   1. create a chain: base.qcow2 with some data, overlay.qcow2 on top;
 *   2. open the overlay and make a queue; put the queue's eventfd in epoll;
 *   3. serve random scatter-gather requests (readv, writev, flush) the way
 *      a virtqueue hands them over, only ever blocking in epoll_wait;
 *   4. check every read against what the disk must hold, and at the end
 *      read the whole disk back.
 *
 *   c_epoll DIR        (DIR: a directory for the two images)
 * Prints one line and exits 0 when every byte is right. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/uio.h>
#include <unistd.h>

#include "qcow2/c.h"

#define DISK_SIZE (UINT64_C(64) << 20)
#define SECTOR 512u
#define MAX_SEGS 4
#define DEPTH 32
#define REQUESTS 2000

/* One virtio-blk request: its kind, where, its segments, and for reads
 * the bytes the disk held when it was submitted. */
struct request {
  int kind; /* 0 read, 1 write, 2 flush */
  uint64_t offset;
  int nseg;
  struct iovec seg[MAX_SEGS];
  uint8_t* expect;
  size_t len;
  int busy;
};

static uint8_t* model; /* what the disk reads as */
static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static uint64_t rnd(void) { /* xorshift64* */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 2685821657736338717u;
}

static int die(const char* what, char* err) {
  fprintf(stderr, "c_epoll: %s: %s\n", what, err != NULL ? err : "failed");
  qcow2_free(err);
  exit(1);
}

/* Fills `r` with a random request and submits it. */
static void submit(qcow2_queue_t* q, struct request* r) {
  char* err = NULL;
  int rc;
  r->busy = 1;
  if (rnd() % 16 == 0) {
    r->kind = 2;
    rc = qcow2_queue_flush(q, r, &err);
  } else {
    r->kind = (int)(rnd() % 2);
    r->nseg = 1 + (int)(rnd() % MAX_SEGS);
    r->len = 0;
    for (int s = 0; s < r->nseg; ++s) {
      r->seg[s].iov_len = SECTOR * (1 + rnd() % 16);
      r->len += r->seg[s].iov_len;
    }
    r->offset = (rnd() % ((DISK_SIZE - r->len) / SECTOR)) * SECTOR;
    uint64_t at = r->offset;
    for (int s = 0; s < r->nseg; ++s) {
      uint8_t* p = r->seg[s].iov_base;
      if (r->kind == 1) {
        for (size_t i = 0; i < r->seg[s].iov_len; ++i) p[i] = (uint8_t)rnd();
        /* Requests on overlapping ranges run in the order submitted. */
        memcpy(model + at, p, r->seg[s].iov_len);
      } else {
        memset(p, 0xee, r->seg[s].iov_len);
        memcpy(r->expect + (at - r->offset), model + at, r->seg[s].iov_len);
      }
      at += r->seg[s].iov_len;
    }
    rc = r->kind == 1
             ? qcow2_queue_writev(q, r->offset, r->seg, r->nseg, r, &err)
             : qcow2_queue_readv(q, r->offset, r->seg, r->nseg, r, &err);
  }
  if (rc != 0) die("submit", err);
}

/* Checks a finished request. Returns 0 when right. */
static int complete(const qcow2_completion_t* c) {
  struct request* r = c->user_data;
  r->busy = 0;
  if (c->result < 0) {
    fprintf(stderr, "c_epoll: request at %llu failed: %s\n",
            (unsigned long long)r->offset, strerror((int)-c->result));
    return 1;
  }
  if (r->kind == 0) {
    size_t at = 0;
    for (int s = 0; s < r->nseg; ++s) {
      if (memcmp(r->seg[s].iov_base, r->expect + at, r->seg[s].iov_len)) {
        fprintf(stderr, "c_epoll: readv at %llu: segment %d differs\n",
                (unsigned long long)r->offset, s);
        return 1;
      }
      at += r->seg[s].iov_len;
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  char base[4096], top[4096];
  snprintf(base, sizeof base, "%s/base.qcow2", argv[1]);
  snprintf(top, sizeof top, "%s/overlay.qcow2", argv[1]);
  unlink(base);
  unlink(top);
  char* err = NULL;
  model = calloc(DISK_SIZE, 1);

  /* 1. The chain: the base holds a pattern in its first 16 MiB. */
  if (qcow2_image_create(base, NULL, DISK_SIZE, "cluster_size=64k", &err))
    die("create base", err);
  qcow2_image_t* img = qcow2_image_open(base, 1, &err);
  if (img == NULL) die("open base", err);
  for (uint64_t i = 0; i < (16u << 20); ++i) model[i] = (uint8_t)(i / 4099);
  if (qcow2_image_write(img, 0, model, 16u << 20, &err))
    die("write base", err);
  if (qcow2_image_close(img, &err)) die("close base", err);
  if (qcow2_image_create(top, "base.qcow2", 0, "backing_fmt=qcow2", &err))
    die("create overlay", err);

  /* 2. The overlay, a queue, epoll on its eventfd. */
  img = qcow2_image_open_opts(top, "read-only=off", &err);
  if (img == NULL) die("open overlay", err);
  qcow2_queue_t* q = qcow2_queue_create(img, DEPTH, &err);
  if (q == NULL) die("queue", err);
  const int efd = qcow2_queue_eventfd(q);
  if (efd < 0) die("eventfd", NULL);
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event ev;
  memset(&ev, 0, sizeof ev);
  ev.events = EPOLLIN;
  if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, efd, &ev) != 0) {
    perror("epoll");
    return 1;
  }

  /* 3. The request loop. */
  static struct request reqs[DEPTH];
  for (int i = 0; i < DEPTH; ++i) {
    for (int s = 0; s < MAX_SEGS; ++s) {
      reqs[i].seg[s].iov_base = malloc(16 * SECTOR);
    }
    reqs[i].expect = malloc(MAX_SEGS * 16 * SECTOR);
  }
  int submitted = 0, done = 0, bad = 0, wakeups = 0;
  while (done < REQUESTS) {
    for (int i = 0; i < DEPTH && submitted < REQUESTS; ++i) {
      if (!reqs[i].busy) {
        submit(q, &reqs[i]);
        ++submitted;
      }
    }
    struct epoll_event out;
    int n = epoll_wait(ep, &out, 1, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n != 1) {
      perror("epoll_wait");
      return 1;
    }
    ++wakeups;
    uint64_t count;
    if (read(efd, &count, sizeof count) < 0 && errno != EAGAIN) {
      perror("read eventfd");
      return 1;
    }
    qcow2_completion_t c[8];
    int k;
    while ((k = qcow2_queue_poll(q, c, 8)) > 0) {
      for (int i = 0; i < k; ++i) bad += complete(&c[i]);
      done += k;
    }
  }
  close(ep);

  /* 4. Everything flushed, then the whole disk read back. */
  if (qcow2_queue_flush(q, NULL, &err)) die("flush", err);
  qcow2_completion_t c;
  if (qcow2_queue_wait(q, &c, 1, 1) != 1 || c.result != 0) die("flush", NULL);
  qcow2_queue_destroy(q);
  uint8_t* all = malloc(DISK_SIZE);
  if (qcow2_image_read(img, 0, all, DISK_SIZE, &err)) die("read back", err);
  if (memcmp(all, model, DISK_SIZE) != 0) {
    fprintf(stderr, "c_epoll: the disk does not hold what was written\n");
    bad++;
  }
  qcow2_stats_t st;
  memset(&st, 0, sizeof st);
  st.size = sizeof st;
  if (qcow2_image_get_stats(img, &st, &err)) die("stats", err);
  if (qcow2_image_close(img, &err)) die("close", err);
  if (bad != 0) return 1;
  printf("c_epoll: libqcow2 %s: %d requests (%llu reads, %llu writes, "
         "%llu flushes) from %d epoll wake-ups; data verified\n",
         qcow2_version_string(), done,
         (unsigned long long)st.guest_read_ops - 1,
         (unsigned long long)st.guest_write_ops,
         (unsigned long long)st.guest_flush_ops, wakeups);
  return 0;
}
