// expect: fp16 needs a loss scaler
// An fp16 trainer must have a dynamic loss scaler (half-precision gradients underflow and
// overflow without one); with precision::dynamic_loss_scaler it compiles.
#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/train/trainer.hpp>

using fp16_cpu = loom::policy<loom::device::cpu, loom::precision::fp16>;
#ifdef LOOM_SHOULD_FAIL
using trainer_t = loom::train::trainer<loom::models::tiny, fp16_cpu, 2, 8>;
#else
using trainer_t = loom::train::trainer<loom::models::tiny, fp16_cpu, 2, 8, loom::parallel::local_group, loom::kernels::fused,
                                       loom::precision::dynamic_loss_scaler>;
#endif
static_assert(sizeof(trainer_t) > 0);

int main() { return 0; }
