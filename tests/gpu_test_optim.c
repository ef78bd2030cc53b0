/* The optimizers on the GPU: every case of test_optim.c runs on the device, is checked against
 * the double reference, and must give the CPU's bits (clipped runs: rel err < 1e-6). */
#define NT_TEST_GPU 1
#include "test_optim.c"
