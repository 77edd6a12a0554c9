// cuDNN's graph API in the calls the CUDA backend needs (cuda_dnn_graph.h).
#include <stdlib.h>

#include "backend/cuda/cuda_dnn_graph.h"

bool dc_dnn_ok_at(dc_dnn_graph *g, cudnnStatus_t st, int line) {
    if (g->st == CUDNN_STATUS_SUCCESS && st != CUDNN_STATUS_SUCCESS) g->st = st, g->line = line;
    return g->st == CUDNN_STATUS_SUCCESS;
}

void dc_dnn_graph_free(dc_dnn_graph *g) {
    if (!g) return;
    for (int i = g->n - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(g->own[i]);
    free(g);
}

cudnnBackendDescriptor_t dc_dnn_make_at(dc_dnn_graph *g, cudnnBackendDescriptorType_t type, int line) {
    cudnnBackendDescriptor_t d = NULL;
    if (g->st != CUDNN_STATUS_SUCCESS) return NULL;
    if (g->n == (int)(sizeof g->own / sizeof g->own[0])) {
        dc_dnn_ok_at(g, CUDNN_STATUS_INTERNAL_ERROR, line);
        return NULL;
    }
    if (dc_dnn_ok_at(g, cudnnBackendCreateDescriptor(type, &d), line)) g->own[g->n++] = d;
    return d;
}

void dc_dnn_set_at(dc_dnn_graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                   cudnnBackendAttributeType_t type, int64_t count, const void *value, int line) {
    if (g->st == CUDNN_STATUS_SUCCESS) dc_dnn_ok_at(g, cudnnBackendSetAttribute(d, name, type, count, value), line);
}

void dc_dnn_finish_at(dc_dnn_graph *g, cudnnBackendDescriptor_t d, int line) {
    if (g->st == CUDNN_STATUS_SUCCESS) dc_dnn_ok_at(g, cudnnBackendFinalize(d), line);
}

cudnnBackendDescriptor_t dc_dnn_tensor(dc_dnn_graph *g, int64_t uid, cudnnDataType_t dt, const int64_t dim[4],
                                       const int64_t stride[4], bool by_value) {
    cudnnBackendDescriptor_t t = DNN_G_MAKE(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const bool virt = uid == 0;
    if (virt) uid = g->next_uid++;
    const int64_t align = 16;
    DNN_G_SET(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    DNN_G_SET(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim);
    DNN_G_SET(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride);
    DNN_G_SET(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    DNN_G_SET(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    DNN_G_SET(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
    if (by_value) DNN_G_SET(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    DNN_G_FINISH(g, t);
    return t;
}

cudnnBackendDescriptor_t dc_dnn_conv(dc_dnn_graph *g, int64_t stride, int64_t ph, int64_t pw) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    const int64_t dims = 2, dil[2] = {1, 1}, str[2] = {stride, stride}, pad[2] = {ph, pw};
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    cudnnBackendDescriptor_t cd = DNN_G_MAKE(g, CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    DNN_G_SET(g, cd, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    DNN_G_SET(g, cd, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
    DNN_G_SET(g, cd, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims);
    DNN_G_SET(g, cd, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil);
    DNN_G_SET(g, cd, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, str);
    DNN_G_SET(g, cd, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
    DNN_G_SET(g, cd, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
    DNN_G_FINISH(g, cd);
    return cd;
}

cudnnBackendDescriptor_t dc_dnn_pointwise(dc_dnn_graph *g, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                                          cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t pw = DNN_G_MAKE(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    DNN_G_SET(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    DNN_G_SET(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    DNN_G_FINISH(g, pw);
    cudnnBackendDescriptor_t op = DNN_G_MAKE(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
    DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b) DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    DNN_G_FINISH(g, op);
    return op;
}

cudnnBackendDescriptor_t dc_dnn_matmul(dc_dnn_graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                                       cudnnBackendDescriptor_t c) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t m = DNN_G_MAKE(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    DNN_G_SET(g, m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    DNN_G_FINISH(g, m);
    cudnnBackendDescriptor_t op = DNN_G_MAKE(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m);
    DNN_G_FINISH(g, op);
    return op;
}

cudnnBackendDescriptor_t dc_dnn_reduction(dc_dnn_graph *g, cudnnReduceTensorOp_t how, cudnnBackendDescriptor_t x,
                                          cudnnBackendDescriptor_t y) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t r = DNN_G_MAKE(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    DNN_G_SET(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how);
    DNN_G_SET(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    DNN_G_FINISH(g, r);
    cudnnBackendDescriptor_t op = DNN_G_MAKE(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r);
    DNN_G_FINISH(g, op);
    return op;
}

cudnnBackendDescriptor_t dc_dnn_reshape(dc_dnn_graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = DNN_G_MAKE(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    DNN_G_SET(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    DNN_G_FINISH(g, op);
    return op;
}

cudnnBackendDescriptor_t dc_dnn_op_graph(dc_dnn_graph *g, cudnnHandle_t dnn, const cudnnBackendDescriptor_t *ops,
                                         int64_t n) {
    cudnnBackendDescriptor_t graph = DNN_G_MAKE(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    DNN_G_SET(g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, ops);
    DNN_G_SET(g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &dnn);
    DNN_G_FINISH(g, graph);
    return graph;
}

bool dc_dnn_nondeterministic(cudnnBackendDescriptor_t cfg) {
    cudnnBackendDescriptor_t eng = NULL;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng)) return true;
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    int64_t n = 0;
    bool found = false, known =
        !cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eng) &&
        !cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                  CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes);
    for (int64_t i = 0; known && i < n; i++) found = found || notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
    cudnnBackendDestroyDescriptor(eng);
    return !known || found;
}

int dc_dnn_plans(dc_dnn_graph *g, cudnnHandle_t dnn, cudnnBackendDescriptor_t graph, int64_t max_ws,
                 bool deterministic, cudnnBackendDescriptor_t *plans, int64_t *ws, int max) {
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    cudnnBackendDescriptor_t heur = DNN_G_MAKE(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    DNN_G_SET(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    DNN_G_SET(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    DNN_G_FINISH(g, heur);
    if (g->st != CUDNN_STATUS_SUCCESS) return 0;
    enum { MAX_CFG = 8 };
    cudnnBackendDescriptor_t cfg[MAX_CFG];
    for (int i = 0; i < MAX_CFG; i++) cfg[i] = DNN_G_MAKE(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    int64_t n = 0;
    if (g->st == CUDNN_STATUS_SUCCESS)
        dc_dnn_ok_at(g, cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                                 MAX_CFG, &n, cfg), __LINE__);
    if (g->st == CUDNN_STATUS_SUCCESS && n == 0) dc_dnn_ok_at(g, CUDNN_STATUS_NOT_SUPPORTED, __LINE__);  // no engine
    int got_plans = 0;
    cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
    for (int64_t i = 0; g->st == CUDNN_STATUS_SUCCESS && i < n && got_plans < max; i++) {
        cudnnBackendDescriptor_t plan = NULL;
        cudnnStatus_t st = deterministic && dc_dnn_nondeterministic(cfg[i]) ? CUDNN_STATUS_NOT_SUPPORTED
                                                                       : CUDNN_STATUS_SUCCESS;
        if (!st) st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
        if (!st) st = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &dnn);
        if (!st)
            st = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                          CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i]);
        if (!st) st = cudnnBackendFinalize(plan);
        int64_t cnt = 0, need = 0;
        if (!st)
            st = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt,
                                          &need);
        if (!st && need <= max_ws) {
            plans[got_plans] = plan, ws[got_plans++] = need;
            continue;
        }
        if (plan) cudnnBackendDestroyDescriptor(plan);
        last = st ? st : CUDNN_STATUS_NOT_SUPPORTED;
    }
    if (g->st == CUDNN_STATUS_SUCCESS && !got_plans) dc_dnn_ok_at(g, last, __LINE__);  // none qualifies
    return got_plans;
}

cudnnBackendDescriptor_t dc_dnn_plan(dc_dnn_graph *g, cudnnHandle_t dnn, cudnnBackendDescriptor_t graph,
                                     int64_t max_ws, bool deterministic, int64_t *ws) {
    cudnnBackendDescriptor_t plan = NULL;
    return dc_dnn_plans(g, dnn, graph, max_ws, deterministic, &plan, ws, 1) ? plan : NULL;
}

cudnnStatus_t dc_dnn_execute(cudnnHandle_t dnn, cudnnBackendDescriptor_t plan, int n, const int64_t *uids,
                             void *const *data, void *ws) {
    cudnnBackendDescriptor_t pack = NULL;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    if (!st) st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    if (!st) st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, data);
    if (!st) st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    if (!st) st = cudnnBackendFinalize(pack);
    if (!st) st = cudnnBackendExecute(dnn, plan, pack);
    if (pack) cudnnBackendDestroyDescriptor(pack);
    return st;
}
