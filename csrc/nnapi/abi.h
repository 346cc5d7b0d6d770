/* nnapi/abi.h — the subset of Android's NNAPI C ABI that nnapi.c uses, declared by pi2 itself.
 * Owns: enum values (docs reference/nnapi.md §4, AOSP NeuralNetworksTypes.h; ABI-frozen) and the
 *       function-pointer types nnapi.c resolves with dlsym. Nothing here is linked: Termux has no
 *       libneuralnetworks.so stub, so the library is opened at run time.
 * Also used by tests/c/nnapi_standin.c, the CPU stand-in library the tests build. */
#ifndef PI2_NNAPI_ABI_H
#define PI2_NNAPI_ABI_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* OperandCode */
enum {
    NN_FLOAT32 = 0, NN_INT32 = 1, NN_UINT32 = 2, NN_TENSOR_FLOAT32 = 3, NN_TENSOR_INT32 = 4,
    NN_TENSOR_QUANT8_ASYMM = 5, NN_BOOL = 6, NN_TENSOR_QUANT16_SYMM = 7, NN_TENSOR_FLOAT16 = 8,
    NN_TENSOR_BOOL8 = 9, NN_FLOAT16 = 10, NN_TENSOR_QUANT8_SYMM_PER_CHANNEL = 11,
    NN_TENSOR_QUANT16_ASYMM = 12, NN_TENSOR_QUANT8_SYMM = 13, NN_TENSOR_QUANT8_ASYMM_SIGNED = 14,
    NN_MODEL = 15
};

/* OperationCode (subset) */
enum {
    NN_OP_ADD = 0, NN_OP_DEQUANTIZE = 6, NN_OP_FULLY_CONNECTED = 9, NN_OP_LOGISTIC = 14, NN_OP_MUL = 18, NN_OP_RELU = 19,
    NN_OP_RESHAPE = 22, NN_OP_CAST = 45, NN_OP_QUANTIZE = 72, NN_OP_BATCH_MATMUL = 102
};

/* FuseCode */
enum { NN_FUSED_NONE = 0, NN_FUSED_RELU = 1, NN_FUSED_RELU1 = 2, NN_FUSED_RELU6 = 3 };

/* PreferenceCode */
enum { NN_PREFER_LOW_POWER = 0, NN_PREFER_FAST_SINGLE_ANSWER = 1, NN_PREFER_SUSTAINED_SPEED = 2 };

/* DeviceTypeCode */
enum { NN_DEVICE_UNKNOWN = 0, NN_DEVICE_OTHER = 1, NN_DEVICE_CPU = 2, NN_DEVICE_GPU = 3, NN_DEVICE_ACCELERATOR = 4 };

/* ResultCode */
enum {
    NN_NO_ERROR = 0, NN_OUT_OF_MEMORY = 1, NN_INCOMPLETE = 2, NN_UNEXPECTED_NULL = 3, NN_BAD_DATA = 4,
    NN_OP_FAILED = 5, NN_BAD_STATE = 6, NN_UNMAPPABLE = 7, NN_OUTPUT_INSUFFICIENT_SIZE = 8,
    NN_UNAVAILABLE_DEVICE = 9, NN_MISSED_DEADLINE_TRANSIENT = 10, NN_MISSED_DEADLINE_PERSISTENT = 11,
    NN_RESOURCE_EXHAUSTED_TRANSIENT = 12, NN_RESOURCE_EXHAUSTED_PERSISTENT = 13, NN_DEAD_OBJECT = 14
};

/* FeatureLevelCode: 27..31 are Android API levels; later levels are 1000006, 1000007, 1000008. */
enum { NN_FEATURE_LEVEL_1 = 27, NN_FEATURE_LEVEL_3 = 29, NN_FEATURE_LEVEL_5 = 31 };
#define NN_FEATURE_LEVEL_6 1000006LL   /* BATCH_MATMUL */
#define NN_MAX_SIZE_OF_IMMEDIATELY_COPIED_VALUES 128

