# Run by the install_package test (tests/install.cmake) with cmake -P:
#   BUILD_DIR  a configured and built nanotrain build
#   WORK       a scratch folder (emptied first)
#   SOURCE_DIR the source tree (for examples/mlp.c and tests/install_consumer/)
#   GENERATOR, C_COMPILER  what the consumer build uses
# Installs into WORK/prefix, checks the layout, builds examples/mlp.c out of tree against
# the package with CMake (and with pkg-config when it is installed), and trains it.
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK})
set(prefix ${WORK}/prefix)
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})

# the layout
file(GLOB_RECURSE libs ${prefix}/lib*/libnanotrain.a)
if(NOT libs)
  message(FATAL_ERROR "libnanotrain.a not installed under ${prefix}")
endif()
foreach(f include/nanotrain/core/nt.h include/nanotrain/models/safetensors.h
          include/nanotrain/models/gpt_hf.h include/nanotrain/optim/adamw.h
          include/nanotrain/ops/linear.h include/nanotrain/amp/scaler.h
          include/nanotrain/data/loader.h bin/nanotrain bin/doctor bin/memest)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()
file(GLOB_RECURSE internal ${prefix}/include/*_internal.h ${prefix}/include/*.cuh)
if(internal)
  message(FATAL_ERROR "private headers installed: ${internal}")
endif()
file(GLOB_RECURSE config ${prefix}/*/nanotrainConfig.cmake)
file(GLOB_RECURSE pc ${prefix}/*/nanotrain.pc)
if(NOT config OR NOT pc)
  message(FATAL_ERROR "package files missing: config '${config}', pc '${pc}'")
endif()

# every installed header compiles on its own with the package's flags (pkg-config's when it
# is installed: they carry the build's definitions, e.g. NT_HAVE_CUDA and CUDA's include path)
find_program(PKG_CONFIG pkg-config)
get_filename_component(pcdir ${pc} DIRECTORY)
set(ENV{PKG_CONFIG_PATH} ${pcdir})
set(cflags -I${prefix}/include/nanotrain)
if(PKG_CONFIG)
  run(${PKG_CONFIG} --cflags nanotrain)
  string(STRIP "${last_output}" cflags)
  separate_arguments(cflags UNIX_COMMAND "${cflags}")
endif()
file(GLOB_RECURSE hdrs RELATIVE ${prefix}/include/nanotrain ${prefix}/include/nanotrain/*.h)
foreach(h ${hdrs})
  string(MAKE_C_IDENTIFIER ${h} id)
  file(WRITE ${WORK}/hdr/${id}.c "#include \"${h}\"\n")
  run(${C_COMPILER} -std=c11 -Wall -Wextra -Werror -fsyntax-only ${cflags} ${WORK}/hdr/${id}.c)
endforeach()

# a program outside the tree, built with CMake against the package
set(src ${WORK}/src)
file(MAKE_DIRECTORY ${src})
file(COPY ${SOURCE_DIR}/examples/mlp.c ${SOURCE_DIR}/tests/install_consumer/CMakeLists.txt
     DESTINATION ${src})
run(${CMAKE_COMMAND} -S ${src} -B ${WORK}/build -G ${GENERATOR}
    -DCMAKE_C_COMPILER=${C_COMPILER} -DCMAKE_PREFIX_PATH=${prefix})
run(${CMAKE_COMMAND} --build ${WORK}/build -j 2)
run(${WORK}/build/mlp --steps 200 --expect-loss 0.1)
message(STATUS "CMake consumer:\n${last_output}")

# the same with pkg-config
if(PKG_CONFIG)
  run(${PKG_CONFIG} --cflags --libs nanotrain)
  string(STRIP "${last_output}" flags)
  separate_arguments(flags UNIX_COMMAND "${flags}")
  run(${C_COMPILER} -std=c11 ${src}/mlp.c -o ${WORK}/mlp_pc ${flags})
  run(${WORK}/mlp_pc --steps 200 --expect-loss 0.1)
  message(STATUS "pkg-config consumer:\n${last_output}")
else()
  message(STATUS "pkg-config not found: the .pc file was not tried")
endif()
