/* model.h — the loaded model: hyper-parameters and views of its mapped tensors (internal).
 * Every pointer here lies inside the read-only mapping (or the file's copy in memory) and was checked by model.c. */
#ifndef PI2_MODEL_H
#define PI2_MODEL_H
#include <stddef.h>

#include "kernels/traits.h"
#include "matmul.h"
#include "pi2.h"

typedef struct {
    const float *attn_norm;                   /* [n_embd] */
    pi2_weight q, k, v, o;                    /* attn_q, attn_k, attn_v, attn_output */
    const float *q_bias, *k_bias, *v_bias;    /* [n_head*hd], [n_head_kv*hd], [n_head_kv*hdv] or NULL */
    const float *q_norm, *k_norm;             /* [head_dim] or NULL */
    const float *post_attn_norm;              /* [n_embd] or NULL */
    const float *ffn_norm;                    /* [n_embd] */
    pi2_weight gate, up, down;                /* down.data NULL when the layer has down_rows */
    pi2_weight down_rows;                     /* [n_ff] rows of n_embd (ffn_down transposed) or data NULL */
    const uint8_t *down_qx1p;                 /* Q4_1/Q5_1 down_rows per 64-neuron group (ffn/down_pack.c), or NULL */
    const uint8_t *up_tight;                  /* with down_qx1p: the bundles' up rows copied back to back, or NULL */
    pi2_weight up_x8;                         /* with up_tight: its rows [0, n_out) in the x8 layout (the dense prefix
                                                 one token computes whole with the gate rows), or n_out 0 */
    int32_t up_dense;                         /* the prefix asked for (pi2_model_ffn_prefix), before the copies */
    const float *down_scale;                  /* [n_ff] row scales of I8 down_rows, else NULL */
    const float *down_colscale;               /* [n_embd] their column scales, else NULL */
    const float *post_ffw_norm;               /* [n_embd] or NULL */
    pi2_weight gate_pred;                     /* pi2-made predictor: low-bit gate copy [n_ff] rows, or data NULL */
    pi2_weight fc1, fc2;                      /* predictor (pi2-made low-rank, or PowerInfer's): [r] and [n_ff] rows, or data NULL */
    /* PI2_ARCH_MOE (ffn/moe.c) */
    const float *o_bias;                      /* [n_embd] or NULL */
    pi2_weight router;                        /* ffn_gate_inp [n_expert] rows, or data NULL (dense) */
    pi2_weight gate_exps, up_exps, down_exps; /* expert 0's rows (n_out per expert); expert e at data + e·n_out rows */
    pi2_weight down_rows_exps;                /* a converted file's down rows per expert (moe_down_rows.c), or data NULL */
    const float *down_scale_exps;             /* [n_expert][n_ff_exp] row scales of I8 down_rows_exps, else NULL */
    const float *down_colscale_exps;          /* [n_expert][n_embd] their column scales, else NULL */
    pi2_weight gate_sh, up_sh, down_sh;       /* the shared expert, or data NULL */
    const float *gate_inp_sh;                 /* [n_embd] qwen2moe's shared-expert gate, or NULL */
    int32_t nope;                             /* 1: no RoPE on this layer */
    int32_t swa;                              /* 1: sliding-window layer */
    int32_t rope_local;                       /* 1: RoPE with rope_base_local, else rope_base */
} pi2_layer;

struct pi2_model {
    pi2_model_params hp;
    const uint8_t *map;          /* the whole file, PROT_READ */
    size_t map_size;
    int map_guard;               /* io_map_guard id of map (-1: none); a split model's first part */
    int *part_guards;            /* a split model: the other parts' guard ids [n_parts - 1], else NULL */
    int32_t n_parts;             /* files mapped into map (1, or a split model's parts) */
    int in_memory;               /* map is anonymous memory the file was read into (no_mmap), not the file's pages */
    pi2_weight token_embd;       /* [n_vocab] rows of n_embd */
    pi2_weight output;           /* [n_vocab] rows of n_embd (token_embd's bytes when tied) */
    const float *output_norm;    /* [n_embd] */
    const float *rope_freqs;     /* [n_rot/2] or NULL */
    pi2_layer *layers;           /* [n_layer] */
    pi2_fp16 *gelu_table;        /* [65536] when ffn_act is GELU, else NULL */
    void *packs[2];              /* pi2_model_repack's copies (attention and output; FFN), or NULL */
    void *moe_pack;              /* pi2_moe_repack's copy of the in-memory experts (ffn/moe_pack.c), or NULL */
    void *down_pack;             /* pi2_ffn_down_pack's copy of the down rows (ffn/down_pack.c), or NULL */
    int64_t packed_bytes;        /* the size of all these copies */
};

/* model_check.c: GGUF's name of each tensor role; whether a role is per layer; the ggml shape (ne0, ne1) a role must
 * have (0: any) and whether the architecture reads it; the checks pi2_model_load makes (PI2_OK, or the error set). */
extern const char *const MODEL_ROLE_NAMES[PI2_TENSOR_COUNT];
int model_per_layer(int32_t role);
int model_expected(const pi2_model_params *p, int32_t role, int64_t *ne0, int64_t *ne1);
pi2_status model_check_params(const pi2_model_params *p);
pi2_status model_check_desc(const pi2_model *m, const pi2_tensor_desc *d, int32_t i);
pi2_status model_check_present(const pi2_model_params *params, const uint8_t *seen);
pi2_status model_check_layer(const pi2_layer *L, int32_t il);
/* model_map.c: the n parts of a model at bases[k] of m->map (or, n == 1, one file, read into memory when no_mmap),
 * each under the SIGBUS guard; sets map, map_size, n_parts and the guards. */
pi2_status model_map_parts(pi2_model *m, const char *const *paths, const uint64_t *bases, int32_t n, int no_mmap);
/* Whether every mapped file of m is still whole (io_map_guard_check of each part). */
pi2_status model_check_maps(const pi2_model *m);

#endif
