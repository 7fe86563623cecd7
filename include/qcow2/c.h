/* SPDX-License-Identifier: Apache-2.0 */
/* The C API of libqcow2, for embedders that are not C++ (C, Rust through
 * bindgen, Go through cgo ...). In the style of LevelDB's and RocksDB's
 * c.h: opaque handles, and errors reported through a `char** errptr`.
 *
 * Errors. Every call that can fail takes `char** errptr` last and returns
 * an int: 0 on success, a negative errno on failure (qcow2_queue_poll and
 * the size/count getters say otherwise). On failure, when errptr is not
 * NULL, *errptr receives a malloc'd, NUL-terminated message naming what is
 * wrong and where (the file path, the guest offset, the option key). Free
 * it with qcow2_free(). A non-NULL *errptr on entry is freed and replaced
 * when a new error is reported, and left as it is on success (so one
 * variable can collect the first error of a sequence after it is checked;
 * set it to NULL after freeing it). The errno values:
 *   -EINVAL   bad argument or option string (unknown key, bad value)
 *   -ENOENT   a file does not exist          -EEXIST  create: file exists
 *   -EACCES   the OS refused access          -EPERM   image read-only,
 *             closed, or marked corrupt
 *   -EIO      request past the end of the disk, malformed image, I/O error
 *   -ENOSPC   no space left on the host file system
 *   -ENOTSUP  a feature the library does not implement
 *   -EBUSY    the image is locked by another process (QEMU's locks)
 *   -EAGAIN   queue full (qcow2_queue_* submits): poll, then submit again
 *   -ECANCELED a live stream or commit was cancelled
 * The message is what to show; the errno is what to branch on.
 *
 * Threading. qcow2_image_t calls may be made from any number of threads at
 * once (requests on different clusters run in parallel). qcow2_image_close
 * and qcow2_image_destroy must not race with any other call on the image,
 * and every queue of the image must be destroyed first. A qcow2_queue_t
 * belongs to one thread at a time (the one that submits and polls); give
 * each I/O thread its own queue. qcow2_free and qcow2_version_string are
 * safe anywhere.
 *
 * Memory. Handles are freed by qcow2_image_close / qcow2_image_destroy
 * and qcow2_queue_destroy, strings by qcow2_free. Buffers passed to the
 * synchronous calls are used only during the call. Buffers passed to queue
 * submits (the memory the iovecs point to) must stay valid and untouched
 * until their completion is returned by qcow2_queue_poll; the iovec arrays
 * themselves are copied and may be reused at once.
 *
 * Versions. Within one major version (the soname libqcow2.so.N) functions
 * are only added, never changed or removed, and structs passed by pointer
 * that may grow start with a `size` field the caller sets to sizeof: the
 * library fills only the fields that fit in that size. See
 * docs/embedding.md.
 */
#ifndef QCOW2_C_H_
#define QCOW2_C_H_

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "qcow2/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- library --------------------------------------------------------- */

/* The version of the library loaded at run time, e.g. "0.1.0" (static
 * storage; never freed). Compare with QCOW2_VERSION_STRING from
 * qcow2/version.h, the version compiled against. */
QCOW2_EXPORT const char* qcow2_version_string(void);

/* Frees a string the library returned (an error message). NULL is fine. */
QCOW2_EXPORT void qcow2_free(void* ptr);

/* ---- images ---------------------------------------------------------- */

/* An open image with its backing chain. Opaque. */
typedef struct qcow2_image_t qcow2_image_t;

