/* SPDX-License-Identifier: Apache-2.0 */
/* The C API's maintenance calls (include/qcow2/c.h), from C11 through c.h
 * alone, with qemu-img as the judge:
 *  - check of an image with leaked clusters gives the counts of
 *    `qemu-img check --output=json`; a leak repair, then a clean check
 *    (ours and qemu-img's);
 *  - bitmaps added, written, merged are listed as `qemu-img info` lists
 *    them, and their dirty ranges are the writes';
 *  - measure gives what `qemu-img measure` prints, with and without a
 *    source image;
 *  - an offline commit leaves the top and the base reading as the top did
 *    before (`qemu-img compare`), both clean for `qemu-img check`;
 *  - internal snapshots: create, list, apply, delete.
 *
 *   c_api_maintenance_test DIR      (DIR: an empty scratch directory)
 * Exit 0: pass, 1: fail, 77: qemu-img missing (skipped). */
#define _POSIX_C_SOURCE 200809L /* the test's own POSIX calls; c.h needs none */

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "qcow2/c.h"
#include "c_api_check.h"

#define MIB (UINT64_C(1) << 20)
#define CLUSTER 65536u

static char dir_path[1024];

#define CHECK_EQ_U64(a, b)                                                \
  do {                                                                    \
    uint64_t a_ = (a), b_ = (b);                                          \
    if (a_ != b_) {                                                       \
      fprintf(stderr, "%s:%d: %s = %llu, %s = %llu\n", __FILE__,          \
              __LINE__, #a, (unsigned long long)a_, #b,                   \
              (unsigned long long)b_);                                    \
      ++failures;                                                         \
    }                                                                     \
  } while (0)

static void path_in_dir(char* out, size_t n, const char* name) {
  snprintf(out, n, "%s/%s", dir_path, name);
}

/* Runs a shell command; returns its exit status (-1 if it did not run). */
static int run(const char* cmd) {
  int rc = system(cmd);
  if (rc == -1 || !WIFEXITED(rc)) return -1;
  return WEXITSTATUS(rc);
}

/* The standard output of `cmd` with every white-space character removed
 * (malloc'd), or NULL. */
static char* output_squeezed(const char* cmd) {
  FILE* p = popen(cmd, "r");
  if (p == NULL) return NULL;
  size_t cap = 1 << 16, len = 0;
  char* out = malloc(cap);
  int c;
  while ((c = fgetc(p)) != EOF) {
    if (isspace(c)) continue;
    if (len + 1 >= cap) out = realloc(out, cap *= 2);
    out[len++] = (char)c;
  }
  out[len] = '\0';
  if (pclose(p) != 0) {
    fprintf(stderr, "failed: %s\n", cmd);
    free(out);
    return NULL;
  }
  return out;
}

/* The number after "key": in squeezed JSON, 0 when the key is absent
 * (qemu-img leaves zero counters out). */
static uint64_t json_number(const char* json, const char* key) {
  char needle[256];
  snprintf(needle, sizeof needle, "\"%s\":", key);
  const char* p = strstr(json, needle);
  if (p == NULL) return 0;
  return strtoull(p + strlen(needle), NULL, 10);
}

static void write_be16(int fd, uint64_t offset, uint16_t v) {
  uint8_t b[2] = {(uint8_t)(v >> 8), (uint8_t)v};
  CHECK(pwrite(fd, b, 2, (off_t)offset) == 2);
}

static uint64_t read_be64(int fd, uint64_t offset) {
  uint8_t b[8];
  CHECK(pread(fd, b, 8, (off_t)offset) == 8);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = v << 8 | b[i];
  return v;
}

/* Gives clusters first..first+n-1 (past the image's end, the file grown to
 * hold them) a refcount of 1 that nothing references: n leaked clusters. */
static void leak_clusters(const char* path, uint64_t first, unsigned n) {
  int fd = open(path, O_RDWR);
  CHECK(fd >= 0);
  if (fd < 0) return;
  const uint64_t table = read_be64(fd, 48);   /* refcount_table_offset */
  const uint64_t block = read_be64(fd, table); /* first refcount block */
  for (unsigned i = 0; i < n; ++i) write_be16(fd, block + (first + i) * 2, 1);
  CHECK(ftruncate(fd, (off_t)((first + n) * CLUSTER)) == 0);
  close(fd);
}

