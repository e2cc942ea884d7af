# loom_target_defaults(<target>): flags for loom's own tests, examples and benchmarks.
# Never applied to the INTERFACE targets, so consumers choose their own -march and warnings.
#   -march=native   when LOOM_NATIVE is ON (default for a top-level build) and the compiler takes it
#   -Wall -Wextra   GCC and Clang
#   -Wno-maybe-uninitialized  GCC: GCC 12 flags its own AVX-512 intrinsics (`__m512 __Y = __Y;` in
#                   avx512fintrin.h, inlined through Eigen) hundreds of times per build, which
#                   buried every real warning
#   -Wno-unknown-pragmas  when OpenMP is off (LOOM_SANITIZE=thread): the `#pragma omp` lines stay
#   loom_sanitize(<target> ${LOOM_SANITIZE})  when LOOM_SANITIZE is set (scripts/sanitize.sh)
#
# loom_sanitize(<target> <sanitizers>): compiles and links <target> with
#   -fsanitize=<sanitizers> -fno-omit-frame-pointer -O1 -g1, plus -fno-sanitize-recover=undefined
#   when <sanitizers> has undefined (a UBSan report aborts the test instead of printing and
#   continuing). -O1 (it overrides the build type's -O3) is the level the sanitizers' documentation
#   recommends; -g1 (line tables only) gives reports file:line stack frames without the cost of
#   full debug information. Used by LOOM_SANITIZE builds and by the sanitize CTest subset
#   (tests/CMakeLists.txt), which sanitizes a few targets of an ordinary build.
#
# loom_test_defaults(<target>): loom_target_defaults plus LOOM_TEST_OPTIMIZE (-O2 by default) for
#   the test programs (loom_tests, the MPI and Ascend test binaries): they run in seconds, and
#   -O2 compiles them in ~80 % of -O3's CPU time with the same floating-point contractions (FMA)
#   as -O3, so the numbers they check are the shipped code's (-O1 forms no FMAs: other roundings).
#   The kernels they call are compiled once at the build type's level (loom_kernel_instances);
#   the examples the CLI tests run, the benchmarks and loom::sessions keep the build type's
#   flags. Empty: the build type's level.
include_guard(GLOBAL)
set(LOOM_TEST_OPTIMIZE "-O2" CACHE STRING "Optimization flag of loom's test programs (empty: the build type's)")
include(CheckCXXCompilerFlag)
if(LOOM_NATIVE)
  check_cxx_compiler_flag(-march=native LOOM_COMPILER_HAS_MARCH_NATIVE)
endif()

function(loom_sanitize target sanitizers)
  target_compile_options(${target} PRIVATE -fsanitize=${sanitizers} -fno-omit-frame-pointer -O1 -g1)
  if(sanitizers MATCHES "undefined")
    target_compile_options(${target} PRIVATE -fno-sanitize-recover=undefined)
  endif()
  target_link_options(${target} PRIVATE -fsanitize=${sanitizers})
endfunction()

function(loom_target_defaults target)
  if(LOOM_NATIVE AND LOOM_COMPILER_HAS_MARCH_NATIVE)
    target_compile_options(${target} PRIVATE -march=native)
  endif()
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE -Wall -Wextra)
    if(NOT LOOM_HAS_OPENMP)
      target_compile_options(${target} PRIVATE -Wno-unknown-pragmas)
    endif()
  endif()
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE -Wno-maybe-uninitialized)
    # GCC 12's AVX-512 intrinsics build "undefined" operands as `__m512 __Y = __Y;`, and once
    # inlined into Eigen's packet code each one warns (-Wuninitialized, ~300 lines per build on an
    # AVX-512 machine; GCC bug 105593, fixed in GCC 13)
    if(LOOM_NATIVE AND LOOM_COMPILER_HAS_MARCH_NATIVE AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
      target_compile_options(${target} PRIVATE -Wno-uninitialized)
    endif()
  endif()
  if(LOOM_SANITIZE)
    loom_sanitize(${target} "${LOOM_SANITIZE}")
  endif()
endfunction()

function(loom_test_defaults target)
  loom_target_defaults(${target})
  if(LOOM_TEST_OPTIMIZE AND NOT LOOM_SANITIZE)
    target_compile_options(${target} PRIVATE ${LOOM_TEST_OPTIMIZE})
  endif()
endfunction()