/* Creates a qcow2 image at `path` (fails with -EEXIST if it exists).
 * `backing` is the backing file name to store (resolved relative to the
 * new image's directory), or NULL for none. `size` is the virtual size in
 * bytes; 0 takes the backing file's size. `options` is qemu-img's -o
 * string, or NULL for the defaults: comma-separated key=value pairs among
 *   cluster_size=65536 (512 .. 2M, a power of two; k/M suffixes allowed)
 *   compat=1.1|0.10   extended_l2=on|off   lazy_refcounts=on|off
 *   refcount_bits=16 (1, 2, 4, ..., 64)   compression_type=zlib|zstd
 *   preallocation=off|metadata|falloc|full
 *   backing_fmt=qcow2|raw   backing_file=NAME (instead of `backing`)
 *   size=SIZE (instead of `size`)   format=qcow2|raw (libqcow2: a raw file)
 *   encrypt.format=luks  encrypt.key-secret-file=PATH (the passphrase: the
 *   file's bytes)  encrypt.cipher-alg=aes-256  encrypt.cipher-mode=xts
 *   encrypt.ivgen-alg=plain64  encrypt.ivgen-hash-alg=HASH
 *   encrypt.hash-alg=sha256  encrypt.iter-time=MS (QEMU's names, defaults)
 *   encrypt.iterations=N (libqcow2's: fixed PBKDF2 counts, not measured)
 * An unknown key or a bad value fails with -EINVAL naming it. Thread-safe.
 */
QCOW2_EXPORT int qcow2_image_create(const char* path, const char* backing,
                                    uint64_t size, const char* options,
                                    char** errptr);

/* Opens `path` and its backing chain, read-write when `read_write` is
 * non-zero. Returns NULL on failure (with *errptr set). The handle is
 * freed by qcow2_image_close or qcow2_image_destroy. Thread-safe. */
QCOW2_EXPORT qcow2_image_t* qcow2_image_open(const char* path, int read_write,
                                             char** errptr);

/* As qcow2_image_open, with options as a comma-separated key=value string
 * (NULL or "" for the defaults: read-only, format probed):
 *   read-only=on|off     (default on)     format=qcow2|raw (default probe)
 *   direct=on|off        O_DIRECT for every file of the chain
 *   cache-size=SIZE      L2 table cache per qcow2 file (k/M/G suffixes)
 *   refcount-cache-size=SIZE
 *   backing=on|off       off: no backing files (unallocated reads zero)
 *   backing-root=DIR     refuse backing files that resolve outside DIR
 *   force-share=on|off   read-only only: open even while another process
 *                        writes the image (qemu-img -U); default off
 *   locking=on|off       take QEMU's image locks (default on)
 *   no-flush=on|off      flushes make nothing durable (qemu-img -t unsafe);
 *                        default off
 *   max-chain=N          deepest backing chain accepted
 *   key-secret-file=PATH the secret of LUKS-encrypted images (the file's
 *                        bytes; without it, or wrong: -EACCES). Copies
 *                        the library makes are wiped after the unlock.
 *   backing.key-secret-file=PATH, backing.backing.key-secret-file=PATH ...
 *                        the secret of the top's backing file, of that
 *                        file's backing file, ... (QEMU's
 *                        backing.encrypt.key-secret), for chains whose
 *                        encrypted images have different secrets; an image
 *                        given none uses key-secret-file's. Wiped likewise.
 *   metadata-only=on|off read-only only: open an encrypted image without
 *                        its secret for its metadata (size, chain, as
 *                        qemu-img info); reads of its data fail with
 *                        -EPERM and the buffer is zeroed; default off
 * An unknown key or bad value fails with -EINVAL naming it. */
QCOW2_EXPORT qcow2_image_t* qcow2_image_open_opts(const char* path,
                                                  const char* options,
                                                  char** errptr);

/* As qcow2_image_open_opts, returning the negative errno of a failure
 * (-ENOENT no such file, -EBUSY locked by another process, -EINVAL bad
 * option, -EACCES, -EIO malformed image ...), 0 on success. *out receives
 * the handle, or NULL on failure; `out` must not be NULL (-EINVAL).
 * qcow2_image_open and qcow2_image_open_opts are this call without the
 * errno. */
QCOW2_EXPORT int qcow2_image_open_ex(const char* path, const char* options,
                                     qcow2_image_t** out, char** errptr);

/* Flushes (when writable), marks the image clean and frees the handle,
 * failed or not: `img` must not be used afterwards. Returns the error of
 * the final flush, if any. NULL is a no-op. */
QCOW2_EXPORT int qcow2_image_close(qcow2_image_t* img, char** errptr);

/* Frees the handle with no error report (a flush error is lost): for
 * error paths. NULL is a no-op. */
QCOW2_EXPORT void qcow2_image_destroy(qcow2_image_t* img);

