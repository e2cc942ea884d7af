#pragma once
/// \file Umbrella for loom::io: safetensors files, model weights, training checkpoints, and the
/// metrics sinks (TensorBoard event files, JSON lines, Chrome/Perfetto traces).
/// Uses nlohmann-json (part of loom::loom when found; Debian nlohmann-json3-dev).
#include <loom/io/checkpoint.hpp>
#include <loom/io/jsonl.hpp>
#include <loom/io/safetensors.hpp>
#include <loom/io/scalar.hpp>
#include <loom/io/tensorboard.hpp>
#include <loom/io/trace.hpp>
#include <loom/io/weights.hpp>
