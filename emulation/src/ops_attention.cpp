// loom's HOST EMULATION of aclnnFlashAttentionScore / aclnnFlashAttentionScoreGrad — NOT the vendor
// library. Semantics from loom's API reference §2.6 (ops-transformer documentation):
//   out = Softmax(Mask(scale * Q K^T)) V per (batch, query head), GQA when Nq is a multiple of Nkv;
//   attenMask: 1 = masked out; sparseMode 0 = the given mask (+ preTokens/nextTokens band),
//   2 = leftUpCausal and 3 = rightDownCausal, both with the compressed 2048x2048 upper-triangular
//   mask (checked element by element here); softmaxMax/softmaxSum: FP32 [B, N, Sq, 8], the row
//   statistic replicated 8 times; backward recomputes the probabilities from them and uses the
//   forward output (attentionIn) for the rowsum(dO * O) term, as flash-attention backward does.
// Not emulated (rejected with 161002): pse shift, dropout (keepProb < 1), prefix/band sparse modes
// 4-8, layouts other than BSH, SBH, BSND, BNSD.
#include <aclnnop/aclnn_flash_attention_score.h>
#include <aclnnop/aclnn_flash_attention_score_grad.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>

#include "internal.hpp"

using namespace loomemu;

namespace {

using dims_t = std::vector<int64_t>;

struct geometry {
  std::string layout;
  int64_t B = 0, Nq = 0, Nkv = 0, Sq = 0, Skv = 0, D = 0;
};

/// Linear index of element (b, n, s, d) in a gathered tensor of `layout` with N heads, S rows.
int64_t at(const std::string& layout, int64_t B, int64_t N, int64_t S, int64_t D, int64_t b, int64_t n, int64_t s,
           int64_t d) {
  if (layout == "BNSD") return ((b * N + n) * S + s) * D + d;
  if (layout == "SBH") return ((s * B + b) * N + n) * D + d;
  return ((b * S + s) * N + n) * D + d;  // BSH, BSND
}

/// (B, S, N*D or N, D) of a q/k/v tensor; "" or the reason it does not fit the layout.
std::string shape_of(const std::string& layout, const aclTensor& t, int64_t heads, int64_t* B, int64_t* S, int64_t* H) {
  const auto& d = t.dims;
  if (layout == "BSH" || layout == "SBH") {
    if (d.size() != 3) return "layout " + layout + " needs 3-D tensors";
    *B = layout == "BSH" ? d[0] : d[1];
    *S = layout == "BSH" ? d[1] : d[0];
    *H = d[2];
    return "";
  }
  if (layout == "BSND" || layout == "BNSD") {
    if (d.size() != 4) return "layout " + layout + " needs 4-D tensors";
    *B = d[0];
    *S = layout == "BSND" ? d[1] : d[2];
    const int64_t n = layout == "BSND" ? d[2] : d[1];
    if (heads > 0 && n != heads) return "head count in the tensor differs from headNum";
    *H = n * d[3];
    return "";
  }
  return "inputLayout \"" + layout + "\" is not one of BSH, SBH, BSND, BNSD";
}

std::string check_common(const aclTensor* q, const aclTensor* k, const aclTensor* v, const aclTensor* mask,
                         double keepProb, int64_t headNum, const char* inputLayout, int64_t innerPrecise,
                         int64_t sparseMode, geometry* g) {
  if (!inputLayout) return "inputLayout is NULL";
  g->layout = inputLayout;
  if (q->dtype != k->dtype || q->dtype != v->dtype ||
      (q->dtype != ACL_FLOAT16 && q->dtype != ACL_BF16 && q->dtype != ACL_FLOAT))
    return "query/key/value must share FLOAT16, BFLOAT16 or FLOAT";
  if (headNum <= 0) return "headNum must be positive";
  int64_t Hq = 0, Hk = 0, Hv = 0, Bk = 0, Bv = 0, Sv = 0;
  if (auto why = shape_of(g->layout, *q, headNum, &g->B, &g->Sq, &Hq); !why.empty()) return why;
  if (auto why = shape_of(g->layout, *k, -1, &Bk, &g->Skv, &Hk); !why.empty()) return why;
  if (auto why = shape_of(g->layout, *v, -1, &Bv, &Sv, &Hv); !why.empty()) return why;
  if (Hq % headNum) return "query hidden size " + std::to_string(Hq) + " is not a multiple of headNum";
  g->Nq = headNum;
  g->D = Hq / headNum;
  if (Bk != g->B || Bv != g->B || Sv != g->Skv) return "batch or key/value sequence lengths differ";
  if (Hk != Hv) return "emulation requires D_k == D_v";
  if (Hk % g->D) return "key hidden size is not a multiple of the head dim";
  g->Nkv = Hk / g->D;
  if (g->Nkv < 1 || g->Nq % g->Nkv) return "Nq / Nkv must be a positive integer (GQA/MQA)";
  // aclnnFlashAttentionScore.md (ops-transformer v9.0.0) constraints: "Nq取值范围1~256", "D：取值范围为1~768"
  if (g->Nq > 256) return "headNum " + std::to_string(g->Nq) + " is outside the documented range 1..256";
  if (g->D < 1 || g->D > 768) return "head dim " + std::to_string(g->D) + " is outside the documented range 1..768";
  if (keepProb != 1.0) return "dropout (keepProb < 1) is not emulated";
  if (innerPrecise < 0 || innerPrecise > 2) return "innerPrecise must be 0, 1 or 2";
  if (sparseMode == 2 || sparseMode == 3) {
    if (!mask) return "sparseMode 2/3 needs the compressed 2048x2048 attenMask";
    if (mask->dims != dims_t{2048, 2048} || mask->strides != dims_t{2048, 1} ||
        (mask->dtype != ACL_BOOL && mask->dtype != ACL_UINT8))
      return "sparseMode 2/3: attenMask must be a contiguous 2048x2048 BOOL/UINT8 matrix, got " + shape_string(*mask);
  } else if (sparseMode == 0) {
    if (mask) {
      const auto& d = mask->dims;
      const bool ok2 = d == dims_t{g->Sq, g->Skv};
      const bool ok4 = d.size() == 4 && (d[0] == 1 || d[0] == g->B) && (d[1] == 1 || d[1] == g->Nq) && d[2] == g->Sq &&
                       d[3] == g->Skv;
      if (!ok2 && !ok4) return "sparseMode 0: attenMask must be [S,S], [1,1,S,S], [B,1,S,S] or [B,N,S,S]";
      if (mask->dtype != ACL_BOOL && mask->dtype != ACL_UINT8) return "attenMask must be BOOL or UINT8";
    }
  } else {
    return "sparseMode " + std::to_string(sparseMode) + " is not emulated (0, 2, 3 are)";
  }
  return "";
}

std::string check_stats(const aclTensor* t, const geometry& g, const char* what) {
  if (!t) return std::string(what) + " is NULL";
  if (t->dtype != ACL_FLOAT || t->dims != dims_t{g.B, g.Nq, g.Sq, 8})
    return std::string(what) + " must be FLOAT [B, N, Sq, 8] = " +
           "[" + std::to_string(g.B) + "," + std::to_string(g.Nq) + "," + std::to_string(g.Sq) + ",8], got " +
           shape_string(*t);
  return "";
}

/// masked(b, n, i, j) for the configured mode; the compressed mask is verified once per call.
struct mask_fn {
  int64_t mode = 0, pre = 0, next = 0, Sq = 0, Skv = 0, B = 1, N = 1;
  bool has = false;
  std::vector<double> m;  // sparseMode 0 only
  dims_t dims;
  bool operator()(int64_t b, int64_t n, int64_t i, int64_t j) const {
    if (mode == 2) return j > i;
    if (mode == 3) return j > i + (Skv - Sq);
    if (!has) return false;
    if (j - i > next || i - j > pre) return true;
    if (dims.size() == 2) return m[std::size_t(i * Skv + j)] != 0;
    const int64_t bb = dims[0] == 1 ? 0 : b, nn = dims[1] == 1 ? 0 : n;
    return m[std::size_t(((bb * dims[1] + nn) * Sq + i) * Skv + j)] != 0;
  }
};

mask_fn build_mask(const aclTensor& M, bool has, const geometry& g, int64_t mode, int64_t pre, int64_t next) {
  mask_fn f;
  f.mode = mode;
  f.pre = pre;
  f.next = next;
  f.Sq = g.Sq;
  f.Skv = g.Skv;
  f.has = has;
  if ((mode == 2 || mode == 3)) {
    const auto* bytes = static_cast<const unsigned char*>(M.data) + M.offset;
    for (int64_t i = 0; i < 2048; ++i)
      for (int64_t j = 0; j < 2048; ++j)
        if ((bytes[i * 2048 + j] != 0) != (j > i))
          throw task_error{ACL_ERROR_RT_AICORE_EXCEPTION,
                           "sparseMode 2/3: attenMask is not the compressed causal mask (element (" + std::to_string(i) +
                               "," + std::to_string(j) + ") must be " + (j > i ? "1 = masked" : "0 = kept") + ")"};
  } else if (has) {
    f.m = gather(M);
    f.dims = M.dims;
  }
  return f;
}

}  // namespace

