/* traits.c — the dispatch tables: filled once from CPU features, then read-only.
 * Does: hold the reference, baseline-SIMD and auto tables, fill them on first use
 *       (pthread_once), answer pi2_traits(type, impl).
 * Does not: contain kernels (ref.c, x86.c, neon.c, axpy.c, axpy_i8.c, axpy_qx1.c) or read the environment (the CPU
 *       variant does, pack.c: PI2_CPU_VARIANT may cap the auto table at the base one); tests select the
 *       reference by passing impl = PI2_K_IMPL_REF, never through a global switch. */
#include "traits.h"
#include "pack.h"

#include <pthread.h>

static pi2_type_traits tables[3][PI2_T_COUNT];  /* [impl][type]; written once, inside init_once */
static uint32_t auto_isa;                       /* written once, inside init_once */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init_once(void) {
    pi2_kernels_fill_ref(tables[PI2_K_IMPL_REF]);
    pi2_kernels_fill_axpy_ref(tables[PI2_K_IMPL_REF]);
    pi2_kernels_fill_axpy_i8(tables[PI2_K_IMPL_REF]);
    pi2_kernels_fill_axpy_qx1(tables[PI2_K_IMPL_REF]);
    memcpy(tables[PI2_K_IMPL_BASE], tables[PI2_K_IMPL_REF], sizeof tables[0]);
    memcpy(tables[PI2_K_IMPL_AUTO], tables[PI2_K_IMPL_REF], sizeof tables[0]);
    const uint32_t base_isa = pi2_kernels_install_x86(tables[PI2_K_IMPL_BASE], 0)
                            | pi2_kernels_install_neon(tables[PI2_K_IMPL_BASE], 0);
    const int ext = pi2_kernels_variant()->allow_ext;   /* 0: PI2_CPU_VARIANT forces the baseline (pack.h) */
    auto_isa = pi2_kernels_install_x86(tables[PI2_K_IMPL_AUTO], ext)
             | pi2_kernels_install_neon(tables[PI2_K_IMPL_AUTO], ext);
    if (base_isa & PI2_K_AVX2) {   /* the AVX2 grouped row sums need what the AVX2 vec_dots need */
        pi2_kernels_install_axpy_x86(tables[PI2_K_IMPL_BASE], 0);
        pi2_kernels_install_axpy_x86(tables[PI2_K_IMPL_AUTO], ext);
    }
    pi2_kernels_install_axpy_i8(tables[PI2_K_IMPL_BASE], base_isa);
    pi2_kernels_install_axpy_i8(tables[PI2_K_IMPL_AUTO], auto_isa);
    pi2_kernels_install_axpy_qx1(tables[PI2_K_IMPL_BASE], base_isa);
    pi2_kernels_install_axpy_qx1(tables[PI2_K_IMPL_AUTO], auto_isa);
}

const pi2_type_traits *pi2_traits(int32_t type, int32_t impl) {
    pthread_once(&once, init_once);
    if (type < 0 || type >= PI2_T_COUNT || impl < 0 || impl > 2) return NULL;
    if (tables[PI2_K_IMPL_REF][type].block_size == 0) return NULL;
    return &tables[impl][type];
}

uint32_t pi2_kernels_isa(void) {
    pthread_once(&once, init_once);
    return auto_isa;
}
