/* pi2.h — the engine's API: the one header a program using pi2's C core includes, and the one pi2/engine binds.
 * Owns: status codes and errors, the ABI version, kernel facts, the model, the context and its decode, the sparse
 *       FFN rule, the streamed FFN (the neuron cache), the statistics, the NNAPI delegate and flash I/O.
 * Shape: opaque handles, init/free pairs, params structs with a *_default_params() or documented zero defaults,
 *       statistics structs whose first field is their size (the caller sets it; C fills only the fields that fit,
 *       so a field added at the end is no ABI break). 31 functions; test entry points are in pi2_test.h.
 * Only declarations marked PI2_API are exported from the built module (the rest is built with hidden visibility).
 * Over 400 lines on purpose: the API is one header (what a program includes, what Python binds), and each
 * declaration keeps its contract beside it.
 * Lines starting with '#' and the word PI2_API are stripped before ffi.cdef, so keep declarations free of other
 * macros. Python reads every enum value below from the compiled module (cffi checks them against C). */
#ifndef PI2_H
#define PI2_H
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define PI2_API __attribute__((visibility("default")))
#else
#define PI2_API
#endif

typedef enum {
    PI2_OK = 0,
    PI2_ERR_INVALID = -1,     /* a bad argument */
    PI2_ERR_IO = -2,          /* a read failed (pi2_error.sys_errno and .path say which) */
    PI2_ERR_NOMEM = -3,       /* an allocation failed */
    PI2_ERR_FORMAT = -4,      /* malformed model data */
    PI2_ERR_UNSUPPORTED = -5, /* a type or feature this build does not support */
    PI2_ERR_ABORTED = -6      /* pi2_abort() stopped a decode */
} pi2_status;

/* Bumped whenever a declaration in this header changes; pi2/engine compares the value compiled into its module
 * with its own at import (a constant, not a function: the API's functions are the engine's calls). */
enum { PI2_ABI_VERSION = 15 };

/* The last error on the calling thread. */
typedef struct {
    uint32_t size;            /* sizeof(pi2_error), set by the caller */
    int32_t status;           /* its pi2_status (PI2_OK: none since the thread started) */
    int32_t sys_errno;        /* PI2_ERR_IO: the errno of the failed call or read (ENODATA: the file ended first) */
    const char *message;      /* one line; "" when none; valid until the thread's next error */
    const char *path;         /* the file a PI2_ERR_IO is about, or "" */
} pi2_error;
PI2_API void pi2_last_error(pi2_error *out);

/* Guard a read-only file mapping the caller made (Python's map of a model file): a SIGBUS inside it (the file
 * truncated, a device error) maps a zero page there instead of killing the process, and pi2_map_guard_check then
 * fails with PI2_ERR_IO naming `path`, the offset and the errno (also when the file `fd` (-1: unknown) has shrunk).
 * Returns an id; -1 when nothing is guarded (every call takes -1). pi2 guards its own mappings itself. */
PI2_API int32_t pi2_map_guard_add(const void *base, uint64_t size, const char *path, int32_t fd);
PI2_API pi2_status pi2_map_guard_check(int32_t id, int32_t release);   /* release 1: stop guarding (id is free) */

/* ---- kernels: ggml block types ----
 * Types are ggml type ids (formats.md §2). Known: F32 0, F16 1, Q4_0 2, Q4_1 3, Q5_0 6, Q5_1 7, Q8_0 8, Q8_1 9,
 * Q4_K 12, Q5_K 13, Q6_K 14, Q8_K 15, BF16 30 (Q8_1 and Q8_K are activation-only). A row of n_cols values of a
 * type takes n_cols / block_size * type_size bytes. */
typedef enum {
    PI2_IMPL_AUTO = 0,   /* the fastest kernels this CPU supports */
    PI2_IMPL_REF = 1,    /* the scalar reference (kernels/ref.c) */
    PI2_IMPL_BASE = 2    /* baseline SIMD without optional extensions (AVX2 w/o VNNI, NEON w/o dotprod) */
} pi2_impl;

typedef enum {
    PI2_ISA_AVX2 = 1,        /* AVX2 + FMA + F16C */
    PI2_ISA_AVX512VNNI = 2,  /* AVX-512 VNNI (vpdpbusd) for the 32-value block types */
    PI2_ISA_NEON = 4,        /* aarch64 Advanced SIMD */
    PI2_ISA_DOTPROD = 8      /* aarch64 SDOT (vdotq_s32) */
} pi2_isa;

typedef struct {
    const char *name;          /* ggml's type name, "Q4_K" */
    int32_t block_size;        /* values per block */
    int32_t type_size;         /* bytes per block */
    int32_t vec_dot_type;      /* activation format rows of this type are multiplied with */
    int32_t has_vec_dot;       /* 1 for weight types pi2_matvec accepts, 0 for activation-only */
    const char *vec_dot_impl;  /* kernel pi2_matvec uses for `impl`: "ref", "avx2", "avx512vnni", "neon", "dotprod"
                                  (NULL when has_vec_dot is 0) */
    uint32_t isa;              /* bit set of PI2_ISA_* the PI2_IMPL_AUTO kernels use on this CPU (0: reference only) */
    int32_t packed;            /* 1: table `impl` has a kernel for rows in the x8 packed layout (pi2_model_repack) */
    const char *variant;       /* the CPU variant the PI2_IMPL_AUTO kernels were chosen for (CPUID vendor/family/model
                                  on x86-64, HWCAP and MIDR on aarch64): "zen4-zmm", "intel-zmm", "intel-skx-ymm",
                                  "avx2", "neon-dotprod", ... */
    const char *variant_why;   /* the CPU it saw and the reason */
} pi2_type_info;

/* Ask for CPU variant `want` before anything chooses kernels: NULL, "" or "auto" = the CPU's own choice; the
 * baseline's name (`avx2` on x86-64, `neon` on aarch64) forces its kernels on a CPU with more (no AVX-512 / dotprod
 * loop then runs anywhere). A name that is no variant of this CPU leaves the CPU's own choice and makes
 * pi2_kernel_info and context creation fail with why. PI2_ERR_INVALID: the variant was already chosen (a first
 * kernel call or context came before this one) and `want` differs from it. */
PI2_API pi2_status pi2_cpu_variant_request(const char *want);

/* Facts about ggml type `type` under implementation `impl` (a pi2_impl), and the CPU's kernels.
 * PI2_ERR_UNSUPPORTED: unknown type; PI2_ERR_INVALID: bad impl or NULL out. */
PI2_API pi2_status pi2_kernel_info(int32_t type, int32_t impl, pi2_type_info *out);

/* out = the n floats of x in activation format `vdt` (F32, F16, BF16, Q8_0, Q8_1 or Q8_K), the bytes llama.cpp's
 * x86 build writes, on every CPU (n / block_size * type_size of them).
 * PI2_ERR_UNSUPPORTED: vdt is not an activation format; PI2_ERR_INVALID: as pi2_matvec. */
PI2_API pi2_status pi2_quantize_act(int32_t vdt, const float *x, int64_t n, void *out);

/* out[r] = row r of w (n_rows rows of `type`, row_bytes apart, n_cols values each) · x_q, where x_q holds n_cols
 * values already in the type's vec_dot_type (pi2_quantize_act); the planner times it.
 * PI2_ERR_UNSUPPORTED: unknown or activation-only type; PI2_ERR_INVALID: NULL pointer, n_cols <= 0 or not a
 * multiple of the block size, n_rows < 0, row_bytes too small, bad impl. */
