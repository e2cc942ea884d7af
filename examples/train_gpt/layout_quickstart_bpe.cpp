// train_gpt --layout for --model quickstart_bpe: the layout<TP,PP> instantiations (tp2pp1, tp1pp2, tp2pp2)
// of run_layout, compiled apart from train_gpt.cpp so the translation units build in parallel.
#include <loom/parallel/comm_threads.hpp>
#if LOOM_WITH_MPI
#include <loom/parallel/comm_mpi.hpp>
#endif

#include "run_layout.hpp"

namespace train_gpt_cli {

template <class M, class World>
int run_layout(const options& o, int tp, int pp, World& world) {
  return dispatch_layout<M, 16, 128>(o, tp, pp, world);
}

template int run_layout<loom::models::quickstart_bpe, loom::comm::threads>(const options&, int, int, loom::comm::threads&);
#if LOOM_WITH_MPI
template int run_layout<loom::models::quickstart_bpe, loom::comm::mpi>(const options&, int, int, loom::comm::mpi&);
#endif

}  // namespace train_gpt_cli
