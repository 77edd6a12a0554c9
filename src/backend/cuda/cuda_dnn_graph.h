// cuDNN's graph API (its backend API, plain C) in the few calls the CUDA
// backend needs: an operation graph is built from descriptors, cuDNN's
// heuristics rank engine configurations for it, and the first that
// finalises into an execution plan within a workspace limit is kept. Each
// op runs a plan with a variant pack (its tensors' pointers by unique id).
// Used by cuDNN's fused attention, forward and backward (cuda_attention_cudnn.cu) and the bf16
// channels-last convolutions (cuda_conv.cu): a plan executes with a fraction
// of the host time of cuDNN's legacy convolution call.
#pragma once
#include <cudnn.h>
#include <stdbool.h>
#include <stdint.h>

// A graph under construction: its descriptors (kept as long as the plan made
// from them) and the first failure (later calls do nothing once one failed).
typedef struct {
    cudnnStatus_t st;
    int line;  // where the first failure happened (the building file's line), for the report
    cudnnBackendDescriptor_t own[96];
    int n;
    int64_t next_uid;  // the next virtual tensor's unique id
} dc_dnn_graph;

// Records the first failure and its line; true while none has happened.
bool dc_dnn_ok_at(dc_dnn_graph *g, cudnnStatus_t st, int line);
cudnnBackendDescriptor_t dc_dnn_make_at(dc_dnn_graph *g, cudnnBackendDescriptorType_t type, int line);
void dc_dnn_set_at(dc_dnn_graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                   cudnnBackendAttributeType_t type, int64_t count, const void *value, int line);
void dc_dnn_finish_at(dc_dnn_graph *g, cudnnBackendDescriptor_t d, int line);
void dc_dnn_graph_free(dc_dnn_graph *g);

// The calls of a graph's construction, each failure reported with its line.
#define DNN_G_MAKE(g, type) dc_dnn_make_at(g, type, __LINE__)
#define DNN_G_SET(g, d, name, type, count, value) dc_dnn_set_at(g, d, name, type, count, value, __LINE__)
#define DNN_G_FINISH(g, d) dc_dnn_finish_at(g, d, __LINE__)

// A 4-d tensor: real (uid given) or virtual (uid 0: an intermediate of the
// graph), 16-byte aligned; by_value: a host scalar.
cudnnBackendDescriptor_t dc_dnn_tensor(dc_dnn_graph *g, int64_t uid, cudnnDataType_t dt, const int64_t dim[4],
                                       const int64_t stride[4], bool by_value);
// A 2-D convolution's descriptor: cross-correlation accumulated in fp32,
// stride `stride`, padding ph rows and pw columns on both sides, no dilation.
cudnnBackendDescriptor_t dc_dnn_conv(dc_dnn_graph *g, int64_t stride, int64_t ph, int64_t pw);
// y = mode(x, b) elementwise in fp32 (b NULL for a unary mode).
cudnnBackendDescriptor_t dc_dnn_pointwise(dc_dnn_graph *g, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                                          cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y);
// c = a b (batched over the leading two dims), accumulated in fp32.
cudnnBackendDescriptor_t dc_dnn_matmul(dc_dnn_graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                                       cudnnBackendDescriptor_t c);
// y = x reduced (how) over the dims where y has size 1, in fp32.
cudnnBackendDescriptor_t dc_dnn_reduction(dc_dnn_graph *g, cudnnReduceTensorOp_t how, cudnnBackendDescriptor_t x,
                                          cudnnBackendDescriptor_t y);
// y = x seen through y's dims, strides and dtype (a transposed view).
cudnnBackendDescriptor_t dc_dnn_reshape(dc_dnn_graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y);
// The operation graph of n ops.
cudnnBackendDescriptor_t dc_dnn_op_graph(dc_dnn_graph *g, cudnnHandle_t dnn, const cudnnBackendDescriptor_t *ops,
                                         int64_t n);
// Whether the engine of configuration cfg carries cuDNN's nondeterminism
// note (true where it cannot be read).
bool dc_dnn_nondeterministic(cudnnBackendDescriptor_t cfg);
// The first configuration cuDNN's heuristics offer that finalises into a
// plan within max_ws bytes of workspace (and, if deterministic, whose engine
// carries no nondeterminism note), or NULL; *ws its workspace bytes.
cudnnBackendDescriptor_t dc_dnn_plan(dc_dnn_graph *g, cudnnHandle_t dnn, cudnnBackendDescriptor_t graph,
                                     int64_t max_ws, bool deterministic, int64_t *ws);
// Up to max such plans, in the heuristics' order, into plans[] (their
// workspace bytes in ws[]); the count, 0 with the failure recorded in g.
int dc_dnn_plans(dc_dnn_graph *g, cudnnHandle_t dnn, cudnnBackendDescriptor_t graph, int64_t max_ws,
                 bool deterministic, cudnnBackendDescriptor_t *plans, int64_t *ws, int max);
// Runs plan on the handle's stream with n tensors (uids[i] at data[i]) and
// the workspace.
cudnnStatus_t dc_dnn_execute(cudnnHandle_t dnn, cudnnBackendDescriptor_t plan, int n, const int64_t *uids,
                             void *const *data, void *ws);
