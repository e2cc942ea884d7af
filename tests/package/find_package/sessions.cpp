// A user's program on loom::sessions: chooses a compiled instance by name and trains two steps
// of char_tiny on one rank; the loss must fall from about ln(256).
#include <loom/train/session.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  const auto* i = loom::train::find_session(loom::train::compiled_sessions(), "char_tiny", "fp32", 1, 1, "cpu", "fused");
  if (!i) return 1;
  loom::train::session_args a;
  a.cfg.schedule = {1e-2, 1e-3, 0, 10};
  auto s = i->make(a, loom::train::world_ref::none());
  std::vector<std::int32_t> w(s->windows_per_step() * s->window());
  for (std::size_t k = 0; k < w.size(); ++k) w[k] = std::int32_t(k % 7 + 97);  // "abcdefg..."
  const double first = s->step(w).loss;
  double last = first;
  for (int k = 0; k < 5; ++k) last = s->step(w).loss;
  std::printf("char_tiny: loss %.4f -> %.4f\n", first, last);
  return std::abs(first - std::log(256.0)) < 0.5 && last < first ? 0 : 1;
}