/* Virtual disk size in bytes. */
QCOW2_EXPORT uint64_t qcow2_image_size(const qcow2_image_t* img);

/* Non-zero when the image was opened for writing. */
QCOW2_EXPORT int qcow2_image_writable(const qcow2_image_t* img);

/* Number of files in the chain (1: no backing file). */
QCOW2_EXPORT int qcow2_image_chain_length(const qcow2_image_t* img);

/* Synchronous I/O: each blocks the calling thread until done. A range
 * past the end of the disk fails with -EIO. Writes are durable after the
 * next successful qcow2_image_flush. */
QCOW2_EXPORT int qcow2_image_read(qcow2_image_t* img, uint64_t offset,
                                  void* buf, size_t len, char** errptr);
QCOW2_EXPORT int qcow2_image_write(qcow2_image_t* img, uint64_t offset,
                                   const void* buf, size_t len,
                                   char** errptr);
/* Writes one guest cluster stored compressed (Image::WriteCompressed):
 * `offset` cluster-aligned, `len` the cluster size (or what is left of
 * the disk's last cluster). Stored uncompressed when compression saves
 * nothing. -ENOTSUP for a raw image, -EINVAL for a range that is not one
 * whole cluster. */
QCOW2_EXPORT int qcow2_image_write_compressed(qcow2_image_t* img,
                                              uint64_t offset,
                                              const void* buf, size_t len,
                                              char** errptr);
/* Makes the range read as zeros (never as backing data); with `unmap`
 * non-zero, host clusters may be released. */
QCOW2_EXPORT int qcow2_image_write_zeroes(qcow2_image_t* img, uint64_t offset,
                                          uint64_t len, int unmap,
                                          char** errptr);
/* Discards the range: it reads as zeros afterwards; the host clusters of
 * fully covered clusters are released. */
QCOW2_EXPORT int qcow2_image_discard(qcow2_image_t* img, uint64_t offset,
                                     uint64_t len, char** errptr);
/* Makes every write completed before the call durable, metadata too. */
QCOW2_EXPORT int qcow2_image_flush(qcow2_image_t* img, char** errptr);

/* What one range of the disk reads from (as `qemu-img map` says). */
typedef struct qcow2_block_status_t {
  size_t size;      /* in: sizeof(qcow2_block_status_t) */
  uint64_t offset;  /* guest offset of the range */
  uint64_t length;  /* bytes with this status */
  int32_t depth;    /* chain index of the deciding file (0 = top) */
  uint8_t allocated;   /* some file of the chain allocates it */
  uint8_t zero;        /* reads as zeros */
  uint8_t data;        /* reads from stored data */
  uint8_t compressed;  /* stored in a compressed cluster */
  uint8_t has_host_offset;
  uint64_t host_offset; /* in the file at `depth` (uncompressed data) */
} qcow2_block_status_t;

/* The status of the range at `offset`, as long as it stays uniform but at
 * most `max_len` bytes. Set out->size first. Safe beside requests in
 * flight. */
QCOW2_EXPORT int qcow2_image_block_status(qcow2_image_t* img, uint64_t offset,
                                          uint64_t max_len,
                                          qcow2_block_status_t* out,
                                          char** errptr);

/* I/O counters (qcow2/stats.h describes each). Fields are only added at
 * the end; the library fills those that fit in out->size. */
typedef struct qcow2_stats_t {
  size_t size; /* in: sizeof(qcow2_stats_t) */
  uint64_t guest_read_ops;
  uint64_t guest_read_bytes;
  uint64_t guest_write_ops;
  uint64_t guest_write_bytes;
  uint64_t guest_zero_ops;
  uint64_t guest_zero_bytes;
  uint64_t guest_discard_ops;
  uint64_t guest_discard_bytes;
  uint64_t guest_flush_ops;
  uint64_t host_data_read_bytes;
  uint64_t host_data_write_bytes;
  uint64_t cow_read_bytes;
  uint64_t cow_write_bytes;
  uint64_t metadata_read_bytes;
  uint64_t metadata_write_bytes;
  uint64_t host_zero_ops;
  uint64_t host_discard_ops;
  uint64_t host_flushes;
  uint64_t cluster_allocations;
} qcow2_stats_t;

