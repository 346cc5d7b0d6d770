/* model_map.c — a model file's bytes for pi2_model_load: mmap the file (or a split model's parts, in one reserved
 * range) read-only under the SIGBUS guard (io/map_guard.c), or read it into memory (no_mmap); check the guards later.
 * Does not: check or place tensors (model.c, model_check.c); unmap (pi2_model_free). */
#define _GNU_SOURCE
#include "model.h"
#include "internal.h"
#include "io/io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define PART_ALIGN 65536u         /* a split model's part bases: a page multiple on every kernel pi2 runs on */

/* The file's bytes in anonymous memory, read-only once read (no_mmap). */
static pi2_status read_file(pi2_model *m, int fd, size_t size, const char *path) {
    uint8_t *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return pi2_set_error(PI2_ERR_NOMEM, "out of memory reading %s (%zu bytes)", path, size);
    for (size_t off = 0; off < size;) {
        const size_t want = size - off < ((size_t)8 << 20) ? size - off : ((size_t)8 << 20);
        const ssize_t got = pread(fd, p + off, want, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            const int e = got < 0 ? errno : 0;
            munmap(p, size);
            return pi2_set_io_error(e, path, "cannot read %s: %s", path, e ? strerror(e) : "the file is shorter than it was");
        }
        off += (size_t)got;
    }
    mprotect(p, size, PROT_READ);
    m->map = p;
    m->map_size = size;
    m->in_memory = 1;
    return PI2_OK;
}

static pi2_status map_file(pi2_model *m, const char *path, int no_mmap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return pi2_set_io_error(errno, path, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    pi2_status s = PI2_OK;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
        s = pi2_set_io_error(0, path, "%s is not a readable, non-empty regular file", path);
    } else if (no_mmap) {
        s = read_file(m, fd, (size_t)st.st_size, path);
    } else {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) s = pi2_set_io_error(errno, path, "cannot map %s: %s", path, strerror(errno));
        else { m->map = p; m->map_size = (size_t)st.st_size; m->map_guard = io_map_guard_add(p, m->map_size, path, fd); }
    }
    close(fd);
    return s;
}

/* The parts of a split model, each at its base inside one reserved range (PROT_NONE between parts). */
pi2_status model_map_parts(pi2_model *m, const char *const *paths, const uint64_t *bases, int32_t n, int no_mmap) {
    if (n == 1) {
        if (bases[0] != 0) return pi2_set_error(PI2_ERR_INVALID, "the first part's base must be 0");
        m->n_parts = 1;
        return map_file(m, paths[0], no_mmap);
    }
    if (no_mmap) return pi2_set_error(PI2_ERR_UNSUPPORTED, "--no-mmap does not read split models yet: merge the parts or drop --no-mmap");
    int *fds = malloc((size_t)n * sizeof *fds);
    uint64_t *sizes = calloc((size_t)n, sizeof *sizes);   /* zeroed: -O3 cannot see every part is stat-ed first */
    if (!fds || !sizes || !(m->part_guards = malloc((size_t)(n - 1) * sizeof *m->part_guards))) {
        free(fds); free(sizes);
        return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the model's parts");
    }
    for (int32_t k = 0; k < n - 1; k++) m->part_guards[k] = -1;
    pi2_status s = PI2_OK;
    int32_t opened = 0;
    for (; opened < n && !s; opened++) {
        const char *path = paths[opened];
        struct stat st;
        if (!path) { s = pi2_set_error(PI2_ERR_INVALID, "NULL part path"); break; }
        if ((fds[opened] = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
            s = pi2_set_io_error(errno, path, "cannot open %s: %s", path, strerror(errno));
            break;
        }
        if (fstat(fds[opened], &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0)
            s = pi2_set_io_error(0, path, "%s is not a readable, non-empty regular file", path);
        sizes[opened] = (uint64_t)st.st_size;
    }
    for (int32_t k = 0; k < n && !s; k++)
        if ((k == 0 && bases[0] != 0) || bases[k] % PART_ALIGN || (k && bases[k] < bases[k - 1] + sizes[k - 1]) ||
            bases[k] > (uint64_t)SIZE_MAX - sizes[k])
            s = pi2_set_error(PI2_ERR_INVALID, "part %d's base %llu is not aligned or overlaps the part before",
                              (int)k, (unsigned long long)bases[k]);
    if (!s) {
        const size_t span = (size_t)(bases[n - 1] + sizes[n - 1]);
        uint8_t *base = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (base == MAP_FAILED) {
            s = pi2_set_error(PI2_ERR_NOMEM, "cannot reserve %zu bytes of addresses for the model's parts", span);
        } else {
            m->map = base;
            m->map_size = span;
            m->n_parts = n;
            for (int32_t k = 0; k < n && !s; k++) {
                void *p = mmap(base + bases[k], (size_t)sizes[k], PROT_READ, MAP_SHARED | MAP_FIXED, fds[k], 0);
                if (p == MAP_FAILED) {
                    s = pi2_set_io_error(errno, paths[k], "cannot map %s: %s", paths[k], strerror(errno));
                    break;
                }
                const int g = io_map_guard_add(p, (size_t)sizes[k], paths[k], fds[k]);
                if (k == 0) m->map_guard = g;
                else m->part_guards[k - 1] = g;
            }
        }
    }
    for (int32_t k = 0; k < opened && k < n; k++)
        if (fds[k] >= 0) close(fds[k]);
    free(fds);
    free(sizes);
    return s;
}

pi2_status model_check_maps(const pi2_model *m) {
    pi2_status s = io_map_guard_check(m->map_guard);
    for (int32_t k = 1; k < m->n_parts && !s; k++) s = io_map_guard_check(m->part_guards[k - 1]);
    return s;
}
