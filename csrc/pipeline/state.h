/* pipeline/state.h — the pipeline's state, shared by its files (internal to csrc/pipeline/): pipeline.c (the plan
 * of each layer and the runs of ready groups), units.c (a token's unit reads: early, needed, reaped) and whole.c
 * (regions read whole, ahead of their FFN).
 * Invariants: one part's unit reads, or one layer's whole-region reads, are in flight at a time (each entry point
 * settles the other kind first); a slot whose read failed holds nothing; early reads belong to the layer whose
 * need comes next, and are reaped with its other reads whether the token needs them or not. */
#ifndef PI2_PIPELINE_STATE_H
#define PI2_PIPELINE_STATE_H
#include "pipeline/pipeline.h"

typedef struct {               /* one part's unit reads of the current layer (units.c) */
    int64_t *delta;            /* [n_cl] the current layer's cluster deltas (pi2_rows) */
    pi2_io_request *reqs;      /* [n_cl] the current layer's misses (and early reads) */
    int32_t n_req, n_sub, n_wait;   /* reads listed, of which submitted, of which reaped */
    int32_t *group_pending;    /* [n_groups] reads each group of the current layer waits for */
    int32_t layer;             /* the layer of reqs */
    int32_t early_layer;       /* the layer whose early reads are in reqs (not yet needed), or -1 */
    int32_t flags_layer;       /* the layer `early` describes, or -1 */
    uint8_t *early;            /* [n_cl] 1: read early and not needed (yet), 2: read early and needed */
    double t_submit;
    int32_t whole_ready;       /* the layer whose whole region was read ahead and is not yet taken, or -1 */
} unit_reads;

typedef struct {               /* whole-region reads submitted ahead of their FFN (whole.c) */
    int32_t layer;             /* the layer they read, or -1 */
    uint32_t parts;            /* bit p: part p of the layer is being read */
    int32_t n_req, n_sub, n_wait, cap;
    pi2_io_request *reqs;      /* [cap]: user = part << 32 | index */
    double t_submit;
} whole_reads;

typedef struct {               /* a MoE layer's expert reads (experts.c) */
    int32_t layer;             /* the layer of the reads in reqs, or -1 */
    pi2_io_request *reqs;      /* [cap]: user = the request's index */
    int32_t *req_e;            /* [cap] the expert each request reads for */
    int64_t *req_need;         /* [cap] where the bytes it must hold end (a short read at the file's end is fine) */
    int32_t cap;               /* n_expert · (3 + clusters per expert) */
    int32_t n_req, n_sub, n_wait;   /* reads listed, of which submitted, of which reaped */
    int32_t n_ahead;           /* experts guessed in reqs */
    int32_t partial;           /* a converted file's misses read the gate rows first, then the open clusters */
    int32_t *pending;          /* [n_expert] slices each listed expert of the layer still waits for */
    const uint8_t **rows[PI2_EXPERT_SLICES];   /* [n_expert] where each needed expert's slices are */
    uint8_t *ahead;            /* [n_expert] 1: read ahead (a guess) and not needed yet, 2: ... and needed */
    uint8_t *found;            /* [n_expert] 1: the step found the expert in a slot (a hit; partial if it reads) */
    int32_t ahead_layer;       /* the layer whose guessed experts are in reqs, or -1 */
    int32_t ahead_on;          /* pi2_stream_params.expert_ahead */
    double t_submit;
} expert_reads;

struct pi2_pipeline {
    pi2_cache *cache;
    int32_t n_groups;          /* groups of PI2_FFN_GROUP neurons per layer */
    unit_reads units[PI2_N_PARTS];
    whole_reads whole;
    int32_t layer, n_tok;      /* the plan of the layer begun last */
    uint32_t whole_parts;      /* ... bit p: part p is read whole */
    uint8_t *ready;            /* [n_groups] groups whose units are present (need) */
    int32_t *groups;           /* [n_groups] the groups one pool run computes */
    expert_reads *experts;     /* a MoE file's expert reads, or NULL */
};

/* units.c */
pi2_status pi2_units_init(pi2_pipeline *pl);
void pi2_units_free(pi2_pipeline *pl);
/* Before layer il's attention, for one token: submit the reads of the bundle clusters the layer's early count names
 * (after its hot prefix, not cached); the layer's need then waits on them like on its own misses. */
pi2_status pi2_units_early(pi2_pipeline *pl, int32_t il);
/* Wait for every part's unreaped unit reads and forget their clusters. */
void pi2_units_settle(pi2_pipeline *pl);

/* experts.c */
pi2_status pi2_experts_init(pi2_pipeline *pl);
void pi2_experts_free(pi2_pipeline *pl);
pi2_status pi2_experts_need(pi2_pipeline *pl, int32_t il, const int32_t *experts, int32_t n, uint8_t *ready);
pi2_status pi2_experts_next_ready(pi2_pipeline *pl, int32_t *groups, int32_t *n_groups);

/* whole.c */
pi2_status pi2_whole_init(pi2_pipeline *pl);
/* Submit the reads of layer il's whole region of each part in `parts` (bit p) that is not resident or already on its
 * way, into the part's slots (forgetting the cached clusters). PI2_ERR_IO, PI2_ERR_INVALID when a region does not
 * fit the slots. */
pi2_status pi2_whole_ahead(pi2_pipeline *pl, int32_t il, uint32_t parts);
/* Make layer il's whole region of `part` present (waiting for its reads ahead, or reading it now) and point view's
 * rows at it. */
pi2_status pi2_whole_load(pi2_pipeline *pl, int32_t part, int32_t il, pi2_layer *view);
/* Wait for the whole-region reads in flight, keep what landed, forget the rest. */
void pi2_whole_settle(pi2_pipeline *pl);

#endif