/* Counters of every request on the image since it was opened (all queues
 * and the synchronous calls). Set out->size first; -EINVAL if it is
 * smaller than the `size` field itself. */
QCOW2_EXPORT int qcow2_image_get_stats(const qcow2_image_t* img,
                                       qcow2_stats_t* out, char** errptr);

/* ---- queues ---------------------------------------------------------- */

/* An asynchronous queue of requests on one image. Opaque. */
typedef struct qcow2_queue_t qcow2_queue_t;

/* One finished request: the user_data given at submit, and its result:
 * bytes transferred for reads and writes, 0 for the others, or a negative
 * errno. */
typedef struct qcow2_completion_t {
  void* user_data;
  int64_t result;
} qcow2_completion_t;

/* A queue of at most `depth` requests in flight (io_uring when available,
 * otherwise synchronous). Freed by qcow2_queue_destroy, which must come
 * before the image is closed. */
QCOW2_EXPORT qcow2_queue_t* qcow2_queue_create(qcow2_image_t* img, int depth,
                                               char** errptr);

/* As qcow2_queue_create, returning the negative errno of a failure
 * (-EINVAL for a NULL image or a depth below 1), 0 on success. *out
 * receives the queue, or NULL on failure; `out` must not be NULL
 * (-EINVAL). */
QCOW2_EXPORT int qcow2_queue_create_ex(qcow2_image_t* img, int depth,
                                       qcow2_queue_t** out, char** errptr);

/* Waits for every request in flight (their completions are dropped) and
 * frees the queue. NULL is a no-op. */
QCOW2_EXPORT void qcow2_queue_destroy(qcow2_queue_t* q);

/* An eventfd (non-blocking, close-on-exec) owned by the queue that is
 * readable whenever qcow2_queue_poll has something to do. Put it in epoll
 * (EPOLLIN); when it fires: read() 8 bytes from it to reset it, then call
 * qcow2_queue_poll until it returns 0. Completions that arrive meanwhile
 * leave it readable again; nothing is lost. Never close it. Returns the
 * descriptor, or a negative errno. */
QCOW2_EXPORT int qcow2_queue_eventfd(qcow2_queue_t* q);

/* Submits: 0 when queued (its completion comes from qcow2_queue_poll,
 * never from the submit), or a negative errno with no completion to come
 * (-EAGAIN: the queue is full; -EIO: range past the end; -EPERM:
 * read-only image). Vectored reads and writes move the bytes straight
 * between the file and the segments (no copy of allocated data). */
QCOW2_EXPORT int qcow2_queue_readv(qcow2_queue_t* q, uint64_t offset,
                                   const struct iovec* iov, int iovcnt,
                                   void* user_data, char** errptr);
QCOW2_EXPORT int qcow2_queue_writev(qcow2_queue_t* q, uint64_t offset,
                                    const struct iovec* iov, int iovcnt,
                                    void* user_data, char** errptr);
QCOW2_EXPORT int qcow2_queue_write_zeroes(qcow2_queue_t* q, uint64_t offset,
                                          uint64_t len, int unmap,
                                          void* user_data, char** errptr);
QCOW2_EXPORT int qcow2_queue_discard(qcow2_queue_t* q, uint64_t offset,
                                     uint64_t len, void* user_data,
                                     char** errptr);
/* Completes after every write whose completion was polled before it. */
QCOW2_EXPORT int qcow2_queue_flush(qcow2_queue_t* q, void* user_data,
                                   char** errptr);

/* Moves requests on and stores up to `max` finished ones in `out`; never
 * blocks. Returns how many it stored (0: none yet). Completions beyond
 * `max` stay for the next call. */
QCOW2_EXPORT int qcow2_queue_poll(qcow2_queue_t* q, qcow2_completion_t* out,
                                  int max);

/* As qcow2_queue_poll, but blocks until at least `min` completions are
 * stored (fewer when fewer requests are in flight). */
QCOW2_EXPORT int qcow2_queue_wait(qcow2_queue_t* q, qcow2_completion_t* out,
                                  int max, int min);

/* Requests submitted whose completion was not yet returned by poll. */
QCOW2_EXPORT int qcow2_queue_in_flight(const qcow2_queue_t* q);

