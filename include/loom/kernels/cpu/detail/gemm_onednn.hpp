#pragma once
/// \file Private: oneDNN's matmul primitive behind loom::kernels::cpu::detail::gemm with an
/// onednn_matmul_cache (gemm_impl::onednn_matmul).
///
/// The row-major product C (M,N) = alpha * op(A) op(B) + beta * C is one matmul primitive
/// (oneDNN developer guide, "Matmul"): src = op(A) (M,K), weights = op(B) (K,N), dst = C (M,N).
/// Leading dimensions and transposes are memory-descriptor strides over the caller's memory
/// (no copies):
///   A   (M,K) strides {lda, 1};   stored (K,M) when trans_a: strides {1, lda}
///   B   (K,N) strides {ldb, 1};   stored (N,K) when trans_b: strides {1, ldb}
///   C   (M,N) strides {ldc, 1}
/// alpha is the output scale (primitive attribute), beta a sum post-op (dst = alpha acc + beta
/// dst, C read in its own type); beta == 0 has no post-op, so C is not read. An optional bias
/// (N values of the operand type, one per column of C) is the primitive's bias argument, added
/// to the fp32 accumulator before the output scale and the sum post-op: a linear layer's
/// forward y = x W^T + b then writes y without reading it (no bias copied into y first).
/// Accumulation is fp32 for bf16, fp16 and fp32 operands.
///
/// Primitives are created once per shape and kept by an onednn_matmul_cache, which the caller
/// owns and passes in (no global state): the CPU engine, one stream, the primitives by shape
/// key, and one loom-owned workspace that is the primitives' scratchpad
/// (scratchpad_mode::user, passed as DNNL_ARG_SCRATCHPAD), grown to the largest need.
///
/// Timing (off by default): set_timing(true) makes the cache record, per key, the calls and the
/// wall-clock seconds of the primitive's execution (execute plus stream wait), read back with
/// timings(); bench_step --gemm-shapes compares them with the same primitive run alone.
///
/// fp16 operands: oneDNN 2.x implements an f16 matmul on CPUs with AVX512-FP16 only, and a bf16
/// one on CPUs with AVX-512 only (not on AVX2 machines). Elsewhere (primitive creation reports
/// "unimplemented") the cache converts A and B to contiguous fp32
/// in the same workspace and runs the fp32 primitive; an fp16 C is then computed in fp32 in the
/// workspace and rounded once into C (as gemm_impl::onednn does).
///
/// Written against the oneDNN 2.x C++ API (Debian libdnnl-dev 2.6.3). With oneDNN 3.x the
/// primitive descriptor takes the engine first and output scales are gone: that branch is
/// compiled only there (not in loom's CI) and refuses alpha != 1.
#include <chrono>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include <Eigen/Core>
#if defined(LOOM_WITH_ONEDNN)
#include <oneapi/dnnl/dnnl.hpp>
#endif

#include <loom/core/error.hpp>
#include <loom/kernels/cpu/detail/gemm_convert.hpp>

