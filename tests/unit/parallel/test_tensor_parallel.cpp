// Tensor-parallel layers at TP = 2 and 4 (comm::threads) against the single-rank computation on
// the same global tensors: outputs and every gradient, fp32 (max-norm relative 1e-5) and float64
// (1e-12). Sizes are odd on purpose (N = 7, C = 13, per-rank widths 5 and 10); parameter
// gradients start from random values to check that they accumulate (+=).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <loom/kernels/cpu.hpp>
#include <loom/parallel/comm_threads.hpp>
#include <loom/parallel/tensor_parallel.hpp>

namespace {

namespace lp = loom::parallel;
namespace kc = loom::kernels::cpu;
using cpu = loom::device::cpu;

constexpr std::size_t sz(long v) noexcept { return std::size_t(v); }

template <class T>
std::vector<T> random_vec(std::size_t n, std::uint32_t seed, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> d(-1.0, 1.0);
  std::vector<T> v(n);
  for (auto& x : v) {
    double y = d(gen);
    if (std::abs(y) < 1e-3) y = 0.5;  // never zero
    x = T(scale * y);
  }
  return v;
}

/// Rows [r*rows/tp, (r+1)*rows/tp) of a row-major (rows, cols) matrix.
template <class T>
std::vector<T> row_block(const std::vector<T>& m, int rows, int cols, int tp, int r) {
  const int part = rows / tp;
  return {m.begin() + std::ptrdiff_t(r) * part * cols, m.begin() + std::ptrdiff_t(r + 1) * part * cols};
}
/// Columns [r*cols/tp, (r+1)*cols/tp) of a row-major (rows, cols) matrix.
template <class T>
std::vector<T> col_block(const std::vector<T>& m, int rows, int cols, int tp, int r) {
  const int part = cols / tp;
  std::vector<T> out;
  for (int i = 0; i < rows; ++i)
    out.insert(out.end(), m.begin() + std::ptrdiff_t(i) * cols + r * part,
               m.begin() + std::ptrdiff_t(i) * cols + (r + 1) * part);
  return out;
}

template <class T>
double tolerance() {
  return std::is_same_v<T, double> ? 1e-12 : 1e-5;
}

/// max |a - b| <= tol * max(|b|, tiny): relative to the reference's max norm.
template <class T>
void check_close(const std::vector<T>& a, const std::vector<T>& b, const char* what) {
  INFO(what);
  REQUIRE(a.size() == b.size());
  double err = 0, ref = 1e-30;
  for (std::size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::abs(double(a[i]) - double(b[i])));
    ref = std::max(ref, std::abs(double(b[i])));
  }
  CHECK(err <= tolerance<T>() * ref);
}

/// Runs f(rank, comm) on tp threads; per-rank results are written by f into captured vectors.
template <class F>
void on_ranks(int tp, F&& f) {
  loom::comm::run_threads(tp, [&](loom::comm::threads& world) { f(world.rank(), world); });
}