/* qcow2::PrepareIoThread (qcow2/queue.h): first thing in a thread that
 * runs queues beside io_uring rings of its own. */
QCOW2_EXPORT void qcow2_prepare_io_thread(void);

/* ---- live stream and commit ------------------------------------------ */

/* Image::LiveStream and Image::LiveCommit (qcow2/live.h, and
 * docs/embedding.md): the chain shortened while queues on other threads
 * keep reading and writing the image. Each call blocks its thread until
 * the job ends. */

/* Cancels a running job from any thread: the job returns -ECANCELED at
 * its next chunk, the chain as it was. Opaque. */
typedef struct qcow2_live_control_t qcow2_live_control_t;
QCOW2_EXPORT qcow2_live_control_t* qcow2_live_control_create(void);
QCOW2_EXPORT void qcow2_live_control_cancel(qcow2_live_control_t* c);
/* NULL is a no-op. Not while a job uses it. */
QCOW2_EXPORT void qcow2_live_control_destroy(qcow2_live_control_t* c);

/* Called on the job's threads, one call at a time: bytes of the disk
 * done, and in all. */
typedef void (*qcow2_live_progress_fn)(void* user_data, uint64_t done,
                                       uint64_t total);

typedef struct qcow2_live_options_t {
  size_t size;          /* in: sizeof(qcow2_live_options_t) */
  uint64_t chunk;       /* bytes per chunk (512 multiple); 0: 1 MiB */
  int depth;            /* chunks in flight (threads); 0: 2 */
  uint64_t rate_limit;  /* bytes per second; 0: no limit */
  qcow2_live_progress_fn progress;  /* may be NULL */
  void* progress_data;
  qcow2_live_control_t* control;    /* may be NULL */
} qcow2_live_options_t;

/* Pulls into the top what layers 1..base-1 allocate (and the top does
 * not); the layer at depth `base` becomes the top's backing file, or none
 * when `base` is the chain length. `opts` may be NULL (defaults). */
QCOW2_EXPORT int qcow2_image_live_stream(qcow2_image_t* img, int base,
                                         const qcow2_live_options_t* opts,
                                         char** errptr);
/* Writes what layers 1..base-1 allocate into the layer at depth `base`
 * (2 <= base < chain length), which becomes the top's backing file.
 * base 1 is qcow2_image_live_commit_active(img, 1, ...). */
QCOW2_EXPORT int qcow2_image_live_commit(qcow2_image_t* img, int base,
                                         const qcow2_live_options_t* opts,
                                         char** errptr);
/* Active commit with its pivot (Image::LiveActiveCommit): writes what
 * layers 0..base-1 (the top included) allocate into the layer at depth
 * `base` (1 <= base < chain length) while the guest writes, copying again
 * what the guest changes, then makes that layer the top: the guest's
 * writes land in it from then on, and layers 0..base-1 leave the chain.
 * The progress total grows with each pass. -ECANCELED: the chain as it
 * was. -ENOTSUP for a base whose size is not the disk's. */
QCOW2_EXPORT int qcow2_image_live_commit_active(
    qcow2_image_t* img, int base, const qcow2_live_options_t* opts,
    char** errptr);

/* ---- persistent dirty bitmaps (Image::ListBitmaps ...) ---------------- */

/* The bitmaps of the top image (qcow2). On an image open read-write every
 * enabled bitmap records each write as it is made, and the bitmaps are
 * written back by qcow2_image_close. Listing and status are safe beside
 * requests in flight on queues; the edits need a writable image (-EPERM
 * otherwise). */
typedef struct qcow2_bitmap_info_t {
  size_t size;           /* in: sizeof(qcow2_bitmap_info_t) */
  char* name;            /* malloc'd: free with qcow2_free */
  uint64_t granularity;  /* bytes per bit */
  uint8_t enabled;       /* the auto flag: writes set its bits */
  uint8_t in_use;        /* inconsistent (found in use): only removable */
} qcow2_bitmap_info_t;

/* The number of bitmaps (0 for a raw image), or a negative errno. */
QCOW2_EXPORT int qcow2_image_bitmap_count(qcow2_image_t* img, char** errptr);
/* Bitmap number `index` (0 .. count-1, directory order); -ENOENT past the
 * last. Set out->size first. */
