#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <loom/io/tensorboard.hpp>

namespace fs = std::filesystem;

namespace {

// ---- An independent decoder, written from the format (not from the writer) -----------------

std::uint32_t crc32c_bitwise(const std::string& s) {  // bit by bit, no table
  std::uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char c : s) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc & 1u) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return crc ^ 0xFFFFFFFFu;
}
std::uint32_t masked(std::uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

std::uint64_t load_le(const std::string& s, std::size_t pos, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= std::uint64_t(static_cast<unsigned char>(s.at(pos + i))) << (8 * i);
  return v;
}

struct decoded_event {
  double wall_time = -1;
  std::int64_t step = 0;
  std::string file_version;
  std::vector<std::pair<std::string, float>> scalars;
};

struct pb_reader {
  const std::string& buf;
  std::size_t pos = 0;
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      REQUIRE(shift < 64);
      const auto b = static_cast<unsigned char>(buf.at(pos++));
      v |= std::uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
  }
  std::string bytes() {
    const auto n = varint();
    REQUIRE(pos + n <= buf.size());
    std::string s = buf.substr(pos, n);
    pos += n;
    return s;
  }
};

decoded_event decode_event(const std::string& data) {
  decoded_event e;
  pb_reader r{data};
  while (r.pos < data.size()) {
    const auto key = r.varint();
    const int field = int(key >> 3), wire = int(key & 7);
    if (field == 1 && wire == 1) {
      const std::uint64_t bits = load_le(data, r.pos, 8);
      std::memcpy(&e.wall_time, &bits, 8);
      r.pos += 8;
    } else if (field == 2 && wire == 0) {
      e.step = static_cast<std::int64_t>(r.varint());
    } else if (field == 3 && wire == 2) {
      e.file_version = r.bytes();
    } else if (field == 5 && wire == 2) {
      const std::string summary = r.bytes();
      pb_reader s{summary};
      while (s.pos < summary.size()) {
        REQUIRE(s.varint() == ((1u << 3) | 2u));  // Summary.value, length-delimited
        const std::string value = s.bytes();
        pb_reader v{value};
        std::string tag;
        float simple = std::nanf("");
        bool has_simple = false;
        while (v.pos < value.size()) {
          const auto vk = v.varint();
          if (vk == ((1u << 3) | 2u)) {
            tag = v.bytes();
          } else if (vk == ((2u << 3) | 5u)) {
            const auto bits = static_cast<std::uint32_t>(load_le(value, v.pos, 4));
            std::memcpy(&simple, &bits, 4);
            v.pos += 4;
            has_simple = true;
          } else {
            FAIL("unexpected field in Summary.Value: key " << vk);
          }
        }
        CHECK(has_simple);
        e.scalars.emplace_back(tag, simple);
      }
    } else {
      FAIL("unexpected field in Event: key " << key);
    }
  }
  return e;
}

/// Splits a TFRecord file, checking both masked CRCs of every record.
std::vector<decoded_event> read_events(const fs::path& p, bool* crc_ok = nullptr) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string file = ss.str();
  std::vector<decoded_event> out;
  std::size_t pos = 0;
  bool ok = true;
  while (pos < file.size()) {
    REQUIRE(pos + 12 <= file.size());
    const std::string len_bytes = file.substr(pos, 8);
    const auto len = load_le(file, pos, 8);
    ok = ok && masked(crc32c_bitwise(len_bytes)) == load_le(file, pos + 8, 4);
    REQUIRE(pos + 12 + len + 4 <= file.size());
    const std::string data = file.substr(pos + 12, len);
    ok = ok && masked(crc32c_bitwise(data)) == load_le(file, pos + 12 + len, 4);
    if (!ok && crc_ok) break;  // the caller expects corruption: report it, do not parse garbage
    out.push_back(decode_event(data));
    pos += 12 + len + 4;
  }
  if (crc_ok) *crc_ok = ok;
  else CHECK(ok);
  return out;
}

fs::path fresh_dir(const char* name) {
  static int counter = 0;
  auto d = fs::temp_directory_path() /
           ("loom_test_" + std::string(name) + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  fs::remove_all(d);
  return d;
}

fs::path only_file(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path());
  REQUIRE(files.size() == 1);
  return files[0];
}

}  // namespace