template <class T>
void column_parallel_case(int tp) {
  CAPTURE(tp);
  const int N = 7, C = 13, OC = 20, OCl = OC / tp;
  loom::context<cpu> ctx;
  const auto x = random_vec<T>(sz(N) * C, 1), w = random_vec<T>(sz(OC) * C, 2),
             b = random_vec<T>(sz(OC), 3), dy = random_vec<T>(sz(N) * OC, 4),
             dw0 = random_vec<T>(sz(OC) * C, 5), db0 = random_vec<T>(sz(OC), 6);
  // single rank
  std::vector<T> y(sz(N) * OC), dx(sz(N) * C), dw = dw0, db = db0;
  kc::matmul_forward(y.data(), x.data(), w.data(), b.data(), N, C, OC);
  kc::matmul_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C, OC, false);
  // tp ranks
  std::vector<std::vector<T>> ys(sz(tp)), dxs(sz(tp)), dws(sz(tp)), dbs(sz(tp));
  on_ranks(tp, [&](int r, loom::comm::threads& g) {
    loom::context<cpu> c;
    const auto wl = row_block(w, OC, C, tp, r), bl = row_block(b, OC, 1, tp, r), dyl = col_block(dy, N, OC, tp, r);
    auto& yl = ys[sz(r)];
    auto& dxl = dxs[sz(r)];
    auto& dwl = dws[sz(r)];
    auto& dbl = dbs[sz(r)];
    yl.resize(sz(N) * OCl);
    dxl.assign(sz(N) * C, T(7));  // overwritten, not accumulated
    dwl = row_block(dw0, OC, C, tp, r);
    dbl = row_block(db0, OC, 1, tp, r);
    lp::column_parallel_linear_forward(c, yl.data(), x.data(), wl.data(), bl.data(), N, C, OCl, g);
    lp::column_parallel_linear_backward(c, dxl.data(), dwl.data(), dbl.data(), dyl.data(), x.data(), wl.data(), N, C,
                                        OCl, g);
  });
  for (int r = 0; r < tp; ++r) {
    CAPTURE(r);
    check_close(ys[sz(r)], col_block(y, N, OC, tp, r), "output slice");
    check_close(dxs[sz(r)], dx, "dinp (all-reduced, replicated)");
    check_close(dws[sz(r)], row_block(dw, OC, C, tp, r), "dw rows");
    check_close(dbs[sz(r)], row_block(db, OC, 1, tp, r), "dbias slice");
    CHECK(dxs[sz(r)] == dxs[0]);  // bitwise replicated
  }
  (void)ctx;
}

template <class T>
void row_parallel_case(int tp) {
  CAPTURE(tp);
  const int N = 7, C = 20, OC = 13, Cl = C / tp;
  const auto x = random_vec<T>(sz(N) * C, 11), w = random_vec<T>(sz(OC) * C, 12),
             b = random_vec<T>(sz(OC), 13), dy = random_vec<T>(sz(N) * OC, 14),
             dw0 = random_vec<T>(sz(OC) * C, 15), db0 = random_vec<T>(sz(OC), 16);
  std::vector<T> y(sz(N) * OC), dx(sz(N) * C), dw = dw0, db = db0;
  kc::matmul_forward(y.data(), x.data(), w.data(), b.data(), N, C, OC);
  kc::matmul_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C, OC, false);
  std::vector<std::vector<T>> ys(sz(tp)), dxs(sz(tp)), dws(sz(tp)), dbs(sz(tp));
  on_ranks(tp, [&](int r, loom::comm::threads& g) {
    loom::context<cpu> c;
    const auto xl = col_block(x, N, C, tp, r), wl = col_block(w, OC, C, tp, r);
    auto& yr = ys[sz(r)];
    yr.assign(sz(N) * OC, T(3));
    dxs[sz(r)].assign(sz(N) * Cl, T(7));
    dws[sz(r)] = col_block(dw0, OC, C, tp, r);
    dbs[sz(r)] = db0;
    lp::row_parallel_linear_forward(c, yr.data(), xl.data(), wl.data(), b.data(), N, Cl, OC, g);
    lp::row_parallel_linear_backward(c, dxs[sz(r)].data(), dws[sz(r)].data(),
                                     dbs[sz(r)].data(), dy.data(), xl.data(), wl.data(), N, Cl, OC, g);
  });
  for (int r = 0; r < tp; ++r) {
    CAPTURE(r);
    check_close(ys[sz(r)], y, "output (all-reduced, replicated)");
    CHECK(ys[sz(r)] == ys[0]);
    check_close(dxs[sz(r)], col_block(dx, N, C, tp, r), "dinp slice");
    check_close(dws[sz(r)], col_block(dw, OC, C, tp, r), "dw columns");
    check_close(dbs[sz(r)], db, "dbias (replicated)");
  }
}

