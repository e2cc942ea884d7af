// expect: trainer: fp16 needs a loss scaler
// The tensor/pipeline-parallel trainer, like train::trainer, refuses fp16 without a dynamic loss
// scaler; with precision::dynamic_loss_scaler it compiles.
#include <loom/device/cpu.hpp>
#include <loom/kernels/cpu.hpp>
#include <loom/parallel/comm_threads.hpp>
#include <loom/train/trainer.hpp>

using fp16_tp2 = loom::policy<loom::device::cpu, loom::precision::fp16, loom::layout<2, 1>>;
#ifdef LOOM_SHOULD_FAIL
using trainer_t = loom::train::trainer<loom::models::tiny_parallel, fp16_tp2, 2, 8, loom::comm::threads>;
#else
using trainer_t = loom::train::trainer<loom::models::tiny_parallel, fp16_tp2, 2, 8, loom::comm::threads,
                                                loom::kernels::fused, loom::precision::dynamic_loss_scaler>;
#endif
static_assert(sizeof(trainer_t) > 0);

int main() { return 0; }