/* Our check report against `qemu-img check --output=json`. */
static void expect_same_counts(const qcow2_check_report_t* r,
                               const char* path) {
  char cmd[8192];
  /* qemu-img check exits non-zero on leaks: read through a shell that
   * always succeeds. */
  snprintf(cmd, sizeof cmd,
           "qemu-img check --output=json '%s' 2>/dev/null; true", path);
  char* json = output_squeezed(cmd);
  CHECK(json != NULL);
  if (json == NULL) return;
  CHECK_EQ_U64(r->corruptions, json_number(json, "corruptions"));
  CHECK_EQ_U64(r->leaks, json_number(json, "leaks"));
  CHECK_EQ_U64(r->check_errors, json_number(json, "check-errors"));
  CHECK_EQ_U64(r->image_end_offset, json_number(json, "image-end-offset"));
  CHECK_EQ_U64(r->total_clusters, json_number(json, "total-clusters"));
  CHECK_EQ_U64(r->allocated_clusters,
               json_number(json, "allocated-clusters"));
  CHECK_EQ_U64(r->fragmented_clusters,
               json_number(json, "fragmented-clusters"));
  CHECK_EQ_U64(r->compressed_clusters,
               json_number(json, "compressed-clusters"));
  free(json);
}

static void fill(uint8_t* buf, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; ++i) buf[i] = (uint8_t)(i * 7 + seed);
}

static void test_check(void) {
  char path[1200], cmd[8192];
  char* err = NULL;
  path_in_dir(path, sizeof path, "leaky.qcow2");
  CHECK_OK(qcow2_image_create(path, NULL, 8 * MIB, NULL, &err), err);
  qcow2_image_t* img = qcow2_image_open(path, 1, &err);
  CHECK(img != NULL);
  if (img == NULL) return;
  static uint8_t data[3 * 65536];
  fill(data, sizeof data, 1);
  CHECK_OK(qcow2_image_write(img, MIB, data, sizeof data, &err), err);
  CHECK_OK(qcow2_image_close(img, &err), err);
  leak_clusters(path, 40, 3);

  qcow2_check_report_t r;
  memset(&r, 0, sizeof r);
  r.size = sizeof r;
  char* messages = NULL;
  CHECK_OK(qcow2_check(path, QCOW2_REPAIR_NONE, &r, &messages, &err), err);
  CHECK_EQ_U64(r.leaks, 3);
  CHECK_EQ_U64(r.corruptions, 0);
  CHECK(r.verdict == 3); /* qemu-img check's exit status for leaks */
  CHECK(messages != NULL && strstr(messages, "Leaked cluster 40") != NULL);
  qcow2_free(messages);
  expect_same_counts(&r, path);
  snprintf(cmd, sizeof cmd, "qemu-img check -q '%s' 2>/dev/null", path);
  CHECK(run(cmd) == r.verdict);

  memset(&r, 0, sizeof r);
  r.size = sizeof r;
  CHECK_OK(qcow2_check(path, QCOW2_REPAIR_LEAKS, &r, NULL, &err), err);
  CHECK_EQ_U64(r.leaks_fixed, 3);
  CHECK(r.rechecked);
  CHECK(r.verdict == 0);
  CHECK_EQ_U64(r.leaks, 0);

  memset(&r, 0, sizeof r);
  r.size = sizeof r;
  CHECK_OK(qcow2_check(path, QCOW2_REPAIR_NONE, &r, NULL, &err), err);
  CHECK(r.verdict == 0);
  expect_same_counts(&r, path);
  snprintf(cmd, sizeof cmd, "qemu-img check -q '%s'", path);
  CHECK(run(cmd) == 0);

  /* Errors: a missing file, a bad repair mode. */
  char missing[1200];
  path_in_dir(missing, sizeof missing, "missing.qcow2");
  CHECK(qcow2_check(missing, 0, &r, NULL, &err) == -ENOENT && err != NULL);
  qcow2_free(err);
  err = NULL;
  CHECK(qcow2_check(path, 7, &r, NULL, &err) == -EINVAL && err != NULL);
  qcow2_free(err);
  err = NULL;
}

