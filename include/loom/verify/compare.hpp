#pragma once
/// \file loom::verify::compare<PolicyA, PolicyB>: the same weights and batch under two policies,
/// layer by layer — the migration guide's step 2 ("fix the seed, run the same batch on two
/// devices, compare the mean and max abs diff of every layer's output").
///
/// Runs one forward (activations of every layer), one forward that writes dlogits, and one
/// backward (every parameter gradient) on both models, then reports per tensor: the means of
/// A and B, mean and max |a - b|, and the relative error ||a - b||_2 / ||a||_2, against a
/// tolerance for the pair of precisions (the looser of the two: tolerance_for). The first
/// failing row — forward order for activations, output-to-input order for gradients, i.e. the
/// order in which errors propagate — names where the two runs part. When the caller loaded B's
/// weights itself (compare_options::copy_weights = false), the parameters are compared first, so
/// a weight that did not load identically is named before the activations it spoils.
/// Works for any two policies whose models compile: cpu/fp32 vs cpu/bf16 and cpu/fp32 vs
/// ascend/bf16 (through the host emulation: tests/ascend/test_gpt.cpp) are tested; every access
/// to a model's memory goes through D::copy_to_host / copy_to_device on the context's stream.
/// See docs/precision.md.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <loom/core/buffer.hpp>
#include <loom/core/context.hpp>
#include <loom/core/error.hpp>
#include <loom/nn/transformer.hpp>
#include <loom/precision/policy.hpp>

