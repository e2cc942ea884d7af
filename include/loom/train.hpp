#pragma once
/// \file Umbrella for loom::train: the trainers (train::trainer for one replica per rank,
/// train::trainer for tensor/pipeline layouts), dynamic loss scaling, step metrics and
/// the console.
/// Not included here: loom/train/ascend_phase_timer.hpp (Ascend; CMake target loom::ascend).
#include <loom/train/console.hpp>
#include <loom/precision/loss_scaler.hpp>
#include <loom/train/metrics.hpp>
#include <loom/train/trainer.hpp>
#include <loom/train/trainer.hpp>