namespace loom::kernels::cpu::detail {

/// Element types the matmul primitive sees (loom's own names, so the key exists without oneDNN).
enum class onednn_dtype : std::uint8_t { f32, bf16, f16 };

/// onednn_dtype of float, Eigen::bfloat16 or Eigen::half.
template <class T>
constexpr onednn_dtype onednn_dtype_of() noexcept {
  if constexpr (std::is_same_v<T, Eigen::bfloat16>) return onednn_dtype::bf16;
  else if constexpr (std::is_same_v<T, Eigen::half>) return onednn_dtype::f16;
  else return onednn_dtype::f32;
}

/// What identifies one matmul primitive: sizes, leading dimensions, transposes, operand and
/// result types, the alpha and beta it was created for (bit patterns; beta == 0 means no
/// sum post-op), and whether it adds a bias. Ordered, so it keys a std::map.
struct onednn_matmul_key {
  int M = 0, N = 0, K = 0, lda = 0, ldb = 0, ldc = 0;
  bool trans_a = false, trans_b = false;
  onednn_dtype ab = onednn_dtype::f32, c = onednn_dtype::f32;
  std::uint32_t alpha_bits = 0, beta_bits = 0;
  bool bias = false;
  auto operator<=>(const onednn_matmul_key&) const = default;
};

/// What the cache measured for one key while timing was on (onednn_matmul_cache::timings()).
struct onednn_matmul_timing {
  onednn_matmul_key key;
  /// Products of this key run while timing was on.
  std::size_t calls = 0;
  /// Their total wall-clock time in seconds (std::chrono::steady_clock): the primitive's
  /// execute plus the stream wait, so the whole product on oneDNN's threads. Not included: the
  /// key lookup, primitive creation, and the fp32 conversions of fp16 operands (convert path).
  double seconds = 0;
  /// oneDNN's implementation name (as impl_name(key)).
  std::string impl;
};

/// Caches oneDNN matmul primitives by shape and runs them (gemm_impl::onednn_matmul).
///
/// Holds: the CPU engine (index 0) and one in-order stream; one primitive per
/// onednn_matmul_key; one 64-byte aligned workspace owned by loom, the scratchpad of every
/// primitive (and the fp32 copies of fp16 operands where oneDNN has no f16 matmul), grown to
/// the largest need and never shrunk.
/// Threads: not thread-safe; one cache per thread (or per training session). Each call runs
/// on oneDNN's own threads (OpenMP in Debian's build: omp_get_max_threads()).
/// Errors: constructing throws loom::device_error when oneDNN cannot create the CPU engine.
/// Built without oneDNN (LOOM_WITH_ONEDNN) the cache is empty and run() throws
/// loom::input_error.
/// Source: oneDNN developer guide, "Matmul" (primitive), "Primitive Attributes: Scratchpad",
/// "Primitive Attributes: Post-ops" (sum), "Primitive Attributes: Quantization" (output scales).
class onednn_matmul_cache {
 public:
  /// Creates the CPU engine and its stream; no primitive yet.
  onednn_matmul_cache();
  onednn_matmul_cache(const onednn_matmul_cache&) = delete;
  onednn_matmul_cache& operator=(const onednn_matmul_cache&) = delete;
  onednn_matmul_cache(onednn_matmul_cache&&) noexcept = default;
  onednn_matmul_cache& operator=(onednn_matmul_cache&&) noexcept = default;
  ~onednn_matmul_cache() = default;

  /// Number of primitives held (distinct keys run so far).
  std::size_t size() const noexcept { return entries_.size(); }
  /// Number of primitives created since construction (== size(): a repeated key reuses its own).
  std::size_t created() const noexcept { return created_; }
  /// Number of products run through the cache (each one primitive execution).
  std::size_t executions() const noexcept { return executions_; }
  /// Bytes of the workspace (scratchpad and fp16 conversion buffers) currently allocated.
  std::size_t workspace_bytes() const noexcept { return workspace_bytes_; }
  /// oneDNN's name of the implementation behind `key` ("brg:avx512_core_bf16", "gemm:jit",
  /// ...; with " (f16 via f32)" appended when fp16 operands are converted), or "" when the
  /// key has no primitive yet.
  std::string impl_name(const onednn_matmul_key& key) const;

  /// Turns per-key timing on or off (off after construction). While on, every run() adds one
  /// call and the seconds of its execute plus stream wait to its key's record (two
  /// steady_clock reads per product); while off, run() costs one branch more than without it.
  /// Turning timing off keeps what was recorded.
  void set_timing(bool on) noexcept { timing_ = on; }
  /// Whether run() records timings (set_timing).
  bool timing() const noexcept { return timing_; }
  /// The records of every key run at least once while timing was on, in key order (one per
  /// distinct onednn_matmul_key; see onednn_matmul_timing for what `seconds` covers). Empty
  /// when timing was never on, after reset_timings(), and when built without oneDNN.
  std::vector<onednn_matmul_timing> timings() const;
  /// Drops the recorded calls and seconds of every key (the primitives stay; timing stays on
  /// or off as it was).
  void reset_timings() noexcept;

  /// C (M,N) = alpha * (op(A) op(B) + bias) + beta * C, fp32 accumulation, through the
  /// primitive of this shape (created on first use, reused after). Same argument contract as
  /// loom::kernels::cpu::gemm, which the caller has checked (gemm_check), with M, N, K > 0.
  /// T: float, Eigen::bfloat16 or Eigen::half; OutT: float or T. beta == 0: C is not read.
  /// bias: N values (bias[j] added to column j of every row), or null for none.
  /// Writes C (M rows of N; the padding up to ldc is untouched) and the workspace.
  /// Errors: loom::input_error when built without oneDNN, or (oneDNN 3.x only) alpha != 1;
  /// loom::device_error when oneDNN fails to create or run the primitive.
  template <class T, class OutT>
  void run(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const T* A, int lda, const T* B, int ldb,
           float beta, OutT* C, int ldc, const T* bias = nullptr);

