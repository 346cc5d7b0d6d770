#include "traits.h"
uint32_t pi2_kernels_install_neon(pi2_type_traits *t, int allow_ext) { (void)t; (void)allow_ext; return 0; }
