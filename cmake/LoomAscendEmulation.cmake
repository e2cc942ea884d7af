# LoomAscendEmulation: loom's HOST EMULATION of the Huawei CANN APIs (ACL runtime, aclnn operators,
# HCCL) so the Ascend backend's code paths build and run in CI on a CPU-only machine. It is NOT the
# vendor toolkit: emulation/include restates the documented signatures, emulation/src implements
# them on host memory (see docs/ascend.md). Test-only; loom itself stays header-only.
#
# The emulation is a fake toolkit tree, <build>/ascend_emulation/lib64/ with the CANN library
# names, which loom loads exactly as it loads a real toolkit (dlopen through ASCEND_HOME_PATH):
#   libascendcl.so   emulation/src/runtime.cpp, elements.cpp    (+ the emulation's control functions loomemu_*)
#   libnnopbase.so   emulation/src/meta.cpp
#   libopapi.so      emulation/src/ops.cpp, ops_attention.cpp, ops_llama.cpp
#   libhccl.so       emulation/src/hccl.cpp
#   libmsprofiler.so emulation/src/prof.cpp     (aclprof* session calls, logged for tests)
# Nothing links them: the test binaries find them through ASCEND_HOME_PATH (set by CTest) or the
# compile definition LOOM_ASCEND_EMULATION_HOME (the fallback when run by hand).
#
# include() it after loom::loom exists. Defines:
#   loom_ascend_emulation              custom target building the four libraries
#   LOOM_ASCEND_EMULATION_HOME         the fake toolkit root (cache, internal)
#   loom_ascend_emulation_tests()      the test binary loom_ascend_tests (tests/unit/main.cpp +
#                                      tests/ascend/*.cpp), one CTest test per TEST_CASE, label
#                                      "ascend"; the compile-fail pairs tests/ascend/compile_fail/
#                                      <name>.cpp (<name>_ok must compile; <name>_ko, with
#                                      -DLOOM_SHOULD_FAIL, must fail printing the text of the file's
#                                      `// expect: <text>` first line); and the header-drift check
#                                      (loom's declarations vs the emulation's headers, compiled with
#                                      LOOM_ASCEND_USE_CANN_HEADERS=1)
include_guard(GLOBAL)
cmake_path(SET _loom_emu_root NORMALIZE "${CMAKE_CURRENT_LIST_DIR}/..")
set(LOOM_ASCEND_EMULATION_ROOT "${_loom_emu_root}" CACHE INTERNAL "loom source root for the Ascend emulation")
set(LOOM_ASCEND_EMULATION_HOME "${CMAKE_BINARY_DIR}/ascend_emulation" CACHE INTERNAL
    "fake CANN toolkit root holding the emulation libraries")

# The fake toolkit also gets include/ (a link to emulation/include), so that
# -DLOOM_ASCEND_USE_CANN_HEADERS=ON -DASCEND_TOOLKIT_HOME=<build>/ascend_emulation can be tried
# against it (cmake/FindAscendCL.cmake finds include/acl/acl.h and lib64/libascendcl.so there).
file(MAKE_DIRECTORY "${LOOM_ASCEND_EMULATION_HOME}/lib64")
if(NOT EXISTS "${LOOM_ASCEND_EMULATION_HOME}/include")
  file(CREATE_LINK "${_loom_emu_root}/emulation/include" "${LOOM_ASCEND_EMULATION_HOME}/include" SYMBOLIC)
endif()
# ... and driver/ (a link to emulation/driver): an emulated `npu-smi info` for examples/doctor's
# driver checks (tests/cli/doctor.sh puts it on PATH). Not part of any toolkit layout.
if(NOT EXISTS "${LOOM_ASCEND_EMULATION_HOME}/driver")
  file(CREATE_LINK "${_loom_emu_root}/emulation/driver" "${LOOM_ASCEND_EMULATION_HOME}/driver" SYMBOLIC)
endif()

