// loom::layout<TP,PP>: rank decomposition and the compile-time fit against a model.
// Expected values are the worked example in include/loom/core/layout.hpp (Megatron order:
// tensor-parallel rank fastest, then data-parallel, then pipeline stage), checked by hand.
#include <doctest/doctest.h>

#include <loom/models/configs.hpp>
#include <loom/models/fits.hpp>

#include <array>

TEST_CASE("layout<2,2> on 8 ranks: tp, dp and pp ranks follow Megatron order") {
  using L = loom::layout<2, 2>;
  constexpr int world = 8;
  constexpr int dp = world / (L::tp * L::pp);
  static_assert(dp == 2);
  constexpr std::array<int, world> tp{0, 1, 0, 1, 0, 1, 0, 1};
  constexpr std::array<int, world> dpr{0, 0, 1, 1, 0, 0, 1, 1};
  constexpr std::array<int, world> pp{0, 0, 0, 0, 1, 1, 1, 1};
  for (int rank = 0; rank < world; ++rank) {
    CAPTURE(rank);
    CHECK(L::tp_rank(rank) == tp[rank]);
    CHECK(L::dp_rank(rank, dp) == dpr[rank]);
    CHECK(L::pp_rank(rank, dp) == pp[rank]);
  }
}

TEST_CASE("layout<4,3> on 24 ranks: every (tp, dp, pp) triple occurs exactly once") {
  using L = loom::layout<4, 3>;
  constexpr int world = 24, dp = world / (L::tp * L::pp);
  std::array<int, world> seen{};
  for (int rank = 0; rank < world; ++rank) {
    const int t = L::tp_rank(rank), d = L::dp_rank(rank, dp), p = L::pp_rank(rank, dp);
    REQUIRE(t >= 0);
    REQUIRE(t < 4);
    REQUIRE(d >= 0);
    REQUIRE(d < dp);
    REQUIRE(p >= 0);
    REQUIRE(p < 3);
    ++seen[(p * dp + d) * 4 + t];
    CHECK(rank == (p * dp + d) * 4 + t);   // the decomposition inverts the rank
  }
  for (int count : seen) CHECK(count == 1);
}

TEST_CASE("fits<> accepts layouts that divide GPT-2 small") {
  // n_head 12, 4*d_model 3072, vocab_padded 50304, n_layer 12: all divisible by 4 and by 3.
  static_assert(loom::models::fits<loom::layout<4, 3>, loom::models::gpt2_small>());
  static_assert(loom::models::fits<loom::parallel::ddp, loom::models::tiny>());
  CHECK(loom::models::fits<loom::layout<4, 3>, loom::models::gpt2_small>());
  CHECK(loom::layout<4, 3>::tp == 4);
  CHECK(loom::layout<4, 3>::pp == 3);
}
