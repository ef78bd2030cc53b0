# Data for the reader tests. Tiny shakespeare comes from NT_DATA_DIR (a cache variable, its
# default taken from the environment at configure time); Fashion-MNIST from NT_FASHION_DIR or
# the Debian package's folder. Tests that need absent data report skipped (exit 77).
set(NT_DATA_DIR "$ENV{NT_DATA_DIR}" CACHE PATH "Folder holding tinyshakespeare.txt")
set(NT_FASHION_DIR "$ENV{NT_FASHION_DIR}" CACHE PATH
    "Fashion-MNIST folder (empty: /usr/share/datasets/fashion-mnist)")

set(nt_data_env)
if(NT_DATA_DIR)
  list(APPEND nt_data_env "NT_DATA_DIR=${NT_DATA_DIR}")
endif()
if(NT_FASHION_DIR)
  list(APPEND nt_data_env "NT_FASHION_DIR=${NT_FASHION_DIR}")
endif()

if(TARGET test_idx)
  add_test(NAME test_idx_fashion COMMAND test_idx --fashion)
  set_tests_properties(test_idx_fashion PROPERTIES LABELS "cpu;data" SKIP_RETURN_CODE 77
                       TIMEOUT 600)
endif()
if(TARGET test_text)
  add_test(NAME test_text_shakespeare COMMAND test_text --shakespeare)
  set_tests_properties(test_text_shakespeare PROPERTIES LABELS "cpu;data" SKIP_RETURN_CODE 77
                       TIMEOUT 600)
endif()
foreach(t test_idx_fashion test_text_shakespeare)
  if(TEST ${t} AND nt_data_env)
    set_tests_properties(${t} PROPERTIES ENVIRONMENT "${nt_data_env}")
  endif()
endforeach()
