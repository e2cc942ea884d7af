#pragma once
/// \file Umbrella for loom::data: byte-level text, Megatron-compatible indexed datasets, window
/// samplers, the background loader and the trainer's batch sources.
/// Not included here: loom/data/text.hpp (cleaning, deduplication and tokenization; needs
/// SentencePiece, utf8proc and xxHash at link time: CMake target loom::text).
#include <loom/data/byte_dataset.hpp>
#include <loom/data/indexed_dataset.hpp>
#include <loom/data/loader.hpp>
#include <loom/data/sampler.hpp>
#include <loom/data/source.hpp>
#include <loom/data/utf8.hpp>