TEST_CASE("crc32c: RFC 3720 B.4 and the standard check value") {
  using loom::io::crc32c;
  CHECK(crc32c("123456789") == 0xE3069283u);
  CHECK(crc32c("") == 0u);
  CHECK(crc32c(std::string(32, '\0')) == 0x8A9136AAu);
  CHECK(crc32c(std::string(32, '\xff')) == 0x62A8AB43u);
  std::string inc(32, '\0');
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<char>(i);
  CHECK(crc32c(inc) == 0x46DD794Eu);
  // Continuation over a split equals the CRC of the whole, and agrees with the bitwise version.
  CHECK(crc32c("56789", crc32c("1234")) == 0xE3069283u);
  std::mt19937 rng(7);
  std::string junk(1237, '\0');
  for (auto& c : junk) c = static_cast<char>(rng());
  CHECK(crc32c(junk) == crc32c_bitwise(junk));
  static_assert(loom::io::crc32c("123456789") == 0xE3069283u);  // constexpr
  CHECK(loom::io::mask_crc(0) == 0xa282ead8u);
  CHECK(loom::io::mask_crc(0x12345678u) == masked(0x12345678u));
}

TEST_CASE("tensorboard_writer: file decodes independently with valid CRCs and exact values") {
  const auto dir = fresh_dir("tb");
  std::mt19937 rng(42);
  std::uniform_real_distribution<double> u(-5.0, 5.0);
  // A 200-byte tag makes the Value's length varint take two bytes.
  const std::string long_tag = "memory/" + std::string(193, 'x');
  std::vector<std::vector<double>> written;
  const std::vector<std::int64_t> steps = {0, 1, 127, 128, 300, 1ll << 40};
  {
    loom::io::tensorboard_writer tb(dir, {.flush_every = 3});
    CHECK(tb.path().filename().string().starts_with("events.out.tfevents."));
    for (std::int64_t step : steps) {
      std::vector<double> v = {u(rng), std::exp(u(rng)), u(rng) * 1e-4, u(rng) * 1e9};
      written.push_back(v);
      const loom::io::scalar s[] = {{"train/loss", v[0]}, {"train/lr", v[1]}, {"train/grad_norm", v[2]},
                                    {long_tag, v[3]}};
      tb.add_scalars(step, s, /*wall_time=*/1.7e9 + double(step));
    }
    tb.add_scalar("val/loss", std::numeric_limits<double>::quiet_NaN(), 7);
    tb.add_scalar("perf/inf", -std::numeric_limits<double>::infinity(), 8);
    CHECK(tb.records() == 1 + steps.size() + 2);
  }
  const auto file = only_file(dir);
  const auto ev = read_events(file);
  REQUIRE(ev.size() == 1 + steps.size() + 2);
  CHECK(ev[0].file_version == "brain.Event:2");
  CHECK(ev[0].scalars.empty());
  {  // Every TensorFlow-written event file starts with these 12 bytes: the 24-byte version
     // Event's length and its masked CRC (a widely quoted file signature, 0x224b7fa3).
    std::ifstream in(file, std::ios::binary);
    unsigned char head[12];
    in.read(reinterpret_cast<char*>(head), 12);
    const unsigned char expect[12] = {0x18, 0, 0, 0, 0, 0, 0, 0, 0xa3, 0x7f, 0x4b, 0x22};
    CHECK(std::memcmp(head, expect, 12) == 0);
  }
  CHECK(ev[0].wall_time > 1.6e9);  // "now", in Unix seconds
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const auto& e = ev[1 + i];
    CHECK(e.step == steps[i]);
    CHECK(e.wall_time == 1.7e9 + double(steps[i]));
    REQUIRE(e.scalars.size() == 4);
    CHECK(e.scalars[0].first == "train/loss");
    CHECK(e.scalars[3].first == long_tag);
    for (int k = 0; k < 4; ++k) CHECK(e.scalars[k].second == static_cast<float>(written[i][k]));
  }
  CHECK(ev[7].step == 7);
  CHECK(std::isnan(ev[7].scalars.at(0).second));
  CHECK(ev[8].scalars.at(0).second == -std::numeric_limits<float>::infinity());

  SUBCASE("a flipped byte fails the CRC check") {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    char c;
    f.seekg(40);
    f.get(c);
    f.seekp(40);
    f.put(static_cast<char>(c ^ 0x10));
    f.close();
    bool ok = true;
    (void)read_events(file, &ok);
    CHECK_FALSE(ok);
  }
  fs::remove_all(dir);
}

