#pragma once
/// \file Umbrella for loom::train: the trainer (one optimizer step over a global batch), dynamic
/// loss scaling, step metrics and the console.
#include <loom/train/console.hpp>
#include <loom/train/loss_scaler.hpp>
#include <loom/train/metrics.hpp>
#include <loom/train/trainer.hpp>
