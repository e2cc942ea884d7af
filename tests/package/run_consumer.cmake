# cmake -DKIND=<find_package|add_subdirectory|fetch_content> -DCONSUMER_DIR=<dir> -DWORK_DIR=<dir>
#       -DLOOM_SOURCE_DIR=<loom source> -DLOOM_BUILD_DIR=<configured loom build>
#       [-DLOOM_EXPECT_COMPONENTS=mpi,text] [-DGENERATOR=Ninja] [-DMAKE_PROGRAM=...] [-DCXX=...]
#       -P run_consumer.cmake
# Configures, builds and runs one consumer project from tests/package/ in a fresh WORK_DIR.
# For find_package, first installs LOOM_BUILD_DIR into WORK_DIR/prefix.
function(run step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("---- ${step}: ${ARGN}\n${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "package test ${KIND}: ${step} failed (exit status ${rc})")
  endif()
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(build "${WORK_DIR}/build")
set(configure_args -S "${CONSUMER_DIR}" -B "${build}" -DCMAKE_BUILD_TYPE=Release)
if(GENERATOR)
  list(APPEND configure_args -G "${GENERATOR}")
endif()
if(MAKE_PROGRAM)
  list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(CXX)
  list(APPEND configure_args "-DCMAKE_CXX_COMPILER=${CXX}")
endif()

if(KIND STREQUAL "find_package")
  set(prefix "${WORK_DIR}/prefix")
  run(install "${CMAKE_COMMAND}" --install "${LOOM_BUILD_DIR}" --prefix "${prefix}")
  # Only the temporary prefix: never a loom from /usr/local or the user package registry.
  list(APPEND configure_args "-DCMAKE_PREFIX_PATH=${prefix}" "-DLOOM_EXPECTED_PREFIX=${prefix}"
                             "-DLOOM_EXPECT_COMPONENTS=${LOOM_EXPECT_COMPONENTS}"
                             -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
else()
  list(APPEND configure_args "-DLOOM_SOURCE_DIR=${LOOM_SOURCE_DIR}")
endif()

run(configure "${CMAKE_COMMAND}" ${configure_args})
run(build "${CMAKE_COMMAND}" --build "${build}")
run(run "${build}/consumer")
if(EXISTS "${build}/consumer_sessions")
  run(run_sessions "${build}/consumer_sessions")
endif()
message(STATUS "package test ${KIND}: configured, built and ran the consumer")