 private:
  struct aligned_free {
    void operator()(std::byte* p) const noexcept { ::operator delete[](p, std::align_val_t(64)); }
  };
  struct entry;  // a primitive and what running it needs (oneDNN types; defined below)

  std::byte* workspace(std::size_t bytes);

  std::map<onednn_matmul_key, std::unique_ptr<entry>> entries_;
  std::unique_ptr<std::byte[], aligned_free> workspace_;
  std::size_t workspace_bytes_ = 0, created_ = 0, executions_ = 0;
  bool timing_ = false;
#if defined(LOOM_WITH_ONEDNN)
  dnnl::engine engine_;
  dnnl::stream stream_;

  entry& find_or_create(const onednn_matmul_key& key);
#endif
};

/// The workspace, grown (contents dropped) to at least `bytes`.
inline std::byte* onednn_matmul_cache::workspace(std::size_t bytes) {
  if (bytes > workspace_bytes_) {
    workspace_.reset();
    workspace_bytes_ = 0;
    workspace_.reset(static_cast<std::byte*>(::operator new[](bytes, std::align_val_t(64))));
    workspace_bytes_ = bytes;
  }
  return workspace_.get();
}

/// Round n bytes up to a multiple of 64 (workspace sections start on cache lines).
constexpr std::size_t onednn_align64(std::size_t n) noexcept { return (n + 63) / 64 * 64; }

#if defined(LOOM_WITH_ONEDNN)

struct onednn_matmul_cache::entry {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c;   // as the primitive sees them (fp32 contiguous when converted)
  dnnl::memory::desc bias;      // (1, N) when the key adds a bias, else empty
  dnnl::memory::desc sp;        // its scratchpad, at the workspace's start
  std::size_t scratch = 0;      // scratchpad bytes
  bool convert = false;         // 16-bit operands converted to fp32 in the workspace
  std::size_t a32 = 0, b32 = 0, c32 = 0, bias32 = 0;  // workspace offsets of the fp32 copies (convert only)
  std::size_t total = 0;        // workspace bytes this primitive needs
  std::string impl;
  // The execute arguments, made once: memory objects over no buffer, pointed at the call's
  // operands with set_data_handle (so a call allocates nothing on loom's side).
  dnnl::memory ma, mb, mc, mbias, msp;
  std::vector<dnnl_exec_arg_t> args;  // for the C API's execute (the C++ one copies a map per call)
  std::size_t timed_calls = 0;        // set_timing(true): products run and their seconds
  double timed_seconds = 0;
};

inline onednn_matmul_cache::onednn_matmul_cache() {
  try {
    engine_ = dnnl::engine(dnnl::engine::kind::cpu, 0);
    stream_ = dnnl::stream(engine_);
  } catch (const dnnl::error& e) {
    throw device_error(int(e.status), "dnnl::engine", e.what());
  }
}

inline std::string onednn_matmul_cache::impl_name(const onednn_matmul_key& key) const {
  const auto it = entries_.find(key);
  return it == entries_.end() ? std::string() : it->second->impl;
}

inline std::vector<onednn_matmul_timing> onednn_matmul_cache::timings() const {
  std::vector<onednn_matmul_timing> out;
  for (const auto& [key, e] : entries_)
    if (e->timed_calls > 0) out.push_back({key, e->timed_calls, e->timed_seconds, e->impl});
  return out;
}

inline void onednn_matmul_cache::reset_timings() noexcept {
  for (auto& [key, e] : entries_) e->timed_calls = 0, e->timed_seconds = 0;
}

/// dnnl data type of an onednn_dtype.
inline dnnl::memory::data_type onednn_data_type(onednn_dtype t) noexcept {
  using dt = dnnl::memory::data_type;
  return t == onednn_dtype::bf16 ? dt::bf16 : t == onednn_dtype::f16 ? dt::f16 : dt::f32;
}

/// The primitive descriptor of C (dc) = alpha (op(A) (da) op(B) (db) + bias (dbias)) + beta C
/// with a user scratchpad (an empty dbias: no bias); throws dnnl::error (status unimplemented
/// when no implementation fits).
inline dnnl::matmul::primitive_desc onednn_matmul_pd(const dnnl::engine& eng, const dnnl::memory::desc& da,
                                                     const dnnl::memory::desc& db, const dnnl::memory::desc& dbias,
                                                     const dnnl::memory::desc& dc, float alpha, float beta) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
#if DNNL_VERSION_MAJOR >= 3
  if (alpha != 1.0f)
    throw input_error("loom::kernels::cpu::gemm: gemm_impl::onednn_matmul with oneDNN 3.x supports alpha == 1 only; "
                      "use gemm_impl::onednn for other alpha");
  return dnnl::matmul::primitive_desc(eng, da, db, dbias, dc, attr);
#else
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(da, db, dbias, dc), attr, eng);
#endif
}