PI2_API pi2_status pi2_matvec(int32_t type, const void *w, size_t row_bytes, int64_t n_rows, int64_t n_cols,
                              const void *x_q, float *out, int32_t impl);

/* ---- models ----
 * Python reads the GGUF metadata and describes every tensor the forward pass uses with a flat pi2_tensor_desc;
 * C maps the file read-only and checks each descriptor (role, layer, type, shape, offset, size) against the
 * hyper-parameters and the file size before touching it. */

/* PI2_ARCH_BAMBOO: PowerInfer's Bamboo / TurboSparse-Mistral, llama's forward pass with its own FFN activation */
/* PI2_ARCH_MOE: the Mixture-of-Experts family and dense qwen3 (qwen3, qwen3moe, llama with experts, qwen2moe, olmoe,
 * granitemoe, smallthinker), computed as pi2/reference_moe.py and docs/moe.md say (the moe fields below) */
typedef enum { PI2_ARCH_LLAMA = 0, PI2_ARCH_QWEN2 = 1, PI2_ARCH_GEMMA3 = 2, PI2_ARCH_BAMBOO = 3, PI2_ARCH_MOE = 4 } pi2_arch;
/* h = act(gate)·up; PI2_ACT_DRELU (bamboo PWRI files): h = relu(gate)·relu(up) */
typedef enum { PI2_ACT_SILU = 0, PI2_ACT_GELU = 1, PI2_ACT_RELU = 2, PI2_ACT_DRELU = 3 } pi2_ffn_act;

/* What a tensor is. Per-layer roles (ATTN_NORM..POST_FFW_NORM) need 0 <= layer < n_layer; the
 * others take layer -1. For a tied output, describe OUTPUT with token_embd's offset and size. */
typedef enum {
    PI2_TENSOR_TOKEN_EMBD = 0,     /* [n_vocab][n_embd], any weight type */
    PI2_TENSOR_OUTPUT_NORM = 1,    /* [n_embd] F32 */
    PI2_TENSOR_OUTPUT = 2,         /* [n_vocab][n_embd] */
    PI2_TENSOR_ROPE_FREQS = 3,     /* [n_rot/2] F32, optional */
    PI2_TENSOR_ATTN_NORM = 4,      /* [n_embd] F32 */
    PI2_TENSOR_ATTN_Q = 5,         /* [n_head*head_dim][n_embd] */
    PI2_TENSOR_ATTN_K = 6,         /* [n_head_kv*head_dim][n_embd] */
    PI2_TENSOR_ATTN_V = 7,         /* [n_head_kv*head_dim_v][n_embd] */
    PI2_TENSOR_ATTN_OUTPUT = 8,    /* [n_embd][n_head*head_dim_v] */
    PI2_TENSOR_ATTN_Q_BIAS = 9,    /* [n_head*head_dim] F32, when qkv_bias */
    PI2_TENSOR_ATTN_K_BIAS = 10,   /* [n_head_kv*head_dim] F32, when qkv_bias */
    PI2_TENSOR_ATTN_V_BIAS = 11,   /* [n_head_kv*head_dim_v] F32, when qkv_bias */
    PI2_TENSOR_ATTN_Q_NORM = 12,   /* [head_dim] F32, when qk_norm */
    PI2_TENSOR_ATTN_K_NORM = 13,   /* [head_dim] F32, when qk_norm */
    PI2_TENSOR_POST_ATTN_NORM = 14,/* [n_embd] F32, when post_norms */
    PI2_TENSOR_FFN_NORM = 15,      /* [n_embd] F32 */
    PI2_TENSOR_FFN_GATE = 16,      /* [n_ff][n_embd] */
    PI2_TENSOR_FFN_UP = 17,        /* [n_ff][n_embd] */
    PI2_TENSOR_FFN_DOWN = 18,      /* [n_embd][n_ff] */
    PI2_TENSOR_POST_FFW_NORM = 19, /* [n_embd] F32, when post_norms */
    PI2_TENSOR_FFN_DOWN_ROWS = 20, /* [n_ff][n_embd]: row i = neuron i's output (ffn_down transposed; pi2
                                      bundles, PowerInfer's ffn_down_t); a layer has this or FFN_DOWN */
    PI2_TENSOR_FFN_GATE_PRED = 21, /* [n_ff][n_embd] PI2_T_LOWBIT1/2: a pi2-made low-bit gate copy, optional */
    PI2_TENSOR_FFN_PRED_FC1 = 22,  /* [r][n_embd] a predictor's fc1, optional (with FC2): a pi2-made low-rank one
                                      (PI2_PRED_LOWRANK) or PowerInfer's (PI2_FFN_PWRI_PREDICTOR) */
    PI2_TENSOR_FFN_PRED_FC2 = 23,  /* [n_ff][r] its fc2 */
    PI2_TENSOR_FFN_DOWN_SCALE = 24,/* [n_ff] F32: row scales of FFN_DOWN_ROWS of type I8 (24), which need it */
    PI2_TENSOR_FFN_DOWN_COLSCALE = 25, /* [n_embd] F32: column scales of those I8 rows (value = col·row·q) */
    /* PI2_ARCH_MOE only: */
    PI2_TENSOR_ATTN_OUTPUT_BIAS = 26,  /* [n_embd] F32, optional */
    PI2_TENSOR_FFN_GATE_INP = 27,  /* [n_expert][n_embd] the router, when n_expert > 0 */
    PI2_TENSOR_FFN_GATE_EXPS = 28, /* ne {n_embd, n_ff_exp, n_expert}: expert e's rows e·n_ff_exp.. contiguous */
    PI2_TENSOR_FFN_UP_EXPS = 29,   /* ne {n_embd, n_ff_exp, n_expert} */
    PI2_TENSOR_FFN_DOWN_EXPS = 30, /* ne {n_ff_exp, n_embd, n_expert} */
    PI2_TENSOR_FFN_GATE_SHEXP = 31,/* [n_ff_shexp][n_embd], when n_ff_shexp > 0 */
    PI2_TENSOR_FFN_UP_SHEXP = 32,  /* [n_ff_shexp][n_embd] */
    PI2_TENSOR_FFN_DOWN_SHEXP = 33,/* [n_embd][n_ff_shexp] */
    PI2_TENSOR_FFN_GATE_INP_SHEXP = 34, /* [n_embd] F32, when shexp_gate */
    /* a converted MoE file's experts (`pi2 convert`): up rows (FFN_UP_EXPS) and down rows in one bundle per neuron */
    PI2_TENSOR_FFN_DOWN_ROWS_EXPS = 35,     /* ne {n_embd, n_ff_exp, n_expert}: row r of expert e is neuron r's down
                                               column (summed as FFN_DOWN_ROWS); a layer has this or FFN_DOWN_EXPS */
    PI2_TENSOR_FFN_DOWN_SCALE_EXPS = 36,    /* ne {n_ff_exp, 1, n_expert} F32: row scales of I8 FFN_DOWN_ROWS_EXPS */
    PI2_TENSOR_FFN_DOWN_COLSCALE_EXPS = 37, /* ne {n_embd, 1, n_expert} F32: their column scales, per expert */
    PI2_TENSOR_COUNT = 38
} pi2_tensor_role;

