#pragma once
/// \file loom::train::parallel_trainer<Model, Policy, B, T, Comm>: the trainer of any
/// layout<TP, PP> (tensor and pipeline parallel, data parallel over the remaining ranks),
/// which is train::basic_trainer (train/trainer.hpp), the one trainer of every layout.
#include <loom/train/trainer.hpp>