/* The bitmap `b` as it appears in squeezed `qemu-img info --output=json`. */
static void expect_listed(const char* json, const qcow2_bitmap_info_t* b) {
  char want[2048];
  snprintf(want, sizeof want, "{\"flags\":[%s%s%s],\"name\":\"%s\","
           "\"granularity\":%llu}",
           b->in_use ? "\"in-use\"" : "",
           b->in_use && b->enabled ? "," : "",
           b->enabled ? "\"auto\"" : "", b->name,
           (unsigned long long)b->granularity);
  if (strstr(json, want) == NULL) {
    fprintf(stderr, "qemu-img info does not list %s in %s\n", want, json);
    ++failures;
  }
}

static void test_bitmaps(void) {
  char path[1200], cmd[8192];
  char* err = NULL;
  path_in_dir(path, sizeof path, "bitmaps.qcow2");
  CHECK_OK(qcow2_image_create(path, NULL, 8 * MIB, NULL, &err), err);
  qcow2_image_t* img = qcow2_image_open(path, 1, &err);
  CHECK(img != NULL);
  if (img == NULL) return;
  CHECK_OK(qcow2_image_bitmap_add(img, "live", 65536, 1, &err), err);
  CHECK_OK(qcow2_image_bitmap_add(img, "sum", 1 << 20, 0, &err), err);
  CHECK(qcow2_image_bitmap_add(img, "live", 65536, 1, &err) == -EEXIST);
  qcow2_free(err);
  err = NULL;
  static uint8_t data[4096];
  fill(data, sizeof data, 2);
  CHECK_OK(qcow2_image_write(img, 3 * MIB + 512, data, sizeof data, &err),
           err);
  CHECK_OK(qcow2_image_bitmap_merge(img, "sum", "live", NULL, &err), err);

  qcow2_bitmap_status_t st;
  memset(&st, 0, sizeof st);
  st.size = sizeof st;
  CHECK_OK(qcow2_image_bitmap_status(img, "live", 0, 8 * MIB, &st, &err),
           err);
  CHECK(!st.dirty && st.length == 3 * MIB);
  CHECK_OK(qcow2_image_bitmap_status(img, "live", 3 * MIB, 8 * MIB, &st,
                                     &err),
           err);
  CHECK(st.dirty && st.length == 65536);
  CHECK_OK(qcow2_image_bitmap_status(img, "sum", 3 * MIB, 8 * MIB, &st,
                                     &err),
           err);
  CHECK(st.dirty && st.length == MIB);
  CHECK(qcow2_image_bitmap_status(img, "nope", 0, 1, &st, &err) == -ENOENT);
  CHECK(err != NULL && strstr(err, "nope") != NULL);
  qcow2_free(err);
  err = NULL;

  const int n = qcow2_image_bitmap_count(img, &err);
  CHECK(n == 2);
  qcow2_bitmap_info_t info[2];
  for (int i = 0; i < n && i < 2; ++i) {
    memset(&info[i], 0, sizeof info[i]);
    info[i].size = sizeof info[i];
    CHECK_OK(qcow2_image_bitmap_info(img, i, &info[i], &err), err);
  }
  CHECK(qcow2_image_bitmap_info(img, 2, &info[0], &err) == -ENOENT);
  qcow2_free(err);
  err = NULL;
  CHECK_OK(qcow2_image_close(img, &err), err);

  snprintf(cmd, sizeof cmd, "qemu-img info --output=json '%s'", path);
  char* json = output_squeezed(cmd);
  CHECK(json != NULL);
  for (int i = 0; json != NULL && i < n && i < 2; ++i) {
    expect_listed(json, &info[i]);
  }
  free(json);
  for (int i = 0; i < n && i < 2; ++i) qcow2_free(info[i].name);
  snprintf(cmd, sizeof cmd, "qemu-img check -q '%s'", path);
  CHECK(run(cmd) == 0);
}

