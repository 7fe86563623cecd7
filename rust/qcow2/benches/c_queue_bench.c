/* SPDX-License-Identifier: Apache-2.0 */
/* The C side of the Rust binding's micro-benchmark (queue_bench.rs is the
 * Rust side; run.sh runs both on one image): random 4 KiB reads or writes
 * at depth 32 through qcow2/c.h, completions taken through epoll on the
 * queue's eventfd, the same loop as queue_bench.rs. Prints the process
 * CPU time per request, and the user-space part of it.
 *
 *   c_queue_bench IMAGE read|write REQUESTS */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "qcow2/c.h"

#define DEPTH 32
#define BLOCK 4096

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static uint64_t rnd(void) { /* xorshift64*, as queue_bench.rs */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 2685821657736338717u;
}

static double cpu_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* User-space CPU time of the process: where the binding's own work goes. */
static double user_ns(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (double)u.ru_utime.tv_sec * 1e9 + (double)u.ru_utime.tv_usec * 1e3;
}

static void die(const char* what, char* err) {
  fprintf(stderr, "c_queue_bench: %s: %s\n", what, err != NULL ? err : "failed");
  exit(1);
}

static void submit(qcow2_queue_t* q, int write, uint64_t blocks,
                   uint8_t* buf, uintptr_t slot) {
  struct iovec iov = {.iov_base = buf, .iov_len = BLOCK};
  uint64_t offset = (rnd() % blocks) * BLOCK;
  char* err = NULL;
  int rc = write ? qcow2_queue_writev(q, offset, &iov, 1, (void*)slot, &err)
                 : qcow2_queue_readv(q, offset, &iov, 1, (void*)slot, &err);
  if (rc != 0) die("submit", err);
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: c_queue_bench IMAGE read|write REQUESTS\n");
    return 2;
  }
  const int write = strcmp(argv[2], "write") == 0;
  const long requests = atol(argv[3]);
  char* err = NULL;
  qcow2_image_t* img = qcow2_image_open_opts(argv[1], "read-only=off", &err);
  if (img == NULL) die("open", err);
  qcow2_queue_t* q = qcow2_queue_create(img, DEPTH, &err);
  if (q == NULL) die("queue", err);
  const int efd = qcow2_queue_eventfd(q);
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0};
  if (efd < 0 || ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, efd, &ev) != 0) die("epoll", NULL);
  const uint64_t blocks = qcow2_image_size(img) / BLOCK;
  uint8_t* bufs = aligned_alloc(4096, (size_t)DEPTH * BLOCK);
  memset(bufs, 0x5a, (size_t)DEPTH * BLOCK);

  const double start = cpu_ns();
  const double user_start = user_ns();
  long submitted = 0, completed = 0;
  for (uintptr_t s = 0; s < DEPTH && submitted < requests; ++s, ++submitted) {
    submit(q, write, blocks, bufs + s * BLOCK, s);
  }
  qcow2_completion_t done[32];
  while (completed < requests) {
    struct epoll_event events[8];
    if (epoll_wait(ep, events, 8, -1) < 0) continue;
    uint64_t count;
    if (read(efd, &count, sizeof count) < 0) { /* nothing to reset */ }
    int k;
    while ((k = qcow2_queue_poll(q, done, 32)) > 0) {
      for (int i = 0; i < k; ++i) {
        if (done[i].result != BLOCK) die("request", NULL);
        ++completed;
        if (submitted < requests) {
          const uintptr_t s = (uintptr_t)done[i].user_data;
          submit(q, write, blocks, bufs + s * BLOCK, s);
          ++submitted;
        }
      }
    }
  }
  const double ns = cpu_ns() - start;
  const double user = user_ns() - user_start;
  printf("c %s %ld requests: %.0f ns CPU per request (user %.0f)\n", argv[2], requests,
         ns / (double)requests, user / (double)requests);
  qcow2_queue_destroy(q);
  if (qcow2_image_close(img, &err) != 0) die("close", err);
  free(bufs);
  close(ep);
  return 0;
}
