#pragma once
/// \file io::scalar: one named number for a metrics sink (TensorBoard, JSON lines, console).
#include <string_view>

namespace loom::io {

/// A tagged scalar, e.g. {"train/loss", 3.21}. Tags use '/' to group (TensorBoard shows the part
/// before the first '/' as a section). The tag must stay alive for the duration of the call
/// that receives it; sinks copy what they keep.
struct scalar {
  std::string_view tag;
  double value = 0;
};

}  // namespace loom::io