/* Type ids (not ggml's) of FFN_GATE_PRED rows: per 32 values an f16 scale d, then 32 codes of 1 or 2 bits
 * packed little-endian; weight = d·(2c − (2^bits − 1)) (pi2/convert/predictor.py). */
enum { PI2_T_LOWBIT1 = 1001, PI2_T_LOWBIT2 = 1002 };

typedef struct {
    int32_t role;       /* a pi2_tensor_role */
    int32_t layer;      /* block index, or -1 for whole-model tensors */
    int32_t type;       /* ggml type id */
    int64_t ne[4];      /* ggml shape: ne[0] values per row, ne[1] rows; unused dims 1 */
    uint64_t offset;    /* absolute byte offset of the data in the file */
    uint64_t nbytes;    /* bytes from the first row's start to the last row's end */
    uint64_t row_stride;/* bytes from one row to the next (0: packed rows); rows of other data between
                           them (pi2 bundles: up row and down row of a neuron in one record) */
} pi2_tensor_desc;

/* Hyper-parameters, as pi2/model/config.py's ModelConfig names them. */
typedef struct {
    int32_t arch;             /* pi2_arch */
    int32_t n_vocab, n_embd, n_layer, n_ff;
    int32_t n_head, n_head_kv, head_dim, head_dim_v, n_rot;
    float rms_eps;
    float rope_base;          /* theta base of full-attention layers */
    float rope_base_local;    /* base of sliding-window layers (0: rope_base) */
    float rope_freq_scale;    /* 1 / linear scaling factor */
    int32_t rope_neox;        /* 1: pairs (i, i + n_rot/2); 0: pairs (2i, 2i+1) */
    int32_t qkv_bias, qk_norm, post_norms;
    int32_t ffn_act;          /* pi2_ffn_act */
    float embd_scale;         /* token embeddings are multiplied by this (1: none) */
    float attn_scale;         /* scale of q.k */
    int32_t q_prescale;       /* 1: q is multiplied by attn_scale before K.Q (gemma3) */
    float logit_softcap;      /* 0: none; else logits = c*tanh(logits/c) */
    int32_t sliding_window;   /* 0: every layer attends to all positions */
    int32_t swa_period;       /* layer il is full-attention when il % swa_period == swa_period-1 */
    /* PI2_ARCH_MOE (zero for the others). Its products follow ggml's x86 AVX-512 orders (moe_matmul.py): F32 and
     * F16 weights by ggml_vec_dot for one token and every expert row, by tinyBLAS for batches; Q4_0 by the
     * repacked GEMV; and the last layer computes its FFN only on the rows whose logits are asked for. */
    int32_t n_expert;         /* experts per layer (0: a dense SwiGLU FFN, qwen3) */
    int32_t n_expert_used;    /* experts per token, 1..n_expert */
    int32_t n_ff_exp;         /* one expert's FFN width */
    int32_t n_ff_shexp;       /* the shared expert's FFN width (0: none) */
    int32_t expert_gating;    /* pi2_expert_gating */
    int32_t expert_weights_norm;  /* 1: the k weights divided by their sum (in double, clamped below at 2^-14) */
    float expert_weights_scale;   /* the k weights times it unless 0 or 1 */
    int32_t expert_act;       /* PI2_ACT_SILU (SwiGLU) or PI2_ACT_RELU (ReGLU: gate > 0 ? gate·up : 0) */
    int32_t shexp_gate;       /* 1: the shared expert times silu(t)/t, t = ffn_gate_inp_shexp · h (qwen2moe) */
    int32_t router_before_attn;   /* 1: the router reads the layer input before attn_norm (smallthinker) */
    int32_t qk_norm_full;     /* 1: q and k RMS-normed over the whole projection before RoPE (olmoe) */
    float residual_scale;     /* 0: none; else attention and FFN outputs times it before the residual add */
    float logit_scale;        /* 0: none; else logits times 1/logit_scale */
    const uint8_t *layer_flags;   /* [n_layer] PI2_LAYER_* bits, copied at load; NULL: swa_period's rule */
    int32_t no_mmap;          /* 1: read the whole file into anonymous memory at load instead of mapping it
                                 (llama.cpp's --no-mmap: the weights stay resident; later changes to the file do
                                 not reach them); 0: map it read-only */
} pi2_model_params;

/* Router gating (llama_expert_gating_func_type): probabilities from the router logits. */
typedef enum { PI2_GATING_SOFTMAX = 1, PI2_GATING_SIGMOID = 2, PI2_GATING_SOFTMAX_WEIGHT = 3,
               PI2_GATING_SQRT_SOFTPLUS = 4 } pi2_expert_gating;
/* layer_flags: sliding-window attention; no RoPE; RoPE with rope_base_local */
enum { PI2_LAYER_SWA = 1, PI2_LAYER_NOPE = 2, PI2_LAYER_ROPE_LOCAL = 4 };

typedef struct pi2_model pi2_model;   /* mapped weights + hyper-parameters; read-only after load */
typedef struct pi2_ctx pi2_ctx;       /* KV cache, scratch buffers, thread pool */

/* Map `path` read-only and check `n_tensors` descriptors against `params` and the file size.
 * PI2_ERR_IO: the file cannot be opened or mapped; PI2_ERR_FORMAT: a descriptor is out of range,
 * has the wrong shape or size, repeats or is missing; PI2_ERR_UNSUPPORTED: a type or arch pi2
 * cannot compute; PI2_ERR_INVALID: NULL arguments or bad hyper-parameters. */
PI2_API pi2_status pi2_model_load(const char *path, const pi2_model_params *params,
                                  const pi2_tensor_desc *tensors, int32_t n_tensors, pi2_model **out);
/* pi2_model_load for a model split across files (llama.cpp's gguf-split parts): part k is mapped at byte bases[k]
 * of one reserved address range, so a descriptor's offset is bases[k] + its offset in part k. bases[0] is 0, each
 * base a multiple of 65536 at or after the end of the part before. Errors as pi2_model_load (PI2_ERR_INVALID for
 * bases out of order); n_parts 1 is pi2_model_load. */
PI2_API pi2_status pi2_model_load_parts(const char *const *paths, const uint64_t *bases, int32_t n_parts,
                                        const pi2_model_params *params, const pi2_tensor_desc *tensors,
                                        int32_t n_tensors, pi2_model **out);
/* Unmap and free (NULL is fine). Free every context of the model first. */
PI2_API void pi2_model_free(pi2_model *model);
/* Repack at load (csrc/model_pack.c): copy the matrices the dense products read into the x8 layout for the
 * packed kernels of table `impl` — attention and output, and with ffn != 0 the FFN's gate, up and down too —
 * where that table has a packed kernel for their type; the mapped pages they replace are released. Results
 * stay bit-identical. Call before any decode; again with ffn = 1 to add the FFN. *bytes (may be NULL) = the
 * bytes the copies hold. PI2_ERR_NOMEM; PI2_ERR_INVALID: NULL model, bad impl. */
