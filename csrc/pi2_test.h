/* pi2_test.h — the C core's test entry points: what only tests (and the developers' scripts) call.
 * Owns: the kernels one by one, the trace hook, the element-wise and attention ops, the matrix product, the thread
 *       pool, the neuron cache's slot LRU, the flash I/O reads themselves and their test switches, and the NNAPI
 *       graph API.
 * How it is reached: pi2's extension module binds this header beside pi2.h (csrc/ffi_build.py), so tests call
 *       these through `pi2._pi2.lib` (tests/ctest.py wraps them); none is exported from the module (nm -D lists
 *       only pi2.h's PI2_API functions), and pi2/ never calls them. C tests compile the sources and include it.
 * Declarations of internal functions here are checked against their own headers by test_api.c, which includes
 *       both. Lines starting with '#' are stripped before ffi.cdef. */
#ifndef PI2_TEST_H
#define PI2_TEST_H
#include "pi2.h"

/* ---- kernels (kernels/api.c) ---- */
/* dst[r * n_cols + c] = value c of row r, for n_rows rows of `type` starting row_bytes apart in src
 * (row_bytes >= the row size). Bit-exact with gguf.quants. Errors as pi2_matvec. */
pi2_status pi2_dequantize_rows(int32_t type, const void *src, size_t row_bytes, float *dst,
                               int64_t n_rows, int64_t n_cols, int32_t impl);

/* The x8 repacked layout (kernels/pack.h: groups of 8 rows, each block column's fields of the 8 rows side by
 * side): dst = src's n_rows plain rows packed (unpack 0) or src's packed rows unpacked (1). n_rows a multiple
 * of 8; Q4_0, Q4_1, Q5_0, Q5_1, Q8_0. PI2_ERR_UNSUPPORTED: other types; PI2_ERR_INVALID: shapes, NULL. */
pi2_status pi2_repack_rows(int32_t type, const void *src, int64_t n_rows, int64_t n_cols, void *dst, int32_t unpack);

/* pi2_matvec on packed rows (pi2_repack_rows) with the packed kernels of `impl`, which return the plain
 * kernels' bits. PI2_ERR_UNSUPPORTED: the table has no packed kernel for the type; else as pi2_matvec. */
pi2_status pi2_matvec_packed(int32_t type, const void *packed, int64_t n_rows, int64_t n_cols, const void *x_q,
                             float *out, int32_t impl);

/* ---- the trace hook ----
 * Called during decode with (name, layer or -1, data, n floats), rows of the current tokens, at the checkpoints of
 * pi2/reference.py (llama.cpp's graph names): per layer "attn_norm", "Qcur", "Kcur", "Vcur" (projections),
 * "Qcur.bias" (qkv_bias), "Qcur.rope", "Kcur.rope" (after norm and RoPE), "kqv_out", "attn_out", "ffn_inp",
 * "ffn_norm", "ffn_gate", "ffn_up", "ffn_swiglu" (act(gate) * up), "ffn_out", "l_out"; then "result_norm" and
 * "result_output" (logits). NULL turns it off; unused, it costs one test per checkpoint. A sparse FFN
 * (pi2_ctx_set_ffn, or FFN_DOWN_ROWS) traces "ffn_gate", "ffn_out" and "l_out" only. */
typedef void (*pi2_trace_fn)(const char *name, int32_t layer, const float *data, int64_t n, void *user);
void pi2_set_trace(pi2_ctx *ctx, pi2_trace_fn fn, void *user);

/* ---- ops (ops.h), the thread pool (threadpool.h) and the matrix product (matmul.h) ---- */
typedef uint16_t pi2_fp16;
typedef struct pi2_pool pi2_pool;
void pi2_rms_norm(float *y, const float *x, const float *w, int64_t n, float eps);
void pi2_rope_cache(float *cs, int32_t pos, int32_t n_rot, float base, float freq_scale, const float *freq_factors);
void pi2_rope(float *x, int32_t n_heads, int32_t head_dim, int32_t n_rot, const float *cs, int32_t neox);
void pi2_gelu_table(pi2_fp16 *table);
void pi2_ffn_activate(float *gate, const float *up, int64_t n, int32_t act, const pi2_fp16 *gelu_table);
pi2_status pi2_pool_create(int32_t n_threads, pi2_pool **out);
void pi2_pool_free(pi2_pool *pool);
/* pi2_attention on q [n_tok][n_head][head_dim] at positions pos0.., the F16 cache k [n_head_kv][head_dim][n_ctx]
 * (transposed; stored here as the cache's halves in rows of pi2_kv_k_ld(n_ctx), as a context has them) and v
 * [n_ctx][n_head_kv][head_dim_v] (F16 values given as floats, stored as the cache's halves here),
 * into out [n_tok][n_head][head_dim_v]; scratch allocated here. PI2_ERR_NOMEM. */
pi2_status pi2_test_attention(pi2_pool *pool, const float *q, const float *k, const float *v, float *out,
                              int32_t n_tok, int32_t pos0, int32_t n_ctx, int32_t n_head, int32_t n_head_kv,
                              int32_t head_dim, int32_t head_dim_v, int32_t window, float scale);
