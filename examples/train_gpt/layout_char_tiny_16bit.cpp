// train_gpt --layout tp2pp2 --precision bf16|fp16 for --model char_tiny: the 16-bit instantiations
// of run_layout (fp16 with a dynamic loss scaler), apart from layout_char_tiny.cpp so the two
// translation units build in parallel. Only tp2pp2, only char_tiny and only --comm threads: each
// (layout, precision, communicator) instantiation costs build time (this TU: 54 s of CPU with the
// two threads instantiations, 83 s with the two MPI ones as well; docs/tensor_pipeline.md).
#include <type_traits>

#include <loom/parallel/comm_threads.hpp>
#if LOOM_WITH_MPI
#include <loom/parallel/comm_mpi.hpp>
#endif

#include "run_layout.hpp"

namespace train_gpt_cli {

template <class M, class World>
int run_layout_16bit(const options& o, int tp, int pp, World& world) {
  if constexpr (std::is_same_v<World, loom::comm::threads>) {
    return dispatch_layout_16bit<M, 8, 32>(o, tp, pp, world);
  } else {
    (void)world;
    throw loom::input_error("--layout tp" + std::to_string(tp) + "pp" + std::to_string(pp) + " --precision " +
                            o.precision + " --comm " + o.comm + ": 16-bit tensor/pipeline-parallel training is compiled "
                            "for --comm threads only; pass --comm threads --ranks N, or drop --precision (fp32)");
  }
}

template int run_layout_16bit<loom::models::char_tiny, loom::comm::threads>(const options&, int, int, loom::comm::threads&);
#if LOOM_WITH_MPI
template int run_layout_16bit<loom::models::char_tiny, loom::comm::mpi>(const options&, int, int, loom::comm::mpi&);
#endif

}  // namespace train_gpt_cli
