/* The loss scaler on the GPU: the same cases as test_scaler.c (vectors A-E bit-exact, misuse,
 * extras, state), with the state and the update kernel on the device. */
#define NT_TEST_GPU 1
#include "test_scaler.c"