PI2_API pi2_status pi2_model_repack(pi2_model *model, int32_t impl, int32_t ffn, int64_t *bytes);
/* The dense prefix of a pi2 file's sparse FFN in memory (csrc/ffn/down_pack.c): n_dense[il] (rounded down to a
 * multiple of 8) of layer il's first, hottest up rows are copied in the x8 layout by the next
 * pi2_model_repack(ffn = 1) and one token computes them all with the gate rows (the active ones' values are the
 * same bits; the rest go unused). Call before that repack. PI2_ERR_INVALID: NULL, n_layer not the model's, or
 * the copies already made. */
PI2_API pi2_status pi2_model_ffn_prefix(pi2_model *model, const int32_t *n_dense, int32_t n_layer);

/* ---- contexts and the forward pass ---- */
typedef struct {
    int32_t n_ctx;      /* positions in the KV cache */
    int32_t n_batch;    /* tokens computed per step of a longer decode (scratch size) */
    int32_t n_threads;  /* compute threads including the caller; results do not depend on it */
    int32_t impl;       /* pi2_impl of the kernels */
    int32_t ctx_shift;  /* 1: a decode that would fill the context first drops half of the positions after the
                           first n_keep and moves the rest down, their keys rotated by RoPE (llama.cpp's context
                           shift, the cache kept in position order); 0: it refuses (PI2_ERR_INVALID) */
    int32_t n_keep;     /* positions a context shift keeps (>= 0) */
    int32_t type_k;     /* ggml type of the K cache: 1 F16; 8 Q8_0, 2 Q4_0, 3 Q4_1, 6 Q5_0, 7 Q5_1 (llama.cpp's
                           -ctk with flash attention off: queries and keys rotated by a Walsh-Hadamard matrix when
                           head_dim is a multiple of 64, keys stored in the type, K·Q by its dot product) */
    int32_t flash_attn; /* 1: attention with llama.cpp's flash attention numbers (-fa on; its CPU default), 0: off */
    int32_t type_v;     /* ggml type of the V cache: 1 F16, or (flash_attn only, as llama.cpp) one of type_k's
                           quantized types, the values stored in the type and read back as floats */
} pi2_ctx_params;

/* n_ctx 4096, n_batch 512 (llama.cpp's n_ubatch), n_threads 1, impl PI2_IMPL_AUTO, no context shift, F16 keys and
 * values, flash attention off. */
PI2_API pi2_ctx_params pi2_ctx_default_params(void);

/* Bytes a context allocates (what pi2_ctx_init makes of the params; the planner budgets with it). */
typedef struct {
    uint32_t size;            /* sizeof(pi2_ctx_sizes), set by the caller */
    int64_t kv_bytes;         /* the KV cache */
    int64_t scratch_bytes;    /* every other buffer: pi2_ctx_init's, the sparse FFN's (a model with down rows), and
                                 the predictor rules' (a model with a predictor: the larger of them) */
} pi2_ctx_sizes;
/* PI2_ERR_INVALID: NULL arguments or bad params (as pi2_ctx_init). */
PI2_API pi2_status pi2_ctx_query(const pi2_model *model, const pi2_ctx_params *params, pi2_ctx_sizes *out);

/* A context on `model` (which must outlive it). PI2_ERR_NOMEM, PI2_ERR_INVALID (bad params), or
 * an error starting threads (PI2_ERR_NOMEM). */
PI2_API pi2_status pi2_ctx_init(pi2_model *model, const pi2_ctx_params *params, pi2_ctx **out);
/* Stop the threads and free (NULL is fine). */
PI2_API void pi2_ctx_free(pi2_ctx *ctx);

/* Evaluate n_tokens tokens after the n_past cached ones and advance n_past. logits receives
 * n_vocab floats of the last token, or n_tokens * n_vocab (row per token) when all_logits is 1, or, when all_logits
 * is -f (1 <= f < n_tokens), (n_tokens - f) * n_vocab: the rows of tokens f.. only (llama-perplexity's outputs).
 * PI2_ERR_INVALID: bad token id, n_tokens < 1, the context would overflow n_ctx, or another decode
 * is running on this context (one decode at a time per context; any thread may call);
 * PI2_ERR_ABORTED: pi2_abort() was called during the decode; n_past is then unchanged;
 * PI2_ERR_IO: a streamed context's read failed (n_past unchanged). */
PI2_API pi2_status pi2_decode(pi2_ctx *ctx, const int32_t *tokens, int32_t n_tokens, float *logits,
                              int32_t all_logits);
/* Keep the first n_keep cached positions and forget the rest (n_past = n_keep; 0 forgets the cache; pi2_ctx_stats
 * has n_past): a prompt cache reuses the prefix it shares with the next prompt. PI2_ERR_INVALID: n_keep outside
 * 0..n_past, or a decode is running. */
PI2_API pi2_status pi2_ctx_truncate(pi2_ctx *ctx, int32_t n_keep);
/* Positions in the KV cache now: pi2_ctx_stats' n_past alone, for a caller that asks once per token (0 for NULL). */
PI2_API int32_t pi2_ctx_n_past(const pi2_ctx *ctx);
/* One token of each of n contexts of the same model in one step (a server's slots): the matrix products of the
 * n tokens share one pass over the weights, each token attends to its own context's cache at its n_past, and each
 * context's n_past advances by one. logits: n * n_vocab floats, row t equal bit for bit to what pi2_decode of
 * tokens[t] on ctxs[t] gives. The contexts must be distinct, not full, on the dense FFN without streaming, NNAPI's
 * hot prefix, a trace hook or experts, and n <= the first context's n_batch (PI2_ERR_INVALID otherwise;
 * PI2_ERR_UNSUPPORTED for a model storing ffn_down as rows). PI2_ERR_ABORTED if pi2_abort() was called on any of
 * them (nothing advances). The first context's threads and scratch do the work. */
PI2_API pi2_status pi2_decode_multi(pi2_ctx *const *ctxs, const int32_t *tokens, int32_t n, float *logits);
/* Ask the running decode to stop at its next layer boundary (each decode clears the flag when it
 * starts). Safe from any thread or a signal handler. */
PI2_API void pi2_abort(pi2_ctx *ctx);

/* ---- sampling ----
 * The top-k cut of a row of n logits (csrc/sample.c): the ids and logits of its k largest, largest first; equal
 * logits in id order, ties at the cut going to the lowest ids. NaN logits are never taken. Returns how many it
 * wrote (min(k, the logits that are numbers)); PI2_ERR_INVALID: NULL pointers, n < 0 or k < 1. ids and vals hold k. */
PI2_API int32_t pi2_top_k(const float *logits, int32_t n, int32_t k, int32_t *ids, float *vals);
/* On n candidates' logits sorted largest first, as llama.cpp's samplers compute them: how many top-p keeps (the
 * shortest head whose softmax mass reaches p, at least min_keep) and how many min-p keeps (the first token and those
 * at least p times as likely as it, at least min_keep); 0 for n = 0. PI2_ERR_INVALID: NULL vals or n < 0. */
PI2_API int32_t pi2_top_p_sorted(const float *vals, int32_t n, float p, int32_t min_keep);
PI2_API int32_t pi2_min_p_sorted(const float *vals, int32_t n, float p, int32_t min_keep);
/* The final draw (llama_sampler_dist_apply) given its uniform double u in [0, 1): the index of the first candidate
 * whose running double sum of expf(logit - max) reaches u times the total. sorted: vals[0] is the largest.
 * PI2_ERR_INVALID: NULL vals or n < 1. */
