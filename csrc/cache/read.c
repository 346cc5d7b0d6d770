/* cache/read.c — the neuron cache's reads: queueing and reaping them through the flash I/O handle (the wait counted
 *       as I/O wait), checking a completion (bytes counted per part; a failure reported with its errno and the
 *       file), and reading a range now in large requests (hot prefixes, whole layers read on demand).
 * Does not: decide what to read or when (csrc/pipeline/), or which slot a cluster takes (slots.c). */
#define _GNU_SOURCE
#include "cache/cache.h"

#include <errno.h>
#include <string.h>
#include <time.h>

double pi2_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

pi2_status pi2_cache_submit(pi2_cache *cache, const pi2_io_request *reqs, int32_t n, int32_t *accepted) {
    *accepted = 0;
    return n > 0 ? pi2_io_submit(cache->io, reqs, n, accepted) : PI2_OK;
}

pi2_status pi2_cache_reap(pi2_cache *cache, pi2_io_completion *done, int32_t max, int32_t *got) {
    const double t0 = pi2_now();
    const pi2_status s = pi2_io_reap(cache->io, done, max, 1, got);
    cache->st.io_wait_s += pi2_now() - t0;
    return s;
}

void pi2_cache_reap_all(pi2_cache *cache) {
    pi2_io_completion done[64];
    int32_t got;
    while (pi2_io_in_flight(cache->io) > 0 && !pi2_io_reap(cache->io, done, 64, 1, &got)) {}
}

pi2_status pi2_cache_check_read(pi2_cache *cache, pi2_part *part, const pi2_io_request *req, const pi2_io_completion *done,
                                int64_t need, int report) {
    const int64_t want = (int64_t)req->offset + (int64_t)req->length <= need ? (int64_t)req->length
                                                                             : need - (int64_t)req->offset;
    cache->st.reads++;
    part->bytes_read += (int64_t)req->length;
    if (!(done->error && done->error != ENODATA) && done->nbytes >= want) return PI2_OK;
    if (!report) return PI2_ERR_IO;
    return pi2_set_io_error(done->error ? done->error : ENODATA, cache->path,
                            "reading %lld bytes of %s at offset %lld of %s: %s", (long long)req->length, part->what,
                            (long long)req->offset, cache->path, done->error ? strerror(done->error) : "short read");
}

pi2_status pi2_cache_read_range(pi2_cache *cache, pi2_part *part, int64_t start, int64_t end, int64_t need,
                                uint8_t *dst) {
    enum { BATCH = 64 };
    pi2_io_request reqs[BATCH];
    pi2_io_completion finished[BATCH];
    const double t0 = pi2_now();
    for (int64_t off = start; off < end;) {
        int32_t n = 0;
        for (; n < BATCH && off < end; n++, off += PI2_LOAD_CHUNK) {
            const int64_t len = end - off < PI2_LOAD_CHUNK ? end - off : PI2_LOAD_CHUNK;
            reqs[n] = (pi2_io_request){.offset = (uint64_t)off, .length = (uint64_t)len, .dest = dst + (off - start)};
        }
        pi2_status s = pi2_io_read_all(cache->io, reqs, n, finished);
        if (s) return s;
        for (int32_t i = 0; i < n; i++)
            if ((s = pi2_cache_check_read(cache, part, &reqs[i], &finished[i], need, 1))) return s;
    }
    const double dt = pi2_now() - t0;
    cache->st.io_wait_s += dt;
    cache->st.read_s += dt;
    return PI2_OK;
}
