# test_memest includes "memest.h" by its bare name: the folder holding the estimator (models/
# today, train/ after the trainer's move) is on its include path.
if(TARGET test_memest)
  target_include_directories(test_memest PRIVATE ${CMAKE_SOURCE_DIR}/models
                             ${CMAKE_SOURCE_DIR}/train)
endif()