/// f -> column fc1 -> gelu -> row fc2 -> g, the Megatron MLP: the conjugate pairs compose.
template <class T>
void mlp_case(int tp) {
  CAPTURE(tp);
  const int N = 7, C = 13, H = 4 * 13 - 4, Hl = H / tp;  // H = 48
  const auto x = random_vec<T>(sz(N) * C, 21), w1 = random_vec<T>(sz(H) * C, 22, 0.3),
             b1 = random_vec<T>(sz(H), 23), w2 = random_vec<T>(sz(C) * H, 24, 0.3),
             b2 = random_vec<T>(sz(C), 25), dy = random_vec<T>(sz(N) * C, 26);
  std::vector<T> h(sz(N) * H), a(h.size()), y(sz(N) * C), da(h.size()), dh(h.size()),
      dx(sz(N) * C), dw1(w1.size()), db1(b1.size()), dw2(w2.size()), db2(b2.size());
  kc::matmul_forward(h.data(), x.data(), w1.data(), b1.data(), N, C, H);
  kc::gelu_forward(a.data(), h.data(), h.size());
  kc::matmul_forward(y.data(), a.data(), w2.data(), b2.data(), N, H, C);
  kc::matmul_backward(da.data(), dw2.data(), db2.data(), dy.data(), a.data(), w2.data(), N, H, C, false);
  kc::gelu_backward(dh.data(), h.data(), da.data(), h.size());
  kc::matmul_backward(dx.data(), dw1.data(), db1.data(), dh.data(), x.data(), w1.data(), N, C, H, false);
  std::vector<std::vector<T>> ys(sz(tp)), dxs(sz(tp)), dw1s(sz(tp)), dw2s(sz(tp));
  on_ranks(tp, [&](int r, loom::comm::threads& g) {
    loom::context<cpu> c;
    const auto w1l = row_block(w1, H, C, tp, r), b1l = row_block(b1, H, 1, tp, r), w2l = col_block(w2, C, H, tp, r);
    std::vector<T> hl(sz(N) * Hl), al(hl.size()), dal(hl.size()), dhl(hl.size()), db1l(sz(Hl)),
        db2l(sz(C));
    auto& yr = ys[sz(r)];
    yr.resize(sz(N) * C);
    dxs[sz(r)].resize(sz(N) * C);
    dw1s[sz(r)].assign(w1l.size(), T(0));
    dw2s[sz(r)].assign(w2l.size(), T(0));
    lp::column_parallel_linear_forward(c, hl.data(), x.data(), w1l.data(), b1l.data(), N, C, Hl, g);
    kc::gelu_forward(al.data(), hl.data(), hl.size());
    lp::row_parallel_linear_forward(c, yr.data(), al.data(), w2l.data(), b2.data(), N, Hl, C, g);
    lp::row_parallel_linear_backward(c, dal.data(), dw2s[sz(r)].data(), db2l.data(), dy.data(), al.data(),
                                     w2l.data(), N, Hl, C, g);
    kc::gelu_backward(dhl.data(), hl.data(), dal.data(), hl.size());
    lp::column_parallel_linear_backward(c, dxs[sz(r)].data(), dw1s[sz(r)].data(), db1l.data(),
                                        dhl.data(), x.data(), w1l.data(), N, C, Hl, g);
  });
  for (int r = 0; r < tp; ++r) {
    CAPTURE(r);
    check_close(ys[sz(r)], y, "mlp output");
    check_close(dxs[sz(r)], dx, "mlp dinp");
    check_close(dw1s[sz(r)], row_block(dw1, H, C, tp, r), "fc1 dw");
    check_close(dw2s[sz(r)], col_block(dw2, C, H, tp, r), "fc2 dw");
  }
}

