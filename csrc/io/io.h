/* io/io.h — the internal interface between io.c (open, validation, slots, completions) and the
 * read backends (uring.c, aio.c, pread_pool.c, mmap.c). Not exposed to Python: pi2.h has the
 * public pi2_io_* entry points.
 * A backend sees only valid requests (aligned, in slots io.c owns) and reports each one finished
 * with io_finish(io, slot, res): res = bytes read or -errno, exactly once per started slot. */
#ifndef PI2_IO_H
#define PI2_IO_H
#include "../pi2.h"

#include <stdint.h>
#include <sys/syscall.h>

typedef struct {
    pi2_status (*init)(pi2_io *io);                     /* allocate rings/threads for io->qd slots */
    /* Start n slots (indices into io->slots); return how many were taken (the first ones; < n only
     * when the kernel is out of room, which wait then makes). A slot the kernel refused on its own, or
     * a synchronous backend's read, is finished at once with io_finish. The backend keeps
     * io->n_started (started, not finished). Negative: a pi2_status for the whole call. */
    int32_t (*start)(pi2_io *io, const int32_t *slots, int32_t n);
    /* Block until at least `min` started slots have finished (0: finish what is ready, no wait). */
    pi2_status (*wait)(pi2_io *io, int32_t min);
    void (*fini)(pi2_io *io);
} io_backend_ops;

typedef struct {
    pi2_io_request req;
    int32_t next_free;     /* free list link (-1: end) */
} io_slot;

struct pi2_io {
    int fd;                     /* the file, O_DIRECT when direct */
    int32_t backend;            /* pi2_io_backend */
    int32_t direct;             /* 1: O_DIRECT in effect */
    int32_t drop_cache;         /* buffered: posix_fadvise(DONTNEED) each range read */
    int32_t qd;                 /* slots */
    int64_t size;               /* file size at open */
    const io_backend_ops *ops;
    void *be;                   /* backend state */
    io_slot *slots;             /* [qd] */
    int32_t free_head;
    int32_t in_flight;          /* slots taken: started, or finished but not reaped */
    int32_t n_started;          /* started and not yet finished */
    pi2_io_completion *done;    /* [qd] ring of finished, unreaped completions */
    int32_t done_head, n_done;
    char note[192];             /* how the file was opened, for pi2_io_get_info */
};

/* io_uring's system call numbers are the same on every architecture pi2 builds for; older C
 * libraries' headers may not name them. */
#ifndef __NR_io_uring_setup
#define __NR_io_uring_setup 425
#endif
#ifndef __NR_io_uring_enter
#define __NR_io_uring_enter 426
#endif

extern const io_backend_ops pi2_io_uring_ops, pi2_io_aio_ops, pi2_io_pread_ops, pi2_io_mmap_ops;

/* Record slot `slot` as finished with `res` (bytes or -errno) and free its slot for reaping. */
void io_finish(pi2_io *io, int32_t slot, int64_t res);

/* mmap backend: drop the mapping's pages from this process, so the page cache can let them go. */
void io_mmap_release(pi2_io *io);

/* map_guard.c: a SIGBUS on a guarded read-only mapping (file truncated, device error) patches in a zero page and is
 * counted instead of killing the process. add returns an id (-1: not guarded; every call below takes -1); fd is
 * duplicated (its size tells truncation from EIO); check sets the error naming the file once the mapping faulted. */
int io_map_guard_add(const void *base, size_t size, const char *path, int fd);
void io_map_guard_remove(int id);
int io_map_guard_faults(int id);
int io_map_guard_shrunk(int id);   /* 1: the file is now shorter than its mapping */
pi2_status io_map_guard_check(int id);

/* Set by a probe that ran io_uring in a child and saw it work; pi2_io_open refuses uring before. */
int io_uring_cleared(void);
void io_uring_set_cleared(void);

#endif
