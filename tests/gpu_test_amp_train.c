/* AMP training on the GPU: the fp32 / bf16 / fp16+scaler curves, the injected overflow and the
 * bit-identical resume of test_amp_train.c, plus the GPU fp32 curve against the CPU's. */
#define NT_TEST_GPU 1
#include "test_amp_train.c"