namespace loom::verify {

/// Relative-error tolerances of one precision against an exact reference, for a whole small
/// GPT (a few layers). Derived from the unit roundoff u = 2^-p (p significand bits) times the
/// few roundings a value goes through per layer, then checked on char_tiny/quickstart
/// (docs/precision.md gives the measured errors): bf16 (u = 3.9e-3) 3e-2 for activations —
/// "within 1e-2 is normal" for a single layer, deeper ones accumulate —, 8e-2 for gradients
/// (a backward pass rounds twice as often and sums over tokens); fp16 (u = 4.9e-4) 8x
/// tighter; fp32 (u = 6e-8) 1e-4 / 1e-3 (reordered sums, different kernels).
struct tolerance {
  double activation;
  double gradient;
};

template <class P>
constexpr tolerance tolerance_of() {
  if constexpr (std::is_same_v<typename P::storage, double>) return {1e-9, 1e-8};
  else if constexpr (std::is_same_v<typename P::storage, float>) return {1e-4, 1e-3};
  else if constexpr (std::is_same_v<typename P::storage, Eigen::half>) return {4e-3, 1e-2};
  else return {3e-2, 8e-2};  // bfloat16 and anything else 16-bit
}

/// The tolerance for comparing precision A with precision B: the looser of the two.
template <class PA, class PB>
constexpr tolerance tolerance_for() {
  constexpr tolerance a = tolerance_of<PA>(), b = tolerance_of<PB>();
  return {std::max(a.activation, b.activation), std::max(a.gradient, b.gradient)};
}

/// Settings of compare().
struct compare_options {
  std::optional<tolerance> tol;  ///< overrides tolerance_for<A, B>() when set
  /// true: B's parameters are overwritten with A's (rounded to B's storage) before comparing.
  /// false: B keeps the weights the caller gave it (e.g. the same checkpoint loaded on another
  /// device); every parameter tensor is then compared first ("weight <name>" rows, in the
  /// model's table order, against the activation tolerance), so a weight that differs is the
  /// first failure named.
  bool copy_weights = true;
};

/// One micro-batch of B sequences of T tokens: inputs and targets, (B,T) int32 each, ids in
/// [0, vocab) (targets may be kernels::ignore_index).
template <int B, int T>
struct batch {
  std::vector<std::int32_t> inputs, targets;
};

/// One compared tensor.
struct tensor_stats {
  std::string name;            ///< e.g. "layer 1 qkv" or "grad layer 1 qkv_w"
  bool gradient = false;       ///< false: activation (forward), true: gradient (backward)
  int layer = -1;              ///< block index, -1 outside the blocks
  std::size_t count = 0;       ///< elements compared
  double mean_a = 0, mean_b = 0;
  double mean_abs_diff = 0, max_abs_diff = 0;
  double rel_error = 0;        ///< ||a - b||_2 / ||a||_2 (||a - b||_2 when a is all zeros)
  double tolerance = 0;
  bool pass = true;            ///< rel_error <= tolerance and b finite
};

/// What compare() found.
struct report {
  std::string policy_a, policy_b;  ///< "cpu/fp32", "cpu/bf16", ...
  double loss_a = 0, loss_b = 0;   ///< mean loss over the batch's non-ignored targets
  tolerance tol{};
  std::vector<tensor_stats> rows;  ///< activations in forward order, then gradients output-to-input
  bool pass() const noexcept {
    return std::all_of(rows.begin(), rows.end(), [](const tensor_stats& r) { return r.pass; });
  }
  /// The first failing row in propagation order, or null.
  const tensor_stats* first_failure() const noexcept {
    for (const auto& r : rows)
      if (!r.pass) return &r;
    return nullptr;
  }
};

namespace detail {

template <class D, class E>
std::vector<double> to_host_double(context<D>& ctx, const E* p, std::size_t n) {
  std::vector<E> raw(n);
  D::copy_to_host(raw.data(), p, n * sizeof(E), ctx.stream);
  ctx.synchronize();
  return std::vector<double>(raw.begin(), raw.end());
}

inline tensor_stats stats(std::string name, bool gradient, int layer, const std::vector<double>& a,
                          const std::vector<double>& b, double tol) {
  tensor_stats s{std::move(name), gradient, layer, a.size()};
  double na = 0, nd = 0;
  bool finite = true;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(a[i] - b[i]);
    finite = finite && std::isfinite(b[i]);
    s.mean_a += a[i];
    s.mean_b += b[i];
    s.mean_abs_diff += d;
    s.max_abs_diff = std::max(s.max_abs_diff, d);
    na += a[i] * a[i];
    nd += d * d;
  }
  const double n = a.empty() ? 1.0 : double(a.size());
  s.mean_a /= n;
  s.mean_b /= n;
  s.mean_abs_diff /= n;
  s.rel_error = na > 0 ? std::sqrt(nd / na) : std::sqrt(nd);
  s.tolerance = tol;
  s.pass = finite && std::isfinite(s.rel_error) && s.rel_error <= tol;
  return s;
}

template <class MA, class MB>
constexpr bool same_shape_v = MA::n_layer == MB::n_layer && MA::n_head == MB::n_head && MA::d_model == MB::d_model &&
                              MA::max_seq == MB::max_seq && MA::vocab == MB::vocab &&
                              MA::vocab_padded == MB::vocab_padded;

template <class M>
std::string shape_string() {
  return std::string(M::name) + " (n_layer " + std::to_string(M::n_layer) + ", n_head " + std::to_string(M::n_head) +
         ", d_model " + std::to_string(M::d_model) + ", max_seq " + std::to_string(M::max_seq) + ", vocab " +
         std::to_string(M::vocab) + ", vocab_padded " + std::to_string(M::vocab_padded) + ")";
}

template <class Policy>
std::string policy_name() {
  return std::string(Policy::device::name) + "/" + std::string(Policy::precision::name);
}

/// The non-ignored targets of batch x; throws loom::input_error for a batch of the wrong size,
/// an id outside [0, Vocab), or no target at all.
template <int Vocab, int B, int T>
long checked_target_count(const batch<B, T>& x) {
  const std::size_t BT = std::size_t(B) * T;
  if (x.inputs.size() != BT || x.targets.size() != BT)
    throw input_error("verify::compare: the batch needs " + std::to_string(BT) + " inputs and targets (B=" +
                      std::to_string(B) + " x T=" + std::to_string(T) + "), got " +
                      std::to_string(x.inputs.size()) + " and " + std::to_string(x.targets.size()));
  long count = 0;
  for (std::size_t i = 0; i < BT; ++i) {
    if (x.inputs[i] < 0 || x.inputs[i] >= Vocab || x.targets[i] < kernels::ignore_index || x.targets[i] >= Vocab)
      throw input_error("verify::compare: token id at position " + std::to_string(i) + " is outside the vocabulary [0, " +
                        std::to_string(Vocab) + "); re-tokenize the batch for this model");
    count += x.targets[i] != kernels::ignore_index;
  }
  if (count == 0) throw input_error("verify::compare: every target of the batch is ignored; give it real targets");
  return count;
}

/// Rows for every layer's output after a forward of BT tokens, in forward order: the
/// embedding, per layer ln1, qkv, attention, residual, ln2, fc, gelu, residual, then the final
/// layernorm, the logits and the per-token loss. add(name, gradient, layer, a, b, n) compares.
template <class M, std::size_t BT, class Add, class ActsA, class ActsB>
void add_activation_rows(Add&& add, const ActsA& aa, const ActsB& ab) {
  const auto pa = aa.ptrs();
  const auto pb = ab.ptrs();
  constexpr std::size_t C = M::d_model, L = M::n_layer, HD = C / M::n_head;
  constexpr std::size_t QKV = (M::n_head + 2 * models::kv_heads_of<M>()) * HD, H = models::mlp_hidden_of<M>();
  constexpr std::size_t FC = models::arch_of<M>().mlp == models::mlp_kind::swiglu ? 2 * H : H;
  add("embedding (token + position)", false, -1, pa.encoded, pb.encoded, BT * C);
  for (std::size_t l = 0; l < L; ++l) {
    const std::string p = "layer " + std::to_string(l) + " ";
    const int li = int(l);
    add(p + "ln1", false, li, pa.ln1 + l * BT * C, pb.ln1 + l * BT * C, BT * C);
    add(p + "qkv", false, li, pa.qkv + l * BT * QKV, pb.qkv + l * BT * QKV, BT * QKV);
    add(p + "attention", false, li, pa.atty + l * BT * C, pb.atty + l * BT * C, BT * C);
    add(p + "residual after attention", false, li, pa.residual2 + l * BT * C, pb.residual2 + l * BT * C, BT * C);
    add(p + "ln2", false, li, pa.ln2 + l * BT * C, pb.ln2 + l * BT * C, BT * C);
    add(p + "fc", false, li, pa.fch + l * BT * FC, pb.fch + l * BT * FC, BT * FC);
    add(p + "gelu", false, li, pa.fch_gelu + l * BT * H, pb.fch_gelu + l * BT * H, BT * H);
    add(p + "residual after mlp", false, li, pa.residual3 + l * BT * C, pb.residual3 + l * BT * C, BT * C);
  }
  add("final layernorm", false, -1, pa.lnf, pb.lnf, BT * C);
  add("logits", false, -1, pa.logits, pb.logits, BT * M::vocab_padded);
  add("per-token loss", false, -1, aa.losses(), ab.losses(), BT);
}

}  // namespace detail

