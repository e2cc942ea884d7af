# cmake -DTEST_EXECUTABLE=<exe> -DTEST_WORKING_DIR=<dir> -DTEST_ENVIRONMENT=<A=1|B=2>
#       -DTEST_LABELS=<l1|l2> -DTEST_TIMEOUT=<s> [-DTEST_NAME_PREFIX=<word>] -DCTEST_FILE=<out>
#       -P loom_doctest_add_tests.cmake
# Writes CTEST_FILE with one add_test per TEST_CASE listed by `<exe> --list-test-cases`, named
# like the TEST_CASE, or "<TEST_NAME_PREFIX>: <TEST_CASE>".
# See cmake/loom-doctest.cmake. Test names may contain any of [ ] ; , characters.
execute_process(COMMAND "${TEST_EXECUTABLE}" --list-test-cases --no-colors=true
                WORKING_DIRECTORY "${TEST_WORKING_DIR}"
                OUTPUT_VARIABLE output ERROR_VARIABLE errors RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "listing the test cases of ${TEST_EXECUTABLE} failed (exit status ${rc}):\n"
                      "${output}${errors}")
endif()

# Make the text list-safe before splitting it into lines: CMake lists treat ';' as a separator and
# do not split inside unbalanced '[' ... ']'. The placeholders are restored per line.
string(REPLACE "[" "@LOOM_LB@" output "${output}")
string(REPLACE "]" "@LOOM_RB@" output "${output}")
string(REPLACE ";" "@LOOM_SC@" output "${output}")
string(REPLACE "\n" ";" lines "${output}")

string(REPLACE "|" ";" environment "${TEST_ENVIRONMENT}")
string(REPLACE "|" ";" labels "${TEST_LABELS}")
set(script "")
set(count 0)
foreach(line IN LISTS lines)
  if(line STREQUAL "" OR line MATCHES "^=+$" OR line MATCHES "^@LOOM_LB@doctest@LOOM_RB@ ")
    continue()
  endif()
  string(REPLACE "@LOOM_LB@" "[" line "${line}")
  string(REPLACE "@LOOM_RB@" "]" line "${line}")
  string(REPLACE "@LOOM_SC@" ";" line "${line}")
  # doctest's --test-case filter splits at commas unless escaped; * and ? are wildcards (kept).
  string(REPLACE "," "\\," filter "${line}")
  set(name "${line}")
  if(TEST_NAME_PREFIX)
    set(name "${TEST_NAME_PREFIX}: ${line}")
  endif()
  string(APPEND script
    "add_test([==[${name}]==] [==[${TEST_EXECUTABLE}]==] [==[--test-case=${filter}]==])\n"
    "set_tests_properties([==[${name}]==] PROPERTIES WORKING_DIRECTORY [==[${TEST_WORKING_DIR}]==]")
  if(environment)
    string(APPEND script " ENVIRONMENT [==[${environment}]==]")
  endif()
  if(labels)
    string(APPEND script " LABELS [==[${labels}]==]")
  endif()
  if(TEST_TIMEOUT)
    string(APPEND script " TIMEOUT ${TEST_TIMEOUT}")
  endif()
  string(APPEND script ")\n")
  math(EXPR count "${count} + 1")
endforeach()
file(WRITE "${CTEST_FILE}" "# ${count} test cases of ${TEST_EXECUTABLE}\n${script}")
