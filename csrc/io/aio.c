/* io/aio.c — the Linux native AIO read backend with raw system calls (io_setup, io_submit,
 * io_getevents, io_destroy; <linux/aio_abi.h>), no libaio: Android's app sandbox allows these.
 * Does: one IOCB_CMD_PREAD per slot, aio_data = slot; an iocb the kernel refuses (io_submit fails on
 *       the first of the rest) is finished with that errno and submission goes on after it.
 * Note: where O_DIRECT is not in effect the kernel reads inside io_submit (no overlap); the probe
 *       measures that. */
#define _GNU_SOURCE
#include "io.h"
#include "../internal.h"

#include <errno.h>
#include <linux/aio_abi.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    aio_context_t ctx;
    struct iocb *cbs;          /* [qd], one per slot */
    struct io_event *events;   /* [qd] */
} aio;

static pi2_status init(pi2_io *io) {
    aio *a = calloc(1, sizeof *a);
    if (!a) return pi2_set_error(PI2_ERR_NOMEM, "no memory for AIO state");
    a->cbs = calloc((size_t)io->qd, sizeof *a->cbs);
    a->events = calloc((size_t)io->qd, sizeof *a->events);
    if (!a->cbs || !a->events) {
        free(a->cbs), free(a->events), free(a);
        return pi2_set_error(PI2_ERR_NOMEM, "no memory for AIO state");
    }
    if (syscall(__NR_io_setup, (unsigned)io->qd, &a->ctx) < 0) {
        int e = errno;
        free(a->cbs), free(a->events), free(a);
        return pi2_set_error(PI2_ERR_UNSUPPORTED, "io_setup: %s", strerror(e));
    }
    io->be = a;
    return PI2_OK;
}

static int32_t start(pi2_io *io, const int32_t *slots, int32_t n) {
    aio *a = io->be;
    struct iocb *ptrs[64];
    int32_t k = 0;
    while (k < n) {
        int32_t m = n - k < 64 ? n - k : 64;
        for (int32_t i = 0; i < m; i++) {
            int32_t s = slots[k + i];
            const pi2_io_request *r = &io->slots[s].req;
            struct iocb *cb = &a->cbs[s];
            memset(cb, 0, sizeof *cb);
            cb->aio_data = (uint64_t)s;
            cb->aio_lio_opcode = IOCB_CMD_PREAD;
            cb->aio_fildes = (uint32_t)io->fd;
            cb->aio_buf = (uint64_t)(uintptr_t)r->dest;
            cb->aio_nbytes = r->length;
            cb->aio_offset = (int64_t)r->offset;
            ptrs[i] = cb;
        }
        long r = syscall(__NR_io_submit, a->ctx, (long)m, ptrs);
        if (r > 0) {
            io->n_started += (int32_t)r;
            k += (int32_t)r;
        } else if (r < 0 && errno == EINTR) {
            continue;
        } else if (r < 0 && errno == EAGAIN) {
            return k;                      /* the kernel's queue is full: the caller waits, then retries */
        } else if (r < 0) {
            io_finish(io, slots[k], -errno);   /* this iocb is refused; the rest go on */
            k++;
        } else {
            return k;
        }
    }
    return k;
}

static pi2_status wait_done(pi2_io *io, int32_t min) {
    aio *a = io->be;
    int32_t got = 0;
    do {
        if (io->n_started == 0) break;
        struct timespec zero = {0, 0};
        long r = syscall(__NR_io_getevents, a->ctx, (long)(min - got > 0 ? min - got : 0), (long)io->n_started,
                         a->events, min - got > 0 ? NULL : &zero);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return pi2_set_io_error(errno, "", "io_getevents: %s", strerror(errno));
        for (long i = 0; i < r; i++) {
            io->n_started--;
            io_finish(io, (int32_t)a->events[i].data, a->events[i].res);
        }
        got += (int32_t)r;
    } while (got < min);
    return PI2_OK;
}

static void fini(pi2_io *io) {
    aio *a = io->be;
    if (!a) return;
    syscall(__NR_io_destroy, a->ctx);
    free(a->cbs), free(a->events), free(a);
    io->be = NULL;
}

const io_backend_ops pi2_io_aio_ops = {init, start, wait_done, fini};
