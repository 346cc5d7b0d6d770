/* ffn/down_pack.h — the in-memory copy of a pi2 file's Q4_1/Q5_1 down rows in the per-group layout
 * (kernels/axpy_qx1_pack.h) that one token's grouped sums read (ffn/sparse.c). */
#ifndef PI2_FFN_DOWN_PACK_H
#define PI2_FFN_DOWN_PACK_H
#include "model.h"

/* Copy every layer's Q4_1/Q5_1 down_rows into one block (layer by layer, group by group), set each layer's
 * down_qx1p, count the bytes in packed_bytes. A no-op where table impl has no kernel for the layout, for rows not
 * in the mapping, and when done before. */
pi2_status pi2_ffn_down_pack(pi2_model *m, int32_t impl);

#endif
