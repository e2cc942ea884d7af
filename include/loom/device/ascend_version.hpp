#pragma once
/// \file loom's CANN compatibility statement and the check of a version against it
/// (examples/doctor reports it; train_gpt --device ascend refuses a runtime outside it).
#include <regex>
#include <string>

namespace loom::device {

/// The CANN versions loom is compiled and tested against. Its declarations restate CANN 8.1.RC1's
/// headers (reference ascend-api.md §1-§3) and CI compiles them against CANN 9.0.0's open-source
/// headers; nothing older than 8.1 has the operators loom calls (aclnnApplyAdamWV2,
/// aclnnCrossEntropyLoss on Atlas A2/A3), and HcclCommConfig before 8.1 is smaller than the one
/// loom fills (its split() would fail). Newer majors are untested.
inline constexpr const char* cann_compatibility = "CANN 8.1.RC1 to 9.0.x (8.x from 8.1; 9.0)";

/// Whether version text ("8.1.RC1", "9.0.0", "8.5.0.alpha001 ...": ascend_runtime::cann_version)
/// is inside cann_compatibility. Returns false, with the reason in `why`, for a version outside it
/// and for text that does not start with <major>.<minor>.
inline bool cann_supported(const std::string& text, std::string* why) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(R"(^\s*(\d+)\.(\d+))"))) {
    *why = "cannot read a version from \"" + text + "\"";
    return false;
  }
  const int major = std::stoi(m[1]), minor = std::stoi(m[2]);
  if (major == 8 && minor >= 1) return true;
  if (major == 9 && minor == 0) return true;
  *why = "CANN " + std::to_string(major) + "." + std::to_string(minor) + " is outside loom's statement (" +
         cann_compatibility + ")";
  return false;
}

}  // namespace loom::device
