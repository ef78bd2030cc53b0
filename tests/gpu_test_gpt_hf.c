/* HF GPT-2 weights into a GPT on the GPU: test_gpt_hf.c's checks with a CUDA context. */
#define NT_TEST_GPU 1
#include "test_gpt_hf.c"