static void expect_measure(const char* qemu_args, const char* options,
                           uint64_t size, qcow2_image_t* source) {
  char cmd[8192];
  char* err = NULL;
  snprintf(cmd, sizeof cmd, "qemu-img measure --output=json %s", qemu_args);
  char* json = output_squeezed(cmd);
  CHECK(json != NULL);
  if (json == NULL) return;
  qcow2_measure_t m;
  memset(&m, 0, sizeof m);
  m.size = sizeof m;
  CHECK_OK(qcow2_measure(options, size, source, &m, &err), err);
  CHECK_EQ_U64(m.required, json_number(json, "required"));
  CHECK_EQ_U64(m.fully_allocated, json_number(json, "fully-allocated"));
  CHECK(m.has_bitmaps == (strstr(json, "\"bitmaps\":") != NULL));
  CHECK_EQ_U64(m.bitmaps, json_number(json, "bitmaps"));
  free(json);
}

static void test_measure(void) {
  char path[1200], args[8192];
  char* err = NULL;
  expect_measure("-O qcow2 --size 1G", NULL, 1ull << 30, NULL);
  expect_measure("-O qcow2 -o cluster_size=4096,preallocation=metadata "
                 "--size 100M",
                 "cluster_size=4096,preallocation=metadata", 100 * MIB,
                 NULL);
  path_in_dir(path, sizeof path, "bitmaps.qcow2"); /* test_bitmaps' */
  qcow2_image_t* src = qcow2_image_open(path, 0, &err);
  CHECK(src != NULL);
  if (src == NULL) return;
  snprintf(args, sizeof args, "-O qcow2 '%s'", path);
  expect_measure(args, NULL, 0, src);
  snprintf(args, sizeof args, "-O qcow2 -o cluster_size=2M '%s'", path);
  expect_measure(args, "cluster_size=2M", 0, src);
  qcow2_image_destroy(src);
}

static void test_commit(void) {
  char base[1200], top[1200], before[1200], cmd[16384];
  char* err = NULL;
  path_in_dir(base, sizeof base, "cbase.qcow2");
  path_in_dir(top, sizeof top, "ctop.qcow2");
  path_in_dir(before, sizeof before, "before.raw");
  CHECK_OK(qcow2_image_create(base, NULL, 8 * MIB, NULL, &err), err);
  CHECK_OK(qcow2_image_create(top, "cbase.qcow2", 0, "backing_fmt=qcow2",
                              &err),
           err);
  static uint8_t data[MIB];
  qcow2_image_t* img = qcow2_image_open(base, 1, &err);
  CHECK(img != NULL);
  if (img == NULL) return;
  fill(data, sizeof data, 3);
  CHECK_OK(qcow2_image_write(img, 0, data, sizeof data, &err), err);
  CHECK_OK(qcow2_image_close(img, &err), err);
  img = qcow2_image_open(top, 1, &err);
  CHECK(img != NULL);
  if (img == NULL) return;
  fill(data, sizeof data, 4);
  CHECK_OK(qcow2_image_write(img, MIB / 2, data, sizeof data, &err), err);
  CHECK_OK(qcow2_image_write_zeroes(img, 5 * MIB, MIB, 0, &err), err);
  CHECK_OK(qcow2_image_close(img, &err), err);
  snprintf(cmd, sizeof cmd, "qemu-img convert -O raw '%s' '%s'", top, before);
  CHECK(run(cmd) == 0);

  qcow2_chain_op_options_t opts;
  memset(&opts, 0, sizeof opts);
  opts.size = sizeof opts;
  opts.chunk = 256 * 1024;
  int emptied = -1;
  CHECK_OK(qcow2_commit(top, NULL, 0, &opts, &emptied, &err), err);
  CHECK(emptied == 1);
  snprintf(cmd, sizeof cmd,
           "qemu-img compare -q -F raw '%s' '%s' && "
           "qemu-img compare -q -F raw '%s' '%s' && "
           "qemu-img check -q '%s' && qemu-img check -q '%s'",
           base, before, top, before, base, top);
  CHECK(run(cmd) == 0);

  /* New data in the top, then a commit cancelled before its first chunk:
   * -ECANCELED, and the base as it was. */
  img = qcow2_image_open(top, 1, &err);
  CHECK(img != NULL);
  if (img == NULL) return;
  fill(data, sizeof data, 9);
  CHECK_OK(qcow2_image_write(img, 2 * MIB, data, sizeof data, &err), err);
  CHECK_OK(qcow2_image_close(img, &err), err);
  qcow2_live_control_t* control = qcow2_live_control_create();
  qcow2_live_control_cancel(control);
  opts.control = control;
  CHECK(qcow2_commit(top, NULL, 1, &opts, NULL, &err) == -ECANCELED);
  qcow2_free(err);
  err = NULL;
  qcow2_live_control_destroy(control);
  snprintf(cmd, sizeof cmd, "qemu-img compare -q -F raw '%s' '%s'", base,
           before);
  CHECK(run(cmd) == 0);
}

