// expect: tensor-parallel degree TP must divide n_head
// GPT-2 small has 12 heads: TP=5 cannot give every tensor-parallel rank whole heads; TP=4 can.
#include <loom/models/configs.hpp>
#include <loom/models/fits.hpp>

#ifdef LOOM_SHOULD_FAIL
static_assert(loom::models::fits<loom::layout<5, 1>, loom::models::gpt2_small>());
#else
static_assert(loom::models::fits<loom::layout<4, 1>, loom::models::gpt2_small>());
#endif

int main() { return 0; }
