#pragma once
/// \file Causal multi-head self-attention on the NPU: aclnnFlashAttentionScore(Grad).
///
/// Layout: loom's qkv (B,T,3C) holds [q | k | v], head h at channels [h*HD, (h+1)*HD); with
/// grouped-query attention (kv_heads < NH) rows are [q: NH heads | k, v: kv_heads heads each] and
/// K/V are passed with kv_heads heads (the operator reads Nkv from their shape; headNum = NH; "Nq /
/// Nkv must be a non-zero integer", ops-transformer aclnnFlashAttentionScore.md). q, k and v
/// are copied out of it into contiguous scratch with aclnnInplaceCopy (strided read) and
/// passed as inputLayout "BSH" (H = NH*HD); the flash-attention docs list ND 3-D/4-D inputs but no
/// non-contiguous support, so loom does not pass strided views. The output (B,T,C) is written in
/// place — "BSH" is exactly loom's head-concatenated layout.
/// Causal mask: sparseMode 2 (leftUpCausal) with the compressed 2048x2048 BOOL mask, element (i,j)
/// = 1 (masked) iff j > i — "1 means masked" (reference §2.6, §7); built once per context on the
/// host, copied from pinned memory, cached in the context's constants. preTokens/nextTokens are
/// ignored in mode 2 (passed as 2147483647 / 0). scale = 1/sqrt(HD), keepProb = 1 (no dropout),
/// innerPrecise = 0, no pse, no padding mask, inputLayout a NUL-terminated non-const char*.
/// Saved state (kernel's `saved`, fp32): softmaxMax then softmaxSum, each [B, NH, T, 8] (the row
/// statistic replicated 8 times, as documented). The backward also needs the forward output
/// (attentionIn); when the caller does not pass it, one more forward call recomputes it. See
/// Note [attention output in backward] in docs/ascend.md.
/// Key padding (optional, (B,T) bytes, non-zero = padded key, as attention<cpu, T, fused>): the
/// compressed mask cannot express it, so a full [B,1,T,T] BOOL mask is built on the device
/// (causal block of the 2048 mask + padding row, aclnnInplaceCopy/aclnnInplaceAdd on UINT8 with an
/// INT64 alpha — aclnnAdd refuses a FLOAT alpha for integer operands, 161002 — then a copy to
/// BOOL: non-zero = masked) and passed with sparseMode 0 (pre/nextTokens unbounded) and
/// innerPrecise 2, the documented handling of rows with every key masked (their output is 0).

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/kernels/ascend/common.hpp>

namespace loom::kernels::ascend {

/// The compressed causal mask (2048 x 2048 bytes, 1 above the diagonal), cached in ctx.
inline const std::uint8_t* causal_mask(ctx_t& ctx) {
  constexpr std::size_t S = 2048;
  return static_cast<const std::uint8_t*>(
      ctx.constants->get("flash_attention/causal_2048", S * S, ctx.ordinal, ctx.stream, [&](void* p, std::size_t) {
        auto* host = static_cast<std::uint8_t*>(device::ascend::allocate_host(S * S));
        for (std::size_t i = 0; i < S; ++i)
          for (std::size_t j = 0; j < S; ++j) host[i * S + j] = j > i ? 1 : 0;
        try {
          device::ascend::copy_to_device(p, host, S * S, ctx.stream);
          ctx.synchronize();  // the pinned staging buffer must outlive the copy
        } catch (...) {
          device::ascend::deallocate_host(host);
          throw;
        }
        device::ascend::deallocate_host(host);
      }));
}

template <class T>
struct flash_attention {
  /// fp32 elements of saved state per layer: softmaxMax and softmaxSum, [B, NH, T, 8] each.
  static constexpr std::size_t saved_elems(std::size_t B, std::size_t NH, std::size_t Tn) { return 2 * B * NH * Tn * 8; }

  /// B sequences of Tn tokens, NH query heads of C / NH channels, KV key/value heads (KV = NH:
  /// multi-head; KV < NH: grouped-query attention, query head h reading key/value head
  /// h / (NH / KV), as the operator's (B, N2, G) axis order does).
  struct problem {
    int B, Tn, C, NH, KV;
    int64_t HD() const { return C / NH; }
    int64_t Ckv() const { return HD() * KV; }           ///< key (and value) width
    int64_t W() const { return C + 2 * Ckv(); }         ///< a qkv row: [q | k | v]
    std::size_t BT() const { return std::size_t(B) * Tn; }
    double scale() const { return 1.0 / std::sqrt(double(C / NH)); }
  };
  static problem make_problem(int B, int Tn, int C, int NH, int kv_heads) {
    const int KV = kv_heads > 0 ? kv_heads : NH;
    if (NH % KV != 0)
      throw input_error("loom::kernels::attention<ascend, T, fused>: " + std::to_string(KV) + " key/value heads do not "
                        "divide " + std::to_string(NH) + " query heads (aclnnFlashAttentionScore: Nq / Nkv must be an "
                        "integer)");
    return {B, Tn, C, NH, KV};
  }

