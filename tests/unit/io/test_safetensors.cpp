// Tests of loom/io/safetensors.hpp: round trips, a file written by Python, every corrupt-file
// case, and atomic writes that never damage an existing file.
#include <doctest/doctest.h>

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <loom/io/safetensors.hpp>

#include "../../support/temp_dir.hpp"

namespace fs = std::filesystem;
using loom::io::safetensors_reader;
using loom::io::safetensors_writer;

namespace {

fs::path source_dir() {
#ifdef LOOM_SOURCE_DIR
  return fs::path(LOOM_SOURCE_DIR);
#else
  return fs::current_path();
#endif
}

using loom_test::temp_dir;

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// 8-byte little-endian length + header + data; `length` overrides the length field.
std::string safetensors_bytes(const std::string& header, const std::string& data,
                              std::uint64_t length = std::numeric_limits<std::uint64_t>::max()) {
  if (length == std::numeric_limits<std::uint64_t>::max()) length = header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return out + header + data;
}

/// what() of the input_error opening `p` throws, or "" when it opens fine.
std::string open_error(const fs::path& p) {
  try {
    safetensors_reader r(p);
  } catch (const loom::input_error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

template <class T>
std::vector<T> random_nonzero(std::size_t n, std::mt19937_64& rng) {
  std::vector<T> v(n);
  for (auto& x : v) {
    do {
      if constexpr (std::is_floating_point_v<T>) {
        x = static_cast<T>(std::uniform_real_distribution<double>(-3.0, 3.0)(rng));
      } else {
        using D = std::conditional_t<(sizeof(T) < 2), int, T>;  // no 8-bit distributions
        x = static_cast<T>(std::uniform_int_distribution<D>(std::numeric_limits<T>::min(),
                                                            std::numeric_limits<T>::max())(rng));
      }
    } while (x == T(0));
  }
  return v;
}

}  // namespace

TEST_CASE("safetensors: round trip of every writable dtype, scalar and empty tensors") {
  temp_dir dir;
  std::mt19937_64 rng(12345);
  const auto f32 = random_nonzero<float>(3 * 5 * 7, rng);
  const auto f64 = random_nonzero<double>(2 * 3, rng);
  const auto i32 = random_nonzero<std::int32_t>(11, rng);
  const auto i64 = random_nonzero<std::int64_t>(4 * 2, rng);
  const auto u16 = random_nonzero<std::uint16_t>(9, rng);
  const auto u8 = random_nonzero<std::uint8_t>(13, rng);
  const auto i8 = random_nonzero<std::int8_t>(5, rng);
  const auto i16 = random_nonzero<std::int16_t>(3, rng);
  const auto u32 = random_nonzero<std::uint32_t>(3, rng);
  const auto u64 = random_nonzero<std::uint64_t>(3, rng);
  const std::vector<std::uint16_t> bf16_bits = {0x3f80, 0xc049, 0x3dcd};  // 1, -3.140625, 0.10009765625
  const std::vector<double> scalar = {-0.75};

  safetensors_writer w;
  w.add("u8", {13}, u8);  // 1-byte first: the writer must still align the 8-byte tensors
  w.add("w.f32", {3, 5, 7}, f32);
  w.add("f64", {2, 3}, std::span<const double>(f64));
  w.add("i32", {11}, i32);
  w.add("i64", {4, 2}, i64);
  w.add("u16", {9}, u16);
  w.add("i8", {5}, i8);
  w.add("i16", {3}, i16);
  w.add("u32", {3}, u32);
  w.add("u64", {3}, u64);
  w.add_bytes("bf16", "BF16", {3}, std::as_bytes(std::span(bf16_bits)));
  w.add("scalar", {}, scalar);
  w.add("empty", {0, 3}, std::vector<float>{});
  w.set_metadata("step", "7");
  w.set_metadata("model", "tiny");
  w.set_metadata("step", "8");  // replaces
  CHECK(w.size() == 13);
  const fs::path p = dir / "round.safetensors";
  w.write(p);

  const std::string raw = read_bytes(p);
  std::uint64_t header_len = 0;
  std::memcpy(&header_len, raw.data(), 8);
  CHECK(header_len % 8 == 0);
  CHECK(raw[8] == '{');

  safetensors_reader r(p);
  CHECK(r.path() == p);
  REQUIRE(r.tensors().size() == 13);
  for (std::size_t i = 0; i < r.tensors().size(); ++i) {
    const auto& t = r.tensors()[i];
    CHECK_MESSAGE(t.begin % loom::io::detail::dtype_size(t.dtype) == 0, t.name);
    if (i > 0) CHECK(r.tensors()[i - 1].end == t.begin);
  }
  CHECK(r.metadata() == std::map<std::string, std::string>{{"step", "8"}, {"model", "tiny"}});
  CHECK(r.has("w.f32"));
  CHECK_FALSE(r.has("w"));
  CHECK(r.info("w.f32").dtype == "F32");
  CHECK(r.info("w.f32").shape == std::vector<std::int64_t>{3, 5, 7});
  CHECK(r.info("w.f32").numel() == 105);
  CHECK(r.info("w.f32").nbytes() == 420);

  CHECK(r.read<float>("w.f32") == f32);
  CHECK(r.read<double>("f64") == f64);
  CHECK(r.read<std::int32_t>("i32") == i32);
  CHECK(r.read<std::int64_t>("i64") == i64);
  CHECK(r.read<std::uint16_t>("u16") == u16);
  CHECK(r.read<std::uint8_t>("u8") == u8);
  CHECK(r.read<std::int8_t>("i8") == i8);
  CHECK(r.read<std::int16_t>("i16") == i16);
  CHECK(r.read<std::uint32_t>("u32") == u32);
  CHECK(r.read<std::uint64_t>("u64") == u64);
  CHECK(r.read<float>("bf16") == std::vector<float>{1.0f, -3.140625f, 0.10009765625f});
  CHECK(r.info("scalar").shape.empty());
  CHECK(r.read<double>("scalar") == scalar);
  CHECK(r.info("empty").numel() == 0);
  CHECK(r.read<float>("empty").empty());

  // Floating conversions: F32 -> double is exact, F64 -> float rounds to nearest.
  const auto f32_as_f64 = r.read<double>("w.f32");
  const auto f64_as_f32 = r.read<float>("f64");
  for (std::size_t i = 0; i < f32.size(); ++i) CHECK(f32_as_f64[i] == static_cast<double>(f32[i]));
  for (std::size_t i = 0; i < f64.size(); ++i) CHECK(f64_as_f32[i] == static_cast<float>(f64[i]));

  std::vector<std::int64_t> into(8, -1);
  r.read_into("i64", std::span(into));
  CHECK(into == i64);

  // A moved-from reader's mapping lives on in the new one.
  safetensors_reader moved = std::move(r);
  CHECK(moved.read<std::int32_t>("i32") == i32);
  CHECK(std::memcmp(moved.bytes("i32").data(), i32.data(), i32.size() * 4) == 0);
}

TEST_CASE("safetensors: read errors name the tensor, the problem and the fix") {
  temp_dir dir;
  safetensors_writer w;
  w.add("ids", {2, 2}, std::vector<std::int32_t>{1, 2, 3, 4});
  w.add("x", {3}, std::vector<float>{1.f, 2.f, 3.f});
  const std::vector<std::uint8_t> fp8 = {1, 2};
  w.add_bytes("fp8", "F8_E4M3", {2}, std::as_bytes(std::span(fp8)));
  const fs::path p = dir / "e.safetensors";
  w.write(p);
  safetensors_reader r(p);

  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const loom::input_error& e) {
      return e.what();
    }
    return "";
  };
  std::string m = message([&] { (void)r.info("nope"); });
  CHECK(contains(m, "no tensor 'nope'"));
  CHECK(contains(m, "ids, x"));
  CHECK(contains(m, p.string()));
  m = message([&] { (void)r.read<float>("ids"); });
  CHECK(contains(m, "dtype I32"));
  m = message([&] { (void)r.read<std::int64_t>("ids"); });
  CHECK(contains(m, "has dtype I32 but was read as I64"));
  m = message([&] { (void)r.read<std::int32_t>("x"); });
  CHECK(contains(m, "has dtype F32 but was read as I32"));
  m = message([&] { (void)r.read<float>("fp8"); });
  CHECK(contains(m, "dtype F8_E4M3"));
  std::vector<float> three(3), two(2);
  CHECK_NOTHROW(r.read_into("x", std::span(three)));
  CHECK(three == std::vector<float>{1.f, 2.f, 3.f});
  m = message([&] { r.read_into("x", std::span(two)); });
  CHECK(contains(m, "has 3 elements (shape [3]) but the destination holds 2"));
  CHECK(r.bytes("fp8").size() == 2);
}

