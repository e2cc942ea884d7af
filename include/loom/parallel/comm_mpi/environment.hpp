#pragma once
/// \file comm::mpi_environment — MPI_Init_thread / MPI_Finalize for comm::mpi
/// (loom/parallel/comm_mpi.hpp, which documents the design).
#include <algorithm>
#include <string>

#include <loom/core/error.hpp>
#include <loom/parallel/comm.hpp>
#include <loom/parallel/detail/mpi_operations.hpp>  // <mpi.h>, mpi_check

namespace loom::parallel::comm {

class mpi_communicator;

/// RAII for MPI_Init_thread / MPI_Finalize. Create exactly one, first thing in main, and destroy
/// every mpi_communicator before it. If MPI is already initialised (by the caller), it neither
/// initialises nor finalises, and only checks the thread level.
/// Errors: device_error if MPI_Init_thread fails or the level provided is below `required`.
class mpi_environment {
 public:
  /// requested: MPI_THREAD_MULTIPLE (asynchronous operations on a progress thread); required:
  /// MPI_THREAD_SERIALIZED (the fallback, see the file comment). argc/argv may be null.
  explicit mpi_environment(int* argc = nullptr, char*** argv = nullptr, int required = MPI_THREAD_SERIALIZED,
                           int requested = MPI_THREAD_MULTIPLE) {
    int initialized = 0;
    detail::mpi_check(MPI_Initialized(&initialized), "MPI_Initialized");
    if (initialized) {
      detail::mpi_check(MPI_Query_thread(&provided_), "MPI_Query_thread");
    } else {
      detail::mpi_check(MPI_Init_thread(argc, argv, std::max(required, requested), &provided_), "MPI_Init_thread");
      owns_ = true;
    }
    if (provided_ < required) {
      const std::string msg =
          (owns_ ? "this MPI library provides thread level " : "MPI was initialised by the caller with thread level ") +
          std::to_string(provided_) + ", less than the required " + std::to_string(required) +
          (owns_ ? "; use an MPI built with thread support"
                 : "; initialise with MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) or let "
                   "mpi_environment initialise MPI");
      if (owns_) MPI_Finalize();
      owns_ = false;
      throw device_error(MPI_ERR_OTHER, initialized ? "MPI_Query_thread" : "MPI_Init_thread", msg);
    }
  }
  mpi_environment(const mpi_environment&) = delete;
  mpi_environment& operator=(const mpi_environment&) = delete;
  ~mpi_environment() {
    int finalized = 0;
    if (owns_ && MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) MPI_Finalize();
  }

  /// The thread level MPI provides (MPI_THREAD_SINGLE ... MPI_THREAD_MULTIPLE).
  int thread_level() const noexcept { return provided_; }

  /// A communicator over all processes (a duplicate of MPI_COMM_WORLD), named "world".
  inline mpi_communicator world(comm_options options = {}) const;

 private:
  int provided_ = 0;
  bool owns_ = false;
};

}  // namespace loom::parallel::comm
