#pragma once
// Test helpers that set process state for one scope and restore it: the OpenMP team size and an
// environment variable. A test must not leave its settings to the next test of the same process.
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <cstdlib>
#include <string>

namespace loom_test {

/// omp_get_max_threads(), 1 without OpenMP.
inline int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

/// Sets the OpenMP team size to n for the scope (kernels pick their path from it; ranks that
/// are threads use 1), then restores it.
struct thread_scope {
  int saved = max_threads();
  explicit thread_scope([[maybe_unused]] int n) {
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
  }
  ~thread_scope() {
#ifdef _OPENMP
    omp_set_num_threads(saved);
#endif
  }
  thread_scope(const thread_scope&) = delete;
  thread_scope& operator=(const thread_scope&) = delete;
};

/// Sets (or unsets, value == nullptr) environment variable `n` for the scope, then restores it.
struct scoped_env {
  std::string name;
  std::string old;
  bool had;
  scoped_env(const char* n, const char* value) : name(n) {
    const char* o = std::getenv(n);
    had = o != nullptr;
    if (had) old = o;
    if (value) ::setenv(n, value, 1);
    else ::unsetenv(n);
  }
  ~scoped_env() {
    if (had) ::setenv(name.c_str(), old.c_str(), 1);
    else ::unsetenv(name.c_str());
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;
};

}  // namespace loom_test