find_package(Threads REQUIRED)
set(_loom_emu_src "${_loom_emu_root}/emulation/src")
function(_loom_emu_library target output)
  add_library(${target} SHARED ${ARGN})
  target_include_directories(${target} PRIVATE "${_loom_emu_root}/emulation/include")
  target_compile_features(${target} PRIVATE cxx_std_20)
  target_link_libraries(${target} PRIVATE Threads::Threads)
  set_target_properties(${target} PROPERTIES
    OUTPUT_NAME ${output}
    LIBRARY_OUTPUT_DIRECTORY "${LOOM_ASCEND_EMULATION_HOME}/lib64"
    BUILD_RPATH "$ORIGIN")
  if(LOOM_SANITIZE AND COMMAND loom_sanitize)   # the test binaries that load it are sanitized too
    loom_sanitize(${target} "${LOOM_SANITIZE}")
  endif()
endfunction()
_loom_emu_library(loom_emu_ascendcl ascendcl "${_loom_emu_src}/runtime.cpp" "${_loom_emu_src}/elements.cpp")
_loom_emu_library(loom_emu_nnopbase nnopbase "${_loom_emu_src}/meta.cpp")
_loom_emu_library(loom_emu_opapi opapi "${_loom_emu_src}/ops.cpp" "${_loom_emu_src}/ops_attention.cpp"
                  "${_loom_emu_src}/ops_llama.cpp")
_loom_emu_library(loom_emu_hccl hccl "${_loom_emu_src}/hccl.cpp")
_loom_emu_library(loom_emu_msprofiler msprofiler "${_loom_emu_src}/prof.cpp")
target_link_libraries(loom_emu_nnopbase PRIVATE loom_emu_ascendcl)
target_link_libraries(loom_emu_opapi PRIVATE loom_emu_nnopbase loom_emu_ascendcl)
target_link_libraries(loom_emu_hccl PRIVATE loom_emu_nnopbase loom_emu_ascendcl)
if(TARGET nlohmann_json::nlohmann_json)   # HcclCommInitClusterInfo reads the rank table (JSON)
  target_link_libraries(loom_emu_hccl PRIVATE nlohmann_json::nlohmann_json)
  target_compile_definitions(loom_emu_hccl PRIVATE LOOMEMU_WITH_JSON=1)
endif()
target_link_libraries(loom_emu_msprofiler PRIVATE loom_emu_ascendcl)
add_custom_target(loom_ascend_emulation DEPENDS loom_emu_ascendcl loom_emu_nnopbase loom_emu_opapi loom_emu_hccl
                                                loom_emu_msprofiler)

