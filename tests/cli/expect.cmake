# Runs CMD (a list) and checks its exit status is EXIT and, when REGEX is given, that its
# stdout + stderr match REGEX. Used by the command-line tests: CTest's PASS_REGULAR_EXPRESSION
# alone ignores the exit status.
#   cmake -DCMD="prog;arg;..." -DEXIT=2 [-DREGEX=...] -P expect.cmake
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
message("${all}")
if(NOT rc STREQUAL "${EXIT}")
  message(FATAL_ERROR "exit status ${rc}, expected ${EXIT}")
endif()
if(DEFINED REGEX AND NOT all MATCHES "${REGEX}")
  message(FATAL_ERROR "output does not match: ${REGEX}")
endif()
