// A user's program: include loom's headers and check some compile-time facts.
#include <loom/device/cpu.hpp>
#include <loom/models/configs.hpp>
#include <loom/models/fits.hpp>
#include <loom/policy.hpp>

#include <type_traits>

using gpt2 = loom::models::gpt2_small;
using policy = loom::policy<loom::device::cpu, loom::precision::fp32, loom::layout<4, 3>>;

static_assert(gpt2::vocab_padded % 128 == 0 && gpt2::vocab_padded >= gpt2::vocab);
static_assert(loom::models::fits<policy::layout, gpt2>());
static_assert(std::is_same_v<policy::device, loom::device::cpu>);
static_assert(policy::layout::tp_rank(5) == 1);

int main() { return policy::layout::pp_rank(/*rank=*/11, /*dp=*/1) == 2 ? 0 : 1; }
