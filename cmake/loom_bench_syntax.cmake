# cmake -DLOOM_SYNTAX_FLAGS_FILE=<file> -DBENCH_DIR=<bench dir> -P loom_bench_syntax.cmake
# Compiles every BENCH_DIR/*.cpp with -fsyntax-only and the library's flags (CTest bench_syntax),
# one after the other; fails naming each file the compiler rejects, with its diagnostics.
include("${LOOM_SYNTAX_FLAGS_FILE}")   # LOOM_CXX, LOOM_SYNTAX_FLAGS
file(GLOB sources "${BENCH_DIR}/*.cpp")
set(failed "")
foreach(src IN LISTS sources)
  execute_process(COMMAND "${LOOM_CXX}" ${LOOM_SYNTAX_FLAGS} -march=native -DLOOM_CPU_EXTERN_KERNELS=1
                          "-DLOOM_BENCH_REFERENCE_DIR=\"${BENCH_DIR}/reference\""
                          "${src}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message("${src}:\n${out}")
    list(APPEND failed "${src}")
  endif()
endforeach()
list(LENGTH sources n)
if(failed)
  message(FATAL_ERROR "bench_syntax: these benchmarks do not compile: ${failed}")
endif()
message("bench_syntax: ${n} benchmarks compile")
