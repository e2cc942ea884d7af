#pragma once
/// \file The local (per tensor-parallel rank) pieces of the vocab-parallel embedding and the
/// vocab-parallel softmax cross-entropy on the NPU — the aclnn counterparts of
/// kernels/cpu/vocab_parallel.hpp. The communication between the pieces is
/// parallel/tensor_parallel.hpp; nothing here communicates.
///
/// A rank owns the `rows` consecutive vocabulary entries [begin, begin + rows) of the padded
/// vocabulary (Megatron-LM's VocabParallelEmbedding / vocab_parallel_cross_entropy split).
///
/// Note [shard index]. Every piece needs, per token id, whether this rank owns it and its local
/// row. On the device, without a host round trip, in INT64 (the index type the operators below
/// document on Atlas A2/A3):
///   c  = clamp(id - begin, -1, rows) + 1         aclnnInplaceCopy (INT32 -> INT64), aclnnInplaceAdds
///                                                (INT64 scalar and alpha), aclnnClamp (INT64 bounds)
/// maps every id — including ignore_index -1 and ids of other ranks, on either side — to
/// c in [0, rows + 1], c in [1, rows] exactly for the ids this rank owns (local row c - 1). A
/// table of rows + 2 entries then turns c into what each piece needs, one aclnnEmbedding gather
/// (its weight may be INT64 or a float type; ops-nn aclnnEmbedding: weight "BFLOAT16, FLOAT,
/// FLOAT16, INT64, INT32, ...", indices "INT64, INT32"):
///   forward row   owned ? c - 1 : 0      a row of the shard to gather (masked afterwards)
///   backward row  owned ? c - 1 : rows   rows = the padding row of aclnnEmbeddingDenseBackward
///   class         owned ? c : 0          the target class in the shifted local vocabulary
///   owned         owned ? 1 : 0          (T or FLOAT) a multiplicative mask
/// The tables depend on `rows` only; they are built on the host once and cached in the context's
/// constants (kernels/ascend/common.hpp ones() does the same for its vectors of ones).
/// The "not ignored" mask of the loss is clamp(target, -1, 0) + 1 (0 for -1, 1 otherwise).
///
/// Which documented rules this meets: indices INT64 and inside the table (an index outside
/// [0, rows) faults aclnnEmbedding on the AI core); aclnnEmbeddingDenseBackward's out FLOAT
/// [numWeights, C] with paddingIdx < numWeights; aclnnClamp's INT64 bounds for an INT64 self (a
/// FLOAT bound does not cast, 161002); aclnnAmax's out of its self's dtype; aclnnReduceSum's dtype
/// equal to out's; aclnnCrossEntropyLossGrad's INT64 target in [0, C), N < 200,000 rows per call.
/// The emulation enforces each (tests/ascend/test_rules.cpp).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/kernels/ascend/common.hpp>
#include <loom/kernels/ascend/crossentropy.hpp>
#include <loom/kernels/ascend/encoder.hpp>