inline onednn_matmul_cache::entry& onednn_matmul_cache::find_or_create(const onednn_matmul_key& k) {
  if (const auto it = entries_.find(k); it != entries_.end()) return *it->second;
  using md = dnnl::memory::desc;
  using dims = dnnl::memory::dims;
  using dt = dnnl::memory::data_type;
  const dnnl::memory::dim M = k.M, N = k.N, K = k.K;
  float alpha, beta;
  std::memcpy(&alpha, &k.alpha_bits, 4);
  std::memcpy(&beta, &k.beta_bits, 4);
  auto e = std::make_unique<entry>();
  const dt tab = onednn_data_type(k.ab), tc = onednn_data_type(k.c);
  e->a = md({M, K}, tab, k.trans_a ? dims{1, k.lda} : dims{k.lda, 1});
  e->b = md({K, N}, tab, k.trans_b ? dims{1, k.ldb} : dims{k.ldb, 1});
  e->c = md({M, N}, tc, dims{k.ldc, 1});
  if (k.bias) e->bias = md({1, N}, tab, dims{N, 1});
  dnnl::matmul::primitive_desc pd;
  try {
    pd = onednn_matmul_pd(engine_, e->a, e->b, e->bias, e->c, alpha, beta);
  } catch (const dnnl::error& err) {
    if (k.ab == onednn_dtype::f32 || err.status != dnnl_unimplemented)
      throw device_error(int(err.status), "dnnl::matmul::primitive_desc", err.what());
    // No f16 (or bf16) matmul on this CPU: fp32 copies of A and B (contiguous, same transposes)
    // and, for a 16-bit C, an fp32 product rounded into C afterwards (beta applied there).
    e->convert = true;
    const bool c_f32 = k.c == onednn_dtype::f32;
    e->a = md({M, K}, dt::f32, k.trans_a ? dims{1, M} : dims{K, 1});
    e->b = md({K, N}, dt::f32, k.trans_b ? dims{1, K} : dims{N, 1});
    e->c = c_f32 ? md({M, N}, dt::f32, dims{k.ldc, 1}) : md({M, N}, dt::f32, dims{N, 1});
    if (k.bias) e->bias = md({1, N}, dt::f32, dims{N, 1});
    try {
      pd = onednn_matmul_pd(engine_, e->a, e->b, e->bias, e->c, alpha, c_f32 ? beta : 0.0f);
    } catch (const dnnl::error& err2) {
      throw device_error(int(err2.status), "dnnl::matmul::primitive_desc (f32 for a 16-bit type)", err2.what());
    }
  }
  e->sp = pd.scratchpad_desc();
  e->scratch = e->sp.get_size();
  e->total = onednn_align64(e->scratch);
  if (e->convert) {
    const std::size_t m = std::size_t(M), n = std::size_t(N), kk = std::size_t(K);
    e->a32 = e->total;
    e->b32 = e->a32 + onednn_align64(m * kk * 4);
    e->c32 = e->b32 + onednn_align64(kk * n * 4);
    e->bias32 = e->c32 + (k.c == onednn_dtype::f32 ? 0 : onednn_align64(m * n * 4));
    e->total = e->bias32 + (k.bias ? onednn_align64(n * 4) : 0);
  }
  e->impl = std::string(pd.impl_info_str()) +
            (e->convert ? k.ab == onednn_dtype::bf16 ? " (bf16 via f32)" : " (f16 via f32)" : "");
  try {
    e->prim = dnnl::matmul(pd);
    e->ma = dnnl::memory(e->a, engine_, DNNL_MEMORY_NONE);
    e->mb = dnnl::memory(e->b, engine_, DNNL_MEMORY_NONE);
    e->mc = dnnl::memory(e->c, engine_, DNNL_MEMORY_NONE);
    e->args = {{DNNL_ARG_SRC, e->ma.get()}, {DNNL_ARG_WEIGHTS, e->mb.get()}, {DNNL_ARG_DST, e->mc.get()}};
    if (k.bias) {
      e->mbias = dnnl::memory(e->bias, engine_, DNNL_MEMORY_NONE);
      e->args.push_back({DNNL_ARG_BIAS, e->mbias.get()});
    }
    if (e->scratch > 0) {
      e->msp = dnnl::memory(e->sp, engine_, DNNL_MEMORY_NONE);
      e->args.push_back({DNNL_ARG_SCRATCHPAD, e->msp.get()});
    }
  } catch (const dnnl::error& err) {
    throw device_error(int(err.status), "dnnl::matmul", err.what());
  }
  ++created_;
  return *entries_.emplace(k, std::move(e)).first->second;
}

