/* nnapi/delegate.h — what nnapi.c (the library and its devices) and nnapi/graph.c (graphs) share.
 * Owns: the table of resolved NNAPI functions, the delegate's state, and the note/result-name helpers. */
#ifndef PI2_NNAPI_DELEGATE_H
#define PI2_NNAPI_DELEGATE_H
#include "internal.h"
#include "nnapi/abi.h"

#define MAX_DEVICES 16
#define MAX_SHAPES 16   /* compiled batch sizes a graph may keep (pi2_nnapi_params.max_shapes) */

typedef struct {
    nn_Model_create Model_create;
    nn_Model_free Model_free;
    nn_Model_addOperand Model_addOperand;
    nn_Model_setOperandValue Model_setOperandValue;
    nn_Model_addOperation Model_addOperation;
    nn_Model_identifyInputsAndOutputs Model_identifyInputsAndOutputs;
    nn_Model_finish Model_finish;
    nn_Model_getSupportedOperationsForDevices Model_getSupportedOperationsForDevices;
    nn_Compilation_createForDevices Compilation_createForDevices;
    nn_Compilation_setPreference Compilation_setPreference;
    nn_Compilation_finish Compilation_finish;
    nn_Compilation_free Compilation_free;
    nn_Execution_create Execution_create;
    nn_Execution_setInput Execution_setInput;
    nn_Execution_setOutput Execution_setOutput;
    nn_Execution_startCompute Execution_startCompute;
    nn_Execution_free Execution_free;
    nn_Event_wait Event_wait;
    nn_Event_free Event_free;
    nn_getDeviceCount getDeviceCount;
    nn_getDevice getDevice;
    nn_Device_getName Device_getName;
    nn_Device_getType Device_getType;
    nn_Device_getFeatureLevel Device_getFeatureLevel;
    /* optional */
    nn_Model_relaxComputationFloat32toFloat16 Model_relaxComputationFloat32toFloat16;
    nn_getRuntimeFeatureLevel getRuntimeFeatureLevel;
} nn_api;

struct pi2_nnapi {
    void *lib;
    nn_api f;
    pi2_nnapi_params p;
    int64_t runtime_level;
    int32_t n_dev, n_sel;
    pi2_nnapi_device dev[MAX_DEVICES];
    const ANeuralNetworksDevice *handle[MAX_DEVICES];
    const ANeuralNetworksDevice *sel[MAX_DEVICES];   /* the selected devices, for compilation */
    char names[MAX_DEVICES][64];
    char notes[4096];
};

/* Record a reason to fall back (once per distinct text) and return PI2_ERR_UNSUPPORTED. */
pi2_status pi2_nnapi_note(pi2_nnapi *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* NNAPI's name of a ResultCode. */
const char *pi2_nnapi_result_name(int rc);

#endif