/// b's parameters (=) a's, each value rounded once to b's storage type, through the host
/// (a's device -> double -> b's storage -> b's device). Synchronizes both contexts. The models
/// must have the same parameter count (same config); otherwise loom::input_error.
template <class PolicyA, class PolicyB, models::model_config MA, models::model_config MB, class AttnA, class AttnB>
void copy_parameters(const nn::transformer<MA, PolicyA, AttnA>& a, context<typename PolicyA::device>& ca,
                     nn::transformer<MB, PolicyB, AttnB>& b, context<typename PolicyB::device>& cb) {
  using SB = typename nn::transformer<MB, PolicyB, AttnB>::storage_t;
  const auto pa = a.parameters();
  const auto pb = b.parameters();
  if (pa.size() != pb.size())
    throw input_error("verify::copy_parameters: A has " + std::to_string(pa.size()) + " parameters, B " +
                      std::to_string(pb.size()) + "; both models need the same config");
  const auto host = detail::to_host_double(ca, pa.data(), pa.size());
  std::vector<SB> nb(host.size());
  for (std::size_t i = 0; i < host.size(); ++i) nb[i] = SB(host[i]);
  PolicyB::device::copy_to_device(pb.data(), nb.data(), nb.size() * sizeof(SB), cb.stream);
  cb.synchronize();
}