TEST_CASE("safetensors: reads a file written by Python (unpadded, unaligned, sorted keys)") {
  // tests/golden/make_io_fixture.py; F16 rounded by numpy, BF16 by torch.
  safetensors_reader r(source_dir() / "tests/golden/io_fixture.safetensors");
  std::vector<std::string> names;
  for (const auto& t : r.tensors()) names.push_back(t.name);
  CHECK(names == std::vector<std::string>{"u8", "f16", "i64", "bf16", "f32", "empty", "i32",
                                          "scalar", "u16", "f64"});
  CHECK(r.metadata().at("note") == "non-ASCII \xc3\xbc" "n\xc3\xaf" "c\xc3\xb6" "de");
  CHECK(r.metadata().at("writer") == "tests/golden/make_io_fixture.py");

  CHECK(r.info("f16").shape == std::vector<std::int64_t>{2, 4});
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> f16_expected = {1.0f,     -2.5f, 65504.0f, 6.103515625e-05f,
                                           5.960464477539063e-08f, -0.0f, inf, 0.333251953125f};
  const auto f16 = r.read<float>("f16");
  CHECK(f16 == f16_expected);
  CHECK(std::signbit(f16[5]));
  const auto f16d = r.read<double>("f16");
  for (std::size_t i = 0; i < f16d.size(); ++i) CHECK(f16d[i] == static_cast<double>(f16_expected[i]));

  const auto bf16 = r.read<float>("bf16");
  CHECK(bf16 == std::vector<float>{1.0f, -3.140625f, 0.10009765625f, 9.183549615799121e-41f, -inf});
  CHECK(r.read<float>("f32") == std::vector<float>{0.1f, -1e-30f, 3.4028234663852886e38f});
  CHECK(r.read<double>("f64") == std::vector<double>{3.141592653589793, -1e-300});
  CHECK(r.info("f64").shape == std::vector<std::int64_t>{2, 1});
  CHECK(r.read<std::int32_t>("i32") ==
        std::vector<std::int32_t>{std::numeric_limits<std::int32_t>::min(), 7,
                                  std::numeric_limits<std::int32_t>::max()});
  CHECK(r.info("i32").shape == std::vector<std::int64_t>{1, 3});
  CHECK(r.read<std::int64_t>("i64") ==
        std::vector<std::int64_t>{std::numeric_limits<std::int64_t>::min(), 1,
                                  (std::int64_t{1} << 62) + 1});
  CHECK(r.read<std::uint8_t>("u8") == std::vector<std::uint8_t>{0, 200, 255});
  CHECK(r.read<std::uint16_t>("u16") == std::vector<std::uint16_t>{65535, 1, 300});
  CHECK(r.info("scalar").shape.empty());
  CHECK(r.read<double>("scalar") == std::vector<double>{2.5});
  CHECK(r.info("empty").shape == std::vector<std::int64_t>{0, 3});
  CHECK(r.read<float>("empty").empty());
}