/* Which attention loops over the F16 cache run from now on (every context, for tests of the loops this CPU would
 * not take): 0 the best this CPU has, 1 none of the AVX-512 ones, 2 the portable C loops only. */
void pi2_test_attention_isa(int32_t level);
/* The F16 K cache's largest leading dimension: halves between rows of a full context of n_ctx positions (kv_quant.h). */
int32_t pi2_kv_k_ld(int32_t n_ctx);
/* A context's F16 keys' row spacing now (at most pi2_kv_k_ld(n_ctx); grows with the positions in use: kv_rows.c). */
int32_t pi2_test_ctx_k_ld(const pi2_ctx *c);
/* out [n_tok][n_out] = x [n_tok][n_in] times the n_out rows of w (row_bytes apart, ggml type `type`) by pi2_matmul
 * with `impl`'s kernels; scratch allocated here. PI2_ERR_NOMEM. */
pi2_status pi2_test_matmul(pi2_pool *pool, const void *w, int32_t type, int64_t n_in, int64_t n_out, size_t row_bytes,
                           const float *x, int32_t n_tok, float *out, int32_t impl);
/* The same with `packed` (pi2_repack_rows of w, or NULL) as the weight's packed copy: matmul.c's packed paths. */
pi2_status pi2_test_matmul_packed(pi2_pool *pool, const void *w, const void *packed, int32_t type, int64_t n_in,
                                  int64_t n_out, size_t row_bytes, const float *x, int32_t n_tok, float *out, int32_t impl);

/* ---- the neuron cache's slot LRU (cache/slots.c) ---- */
typedef struct pi2_test_slots pi2_test_slots;
pi2_status pi2_test_slots_new(int32_t n_slots, int32_t n_layer, int32_t n_cl, pi2_test_slots **out);
void pi2_test_slots_free(pi2_test_slots *p);
int32_t pi2_test_slots_find(pi2_test_slots *p, int32_t il, int32_t cl);
int32_t pi2_test_slots_take(pi2_test_slots *p, int32_t il, int32_t cl);
void pi2_test_slots_forget(pi2_test_slots *p, int32_t s);
void pi2_test_slots_clear(pi2_test_slots *p);
void pi2_test_slots_pin(pi2_test_slots *p, int32_t s);
void pi2_test_slots_unpin(pi2_test_slots *p, int32_t s);
/* 0 when the invariants hold, else a code > 0 saying which failed (pi2_slots_check). */
int32_t pi2_test_slots_check(const pi2_test_slots *p);
/* The state: the LRU list walked from head (most recent) into order[n_slots] (returns its length; the walk stops
 * after n_slots entries), the tail, each slot's (layer, cluster) or -1 into layer[n_slots], cl[n_slots], and
 * slot_of[n_layer * n_cl]. */
int32_t pi2_test_slots_state(const pi2_test_slots *p, int32_t *order, int32_t *tail, int32_t *layer, int32_t *cl,
                             int32_t *slot_of);
/* Break the table: slot_of[k] = s (the check must notice). */
void pi2_test_slots_poke(pi2_test_slots *p, int32_t k, int32_t s);

/* ---- flash I/O: the reads, and the test switches ----
 * Offsets, lengths and destinations are multiples of PI2_IO_ALIGN. Errors are per request, as an errno in the
 * completion: EINVAL misaligned or empty request, EBADF the file descriptor was closed under the handle, EIO the
 * device failed, ENODATA the file ended before the request did (a request starting at or past the end, or a short
 * read inside the file; a request covering the file's last partial block reads the bytes up to the end with no
 * error and nbytes < length). */
typedef struct {
    uint64_t offset;      /* byte offset in the file, a multiple of PI2_IO_ALIGN */
    uint64_t length;      /* bytes, a multiple of PI2_IO_ALIGN, 1 .. 1 GiB */
    void *dest;           /* PI2_IO_ALIGN-aligned, length bytes */
    uint64_t user;        /* returned in the completion */
} pi2_io_request;

typedef struct {
    uint64_t user;        /* the request's */
    int64_t nbytes;       /* bytes read into dest (may be > 0 with ENODATA: a short read) */
    int32_t error;        /* 0 or an errno (see above) */
} pi2_io_completion;

/* Queue requests in order until queue_depth are in flight; *n_accepted says how many were taken (the
 * rest: reap, then submit them again). A request that is invalid takes a slot and completes at once
 * with EINVAL. PI2_ERR_INVALID: NULL arguments or n < 0; PI2_ERR_IO: the backend itself failed. */
pi2_status pi2_io_submit(pi2_io *io, const pi2_io_request *reqs, int32_t n, int32_t *n_accepted);
/* Wait until min_complete requests (capped at those in flight) have finished, then move up to max
 * finished ones into out (*n_out of them, in completion order). min_complete 0 never blocks. */
