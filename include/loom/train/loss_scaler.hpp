#pragma once
/// \file The loss scalers under their train:: names (they live in precision/loss_scaler.hpp:
/// dynamic loss scaling is part of a precision policy's contract, and io/ reads their state
/// without depending on train/).
#include <loom/precision/loss_scaler.hpp>

namespace loom::train {
using precision::dynamic_loss_scaler;
using precision::loss_scaler;
using precision::loss_scaler_config;
using precision::loss_scaler_state;
using precision::no_loss_scaler;
}  // namespace loom::train
