/* cache/experts.h — the expert cache of a streamed Mixture-of-Experts context (experts.c): where each expert's
 * slices of ffn_{gate,up,down}_exps are in a plain GGUF (one contiguous span each: expert e of a {n_in, n_out, X}
 * tensor is n_out rows from data + e·n_out·row_bytes), resident hot experts, and an LRU of cold expert slots
 * (slots.c, one "cluster" per expert). A slot holds the three slices of one expert, each read as the 4 KiB-aligned
 * span enclosing it at a fixed place in the slot; the slice's rows start at slot + span_at[w] + (off - aligned off).
 * A converted file's layer (pi2/model/expert_bundles.py) has two slices: the gate rows and the expert's up/down
 * bundle records (its up rows and, down_at bytes into each record, its down rows), so a slot is two spans.
 * Hot experts are learned while running too (experts_learn.c): the cold slots of the most routed experts are pinned.
 * Does not: decide what to read when (csrc/pipeline/experts.c), compute (csrc/ffn/moe_stream.c) or choose sizes
 * (the planner, pi2/plan/experts.py). */
#ifndef PI2_CACHE_EXPERTS_H
#define PI2_CACHE_EXPERTS_H
#include <stdint.h>

#include "cache/slots.h"
#include "model.h"

enum { PI2_EXPERT_GATE = 0, PI2_EXPERT_UP = 1, PI2_EXPERT_DOWN = 2, PI2_EXPERT_SLICES = 3 };
enum { PI2_EXPERT_CLUSTER = 8 };   /* neurons of a converted file's bundle cluster (a slot's unit of presence) */

typedef struct {
    int64_t off[PI2_EXPERT_SLICES];     /* file offset of expert 0's slice of gate, up, down (0: no experts) */
    int64_t bytes[PI2_EXPERT_SLICES];   /* bytes of one expert's slice (down 0 in a converted file's layer) */
    int64_t down_at;                    /* a converted file (up/down bundles): the up slice is the expert's bundle
                                         * records and its down rows start down_at bytes after its up rows; else 0 */
    int64_t cl_bytes;                   /* ... and a cluster of PI2_EXPERT_CLUSTER records is cl_bytes long */
} pi2_expert_region;

typedef struct pi2_expert_cache {
    int32_t n_layer, n_expert;
    pi2_expert_region *layers;          /* [n_layer] */
    int64_t span_at[PI2_EXPERT_SLICES]; /* where each slice's span starts in a slot */
    size_t slot_bytes;
    pi2_slots slots;                    /* cold slots: (layer, expert) */
    int32_t *hot_of;                    /* [n_layer][n_expert] the hot record holding the expert, or -1 */
    int32_t n_hot;
    uint8_t *hot_arena;                 /* [n_hot] records of slot_bytes, 4 KiB-aligned */
    uint8_t *arena;                     /* [slots.n_slots] slots of slot_bytes, 4 KiB-aligned */
    int32_t n_cl;                       /* bundle clusters per expert of a converted file's layer (0: none) */
    uint8_t *present;                   /* [slots.n_slots][n_cl] 1: the cluster's records are read or being read
                                         * into the slot (its gate rows always are while it holds an expert) */
    int64_t hot, hits, misses, bytes_read, early, early_unused;   /* statistics (per layer and token step) */
    /* learned hot experts (experts_learn.c) */
    int32_t n_learn;                    /* cold slots that may be pinned (0: not learning) */
    float *score;                       /* [n_layer][n_expert] rows routed, halved every PI2_EXPERT_HALF_LIFE tokens
                                         * (learning, or under a cap: its evictions; else NULL) */
    uint8_t *want;                      /* [n_layer][n_expert] 1: among the n_learn most routed cold experts */
    void *order;                        /* [n_layer·n_expert] scratch of the choice */
    int64_t learn_tokens;               /* tokens routed since the cache was made */
    int64_t pinned_hits;                /* of hits: found in a pinned slot */
    /* bytes held (slots sized to what is read: held.c) */
    int64_t cap;                        /* > 0: the cold slots hold at most this many bytes read, but for the slots
                                         * of the current step; 0: no limit but the slot count */
    int64_t held_total;                 /* bytes of the cold slots' pages reads have filled (resident) */
    int64_t *held;                      /* [slots.n_slots] ... of each slot */
    uint8_t *pages;                     /* [slots.n_slots][page_words] bit per 4 KiB page of the slot: filled */
    int32_t page_words;                 /* bytes of a slot's page bitmap */
    int32_t n_resident;                 /* slots with pages (held > 0) */
    int64_t *mark;                      /* [slots.n_slots] the step that last used the slot (epoch: in use) */
    int64_t epoch;                      /* the current step (a layer's need; the next one's guesses are epoch + 1) */
    int64_t partial_hits, cl_need, cl_found, evicted;   /* statistics */
    int32_t *pre;                       /* [n_layer][n_expert] leading clusters read with the gate rows, or NULL */
} pi2_expert_cache;

/* 1 when layer il has streamed experts. */
static inline int pi2_expert_layer(const pi2_expert_cache *ec, int32_t il) { return ec->layers[il].bytes[0] > 0; }

/* 1 when layer il reads slice w (a converted file's layer has no down slice of its own). */
static inline int pi2_expert_has_slice(const pi2_expert_cache *ec, int32_t il, int32_t w) {
    return ec->layers[il].bytes[w] > 0;
}

/* File span [*start, *end) of slice w of expert e of layer il, 4 KiB-aligned; *need: where its bytes end. */
void pi2_expert_span(const pi2_expert_cache *ec, int32_t il, int32_t e, int32_t w, int64_t *start, int64_t *end,
                     int64_t *need);
