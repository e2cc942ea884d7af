# cmake -DLOOM_SYNTAX_FLAGS_FILE=<file> -DSOURCE=<file.cpp> -P loom_compile_fail.cmake
# The `_ko` half of a compile-fail test (tests/compile_fail/CMakeLists.txt): compiles SOURCE with
# -DLOOM_SHOULD_FAIL. If the compiler rejects it, its diagnostics are printed for the test's
# PASS_REGULAR_EXPRESSION to check; if it accepts it, says so and prints no diagnostics, so the
# expected text cannot match.
include("${LOOM_SYNTAX_FLAGS_FILE}")   # LOOM_CXX, LOOM_SYNTAX_FLAGS
execute_process(COMMAND "${LOOM_CXX}" ${LOOM_SYNTAX_FLAGS} -DLOOM_SHOULD_FAIL "${SOURCE}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled with -DLOOM_SHOULD_FAIL, but it must be rejected")
endif()
message("compiler exit status ${rc}; its output:\n${out}")
