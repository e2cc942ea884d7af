// expect: 1F1B with fewer micro-batches than pipeline stages
// M < PP is a *warning* (pipeline_fills returns false and the compiler prints a deprecation
// warning naming the bubble); the schedule stays correct for any M >= 1. This test promotes that
// warning to an error to prove it is printed: 2 micro-batches on 4 stages warn, 4 on 4 do not.
#pragma GCC diagnostic error "-Wdeprecated-declarations"  // before the include: the warning points into it
#include <loom/parallel/schedule.hpp>

#ifdef LOOM_SHOULD_FAIL
constexpr bool fills = loom::parallel::pipeline_fills<4, 2>();
#else
constexpr bool fills = loom::parallel::pipeline_fills<4, 4>();
#endif

int main() { return fills ? 0 : 1; }