typedef struct ANeuralNetworksModel ANeuralNetworksModel;
typedef struct ANeuralNetworksCompilation ANeuralNetworksCompilation;
typedef struct ANeuralNetworksExecution ANeuralNetworksExecution;
typedef struct ANeuralNetworksEvent ANeuralNetworksEvent;
typedef struct ANeuralNetworksDevice ANeuralNetworksDevice;

typedef struct ANeuralNetworksOperandType {
    int32_t type;              /* OperandCode */
    uint32_t dimensionCount;   /* 0 for scalars */
    const uint32_t *dimensions;
    float scale;               /* quantized types only, else 0 */
    int32_t zeroPoint;         /* quantized types only, else 0 */
} ANeuralNetworksOperandType;

/* Function types, named after the NNAPI function minus the "ANeuralNetworks" prefix. */
typedef int (*nn_Model_create)(ANeuralNetworksModel **model);
typedef void (*nn_Model_free)(ANeuralNetworksModel *model);
typedef int (*nn_Model_addOperand)(ANeuralNetworksModel *model, const ANeuralNetworksOperandType *type);
typedef int (*nn_Model_setOperandValue)(ANeuralNetworksModel *model, int32_t index, const void *buffer, size_t length);
typedef int (*nn_Model_addOperation)(ANeuralNetworksModel *model, int32_t type, uint32_t inputCount,
                                     const uint32_t *inputs, uint32_t outputCount, const uint32_t *outputs);
typedef int (*nn_Model_identifyInputsAndOutputs)(ANeuralNetworksModel *model, uint32_t inputCount,
                                                 const uint32_t *inputs, uint32_t outputCount, const uint32_t *outputs);
typedef int (*nn_Model_relaxComputationFloat32toFloat16)(ANeuralNetworksModel *model, bool allow);
typedef int (*nn_Model_finish)(ANeuralNetworksModel *model);
typedef int (*nn_Model_getSupportedOperationsForDevices)(const ANeuralNetworksModel *model,
                                                         const ANeuralNetworksDevice *const *devices,
                                                         uint32_t numDevices, bool *supportedOps);
typedef int (*nn_Compilation_createForDevices)(ANeuralNetworksModel *model, const ANeuralNetworksDevice *const *devices,
                                               uint32_t numDevices, ANeuralNetworksCompilation **compilation);
typedef int (*nn_Compilation_setPreference)(ANeuralNetworksCompilation *compilation, int32_t preference);
typedef int (*nn_Compilation_finish)(ANeuralNetworksCompilation *compilation);
typedef void (*nn_Compilation_free)(ANeuralNetworksCompilation *compilation);
typedef int (*nn_Execution_create)(ANeuralNetworksCompilation *compilation, ANeuralNetworksExecution **execution);
typedef int (*nn_Execution_setInput)(ANeuralNetworksExecution *execution, int32_t index,
                                     const ANeuralNetworksOperandType *type, const void *buffer, size_t length);
typedef int (*nn_Execution_setOutput)(ANeuralNetworksExecution *execution, int32_t index,
                                      const ANeuralNetworksOperandType *type, void *buffer, size_t length);
typedef int (*nn_Execution_startCompute)(ANeuralNetworksExecution *execution, ANeuralNetworksEvent **event);
typedef void (*nn_Execution_free)(ANeuralNetworksExecution *execution);
typedef int (*nn_Event_wait)(ANeuralNetworksEvent *event);
typedef void (*nn_Event_free)(ANeuralNetworksEvent *event);
typedef int (*nn_getDeviceCount)(uint32_t *numDevices);
typedef int (*nn_getDevice)(uint32_t devIndex, ANeuralNetworksDevice **device);
typedef int (*nn_Device_getName)(const ANeuralNetworksDevice *device, const char **name);
typedef int (*nn_Device_getType)(const ANeuralNetworksDevice *device, int32_t *type);
typedef int (*nn_Device_getFeatureLevel)(const ANeuralNetworksDevice *device, int64_t *featureLevel);
typedef int64_t (*nn_getRuntimeFeatureLevel)(void);

#endif
