# cmake --install into a scratch prefix, then examples/mlp.c built outside the tree against the
# installed package (find_package(nanotrain), and pkg-config when present) and trained
# (cmake/install_test.cmake does the work).
if(TARGET ntlib AND TARGET mlp)
  add_test(NAME install_package
           COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${CMAKE_BINARY_DIR}
                   -DWORK=${CMAKE_CURRENT_BINARY_DIR}/install_package
                   -DSOURCE_DIR=${CMAKE_SOURCE_DIR} -DGENERATOR=${CMAKE_GENERATOR}
                   -DC_COMPILER=${CMAKE_C_COMPILER}
                   -P ${CMAKE_SOURCE_DIR}/cmake/install_test.cmake)
  set_tests_properties(install_package PROPERTIES LABELS cpu TIMEOUT ${NT_TEST_TIMEOUT})
endif()
