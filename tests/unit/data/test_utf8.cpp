// UTF-8 well-formedness and the printable repair of byte-level text: the boundary cases of
// Unicode's table 3-7 by hand, and (with the text libraries) every verdict on random byte
// strings against utf8proc's decoder.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <string_view>

#include <loom/data/utf8.hpp>
#ifdef LOOM_TEST_TEXT
#include <utf8proc.h>
#endif

using loom::data::printable_utf8;
using loom::data::utf8_sequence_length;
using loom::data::valid_utf8;

namespace {
const std::string fffd = "\xEF\xBF\xBD";
}

TEST_CASE("utf8: sequence lengths at the edges of table 3-7") {
  struct row {
    std::string_view bytes;
    std::size_t length;
  };
  for (const row r : {row{"A", 1}, row{"\x7F", 1}, row{"\xC2\x80", 2}, row{"\xDF\xBF", 2}, row{"\xC0\x80", 0},
                      row{"\xC1\xBF", 0}, row{"\xE0\xA0\x80", 3}, row{"\xE0\x9F\xBF", 0}, row{"\xED\x9F\xBF", 3},
                      row{"\xED\xA0\x80", 0} /* U+D800 */, row{"\xEF\xBF\xBF", 3}, row{"\xF0\x90\x80\x80", 4},
                      row{"\xF0\x8F\xBF\xBF", 0}, row{"\xF4\x8F\xBF\xBF", 4}, row{"\xF4\x90\x80\x80", 0},
                      row{"\xF5\x80\x80\x80", 0}, row{"\xE2\x82", 0} /* cut short */, row{"\x80", 0},
                      row{"\xE4\xB8\xAD", 3} /* 中 */, row{"\xE2\x28\xA1", 0}}) {
    INFO(std::string(r.bytes));
    CHECK(utf8_sequence_length(r.bytes, 0) == r.length);
  }
  CHECK(valid_utf8("To be, or not to be: \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80"));
  CHECK_FALSE(valid_utf8("ok \xFF"));
  CHECK(valid_utf8(""));
}

TEST_CASE("utf8: printable_utf8 keeps well-formed text and turns each bad or control run into one U+FFFD") {
  const std::string good = "caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80";
  CHECK(printable_utf8(good) == good);
  CHECK(printable_utf8("a\xFF\xFE" "b") == "a" + fffd + "b");
  CHECK(printable_utf8("\xE2\x82") == fffd);                       // cut short at the end
  CHECK(printable_utf8("\xE2\x82" "x\xC3\xA9") == fffd + "x\xC3\xA9");  // cut short before ASCII
  CHECK(printable_utf8("\xED\xA0\x80") == fffd);                   // a surrogate: one run of three
  CHECK(printable_utf8("\x80\xC3\xA9\x80") == fffd + "\xC3\xA9" + fffd);
  CHECK(printable_utf8("a\x1b[2Jb\x04\x7F") == "a" + fffd + "[2Jb" + fffd);  // ESC, EOT+DEL: one run
  CHECK(printable_utf8("line\n\tnext") == "line\n\tnext");
}

TEST_CASE("utf8: random bytes: the repair is well-formed, idempotent, and keeps every valid sequence") {
  std::mt19937_64 rng(20261203);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string s(std::size_t(rng() % 23), '\0');
    for (auto& c : s) {  // mostly high bytes, so sequences are started, cut and mixed
      const auto r = rng();
      c = char(r % 4 == 0 ? 0x20 + r % 90 : 0x80 + (r >> 8) % 0x80);
    }
    const std::string out = printable_utf8(s);
    CHECK(valid_utf8(out));
    CHECK(printable_utf8(out) == out);
    if (valid_utf8(s)) CHECK(out == s);
#ifdef LOOM_TEST_TEXT
    bool utf8proc_valid = true;  // utf8proc's decoder as the independent reference
    const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
    for (std::size_t i = 0; i < s.size();) {
      utf8proc_int32_t cp;
      const auto n = utf8proc_iterate(p + i, utf8proc_ssize_t(s.size() - i), &cp);
      if (n <= 0) {
        utf8proc_valid = false;
        break;
      }
      i += std::size_t(n);
    }
    INFO(trial);
    CHECK(valid_utf8(s) == utf8proc_valid);
#endif
  }
}
