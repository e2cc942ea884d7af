#pragma once
/// \file Token + position embedding on the NPU: aclnnEmbedding / aclnnEmbeddingDenseBackward, plus
/// a broadcast aclnnInplaceAdd (positions) and a GEMV against ones (position-gradient reduction).
///
/// Note [embedding rows]: aclnn needs the table's row count (the weight descriptor in forward,
/// numWeights in backward), and loom's op interface (kernels::ops, shared with the CPU) carries
/// none. The table's extent is taken from the caching allocator: the rows from `table` to the end
/// of the pool block that holds it. For a standalone table that is its exact size; inside the
/// model's flat parameter/gradient buffer it also covers the tensors after it, which is harmless —
/// token ids are validated at the data boundary, and the backward's extra rows are zero (adding
/// them is exact) — but costs an (rows x C) scratch and add. The *_rows overloads take the count.
/// paddingIdx: documented as "negative = none" while the parameter is uint64_t; loom passes
/// (uint64_t)-1 (cann-ops aclnnEmbeddingDenseBackward.md; reference §8 lists it as unconfirmed).

#include <string>
#include <type_traits>

#include <loom/kernels/ascend/common.hpp>

namespace loom::kernels::ascend {

/// Rows of C elements of T from `table` to the end of its pool block (Note [embedding rows]).
template <class T>
int64_t table_rows(const T* table, int C) {
  const std::size_t bytes = device::ascend::bytes_after(table);
  if (bytes < std::size_t(C) * sizeof(T))
    throw input_error("loom::kernels::ascend: the embedding table is not memory from loom's NPU pool (cannot bound "
                      "its rows); allocate it with loom::buffer<device::ascend, T> or pass the row count");
  return int64_t(bytes / (std::size_t(C) * sizeof(T)));
}

/// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]; out (B,T,C) =; wte (V,C); wpe (>= T, C), or null
/// (no learned positions: the token rows alone, as rotary models have);
/// tokens (B,T) int32 in [0, V) (an id outside faults the kernel: device_error at the next sync).
template <class T>
void encoder_forward_rows(ctx_t& ctx, T* out, const std::int32_t* tokens, const T* wte, const T* wpe, int B, int Tn,
                          int C, int64_t V) {
  constexpr auto dt = dtype_of<T>();
  tensor w(ctx, wte, dt, {V, int64_t(C)}), idx(ctx, tokens, acl::dt_int32, {B, Tn}), o(ctx, out, dt, {B, Tn, C});
  launch(ctx, "aclnnEmbedding", ctx.api().aclnnEmbeddingGetWorkspaceSize, ctx.api().aclnnEmbedding, w, idx, o);
  if (wpe) add_inplace(ctx, o, tensor(ctx, wpe, dt, {Tn, C}));  // (T,C) broadcast over the batch
}

template <class T>
void encoder_forward(ctx_t& ctx, T* out, const std::int32_t* tokens, const T* wte, const T* wpe, int B, int Tn, int C) {
  encoder_forward_rows(ctx, out, tokens, wte, wpe, B, Tn, C, table_rows(wte, C));
}

/// dwpe[t,:] += sum_b dout[b,t,:] (aclnnInplaceAddmm: dwpe as (1, T*C) += ones(1,B) dout(B, T*C));
/// dwpe (>= T, C) +=, dout (B,T,C). G is the gradient type (kernels::gradient_t); when G != T the
/// sum is formed in T scratch (aclnnMatmul) and widened into G (accumulate()).
template <class T, class G = T>
void position_backward(ctx_t& ctx, G* dwpe, const T* dout, int B, int Tn, int C) {
  constexpr auto dt = dtype_of<T>();
  const int64_t TC = int64_t(Tn) * C;
  tensor e(ctx, ones<T>(ctx, std::size_t(B)), dt, {1, B}), d(ctx, dout, dt, {B, TC});
  if constexpr (std::is_same_v<G, T>) {
    tensor dp(ctx, dwpe, dt, {1, TC});
    scalar one(ctx, 1.0f);
    launch(ctx, "aclnnInplaceAddmm", ctx.api().aclnnInplaceAddmmGetWorkspaceSize, ctx.api().aclnnInplaceAddmm, dp, e, d, one, one, cube_math_type);
  } else {
    scratch<T> part(ctx, std::size_t(TC));
    tensor dp(ctx, part.data(), dt, {1, TC});
    launch(ctx, "aclnnMatmul", ctx.api().aclnnMatmulGetWorkspaceSize, ctx.api().aclnnMatmul, e, d, dp, cube_math_type);
    accumulate(ctx, dwpe, part.data(), {TC});
  }
}

/// dwte[tokens[b,t],:] += dout[b,t,:] (aclnnEmbeddingDenseBackward into fp32 scratch, then added);
/// dwpe[t,:] += sum_b dout[b,t,:] (position_backward; skipped when dwpe is null).
/// dwte (V,C) +=, dwpe (>= T, C) += or null, dout (B,T,C). G is the gradient type (kernels::gradient_t);
/// when G != T both sums are formed in T scratch and widened into G (accumulate()).
template <class T, class G = T>
void encoder_backward_rows(ctx_t& ctx, G* dwte, G* dwpe, const T* dout, const std::int32_t* tokens, int B, int Tn,
                           int C, int64_t V) {
  constexpr auto dt = dtype_of<T>();
  if (dwpe) position_backward(ctx, dwpe, dout, B, Tn, C);
  // out is float32 whatever grad's type: the CANN 8.1.RC1 header documents "数据类型支持float32类型"
  // for it (aclnnop/aclnn_embedding_dense_backward.h; 9.0 also accepts grad's types).
  scratch<float> tmp(ctx, std::size_t(V) * std::size_t(C));
  tensor g(ctx, dout, dt, {int64_t(B) * Tn, C}), idx(ctx, tokens, acl::dt_int32, {int64_t(B) * Tn}),
      o(ctx, tmp.data(), acl::dt_float, {V, int64_t(C)});
  const uint64_t no_padding = ~uint64_t(0);
  launch(ctx, "aclnnEmbeddingDenseBackward", ctx.api().aclnnEmbeddingDenseBackwardGetWorkspaceSize, ctx.api().aclnnEmbeddingDenseBackward, g, idx, uint64_t(V), no_padding, false, o);
  accumulate(ctx, dwte, tmp.data(), {V, int64_t(C)});
}

template <class T, class G = T>
void encoder_backward(ctx_t& ctx, G* dwte, G* dwpe, const T* dout, const std::int32_t* tokens, int B, int Tn, int C) {
  encoder_backward_rows(ctx, dwte, dwpe, dout, tokens, B, Tn, C, table_rows(dwte, C));
}

}  // namespace loom::kernels::ascend
