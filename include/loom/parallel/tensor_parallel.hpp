#pragma once
/// \file Tensor-parallel layers (Megatron-LM semantics), over any loom::parallel communicator.
///
/// Sources: Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter Language Models Using
/// Model Parallelism" (arXiv:1909.08053) §3, Fig. 3-4; Megatron-LM core tensor_parallel/
/// (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
/// vocab_parallel_cross_entropy, mappings.py).
///
/// The conjugate communication pairs (`tp` is the tensor-parallel group, explicit everywhere;
/// no global state, STYLE §3.9):
///   f  copy_to_tp       enters a column-parallel region:  forward identity,   backward all-reduce
///   g  reduce_from_tp   leaves a row-parallel region:      forward all-reduce, backward identity
/// An MLP is f -> column-parallel fc1 -> gelu (local) -> row-parallel fc2 -> g; attention is
/// f -> column-parallel qkv (whole heads per rank) -> attention (local) -> row-parallel proj -> g.
/// One all-reduce forward and one backward per region, of the (N, C) activation.
///
/// Worked example, TP = 2, a Linear C -> OC with weight W (OC, C) stored as torch.nn.Linear:
///   column-parallel: rank r holds W rows [r*OC/2, (r+1)*OC/2) and that slice of the bias;
///                    input x replicated, output y[:, r-th half] local (not gathered)
///   row-parallel:    rank r holds W columns [r*C/2, (r+1)*C/2); input x[:, r-th half] local;
///                    output sum_r x_r W_r^T all-reduced, plus the (replicated) bias once
///   vocab-parallel:  rank r holds embedding rows [r*Vp/2, (r+1)*Vp/2); the LM head reuses them
///                    as a column-parallel linear, and the cross-entropy never gathers logits
///
/// Pointers are device pointers of D (host memory for device::cpu); each function orders its
/// kernels on ctx.stream and synchronizes the stream before it communicates, so the communicator
/// may read the buffers. Every rank of `tp` must call the same functions with the same sizes.
/// Write modes follow Note [grad accumulation]: parameter gradients +=, activation outputs and
/// activation gradients = (documented per function).
/// Errors: what the communicator throws (loom::input_error for mismatched calls across ranks,
/// comm_aborted, comm_timeout); sizes are the caller's contract and not checked here.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include <loom/core/context.hpp>
#include <loom/core/device.hpp>
#include <loom/kernels/ops.hpp>
#include <loom/parallel/comm.hpp>

