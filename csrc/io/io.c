/* io/io.c — pi2_io_* handles: open (O_DIRECT with a clean fallback), request validation, slots,
 * completion queue, short-read and end-of-file rules, page-cache drops; backends do the reads.
 * Does not: choose a backend (probe.c, then Python) or time reads (bench.c).
 * Invariants: in_flight == slots taken == started + finished-unreaped; every taken slot is finished
 * exactly once; n_done <= qd. */
#define _GNU_SOURCE
#include "io.h"
#include "../internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_LEN (1ull << 30)

static const char *const NAMES[] = {"auto", "uring", "aio", "pread", "mmap"};

static atomic_int uring_cleared;
int io_uring_cleared(void) { return atomic_load(&uring_cleared); }
void io_uring_set_cleared(void) { atomic_store(&uring_cleared, 1); }

pi2_io_params io_default_params(void) {
    return (pi2_io_params){.backend = PI2_IO_PREAD, .queue_depth = 32, .direct = 1, .drop_cache = 1};
}

static const io_backend_ops *ops_of(int32_t b) {
    switch (b) {
    case PI2_IO_URING: return &pi2_io_uring_ops;
    case PI2_IO_AIO: return &pi2_io_aio_ops;
    case PI2_IO_PREAD: return &pi2_io_pread_ops;
    case PI2_IO_MMAP: return &pi2_io_mmap_ops;
    default: return NULL;
    }
}

/* 1: statx says this file cannot do direct I/O (kernel >= 6.1 answers; older kernels say nothing).
 * The raw system call: Bionic declares statx() only from API level 30. */
static int statx_no_dio(int fd) {
#if defined(STATX_DIOALIGN) && defined(__NR_statx)
    struct statx sx;
    memset(&sx, 0, sizeof sx);
    if (syscall(__NR_statx, fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN))
        return sx.stx_dio_offset_align == 0 || sx.stx_dio_offset_align > PI2_IO_ALIGN ||
               sx.stx_dio_mem_align > PI2_IO_ALIGN;
#else
    (void)fd;
#endif
    return 0;
}

/* Open path with O_DIRECT if it works for an aligned read; else buffered. Sets io->fd/direct/note. */
static pi2_status open_file(pi2_io *io, const char *path, const pi2_io_params *p, int32_t test_flags) {
    const int base = O_RDONLY | O_CLOEXEC;
    int want_direct = p->direct && p->backend != PI2_IO_MMAP;
    if (want_direct) {
        int fd = (test_flags & PI2_IO_TEST_DIRECT_OPEN_EINVAL) ? (errno = EINVAL, -1)
                                                                    : open(path, base | O_DIRECT);
        if (fd < 0 && errno != EINVAL)
            return pi2_set_io_error(errno, path, "cannot open %s: %s", path, strerror(errno));
        if (fd < 0) {
            snprintf(io->note, sizeof io->note, "buffered: the file system refuses O_DIRECT (EINVAL at open)");
        } else if (statx_no_dio(fd)) {
            close(fd);
            snprintf(io->note, sizeof io->note, "buffered: statx reports no direct I/O for this file");
        } else {
            void *buf = NULL;
            ssize_t r = -1;
            if (posix_memalign(&buf, PI2_IO_ALIGN, PI2_IO_ALIGN) != 0) {
                close(fd);
                return pi2_set_error(PI2_ERR_NOMEM, "no memory for a 4 KiB buffer");
            }
            if (test_flags & PI2_IO_TEST_DIRECT_READ_EINVAL) errno = EINVAL;
            else r = pread(fd, buf, PI2_IO_ALIGN, 0);
            int err = errno;
            free(buf);
            if (r >= 0) {
                io->fd = fd;
                io->direct = 1;
                snprintf(io->note, sizeof io->note, "O_DIRECT");
                return PI2_OK;
            }
            close(fd);
            if (err != EINVAL)
                return pi2_set_io_error(err, path, "cannot read %s: %s", path, strerror(err));
            snprintf(io->note, sizeof io->note, "buffered: an aligned O_DIRECT read failed with EINVAL");
        }
    } else {
        snprintf(io->note, sizeof io->note, p->backend == PI2_IO_MMAP ? "mapped (page cache)" : "buffered: as asked");
    }
    io->fd = open(path, base);
    if (io->fd < 0) return pi2_set_io_error(errno, path, "cannot open %s: %s", path, strerror(errno));
    io->direct = 0;
    posix_fadvise(io->fd, 0, 0, POSIX_FADV_RANDOM);
    return PI2_OK;
}