TEST_CASE("safetensors: every corrupt file raises input_error naming file, problem and fix") {
  temp_dir dir;
  const std::string ok_entry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string eight(8, '\x01');
  struct bad_case {
    const char* label;
    std::string bytes;
    const char* expect;  // a part of what() naming the problem
  };
  const std::vector<bad_case> cases = {
      {"empty file", "", "0 bytes long, shorter than the 8-byte header length"},
      {"five bytes", "abcde", "5 bytes long"},
      {"length beyond file", safetensors_bytes("{" + ok_entry + "}", eight, 1000),
       "header length field says 1000 bytes but only"},
      {"huge length", safetensors_bytes("{}", "", std::uint64_t{1} << 63), "header length field says"},
      {"invalid JSON", safetensors_bytes(R"({"a": {"dtype": )", ""), "not valid JSON"},
      {"invalid UTF-8", safetensors_bytes("{\"\xff\xfe\":{}}", ""), "not valid JSON"},
      {"trailing garbage in header", safetensors_bytes("{" + ok_entry + "}x", eight), "not valid JSON"},
      {"header is an array", safetensors_bytes("[1, 2]", ""), "JSON array, not an object"},
      {"entry not an object", safetensors_bytes(R"({"a":3})", ""), "tensor 'a' is a JSON number"},
      {"unknown dtype", safetensors_bytes(R"({"a":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})",
                                          std::string(16, 'x')),
       "unknown dtype \"F128\""},
      {"dtype not a string", safetensors_bytes(R"({"a":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})",
                                               "xxxx"),
       "\"dtype\" is not a string"},
      {"missing shape", safetensors_bytes(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", eight),
       "tensor 'a' has no \"shape\""},
      {"missing offsets", safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2]}})", eight),
       "has no \"data_offsets\""},
      {"negative dimension", safetensors_bytes(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})",
                                               eight),
       "non-negative integer"},
      {"fractional dimension",
       safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", eight),
       "non-negative integer"},
      {"offsets not integers",
       safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0.0,8]}})", eight),
       "not a pair of non-negative integers"},
      {"three offsets", safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}})", eight),
       "not a pair of non-negative integers"},
      {"reversed offsets", safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", eight),
       "end before they begin"},
      {"offsets out of range",
       safetensors_bytes(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", eight),
       "run past the end of the 8-byte data section"},
      {"size does not match dtype*shape",
       safetensors_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight),
       "needs 12 bytes but its data_offsets [0, 8] span 8"},
      {"F64 sized as F32", safetensors_bytes(R"({"a":{"dtype":"F64","shape":[2],"data_offsets":[0,8]}})", eight),
       "needs 16 bytes"},
      {"overflowing shape",
       safetensors_bytes(
           R"({"a":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904],"data_offsets":[0,8]}})",
           eight),
       "needs an overflowing number of bytes"},
      {"overlap",
       safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                         std::string(12, 'x')),
       "tensors 'a' and 'b' overlap"},
      {"hole", safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                 std::string(12, 'x')),
       "data bytes [0, 4) belong to no tensor"},
      {"trailing data", safetensors_bytes("{" + ok_entry + "}", std::string(12, 'x')),
       "trailing bytes after the last tensor"},
      {"duplicate key",
       safetensors_bytes("{" + ok_entry + "," + ok_entry + "}", eight), "lists the key 'a' more than once"},
      {"metadata not an object", safetensors_bytes(R"({"__metadata__":[1],)" + ok_entry + "}", eight),
       "\"__metadata__\" is not an object"},
      {"metadata value not a string",
       safetensors_bytes(R"({"__metadata__":{"step":7},)" + ok_entry + "}", eight),
       "value of 'step' is a JSON number, not a string"},
  };
  // The baseline of the cases above is valid: only the stated defect makes them fail.
  const fs::path good = dir / "good.safetensors";
  write_bytes(good, safetensors_bytes("{" + ok_entry + "}", eight));
  CHECK(open_error(good).empty());
  write_bytes(good, safetensors_bytes("{" + ok_entry + "}   ", eight));  // padding
  CHECK(open_error(good).empty());

  for (const auto& c : cases) {
    CAPTURE(c.label);
    const fs::path p = dir / (std::string("bad_") + std::to_string(&c - cases.data()) + ".safetensors");
    write_bytes(p, c.bytes);
    const std::string m = open_error(p);
    CAPTURE(m);
    CHECK(contains(m, c.expect));
    CHECK(contains(m, p.string()));  // names the file
    CHECK(contains(m, "; "));         // "<problem>; <fix>"
  }

  std::string m = open_error(dir / "missing.safetensors");
  CHECK(contains(m, "cannot open"));
  CHECK(contains(m, "No such file or directory"));
  m = open_error(dir.path);
  CHECK(contains(m, "not a regular file"));
}