extern "C" aclnnStatus aclnnFlashAttentionScoreGetWorkspaceSize(
    const aclTensor* query, const aclTensor* key, const aclTensor* value, const aclTensor* realShiftOptional,
    const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional, const aclTensor* attenMaskOptional,
    const aclIntArray* prefixOptional, double scaleValue, double keepProb, int64_t preTokens, int64_t nextTokens,
    int64_t headNum, char* inputLayout, int64_t innerPrecise, int64_t sparseMode, const aclTensor* softmaxMaxOut,
    const aclTensor* softmaxSumOut, const aclTensor* softmaxOutOut, const aclTensor* attentionOutOut, uint64_t* ws,
    aclOpExecutor** ex) {
  constexpr const char* name = "aclnnFlashAttentionScore";
  if (int c = injected("aclnnFlashAttentionScoreGetWorkspaceSize")) return c;
  if (!query || !key || !value || !attentionOutOut || !softmaxMaxOut || !softmaxSumOut)
    return reject(name, param_nullptr, "query, key, value, softmaxMaxOut, softmaxSumOut and attentionOutOut are required");
  if (realShiftOptional || dropMaskOptional || paddingMaskOptional || softmaxOutOut || prefixOptional)
    return reject(name, param_invalid, "pse shift, dropout mask, padding mask, softmaxOut and prefix are not emulated "
                                       "(pass NULL)");
  geometry g;
  if (auto why = check_common(query, key, value, attenMaskOptional, keepProb, headNum, inputLayout, innerPrecise,
                              sparseMode, &g);
      !why.empty())
    return reject(name, param_invalid, why);
  if (auto why = check_stats(softmaxMaxOut, g, "softmaxMaxOut"); !why.empty()) return reject(name, param_invalid, why);
  if (auto why = check_stats(softmaxSumOut, g, "softmaxSumOut"); !why.empty()) return reject(name, param_invalid, why);
  if (attentionOutOut->dims != query->dims || attentionOutOut->dtype != query->dtype)
    return reject(name, param_invalid, "attentionOutOut must match query in shape and dtype");
  const aclTensor Q = *query, K = *key, V = *value, O = *attentionOutOut, MX = *softmaxMaxOut, SM = *softmaxSumOut;
  const bool hm = attenMaskOptional;
  const aclTensor M = hm ? *attenMaskOptional : aclTensor{};
  return make_executor(
      name, {query, key, value, attenMaskOptional, softmaxMaxOut, softmaxSumOut, attentionOutOut},
      uint64_t(g.B * g.Nq * g.Sq) * 8,
      [=](void*) {
        const auto mask = build_mask(M, hm, g, sparseMode, preTokens, nextTokens);
        const auto q = gather(Q), k = gather(K), v = gather(V);
        std::vector<double> o(q.size(), 0.0), mx(std::size_t(g.B * g.Nq * g.Sq * 8)), sm(mx.size());
        std::vector<double> p(std::size_t(g.Skv));
        const int64_t group = g.Nq / g.Nkv;
        for (int64_t b = 0; b < g.B; ++b)
          for (int64_t n = 0; n < g.Nq; ++n) {
            const int64_t nk = n / group;
            for (int64_t i = 0; i < g.Sq; ++i) {
              double rmax = -std::numeric_limits<double>::infinity();
              for (int64_t j = 0; j < g.Skv; ++j) {
                if (mask(b, n, i, j)) {
                  p[std::size_t(j)] = -std::numeric_limits<double>::infinity();
                  continue;
                }
                double s = 0;
                for (int64_t d = 0; d < g.D; ++d)
                  s += q[std::size_t(at(g.layout, g.B, g.Nq, g.Sq, g.D, b, n, i, d))] *
                       k[std::size_t(at(g.layout, g.B, g.Nkv, g.Skv, g.D, b, nk, j, d))];
                p[std::size_t(j)] = s * scaleValue;
                rmax = std::max(rmax, p[std::size_t(j)]);
              }
              double rsum = 0;
              for (int64_t j = 0; j < g.Skv; ++j) {
                p[std::size_t(j)] = std::isinf(p[std::size_t(j)]) ? 0.0 : std::exp(p[std::size_t(j)] - rmax);
                rsum += p[std::size_t(j)];
              }
              for (int64_t d = 0; d < g.D; ++d) {
                double acc = 0;
                for (int64_t j = 0; j < g.Skv; ++j)
                  if (p[std::size_t(j)] != 0) acc += p[std::size_t(j)] * v[std::size_t(at(g.layout, g.B, g.Nkv, g.Skv, g.D, b, nk, j, d))];
                o[std::size_t(at(g.layout, g.B, g.Nq, g.Sq, g.D, b, n, i, d))] = rsum > 0 ? acc / rsum : 0.0;
              }
              for (int r = 0; r < 8; ++r) {
                mx[std::size_t(((b * g.Nq + n) * g.Sq + i) * 8 + r)] = rmax;
                sm[std::size_t(((b * g.Nq + n) * g.Sq + i) * 8 + r)] = rsum;
              }
            }
          }
        scatter(O, o);
        scatter(MX, mx);
        scatter(SM, sm);
      },
      ws, ex);
}