static void test_snapshots(void) {
  char path[1200], cmd[8192];
  char* err = NULL;
  path_in_dir(path, sizeof path, "snap.qcow2");
  CHECK_OK(qcow2_image_create(path, NULL, 4 * MIB, NULL, &err), err);
  qcow2_image_t* img = qcow2_image_open(path, 1, &err);
  CHECK(img != NULL);
  if (img == NULL) return;
  static uint8_t a[4096], b[4096], back[4096];
  fill(a, sizeof a, 5);
  fill(b, sizeof b, 6);
  CHECK_OK(qcow2_image_write(img, 0, a, sizeof a, &err), err);
  CHECK_OK(qcow2_image_snapshot_create(img, "first", NULL, &err), err);
  CHECK_OK(qcow2_image_write(img, 0, b, sizeof b, &err), err);
  CHECK(qcow2_image_snapshot_count(img, &err) == 1);
  qcow2_snapshot_info_t sn;
  memset(&sn, 0, sizeof sn);
  sn.size = sizeof sn;
  CHECK_OK(qcow2_image_snapshot_info(img, 0, &sn, &err), err);
  CHECK(sn.name != NULL && strcmp(sn.name, "first") == 0);
  CHECK(sn.id != NULL && strcmp(sn.id, "1") == 0);
  CHECK_EQ_U64(sn.disk_size, 4 * MIB);
  qcow2_free(sn.name);
  qcow2_free(sn.id);
  CHECK_OK(qcow2_image_snapshot_apply(img, "first", &err), err);
  CHECK_OK(qcow2_image_read(img, 0, back, sizeof back, &err), err);
  CHECK(memcmp(back, a, sizeof a) == 0);
  CHECK(qcow2_image_snapshot_delete(img, "none", &err) == -ENOENT);
  qcow2_free(err);
  err = NULL;
  CHECK_OK(qcow2_image_close(img, &err), err);
  snprintf(cmd, sizeof cmd,
           "qemu-img snapshot -l '%s' | grep -q first && "
           "qemu-img check -q '%s'",
           path, path);
  CHECK(run(cmd) == 0);
  img = qcow2_image_open(path, 1, &err);
  CHECK(img != NULL);
  if (img == NULL) return;
  CHECK_OK(qcow2_image_snapshot_delete(img, "1", &err), err);
  CHECK(qcow2_image_snapshot_count(img, &err) == 0);
  CHECK_OK(qcow2_image_close(img, &err), err);
  snprintf(cmd, sizeof cmd, "qemu-img check -q '%s'", path);
  CHECK(run(cmd) == 0);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s SCRATCH_DIR\n", argv[0]);
    return 2;
  }
  if (run("qemu-img --version >/dev/null 2>&1") != 0) {
    fprintf(stderr, "qemu-img missing: skipped\n");
    return 77;
  }
  snprintf(dir_path, sizeof dir_path, "%s", argv[1]);
  test_check();
  test_bitmaps();
  test_measure();
  test_commit();
  test_snapshots();
  if (failures != 0) {
    fprintf(stderr, "c_api_maintenance_test: %d failure(s)\n", failures);
    return 1;
  }
  printf("c_api_maintenance_test: passed; qemu-img agrees\n");
  return 0;
}
