/* io/uring.c — the io_uring read backend, from the kernel ABI in <linux/io_uring.h> with raw system
 * calls (io_uring_setup, io_uring_enter) and the mmap'd SQ/CQ rings; no liburing.
 * Does: one IORING_OP_READ per slot, user_data = slot; SQ tail published with release, CQ tail read
 *       with acquire. SQEs the kernel did not take yet stay queued and go with the next enter.
 * Does not: decide whether io_uring may be called (probe.c; pi2_io_open refuses it before). */
#define _GNU_SOURCE
#include "io.h"
#include "../internal.h"

#include <errno.h>
#include <linux/io_uring.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct {
    int ring_fd;
    unsigned *sq_head, *sq_tail, *sq_mask, *sq_array, sq_entries;
    unsigned *cq_head, *cq_tail, *cq_mask;
    struct io_uring_sqe *sqes;
    struct io_uring_cqe *cqes;
    void *sq_ptr, *cq_ptr;
    size_t sq_size, cq_size, sqes_size;
    unsigned pending;          /* SQEs in the ring the kernel has not consumed */
} uring;

static int sys_setup(unsigned entries, struct io_uring_params *p) {
    return (int)syscall(__NR_io_uring_setup, entries, p);
}
static int sys_enter(int fd, unsigned to_submit, unsigned min_complete, unsigned flags) {
    return (int)syscall(__NR_io_uring_enter, fd, to_submit, min_complete, flags, NULL, 0);
}

static void unmap(uring *u) {
    if (u->sqes && u->sqes != MAP_FAILED) munmap(u->sqes, u->sqes_size);
    if (u->cq_ptr && u->cq_ptr != MAP_FAILED && u->cq_ptr != u->sq_ptr) munmap(u->cq_ptr, u->cq_size);
    if (u->sq_ptr && u->sq_ptr != MAP_FAILED) munmap(u->sq_ptr, u->sq_size);
    if (u->ring_fd >= 0) close(u->ring_fd);
}

static pi2_status init(pi2_io *io) {
    uring *u = calloc(1, sizeof *u);
    if (!u) return pi2_set_error(PI2_ERR_NOMEM, "no memory for an io_uring");
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    u->ring_fd = sys_setup((unsigned)io->qd, &p);
    if (u->ring_fd < 0) {
        int e = errno;
        free(u);
        return pi2_set_error(PI2_ERR_UNSUPPORTED, "io_uring_setup: %s", strerror(e));
    }
    u->sq_size = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    u->cq_size = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    if (p.features & IORING_FEAT_SINGLE_MMAP) {
        if (u->cq_size > u->sq_size) u->sq_size = u->cq_size;
        u->cq_size = u->sq_size;
    }
    u->sq_ptr = mmap(NULL, u->sq_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, u->ring_fd, IORING_OFF_SQ_RING);
    u->cq_ptr = (p.features & IORING_FEAT_SINGLE_MMAP) ? u->sq_ptr
              : mmap(NULL, u->cq_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, u->ring_fd, IORING_OFF_CQ_RING);
    u->sqes_size = p.sq_entries * sizeof(struct io_uring_sqe);
    u->sqes = mmap(NULL, u->sqes_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, u->ring_fd, IORING_OFF_SQES);
    if (u->sq_ptr == MAP_FAILED || u->cq_ptr == MAP_FAILED || u->sqes == MAP_FAILED) {
        int e = errno;
        unmap(u);
        free(u);
        return pi2_set_error(PI2_ERR_UNSUPPORTED, "io_uring: cannot map the rings: %s", strerror(e));
    }
    char *sq = u->sq_ptr, *cq = u->cq_ptr;
    u->sq_head = (unsigned *)(sq + p.sq_off.head);
    u->sq_tail = (unsigned *)(sq + p.sq_off.tail);
    u->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    u->sq_array = (unsigned *)(sq + p.sq_off.array);
    u->sq_entries = p.sq_entries;
    u->cq_head = (unsigned *)(cq + p.cq_off.head);
    u->cq_tail = (unsigned *)(cq + p.cq_off.tail);
    u->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    u->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
    io->be = u;
    return PI2_OK;
}

/* Hand queued SQEs to the kernel, optionally waiting for min completions. <0: a pi2_status. */
static int enter(uring *u, unsigned min_complete) {
    for (;;) {
        int r = sys_enter(u->ring_fd, u->pending, min_complete, min_complete ? IORING_ENTER_GETEVENTS : 0);
        if (r >= 0) {
            u->pending -= (unsigned)r <= u->pending ? (unsigned)r : u->pending;
            return 0;
        }
        if (errno == EINTR) continue;
        if ((errno == EAGAIN || errno == EBUSY) && !min_complete) return 0;   /* retried at the next enter */
        if (errno == EAGAIN || errno == EBUSY) { min_complete = 0; continue; }
        return pi2_set_io_error(errno, "", "io_uring_enter: %s", strerror(errno));
    }
}

static int32_t start(pi2_io *io, const int32_t *slots, int32_t n) {
    uring *u = io->be;
    unsigned head = __atomic_load_n(u->sq_head, __ATOMIC_ACQUIRE);
    unsigned tail = *u->sq_tail;
    int32_t k = 0;
    for (; k < n && tail - head < u->sq_entries; k++, tail++) {
        const pi2_io_request *r = &io->slots[slots[k]].req;
        unsigned idx = tail & *u->sq_mask;
        struct io_uring_sqe *sqe = &u->sqes[idx];
        memset(sqe, 0, sizeof *sqe);
        sqe->opcode = IORING_OP_READ;
        sqe->fd = io->fd;
        sqe->addr = (uint64_t)(uintptr_t)r->dest;
        sqe->len = (uint32_t)r->length;
        sqe->off = r->offset;
        sqe->user_data = (uint64_t)slots[k];
        u->sq_array[idx] = idx;
    }
    __atomic_store_n(u->sq_tail, tail, __ATOMIC_RELEASE);
    u->pending += (unsigned)k;
    io->n_started += k;
    int st = enter(u, 0);
    return st < 0 ? st : k;
}

static int32_t harvest(pi2_io *io, uring *u) {
    unsigned head = *u->cq_head, tail = __atomic_load_n(u->cq_tail, __ATOMIC_ACQUIRE);
    int32_t got = 0;
    for (; head != tail; head++, got++) {
        const struct io_uring_cqe *c = &u->cqes[head & *u->cq_mask];
        io->n_started--;
        io_finish(io, (int32_t)c->user_data, c->res);
    }
    __atomic_store_n(u->cq_head, head, __ATOMIC_RELEASE);
    return got;
}

static pi2_status wait_done(pi2_io *io, int32_t min) {
    uring *u = io->be;
    if (u->pending) {
        int st = enter(u, 0);
        if (st < 0) return (pi2_status)st;
    }
    int32_t got = harvest(io, u);
    while (got < min) {
        int st = enter(u, (unsigned)(min - got));
        if (st < 0) return (pi2_status)st;
        got += harvest(io, u);
    }
    return PI2_OK;
}

static void fini(pi2_io *io) {
    uring *u = io->be;
    if (!u) return;
    unmap(u);
    free(u);
    io->be = NULL;
}

const io_backend_ops pi2_io_uring_ops = {init, start, wait_done, fini};
