/* kv_quant.h — the KV cache's key types (internal): F16 keys (halves, transposed) or Q8_0, Q4_0, Q4_1, Q5_0, Q5_1
 * keys (blocks, one row of n_head_kv * head_dim values per cell), with llama.cpp's Walsh-Hadamard rotation of queries
 * and quantized keys.
 * pi2/reference/kv_cache.py is the specification. */
#ifndef PI2_KV_QUANT_H
#define PI2_KV_QUANT_H
#include <stddef.h>
#include <stdint.h>

#include "kernels/traits.h"
#include "pi2.h"

struct pi2_ctx;

/* Whether pi2 computes attention over a K cache of ggml type `type_k` (F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1). */
int pi2_kv_type_ok(int32_t type_k);
/* The F16 keys' largest leading dimension (a context's rows start closer: kv_rows.c): halves from one row of the
 * transposed cache (one dimension of a KV head, every position) to the next, n_ctx rounded up to whole 64-byte lines, so that in the page-aligned cache (kv_mem.c) each
 * row, and each block of 64 keys the score loops read, starts on a cache line. */
int32_t pi2_kv_k_ld(int32_t n_ctx);
/* Bytes of the K cache for these parameters: 2 per value for F16 (IEEE halves, as llama.cpp; pi2_kv_k_ld of them a
 * row), blocks otherwise. */
size_t pi2_kv_k_bytes(const pi2_model_params *hp, int32_t type_k, int32_t n_ctx);
/* Bytes of the V cache: F16 values as halves (2 bytes each), or (flash attention) blocks of type_v. */
size_t pi2_kv_v_bytes(const pi2_model_params *hp, int32_t type_v, int32_t n_ctx);
/* Bytes of one cell's values (all KV heads): 2 per value for F16, blocks for a quantized V cache. */
size_t pi2_kv_v_cell_bytes(const pi2_model_params *hp, int32_t type_v);
/* Store one token's values v (n_head_kv * head_dim_v floats) at cell pos of layer il in a quantized V cache
 * (ggml_set_rows' quantizer, as for keys). */
void pi2_kv_store_v(struct pi2_ctx *c, int32_t il, size_t pos, const float *v);
/* Bytes of one cell's keys (all KV heads): 2 per value for F16, blocks for a quantized K cache. */
size_t pi2_kv_k_cell_bytes(const pi2_model_params *hp, int32_t type_k);
/* The Hadamard size llama.cpp rotates queries and quantized keys with: the largest power of two >= 64 dividing
 * head_dim, 0 (no rotation) for an F16 cache or a head_dim that 64 does not divide. */
int32_t pi2_kv_rot_size(int32_t head_dim, int32_t type_k);
/* ggml_compute_forward_fwht in place on n_vals / n runs of n values: x·(1/sqrtf(n)), then butterflies
 * (u + v, u - v) for strides 1, 2, 4, ... */
void pi2_kv_fwht(float *x, int64_t n_vals, int32_t n);
/* Store one token's keys k (n_head_kv * head_dim floats, already rotated) at cell pos of layer il in the cache's
 * type (ggml_set_rows' quantizer: quantize_row_q8_0, or the 4- and 5-bit types' scalar reference quantizers). */
void pi2_kv_store_k(struct pi2_ctx *c, int32_t il, size_t pos, const float *k);
/* s[j] = scale · (q · key j of KV head hkv) for j in [j0, j1), the query quantized to the keys' vec_dot type into qq
 * (head_dim/32 blocks of Q8_0 or Q8_1) and each key multiplied by the type's vec_dot (ggml_vec_dot_q8_0_q8_0,
 * _q4_0_q8_0, ...; tinyBLAS adds in the same order where it applies). */
void pi2_kv_scores(const pi2_type_traits *kt, const uint8_t *keys, size_t cell_bytes, int32_t hkv, int32_t head_dim,
                   const float *q, float scale, float *s, int32_t j0, int32_t j1, void *qq);
/* A context shift of layer il's quantized keys: cells n_keep + n_discard + t move to n_keep + t (t < m), each
 * dequantized, rotated back, rotated by RoPE with the cos/sin table cs, rotated forward and quantized again
 * (llama_kv_cache::build_rope_shift on a quantized cache). row: scratch of n_head_kv * head_dim floats. */
void pi2_kv_shift_k(struct pi2_ctx *c, int32_t il, int32_t n_keep, int32_t n_discard, int32_t m, const float *cs,
                    float *row);

#endif