namespace loom::parallel {

// ---------------------------------------------------------------------------------------------
// The conjugate pairs f and g
// ---------------------------------------------------------------------------------------------

/// f, forward: identity (the input of a column-parallel region is replicated on every tp rank).
template <class T, communicator_for<T> C>
void copy_to_tp_forward(std::span<T> /*x*/, C& /*tp*/) noexcept {}

/// f, backward: dx = sum over tp ranks of dx (in place). Each rank's dx is the gradient of its
/// own slice of the region's output; the replicated input's gradient is their sum.
template <class T, communicator_for<T> C>
void copy_to_tp_backward(std::span<T> dx, C& tp) {
  tp.all_reduce(dx, reduce_op::sum);
}

/// g, forward: y = sum over tp ranks of y (in place): the partial products of a row-parallel
/// region become the replicated output.
template <class T, communicator_for<T> C>
void reduce_from_tp_forward(std::span<T> y, C& tp) {
  tp.all_reduce(y, reduce_op::sum);
}

/// g, backward: identity (the output gradient is already replicated on every tp rank).
template <class T, communicator_for<T> C>
void reduce_from_tp_backward(std::span<T> /*dy*/, C& /*tp*/) noexcept {}

/// The vocabulary rows [begin, begin + rows) that tensor-parallel rank `rank` of `tp_size` owns
/// in a padded vocabulary of vocab_padded rows (vocab_padded % tp_size == 0, models::fits).
struct vocab_range {
  int begin = 0, rows = 0;
  static constexpr vocab_range of(int vocab_padded, int tp_size, int rank) noexcept {
    const int rows = vocab_padded / tp_size;
    return {rank * rows, rows};
  }
};

// ---------------------------------------------------------------------------------------------
// Column- and row-parallel linear layers
// ---------------------------------------------------------------------------------------------

/// ColumnParallelLinear forward, output not gathered:
///   out (N, OCl) = inp (N, Cin) * w (OCl, Cin)^T + bias (OCl)        written (=)
/// where OCl = OC / tp.size() and w, bias are this rank's rows of the global (OC, Cin), (OC).
/// inp is the replicated input of the region (f forward is the identity). bias may be null.
/// Cost: 2 N Cin OCl flops, no communication.
template <class D, class T, communicator_for<T> Comm>
void column_parallel_linear_forward(context<D>& ctx, T* out, const T* inp, const T* w, const T* bias, int N, int Cin,
                                    int OCl, Comm& tp) {
  copy_to_tp_forward(std::span<T>{}, tp);
  kernels::ops<D, T>::matmul_forward(ctx, out, inp, w, bias, N, Cin, OCl);
}

/// ColumnParallelLinear backward:
///   dinp (N, Cin) = sum over tp ranks of dout_r * w_r    written (=), identical on every rank
///   dw (OCl, Cin) += dout^T inp;  dbias (OCl) += column sums of dout (skipped when null)
/// dout (N, OCl) is this rank's slice of the output gradient. dinp is overwritten, not
/// accumulated, because the all-reduce (f backward) sums whatever dinp holds: to add the result
/// to a residual-stream gradient, write into scratch and add. G is the parameter-gradient type
/// (kernels::gradient_t: fp32 for 16-bit T; T itself for fp32). Cost: 4 N Cin OCl flops and one
/// all-reduce of N*Cin elements (of T: bf16/fp16 activation gradients are summed in fp32, rounded once).
template <class D, class T, class G, communicator_for<T> Comm>
void column_parallel_linear_backward(context<D>& ctx, T* dinp, G* dw, G* dbias, const T* dout, const T* inp,
                                     const T* w, int N, int Cin, int OCl, Comm& tp) {
  kernels::ops<D, T>::matmul_backward(ctx, dinp, dw, dbias, dout, inp, w, N, Cin, OCl, false);
  ctx.synchronize();
  copy_to_tp_backward(std::span<T>(dinp, std::size_t(N) * Cin), tp);
}

/// RowParallelLinear forward, input already split (the output of a column-parallel region):
///   out (N, OC) = sum over tp ranks of inp_r (N, Cl) * w_r (OC, Cl)^T, + bias (OC)   written (=)
/// where Cl = Cin / tp.size(), w is this rank's columns of the global (OC, Cin) and bias is the
/// replicated bias (may be null). The bias enters the sum once (tp rank 0 adds it before the
/// all-reduce), so out is bitwise identical on every rank. Cost: 2 N Cl OC flops and one
/// all-reduce of N*OC elements (g forward).
template <class D, class T, communicator_for<T> Comm>
void row_parallel_linear_forward(context<D>& ctx, T* out, const T* inp, const T* w, const T* bias, int N, int Cl,
                                 int OC, Comm& tp) {
  kernels::ops<D, T>::matmul_forward(ctx, out, inp, w, tp.rank() == 0 ? bias : nullptr, N, Cl, OC);
  ctx.synchronize();
  reduce_from_tp_forward(std::span<T>(out, std::size_t(N) * OC), tp);
}

/// RowParallelLinear backward (g backward is the identity: dout is replicated):
///   dinp (N, Cl) = dout (N, OC) * w (OC, Cl)     written (=), this rank's slice
///   dw (OC, Cl) += dout^T inp;  dbias (OC) += column sums of dout (skipped when null)
/// The replicated bias gets the same gradient on every rank. G as column_parallel_linear_backward.
/// Cost: 4 N Cl OC flops, no communication.
template <class D, class T, class G, communicator_for<T> Comm>
void row_parallel_linear_backward(context<D>& ctx, T* dinp, G* dw, G* dbias, const T* dout, const T* inp, const T* w,
                                  int N, int Cl, int OC, Comm& tp) {
  reduce_from_tp_backward(std::span<T>{}, tp);
  kernels::ops<D, T>::matmul_backward(ctx, dinp, dw, dbias, dout, inp, w, N, Cl, OC, false);
}

// ---------------------------------------------------------------------------------------------
// Vocab-parallel embedding and cross-entropy (the local pieces are kernels::ops members)
// ---------------------------------------------------------------------------------------------

/// VocabParallelEmbedding forward with the (replicated) position embedding:
///   out (B*Tn, C) = wte[tokens] + wpe[t]   written (=), identical on every tp rank
/// wte_local (Vp/tp, C) holds this rank's vocabulary rows (vocab_range::of(Vp, tp.size(),
/// tp.rank())); each rank writes its own rows (zero for tokens it does not own; rank 0 adds
/// wpe) and one all-reduce of B*Tn*C elements sums them (g forward). tokens in [0, Vp), validated
/// by the caller; wpe may be null. Cost: B*Tn*C adds + the all-reduce.
template <class D, class T, communicator_for<T> Comm>
void vocab_parallel_embedding_forward(context<D>& ctx, T* out, const std::int32_t* tokens, const T* wte_local,
                                      const T* wpe, int B, int Tn, int C, int vocab_padded, Comm& tp) {
  const auto r = vocab_range::of(vocab_padded, tp.size(), tp.rank());
  kernels::ops<D, T>::embedding_shard_forward(ctx, out, tokens, wte_local, tp.rank() == 0 ? wpe : nullptr, B, Tn, C,
                                              r.begin, r.rows);
  ctx.synchronize();
  reduce_from_tp_forward(std::span<T>(out, std::size_t(B) * Tn * C), tp);
}

/// VocabParallelEmbedding backward (no communication: dout is replicated, g backward is the
/// identity): dwte_local[token - begin] += dout for tokens this rank owns; dwpe += dout (every
/// rank, the same values: wpe is replicated). dwpe may be null. G as column_parallel_linear_backward.
template <class D, class T, class G, communicator_for<T> Comm>
void vocab_parallel_embedding_backward(context<D>& ctx, G* dwte_local, G* dwpe, const T* dout,
                                       const std::int32_t* tokens, int B, int Tn, int C, int vocab_padded, Comm& tp) {
  const auto r = vocab_range::of(vocab_padded, tp.size(), tp.rank());
  kernels::ops<D, T>::embedding_shard_backward(ctx, dwte_local, dwpe, dout, tokens, B, Tn, C, r.begin, r.rows);
}

/// Scratch elements vocab_parallel_crossentropy needs for N rows: 3N in the accumulator type.
constexpr std::size_t vocab_parallel_crossentropy_scratch(int N) noexcept { return 3 * std::size_t(N); }

/// Vocab-parallel fused softmax cross-entropy (Megatron's vocab_parallel_cross_entropy): equal
/// to kernels::cpu::crossentropy_forward_backward on the gathered (N, Vp) logits, but no rank
/// ever holds more than its (N, Vp/tp) slice.
///   logits_local (N, Vp/tp)  this rank's vocabulary columns; overwritten with this rank's slice
///                            of dlogits when write_dlogits (grad_scale * (softmax - onehot) over
///                            the real vocabulary [0, V), 0 on padding columns and ignored rows)
///   losses (N)               written (=), identical on every rank; 0 for ignored rows
///   targets (N)              global ids in [0, V) or kernels::ignore_index, same on every rank
///   scratch                  vocab_parallel_crossentropy_scratch(N) accumulator elements
/// Communication: one all-reduce(max) of N values (row maxima), one all-reduce(sum) of 2N
/// values (softmax denominators and target logits, the latter contributed by the owning rank).
/// Returns the sum of the losses (identical on every rank). Cost: ~4 N V/tp flops per rank.
template <class D, class T, communicator_for<T> Comm>
  requires communicator_for<Comm, typename kernels::ops<D, T>::acc>
typename kernels::ops<D, T>::acc vocab_parallel_crossentropy(context<D>& ctx, T* logits_local,
                                                             typename kernels::ops<D, T>::acc* losses,
                                                             const std::int32_t* targets,
                                                             typename kernels::ops<D, T>::acc* scratch, int N, int V,
                                                             int vocab_padded, bool write_dlogits,
                                                             typename kernels::ops<D, T>::acc grad_scale, Comm& tp) {
  using ops = kernels::ops<D, T>;
  using A = typename ops::acc;
  const auto r = vocab_range::of(vocab_padded, tp.size(), tp.rank());
  const int valid = std::clamp(V - r.begin, 0, r.rows);  // real (non-padding) columns of this shard
  A* row_max = scratch;
  A* stats = scratch + N;
  ops::vocab_shard_max(ctx, row_max, logits_local, targets, N, r.rows, valid);
  ctx.synchronize();
  tp.all_reduce(std::span<A>(row_max, std::size_t(N)), reduce_op::max);
  ops::vocab_shard_sums(ctx, stats, logits_local, row_max, targets, N, r.rows, valid, r.begin);
  ctx.synchronize();
  tp.all_reduce(std::span<A>(stats, 2 * std::size_t(N)), reduce_op::sum);
  return ops::vocab_shard_finish(ctx, logits_local, losses, row_max, stats, targets, N, r.rows, valid, r.begin,
                                 write_dlogits, grad_scale);
}

}  // namespace loom::parallel
