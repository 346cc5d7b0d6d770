/* ffn/down_pack.h — the in-memory copies of a pi2 file's bundles whose down rows are Q4_1/Q5_1: the down rows in
 * the per-group layout (kernels/axpy_qx1_pack.h) that one token's grouped sums read, the up rows back to back
 * (ffn/sparse.c). */
#ifndef PI2_FFN_DOWN_PACK_H
#define PI2_FFN_DOWN_PACK_H
#include "model.h"

/* Copy every such layer's down_rows (group by group) and up rows into one block, set each layer's down_qx1p and
 * up_tight, release the bundles' mapped pages (bundle-ud files mapped from disk: batches fault them in again),
 * count the bytes in packed_bytes. A no-op where table impl has no kernel for the layout, and when done before. */
pi2_status pi2_ffn_down_pack(pi2_model *m, int32_t impl);

#endif
