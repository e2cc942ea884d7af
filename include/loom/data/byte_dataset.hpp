#pragma once
/// \file Byte-level text data: a UTF-8 file read as token ids 0..255, split into a training
/// and a validation part.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/data/utf8.hpp>

namespace loom::data {

/// A text file as byte tokens (vocabulary 256), split at `1 - val_fraction` of its length:
/// the first part trains, the last part validates (the split point is a byte offset).
///
/// Errors (loom::input_error, one line naming the problem and the fix): the file is missing,
/// unreadable, empty, binary (contains NUL bytes or is not valid UTF-8), or either split is
/// shorter than one window of `window` tokens.
class byte_dataset {
 public:
  byte_dataset(const std::filesystem::path& path, std::size_t window, double val_fraction = 0.1) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::exists(path, ec))
      throw input_error("data file '" + path.string() + "' does not exist; pass an existing UTF-8 text file, or the PREFIX of a "
                        "prepare_data dataset (PREFIX.bin and PREFIX.idx), with --data");
    if (fs::is_directory(path, ec))
      throw input_error("data path '" + path.string() + "' is a directory; pass a UTF-8 text file with --data");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw input_error("cannot read data file '" + path.string() + "'; check its permissions");
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (bytes.empty()) throw input_error("data file '" + path.string() + "' is empty; pass a non-empty UTF-8 text file");
    if (bytes.find('\0') != std::string::npos || !valid_utf8(bytes))
      throw input_error("data file '" + path.string() +
                        "' is not UTF-8 text (it contains NUL bytes or invalid UTF-8); pass a text file, "
                        "or clean it first with prepare_data");
    if (!(val_fraction > 0 && val_fraction < 1))
      throw input_error("the validation fraction must be in (0, 1); pass e.g. --val-fraction 0.1");
    const std::size_t split = std::size_t(double(bytes.size()) * (1.0 - val_fraction));
    train_.assign(bytes.begin(), bytes.begin() + split);
    val_.assign(bytes.begin() + split, bytes.end());
    if (val_.size() < window || train_.size() < window)
      throw input_error("data file '" + path.string() + "' has " + std::to_string(bytes.size()) +
                        " bytes, too short for sequences of " + std::to_string(window - 1) +
                        " tokens after the train/validation split; use a longer text or a shorter --seq-len");
  }

  static constexpr int vocab = 256;
  const std::vector<std::uint8_t>& train() const noexcept { return train_; }
  const std::vector<std::uint8_t>& validation() const noexcept { return val_; }

 private:
  std::vector<std::uint8_t> train_, val_;
};

}  // namespace loom::data