  /// q (B,T,C), k and v (B,T,Ckv) contiguous copies of the three slices of qkv (B,T,W).
  static void split_qkv(ctx_t& ctx, T* q, T* k, T* v, const T* qkv, const problem& p) {
    constexpr auto dt = dtype_of<T>();
    const int64_t row = int64_t(p.Tn) * p.W();
    copy(ctx, tensor(ctx, q, dt, {p.B, p.Tn, p.C}), tensor(ctx, qkv, dt, {p.B, p.Tn, p.C}, {row, p.W(), 1}));
    copy(ctx, tensor(ctx, k, dt, {p.B, p.Tn, p.Ckv()}), tensor(ctx, qkv + p.C, dt, {p.B, p.Tn, p.Ckv()}, {row, p.W(), 1}));
    copy(ctx, tensor(ctx, v, dt, {p.B, p.Tn, p.Ckv()}),
         tensor(ctx, qkv + p.C + p.Ckv(), dt, {p.B, p.Tn, p.Ckv()}, {row, p.W(), 1}));
  }

  /// The attention mask and its mode: the cached compressed causal mask (sparseMode 2), or, with
  /// key padding, a [B,1,T,T] BOOL mask built in `storage` (B*T*T*2 bytes) (sparseMode 0).
  struct mask_args {
    const void* data;
    std::vector<int64_t> dims;
    int64_t sparse_mode, pre_tokens, next_tokens, inner_precise;
  };
  static mask_args make_mask(ctx_t& ctx, const std::uint8_t* key_padding, std::uint8_t* storage, const problem& p) {
    const std::uint8_t* causal = causal_mask(ctx);
    if (!key_padding) return {causal, {2048, 2048}, 2, 2147483647, 0, 0};
    if (p.Tn > 2048)
      throw input_error("loom::kernels::attention<ascend, T, fused>: key padding supports T <= 2048 (the causal block "
                        "is cut from the compressed 2048x2048 mask); got T = " + std::to_string(p.Tn));
    const int64_t B = p.B, Tn = p.Tn;
    std::uint8_t* sum = storage;                              // (B,T,T) UINT8: causal + padding
    std::uint8_t* mask = storage + std::size_t(B * Tn * Tn);  // (B,1,T,T) BOOL
    tensor s(ctx, sum, acl::dt_uint8, {B, Tn, Tn});
    copy(ctx, s, tensor(ctx, causal, acl::dt_uint8, {Tn, Tn}, {2048, 1}));  // broadcast over the batch
    // padding row, broadcast over queries; an integer alpha (docs/ascend.md §4a: UINT8 + UINT8 with a
    // FLOAT alpha is 161002 on the NPU)
    add_inplace(ctx, s, tensor(ctx, key_padding, acl::dt_uint8, {B, 1, Tn}), std::int64_t(1));
    copy(ctx, tensor(ctx, mask, acl::dt_bool, {B, 1, Tn, Tn}), tensor(ctx, sum, acl::dt_uint8, {B, 1, Tn, Tn}));
    return {mask, {B, 1, Tn, Tn}, 0, 2147483647, 2147483647, 2};
  }

  /// out (B,T,C) =; stats: softmaxMax then softmaxSum (fp32, [B,NH,T,8] each) =; q,k,v contiguous.
  static void run_forward(ctx_t& ctx, T* out, float* stats, const T* q, const T* k, const T* v, const problem& p,
                          const mask_args& m) {
    constexpr auto dt = dtype_of<T>();
    const std::size_t per = std::size_t(p.B) * p.NH * p.Tn * 8;
    tensor Q(ctx, q, dt, {p.B, p.Tn, p.C}), K(ctx, k, dt, {p.B, p.Tn, p.Ckv()}), V(ctx, v, dt, {p.B, p.Tn, p.Ckv()});
    tensor O(ctx, out, dt, {p.B, p.Tn, p.C}), M(ctx, m.data, acl::dt_bool, m.dims, {});
    tensor mx(ctx, stats, acl::dt_float, {p.B, p.NH, p.Tn, 8}), sm(ctx, stats + per, acl::dt_float, {p.B, p.NH, p.Tn, 8});
    char layout[] = "BSH";
    launch(ctx, "aclnnFlashAttentionScore", ctx.api().aclnnFlashAttentionScoreGetWorkspaceSize, ctx.api().aclnnFlashAttentionScore, Q, K, V, nullptr, nullptr, nullptr, M, nullptr, p.scale(), /*keepProb=*/1.0, m.pre_tokens, m.next_tokens, p.NH, layout, m.inner_precise, m.sparse_mode, mx, sm, nullptr, O);
  }