template <class T>
void embedding_case(int tp) {
  CAPTURE(tp);
  const int B = 2, Tn = 5, C = 13, V = 37, Vp = 40, N = B * Tn;
  std::vector<std::int32_t> tok(sz(N));
  std::mt19937 gen(31);
  for (auto& t : tok) t = std::int32_t(gen() % V);
  tok[3] = tok[7];  // a repeated token: its gradient rows add up
  const auto wte = random_vec<T>(sz(Vp) * C, 32), wpe = random_vec<T>(sz(Tn + 2) * C, 33),
             dy = random_vec<T>(sz(N) * C, 34), dwte0 = random_vec<T>(wte.size(), 35),
             dwpe0 = random_vec<T>(wpe.size(), 36);
  std::vector<T> y(sz(N) * C), dwte = dwte0, dwpe = dwpe0;
  kc::encoder_forward(y.data(), tok.data(), wte.data(), wpe.data(), B, Tn, C);
  kc::encoder_backward(dwte.data(), dwpe.data(), dy.data(), tok.data(), B, Tn, C);
  std::vector<std::vector<T>> ys(sz(tp)), dwtes(sz(tp)), dwpes(sz(tp));
  on_ranks(tp, [&](int r, loom::comm::threads& g) {
    loom::context<cpu> c;
    const auto wl = row_block(wte, Vp, C, tp, r);
    ys[sz(r)].resize(sz(N) * C);
    dwtes[sz(r)] = row_block(dwte0, Vp, C, tp, r);
    dwpes[sz(r)] = dwpe0;
    lp::vocab_parallel_embedding_forward(c, ys[sz(r)].data(), tok.data(), wl.data(), wpe.data(), B, Tn, C, Vp, g);
    lp::vocab_parallel_embedding_backward(c, dwtes[sz(r)].data(), dwpes[sz(r)].data(), dy.data(),
                                          tok.data(), B, Tn, C, Vp, g);
  });
  for (int r = 0; r < tp; ++r) {
    CAPTURE(r);
    check_close(ys[sz(r)], y, "embedding output");
    CHECK(ys[sz(r)] == y);  // one non-zero row per token plus wpe: exact
    check_close(dwtes[sz(r)], row_block(dwte, Vp, C, tp, r), "dwte rows");
    check_close(dwpes[sz(r)], dwpe, "dwpe (replicated)");
  }
}

/// LM head (column-parallel with the vocab shard of wte) + vocab-parallel cross-entropy + head
/// backward, against the single-rank matmul + fused cross-entropy + matmul backward.
template <class T>
void head_crossentropy_case(int tp, int Vp) {
  CAPTURE(tp);
  CAPTURE(Vp);
  using A = kc::acc_t<T>;
  const int N = 9, C = 13, V = 37, Vl = Vp / tp;
  std::vector<std::int32_t> tgt(sz(N));
  std::mt19937 gen(41);
  for (auto& t : tgt) t = std::int32_t(gen() % V);
  tgt[2] = loom::kernels::ignore_index;
  tgt[4] = V - 1;  // the last real entry, next to the padding
  tgt[5] = 0;
  const auto x = random_vec<T>(sz(N) * C, 42), wte = random_vec<T>(sz(Vp) * C, 43, 2.0);
  const A scale = A(1) / A(N - 1);
  std::vector<T> logits(sz(N) * Vp), dx(sz(N) * C), dwte(wte.size(), T(0));
  std::vector<A> losses(sz(N));
  kc::matmul_forward(logits.data(), x.data(), wte.data(), static_cast<const T*>(nullptr), N, C, Vp);
  const A total = kc::crossentropy_forward_backward(logits.data(), losses.data(), tgt.data(), N, V, Vp, true, scale);
  kc::matmul_backward(dx.data(), dwte.data(), static_cast<T*>(nullptr), logits.data(), x.data(), wte.data(), N, C, Vp,
                      false);
  std::vector<std::vector<T>> dlogs(sz(tp)), dxs(sz(tp)), dwtes(sz(tp));
  std::vector<std::vector<A>> lss(sz(tp));
  std::vector<A> totals(sz(tp));
  on_ranks(tp, [&](int r, loom::comm::threads& g) {
    loom::context<cpu> c;
    const auto wl = row_block(wte, Vp, C, tp, r);
    std::vector<T> lg(sz(N) * Vl);
    std::vector<A> scratch(lp::vocab_parallel_crossentropy_scratch(N));
    lss[sz(r)].resize(sz(N));
    dxs[sz(r)].resize(sz(N) * C);
    dwtes[sz(r)].assign(wl.size(), T(0));
    lp::column_parallel_linear_forward(c, lg.data(), x.data(), wl.data(), static_cast<const T*>(nullptr), N, C, Vl, g);
    totals[sz(r)] = lp::vocab_parallel_crossentropy(c, lg.data(), lss[sz(r)].data(), tgt.data(),
                                                             scratch.data(), N, V, Vp, true, scale, g);
    dlogs[sz(r)] = lg;
    lp::column_parallel_linear_backward(c, dxs[sz(r)].data(), dwtes[sz(r)].data(),
                                        static_cast<T*>(nullptr), lg.data(), x.data(), wl.data(), N, C, Vl, g);
  });
  for (int r = 0; r < tp; ++r) {
    CAPTURE(r);
    CHECK(double(totals[sz(r)]) == doctest::Approx(double(total)).epsilon(tolerance<T>()));
    CHECK(totals[sz(r)] == totals[0]);
    check_close(lss[sz(r)], losses, "per-token losses");
    check_close(dlogs[sz(r)], col_block(logits, N, Vp, tp, r), "dlogits slice");
    check_close(dxs[sz(r)], dx, "dlnf (all-reduced)");
    check_close(dwtes[sz(r)], row_block(dwte, Vp, C, tp, r), "dwte rows (head)");
  }
}

}  // namespace

