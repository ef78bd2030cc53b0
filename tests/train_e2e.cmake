# The data-dependent parts of test_train_e2e, each its own test so that missing data shows as
# skipped (exit 77) rather than as a pass with parts dropped. The plain test_train_e2e (synthetic
# tokens, no data) is registered by the tests/test_*.c glob.
if(TARGET test_train_e2e)
  foreach(part gpt-learn cnn-resume cnn-learn)
    string(REPLACE "-" "_" name ${part})
    add_test(NAME test_train_e2e_${name} COMMAND test_train_e2e --${part})
    set_tests_properties(test_train_e2e_${name} PROPERTIES LABELS "cpu;data" SKIP_RETURN_CODE 77
                         TIMEOUT ${NT_TEST_TIMEOUT})
    if(nt_data_env)
      set_tests_properties(test_train_e2e_${name} PROPERTIES ENVIRONMENT "${nt_data_env}")
    endif()
  endforeach()
endif()