PI2_API int32_t pi2_dist(const float *vals, int32_t n, int32_t sorted, double u);
/* The usual chain in one call (llama.cpp's default order: top-k, top-p, min-p, temperature, dist): the top-k cut of
 * a row of n logits (as pi2_top_k), then on its k candidates stages[0..n_stages) in order, each with params[i]
 * (PI2_SAMPLE_TOP_P: p, PI2_SAMPLE_MIN_P: p, PI2_SAMPLE_TEMP: the temperature, <= 0 keeping the first candidate
 * only), then the draw with u (as pi2_dist on sorted candidates). Returns the drawn token id; PI2_SAMPLE_FEW when
 * fewer than k logits are numbers (nothing decided: the caller runs the stages one by one); PI2_ERR_INVALID: NULL
 * pointers, n < 0, k < 1, an unknown stage. ids and vals hold k: the candidates left before the draw come out in
 * their first *n_left (n_left may be NULL). */
enum { PI2_SAMPLE_TOP_P = 1, PI2_SAMPLE_MIN_P = 2, PI2_SAMPLE_TEMP = 3, PI2_SAMPLE_FEW = -100 };
PI2_API int32_t pi2_sample_top_k_chain(const float *logits, int32_t n, int32_t k, const int32_t *stages,
                                       const float *params, int32_t n_stages, int32_t min_keep, double u,
                                       int32_t *ids, float *vals, int32_t *n_left);

/* ---- the sparse FFN ----
 * Which FFN neurons a token computes. Gate rows are computed for every neuron (PI2_FFN_PREDICTED_GATE and
 * PI2_FFN_PWRI_PREDICTOR: see there); up rows only for the active ones; h_i = act(gate_i)·up_i (PI2_ACT_DRELU:
 * relu(gate_i)·relu(up_i), one float product) is 0 for the others. Down as FFN_DOWN: the dense product of h
 * (zeros included, so every rule with all neurons active is the dense FFN bit for bit). Down as
 * FFN_DOWN_ROWS: y = Σ h_i·row_i in groups of PI2_FFN_GROUP neurons: each element of a group's
 * partial sum starts at +0 and adds h_i·v_ij (v = the row's values as pi2_dequantize_rows gives
 * them; one float product, one float sum) for its active neurons in ascending order; y starts at +0
 * and adds the partial sums of groups with an active neuron in ascending order. Bit-identical for any
 * thread count; pi2/reference/sparse_ffn.py is the specification. I8 rows (with FFN_DOWN_SCALE and _COLSCALE): a
 * group's partial sum is the integer scheme of pi2/down_i8.py (kernels/axpy_i8.c), and y is multiplied
 * by the column scales once the groups are added. */
enum { PI2_FFN_GROUP = 64 };  /* neurons per partial sum of FFN_DOWN_ROWS (a group) */

typedef enum {
    PI2_FFN_DENSE = 0,      /* every neuron */
    PI2_FFN_THRESHOLD = 1,  /* |score_i| > thresholds[layer] */
    PI2_FFN_TOPK = 2,       /* the ceil(keep·n_ff) largest |score_i| of each token, ties to the lower index */
    PI2_FFN_RELU = 3,       /* gate_i > 0 */
    PI2_FFN_PREDICTED_GATE = 4, /* a pi2-made predictor ĝ chooses the gate rows: P = {|act(ĝ_i)| > pred_cuts[layer]};
                               gate rows of P only (one token; a batch computes them all);
                               active = P ∩ {|act(gate_i)| > thresholds[layer]} */
    PI2_FFN_PWRI_PREDICTOR = 5  /* PowerInfer's predictor (PWRI files) alone chooses: s = FC2 · relu(FC1 · h), h the
                               residual before ffn_norm, each a matrix product like the model's own,
                               relu(v) = v <= 0 ? 0 : v; active = {s_i >= thresholds[layer]}; gate rows of the active
                               neurons only (one token; a batch computes them all); every layer needs FC1 and FC2;
                               not with score_up */
} pi2_ffn_rule;

typedef enum {
    PI2_PRED_LOWBIT = 0,    /* ĝ = FFN_GATE_PRED · Q8_0(z), block sums in order (pi2/convert/predictor.py) */
    PI2_PRED_LOWRANK = 1    /* ĝ = FC2 · (FC1 · z), each a matrix product like the model's own */
} pi2_pred_kind;

typedef enum {
    PI2_PRED_INPUT_FFN_NORM = 0,   /* z = ffn_norm(h) */
    PI2_PRED_INPUT_ATTN_NORM = 1   /* z = attn_norm of the layer's input (the predictor can run during attention) */
} pi2_pred_input;

typedef struct {
    int32_t rule;             /* pi2_ffn_rule */
    int32_t score_up;         /* 0: score = act(gate); 1: score = act(gate)·up (every up row computed; not
                                 with PI2_FFN_PREDICTED_GATE) */
    float keep;               /* PI2_FFN_TOPK: fraction in (0, 1] */
    const float *thresholds;  /* PI2_FFN_THRESHOLD, _PREDICTED_GATE, _PWRI_PREDICTOR: [n_layer], copied */
    int32_t pred_kind;        /* PI2_FFN_PREDICTED_GATE: pi2_pred_kind; every layer needs its tensors */
    int32_t pred_input;       /* PI2_FFN_PREDICTED_GATE: pi2_pred_input */
    const float *pred_cuts;   /* PI2_FFN_PREDICTED_GATE: [n_layer] t_L − m_L, copied */
} pi2_ffn_params;

/* Set how the context computes FFN layers (the default is PI2_FFN_DENSE) and zero its FFN statistics.
 * PI2_ERR_INVALID: bad rule, keep or NULL thresholds; PI2_ERR_NOMEM. */
PI2_API pi2_status pi2_ctx_set_ffn(pi2_ctx *ctx, const pi2_ffn_params *params);

/* ---- the streamed FFN: the neuron cache of a context ----
 * For files whose down rows and up rows are strided views of one bundle region per layer (pi2 files in
 * the bundle-ud layout), a context can stop reading the bundles through the mapping: each layer's first
 * n_hot neurons (whole clusters) are read once into resident memory, the others are served from an LRU
 * of cluster slots shared by all layers, read with the flash I/O backend (4 KiB-aligned, O_DIRECT when
 * allowed) straight into the slots (csrc/cache/); the read/compute pipeline (csrc/pipeline/) plans each layer's
 * reads. The bundle range of the mapping gets MADV_RANDOM and MADV_DONTNEED and is not touched again. Decode
 * of one token computes hot and cached clusters while the misses are read; a batch reads each layer's whole
 * bundle region sequentially into the slots (dropping the cached clusters). Results are bit-identical to the
 * mapped run.
 * With stream_gate the gate rows (one region of packed rows per layer) are streamed the same way, in their
 * own hot prefixes and slots (two-phase loading): one token under PI2_FFN_PREDICTED_GATE reads the gate clusters
 * of its predicted set P and computes each group of P's gate rows as soon as its reads land, then the
 * bundle clusters of its active set; every other FFN computation (batches, other rules) reads the layer's
 * gate region whole into the gate slots first. Without it the gate rows stay mapped (the fixed region). */