QCOW2_EXPORT int qcow2_image_bitmap_info(qcow2_image_t* img, int index,
                                         qcow2_bitmap_info_t* out,
                                         char** errptr);

typedef struct qcow2_bitmap_status_t {
  size_t size;      /* in: sizeof(qcow2_bitmap_status_t) */
  uint64_t offset;  /* guest offset of the range */
  uint64_t length;  /* bytes with this state */
  uint8_t dirty;    /* written since the bitmap was cleared */
} qcow2_bitmap_status_t;

/* The dirty state of bitmap `name` at `offset`, as long as it stays
 * uniform, at most `max_len` bytes (clipped to the disk). -ENOENT naming
 * the bitmap if it does not exist; -EPERM for one in use. */
QCOW2_EXPORT int qcow2_image_bitmap_status(qcow2_image_t* img,
                                           const char* name, uint64_t offset,
                                           uint64_t max_len,
                                           qcow2_bitmap_status_t* out,
                                           char** errptr);
/* Creates bitmap `name` (granularity 0: the cluster size, at least 4 KiB),
 * recording writes when `enabled` is non-zero. -EEXIST if it exists. */
QCOW2_EXPORT int qcow2_image_bitmap_add(qcow2_image_t* img, const char* name,
                                        uint64_t granularity, int enabled,
                                        char** errptr);
QCOW2_EXPORT int qcow2_image_bitmap_remove(qcow2_image_t* img,
                                           const char* name, char** errptr);
QCOW2_EXPORT int qcow2_image_bitmap_clear(qcow2_image_t* img, const char* name,
                                          char** errptr);
QCOW2_EXPORT int qcow2_image_bitmap_enable(qcow2_image_t* img,
                                           const char* name, char** errptr);
QCOW2_EXPORT int qcow2_image_bitmap_disable(qcow2_image_t* img,
                                            const char* name, char** errptr);
/* Marks dirty in bitmap `target` every granule bitmap `source` of
 * `source_img` (NULL: `img` itself) has dirty (qemu-img bitmap --merge). */
QCOW2_EXPORT int qcow2_image_bitmap_merge(qcow2_image_t* img,
                                          const char* target,
                                          const char* source,
                                          qcow2_image_t* source_img,
                                          char** errptr);

/* ---- internal snapshots (Image::ListSnapshots ...) --------------------- */

typedef struct qcow2_snapshot_info_t {
  size_t size;             /* in: sizeof(qcow2_snapshot_info_t) */
  char* id;                /* malloc'd: free with qcow2_free */
  char* name;              /* malloc'd: free with qcow2_free */
  uint64_t vm_state_size;  /* bytes of VM state (0: disk only) */
  uint32_t date_sec;
  uint32_t date_nsec;
  uint64_t vm_clock_nsec;
  uint64_t disk_size;      /* virtual size of the disk it holds */
  uint8_t has_icount;
  uint64_t icount;
} qcow2_snapshot_info_t;

/* The number of internal snapshots of the top image, or a negative errno
 * (-ENOTSUP for a raw image). */
QCOW2_EXPORT int qcow2_image_snapshot_count(qcow2_image_t* img,
                                            char** errptr);
/* Snapshot number `index` in table order; -ENOENT past the last. */
QCOW2_EXPORT int qcow2_image_snapshot_info(qcow2_image_t* img, int index,
                                           qcow2_snapshot_info_t* out,
                                           char** errptr);
/* Create (id NULL or "": the next numeric id), apply (revert the disk to
 * it) and delete, by id or else by name. They need a writable image with
 * no queue open (-EPERM otherwise); -ENOENT when none matches. */
QCOW2_EXPORT int qcow2_image_snapshot_create(qcow2_image_t* img,
                                             const char* name, const char* id,
                                             char** errptr);
QCOW2_EXPORT int qcow2_image_snapshot_apply(qcow2_image_t* img,
                                            const char* name_or_id,
                                            char** errptr);
QCOW2_EXPORT int qcow2_image_snapshot_delete(qcow2_image_t* img,
                                             const char* name_or_id,
                                             char** errptr);

/* ---- offline maintenance (qcow2/maintenance.h) ------------------------- */

