# gpu_test_gemm once more with autotuning off: every plan runs the heuristic's first choice.
if(TARGET gpu_test_gemm)
  add_test(NAME gpu_test_gemm_heuristic COMMAND gpu_test_gemm)
  set_tests_properties(gpu_test_gemm_heuristic PROPERTIES ENVIRONMENT NT_GEMM_AUTOTUNE=0
                       LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 600)
endif()

# The FP8 cases alone with NT_LOG=debug: each FP8 plan's layouts, types, heuristic status and
# candidate count, C handling and the kernel kept go to the log (diagnostics if FP8 fails).
if(TARGET gpu_test_gemm)
  add_test(NAME gpu_test_gemm_fp8_log COMMAND gpu_test_gemm fp8)
  set_tests_properties(gpu_test_gemm_fp8_log PROPERTIES ENVIRONMENT NT_LOG=debug
                       LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 300)
endif()
