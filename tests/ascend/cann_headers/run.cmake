# cmake -DLOOM_SOURCE_DIR=<loom> -DCANN_ROOT=<headers-only CANN root> -DWORK_DIR=<scratch>
#       [-DGENERATOR=Ninja] [-DMAKE_PROGRAM=...] [-DCXX=...] -P run.cmake
# Configures and builds tests/ascend/cann_headers in WORK_DIR (CTest ascend_cann_headers).
if(NOT EXISTS "${CANN_ROOT}/include/acl/acl.h")
  message(FATAL_ERROR "no CANN headers at ${CANN_ROOT} (expected include/acl/acl.h): CI keeps CANN's open-source "
                      "headers at ../shared/reference/cann-headers next to the repository; pass -DLOOM_CANN_HEADERS_DIR=<dir>")
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
set(args -S "${LOOM_SOURCE_DIR}/tests/ascend/cann_headers" -B "${WORK_DIR}" "-DLOOM_SOURCE_DIR=${LOOM_SOURCE_DIR}"
         "-DCANN_ROOT=${CANN_ROOT}" -DCMAKE_BUILD_TYPE=)  # no optimisation: only compiling matters
if(GENERATOR)
  list(APPEND args -G "${GENERATOR}")
endif()
if(MAKE_PROGRAM)
  list(APPEND args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(CXX)
  list(APPEND args "-DCMAKE_CXX_COMPILER=${CXX}")
endif()
foreach(step configure build)
  if(step STREQUAL "configure")
    set(cmd "${CMAKE_COMMAND}" ${args})
  else()
    set(cmd "${CMAKE_COMMAND}" --build "${WORK_DIR}")
  endif()
  execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("---- ${step}\n${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "ascend_cann_headers: ${step} against ${CANN_ROOT} failed (exit status ${rc})")
  endif()
endforeach()
message(STATUS "ascend_cann_headers: loom's Ascend code compiled against the CANN headers at ${CANN_ROOT}")
