/* cache_parts.h — the neuron cache's state (internal to cache.c and cache_read.c).
 * The cache streams one or two parts of every FFN layer: the bundles (up and down rows of a neuron in one
 * record) and, when the stream params ask for it, the gate rows. Each part has per layer a region of the file
 * (records of bb bytes from rec0, neuron order), a resident hot prefix of whole clusters, and its own arena
 * (hot prefixes, then cold cluster slots kept by an LRU, cache_pool.c). A row of neuron i at file offset f is
 * at arena + delta(cluster of i) + f while its cluster is present. */
#ifndef PI2_CACHE_PARTS_H
#define PI2_CACHE_PARTS_H
#include <stdint.h>
#include <time.h>

#include "cache.h"
#include "cache_pool.h"

typedef struct {
    int64_t rec0, bb;          /* file offset of neuron 0's record; record stride */
    int64_t row_off[2];        /* file offsets of neuron 0's rows: bundles up, down; gate rows [0] only */
    int32_t hot_cl;            /* resident clusters */
    int32_t early_cl;          /* cold clusters after the hot prefix read before the layer's attention */
    int64_t hot_delta;         /* arena + hot_delta + file offset = the byte, for hot clusters */
} region_t;

typedef struct {
    const char *what;          /* "bundles", "gate rows" (messages) */
    region_t *L;               /* [n_layer] */
    pi2_slots slots;           /* which cold cluster each slot holds */
    size_t slot_bytes, slots_off, arena_bytes, hot_bytes;
    uint8_t *arena;            /* 4 KiB-aligned: hot prefixes, then the slots */
    int64_t *delta;            /* [n_cl] the current layer's cluster deltas */
    pi2_io_request *reqs;      /* [n_cl] the current layer's misses */
    int32_t n_req, n_sub, n_wait;   /* misses, of which submitted, of which reaped */
    int32_t *g_pending;        /* [groups] the current layer's reads each group waits for */
    int32_t cur;               /* current layer */
    int32_t early_layer;       /* the layer whose early reads are in q->reqs (not yet begun), or -1 */
    int32_t flags_layer;       /* the layer `early` describes, or -1 */
    uint8_t *early;            /* [n_cl] 1: read early and not needed (yet), 2: read early and needed */
    double t_submit;
    int64_t hot, hits, misses, bytes_read, layer_loads;   /* this part's statistics */
    int32_t ready;             /* the layer whose whole region was read ahead and is not yet taken, or -1 */
} part_t;

typedef struct {               /* whole-layer reads submitted ahead of their FFN (cache_layer.c) */
    int32_t layer;             /* the layer they read, or -1 */
    uint32_t parts;            /* bit p: part p of the layer is being read */
    int32_t n_req, n_sub, n_wait, cap;
    pi2_io_request *reqs;      /* [cap]: user = part << 32 | index */
    double t_submit;
} ahead_t;

struct pi2_cache {
    const pi2_model *m;
    int32_t C, n_layer, n_ff, n_cl, n_parts;   /* n_parts 2: the gate rows stream too */
    pi2_io *io;
    part_t part[2];            /* [PI2_PART_BUNDLES], [PI2_PART_GATE] */
    ahead_t ahead;
    pi2_cache_stats st;        /* the shared figures: tokens, reads, io_wait_s, read_s */
};

static inline double pi2_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int64_t down_a(int64_t x) { return x / PI2_IO_ALIGN * PI2_IO_ALIGN; }
static inline int64_t up_a(int64_t x) { return (x + PI2_IO_ALIGN - 1) / PI2_IO_ALIGN * PI2_IO_ALIGN; }

/* File span [*s, *e) of clusters [c0, c1) of region l, 4 KiB-aligned; *need: where its bytes end. */
static inline void span(const pi2_cache *k, const region_t *l, int32_t c0, int32_t c1, int64_t *s, int64_t *e,
                        int64_t *need) {
    const int64_t n1 = (int64_t)c1 * k->C < k->n_ff ? (int64_t)c1 * k->C : k->n_ff;
    *s = down_a(l->rec0 + (int64_t)c0 * k->C * l->bb);
    *e = up_a(l->rec0 + n1 * l->bb);
    if (need) *need = l->rec0 + n1 * l->bb;
}

#define PI2_LOAD_CHUNK (1u << 20)   /* bytes per request of a whole-layer read */

/* Count a completed large read of part q (request r, completion c) and check that its bytes up to `need` arrived:
 * PI2_ERR_IO if not, with the message set when `report` (cache_read.c). */
pi2_status pi2_cache_check_read(pi2_cache *k, part_t *q, const pi2_io_request *r, const pi2_io_completion *c,
                                int64_t need, int report);
/* Read [s, e) of the file into dst in large requests; the bytes up to `need` must arrive (cache_read.c). */
pi2_status pi2_cache_read_range(pi2_cache *k, part_t *q, int64_t s, int64_t e, int64_t need, uint8_t *dst);
/* Wait for every part's unreaped cluster reads and forget their clusters (cache_read.c). */
void pi2_cache_settle_clusters(pi2_cache *k);
/* Size the whole-layer reads' request list (cache_layer.c); PI2_ERR_NOMEM. */
pi2_status pi2_cache_ahead_init(pi2_cache *k);
/* Wait for the whole-layer reads in flight, keep what landed, forget the rest (cache_layer.c). */
void pi2_cache_settle_ahead(pi2_cache *k);

#endif