typedef struct {
    const char *path;      /* the model's file (its size must equal the mapping's) */
    int32_t backend;       /* pi2_io_backend, not PI2_IO_AUTO */
    int32_t queue_depth;   /* reads in flight, 1..PI2_IO_MAX_QD */
    int32_t direct;        /* 1: O_DIRECT when the file system allows it */
    int32_t cluster;       /* neurons per cluster: 8, 16, 32 or 64 (divides PI2_FFN_GROUP) */
    int32_t n_slots;       /* cold cluster slots, >= pi2_stream_query's min_slots */
    const int32_t *n_hot;  /* [n_layer] resident prefix per layer, rounded down to whole clusters; NULL: none */
    int32_t stream_gate;   /* 1: the gate rows stream too (then the two fields below count) */
    int32_t n_gate_slots;  /* cold gate-cluster slots, >= min_slots (one layer's gate region fits them) */
    const int32_t *n_gate_hot; /* [n_layer] resident gate rows per layer, rounded down to whole clusters; NULL: none */
    const int32_t *n_early;    /* [n_layer] cold bundle clusters right after the hot prefix whose reads a single token
                                * issues before the layer's attention (clusters nearly every token needs), so they
                                * land while it computes; NULL: none. Ignored when the gate rows stream. */
    /* A MoE file (plain GGUF, PI2_ARCH_MOE): its experts stream instead (the fields above but path, backend,
     * queue_depth and direct are ignored): each selected expert's slices of ffn_{gate,up,down}_exps are read (the
     * enclosing 4 KiB spans) into one of n_expert_slots cold slots (an LRU shared by all layers), or found among
     * the resident hot experts; everything else stays mapped (the fixed region). */
    int32_t n_expert_slots;    /* cold expert slots, >= 1 (one layer's experts of a step are computed in chunks
                                * of at most this many) */
    const uint8_t *expert_hot; /* [n_layer][n_expert] 1: the expert is resident (read once now); NULL: none */
    int32_t expert_ahead;      /* 1: guess layer il+1's experts from layer il's output (its router) and read them
                                * during layer il's FFN and il+1's attention (smallthinker: its early router) */
    int32_t expert_learn;      /* 1: learn hot experts while running: the cold slots of the most routed experts
                                * (rows counted, halved every 256 tokens) are kept out of the LRU, all but 2·k */
    int64_t expert_cold_bytes; /* > 0: the cold slots hold at most this many bytes read (a converted file's slot
                                * holds its gate rows and only the clusters read into it): the least recently used
                                * experts are dropped (their pages freed) to stay under it, so n_expert_slots may
                                * count more slots than whole experts fit; 0: n_expert_slots whole slots */
    const int32_t *expert_pre; /* [n_layer][n_expert] a converted file read in two phases: the expert's leading
                                * bundle clusters (hot-first: the ones most tokens open) read with its gate rows, so
                                * the second phase finds them (a guess: bytes, never results); NULL: none */
} pi2_stream_params;

typedef struct {
    int64_t slot_bytes;    /* bytes of one cold slot */
    int64_t min_slots;     /* fewest slots a context needs (the largest layer's clusters) */
    int64_t hot_bytes;     /* bytes of `layer`'s resident prefix of n_hot neurons */
    int64_t bundle_bytes;  /* bytes from one neuron's record to the next in `layer` */
    int64_t layer_bytes;   /* bytes of `layer`'s bundle region */
    int64_t gate_slot_bytes;   /* bytes of one cold gate-cluster slot (min_slots of them at least) */
    int64_t gate_hot_bytes;    /* bytes of `layer`'s resident prefix of n_hot gate rows */
    int64_t gate_row_bytes;    /* bytes of one gate row of `layer` */
    int64_t gate_layer_bytes;  /* bytes of `layer`'s gate region, 4 KiB-aligned */
} pi2_stream_sizes;

/* Sizes of a streamed context's cache (the gate_* sizes 0 when the gate rows cannot stream: not packed rows).
 * PI2_ERR_INVALID: bad cluster or layer; PI2_ERR_UNSUPPORTED: the model's FFN is not in streamable bundles. */
PI2_API pi2_status pi2_stream_query(const pi2_model *model, int32_t cluster, int32_t layer, int32_t n_hot,
                                    pi2_stream_sizes *out);
/* Stream the context's FFN bundles as `params` says (NULL: back to reading through the mapping), and
 * zero the statistics. Reads the hot prefixes now. Errors: PI2_ERR_IO, PI2_ERR_NOMEM, PI2_ERR_INVALID
 * (bad params, too few slots, an arena of 2 GiB or more, a decode running), PI2_ERR_UNSUPPORTED. */
PI2_API pi2_status pi2_ctx_set_stream(pi2_ctx *ctx, const pi2_stream_params *params);

/* ---- statistics ---- */
typedef struct {
    uint32_t size;         /* sizeof(pi2_ctx_stats), set by the caller */
    int64_t *ffn_active;   /* in: the caller's [n_layer] or NULL; out: active neurons of each layer summed over
                              ffn_tokens */
    int64_t *ffn_predicted;/* in: [n_layer] or NULL; out: PI2_FFN_PREDICTED_GATE's |P| per layer, summed alike
                              (zeros under other rules) */
    int64_t ffn_tokens;    /* tokens that went through the FFN since pi2_ctx_set_ffn */
    int64_t nnapi_runs;    /* prompt-batch products the delegate computed since pi2_ctx_set_nnapi(PI2_NNAPI_BATCHES) */
    int64_t nnapi_fallbacks;   /* ... handed back to the CPU after a failure */
    int64_t nnapi_bytes;   /* bytes of the attached weight copies (0 when none) */
    int64_t hot_runs;      /* layer-tokens whose hot prefix the delegate computed since pi2_ctx_set_nnapi(PI2_NNAPI_HOT) */
    int64_t hot_fallbacks; /* ... the CPU computed after a failure */
    int64_t hot_bytes;     /* bytes the attached hot prefix holds now: copies, staging (made at a graph's first run),
                              output and index scratch; pi2/plan/npu_plan.py's copy_bytes once every graph has run */
    int64_t n_past;        /* positions in the KV cache now */
    int64_t *expert_rows;  /* in: the caller's [n_layer][n_expert] or NULL; out: the (token, slot) rows routed to each
                              expert of each layer since the context was made (PI2_ARCH_MOE; zeros for the others) */
} pi2_ctx_stats;

