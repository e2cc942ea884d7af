#pragma once
/// \file The recipe of an architecture (models/recipe.hpp: model configs name it, so it sits
/// below nn), under the name nn's users know.
#include <loom/models/recipe.hpp>
