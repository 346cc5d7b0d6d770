/* io/bench.c — pi2_io_bench: the timed loop of the device read-throughput profile (pi2/plan/profile.py
 * drives it): random block-sized reads at aligned offsets, a fixed number in flight, for a set time.
 * Does not: choose block sizes or cache results (Python). */
#define _GNU_SOURCE
#include "io.h"
#include "../internal.h"

#include <stdlib.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t next_rand(uint64_t *s) {   /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

pi2_status pi2_io_bench(pi2_io *io, uint64_t block, int32_t qd, double seconds, uint64_t seed,
                        pi2_io_bench_result *out) {
    if (!io || !out) return pi2_set_error(PI2_ERR_INVALID, "NULL handle or output");
    *out = (pi2_io_bench_result){0};
    if (block == 0 || block % PI2_IO_ALIGN || block > (uint64_t)io->size || block > (1u << 30))
        return pi2_set_error(PI2_ERR_INVALID, "block %llu is not a multiple of 4096 within the file (%lld bytes)",
                             (unsigned long long)block, (long long)io->size);
    if (qd < 1 || qd > io->qd || qd > 256)
        return pi2_set_error(PI2_ERR_INVALID, "queue depth %d is not in 1..%d", qd, io->qd < 256 ? io->qd : 256);
    if (!(seconds > 0 && seconds <= 600)) return pi2_set_error(PI2_ERR_INVALID, "seconds must be in (0, 600]");
    if (io->in_flight) return pi2_set_error(PI2_ERR_INVALID, "pi2_io_bench: requests already in flight");
    char *bufs = NULL;
    if (posix_memalign((void **)&bufs, PI2_IO_ALIGN, block * (uint64_t)qd) != 0)
        return pi2_set_error(PI2_ERR_NOMEM, "no memory for %d buffers of %llu bytes", qd, (unsigned long long)block);
    if (!io->direct) pi2_io_drop_cache(io);
    const uint64_t n_pos = ((uint64_t)io->size - block) / PI2_IO_ALIGN + 1;
    int32_t free_buf[256], n_free = qd;
    for (int32_t i = 0; i < qd; i++) free_buf[i] = i;
    pi2_io_completion got[256];
    pi2_status st = PI2_OK;
    const double t0 = now_s(), t_end = t0 + seconds;
    int running = 1;
    while (st == PI2_OK && (running || io->in_flight)) {
        if (running && n_free > 0) {   /* refill the queue with one submit */
            pi2_io_request r[256];
            for (int32_t i = 0; i < n_free; i++) {
                int32_t b = free_buf[n_free - 1 - i];
                r[i] = (pi2_io_request){.offset = next_rand(&seed) % n_pos * PI2_IO_ALIGN, .length = block,
                                        .dest = bufs + (uint64_t)b * block, .user = (uint64_t)b};
            }
            int32_t acc = 0;
            st = pi2_io_submit(io, r, n_free, &acc);
            n_free -= acc;
        }
        int32_t k = 0;
        if (st == PI2_OK) st = pi2_io_reap(io, got, qd, 1, &k);
        for (int32_t i = 0; i < k; i++) {
            free_buf[n_free++] = (int32_t)got[i].user;
            out->reads++;
            out->bytes += got[i].nbytes;
            out->errors += got[i].error != 0;
        }
        if (running && now_s() >= t_end) running = 0;
    }
    out->seconds = now_s() - t0;
    free(bufs);
    return st;
}
