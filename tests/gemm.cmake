# gpu_test_gemm once more with autotuning off (the tests' helper maps NT_GEMM_AUTOTUNE onto
# the option gemm_autotune): every plan runs the heuristic's first choice.
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

# The autotuner's widened search (gemm_search 2 with every candidate verified, then modes 1 and
# 0; the test makes contexts with those options itself), each kept plan against the CPU.
# NT_LOG=debug (mapped by the tests' helper onto the option log): each plan's search summary
# and fastest configurations.
if(TARGET gpu_test_gemm)
  add_test(NAME gpu_test_gemm_search COMMAND gpu_test_gemm search)
  set_tests_properties(gpu_test_gemm_search PROPERTIES ENVIRONMENT NT_LOG=debug
                       LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 900)
endif()
