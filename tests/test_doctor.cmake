# tools/doctor as tests, labelled cpu: it must exit 0 on a machine without a GPU (and on a
# healthy GPU machine), and `doctor --json` must print one valid JSON object.
#
# This file is used twice: included by tests/CMakeLists.txt it registers the tests; run with
# `cmake -DDOCTOR=<path> -DMODE=text|json -P test_doctor.cmake` it performs the check.
if(CMAKE_SCRIPT_MODE_FILE)
  set(args --bandwidth-mib 64)
  if(MODE STREQUAL "json")
    list(APPEND args --json)
  endif()
  execute_process(COMMAND ${DOCTOR} ${args} OUTPUT_VARIABLE out ERROR_VARIABLE err
                  RESULT_VARIABLE rc)
  message("${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "doctor ${args} exited with ${rc}")
  endif()
  if(MODE STREQUAL "json")
    string(JSON status ERROR_VARIABLE json_err GET "${out}" cuda status)
    if(json_err)
      message(FATAL_ERROR "doctor --json printed invalid JSON or lacks cuda.status: ${json_err}")
    endif()
    string(JSON cores ERROR_VARIABLE json_err GET "${out}" cpu logical_cores)
    if(json_err OR NOT cores GREATER 0)
      message(FATAL_ERROR "doctor --json: cpu.logical_cores missing or not > 0: ${json_err}")
    endif()
    string(JSON ngpus ERROR_VARIABLE json_err LENGTH "${out}" gpus)
    if(json_err)
      message(FATAL_ERROR "doctor --json: gpus is not an array: ${json_err}")
    endif()
    find_program(PYTHON3 python3)
    if(PYTHON3)  # a strict parser as well (CMake's accepts some non-JSON)
      execute_process(COMMAND ${CMAKE_COMMAND} -E echo_append "${out}"
                      COMMAND ${PYTHON3} -m json.tool RESULT_VARIABLE py_rc
                      OUTPUT_QUIET ERROR_VARIABLE py_err)
      if(NOT py_rc EQUAL 0)
        message(FATAL_ERROR "python3 -m json.tool rejects doctor --json: ${py_err}")
      endif()
    endif()
    message("doctor --json: valid, cuda.status = ${status}, ${ngpus} GPU(s)")
  elseif(NOT out MATCHES "nanotrain doctor" OR NOT out MATCHES "status")
    message(FATAL_ERROR "doctor printed no report")
  endif()
  return()
endif()

if(TARGET doctor)
  foreach(mode text json)
    add_test(NAME doctor_${mode}
             COMMAND ${CMAKE_COMMAND} -DDOCTOR=$<TARGET_FILE:doctor> -DMODE=${mode}
                     -P ${CMAKE_CURRENT_LIST_FILE})
    set_tests_properties(doctor_${mode} PROPERTIES LABELS cpu TIMEOUT 300)
  endforeach()
endif()