function(loom_ascend_emulation_tests)
  set(root "${LOOM_ASCEND_EMULATION_ROOT}")
  file(GLOB sources CONFIGURE_DEPENDS "${root}/tests/ascend/*.cpp")
  if(NOT sources)
    return()
  endif()
  find_package(doctest REQUIRED)
  if(TARGET loom_doctest_main)   # tests/CMakeLists.txt: doctest's main, compiled once
    add_executable(loom_ascend_tests $<TARGET_OBJECTS:loom_doctest_main> ${sources})
  else()
    add_executable(loom_ascend_tests "${root}/tests/unit/main.cpp" ${sources})
  endif()
  # loom::ascend: the policy over loom's own declarations; the emulation is loaded, never linked.
  # loom_kernel_instances (when loom's programs are built): the CPU reference kernels compiled once.
  target_link_libraries(loom_ascend_tests PRIVATE loom::ascend doctest::doctest
                                                  $<TARGET_NAME_IF_EXISTS:loom_kernel_instances>)
  target_include_directories(loom_ascend_tests PRIVATE "${root}/tests" "${root}/emulation/include")
  target_compile_definitions(loom_ascend_tests PRIVATE LOOM_ASCEND_EMULATION_HOME="${LOOM_ASCEND_EMULATION_HOME}")
  add_dependencies(loom_ascend_tests loom_ascend_emulation)
  if(COMMAND loom_test_defaults)
    loom_test_defaults(loom_ascend_tests)
  endif()
  set(env "ASCEND_HOME_PATH=${LOOM_ASCEND_EMULATION_HOME}" "OMP_WAIT_POLICY=PASSIVE")  # tests/CMakeLists.txt says why
  if(COMMAND loom_doctest_discover_tests)
    loom_doctest_discover_tests(loom_ascend_tests WORKING_DIRECTORY "${root}" LABELS ascend TIMEOUT 900
                                ENVIRONMENT "${env}")
  else()
    add_test(NAME loom_ascend_tests COMMAND loom_ascend_tests WORKING_DIRECTORY "${root}")
    set_tests_properties(loom_ascend_tests PROPERTIES ENVIRONMENT "${env}")
  endif()

  # comm::hccl across processes: tests/ascend/mpi/*.cpp -> loom_ascend_mpi_tests under mpirun -np 2,
  # one emulated NPU per process, HCCL data through the emulation's shared-memory transport.
  file(GLOB mpi_sources CONFIGURE_DEPENDS "${root}/tests/ascend/mpi/*.cpp")
  if(mpi_sources AND TARGET loom::mpi AND MPIEXEC_EXECUTABLE)
    add_executable(loom_ascend_mpi_tests "${root}/tests/unit/main.cpp" ${mpi_sources})
    target_link_libraries(loom_ascend_mpi_tests PRIVATE loom::ascend loom::mpi doctest::doctest
                                                        $<TARGET_NAME_IF_EXISTS:loom_kernel_instances>)
    target_include_directories(loom_ascend_mpi_tests PRIVATE "${root}/tests" "${root}/emulation/include")
    target_compile_definitions(loom_ascend_mpi_tests PRIVATE LOOM_TEST_MPI=1
                               LOOM_ASCEND_EMULATION_HOME="${LOOM_ASCEND_EMULATION_HOME}")
    add_dependencies(loom_ascend_mpi_tests loom_ascend_emulation)
    if(COMMAND loom_test_defaults)
      loom_test_defaults(loom_ascend_mpi_tests)
    endif()
    set(mpi_flags ${MPIEXEC_PREFLAGS})
    execute_process(COMMAND "${MPIEXEC_EXECUTABLE}" --version OUTPUT_VARIABLE mpi_version ERROR_QUIET)
    if(mpi_version MATCHES "Open MPI|OpenRTE")
      list(APPEND mpi_flags --oversubscribe --allow-run-as-root)
    endif()
    add_test(NAME ascend_hccl_mpi_np2
             COMMAND "${MPIEXEC_EXECUTABLE}" ${MPIEXEC_NUMPROC_FLAG} 2 ${mpi_flags}
                     $<TARGET_FILE:loom_ascend_mpi_tests> ${MPIEXEC_POSTFLAGS}
             WORKING_DIRECTORY "${root}")
    set_tests_properties(ascend_hccl_mpi_np2 PROPERTIES
      ENVIRONMENT "${env};OMP_NUM_THREADS=1;LOOMEMU_HCCL_SHM_MB=1" PROCESSORS 2 LABELS "ascend;mpi" TIMEOUT 300)
  endif()

  # comm::hccl from a rank table (HcclCommInitClusterInfo): the binary spawns itself as two worker
  # processes with RANK_TABLE_FILE and RANK_ID 0/1 (no MPI), and checks the emulation's and loom's
  # rejection of bad tables in one process.
  set(rank_table_src "${root}/tests/ascend/rank_table/test_rank_table_launch.cpp")
  if(EXISTS "${rank_table_src}" AND TARGET nlohmann_json::nlohmann_json)
    add_executable(loom_ascend_rank_table_tests "${rank_table_src}")
    target_link_libraries(loom_ascend_rank_table_tests PRIVATE loom::ascend doctest::doctest)
    target_include_directories(loom_ascend_rank_table_tests PRIVATE "${root}/tests" "${root}/emulation/include")
    target_compile_definitions(loom_ascend_rank_table_tests PRIVATE
                               LOOM_ASCEND_EMULATION_HOME="${LOOM_ASCEND_EMULATION_HOME}")
    add_dependencies(loom_ascend_rank_table_tests loom_ascend_emulation)
    if(COMMAND loom_target_defaults)
      loom_target_defaults(loom_ascend_rank_table_tests)
    endif()
    add_test(NAME ascend_hccl_rank_table COMMAND loom_ascend_rank_table_tests WORKING_DIRECTORY "${root}")
    set_tests_properties(ascend_hccl_rank_table PROPERTIES
      ENVIRONMENT "${env};OMP_NUM_THREADS=1" PROCESSORS 2 LABELS ascend TIMEOUT 300)
    # The same workers under `mpirun -np 2`, RANK_ID taken from the launcher's rank variable by a
    # shell wrapper (as a user's script does). The table is copied into the build tree: the
    # emulation's segment is named after the table's path, so build trees never share one.
    if(MPIEXEC_EXECUTABLE)
      set(rank_table_copy "${CMAKE_CURRENT_BINARY_DIR}/rank_table_np2/hccl.json")
      configure_file("${root}/tests/ascend/rank_table/hccl_np2.json" "${rank_table_copy}" COPYONLY)
      set(mpi_flags ${MPIEXEC_PREFLAGS})
      execute_process(COMMAND "${MPIEXEC_EXECUTABLE}" --version OUTPUT_VARIABLE mpi_version ERROR_QUIET)
      if(mpi_version MATCHES "Open MPI|OpenRTE")
        list(APPEND mpi_flags --oversubscribe --allow-run-as-root)
      endif()
      add_test(NAME ascend_hccl_rank_table_mpirun
               COMMAND "${MPIEXEC_EXECUTABLE}" ${MPIEXEC_NUMPROC_FLAG} 2 ${mpi_flags}
                       sh -c "RANK_ID=\${OMPI_COMM_WORLD_RANK:-\${PMI_RANK}} exec \"\$0\""
                       $<TARGET_FILE:loom_ascend_rank_table_tests> ${MPIEXEC_POSTFLAGS}
               WORKING_DIRECTORY "${root}")
      set_tests_properties(ascend_hccl_rank_table_mpirun PROPERTIES
        ENVIRONMENT "${env};OMP_NUM_THREADS=1;LOOM_RANK_TABLE_WORKER=1;RANK_TABLE_FILE=${rank_table_copy};HCCL_CONNECT_TIMEOUT=60"
        PROCESSORS 2 LABELS "ascend;mpi" TIMEOUT 300)
    endif()
  endif()

  # Loading, not linking: the test binary must not depend on any CANN library name.
  find_program(LOOM_READELF readelf)
  if(LOOM_READELF)
    add_test(NAME ascend_tests_link_no_cann_library COMMAND "${LOOM_READELF}" -d $<TARGET_FILE:loom_ascend_tests>)
    set_tests_properties(ascend_tests_link_no_cann_library PROPERTIES LABELS ascend
                         FAIL_REGULAR_EXPRESSION "libascendcl|libnnopbase|libopapi|libhccl|libhcomm"
                         PASS_REGULAR_EXPRESSION "NEEDED")
  endif()

  # syntax-only compiles with the include flags of loom::ascend
  set(probe "${CMAKE_CURRENT_BINARY_DIR}/loom_ascend_probe.cpp")
  file(WRITE "${probe}" "// include flags probe, never built\n")
  add_library(loom_ascend_probe OBJECT EXCLUDE_FROM_ALL "${probe}")
  target_link_libraries(loom_ascend_probe PRIVATE loom::ascend)
  set(inc "$<REMOVE_DUPLICATES:$<TARGET_PROPERTY:loom_ascend_probe,INCLUDE_DIRECTORIES>>")
  set(flags -std=c++20 -fsyntax-only "$<$<BOOL:${inc}>:-I$<JOIN:${inc},$<SEMICOLON>-I>>")

  # Drift check: loom's declarations (device/detail/acl_api.hpp) against headers at the vendor
  # include paths — here the emulation's, which restate the same reference. With a real toolkit,
  # -DLOOM_ASCEND_USE_CANN_HEADERS=ON does the same against CANN's own headers.
  # LOOM_ACL_CHECK_NEWER_FUNCTIONS: the emulation declares the ACL 1.17 functions loom looks up
  # (aclsysGetVersionStr, aclFinalizeReference) while its interface version stays 1.13; check them too.
  add_test(NAME ascend_declarations_match_headers
           COMMAND "${CMAKE_CXX_COMPILER}" ${flags} -DLOOM_ASCEND_USE_CANN_HEADERS=1 -DLOOM_ACL_CHECK_NEWER_FUNCTIONS=1
                   "-I${root}/emulation/include" -x c++ "${root}/include/loom/kernels/ascend.hpp"
                   -include "${root}/include/loom/parallel/comm_hccl.hpp"
           COMMAND_EXPAND_LISTS)
  set_tests_properties(ascend_declarations_match_headers PROPERTIES LABELS "ascend;failtest" TIMEOUT 300)

  # The same declarations against CANN's own open-source headers (9.0.0, headers only: see
  # LOOM_CANN_HEADERS_DIR's README), through the real build path: a consumer project configured
  # with LOOM_ASCEND_USE_CANN_HEADERS=ON (FindAscendCL on a headers-only root) that compiles the
  # whole Ascend side. With ascend_declarations_match_headers this checks the emulation's headers
  # against the vendor's for every function, type and constant loom declares: each set must equal
  # loom's declarations (static_assert on decltype(&::fn) and on each value).
  cmake_path(SET _cann_default NORMALIZE "${root}/../shared/reference/cann-headers")
  set(LOOM_CANN_HEADERS_DIR "${_cann_default}" CACHE PATH
      "Headers-only CANN root (include/acl/acl.h ...) for the test ascend_cann_headers")
  add_test(NAME ascend_cann_headers
           COMMAND "${CMAKE_COMMAND}" "-DLOOM_SOURCE_DIR=${root}" "-DCANN_ROOT=${LOOM_CANN_HEADERS_DIR}"
                   "-DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/ascend_cann_headers" "-DGENERATOR=${CMAKE_GENERATOR}"
                   "-DMAKE_PROGRAM=${CMAKE_MAKE_PROGRAM}" "-DCXX=${CMAKE_CXX_COMPILER}"
                   -P "${root}/tests/ascend/cann_headers/run.cmake")
  set_tests_properties(ascend_cann_headers PROPERTIES LABELS "ascend;package" TIMEOUT 900)
  # ... and every function and constant the emulation declares that CANN's headers declare too,
  # compared directly (decltype(&::fn) and values, built once per header set; a few seconds).
  add_test(NAME ascend_emulation_matches_cann_headers
           COMMAND "${CMAKE_COMMAND}" "-DEMU_INCLUDE=${root}/emulation/include"
                   "-DCANN_INCLUDE=${LOOM_CANN_HEADERS_DIR}/include"
                   "-DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/ascend_emulation_matches" "-DCXX=${CMAKE_CXX_COMPILER}"
                   -P "${root}/tests/ascend/cann_headers/emulation_matches.cmake")
  set_tests_properties(ascend_emulation_matches_cann_headers PROPERTIES LABELS "ascend;failtest" TIMEOUT 300)

  file(GLOB failtests CONFIGURE_DEPENDS "${root}/tests/ascend/compile_fail/*.cpp")
  foreach(src IN LISTS failtests)
    get_filename_component(name "${src}" NAME_WE)
    file(STRINGS "${src}" first_line LIMIT_COUNT 1)
    if(NOT first_line MATCHES "^// expect: (.+)$")
      message(FATAL_ERROR "${src}: the first line must be `// expect: <text the compiler must print>`")
    endif()
    string(STRIP "${CMAKE_MATCH_1}" expected)
    string(REGEX REPLACE "([][+.*()^$?|\\\\{}])" "\\\\\\1" expected_regex "${expected}")
    add_test(NAME ascend_${name}_ok COMMAND "${CMAKE_CXX_COMPILER}" ${flags} "${src}" COMMAND_EXPAND_LISTS)
    add_test(NAME ascend_${name}_ko COMMAND "${CMAKE_CXX_COMPILER}" ${flags} -DLOOM_SHOULD_FAIL "${src}"
             COMMAND_EXPAND_LISTS)
    # PASS_REGULAR_EXPRESSION alone decides: a compile that succeeds prints nothing and fails the test
    set_tests_properties(ascend_${name}_ok ascend_${name}_ko PROPERTIES LABELS "ascend;failtest" TIMEOUT 300)
    set_tests_properties(ascend_${name}_ko PROPERTIES PASS_REGULAR_EXPRESSION "${expected_regex}")
  endforeach()
endfunction()
