# LoomAscendEmulation: loom's HOST EMULATION of the Huawei CANN APIs (ACL runtime, aclnn operators,
# HCCL) so the Ascend backend's code paths build and run in CI on a CPU-only machine. It is NOT the
# vendor toolkit: emulation/include restates the documented signatures, emulation/src implements
# them on host memory (see docs/ascend.md). Test-only; loom itself stays header-only.
#
# include() it after loom::loom exists. Defines:
#   loom_ascend_emulation         STATIC library built from emulation/src/*.cpp
#   loom::ascend_emulated         INTERFACE: loom::loom + emulation/include + the library +
#                                 the compile definition LOOM_ASCEND_EMULATION=1
#   loom_ascend_emulation_tests() adds the test binary loom_ascend_tests (tests/unit/main.cpp +
#                                 tests/ascend/*.cpp), one CTest test per TEST_CASE, label "ascend",
#                                 and the compile-fail pairs tests/ascend/compile_fail/<name>.cpp
#                                 (<name>_ok must compile; <name>_ko, with -DLOOM_SHOULD_FAIL, must
#                                 fail printing the text of the file's `// expect: <text>` first line)
include_guard(GLOBAL)
cmake_path(SET _loom_emu_root NORMALIZE "${CMAKE_CURRENT_LIST_DIR}/..")
set(LOOM_ASCEND_EMULATION_ROOT "${_loom_emu_root}" CACHE INTERNAL "loom source root for the Ascend emulation")

find_package(Threads REQUIRED)
file(GLOB _loom_emu_sources CONFIGURE_DEPENDS "${_loom_emu_root}/emulation/src/*.cpp")
add_library(loom_ascend_emulation STATIC ${_loom_emu_sources})
target_include_directories(loom_ascend_emulation PUBLIC "${_loom_emu_root}/emulation/include")
target_compile_features(loom_ascend_emulation PUBLIC cxx_std_20)
target_link_libraries(loom_ascend_emulation PUBLIC Threads::Threads)
set_target_properties(loom_ascend_emulation PROPERTIES POSITION_INDEPENDENT_CODE ON)

add_library(loom_ascend_emulated INTERFACE)
add_library(loom::ascend_emulated ALIAS loom_ascend_emulated)
target_link_libraries(loom_ascend_emulated INTERFACE loom::loom loom_ascend_emulation)
target_compile_definitions(loom_ascend_emulated INTERFACE LOOM_ASCEND_EMULATION=1)

function(loom_ascend_emulation_tests)
  set(root "${LOOM_ASCEND_EMULATION_ROOT}")
  file(GLOB sources CONFIGURE_DEPENDS "${root}/tests/ascend/*.cpp")
  if(NOT sources)
    return()
  endif()
  find_package(doctest REQUIRED)
  add_executable(loom_ascend_tests "${root}/tests/unit/main.cpp" ${sources})
  target_link_libraries(loom_ascend_tests PRIVATE loom::ascend_emulated doctest::doctest)
  target_include_directories(loom_ascend_tests PRIVATE "${root}/tests")
  if(COMMAND loom_target_defaults)
    loom_target_defaults(loom_ascend_tests)
  endif()
  if(COMMAND loom_doctest_discover_tests)
    loom_doctest_discover_tests(loom_ascend_tests WORKING_DIRECTORY "${root}" LABELS ascend TIMEOUT 900)
  else()
    add_test(NAME loom_ascend_tests COMMAND loom_ascend_tests WORKING_DIRECTORY "${root}")
  endif()

  # compile-fail pairs: syntax-only compiles with the include flags of loom::ascend_emulated
  file(GLOB failtests CONFIGURE_DEPENDS "${root}/tests/ascend/compile_fail/*.cpp")
  if(failtests)
    set(probe "${CMAKE_CURRENT_BINARY_DIR}/loom_ascend_probe.cpp")
    file(WRITE "${probe}" "// include flags probe, never built\n")
    add_library(loom_ascend_probe OBJECT EXCLUDE_FROM_ALL "${probe}")
    target_link_libraries(loom_ascend_probe PRIVATE loom::ascend_emulated)
    set(inc "$<REMOVE_DUPLICATES:$<TARGET_PROPERTY:loom_ascend_probe,INCLUDE_DIRECTORIES>>")
    set(flags -std=c++20 -fsyntax-only "$<$<BOOL:${inc}>:-I$<JOIN:${inc},$<SEMICOLON>-I>>")
  endif()
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