TEST_CASE("safetensors: writer rejects bad tensors before writing anything") {
  safetensors_writer w;
  const std::vector<float> six(6, 1.5f);
  w.add("a", {2, 3}, six);
  CHECK_THROWS_WITH_AS(w.add("a", {6}, six), doctest::Contains("already added"), loom::input_error);
  CHECK_THROWS_WITH_AS(w.add("__metadata__", {6}, six), doctest::Contains("reserved"), loom::input_error);
  CHECK_THROWS_WITH_AS(w.add("", {6}, six), doctest::Contains("reserved or empty"), loom::input_error);
  CHECK_THROWS_WITH_AS(w.add("b", {2, 2}, six), doctest::Contains("needs 16 bytes of data but got 24"),
                       loom::input_error);
  CHECK_THROWS_WITH_AS(w.add("b", {-2, -3}, six), doctest::Contains("invalid shape [-2, -3]"),
                       loom::input_error);
  CHECK_THROWS_WITH_AS(w.add_bytes("b", "F12", {1}, std::as_bytes(std::span(six))),
                       doctest::Contains("unknown dtype \"F12\""), loom::input_error);
  CHECK_THROWS_WITH_AS(w.add("bad\xff", {6}, six), doctest::Contains("not valid UTF-8"), loom::input_error);
  CHECK_THROWS_WITH_AS(w.set_metadata("k", "\xc3"), doctest::Contains("not valid UTF-8"), loom::input_error);
  CHECK(w.size() == 1);
}

