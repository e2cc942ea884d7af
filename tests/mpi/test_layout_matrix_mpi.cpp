// The layout matrix of the one trainer over comm::mpi: the checks of tests/unit/train/
// test_layout_matrix.cpp (comm::threads), shared through tests/support/layout_matrix.hpp —
// every layout trains like one rank on the same global batch within the precision's tolerance,
// resumes bit for bit from its own checkpoint, and reshards onto one rank. Each process is one
// rank of the layout; the cells run depend on the world size (ctest: mpi_np2, mpi_np3, and
// mpi_np4 running this file's test case only):
//   2 ranks: DP (1,1,2) with ZeRO-1 in fp32, bf16 and fp16 (the sharded masters, saved and
//            loaded); TP (2,1,1) fp32; PP (1,2,1) bf16
//   3 ranks: DP (1,1,3) with ZeRO-1 in bf16 (uneven chunks) and without it in fp16
//   4 ranks: TP x PP (2,2,1) fp16; TP with DP (2,1,2) bf16 ZeRO-1; PP with DP (1,2,2) fp32 ZeRO-1
#include <doctest/doctest.h>

#include <stdlib.h>

#include <array>
#include <filesystem>
#include <string>
#include <system_error>

#include <loom/parallel/comm_mpi.hpp>

#include "../support/layout_matrix.hpp"

namespace {

using namespace loom;
namespace lm = loom_test::layout_matrix;

/// A directory every rank sees: rank 0 creates it under $TMPDIR (one machine) and broadcasts its
/// name; removed by rank 0 after a barrier at scope exit.
struct shared_temp_dir {
  comm::mpi& world;
  lm::fs::path path;
  explicit shared_temp_dir(comm::mpi& w) : world(w) {
    std::array<char, 512> name{};
    if (world.rank() == 0) {
      std::string tmpl = (lm::fs::temp_directory_path() / "loom_mpi_matrix_XXXXXX").string();
      if (::mkdtemp(tmpl.data()) != nullptr && tmpl.size() < name.size()) tmpl.copy(name.data(), tmpl.size());
    }
    world.broadcast(std::span<char>(name), 0);
    path = name.data();
    REQUIRE(!path.empty());
  }
  ~shared_temp_dir() {
    world.barrier();
    std::error_code ec;
    if (world.rank() == 0) lm::fs::remove_all(path, ec);
  }
  shared_temp_dir(const shared_temp_dir&) = delete;
  shared_temp_dir& operator=(const shared_temp_dir&) = delete;
};

/// One cell: this process is one of world.size() = TP * PP * dp ranks.
template <class Prec, int TP, int PP>
void matrix_case(comm::mpi& world, int global_windows, bool zero1) {
  REQUIRE(world.size() % (TP * PP) == 0);
  const shared_temp_dir dir(world);
  const std::string name = lm::cell_name<Prec>(TP, PP, world.size() / (TP * PP), zero1);
  lm::check_cell<Prec>(name, global_windows, dir.path, [&](const lm::fs::path& save, const lm::fs::path& load) {
    return lm::layout_rank<Prec, TP, PP>(world, global_windows, zero1, save, load);
  }, world.rank() == 0);
}

}  // namespace

TEST_CASE("layout matrix over comm::mpi: every layout trains like one rank, resumes bit for bit, reshards") {
  comm::mpi world(MPI_COMM_WORLD);
  switch (world.size()) {
    case 2:  // 8 windows per step: 4 per dp rank
      matrix_case<precision::fp32, 1, 1>(world, 8, true);
      matrix_case<precision::bf16, 1, 1>(world, 8, true);
      matrix_case<precision::fp16, 1, 1>(world, 8, true);
      matrix_case<precision::fp32, 2, 1>(world, 8, false);
      matrix_case<precision::bf16, 1, 2>(world, 8, false);
      break;
    case 3:  // 6 windows per step: one micro-batch of 2 per dp rank
      matrix_case<precision::bf16, 1, 1>(world, 6, true);
      matrix_case<precision::fp16, 1, 1>(world, 6, false);
      break;
    case 4:
      matrix_case<precision::fp16, 2, 2>(world, 8, false);
      matrix_case<precision::bf16, 2, 1>(world, 8, true);
      matrix_case<precision::fp32, 1, 2>(world, 8, true);
      break;
    default:
      MESSAGE("layout matrix over comm::mpi: no cells for " << world.size() << " ranks (2, 3 and 4 have some)");
  }
}
