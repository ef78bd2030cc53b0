# gpu_test_gemm once more with autotuning off: every plan runs the heuristic's first choice.
if(TARGET gpu_test_gemm)
  add_test(NAME gpu_test_gemm_heuristic COMMAND gpu_test_gemm)
  set_tests_properties(gpu_test_gemm_heuristic PROPERTIES ENVIRONMENT NT_GEMM_AUTOTUNE=0
                       LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 600)
endif()
