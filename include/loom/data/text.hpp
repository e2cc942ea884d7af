#pragma once
/// \file Umbrella for loom::data::text: cleaning, deduplication, filtering, tokenization.
/// Needs the Debian libraries utf8proc, xxhash and SentencePiece at link time
/// (-lutf8proc -lxxhash -lsentencepiece -lsentencepiece_train; CMake target loom::text),
/// so it is not part of the header-only core umbrella.
#include <loom/data/text/clean.hpp>
#include <loom/data/text/dedup.hpp>
#include <loom/data/text/filter.hpp>
#include <loom/data/text/tokenizer.hpp>