extern "C" aclnnStatus aclnnFlashAttentionScore(void* workspace, uint64_t workspaceSize, aclOpExecutor* executor,
                                                aclrtStream stream) {
  return launch("aclnnFlashAttentionScore", workspace, workspaceSize, executor, stream);
}

extern "C" aclnnStatus aclnnFlashAttentionScoreGradGetWorkspaceSize(
    const aclTensor* query, const aclTensor* keyIn, const aclTensor* value, const aclTensor* dy,
    const aclTensor* pseShiftOptional, const aclTensor* dropMaskOptional, const aclTensor* paddingMaskOptional,
    const aclTensor* attenMaskOptional, const aclTensor* softmaxMaxOptional, const aclTensor* softmaxSumOptional,
    const aclTensor* softmaxInOptional, const aclTensor* attentionInOptional, const aclIntArray* prefixOptional,
    double scaleValue, double keepProb, int64_t preTokens, int64_t nextTokens, int64_t headNum, char* inputLayout,
    int64_t innerPrecise, int64_t sparseMode, const aclTensor* dqOut, const aclTensor* dkOut, const aclTensor* dvOut,
    const aclTensor* dpseOut, uint64_t* ws, aclOpExecutor** ex) {
  constexpr const char* name = "aclnnFlashAttentionScoreGrad";
  if (int c = injected("aclnnFlashAttentionScoreGradGetWorkspaceSize")) return c;
  if (!query || !keyIn || !value || !dy || !dqOut || !dkOut || !dvOut)
    return reject(name, param_nullptr, "query, keyIn, value, dy, dqOut, dkOut and dvOut are required");
  if (pseShiftOptional || dropMaskOptional || paddingMaskOptional || softmaxInOptional || prefixOptional || dpseOut)
    return reject(name, param_invalid, "pse, dropout mask, padding mask, softmaxIn, prefix and dpse are not emulated");
  if (!softmaxMaxOptional || !softmaxSumOptional || !attentionInOptional)
    return reject(name, param_nullptr, "the emulation needs softmaxMax, softmaxSum and attentionIn from the forward");
  geometry g;
  if (auto why = check_common(query, keyIn, value, attenMaskOptional, keepProb, headNum, inputLayout, innerPrecise,
                              sparseMode, &g);
      !why.empty())
    return reject(name, param_invalid, why);
  if (auto why = check_stats(softmaxMaxOptional, g, "softmaxMax"); !why.empty()) return reject(name, param_invalid, why);
  if (auto why = check_stats(softmaxSumOptional, g, "softmaxSum"); !why.empty()) return reject(name, param_invalid, why);
  for (auto [t, ref, what] : {std::tuple{dy, query, "dy"}, std::tuple{attentionInOptional, query, "attentionIn"},
                              std::tuple{dqOut, query, "dqOut"}, std::tuple{dkOut, keyIn, "dkOut"},
                              std::tuple{dvOut, value, "dvOut"}})
    if (t->dims != ref->dims || t->dtype != ref->dtype)
      return reject(name, param_invalid, std::string(what) + " must match the shape and dtype of its input");
  const aclTensor Q = *query, K = *keyIn, V = *value, DY = *dy, MX = *softmaxMaxOptional, SM = *softmaxSumOptional,
                  O = *attentionInOptional, DQ = *dqOut, DK = *dkOut, DV = *dvOut;
  const bool hm = attenMaskOptional;
  const aclTensor M = hm ? *attenMaskOptional : aclTensor{};
  return make_executor(
      name,
      {query, keyIn, value, dy, attenMaskOptional, softmaxMaxOptional, softmaxSumOptional, attentionInOptional, dqOut,
       dkOut, dvOut},
      uint64_t(g.B * g.Nq * g.Sq) * 8,
      [=](void*) {
        const auto mask = build_mask(M, hm, g, sparseMode, preTokens, nextTokens);
        const auto q = gather(Q), k = gather(K), v = gather(V), dyv = gather(DY), mx = gather(MX), sm = gather(SM),
                   o = gather(O);
        std::vector<double> dq(q.size(), 0.0), dk(k.size(), 0.0), dv(v.size(), 0.0), p(std::size_t(g.Skv));
        const int64_t group = g.Nq / g.Nkv;
        auto qi = [&](int64_t b, int64_t n, int64_t s, int64_t d) {
          return std::size_t(at(g.layout, g.B, g.Nq, g.Sq, g.D, b, n, s, d));
        };
        auto ki = [&](int64_t b, int64_t n, int64_t s, int64_t d) {
          return std::size_t(at(g.layout, g.B, g.Nkv, g.Skv, g.D, b, n, s, d));
        };
        for (int64_t b = 0; b < g.B; ++b)
          for (int64_t n = 0; n < g.Nq; ++n) {
            const int64_t nk = n / group;
            for (int64_t i = 0; i < g.Sq; ++i) {
              const std::size_t st = std::size_t(((b * g.Nq + n) * g.Sq + i) * 8);
              const double rmax = mx[st], rsum = sm[st];
              double Di = 0;
              for (int64_t d = 0; d < g.D; ++d) Di += dyv[qi(b, n, i, d)] * o[qi(b, n, i, d)];
              for (int64_t j = 0; j < g.Skv; ++j) {
                if (mask(b, n, i, j) || rsum <= 0) {
                  p[std::size_t(j)] = 0;
                  continue;
                }
                double s = 0;
                for (int64_t d = 0; d < g.D; ++d) s += q[qi(b, n, i, d)] * k[ki(b, nk, j, d)];
                p[std::size_t(j)] = std::exp(s * scaleValue - rmax) / rsum;
              }
              for (int64_t j = 0; j < g.Skv; ++j) {
                const double pij = p[std::size_t(j)];
                if (pij == 0) continue;
                double dp = 0;
                for (int64_t d = 0; d < g.D; ++d) {
                  dv[ki(b, nk, j, d)] += pij * dyv[qi(b, n, i, d)];
                  dp += dyv[qi(b, n, i, d)] * v[ki(b, nk, j, d)];
                }
                const double ds = pij * (dp - Di) * scaleValue;
                for (int64_t d = 0; d < g.D; ++d) {
                  dq[qi(b, n, i, d)] += ds * k[ki(b, nk, j, d)];
                  dk[ki(b, nk, j, d)] += ds * q[qi(b, n, i, d)];
                }
              }
            }
          }
        scatter(DQ, dq);
        scatter(DK, dk);
        scatter(DV, dv);
      },
      ws, ex);
}

extern "C" aclnnStatus aclnnFlashAttentionScoreGrad(void* workspace, uint64_t workspaceSize, aclOpExecutor* executor,
                                                    aclrtStream stream) {
  return launch("aclnnFlashAttentionScoreGrad", workspace, workspaceSize, executor, stream);
}
