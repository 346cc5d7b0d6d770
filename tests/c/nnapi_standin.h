/* nnapi_standin.h — what the two files of the stand-in libneuralnetworks.so (nnapi_standin.c: control, devices, models;
 * nnapi_standin_exec.c: compilations, executions) share: the control settings and counters, a model's operands and
 * operations, and their sizes. Internal symbols are hidden: the library exports the NNAPI ABI and standin_* only.
 * Does not: declare the ABI (csrc/nnapi/abi.h does, for the delegate too). */
#ifndef PI2_NNAPI_STANDIN_H
#define PI2_NNAPI_STANDIN_H
#include "nnapi/abi.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define EXPORT __attribute__((visibility("default")))
#define HIDDEN __attribute__((visibility("hidden")))
#define MAX_OPERANDS 64
#define MAX_OPS 16

/* standin_set's keys (nnapi_standin.c), read by both files. */
struct standin_ctl {
    int fail_compile, fail_start, fail_execute, unsupported, accelerator, device_level, runtime_level, delay_ms;
};
HIDDEN extern struct standin_ctl ctl;
HIDDEN extern int executions_done;       /* under lock */
HIDDEN extern pthread_mutex_t lock;

typedef struct {
    int32_t type;
    uint32_t n_dims, dims[4];
    const void *value;        /* constant data (copied when <= 128 bytes, else the caller's pointer) */
    size_t length;
    uint8_t copy[NN_MAX_SIZE_OF_IMMEDIATELY_COPIED_VALUES];
} operand;

typedef struct { int32_t type; uint32_t n_in, in[4], out; } operation;

struct ANeuralNetworksModel {
    int finished, relaxed;
    uint32_t n_operands, n_ops, n_inputs, n_outputs, inputs[4], outputs[4];
    operand opd[MAX_OPERANDS];
    operation op[MAX_OPS];
};

static inline size_t elem_size(int32_t t) { return t == NN_TENSOR_FLOAT16 ? 2 : 4; }
static inline size_t n_elems(const operand *o) {
    size_t n = 1;
    for (uint32_t i = 0; i < o->n_dims; i++) n *= o->dims[i];
    return n;
}
static inline int is_tensor(int32_t t) { return t == NN_TENSOR_FLOAT32 || t == NN_TENSOR_FLOAT16; }

#endif