TEST_CASE_TEMPLATE("tensor parallel: column-parallel linear equals the single-rank linear", T, float, double) {
  column_parallel_case<T>(2);
  column_parallel_case<T>(4);
}

TEST_CASE_TEMPLATE("tensor parallel: row-parallel linear equals the single-rank linear", T, float, double) {
  row_parallel_case<T>(2);
  row_parallel_case<T>(4);
}

TEST_CASE_TEMPLATE("tensor parallel: f -> column -> gelu -> row -> g (the MLP) equals the single-rank MLP", T, float,
                   double) {
  mlp_case<T>(2);
  mlp_case<T>(4);
}

TEST_CASE_TEMPLATE("tensor parallel: vocab-parallel embedding equals the single-rank embedding", T, float, double) {
  embedding_case<T>(2);
  embedding_case<T>(4);
}

TEST_CASE_TEMPLATE("tensor parallel: LM head + vocab-parallel cross-entropy equal the single-rank head and loss", T,
                   float, double) {
  head_crossentropy_case<T>(2, 40);
  head_crossentropy_case<T>(4, 40);  // rank 3 owns [30, 40): 7 real columns and 3 padding
  head_crossentropy_case<T>(4, 64);  // rank 3 owns [48, 64): padding only; rank 2 [32, 48): 5 real
}

TEST_CASE("tensor parallel: the conjugate pairs f and g") {
  loom::comm::run_threads(3, [](loom::comm::threads& g) {
    std::vector<float> v{float(g.rank() + 1), 2.0f * float(g.rank())};
    lp::copy_to_tp_forward(std::span<float>(v), g);  // identity
    CHECK(v[0] == float(g.rank() + 1));
    lp::reduce_from_tp_backward(std::span<float>(v), g);  // identity
    CHECK(v[1] == 2.0f * float(g.rank()));
    lp::copy_to_tp_backward(std::span<float>(v), g);  // sum
    CHECK(v[0] == 6.0f);
    CHECK(v[1] == 6.0f);
    lp::reduce_from_tp_forward(std::span<float>(v), g);  // sum again
    CHECK(v[0] == 18.0f);
  });
  CHECK(lp::vocab_range::of(64, 4, 3).begin == 48);
  CHECK(lp::vocab_range::of(64, 4, 3).rows == 16);
}
