// expect: tensor-parallel degree TP must divide vocab_padded
// A model whose only TP-incompatible dimension is vocab_padded = 102: TP=4 divides the 4 heads and
// the MLP width 256 but not 102; TP=2 divides all three.
#include <loom/models/configs.hpp>
#include <loom/models/fits.hpp>

struct odd_vocab {
  static constexpr int n_layer = 2, n_head = 4, d_model = 64, max_seq = 32;
  static constexpr int vocab = 100, vocab_padded = 102;
};
static_assert(loom::models::model_config<odd_vocab>);

#ifdef LOOM_SHOULD_FAIL
static_assert(loom::models::fits<loom::layout<4, 1>, odd_vocab>());
#else
static_assert(loom::models::fits<loom::layout<2, 1>, odd_vocab>());
#endif

int main() { return 0; }