/* The rows of slice w of expert e of layer il in a record (a slot or a hot record) at `rec`; in a converted file's
 * layer, w = DOWN gives the down rows inside the bundle records (the up rows + down_at). */
const uint8_t *pi2_expert_rows_in(const pi2_expert_cache *ec, const uint8_t *rec, int32_t il, int32_t e, int32_t w);
static inline uint8_t *pi2_expert_slot(const pi2_expert_cache *ec, int32_t slot) {
    return ec->arena + (size_t)slot * ec->slot_bytes;
}
static inline uint8_t *pi2_expert_present(const pi2_expert_cache *ec, int32_t slot) {
    return ec->present + (size_t)slot * (size_t)ec->n_cl;
}
/* File span [*start, *end) (4 KiB-aligned, inside the bundle slice's span) of clusters [c0, c1) of expert e's bundle
 * records in layer il; *need: where the bytes it must hold end; [*full0, *full1): the clusters it holds whole. */
void pi2_expert_cluster_span(const pi2_expert_cache *ec, int32_t il, int32_t e, int32_t c0, int32_t c1, int64_t *start,
                             int64_t *end, int64_t *need, int32_t *full0, int32_t *full1);
static inline uint8_t *pi2_expert_hot_rec(const pi2_expert_cache *ec, int32_t h) {
    return ec->hot_arena + (size_t)h * ec->slot_bytes;
}

/* Bytes of one expert slot of m (0 and PI2_ERR_UNSUPPORTED when m has no expert tensors to stream). */
pi2_status pi2_expert_slot_bytes(const pi2_model *m, int64_t *out);
/* The regions, n_slots cold slots and the hot records of the experts hot[il·X + e] != 0 (NULL: none); the hot
 * records are filled by the caller (pi2_cache_create). PI2_ERR_NOMEM, PI2_ERR_INVALID, PI2_ERR_UNSUPPORTED. */
pi2_status pi2_expert_cache_init(pi2_expert_cache *ec, const pi2_model *m, int32_t n_slots, const uint8_t *hot);
void pi2_expert_cache_free(pi2_expert_cache *ec);

/* Slots sized to what is read (experts_held.c). Under a cap, a slot's resident pages are only the ones reads filled;
 * the least recently used slots give their pages back (MADV_DONTNEED) to keep the cap, so it holds as many experts
 * as their read bytes allow (a converted file: gate rows and only the clusters tokens opened), not as many as whole
 * slots fit. A slot taken for another expert keeps its pages (its reads land in pages already there: no faults).
 * Under a cap the pages that go are those of the least routed expert (the decayed counts of experts_learn.c, kept
 * under a cap whether or not it learns), the least recently used of equals: an LRU alone forgets an expert routed
 * often but not in the last few tokens before one routed once (the bench's 12-layer file at 0.40: 50 → 60 % hits).
 * pi2_expert_take: a slot for expert e of layer il, not in use (its old expert forgotten): under a cap, the least
 * recently used slot without pages while another slot's worth of pages fits, else the slot with pages not in use
 * of the least routed expert (reused); without a cap the LRU's tail; forget: the slot holds no expert; charge: `len`
 * bytes are being read into `slot` at `dest`, then the slots with pages not in use (mark < epoch) of the least routed
 * experts give their pages back while the slots hold more than the cap (the learned pinned ones last);
 * room: how many whole experts a step may need at once. */
int32_t pi2_expert_take(pi2_expert_cache *ec, int32_t il, int32_t e);
void pi2_expert_forget(pi2_expert_cache *ec, int32_t slot);
void pi2_expert_charge(pi2_expert_cache *ec, int32_t slot, const uint8_t *dest, int64_t len);
int32_t pi2_expert_room(const pi2_expert_cache *ec);
/* Set the cap (bytes, 0: none) of a cache just made: the slots' pages not read yet are never touched. */
void pi2_expert_set_cap(pi2_expert_cache *ec, int64_t cap);

/* Learned hot experts (experts_learn.c). Every routed row counts for its expert; at each token step the n_learn
 * most routed cold experts (decayed counts) are wanted, and a wanted expert's slot is pinned (kept out of the LRU)
 * while it holds it; an expert no longer wanted goes back to the LRU's tail. n_learn = n_slots - 2·k (at least k
 * slots stay in the LRU: a step's misses and the next layer's guesses). on 0: the slots stay a plain LRU. */
enum { PI2_EXPERT_HALF_LIFE = 256 };
pi2_status pi2_expert_learn_init(pi2_expert_cache *ec, int32_t k, int32_t on);
/* A step of layer il routed rows[e] rows to each expert e of experts[0..n). */
void pi2_expert_learn_rows(pi2_expert_cache *ec, int32_t il, const int32_t *experts, const int32_t *rows, int32_t n);
/* A step of n_tok tokens begins (at the first layer with experts): choose the wanted experts again. */
void pi2_expert_learn_step(pi2_expert_cache *ec, int32_t n_tok);
/* Expert e of layer il is now in `slot` (found or being read): pin the slot when the expert is wanted. */
static inline void pi2_expert_learn_use(pi2_expert_cache *ec, int32_t slot, int32_t il, int32_t e) {
    if (ec->n_learn && ec->want[(size_t)il * ec->n_expert + e] && ec->slots.n_slots - ec->slots.n_list < ec->n_learn)
        pi2_slots_pin(&ec->slots, slot);
}

#endif
