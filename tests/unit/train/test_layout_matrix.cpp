// The regular matrix of the one trainer (train::trainer): {fp32, bf16, fp16 with the
// dynamic loss scaler} x {DP only, TP, PP, TP x PP, TP x PP with DP} x {ZeRO-1 off, on}, over
// comm::threads, each against one rank (train::trainer) on the same global batch:
//   - the loss of every step within a tolerance derived from the precision's unit roundoff
//     (fp32 u = 2^-24: 1e-5 relative; bf16 u = 2^-8: 2^-7; fp16 u = 2^-11: 2^-9), the same loss
//     scale and skipped steps as one rank;
//   - a checkpoint saved after step 2 resumes on the same layout bit for bit (losses of steps
//     3..4), and loads onto one rank (resharded) within the tolerance;
//   - the same with dropout 0.1 for fp32 TP, PP and TP x DP (the masks do not depend on the layout);
//   - the Llama recipe (llama_tiny) in bf16 and fp16 on TP x PP x DP with ZeRO-1, TP x DP, PP.
// CI runs a covering subset (every pair of precision, layout kind and ZeRO setting appears
// together at least once: TEST_CASE "layout matrix (covering subset)"); the whole product is the
// skipped TEST_CASE "layout matrix [full]" (run it with build/tests/loom_tests -tc='*full*'
// --no-skip). The cell's checks live in tests/support/layout_matrix.hpp, shared with the MPI
// side of the matrix (tests/mpi/test_layout_matrix_mpi.cpp).
#include <doctest/doctest.h>

#include <loom/parallel/comm_threads.hpp>

#include "../../support/layout_matrix.hpp"
#include "../../support/temp_dir.hpp"

namespace {

using namespace loom;
namespace lm = loom_test::layout_matrix;
constexpr int global_windows = 8;  // per step: micro * micro_batch * dp for dp = 2; dp = 1 runs 4 micro-batches

/// One cell over comm::threads: TP * PP * dp threads per run.
template <class Prec, int TP, int PP, class Model = lm::M>
void matrix_case(int dp, bool zero1, double dropout = 0) {
  loom_test::temp_dir dir;
  const std::string name =
      std::string(Model::name) + " " + lm::cell_name<Prec>(TP, PP, dp, zero1) + (dropout > 0 ? " dropout " + std::to_string(dropout).substr(0, 3) : "");
  lm::check_cell<Prec, Model>(
      name, global_windows, dir.path,
      [&](const lm::fs::path& save, const lm::fs::path& load) {
        lm::curve out;
        comm::run_threads(TP * PP * dp, [&](comm::threads& world) {
          auto c = lm::layout_rank<Prec, TP, PP, Model>(world, global_windows, zero1, save, load, dropout);
          if (world.rank() == 0) out = std::move(c);
        });
        return out;
      },
      true, dropout);
}

}  // namespace

TEST_CASE("layout matrix (covering subset): every layout trains like one rank, resumes bit for bit, reshards") {
  // DP only (1,1,2), TP (2,1,1), PP (1,2,1), TP x PP (2,2,1), TP x PP with DP (2,2,2);
  // ZeRO-1 where there is a dp group. Every (precision, layout), (precision, ZeRO-1) and
  // (layout with dp, ZeRO-1) pair appears.
  matrix_case<precision::fp32, 1, 1>(2, true);
  matrix_case<precision::fp32, 2, 1>(1, false);
  matrix_case<precision::fp32, 1, 2>(1, false);
  matrix_case<precision::fp32, 2, 2>(1, false);
  matrix_case<precision::fp32, 2, 2>(2, false);
  matrix_case<precision::bf16, 1, 1>(2, false);
  matrix_case<precision::bf16, 2, 1>(1, false);
  matrix_case<precision::bf16, 1, 2>(1, false);
  matrix_case<precision::bf16, 2, 2>(1, false);
  matrix_case<precision::bf16, 2, 2>(2, true);
  matrix_case<precision::fp16, 1, 1>(2, true);
  matrix_case<precision::fp16, 2, 1>(1, false);
  matrix_case<precision::fp16, 1, 2>(1, false);
  matrix_case<precision::fp16, 2, 2>(1, false);
  matrix_case<precision::fp16, 2, 2>(2, false);
}

TEST_CASE("layout matrix, Llama (grouped-query attention, SwiGLU sections split by TP): 16-bit layouts") {
  // fp32 layouts of llama_tiny: tests/unit/io/test_checkpoint_parallel.cpp; here bf16 and fp16
  // (dynamic loss scaler) on TP x PP, with DP and ZeRO-1, resumed and resharded.
  using L = models::llama_tiny;
  matrix_case<precision::bf16, 2, 2, L>(2, true);
  matrix_case<precision::fp16, 2, 1, L>(2, false);
  matrix_case<precision::fp16, 1, 2, L>(1, false);
}

TEST_CASE("layout matrix with dropout 0.1: fp32 TP, PP, TP x DP equal one rank, resume bit for bit") {
  // Masks are keyed by (seed, step, global micro-batch, global layer, global head, position)
  // (nn/dropout.hpp), so a sharded or split run draws the single rank's masks: the same 1e-5
  // bound as without dropout, and a resumed run repeats the uninterrupted one bit for bit.
  const auto off = lm::one_rank<precision::fp32>(global_windows, 0, lm::steps);
  const auto on = lm::one_rank<precision::fp32>(global_windows, 0, lm::steps, {}, 0.1);
  for (int s = 0; s < lm::steps; ++s) CHECK(on.loss[std::size_t(s)] != off.loss[std::size_t(s)]);  // dropout is on
  matrix_case<precision::fp32, 2, 1>(1, false, 0.1);
  matrix_case<precision::fp32, 1, 2>(1, false, 0.1);
  matrix_case<precision::fp32, 2, 1>(2, true, 0.1);
}

TEST_CASE("layout matrix [full]: the whole product" * doctest::skip()) {
  auto all_layouts = []<class Prec>() {
    for (const bool z : {false, true}) {
      matrix_case<Prec, 1, 1>(2, z);
      matrix_case<Prec, 2, 1>(2, z);
      matrix_case<Prec, 1, 2>(2, z);
      matrix_case<Prec, 2, 2>(2, z);
    }
    matrix_case<Prec, 2, 1>(1, false);
    matrix_case<Prec, 1, 2>(1, false);
    matrix_case<Prec, 2, 2>(1, false);
  };
  all_layouts.template operator()<precision::fp32>();
  all_layouts.template operator()<precision::bf16>();
  all_layouts.template operator()<precision::fp16>();
}
