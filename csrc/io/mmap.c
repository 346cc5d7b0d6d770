/* io/mmap.c — the mmap read backend: the file mapped read-only with MADV_RANDOM (no readahead), each
 * request's range asked for with MADV_WILLNEED (one read for the range instead of a fault per page) and
 * copied out of the mapping in the submitting thread, so requests never overlap; requests past the mapped end are not touched (ENODATA by io.c's rules).
 * A file truncated under the mapping, or a device error, faults (SIGBUS): map_guard.c turns that into -EIO. */
#define _GNU_SOURCE
#include "io.h"
#include "../internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct { void *base; size_t size, page; int guard; } mapping;

static pi2_status init(pi2_io *io) {
    mapping *m = calloc(1, sizeof *m);
    if (!m) return pi2_set_error(PI2_ERR_NOMEM, "no memory for a mapping");
    m->size = (size_t)io->size;
    m->page = (size_t)sysconf(_SC_PAGESIZE);
    if (m->size) {
        m->base = mmap(NULL, m->size, PROT_READ, MAP_SHARED, io->fd, 0);
        if (m->base == MAP_FAILED) {
            int e = errno;
            free(m);
            return pi2_set_error(PI2_ERR_IO, "cannot map the file: %s", strerror(e));
        }
        madvise(m->base, m->size, MADV_RANDOM);
    }
    m->guard = io_map_guard_add(m->base, m->size, "the model file", io->fd);
    io->be = m;
    return PI2_OK;
}

static int32_t start(pi2_io *io, const int32_t *slots, int32_t n) {
    const mapping *m = io->be;
    for (int32_t i = 0; i < n; i++) {
        const pi2_io_request *r = &io->slots[slots[i]].req;
        int64_t res = 0;
        if (r->offset < m->size) {
            size_t k = m->size - r->offset < r->length ? m->size - r->offset : r->length;
            size_t lo = r->offset / m->page * m->page;
            if (k > PI2_IO_ALIGN) madvise((char *)m->base + lo, r->offset + k - lo, MADV_WILLNEED);
            const int faults = io_map_guard_faults(m->guard);
            memcpy(r->dest, (const char *)m->base + r->offset, k);
            res = io_map_guard_faults(m->guard) != faults ? -EIO                 /* SIGBUS: truncated or EIO */
                  : io_map_guard_shrunk(m->guard) ? -ENODATA : (int64_t)k;     /* past a new end: zeros */
        }
        io_finish(io, slots[i], res);
    }
    return n;
}

static pi2_status wait_done(pi2_io *io, int32_t min) {
    (void)io, (void)min;   /* every read finished in start */
    return PI2_OK;
}

static void fini(pi2_io *io) {
    mapping *m = io->be;
    if (!m) return;
    io_map_guard_remove(m->guard);
    if (m->size) munmap(m->base, m->size);
    free(m);
    io->be = NULL;
}

void io_mmap_release(pi2_io *io) {
    const mapping *m = io->be;
    if (m && m->size) madvise(m->base, m->size, MADV_DONTNEED);   /* unmapped pages can leave the page cache */
}

const io_backend_ops pi2_io_mmap_ops = {init, start, wait_done, fini};