namespace loom::kernels::ascend {

/// The tables of Note [shard index].
enum class shard_table { forward_row, backward_row, target_class, owned };

/// The device table `kind` of rows + 2 entries of type X (Note [shard index]), cached in ctx.
template <class X>
const X* shard_lookup_table(ctx_t& ctx, shard_table kind, int rows) {
  const std::size_t n = std::size_t(rows) + 2;
  const std::string key = "vocab_shard/" + std::to_string(int(kind)) + "/" + std::to_string(int(dtype_of<X>())) + "/" +
                          std::to_string(rows);
  return static_cast<const X*>(ctx.constants->get(key, n * sizeof(X), ctx.ordinal, ctx.stream, [&](void* p, std::size_t) {
    std::vector<X> h(n);
    for (std::size_t c = 0; c < n; ++c) {
      const bool owned = c >= 1 && c <= std::size_t(rows);
      switch (kind) {
        case shard_table::forward_row: h[c] = X(owned ? double(c - 1) : 0.0); break;
        case shard_table::backward_row: h[c] = X(owned ? double(c - 1) : double(rows)); break;
        case shard_table::target_class: h[c] = X(owned ? double(c) : 0.0); break;
        case shard_table::owned: h[c] = X(owned ? 1.0 : 0.0); break;
      }
    }
    device::ascend::copy_to_device(p, h.data(), n * sizeof(X), ctx.stream);  // pageable: synchronous
  }));
}

/// c (n) INT64 = clamp(ids - begin, lo, hi) + 1 (Note [shard index] with lo = -1, hi = rows; the
/// "not ignored" mask with begin = 0, lo = -1, hi = 0). ids (n) int32 device memory.
inline void shard_index(ctx_t& ctx, std::int64_t* c, const std::int32_t* ids, int n, int begin, std::int64_t lo,
                        std::int64_t hi) {
  scratch<std::int64_t> shifted(ctx, std::size_t(n));
  tensor id32(ctx, ids, acl::dt_int32, {n}), s(ctx, shifted.data(), acl::dt_int64, {n}), out(ctx, c, acl::dt_int64, {n});
  copy(ctx, s, id32);
  const scalar one(ctx, std::int64_t(1)), minus_begin(ctx, std::int64_t(-begin)), low(ctx, lo), high(ctx, hi);
  if (begin != 0)
    launch(ctx, "aclnnInplaceAdds", ctx.api().aclnnInplaceAddsGetWorkspaceSize, ctx.api().aclnnInplaceAdds, s, minus_begin, one);
  launch(ctx, "aclnnClamp", ctx.api().aclnnClampGetWorkspaceSize, ctx.api().aclnnClamp, s, low, high, out);
  launch(ctx, "aclnnInplaceAdds", ctx.api().aclnnInplaceAddsGetWorkspaceSize, ctx.api().aclnnInplaceAdds, out, one, one);
}

/// out (n) = table[c] (aclnnEmbedding over a (entries, 1) table): c (n) INT64 in [0, entries).
template <class X>
void lookup(ctx_t& ctx, X* out, const X* table, int64_t entries, const std::int64_t* c, int n) {
  tensor w(ctx, table, dtype_of<X>(), {entries, 1}), idx(ctx, c, acl::dt_int64, {n}), o(ctx, out, dtype_of<X>(), {n, 1});
  launch(ctx, "aclnnEmbedding", ctx.api().aclnnEmbeddingGetWorkspaceSize, ctx.api().aclnnEmbedding, w, idx, o);
}

/// The (rows + 2)-entry table `kind` looked up at the shard index of ids: out (n).
template <class X>
void shard_lookup(ctx_t& ctx, X* out, shard_table kind, const std::int32_t* ids, int n, int begin, int rows) {
  scratch<std::int64_t> c(ctx, std::size_t(n));
  shard_index(ctx, c.data(), ids, n, begin, -1, rows);
  lookup(ctx, out, shard_lookup_table<X>(ctx, kind, rows), int64_t(rows) + 2, c.data(), n);
}

/// keep (n) FLOAT = 1 where targets[i] != ignore_index (-1), else 0: clamp(t, -1, 0) + 1, cast.
inline void not_ignored(ctx_t& ctx, float* keep, const std::int32_t* targets, int n) {
  scratch<std::int64_t> c(ctx, std::size_t(n));
  shard_index(ctx, c.data(), targets, n, 0, -1, 0);
  copy(ctx, tensor(ctx, keep, acl::dt_float, {n}), tensor(ctx, c.data(), acl::dt_int64, {n}));
}

/// out[n,:] = (owned(tokens[n]) ? wte_local[tokens[n]-begin,:] : 0) + (wpe ? wpe[n % Tn,:] : 0)
///   out (B*Tn, C) written (=); tokens (B,Tn) int32 in [0, Vp) (any value is safe: foreign ids give
///   zero rows); wte_local (rows, C); wpe (>= Tn, C) or null. Summed over ranks (wpe on one rank)
///   this is encoder_forward. aclnn: the shard index (Note [shard index]), two aclnnEmbedding
///   gathers (row and mask), aclnnEmbedding of the rows, aclnnInplaceMul by the (N,1) mask
///   (broadcast), aclnnInplaceAdd of wpe (broadcast over the batch). Scratch: 3 N int64 + N T.
template <class T>
void embedding_shard_forward(ctx_t& ctx, T* out, const std::int32_t* tokens, const T* wte_local, const T* wpe, int B,
                             int Tn, int C, int begin, int rows) {
  constexpr auto dt = dtype_of<T>();
  const int N = B * Tn;
  scratch<std::int64_t> row(ctx, std::size_t(N));
  scratch<T> mask(ctx, std::size_t(N));
  {
    scratch<std::int64_t> c(ctx, std::size_t(N));
    shard_index(ctx, c.data(), tokens, N, begin, -1, rows);
    lookup(ctx, row.data(), shard_lookup_table<std::int64_t>(ctx, shard_table::forward_row, rows), int64_t(rows) + 2,
           c.data(), N);
    lookup(ctx, mask.data(), shard_lookup_table<T>(ctx, shard_table::owned, rows), int64_t(rows) + 2, c.data(), N);
  }
  tensor w(ctx, wte_local, dt, {rows, C}), idx(ctx, row.data(), acl::dt_int64, {N}), o(ctx, out, dt, {N, C});
  launch(ctx, "aclnnEmbedding", ctx.api().aclnnEmbeddingGetWorkspaceSize, ctx.api().aclnnEmbedding, w, idx, o);
  launch(ctx, "aclnnInplaceMul", ctx.api().aclnnInplaceMulGetWorkspaceSize, ctx.api().aclnnInplaceMul, o,
         tensor(ctx, mask.data(), dt, {N, 1}));
  if (wpe) add_inplace(ctx, tensor(ctx, out, dt, {B, Tn, C}), tensor(ctx, wpe, dt, {Tn, C}));
}

/// dwte_local[tokens[n]-begin,:] += dout[n,:] for the tokens this rank owns; dwpe[n % Tn,:] +=
/// dout[n,:] when dwpe is not null. dwte_local (rows, C) +=, dwpe (>= Tn, C) +=, dout (B*Tn, C);
/// G the parameter-gradient type (kernels::gradient_t). aclnn: the backward-row table maps foreign
/// ids to row `rows`, which aclnnEmbeddingDenseBackward(numWeights = rows + 1, paddingIdx = rows)
/// leaves at zero; its FLOAT (rows + 1, C) output is added to dwte_local (accumulate()); the
/// position gradient as in encoder_backward. Scratch: (rows + 1) C floats + 2 N int64.
template <class T, class G>
void embedding_shard_backward(ctx_t& ctx, G* dwte_local, G* dwpe, const T* dout, const std::int32_t* tokens, int B,
                              int Tn, int C, int begin, int rows) {
  constexpr auto dt = dtype_of<T>();
  const int N = B * Tn;
  if (dwpe) position_backward(ctx, dwpe, dout, B, Tn, C);
  scratch<std::int64_t> row(ctx, std::size_t(N));
  shard_lookup(ctx, row.data(), shard_table::backward_row, tokens, N, begin, rows);
  scratch<float> tmp(ctx, (std::size_t(rows) + 1) * std::size_t(C));
  tensor g(ctx, dout, dt, {N, C}), idx(ctx, row.data(), acl::dt_int64, {N}),
      o(ctx, tmp.data(), acl::dt_float, {int64_t(rows) + 1, int64_t(C)});
  launch(ctx, "aclnnEmbeddingDenseBackward", ctx.api().aclnnEmbeddingDenseBackwardGetWorkspaceSize,
         ctx.api().aclnnEmbeddingDenseBackward, g, idx, uint64_t(rows) + 1, uint64_t(rows), false, o);
  accumulate(ctx, dwte_local, tmp.data(), {int64_t(rows), int64_t(C)});
}

/// The (N, valid) real columns of a shard's logits (N, rows), widened to FLOAT: x (N, valid) =.
template <class T>
void real_columns_fp32(ctx_t& ctx, float* x, const T* logits, int N, int rows, int valid) {
  copy(ctx, tensor(ctx, x, acl::dt_float, {N, valid}), tensor(ctx, logits, dtype_of<T>(), {N, valid}, {rows, 1}));
}

/// Step 1 of the vocab-parallel cross-entropy: row_max[n] = max of logits_local[n, :valid] (=;
/// -inf when the shard has no real column). logits_local (N, rows) T; valid = real_columns(V,
/// begin, rows). aclnnAmax over dim 1 of the strided (N, valid) view (its out has self's dtype:
/// T scratch, then widened). Differs from the CPU piece: an ignored row gets its real maximum, not
/// 0 (the finish masks ignored rows; any finite stabiliser is exact).
template <class T>
void vocab_shard_max(ctx_t& ctx, float* row_max, const T* logits, int N, int rows, int valid) {
  if (valid == 0) {
    fill(ctx, row_max, std::size_t(N), -std::numeric_limits<float>::infinity());
    return;
  }
  constexpr auto dt = dtype_of<T>();
  const int_array dim(ctx, {1});
  const tensor x(ctx, logits, dt, {N, valid}, {rows, 1});
  if constexpr (std::is_same_v<T, float>) {
    launch(ctx, "aclnnAmax", ctx.api().aclnnAmaxGetWorkspaceSize, ctx.api().aclnnAmax, x, dim, false,
           tensor(ctx, row_max, dt, {N}));
  } else {
    scratch<T> m(ctx, std::size_t(N));
    const tensor mt(ctx, m.data(), dt, {N});
    launch(ctx, "aclnnAmax", ctx.api().aclnnAmaxGetWorkspaceSize, ctx.api().aclnnAmax, x, dim, false, mt);
    copy(ctx, tensor(ctx, row_max, acl::dt_float, {N}), mt);
  }
}

/// Step 2: with the global row maxima m, stats[n] = sum over the real local columns of
/// exp(logit - m[n]) and stats[N+n] = the target's logit when this shard owns the target, else 0
/// (both =). Summed over ranks: the softmax denominator and the target logit. logits (N, rows) T,
/// targets (N) int32 global ids or -1. aclnn: the real columns widened to FLOAT (aclnnInplaceCopy),
/// aclnnInplaceAdd of -m (broadcast), aclnnInplaceExp, aclnnReduceSum over dim 1 (dtype FLOAT);
/// the target logit gathered by aclnnEmbedding from the logits viewed as (N*rows, 1) at n*rows +
/// forward row, times the owned mask (aclnnInplaceMul). Scratch: N valid floats + 3 N int64 + N T.
template <class T>
void vocab_shard_sums(ctx_t& ctx, float* stats, const T* logits, const float* row_max, const std::int32_t* targets,
                      int N, int rows, int valid, int begin) {
  if (valid == 0) {  // no real column, and so no target (targets < V <= begin)
    device::ascend::memset(stats, 0, 2 * std::size_t(N) * sizeof(float), ctx.stream);
    return;
  }
  constexpr auto dt = dtype_of<T>();
  {
    scratch<float> x(ctx, std::size_t(N) * std::size_t(valid));
    real_columns_fp32(ctx, x.data(), logits, N, rows, valid);
    const tensor xt(ctx, x.data(), acl::dt_float, {N, valid});
    add_inplace(ctx, xt, tensor(ctx, row_max, acl::dt_float, {N, 1}), -1.0f);
    launch(ctx, "aclnnInplaceExp", ctx.api().aclnnInplaceExpGetWorkspaceSize, ctx.api().aclnnInplaceExp, xt);
    const int_array dim(ctx, {1});
    launch(ctx, "aclnnReduceSum", ctx.api().aclnnReduceSumGetWorkspaceSize, ctx.api().aclnnReduceSum, xt, dim, false,
           acl::dt_float, tensor(ctx, stats, acl::dt_float, {N}));
  }
  // target logit: logits.flat[n*rows + row(target)], masked to this shard's targets
  scratch<std::int64_t> c(ctx, std::size_t(N)), flat(ctx, std::size_t(N));
  shard_index(ctx, c.data(), targets, N, begin, -1, rows);
  lookup(ctx, flat.data(), shard_lookup_table<std::int64_t>(ctx, shard_table::forward_row, rows), int64_t(rows) + 2,
         c.data(), N);
  const auto* offsets = static_cast<const std::int64_t*>(ctx.constants->get(
      "vocab_shard/row_offsets/" + std::to_string(N) + "/" + std::to_string(rows), std::size_t(N) * sizeof(std::int64_t),
      ctx.ordinal, ctx.stream, [&](void* p, std::size_t) {
        std::vector<std::int64_t> h(static_cast<std::size_t>(N));
        for (int n = 0; n < N; ++n) h[std::size_t(n)] = std::int64_t(n) * rows;
        device::ascend::copy_to_device(p, h.data(), h.size() * sizeof(std::int64_t), ctx.stream);
      }));
  const tensor ft(ctx, flat.data(), acl::dt_int64, {N});
  add_inplace(ctx, ft, tensor(ctx, offsets, acl::dt_int64, {N}), std::int64_t(1));
  scratch<T> picked(ctx, std::size_t(N));
  tensor w(ctx, logits, dt, {int64_t(N) * rows, 1}), pk(ctx, picked.data(), dt, {N, 1});
  launch(ctx, "aclnnEmbedding", ctx.api().aclnnEmbeddingGetWorkspaceSize, ctx.api().aclnnEmbedding, w, ft, pk);
  float* target_logit = stats + N;
  const tensor tl(ctx, target_logit, acl::dt_float, {N});
  copy(ctx, tl, tensor(ctx, picked.data(), dt, {N}));
  scratch<float> owned(ctx, std::size_t(N));
  lookup(ctx, owned.data(), shard_lookup_table<float>(ctx, shard_table::owned, rows), int64_t(rows) + 2, c.data(), N);
  launch(ctx, "aclnnInplaceMul", ctx.api().aclnnInplaceMulGetWorkspaceSize, ctx.api().aclnnInplaceMul, tl,
         tensor(ctx, owned.data(), acl::dt_float, {N}));
}

/// Step 3: with the global statistics (stats summed over ranks; m = row_max, S = stats[:N], x_t =
/// stats[N:]), writes losses[n] = (m + log S - x_t) * [target != -1] (=), and, when write_dlogits,
/// overwrites logits_local (N, rows) with grad_scale * (softmax - onehot(target)) on the real
/// columns, 0 on padding columns and ignored rows. Returns the sum of the losses, read back
/// (synchronizes the stream) and added in double in row order: the same on every tp rank.
/// aclnn: lse = m + log S (aclnnInplaceCopy, aclnnInplaceLog, aclnnInplaceAdd), losses by aclnnAdd
/// (alpha -1) and aclnnInplaceMul with the not-ignored mask; dlogits by aclnnCrossEntropyLossGrad
/// on the shifted local vocabulary (Note [shifted vocabulary] in crossentropy.hpp): logProb
/// (N, valid+1) FLOAT = [pad | x - lse], i.e. the global log-probabilities of this shard's columns,
/// target = the class table (owned ? local + 1 : 0, the pad class for foreign and ignored rows,
/// whose one-hot lands in the discarded column 0), gradLoss = grad_scale * not-ignored,
/// reduction "none", ignoreIndex -100 (no target takes it): the documented result gradLoss *
/// (exp(logProb) - onehot) is the slice of the global gradient. Row blocks of < 200,000 rows.
/// Differs from the CPU piece (kernels/cpu/vocab_parallel.hpp): no log1p form for a target that
/// is the row maximum, so a loss near 0 keeps an absolute, not relative, fp32 error (as the
/// single-rank aclnnCrossEntropyLoss path). Scratch: 2 N (valid+1) + 4 N floats + 3 N int64.
template <class T>
float vocab_shard_finish(ctx_t& ctx, T* logits, float* losses, const float* row_max, const float* stats,
                         const std::int32_t* targets, int N, int rows, int valid, int begin, bool write_dlogits,
                         float grad_scale) {
  constexpr auto dt = dtype_of<T>();
  scratch<float> lse(ctx, std::size_t(N)), keep(ctx, std::size_t(N));
  const tensor lt(ctx, lse.data(), acl::dt_float, {N}), kt(ctx, keep.data(), acl::dt_float, {N});
  copy(ctx, lt, tensor(ctx, stats, acl::dt_float, {N}));
  launch(ctx, "aclnnInplaceLog", ctx.api().aclnnInplaceLogGetWorkspaceSize, ctx.api().aclnnInplaceLog, lt);
  add_inplace(ctx, lt, tensor(ctx, row_max, acl::dt_float, {N}));
  not_ignored(ctx, keep.data(), targets, N);
  {
    const tensor loss(ctx, losses, acl::dt_float, {N});
    const scalar minus_one(ctx, -1.0f);
    launch(ctx, "aclnnAdd", ctx.api().aclnnAddGetWorkspaceSize, ctx.api().aclnnAdd, lt,
           tensor(ctx, stats + N, acl::dt_float, {N}), minus_one, loss);
    launch(ctx, "aclnnInplaceMul", ctx.api().aclnnInplaceMulGetWorkspaceSize, ctx.api().aclnnInplaceMul, loss, kt);
  }
  if (write_dlogits) {
    if (valid > 0) {
      const int64_t Cs = int64_t(valid) + 1;  // the shifted local vocabulary
      const int block_max = std::min(N, crossentropy_max_rows);
      scratch<float> lp(ctx, std::size_t(block_max) * std::size_t(Cs)), dlp(ctx, std::size_t(block_max) * std::size_t(Cs));
      scratch<std::int64_t> cls(ctx, std::size_t(N));
      shard_lookup(ctx, cls.data(), shard_table::target_class, targets, N, begin, rows);
      const scalar gs(ctx, grad_scale);
      launch(ctx, "aclnnInplaceMuls", ctx.api().aclnnInplaceMulsGetWorkspaceSize, ctx.api().aclnnInplaceMuls, kt, gs);
      char none[] = "none";
      constexpr int64_t no_ignore_index = -100;  // no class of the shifted vocabulary is negative
      for (int r0 = 0; r0 < N; r0 += block_max) {
        const int n = std::min(block_max, N - r0);
        fill(ctx, lp.data(), std::size_t(n) * std::size_t(Cs), crossentropy_pad_logit);
        const tensor real(ctx, lp.data() + 1, acl::dt_float, {n, valid}, {Cs, 1});
        copy(ctx, real, tensor(ctx, logits + std::size_t(r0) * rows, dt, {n, valid}, {rows, 1}));
        add_inplace(ctx, real, tensor(ctx, lse.data() + r0, acl::dt_float, {n, 1}), -1.0f);
        const tensor lpt(ctx, lp.data(), acl::dt_float, {n, Cs}), out(ctx, dlp.data(), acl::dt_float, {n, Cs});
        launch(ctx, "aclnnCrossEntropyLossGrad", ctx.api().aclnnCrossEntropyLossGradGetWorkspaceSize,
               ctx.api().aclnnCrossEntropyLossGrad, tensor(ctx, keep.data() + r0, acl::dt_float, {n}), lpt,
               tensor(ctx, cls.data() + r0, acl::dt_int64, {n}), nullptr, nullptr, nullptr, none, no_ignore_index, 0.0,
               0.0, out);
        T* lg = logits + std::size_t(r0) * rows;
        device::ascend::memset(lg, 0, std::size_t(n) * std::size_t(rows) * sizeof(T), ctx.stream);
        copy(ctx, tensor(ctx, lg, dt, {n, valid}, {rows, 1}),
             tensor(ctx, dlp.data() + 1, acl::dt_float, {n, valid}, {Cs, 1}));
      }
    } else {
      device::ascend::memset(logits, 0, std::size_t(N) * std::size_t(rows) * sizeof(T), ctx.stream);
    }
  }
  const auto host = to_host(ctx, static_cast<const float*>(losses), std::size_t(N));
  double total = 0;
  for (float l : host) total += l;
  return float(total);
}

}  // namespace loom::kernels::ascend