typedef struct {
    uint32_t size;         /* sizeof(pi2_cache_stats), set by the caller */
    int64_t tokens;        /* single tokens computed by clusters since pi2_ctx_set_stream */
    int64_t hot;           /* needed bundle clusters found in the hot prefix (per token and layer) */
    int64_t hits;          /* needed cold bundle clusters found in a slot */
    int64_t misses;        /* needed cold bundle clusters read */
    int64_t reads;         /* read requests, bundles and gate rows (misses + the large reads of whole layers) */
    int64_t bytes_read;    /* bytes those requests asked for (gate rows included) */
    int64_t layer_loads;   /* whole bundle regions read for batches */
    double io_wait_s;      /* time the decoding thread waited for reads (not hidden by computing) */
    double read_s;         /* time from submitting a layer's reads to the last completion */
    int64_t arena_bytes;   /* resident hot prefixes + slots, bundles and gate rows */
    int64_t hot_bytes;     /* of which hot prefixes (gate rows included) */
    int64_t gate_hot;      /* stream_gate: needed gate clusters (of P, per token and layer) in the hot prefix */
    int64_t gate_hits;     /* ... found in a gate slot */
    int64_t gate_misses;   /* ... read */
    int64_t gate_bytes_read;   /* of bytes_read: gate rows (clusters and whole regions) */
    int64_t gate_layer_loads;  /* whole gate regions read (batches; single tokens of rules other than predicted) */
    int64_t gate_arena_bytes;  /* of arena_bytes: gate hot prefixes + gate slots */
    int64_t gate_hot_bytes;    /* of hot_bytes: gate hot prefixes */
    int64_t early_reads;       /* of misses and reads: bundle clusters read before the layer's attention (n_early) */
    int64_t early_unused;      /* of early_reads: clusters the token's active set did not need after all */
    int64_t layer_loads_ahead; /* of layer_loads + gate_layer_loads: whole regions submitted before their FFN
                                * (during the layer's attention, or the previous layer's FFN in a batch) */
    int64_t expert_hot;        /* MoE: needed experts (per layer and step) found resident */
    int64_t expert_hits;       /* ... found in a cold slot */
    int64_t expert_misses;     /* ... read (their three slices; bytes in bytes_read) */
    int64_t expert_ahead;      /* experts read ahead of their layer's routing (a guess) */
    int64_t expert_ahead_used; /* ... of which the routing then needed (counted in expert_misses too) */
    int64_t expert_rows;       /* (token, slot) rows routed through streamed layers */
    int64_t expert_pinned;     /* cold slots pinned now: hot experts learned while running (expert_learn) */
    int64_t expert_pinned_hits;/* of expert_hits: found in a pinned slot */
    int64_t expert_partial_hits;   /* of expert_hits: a converted file's expert whose slot lacked clusters the token
                                    * opened (they were read) */
    int64_t expert_cl_need;    /* a converted file: bundle clusters of cold experts a step needed (open ones, or all) */
    int64_t expert_cl_found;   /* ... of which were in the slot already */
    int64_t expert_held_bytes; /* bytes the cold slots hold now (read into them) */
    int64_t expert_evicted;    /* experts dropped from a slot (replaced, or their pages given back to keep
                                * expert_cold_bytes) */
    int64_t expert_slots_held; /* cold slots holding an expert now */
} pi2_cache_stats;

/* From now on, count the neurons of ReLU-family experts that routed rows open: counts[(il·n_expert + e)·n_ff_exp + r]
 * += 1 for each (token, slot) routed to expert e of layer il whose gate row r is > 0 (`pi2 convert`'s profile), and
 * clusters[il] += the runs of `cluster` consecutive neurons holding an open one, per routed row (what reading only
 * open clusters of a converted file's bundles costs). The caller's zeroed buffers of n_layer·n_expert·n_ff_exp and
 * n_layer values, kept until the next call; NULL: not counted. Experts computed from the mapping only (not while
 * they stream). PI2_ERR_INVALID: NULL context, a model without experts, or a cluster outside 1..n_ff_exp. */
PI2_API pi2_status pi2_ctx_count_expert_neurons(pi2_ctx *ctx, int64_t *counts, int64_t *clusters, int32_t cluster);

/* The context's figures into `out` (NULL: skipped) and, for a streamed context, its neuron cache's into `cache`
 * (NULL: skipped). PI2_ERR_INVALID: NULL context, a size of 0, or `cache` given for a context not streamed. */
PI2_API pi2_status pi2_ctx_get_stats(const pi2_ctx *ctx, pi2_ctx_stats *out, pi2_cache_stats *cache);

/* ---- the NNAPI delegate (csrc/nnapi/) ----
 * Android's Neural Networks API, opened with dlopen at run time (never linked, so one build runs
 * everywhere). Graphs of FULLY_CONNECTED operations over F16 (or F32) copies of the weights, made once
 * when a graph is created; one compilation per batch size, cached; runs started asynchronously so the
 * CPU computes meanwhile. Every failure of the delegate returns PI2_ERR_UNSUPPORTED: the caller computes
 * that operation on the CPU; a graph that failed to compile or run is not tried again, and the reason is
 * kept once in the notes. */
typedef struct pi2_nnapi pi2_nnapi;               /* the opened library, its devices and notes */

typedef struct {
    const char *lib_path;        /* NULL: "libneuralnetworks.so" (the dynamic linker's search) */
    int32_t accelerators_only;   /* 1: compile for GPU/accelerator devices only; 0: any device listed */
    int32_t weight_type;         /* 1: F16 weights and activations (default); 0: F32 with relaxed F16 math */
    int32_t max_shapes;          /* compiled batch sizes kept per graph, least recently used dropped (4) */
    int32_t batch_matmul;        /* 1: BATCH_MATMUL (x · Wᵀ, then RELU where fused) instead of FULLY_CONNECTED
                                    when the runtime and every selected device have feature level 6 */
} pi2_nnapi_params;

typedef struct {
    const char *name;            /* the driver's name, e.g. "qti-gpu", "nnapi-reference" */
    int32_t type;                /* NNAPI DeviceTypeCode: 0 unknown, 1 other, 2 CPU, 3 GPU, 4 accelerator */
    int64_t feature_level;       /* 27..31, then 1000006.. */
    int32_t selected;            /* 1: graphs compile for this device */
} pi2_nnapi_device;

enum { PI2_NNAPI_MAX_DEVICES = 16 };

typedef struct {
    uint32_t size;               /* sizeof(pi2_nnapi_info), set by the caller */
    int64_t runtime_feature_level;
    const char *notes;           /* why the delegate fell back to the CPU, one line per distinct reason ("" when
                                    it never did); lives as long as the delegate */
    int32_t n_devices;
    pi2_nnapi_device devices[16];/* [n_devices] (PI2_NNAPI_MAX_DEVICES); names live as long as the delegate */
} pi2_nnapi_info;

/* Open the library and list its devices; NULL params: lib_path NULL, accelerators_only 0, weight_type 1 (F16),
 * max_shapes 4, batch_matmul 0. PI2_ERR_UNSUPPORTED: no library, a missing function, or a
 * failing device query (the message says which); PI2_ERR_INVALID: NULL out or bad params. */
PI2_API pi2_status pi2_nnapi_open(const pi2_nnapi_params *params, pi2_nnapi **out);
/* Close (NULL is fine). Detach it from contexts first. */
PI2_API void pi2_nnapi_close(pi2_nnapi *d);
/* The runtime's level, the devices and the notes now. PI2_ERR_INVALID: NULL arguments or size. */
PI2_API pi2_status pi2_nnapi_get_info(const pi2_nnapi *d, pi2_nnapi_info *out);
/* The planner's measure of the delegate: a hot-FFN graph (pi2_test.h's pi2_nnapi_ffn_create) of n_hot neurons of
 * random F32 weights of width n_embd and activation `act`, run once on one token (compiling it), then `runs` times;
 * *best_seconds: the fastest of those. PI2_ERR_UNSUPPORTED: the graph failed (as the engine would fall back);
 * PI2_ERR_INVALID; PI2_ERR_NOMEM. */
PI2_API pi2_status pi2_nnapi_bench_ffn(pi2_nnapi *d, int32_t act, int32_t n_embd, int32_t n_hot, int32_t runs,
                                       double *best_seconds);

