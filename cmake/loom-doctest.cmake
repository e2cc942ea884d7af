# loom_doctest_discover_tests(<target> [WORKING_DIRECTORY <dir>] [ENVIRONMENT <VAR=value>...]
#                             [LABELS <label>...] [TIMEOUT <seconds>] [NAME_PREFIX <word>])
# Registers one CTest test per doctest TEST_CASE of <target>, named exactly like the TEST_CASE
# ("<word>: <TEST_CASE>" with NAME_PREFIX, for a second binary compiling the same test files) and
# running `<target> --test-case=<name>`. Same mechanism as doctest's doctest_discover_tests
# (/usr/lib/cmake/doctest/doctest.cmake): after each build a POST_BUILD step lists the test cases
# into a CTest include file, so adding a TEST_CASE needs no re-configure.
# Why not doctest's own function: its doctestAddTests.cmake (doctest 2.4.9, Debian 12) splits the
# list output with CMake lists, so a test name with an unbalanced '[' (e.g. "... of [0, n)") merges
# all following names into one broken test, and its PROPERTIES cannot carry a list-valued
# ENVIRONMENT. cmake/loom_doctest_add_tests.cmake parses bracket- and semicolon-safe instead.
include_guard(GLOBAL)
set(_LOOM_DOCTEST_ADD_TESTS_SCRIPT "${CMAKE_CURRENT_LIST_DIR}/loom_doctest_add_tests.cmake")

function(loom_doctest_discover_tests target)
  cmake_parse_arguments(arg "" "WORKING_DIRECTORY;TIMEOUT;NAME_PREFIX" "ENVIRONMENT;LABELS" ${ARGN})
  if(NOT arg_WORKING_DIRECTORY)
    set(arg_WORKING_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}")
  endif()
  set(tests_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_tests.cmake")
  set(include_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_include.cmake")
  # Lists cannot cross add_custom_command's -D arguments intact; pass them '|'-separated.
  string(REPLACE ";" "|" env "${arg_ENVIRONMENT}")
  string(REPLACE ";" "|" labels "${arg_LABELS}")
  add_custom_command(TARGET ${target} POST_BUILD
    BYPRODUCTS "${tests_file}"
    COMMAND "${CMAKE_COMMAND}"
            "-DTEST_EXECUTABLE=$<TARGET_FILE:${target}>"
            "-DTEST_WORKING_DIR=${arg_WORKING_DIRECTORY}"
            "-DTEST_ENVIRONMENT=${env}"
            "-DTEST_LABELS=${labels}"
            "-DTEST_TIMEOUT=${arg_TIMEOUT}"
            "-DTEST_NAME_PREFIX=${arg_NAME_PREFIX}"
            "-DCTEST_FILE=${tests_file}"
            -P "${_LOOM_DOCTEST_ADD_TESTS_SCRIPT}"
    VERBATIM)
  file(WRITE "${include_file}"
    "if(EXISTS \"${tests_file}\")\n"
    "  include(\"${tests_file}\")\n"
    "else()\n"
    "  add_test(${target}_NOT_BUILT ${target}_NOT_BUILT)\n"
    "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${include_file}")
endfunction()