TEST_CASE("safetensors: a write removes the temp files of killed writers, not of live ones") {
  temp_dir dir;
  const fs::path p = dir / "w.safetensors";
  // a writer that died between creating its temp file and the rename (a child that has exited
  // and been reaped: its pid is free), and one that is alive (our parent)
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  REQUIRE(dead > 0);
  int status = 0;
  ::waitpid(dead, &status, 0);
  const fs::path stale = p.string() + ".tmp." + std::to_string(dead);
  const fs::path live = p.string() + ".tmp." + std::to_string(::getppid());
  const fs::path other = dir / "x.safetensors.tmp.1";  // another file's: not ours to touch
  write_bytes(stale, "half a file");
  write_bytes(live, "being written");
  write_bytes(other, "x");
  safetensors_writer w;
  const std::vector<float> v = {1.5f, -2.f};
  w.add("x", {2}, v);
  w.write(p);
  CHECK_FALSE(fs::exists(stale));
  CHECK(fs::exists(live));
  CHECK(fs::exists(other));
  CHECK(safetensors_reader(p).info("x").shape == std::vector<std::int64_t>{2});
}

TEST_CASE("safetensors: a failed write leaves the existing file intact and no temp file") {
  temp_dir dir;
  const fs::path p = dir / "ckpt.safetensors";
  const std::vector<float> v1 = {1.f, 2.f, 3.f};
  safetensors_writer w1;
  w1.add("x", {3}, v1);
  w1.write(p);
  const std::string original = read_bytes(p);

  std::mt19937_64 rng(7);
  safetensors_writer w2;
  w2.add("x", {64, 256}, random_nonzero<float>(64 * 256, rng));  // 64 KiB

  auto leftovers = [&] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir.path))
      n += contains(e.path().filename().string(), ".tmp.");
    return n;
  };

  SUBCASE("directory missing") {
    const fs::path q = dir / "no_such_dir" / "ckpt.safetensors";
    CHECK_THROWS_WITH_AS(w2.write(q), doctest::Contains("no_such_dir' exists and is writable"),
                         loom::input_error);
    CHECK_THROWS_WITH_AS(w2.write(q), doctest::Contains("No such file or directory"), loom::input_error);
    CHECK_FALSE(fs::exists(q.parent_path()));
  }
  SUBCASE("temp file cannot be created") {
    const fs::path blocker = p.string() + ".tmp." + std::to_string(::getpid());
    fs::create_directory(blocker);  // open(O_WRONLY) on a directory fails with EISDIR
    CHECK_THROWS_AS(w2.write(p), loom::input_error);
    fs::remove(blocker);
  }
  SUBCASE("rename fails: the target is a non-empty directory") {
    const fs::path d = dir / "a_dir.safetensors";
    fs::create_directory(d);
    write_bytes(d / "keep", "x");
    try {
      w2.write(d);
      FAIL("write over a non-empty directory did not throw");
    } catch (const loom::input_error&) {
      FAIL("rename failure must be loom::error, not input_error");
    } catch (const loom::error& e) {
      CHECK(contains(e.what(), "renaming"));
      CHECK(contains(e.what(), "left unchanged"));
    }
    CHECK(read_bytes(d / "keep") == "x");
  }
  SUBCASE("disk full in the middle of the data (RLIMIT_FSIZE)") {
    // The 4 KiB file-size limit makes write(2) fail with EFBIG partway through the 64 KiB.
    struct rlimit old {};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
    auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = old;
    small.rlim_cur = 4096;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    std::string what;
    bool input = false;
    try {
      w2.write(p);
    } catch (const loom::input_error& e) {
      input = true;
      what = e.what();
    } catch (const loom::error& e) {
      what = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &old);
    ::signal(SIGXFSZ, old_handler);
    CHECK_FALSE(input);
    CHECK(contains(what, "writing"));
    CHECK(contains(what, "File too large"));
    CHECK(contains(what, "was left unchanged"));
  }

  CHECK(read_bytes(p) == original);
  CHECK(safetensors_reader(p).read<float>("x") == v1);
  CHECK(leftovers() == 0);

  // And a successful write replaces it.
  w2.write(p);
  CHECK(safetensors_reader(p).info("x").shape == std::vector<std::int64_t>{64, 256});
  CHECK(leftovers() == 0);
}