/* PI2_NNAPI_BATCHES: hand the dense matrix products of prompt batches of >= min_batch tokens in ctx (every layer's
 * q/k/v, output, gate/up and down) to d, with weight copies made now; NULL d detaches. d must outlive
 * the context or a later detach. A product whose graph fails runs on the CPU. PI2_ERR_UNSUPPORTED or
 * PI2_ERR_NOMEM: nothing attached (n_hot unused).
 * PI2_NNAPI_HOT: hand the hot prefix of single-token decode to d (nnapi/hot_ffn.c): for each layer with n_hot[il] > 0
 * ([n_layer] counts), a hot-FFN graph over neurons 0..n_hot[il]-1 of ffn_gate, ffn_up and the down rows
 * (F16 copies made now). A token's sparse FFN then starts the graph before its gate rows, computes the
 * rule's active neurons from n_hot[il] on with the CPU meanwhile, and adds the graph's output: the hot
 * neurons are all computed, densely, in the graph's F16 arithmetic. NULL d detaches; d must outlive the
 * context or a later detach. A layer whose graph fails to compile or run is computed by the CPU alone
 * (for a failed run, that token again from its active list). PI2_ERR_INVALID: a count outside 0..n_ff, or
 * a layer without down rows; PI2_ERR_UNSUPPORTED (GELU, no device selected) or PI2_ERR_NOMEM: nothing attached
 * (min_batch unused). Each use is attached or detached on its own; PI2_ERR_INVALID: another `use`. */
typedef enum { PI2_NNAPI_BATCHES = 1, PI2_NNAPI_HOT = 2 } pi2_nnapi_use;
PI2_API pi2_status pi2_ctx_set_nnapi(pi2_ctx *ctx, int32_t use, pi2_nnapi *d, int32_t min_batch, const int32_t *n_hot);

/* ---- flash I/O (csrc/io/): aligned reads of one file, and the probe that picks a backend ----
 * Backends: io_uring (raw system calls), Linux native AIO, a pread thread pool, mmap (MADV_RANDOM,
 * copies in the submitting thread). Every backend returns the same bytes for the same requests.
 * io_uring is refused (PI2_ERR_UNSUPPORTED) until pi2_io_probe has run it in a child in this process
 * and seen it work: Android's app sandbox kills a process that calls it (SIGSYS). The reads themselves
 * (submit, reap) are the engine's own (the neuron cache); pi2_test.h declares them for tests. */
typedef enum { PI2_IO_AUTO = 0, PI2_IO_URING = 1, PI2_IO_AIO = 2, PI2_IO_PREAD = 3, PI2_IO_MMAP = 4 } pi2_io_backend;
enum { PI2_IO_ALIGN = 4096, PI2_IO_MAX_QD = 1024, PI2_IO_N_BACKENDS = 4 };

typedef struct pi2_io pi2_io;   /* one open file and one backend's queue; one thread at a time */

typedef struct {
    int32_t backend;      /* pi2_io_backend, not PI2_IO_AUTO (Python resolves auto with the probe) */
    int32_t queue_depth;  /* requests in flight at most, 1..PI2_IO_MAX_QD (pread: min(it, 64) threads) */
    int32_t direct;       /* 1: O_DIRECT when the file system allows it, else buffered; 0: buffered */
    int32_t drop_cache;   /* 1: when buffered, drop every range read from the page cache (DONTNEED) */
} pi2_io_params;

typedef struct {
    int32_t backend;      /* pi2_io_backend */
    int32_t direct;       /* 1: O_DIRECT is in effect */
    int32_t queue_depth;
    int32_t fd;           /* the descriptor the handle reads (owned by it) */
    int64_t file_size;    /* bytes, at open */
    const char *note;     /* how the file was opened, e.g. why O_DIRECT was not used; lives as long as io */
} pi2_io_info;

/* Open `path` for reading and describe the handle in *info (NULL: skipped). O_DIRECT falls back to buffered reads
 * when the open or the first aligned read fails with EINVAL, or statx says the file has no direct I/O (the note
 * says which). PI2_ERR_IO: cannot open/stat/map; PI2_ERR_UNSUPPORTED: the kernel refuses the backend (io_setup,
 * io_uring_setup) or io_uring was not cleared by a probe; PI2_ERR_INVALID; PI2_ERR_NOMEM. */
PI2_API pi2_status pi2_io_open(const char *path, const pi2_io_params *params, pi2_io **out, pi2_io_info *info);
/* Wait for every request in flight, then close (NULL is fine). */
PI2_API void pi2_io_close(pi2_io *io);

/* Random reads of `block` bytes (a multiple of PI2_IO_ALIGN, <= the file size) at aligned offsets, qd in flight
 * (<= the handle's queue_depth), for `seconds`; offsets from `seed`. A buffered handle drops the file from the page
 * cache first and every range it reads, so the page cache never serves a repeat. errors: reads that failed. */
typedef struct { int64_t reads, bytes, errors; double seconds; } pi2_io_bench_result;
PI2_API pi2_status pi2_io_bench(pi2_io *io, uint64_t block, int32_t qd, double seconds, uint64_t seed,
                                pi2_io_bench_result *out);

/* The probe: for each backend in the order uring, aio, pread, mmap, a forked child opens `path` with
 * it, checks its bytes against pread, and times 16 concurrent 4 KiB reads against single ones (SERIAL
 * unless the batch takes under 0.55 of the time of the reads one by one, in one of two rounds); the
 * child's exit code and a report through a pipe are the verdict, a child killed by a signal means the
 * backend is refused (the parent never makes the call itself). A child that takes over 10 s is killed. */
typedef enum {
    PI2_IO_VERDICT_OK = 0,          /* works, and reads run concurrently (or come from memory) */
    PI2_IO_VERDICT_SERIAL = 1,      /* works, but concurrent reads do not overlap */
    PI2_IO_VERDICT_REFUSED = 2,     /* the child was killed by a signal (seccomp: SIGSYS) */
    PI2_IO_VERDICT_UNAVAILABLE = 3, /* the kernel returned an error (ENOSYS, EPERM, ...) */
    PI2_IO_VERDICT_FAILED = 4       /* wrong bytes, a read error, or the child hung */
} pi2_io_verdict_code;

enum { PI2_IO_PROBE_BUFFERED = 1 };   /* pi2_io_probe flag: probe without O_DIRECT */

typedef struct {
    int32_t backend;        /* pi2_io_backend */
    int32_t verdict;        /* pi2_io_verdict_code */
    int32_t signal;         /* the signal that killed the child (REFUSED), else 0 */
    int32_t direct;         /* 1: the child read with O_DIRECT */
    double read_us;         /* wall time of one read alone (median) */
    double read_submit_us;  /* of which inside submit (median) */
    double submit_us;       /* time inside submit for 16 reads */
    double batch_us;        /* 16 reads from submit to the last completion */
    char reason[200];       /* one line */
} pi2_io_verdict;

/* out: PI2_IO_N_BACKENDS verdicts in probe order; *chosen: the first OK backend, else the first SERIAL,
 * else PI2_IO_AUTO (none works). flags: PI2_IO_PROBE_BUFFERED or 0. PI2_ERR_INVALID: NULL arguments or unknown
 * flags; PI2_ERR_IO: path unreadable, fork or pipe failed. */
PI2_API pi2_status pi2_io_probe(const char *path, int32_t flags, pi2_io_verdict *out, int32_t *chosen);

#endif
