// expect: pipeline-parallel degree PP must divide n_layer
// GPT-2 small has 12 layers: PP=5 stages cannot hold equal numbers of layers; PP=4 can.
#include <loom/models/configs.hpp>
#include <loom/models/fits.hpp>

#ifdef LOOM_SHOULD_FAIL
static_assert(loom::models::fits<loom::layout<1, 5>, loom::models::gpt2_small>());
#else
static_assert(loom::models::fits<loom::layout<1, 4>, loom::models::gpt2_small>());
#endif

int main() { return 0; }
