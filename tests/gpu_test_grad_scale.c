/* The folded unscale on the GPU: every case of test_grad_scale.c runs on the device, and the
 * grad_divisor case must give the CPU's bits. */
#define NT_TEST_GPU 1
#include "test_grad_scale.c"
