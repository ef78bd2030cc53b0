# The library reads no environment variable: kernel and algorithm choices come from the
# context's options (core/ctx.h), data folders from the caller. This test (label cpu) fails
# when a source under a library folder calls getenv(.
#
# Used twice, as test_doctor.cmake is: included by tests/CMakeLists.txt it registers the test;
# run with `cmake -DROOT=<source dir> -P no_getenv.cmake` it performs the check.
if(CMAKE_SCRIPT_MODE_FILE)
  cmake_minimum_required(VERSION 3.24)
  set(dirs core ops amp optim data models train dist)
  set(found "")
  foreach(d ${dirs})
    file(GLOB_RECURSE srcs ${ROOT}/${d}/*.c ${ROOT}/${d}/*.h ${ROOT}/${d}/*.cu ${ROOT}/${d}/*.cuh)
    foreach(f ${srcs})
      file(RELATIVE_PATH rel ${ROOT} ${f})
      file(STRINGS ${f} hits REGEX "getenv[ \t]*\\(")
      foreach(h ${hits})
        string(STRIP "${h}" h)
        string(APPEND found "\n  ${rel}: ${h}")
      endforeach()
    endforeach()
  endforeach()
  if(found)
    message(FATAL_ERROR "library sources read the environment (use a context option, "
                        "core/ctx.h, or take the value as an argument):${found}")
  endif()
  message("no getenv( in ${dirs}")
  return()
endif()

add_test(NAME no_getenv_in_library
         COMMAND ${CMAKE_COMMAND} -DROOT=${CMAKE_SOURCE_DIR} -P ${CMAKE_CURRENT_LIST_FILE})
set_tests_properties(no_getenv_in_library PROPERTIES LABELS cpu TIMEOUT 60)