pi2_status pi2_io_reap(pi2_io *io, pi2_io_completion *out, int32_t max, int32_t min_complete, int32_t *n_out);
/* Requests submitted and not yet reaped. */
int32_t pi2_io_in_flight(const pi2_io *io);
/* Submit and reap all n requests with queue_depth in flight; out[i] is reqs[i]'s completion.
 * Needs nothing in flight before. Per-request errors stay in out; the status is for the call. */
pi2_status pi2_io_read_all(pi2_io *io, const pi2_io_request *reqs, int32_t n, pi2_io_completion *out);
/* Drop the file's pages from the page cache (posix_fadvise DONTNEED on the whole file). */
pi2_status pi2_io_drop_cache(pi2_io *io);

typedef enum {
    PI2_IO_TEST_DIRECT_OPEN_EINVAL = 1,  /* behave as if the O_DIRECT open failed with EINVAL */
    PI2_IO_TEST_DIRECT_READ_EINVAL = 2   /* ... as if the first O_DIRECT read failed with EINVAL */
} pi2_io_test_flag;
/* pi2_io_open with pi2_io_test_flag bits. */
pi2_status pi2_test_io_open(const char *path, const pi2_io_params *params, int32_t test_flags, pi2_io **out,
                            pi2_io_info *info);

typedef enum {
    PI2_IO_PROBE_TEST_SECCOMP_URING = 2,/* the child installs a seccomp filter trapping io_uring_setup */
    PI2_IO_PROBE_TEST_RAISE_SIGSYS = 4  /* the uring child raises SIGSYS before any system call */
} pi2_io_probe_test_flag;
/* pi2_io_probe with pi2_io_probe_test_flag bits too. */
pi2_status pi2_test_io_probe(const char *path, int32_t flags, int32_t test_flags, pi2_io_verdict *out,
                             int32_t *chosen);

/* ---- the NNAPI graph API (nnapi/graph.c), which the engine uses inside; tests run graphs directly ---- */
typedef struct pi2_nnapi_graph pi2_nnapi_graph;   /* weight copies + compilations per batch size */

/* A weight matrix in ggml layout: n_rows rows of n_cols values of `type`, row_bytes apart. */
typedef struct {
    const void *data;
    int32_t type;                /* ggml type id (any type pi2_dequantize_rows reads) */
    int64_t n_rows, n_cols;
    size_t row_bytes;
} pi2_nnapi_matrix;

/* out_i[t] = w[i] · x[t] for n_w (1..4) matrices sharing n_cols: one FULLY_CONNECTED (or BATCH_MATMUL)
 * per matrix on a shared input [n_tok][n_cols]. PI2_ERR_UNSUPPORTED: no device selected; PI2_ERR_NOMEM;
 * PI2_ERR_INVALID: bad matrices. */
pi2_status pi2_nnapi_fc_create(pi2_nnapi *d, const pi2_nnapi_matrix *w, int32_t n_w, pi2_nnapi_graph **out);
/* The hot prefix (neurons 0..n_hot-1) of one FFN layer as one graph:
 *   out[t] = down_hot · (act(gate_hot · x[t]) * (up_hot · x[t]))
 * gate, up: ffn_gate / ffn_up, [n_ff][n_embd]; down: ffn_down [n_embd][n_ff] (down_t 0, n_hot a multiple
 * of its block size) or ffn_down_t [n_ff][n_embd] (down_t 1). act: PI2_ACT_SILU (LOGISTIC then MUL:
 * NNAPI has no SiLU) or PI2_ACT_RELU (FUSED_RELU on the gate); PI2_ACT_GELU: PI2_ERR_UNSUPPORTED. */
pi2_status pi2_nnapi_ffn_create(pi2_nnapi *d, int32_t act, const pi2_nnapi_matrix *gate, const pi2_nnapi_matrix *up,
                                const pi2_nnapi_matrix *down, int32_t down_t, int64_t n_hot, pi2_nnapi_graph **out);
/* Start g on x [n_tok][n_in] and return at once; out[i] receives output i ([n_tok][n_out_i]) at
 * pi2_nnapi_wait. x may be reused as soon as this returns; out must stay valid until the wait.
 * The first start at a batch size compiles the graph for it (slow, once). PI2_ERR_UNSUPPORTED: the
 * graph failed now or earlier (compute on the CPU); PI2_ERR_INVALID: bad arguments or a run pending. */
pi2_status pi2_nnapi_start(pi2_nnapi_graph *g, const float *x, int32_t n_tok, float *const *out);
/* Wait for the started run and fill out. PI2_ERR_UNSUPPORTED: the run failed (out is untouched:
 * compute on the CPU; the graph is not used again); PI2_ERR_INVALID: nothing started. */
pi2_status pi2_nnapi_wait(pi2_nnapi_graph *g);
/* Bytes of the weight copies and staging buffers g holds (they count against the memory budget). */
size_t pi2_nnapi_graph_bytes(const pi2_nnapi_graph *g);
/* Free (NULL is fine; waits for a pending run). */
void pi2_nnapi_graph_free(pi2_nnapi_graph *g);

#endif
