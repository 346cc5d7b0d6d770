/* io/map_guard.c — a read-only file mapping that faults (the file truncated under it, or the device failing a
 * read: SIGBUS) becomes an I/O error naming the file instead of killing the process.
 * Does: keep a table of guarded mappings (the model's, the mmap backend's); a SIGBUS handler that, for an address
 *       inside one of them, maps a zero page over the faulting page, counts the fault and returns, so the
 *       interrupted code goes on reading zeros; io_map_guard_check turns a counted fault into PI2_ERR_IO with the
 *       file, the offset and why (the file's size now when it shrank, EIO otherwise). A SIGBUS anywhere else goes
 *       to the handler installed before this one, or kills the process as it would have.
 * Does not: make the zeros right. Whoever reads guarded memory checks before handing out a result (pi2_decode
 *       before it returns logits, the mmap backend before it completes a read); a mapping that faulted stays
 *       zero-filled where it faulted, so its model must be loaded again.
 * Invariants: the handler takes no lock and calls only mmap and atomic loads/stores. */
#define _GNU_SOURCE
#include "io.h"
#include "../internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define N_GUARDS 64

typedef struct {
    _Atomic uintptr_t base;     /* 0: a free entry */
    size_t size;
    atomic_int faults;
    atomic_llong first;         /* offset of the first fault in the mapping */
    int fd;                     /* a duplicate of the mapped file's descriptor: its size after a fault */
    char path[256];
} guard;

static guard guards[N_GUARDS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction previous;
static int installed;
static uintptr_t page_size = 4096;

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    const uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < N_GUARDS; i++) {
        const uintptr_t b = atomic_load(&guards[i].base);
        if (!b || a < b || a >= b + guards[i].size) continue;
        const uintptr_t page = a & ~(page_size - 1);
        void *p = mmap((void *)page, (size_t)page_size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                       -1, 0);
        if (p == MAP_FAILED) break;       /* cannot patch it: die as without the guard */
        if (atomic_fetch_add(&guards[i].faults, 1) == 0) atomic_store(&guards[i].first, (long long)(a - b));
        return;
    }
    if ((previous.sa_flags & SA_SIGINFO) && previous.sa_sigaction) {
        previous.sa_sigaction(sig, si, uc);
    } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
        previous.sa_handler(sig);
    } else {                               /* default: the fault happens again on return and kills */
        struct sigaction dfl = {.sa_handler = SIG_DFL};
        sigemptyset(&dfl.sa_mask);
        sigaction(SIGBUS, &dfl, NULL);
    }
}

int io_map_guard_add(const void *base, size_t size, const char *path, int fd) {
    if (!base || !size) return -1;
    pthread_mutex_lock(&lock);
    if (!installed) {
        page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
        struct sigaction sa = {.sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER};
        sigemptyset(&sa.sa_mask);
        installed = sigaction(SIGBUS, &sa, &previous) == 0;
    }
    int id = -1;
    for (int i = 0; installed && i < N_GUARDS && id < 0; i++) {
        if (atomic_load(&guards[i].base)) continue;
        guard *g = &guards[i];
        g->size = size;
        g->fd = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
        snprintf(g->path, sizeof g->path, "%s", path ? path : "the mapped file");
        atomic_store(&g->faults, 0);
        atomic_store(&g->base, (uintptr_t)base);       /* published last: the handler sees a whole entry */
        id = i;
    }
    pthread_mutex_unlock(&lock);
    return id;                                         /* -1: table full, the mapping is not guarded */
}

void io_map_guard_remove(int id) {
    if (id < 0 || id >= N_GUARDS) return;
    pthread_mutex_lock(&lock);
    atomic_store(&guards[id].base, 0);
    if (guards[id].fd >= 0) close(guards[id].fd);
    guards[id].fd = -1;
    pthread_mutex_unlock(&lock);
}

int io_map_guard_faults(int id) {
    return id >= 0 && id < N_GUARDS ? atomic_load(&guards[id].faults) : 0;
}

int io_map_guard_shrunk(int id) {
    struct stat st;
    if (id < 0 || id >= N_GUARDS || guards[id].fd < 0 || fstat(guards[id].fd, &st) != 0) return 0;
    return (size_t)st.st_size < guards[id].size;
}

pi2_status io_map_guard_check(int id) {
    if (id < 0 || id >= N_GUARDS) return PI2_OK;
    const guard *g = &guards[id];
    struct stat st;
    if (!io_map_guard_faults(id)) {       /* no fault yet: a file that shrank fails now, not at the next page */
        if (g->fd >= 0 && fstat(g->fd, &st) == 0 && (size_t)st.st_size < g->size)
            return pi2_set_error(PI2_ERR_IO, "%s: the file was truncated to %lld bytes while in use (it had %lld): %s",
                                 g->path, (long long)st.st_size, (long long)g->size, strerror(ENODATA));
        return PI2_OK;
    }
    const long long off = atomic_load(&g->first);
    if (g->fd >= 0 && fstat(g->fd, &st) == 0 && (long long)st.st_size <= off)
        return pi2_set_error(PI2_ERR_IO, "%s: the file was truncated to %lld bytes while in use (byte %lld of its "
                             "mapping is gone: %s)", g->path, (long long)st.st_size, off, strerror(ENODATA));
    return pi2_set_error(PI2_ERR_IO, "%s: reading byte %lld of its mapping failed: %s (EIO)", g->path, off,
                         strerror(EIO));
}

int32_t pi2_map_guard_add(const void *base, uint64_t size, const char *path, int32_t fd) {
    return io_map_guard_add(base, (size_t)size, path, fd);
}

void pi2_map_guard_remove(int32_t id) { io_map_guard_remove(id); }

pi2_status pi2_map_guard_check(int32_t id) { return io_map_guard_check(id); }