/* qemu-img check's report. `verdict` is qemu-img check's exit status:
 * 0 clean, 1 the check failed (check_errors, or it stopped early),
 * 2 corruptions, 3 leaked clusters only. */
typedef struct qcow2_check_report_t {
  size_t size; /* in: sizeof(qcow2_check_report_t) */
  uint64_t corruptions;
  uint64_t leaks;
  uint64_t check_errors;
  uint64_t corruptions_fixed;
  uint64_t leaks_fixed;
  uint64_t image_end_offset;
  uint64_t total_clusters;
  uint64_t allocated_clusters;
  uint64_t fragmented_clusters;
  uint64_t compressed_clusters;
  int32_t verdict;
  uint8_t rechecked;  /* repaired, then checked again (these counters) */
} qcow2_check_report_t;

#define QCOW2_REPAIR_NONE 0
#define QCOW2_REPAIR_LEAKS 1
#define QCOW2_REPAIR_ALL 2

/* Checks the qcow2 image at `path` (opened read-write for a repair) and
 * fills `out`. When `messages` is not NULL, *messages receives the lines
 * qemu-img prints to stderr, each ending in '\n' (malloc'd; free with
 * qcow2_free). Problems found are in the report, not an error: the call
 * fails only when the image cannot be checked at all (-ENOENT, -EINVAL
 * not qcow2, -EIO malformed header, -ENOTSUP, -EBUSY locked). */
QCOW2_EXPORT int qcow2_check(const char* path, int repair,
                             qcow2_check_report_t* out, char** messages,
                             char** errptr);

/* qemu-img measure: the bytes a new image needs. */
typedef struct qcow2_measure_t {
  size_t size; /* in: sizeof(qcow2_measure_t) */
  uint64_t required;
  uint64_t fully_allocated;
  uint8_t has_bitmaps;  /* both sides carry persistent bitmaps */
  uint64_t bitmaps;     /* bytes of their metadata and data */
} qcow2_measure_t;

/* The new image is described by `options` (qcow2_image_create's -o string:
 * format, cluster_size, compat, preallocation ...) and `size`; with a
 * `source` image, its size and data instead of `size`. */
QCOW2_EXPORT int qcow2_measure(const char* options, uint64_t size,
                               qcow2_image_t* source, qcow2_measure_t* out,
                               char** errptr);

/* Progress of an offline chain operation: the fraction done (0..1). */
typedef void (*qcow2_progress_fn)(void* user_data, double fraction);

typedef struct qcow2_chain_op_options_t {
  size_t size;               /* in: sizeof(qcow2_chain_op_options_t) */
  const char* open_options;  /* qcow2_image_open_opts's string, or NULL */
  int depth;                 /* chunks in flight; 0: 16 */
  uint64_t chunk;            /* bytes per chunk (512 multiple); 0: 1 MiB */
  qcow2_progress_fn progress;  /* may be NULL */
  void* progress_data;
  qcow2_live_control_t* control;  /* cancel: -ECANCELED; may be NULL */
} qcow2_chain_op_options_t;

/* qemu-img commit of the image at `path` into `base` (NULL: its backing
 * file; a named base keeps the top as it is, as qemu-img -b does); with
 * `keep_top` zero the top is emptied afterwards (*emptied, if not NULL,
 * says whether it was). `opts` may be NULL. */
QCOW2_EXPORT int qcow2_commit(const char* path, const char* base,
                              int keep_top,
                              const qcow2_chain_op_options_t* opts,
                              int* emptied, char** errptr);
/* qemu-img rebase: `backing` NULL or "" for none; `unsafe` non-zero only
 * rewrites the name (-u). */
QCOW2_EXPORT int qcow2_rebase(const char* path, const char* backing,
                              const char* backing_format, int unsafe,
                              const qcow2_chain_op_options_t* opts,
                              char** errptr);
/* Offline block-stream: pulls into the top what lies above `base` (NULL:
 * the whole chain) and makes `base` its backing file. */
QCOW2_EXPORT int qcow2_stream(const char* path, const char* base,
                              const qcow2_chain_op_options_t* opts,
                              char** errptr);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* QCOW2_C_H_ */