/// Compares model `b` (policy PolicyB) with model `a` (policy PolicyA) on batch `x`.
///   a   the reference; its parameters are read, its gradients overwritten
///   b   its parameters are overwritten (=) with a's, rounded to b's storage type (unless
///       opt.copy_weights is false: then they are compared as they are); its gradients and
///       activations are overwritten
///   x   B sequences of T tokens (T <= max_seq)
///   opt tolerance override; copy_weights
/// Both models' gradients are zeroed and then hold this batch's gradients (mean loss).
/// Returns the per-tensor comparison (report). Errors: loom::input_error when the models
/// have different shapes (naming both) or the batch has the wrong size or ids outside the
/// vocabulary. Cost: two forwards and one backward per model, plus host copies of every
/// activation and gradient.
template <class PolicyA, class PolicyB, models::model_config MA, models::model_config MB, class AttnA, class AttnB,
          int B, int T>
report compare(nn::transformer<MA, PolicyA, AttnA>& a, context<typename PolicyA::device>& ca,
               nn::transformer<MB, PolicyB, AttnB>& b, context<typename PolicyB::device>& cb, const batch<B, T>& x,
               const compare_options& opt = {}) {
  if constexpr (!detail::same_shape_v<MA, MB>) {
    throw input_error("verify::compare: the models have different shapes: A is " + detail::shape_string<MA>() +
                      ", B is " + detail::shape_string<MB>() +
                      "; compare the same model config under two policies (load the same weights into both)");
  } else {
    using GA = nn::transformer<MA, PolicyA, AttnA>;
    using GB = nn::transformer<MB, PolicyB, AttnB>;
    using DA = typename PolicyA::device;
    using DB = typename PolicyB::device;
    constexpr std::size_t BT = std::size_t(B) * T;
    const long count = detail::checked_target_count<MA::vocab>(x);

    report r;
    r.policy_a = detail::policy_name<PolicyA>();
    r.policy_b = detail::policy_name<PolicyB>();
    r.tol = opt.tol.value_or(tolerance_for<typename PolicyA::precision, typename PolicyB::precision>());

    const double ta = r.tol.activation, tg = r.tol.gradient;
    auto add = [&](std::string name, bool grad, int layer, const auto* xa, const auto* xb, std::size_t n) {
      r.rows.push_back(detail::stats(std::move(name), grad, layer, detail::to_host_double(ca, xa, n),
                                     detail::to_host_double(cb, xb, n), grad ? tg : ta));
    };
    constexpr std::size_t L = MA::n_layer;
    if (opt.copy_weights) {
      copy_parameters(a, ca, b, cb);
    } else {
      // the caller's weights: compare every parameter tensor first (forward order)
      models::for_each_tensor(GA::table, int(L), [&](std::size_t k, int layer) {
        const auto& s = GA::table[k];
        const auto wa = a.parameter(k), wb = b.parameter(k);
        const std::size_t per = s.layer_size(), off = layer < 0 ? 0 : std::size_t(layer) * per;
        add(std::string("weight ") + (layer < 0 ? "" : "layer " + std::to_string(layer) + " ") + std::string(s.name),
            false, layer, wa.data() + off, wb.data() + off, per);
      });
    }
    buffer<DA, std::int32_t> in_a(BT, ca.stream), tg_a(BT, ca.stream);
    buffer<DB, std::int32_t> in_b(BT, cb.stream), tg_b(BT, cb.stream);
    DA::copy_to_device(in_a.data(), x.inputs.data(), BT * sizeof(std::int32_t), ca.stream);
    DA::copy_to_device(tg_a.data(), x.targets.data(), BT * sizeof(std::int32_t), ca.stream);
    DB::copy_to_device(in_b.data(), x.inputs.data(), BT * sizeof(std::int32_t), cb.stream);
    DB::copy_to_device(tg_b.data(), x.targets.data(), BT * sizeof(std::int32_t), cb.stream);
    typename GA::template activations<B, T> aa(ca);
    typename GB::template activations<B, T> ab(cb);
    auto& ma = a;

    // forward without dlogits: every layer's output, and the logits
    r.loss_a = double(ma.forward(ca, aa, in_a.data(), tg_a.data(), B, T)) / double(count);
    r.loss_b = double(b.forward(cb, ab, in_b.data(), tg_b.data(), B, T)) / double(count);
    detail::add_activation_rows<MA, BT>(add, aa, ab);
    const auto pa = aa.ptrs();
    const auto pb = ab.ptrs();

    // forward writing dlogits (mean loss), then backward: every parameter gradient
    ma.zero_grad(ca);
    b.zero_grad(cb);
    ma.forward(ca, aa, in_a.data(), tg_a.data(), B, T, typename GA::acc_t(1.0 / double(count)));
    b.forward(cb, ab, in_b.data(), tg_b.data(), B, T, typename GB::acc_t(1.0 / double(count)));
    add("dlogits", true, -1, pa.logits, pb.logits, BT * MA::vocab_padded);
    ma.backward(ca, aa, in_a.data(), B, T);
    b.backward(cb, ab, in_b.data(), B, T);
    // every parameter gradient, in backward order
    models::for_each_tensor(
        GA::table, int(L),
        [&](std::size_t k, int layer) {
          const auto& s = GA::table[k];
          const auto ga = ma.gradient(k), gb = b.gradient(k);
          const std::size_t per = s.layer_size(), off = layer < 0 ? 0 : std::size_t(layer) * per;
          add(std::string("grad ") + (layer < 0 ? "" : "layer " + std::to_string(layer) + " ") + std::string(s.name),
              true, layer, ga.data() + off, gb.data() + off, per);
        },
        /*reverse=*/true);
    return r;
  }
}

