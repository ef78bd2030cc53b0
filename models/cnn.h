/* The small CNN for Fashion-MNIST:
 *   conv3x3(in->c1) ReLU conv3x3(c1->c1) ReLU maxpool2      (unit "stage1")
 *   conv3x3(c1->c2) ReLU conv3x3(c2->c2) ReLU maxpool2      (unit "stage2")
 *   linear(c2 * H/4 * W/4 -> hidden) ReLU [dropout] linear(hidden -> classes)   (unit "head")
 * padding 1, so 28x28 -> 14x14 -> 7x7 (64 * 7 * 7 = 3136 features with the defaults).
 * Init as torch's defaults (uniform +-1/sqrt(fan_in) for weights and biases). Parameter names
 * conv1.weight ... fc2.bias, in PyTorch's layouts (conv weights [out, in, 3, 3], fc1 columns in
 * NCHW flatten order), so bench/bench_train.py's PyTorch model takes the same tensors. The
 * feature maps are channels last (NHWC, ops/conv2d_nhwc.h); the last pool writes NCHW. */
#ifndef NT_MODELS_CNN_H
#define NT_MODELS_CNN_H
#include "core/nt.h"
#include "models/module.h"
NT_EXTERN_C_BEGIN

typedef struct {
  int in_channels, height, width;   /* 1, 28, 28 (height and width multiples of 4) */
  int c1, c2, hidden, classes;      /* 32, 64, 256, 10 */
  float dropout;                    /* after the hidden ReLU, training only (default 0) */
} nt_cnn_config;

nt_cnn_config nt_cnn_config_default(void);
nt_status nt_cnn_config_check(nt_ctx *ctx, const nt_cnn_config *c);

typedef struct nt_cnn nt_cnn;

/* batch: the largest batch a call may pass. */
nt_status nt_cnn_create(nt_ctx *ctx, const nt_cnn_config *cfg, nt_dtype compute_dtype, int batch,
                        nt_cnn **out);
void nt_cnn_free(nt_ctx *ctx, nt_cnn *m);
nt_params *nt_cnn_params(nt_cnn *m);
const nt_cnn_config *nt_cnn_get_config(const nt_cnn *m);
/* Training FLOPs per image (forward + backward = 3x the forward's multiply-adds x 2). */
double nt_cnn_flops_per_image(const nt_cnn *m);
size_t nt_cnn_activation_bytes(const nt_cnn *m);

/* Sizes of a model that is not built (memory estimates). */
nt_status nt_cnn_estimate(nt_ctx *ctx, const nt_cnn_config *cfg, nt_dtype compute_dtype,
                          int batch, nt_model_sizes *out);

/* Runs fc1 and fc2 as FP8 GEMMs with delayed scaling (ops/fp8_linear.h); the convolutions
 * stay in the compute dtype. emulate: FP8 quantization with fp32 GEMMs (CPU, tests). */
nt_status nt_cnn_enable_fp8(nt_ctx *ctx, nt_cnn *m, bool emulate);

/* images: [n, H, W, in] channels last in the compute dtype (normalised; for in = 1, [n, 1, H,
 * W] too, the same memory); labels: I32 [n]. Forward (dropout
 * on), loss, backward into the parameter gradients; loss gradient times *dloss_scale. hooks
 * (NULL: none) are called around the three units (models/module.h): before_forward for stage1,
 * stage2, head; before_backward and grads_ready for head, stage2, stage1. */
nt_status nt_cnn_train_step(nt_ctx *ctx, nt_cnn *m, const nt_tensor *images,
                            const nt_tensor *labels, const float *dloss_scale,
                            const nt_unit_hooks *hooks);
/* Forward without dropout and the mean loss; *logits views [n, classes] (compute dtype). */
nt_status nt_cnn_eval(nt_ctx *ctx, nt_cnn *m, const nt_tensor *images, const nt_tensor *labels,
                      nt_tensor *logits);
const nt_tensor *nt_cnn_loss(const nt_cnn *m);

NT_EXTERN_C_END
#endif
