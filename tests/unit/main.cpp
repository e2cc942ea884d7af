// The one main() of loom's doctest binaries; test files only `#include <doctest/doctest.h>`.
//   loom_tests      (tests/unit/**/*.cpp)  plain doctest main
//   loom_mpi_tests  (tests/mpi/*.cpp, built with LOOM_TEST_MPI=1)  every rank runs the tests
//                   between MPI_Init and MPI_Finalize; ranks other than 0 print only failures;
//                   the exit status is the worst over all ranks, so a failure on any rank fails.
// Both binaries are built with LOOM_SOURCE_DIR and LOOM_DATA_DIR defined as string literals
// (the repository and the corpora directory); CTest also exports them as environment variables.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#if LOOM_TEST_MPI
#include <mpi.h>
#endif

int main(int argc, char** argv) {
#if LOOM_TEST_MPI
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  doctest::Context context;
  context.applyCommandLine(argc, argv);
  if (rank != 0) context.setOption("minimal", true);
  int status = context.run();
  if (!context.shouldExit()) {
    int worst = 0;
    MPI_Allreduce(&status, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    status = worst;
  }
  MPI_Finalize();
  return status;
#else
  doctest::Context context;
  context.applyCommandLine(argc, argv);
  return context.run();
#endif
}
