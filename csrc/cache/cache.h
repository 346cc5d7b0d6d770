/* cache/cache.h — the neuron cache of a streamed context (cache.c, read.c): the slots and the reads that fill them.
 * Each part of a layer (pi2_part: the bundles; the gate rows when they stream) lives in its part's arena: a
 * resident hot prefix per layer, then cold unit slots kept by an LRU (slots.c). A unit is a cluster of `cluster`
 * neurons; its record of neuron i at file offset f is at arena + delta + f while the unit is present, delta being
 * the hot prefix's (pi2_region.hot_delta) or its slot's (pi2_cache_slot_delta). The bundles' arena offsets stay
 * below 2 GiB so they fit the int32 index of axpy_group.
 * Does not: decide what to read when (csrc/pipeline/), compute (csrc/ffn/) or choose sizes (the planner). */
#ifndef PI2_CACHE_H
#define PI2_CACHE_H
#include <stdint.h>

#include "cache/experts.h"
#include "cache/slots.h"
#include "internal.h"
#include "model.h"

/* PI2_PART_EXPERTS: a MoE layer's experts (cache/experts.h), a unit per expert; kept apart from the neuron parts'
 * arrays (a MoE context streams no neuron part). */
enum { PI2_PART_BUNDLES = 0, PI2_PART_GATE = 1, PI2_N_PARTS = 2, PI2_PART_EXPERTS = PI2_N_PARTS };

typedef struct {               /* one part of one layer in the file */
    int64_t rec0, rec_bytes;   /* file offset of neuron 0's record; record stride */
    int64_t row_off[2];        /* file offsets of neuron 0's rows: bundles up, down; gate rows [0] only */
    int32_t hot_cl;            /* resident clusters */
    int32_t early_cl;          /* cold clusters after the hot prefix read before the layer's attention */
    int64_t hot_delta;         /* arena + hot_delta + file offset = the byte, for hot clusters */
} pi2_region;

typedef struct {
    const char *what;          /* "bundles", "gate rows" (messages) */
    pi2_region *layers;        /* [n_layer] */
    pi2_slots slots;           /* which cold cluster each slot holds */
    size_t slot_bytes, slots_off, arena_bytes, hot_bytes;
    uint8_t *arena;            /* 4 KiB-aligned: hot prefixes, then the slots */
    int64_t hot, hits, misses, bytes_read, layer_loads;   /* this part's statistics */
} pi2_part;

typedef struct pi2_cache {
    const pi2_model *m;
    int32_t cluster, n_layer, n_ff, n_cl, n_parts;   /* n_parts 2: the gate rows stream too */
    pi2_io *io;
    char *path;                /* the file (messages) */
    pi2_part part[PI2_N_PARTS];
    pi2_expert_cache *experts; /* a MoE file's experts (n_parts 0), or NULL */
    pi2_cache_stats st;        /* the shared figures: tokens, reads, io_wait_s, read_s, early and ahead counts */
} pi2_cache;

/* Open the file, size the arenas, read every hot prefix (PI2_ERR_IO, PI2_ERR_NOMEM, PI2_ERR_INVALID,
 * PI2_ERR_UNSUPPORTED: a layout the cache cannot stream). */
pi2_status pi2_cache_create(const pi2_model *m, const pi2_stream_params *p, pi2_cache **out);
void pi2_cache_free(pi2_cache *cache);
void pi2_cache_get_stats(const pi2_cache *cache, pi2_cache_stats *out);

/* Seconds on the monotonic clock. */
double pi2_now(void);

static inline int64_t pi2_align_down(int64_t x) { return x / PI2_IO_ALIGN * PI2_IO_ALIGN; }
static inline int64_t pi2_align_up(int64_t x) { return (x + PI2_IO_ALIGN - 1) / PI2_IO_ALIGN * PI2_IO_ALIGN; }

/* File span [*start, *end) of clusters [c0, c1) of region r, 4 KiB-aligned; *need: where its bytes end. */
static inline void pi2_cache_span(const pi2_cache *cache, const pi2_region *r, int32_t c0, int32_t c1, int64_t *start,
                                  int64_t *end, int64_t *need) {
    const int64_t n1 = (int64_t)c1 * cache->cluster < cache->n_ff ? (int64_t)c1 * cache->cluster : cache->n_ff;
    *start = pi2_align_down(r->rec0 + (int64_t)c0 * cache->cluster * r->rec_bytes);
    *end = pi2_align_up(r->rec0 + n1 * r->rec_bytes);
    if (need) *need = r->rec0 + n1 * r->rec_bytes;
}

/* A slot of a part: where its bytes are, and the delta that addresses a file offset inside the cluster it holds,
 * whose span starts at file offset `start`. */
static inline uint8_t *pi2_cache_slot(const pi2_part *part, int32_t slot) {
    return part->arena + part->slots_off + (size_t)slot * part->slot_bytes;
}
static inline int64_t pi2_cache_slot_delta(const pi2_part *part, int32_t slot, int64_t start) {
    return (int64_t)(part->slots_off + (size_t)slot * part->slot_bytes) - start;
}

#define PI2_LOAD_CHUNK (1u << 20)   /* bytes per request of a whole-layer read */

/* ---- reads (read.c) ---- */
/* Queue reads (pi2_io_submit); *accepted of them were taken. PI2_ERR_IO with the message set. */
pi2_status pi2_cache_submit(pi2_cache *cache, const pi2_io_request *reqs, int32_t n, int32_t *accepted);
/* Wait for at least one read and take up to max completions; the wait counts as io_wait_s. */
pi2_status pi2_cache_reap(pi2_cache *cache, pi2_io_completion *done, int32_t max, int32_t *got);
/* Wait for everything in flight and drop it (after an error). */
void pi2_cache_reap_all(pi2_cache *cache);
/* Count a completed read of a part (request r, completion c) and check that its bytes up to `need` arrived:
 * PI2_ERR_IO if not, with the message, errno and path set when `report`. */
pi2_status pi2_cache_check_read(pi2_cache *cache, pi2_part *part, const pi2_io_request *r, const pi2_io_completion *c,
                                int64_t need, int report);
/* Read [start, end) of the file into dst in large requests, now; the bytes up to `need` must arrive. */
pi2_status pi2_cache_read_range(pi2_cache *cache, pi2_part *part, int64_t start, int64_t end, int64_t need, uint8_t *dst);

#endif
