// expect: tensor-parallel degree TP must divide n_kv_head
// llama_100m has 12 query heads but 4 key/value heads (grouped-query attention): TP=3 divides the
// query heads, not the key/value heads a rank must own whole; TP=4 divides both.
#include <loom/models/configs.hpp>
#include <loom/models/fits.hpp>

#ifdef LOOM_SHOULD_FAIL
static_assert(loom::models::fits<loom::layout<3, 1>, loom::models::llama_100m>());
#else
static_assert(loom::models::fits<loom::layout<4, 1>, loom::models::llama_100m>());
#endif

int main() { return 0; }
