/* axpy_qx1_pack.h — Q4_1 and Q5_1 down rows repacked per 64-neuron group for the integer group sums
 * (pi2/reference/down_qx1.py's numbers; axpy_qx1.c sums the file's rows, this layout's kernel the same bits).
 * Layout of one group of up to 64 rows (PI2_QX1P_ROWS; missing rows are zeros) of nb 32-column blocks, chunk by
 *   chunk of 16 blocks (the last chunk nc = the rest), so that a group is one forward stream:
 *   scales: per row r, nc·4 bytes: the d of each block b of the chunk (fp16), then the m of each (fp16);
 *   values: for block b of the chunk, for quad t (rows 4t..4t+3): 64 bytes, byte 4j+r = row 4t+r's nibble byte j
 *           (its low nibble is column j, its high nibble column j+16); Q5_1 then 16 bytes: two 64-bit masks whose
 *           bit 4j+r is row 4t+r's fifth bit of column j, then of column j+16. So one 64-byte load holds the
 *           four rows' values column by column, the layout VNNI's 4-byte dot products read.
 *   Chunk c0 (a multiple of 16) starts at c0·(64·4 + 16·unit) bytes, unit = 64 (Q4_1) or 80 (Q5_1).
 * Does: pack one group; the kernel that sums a group's active rows from it (AVX-512 VNNI; NULL elsewhere).
 * Does not: decide what to pack (ffn/down_pack.c) or sum rows in the file's layout (axpy_qx1.c). */
#ifndef PI2_KERNELS_AXPY_QX1_PACK_H
#define PI2_KERNELS_AXPY_QX1_PACK_H
#include <stddef.h>
#include <stdint.h>

#define PI2_QX1P_ROWS 64

/* Bytes of one packed group of `type` (Q4_1 or Q5_1; 0 for other types) with nb blocks per row. */
size_t pi2_qx1p_group_bytes(int32_t type, int64_t nb);
/* dst (pi2_qx1p_group_bytes) = the layout of n_rows ≤ 64 plain rows (rb bytes apart) of nb blocks. */
void pi2_qx1p_pack_group(int32_t type, const uint8_t *rows, size_t rb, int32_t n_rows, int64_t nb, uint8_t *dst);

/* y[0..n) = y + the group's part, bit for bit axpy_group's of the same rows (axpy_qx1.c): rows loc[0..k) of the
 * packed group grp (ascending, < 64), weights p[0..k), n = 32·nb. */
typedef void (*pi2_axpy_qx1p_fn)(int64_t n, float *y, const uint8_t *grp, const int32_t *loc, const float *p,
                                 int32_t k);
/* The kernel of `type` in table `impl` (kernels/traits.h), or NULL where there is none (then nothing is packed). */
pi2_axpy_qx1p_fn pi2_kernels_axpy_qx1p(int32_t type, int32_t impl);

#endif