static pi2_status get_info(const pi2_io *io, pi2_io_info *out) {
    *out = (pi2_io_info){.backend = io->backend, .direct = io->direct, .queue_depth = io->qd, .fd = io->fd,
                         .file_size = io->size, .note = io->note};
    return PI2_OK;
}

pi2_status pi2_io_open(const char *path, const pi2_io_params *p, pi2_io **out, pi2_io_info *info) {
    return pi2_test_io_open(path, p, 0, out, info);
}

pi2_status pi2_test_io_open(const char *path, const pi2_io_params *p, int32_t test_flags, pi2_io **out,
                            pi2_io_info *info) {
    if (!out) return pi2_set_error(PI2_ERR_INVALID, "NULL output");
    *out = NULL;
    if (!path || !p) return pi2_set_error(PI2_ERR_INVALID, "NULL path or params");
    const io_backend_ops *ops = ops_of(p->backend);
    if (!ops) return pi2_set_error(PI2_ERR_INVALID, "unknown I/O backend %d (auto is resolved by the probe)", p->backend);
    if (p->queue_depth < 1 || p->queue_depth > PI2_IO_MAX_QD)
        return pi2_set_error(PI2_ERR_INVALID, "queue depth %d is not in 1..%d", p->queue_depth, PI2_IO_MAX_QD);
    if (p->backend == PI2_IO_URING && !io_uring_cleared())
        return pi2_set_error(PI2_ERR_UNSUPPORTED, "io_uring has not been probed safe in this process (pi2_io_probe)");
    pi2_io *io = calloc(1, sizeof *io);
    if (!io) return pi2_set_error(PI2_ERR_NOMEM, "no memory for an I/O handle");
    io->fd = -1;
    io->backend = p->backend;
    io->qd = p->queue_depth;
    io->drop_cache = p->drop_cache && p->backend != PI2_IO_MMAP;   /* a mapping keeps its pages */
    io->ops = ops;
    io->slots = calloc((size_t)io->qd, sizeof *io->slots);
    io->done = calloc((size_t)io->qd, sizeof *io->done);
    if (!io->slots || !io->done) {
        free(io->slots), free(io->done), free(io);
        return pi2_set_error(PI2_ERR_NOMEM, "no memory for %d I/O slots", p->queue_depth);
    }
    for (int32_t i = 0; i < io->qd; i++) io->slots[i].next_free = i + 1 < io->qd ? i + 1 : -1;
    pi2_status st = open_file(io, path, p, test_flags);
    struct stat sb;
    if (st == PI2_OK && fstat(io->fd, &sb) != 0) st = pi2_set_io_error(errno, path, "cannot stat %s: %s", path, strerror(errno));
    if (st == PI2_OK) {
        io->size = sb.st_size;
        st = ops->init(io);
    }
    if (st != PI2_OK) {
        if (io->fd >= 0) close(io->fd);
        free(io->slots), free(io->done), free(io);
        return st;
    }
    *out = io;
    return info ? get_info(io, info) : PI2_OK;
}

void io_finish(pi2_io *io, int32_t slot, int64_t res) {
    const pi2_io_request *r = &io->slots[slot].req;
    pi2_io_completion c = {.user = r->user, .nbytes = res > 0 ? res : 0, .error = res < 0 ? (int32_t)-res : 0};
    if (res >= 0) {
        uint64_t want = r->offset >= (uint64_t)io->size ? 0 : (uint64_t)io->size - r->offset;
        if (want > r->length) want = r->length;
        if (want == 0 || (uint64_t)res < want) c.error = ENODATA;   /* past the end, or a short read */
        if (!io->direct && io->drop_cache && res > 0)
            posix_fadvise(io->fd, (off_t)r->offset, (off_t)res, POSIX_FADV_DONTNEED);
    }
    io->done[(io->done_head + io->n_done) % io->qd] = c;
    io->n_done++;
    io->slots[slot].next_free = io->free_head;
    io->free_head = slot;
}

static int valid(const pi2_io_request *r) {
    return r->length > 0 && r->length <= MAX_LEN && r->dest && r->offset % PI2_IO_ALIGN == 0 &&
           r->length % PI2_IO_ALIGN == 0 && (uintptr_t)r->dest % PI2_IO_ALIGN == 0;
}