/// The report as a table (one row per tensor, "FAIL" marked) and a verdict naming the first
/// failing tensor.
inline std::string format(const report& r) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "A = %s, B = %s | loss A %.6f, B %.6f | tolerance (relative L2) %.0e activations, %.0e gradients\n",
                r.policy_a.c_str(), r.policy_b.c_str(), r.loss_a, r.loss_b, r.tol.activation, r.tol.gradient);
  out += line;
  std::snprintf(line, sizeof line, "%-34s %10s %12s %12s %11s %11s %10s  %s\n", "tensor", "elements", "mean A", "mean B",
                "mean|A-B|", "max|A-B|", "rel err", "");
  out += line;
  for (const auto& s : r.rows) {
    std::snprintf(line, sizeof line, "%-34s %10zu %12.4e %12.4e %11.3e %11.3e %10.2e  %s\n", s.name.c_str(), s.count,
                  s.mean_a, s.mean_b, s.mean_abs_diff, s.max_abs_diff, s.rel_error, s.pass ? "ok" : "FAIL");
    out += line;
  }
  if (const auto* f = r.first_failure())
    out += "FAIL: first disagreement at '" + f->name + "' (relative error " + std::to_string(f->rel_error) +
           " > tolerance " + std::to_string(f->tolerance) + ")\n";
  else
    out += "PASS: every tensor agrees within the tolerance\n";
  return out;
}

}  // namespace loom::verify
