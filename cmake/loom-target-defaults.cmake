# loom_target_defaults(<target>): flags for loom's own tests, examples and benchmarks.
# Never applied to the INTERFACE targets, so consumers choose their own -march and warnings.
#   -march=native   when LOOM_NATIVE is ON (default for a top-level build) and the compiler takes it
#   -Wall -Wextra   GCC and Clang
#   -Wno-maybe-uninitialized  GCC: GCC 12 flags its own AVX-512 intrinsics (`__m512 __Y = __Y;` in
#                   avx512fintrin.h, inlined through Eigen) hundreds of times per build, which
#                   buried every real warning
include_guard(GLOBAL)
include(CheckCXXCompilerFlag)
if(LOOM_NATIVE)
  check_cxx_compiler_flag(-march=native LOOM_COMPILER_HAS_MARCH_NATIVE)
endif()

function(loom_target_defaults target)
  if(LOOM_NATIVE AND LOOM_COMPILER_HAS_MARCH_NATIVE)
    target_compile_options(${target} PRIVATE -march=native)
  endif()
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE -Wall -Wextra)
  endif()
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE -Wno-maybe-uninitialized)
  endif()
endfunction()