  static std::size_t mask_bytes(const problem& p, const std::uint8_t* key_padding) {
    return key_padding ? 2 * std::size_t(p.B) * p.Tn * p.Tn : 0;
  }

  /// out (B,T,C) = attention(qkv); saved (saved_elems) = softmax statistics. qkv (B,T,W) with
  /// kv_heads key/value heads (0 = NH).
  static void forward(ctx_t& ctx, T* out, float* saved, const T* qkv, int B, int Tn, int C, int NH,
                      const std::uint8_t* key_padding = nullptr, int kv_heads = 0) {
    const problem p = make_problem(B, Tn, C, NH, kv_heads);
    scratch<T> qkvc(ctx, p.BT() * std::size_t(p.W()));
    scratch<std::uint8_t> mask_storage(ctx, mask_bytes(p, key_padding));
    const mask_args m = make_mask(ctx, key_padding, mask_storage.data(), p);
    T* q = qkvc.data();
    T* k = q + p.BT() * std::size_t(C);
    T* v = k + p.BT() * std::size_t(p.Ckv());
    split_qkv(ctx, q, k, v, qkv, p);
    run_forward(ctx, out, saved, q, k, v, p, m);
  }

  /// dqkv (B,T,W) =; dout (B,T,C); out = the forward output (B,T,C), or null to recompute it.
  static void backward(ctx_t& ctx, T* dqkv, const T* dout, const T* qkv, const T* out, const float* saved, int B,
                       int Tn, int C, int NH, const std::uint8_t* key_padding = nullptr, int kv_heads = 0) {
    constexpr auto dt = dtype_of<T>();
    const problem p = make_problem(B, Tn, C, NH, kv_heads);
    const std::size_t BTW = p.BT() * std::size_t(p.W()), BTC = p.BT() * std::size_t(C), per = std::size_t(B) * NH * Tn * 8;
    const int64_t Ckv = p.Ckv();
    scratch<T> work(ctx, 2 * BTW + (out ? 0 : BTC));  // q, k, v | dq, dk, dv | the recomputed output
    scratch<std::uint8_t> mask_storage(ctx, mask_bytes(p, key_padding));
    const mask_args m = make_mask(ctx, key_padding, mask_storage.data(), p);
    T* q = work.data();
    T* k = q + BTC;
    T* v = k + p.BT() * std::size_t(Ckv);
    T* grads = q + BTW;  // dq (B,T,C), dk and dv (B,T,Ckv)
    split_qkv(ctx, q, k, v, qkv, p);
    scratch<float> stats(ctx, out ? 0 : 2 * per);
    if (!out) {
      run_forward(ctx, grads + BTW, stats.data(), q, k, v, p, m);
      out = grads + BTW;
    }
    tensor Q(ctx, q, dt, {B, Tn, C}), K(ctx, k, dt, {B, Tn, Ckv}), V(ctx, v, dt, {B, Tn, Ckv}), DY(ctx, dout, dt, {B, Tn, C});
    tensor O(ctx, out, dt, {B, Tn, C}), M(ctx, m.data, acl::dt_bool, m.dims, {});
    tensor mx(ctx, saved, acl::dt_float, {B, NH, Tn, 8}), sm(ctx, saved + per, acl::dt_float, {B, NH, Tn, 8});
    T* dk = grads + BTC;
    T* dv = dk + p.BT() * std::size_t(Ckv);
    tensor DQ(ctx, grads, dt, {B, Tn, C}), DK(ctx, dk, dt, {B, Tn, Ckv}), DV(ctx, dv, dt, {B, Tn, Ckv});
    char layout[] = "BSH";
    launch(ctx, "aclnnFlashAttentionScoreGrad", ctx.api().aclnnFlashAttentionScoreGradGetWorkspaceSize, ctx.api().aclnnFlashAttentionScoreGrad, Q, K, V, DY, nullptr, nullptr, nullptr, M, mx, sm, nullptr, O, nullptr, p.scale(), 1.0, m.pre_tokens, m.next_tokens, NH, layout, m.inner_precise, m.sparse_mode, DQ, DK, DV, nullptr);
    const int64_t row = int64_t(Tn) * p.W();
    copy(ctx, tensor(ctx, dqkv, dt, {B, Tn, C}, {row, p.W(), 1}), DQ);
    copy(ctx, tensor(ctx, dqkv + C, dt, {B, Tn, Ckv}, {row, p.W(), 1}), DK);
    copy(ctx, tensor(ctx, dqkv + C + Ckv, dt, {B, Tn, Ckv}, {row, p.W(), 1}), DV);
  }
};

}  // namespace loom::kernels::ascend
