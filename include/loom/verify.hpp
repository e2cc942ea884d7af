#pragma once
/// \file loom/verify: checks that two policies compute the same thing (verify/compare.hpp).
#include <loom/verify/compare.hpp>