template <class T, class OutT>
void onednn_matmul_cache::run(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const T* A, int lda,
                              const T* B, int ldb, float beta, OutT* C, int ldc, const T* bias) {
  onednn_matmul_key key{M, N, K, lda, ldb, ldc, trans_a, trans_b, onednn_dtype_of<T>(), onednn_dtype_of<OutT>()};
  key.bias = bias != nullptr;
  if (beta == 0.0f) beta = 0.0f;  // -0 and +0: one key, no post-op
  std::memcpy(&key.alpha_bits, &alpha, 4);
  std::memcpy(&key.beta_bits, &beta, 4);
  entry& e = find_or_create(key);
  ++executions_;
  std::byte* ws = workspace(e.total);
  void* pa = const_cast<T*>(A);
  void* pb = const_cast<T*>(B);
  void* pc = C;
  void* pbias = const_cast<T*>(bias);
  if (e.convert) {  // no 16-bit matmul on this CPU: contiguous fp32 copies in the workspace
    float* a32 = reinterpret_cast<float*>(ws + e.a32);
    float* b32 = reinterpret_cast<float*>(ws + e.b32);
    gemm_convert_rows(a32, A, trans_a ? K : M, trans_a ? M : K, lda);
    gemm_convert_rows(b32, B, trans_b ? N : K, trans_b ? K : N, ldb);
    pa = a32, pb = b32;
    if (bias) {
      float* bias32 = reinterpret_cast<float*>(ws + e.bias32);
      gemm_convert_rows(bias32, bias, 1, N, N);
      pbias = bias32;
    }
    if constexpr (!std::is_same_v<OutT, float>) pc = ws + e.c32;
  }
  try {
    e.ma.set_data_handle(pa);
    e.mb.set_data_handle(pb);
    e.mc.set_data_handle(pc);
    if (bias) e.mbias.set_data_handle(pbias);
    if (e.scratch > 0) e.msp.set_data_handle(ws);
    using clock = std::chrono::steady_clock;
    const clock::time_point t0 = timing_ ? clock::now() : clock::time_point{};
    dnnl::error::wrap_c_api(dnnl_primitive_execute(e.prim.get(), stream_.get(), int(e.args.size()), e.args.data()),
                            "could not execute the matmul primitive");
    stream_.wait();
    if (timing_) {
      ++e.timed_calls;
      e.timed_seconds += std::chrono::duration<double>(clock::now() - t0).count();
    }
  } catch (const dnnl::error& err) {
    throw device_error(int(err.status), "dnnl::matmul::execute", err.what());
  }
  if constexpr (!std::is_same_v<OutT, float>)
    if (e.convert) gemm_round_into(M, N, beta, reinterpret_cast<const float*>(ws + e.c32), C, ldc);
}

#else  // built without oneDNN: the cache exists (so callers compile) and refuses to run

struct onednn_matmul_cache::entry {};

inline onednn_matmul_cache::onednn_matmul_cache() = default;

inline std::string onednn_matmul_cache::impl_name(const onednn_matmul_key&) const { return {}; }

inline std::vector<onednn_matmul_timing> onednn_matmul_cache::timings() const { return {}; }

inline void onednn_matmul_cache::reset_timings() noexcept {}

template <class T, class OutT>
void onednn_matmul_cache::run(bool, bool, int, int, int, float, const T*, int, const T*, int, float, OutT*, int,
                              const T*) {
  throw input_error(
      "loom::kernels::cpu::gemm: gemm_impl::onednn_matmul needs oneDNN, and loom was built without oneDNN "
      "(LOOM_WITH_ONEDNN); use gemm_impl::automatic");
}

#endif

/// True when the oneDNN matmul primitive is compiled in (LOOM_WITH_ONEDNN).
inline constexpr bool gemm_has_onednn_matmul = gemm_has_onednn;

}  // namespace loom::kernels::cpu::detail