TEST_CASE("tensorboard_writer: records reach the file every flush_every records") {
  const auto dir = fresh_dir("tb_flush");
  loom::io::tensorboard_writer tb(dir, {.flush_every = 2});
  // The version record is flushed on open.
  CHECK(read_events(tb.path()).size() == 1);
  tb.add_scalar("a", 1.0, 1);
  CHECK(read_events(tb.path()).size() == 1);  // buffered
  tb.add_scalar("a", 2.0, 2);
  CHECK(read_events(tb.path()).size() == 3);  // second record since the last flush
  tb.add_scalar("a", 3.0, 3);
  tb.flush();
  const auto ev = read_events(tb.path());
  REQUIRE(ev.size() == 4);
  CHECK(ev[3].scalars.at(0).second == 3.0f);
  fs::remove_all(dir);
}

TEST_CASE("tensorboard_writer: never overwrites, reports an unusable directory") {
  const auto dir = fresh_dir("tb_excl");
  {
    loom::io::tensorboard_writer a(dir, {.filename_suffix = ".rank0"});
    loom::io::tensorboard_writer b(dir, {.filename_suffix = ".rank0"});  // same second, same name
    CHECK(a.path() != b.path());
    a.add_scalar("x", 1, 1);
    b.add_scalar("x", 2, 1);
  }
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    CHECK(e.path().filename().string().find(".rank0") != std::string::npos);
    CHECK(read_events(e.path()).size() == 2);
    ++n;
  }
  CHECK(n == 2);

  std::ofstream(dir / "plain_file") << "x";
  CHECK_THROWS_AS(loom::io::tensorboard_writer(dir / "plain_file" / "sub"), loom::input_error);
  fs::remove_all(dir);
}

TEST_CASE("tensorboard_writer: the Python decoder (tests/golden/read_tfevents.py) agrees") {
#ifdef LOOM_SOURCE_DIR
  const fs::path script = fs::path(LOOM_SOURCE_DIR) / "tests" / "golden" / "read_tfevents.py";
#else
  const fs::path script = fs::path(__FILE__).parent_path() / ".." / ".." / "golden" / "read_tfevents.py";
#endif
  if (!fs::exists(script) || std::system("python3 -c 'import json,struct' >/dev/null 2>&1") != 0) {
    MESSAGE("skipped: python3 or " << script << " not available");
    return;
  }
  const auto dir = fresh_dir("tb_py");
  std::vector<float> values;
  {
    loom::io::tensorboard_writer tb(dir);
    std::mt19937 rng(3);
    std::normal_distribution<double> g(0.0, 10.0);
    for (int step = 0; step < 50; ++step) {
      const double v = g(rng);
      values.push_back(static_cast<float>(v));
      const loom::io::scalar s[] = {{"train/loss", v}, {"train/步", -v}};
      tb.add_scalars(step * 10, s);
    }
  }
  const auto out = dir / "decoded.jsonl";
  const auto file = only_file(dir);
  const std::string cmd = "python3 '" + script.string() + "' '" + file.string() + "' > '" + out.string() + "'";
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::ifstream in(out);
  std::string line;
  std::vector<nlohmann::json> lines;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  REQUIRE(lines.size() == 51);
  CHECK(lines[0]["file_version"] == "brain.Event:2");
  for (int i = 0; i < 50; ++i) {
    const auto& e = lines[1 + i];
    CHECK(e["step"].get<std::int64_t>() == i * 10);
    CHECK(e["scalars"][0][0] == "train/loss");
    CHECK(e["scalars"][0][1].get<double>() == double(values[i]));  // float32 exactly
    CHECK(e["scalars"][1][0] == "train/步");
    CHECK(e["scalars"][1][1].get<double>() == double(-values[i]));
  }
  // The Python decoder rejects a corrupted file.
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(file) - 6));
    f.put('\x7f');
  }
  const std::string bad = "python3 '" + script.string() + "' '" + file.string() + "' >/dev/null 2>&1";
  CHECK(std::system(bad.c_str()) != 0);
  fs::remove_all(dir);
}
