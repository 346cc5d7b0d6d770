/* pack.h — the repacked weight layout ("x8") and its converters, and the run-time CPU variant.
 * Layout: a matrix of 32-value blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) whose row count is a multiple of
 *   PI2_PACK_ROWS is cut into groups of PI2_PACK_ROWS consecutive rows; group g takes the bytes of its rows
 *   (g·8·row_bytes ..), block column i of the group at offset i·8·type_size holds, field by field in the
 *   block's own field order, that field of the 8 rows' block i: Q4_1 = d[8] (fp16), m[8], qs[8][16];
 *   Q5_0 = d[8], qh[8][4], qs[8][16]; Q8_0 = d[8], qs[8][32]. Same bytes as the plain rows, so the same size;
 *   a kernel converts 8 scales with one instruction and streams one contiguous run per group.
 *   Q4_K, Q5_K and Q6_K: the same, their fields longer than 2 bytes interleaved in 4-byte units, Q5_K's and
 *   Q6_K's units in their kernels' read order (pack_k.c).
 * Does: pack and unpack (exact inverses), name the packable types, say which CPU variant runs (x86.c, neon.c).
 * Does not: compute (the kernels are the traits' vec_dot_pack) or decide what to pack (model.c). */
#ifndef PI2_KERNELS_PACK_H
#define PI2_KERNELS_PACK_H
#include <stddef.h>
#include <stdint.h>

#define PI2_PACK_ROWS 8
#define PI2_PACK_MAX_ROW_BYTES 12288   /* wider rows stay plain: a batch unpacks a group on the stack */

/* The byte sizes of the fields of `type`'s block, in order, into f[0..n); n (0: the type is not packable). */
int pi2_pack_fields(int32_t type, int32_t f[4]);
/* dst = the x8 layout of n_rows plain rows (n_rows a multiple of 8, row_bytes = n_blocks · type_size). */
void pi2_pack_rows(int32_t type, const uint8_t *src, int64_t n_rows, int64_t n_blocks, uint8_t *dst);
/* dst = the 8 plain rows (row_bytes apart) of one packed group. */
void pi2_unpack_group(int32_t type, const uint8_t *group, int64_t n_blocks, uint8_t *dst, size_t row_bytes);

/* The K-quants (Q4_K, Q5_K, Q6_K) in 4-byte units (pack_k.c): their field sizes into f (0: not a K-quant layout), and
 * pack/unpack as above (pi2_pack_rows and pi2_unpack_group call these for those types). */
int pi2_pack_k_fields(int32_t type, int32_t f[4]);
void pi2_pack_k_rows(int32_t type, const uint8_t *src, int64_t n_rows, int64_t n_blocks, uint8_t *dst);
void pi2_unpack_k_group(int32_t type, const uint8_t *group, int64_t n_blocks, uint8_t *dst, size_t row_bytes);

/* The CPU variant the auto table was built for (x86.c / neon.c): a short name ("zen4-zmm", "intel-zmm",
 * "intel-ymm", "avx2", "dotprod", ...) and a reason line for `pi2 devices`; software prefetch distance in bytes
 * of the packed kernels (0: none); allow_ext 0 when pi2_cpu_variant_request (pi2.h; Python passes the environment
 * variable PI2_CPU_VARIANT) named the baseline (`avx2` on x86-64, `neon` on aarch64): the auto table then holds the
 * base table's kernels and no AVX-512 / dotprod loop runs anywhere; error non-empty when that name is no variant of
 * this CPU (the auto choice stands, and the kernel info and model loading fail with it). Filled once, before the
 * tables, from the request as it was then. */
typedef struct {
    char name[32];
    char why[192];
    char error[160];
    int32_t prefetch;
    int32_t allow_ext;
} pi2_cpu_variant;
const pi2_cpu_variant *pi2_kernels_variant(void);
/* Fill v for this CPU (x86.c; neon.c on aarch64); 0 when the file's architecture is not this one. `want` is
 * the requested name (NULL when none or "auto"): the baseline's name forces it (allow_ext 0), anything else sets
 * v->error. */
int pi2_kernels_variant_x86(pi2_cpu_variant *v, const char *want);
int pi2_kernels_variant_neon(pi2_cpu_variant *v, const char *want);

#endif