pi2_status pi2_io_submit(pi2_io *io, const pi2_io_request *reqs, int32_t n, int32_t *n_accepted) {
    if (n_accepted) *n_accepted = 0;
    if (!io || (!reqs && n) || n < 0 || !n_accepted)
        return pi2_set_error(PI2_ERR_INVALID, "pi2_io_submit: NULL arguments or n < 0");
    int32_t start[PI2_IO_MAX_QD], n_start = 0, taken = 0;
    while (taken < n && io->in_flight < io->qd) {
        int32_t s = io->free_head;
        io->free_head = io->slots[s].next_free;
        io->slots[s].req = reqs[taken++];
        io->in_flight++;
        if (valid(&io->slots[s].req)) start[n_start++] = s;
        else io_finish(io, s, -EINVAL);
    }
    int32_t off = 0;
    while (off < n_start) {
        int32_t k = io->ops->start(io, start + off, n_start - off);
        if (k < 0) return pi2_set_error((pi2_status)k, "%s: submitting reads failed", NAMES[io->backend]);
        if (k == 0 && io->n_started == 0)   /* nothing to wait for: the kernel would never make room */
            return pi2_set_error(PI2_ERR_IO, "%s: the kernel takes no reads with none in flight",
                                 NAMES[io->backend]);
        off += k;
        if (off < n_start) {   /* the kernel is full: make room by finishing what is ready */
            pi2_status st = io->ops->wait(io, 1);
            if (st != PI2_OK) return st;
        }
    }
    *n_accepted = taken;
    return PI2_OK;
}

pi2_status pi2_io_reap(pi2_io *io, pi2_io_completion *out, int32_t max, int32_t min_complete, int32_t *n_out) {
    if (n_out) *n_out = 0;
    if (!io || !n_out || (!out && max > 0) || max < 0)
        return pi2_set_error(PI2_ERR_INVALID, "pi2_io_reap: NULL arguments or max < 0");
    if (min_complete > io->in_flight) min_complete = io->in_flight;
    if (min_complete > max) min_complete = max;
    if (io->n_done < min_complete || io->n_started > 0) {
        int32_t need = min_complete - io->n_done;
        pi2_status st = io->ops->wait(io, need > 0 ? need : 0);
        if (st != PI2_OK) return st;
    }
    int32_t k = 0;
    while (k < max && io->n_done > 0) {
        out[k++] = io->done[io->done_head];
        io->done_head = (io->done_head + 1) % io->qd;
        io->n_done--;
        io->in_flight--;
    }
    *n_out = k;
    return PI2_OK;
}

int32_t pi2_io_in_flight(const pi2_io *io) { return io ? io->in_flight : 0; }

pi2_status pi2_io_read_all(pi2_io *io, const pi2_io_request *reqs, int32_t n, pi2_io_completion *out) {
    if (!io || n < 0 || (n && (!reqs || !out)))
        return pi2_set_error(PI2_ERR_INVALID, "pi2_io_read_all: NULL arguments or n < 0");
    if (io->in_flight) return pi2_set_error(PI2_ERR_INVALID, "pi2_io_read_all: requests already in flight");
    /* user carries the index while in flight; the caller's tag is restored in out */
    pi2_io_request batch[64];
    pi2_io_completion got[64];
    int32_t next = 0, done = 0;
    while (done < n) {
        while (next < n && io->in_flight < io->qd) {
            int32_t m = 0;
            while (m < 64 && next + m < n && io->in_flight + m < io->qd) {
                batch[m] = reqs[next + m];
                batch[m].user = (uint64_t)(next + m);
                m++;
            }
            int32_t acc;
            pi2_status st = pi2_io_submit(io, batch, m, &acc);
            if (st != PI2_OK) return st;
            next += acc;
        }
        int32_t k;
        pi2_status st = pi2_io_reap(io, got, 64, 1, &k);
        if (st != PI2_OK) return st;
        for (int32_t i = 0; i < k; i++) {
            uint64_t idx = got[i].user;
            out[idx] = got[i];
            out[idx].user = reqs[idx].user;
        }
        done += k;
    }
    return PI2_OK;
}

pi2_status pi2_io_drop_cache(pi2_io *io) {
    if (!io) return pi2_set_error(PI2_ERR_INVALID, "NULL handle");
    if (io->backend == PI2_IO_MMAP) io_mmap_release(io);
    int e = posix_fadvise(io->fd, 0, 0, POSIX_FADV_DONTNEED);
    return e ? pi2_set_io_error(e, "", "posix_fadvise(DONTNEED): %s", strerror(e)) : PI2_OK;
}

void pi2_io_close(pi2_io *io) {
    if (!io) return;
    while (io->n_started > 0 && io->ops->wait(io, io->n_started) == PI2_OK) {}
    io->ops->fini(io);
    if (io->fd >= 0) close(io->fd);
    free(io->slots), free(io->done), free(io);
}
