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
#                                 tests/ascend/*.cpp), one CTest test per TEST_CASE, label "ascend"
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
endfunction()
