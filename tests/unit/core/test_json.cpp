// loom::json_integer: a JSON number becomes an integer of type T only when it is an integer in
// T's range (nlohmann's get<int> on 1e63 is a float-to-int conversion out of range: undefined).
// loom::parse_json: nesting deeper than json_max_depth is refused before nlohmann builds it.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include <loom/core/error.hpp>
#include <loom/core/json.hpp>

using loom::json_integer;
using nlohmann::json;

TEST_CASE("json_integer: integers inside the type's range pass unchanged") {
  CHECK(json_integer<int>(json::parse("2")) == 2);
  CHECK(json_integer<int>(json::parse("-2147483648")) == std::numeric_limits<int>::min());
  CHECK(json_integer<int>(json::parse("2147483647")) == std::numeric_limits<int>::max());
  CHECK(json_integer<std::uint64_t>(json::parse("18446744073709551615")) == ~std::uint64_t(0));
  CHECK(json_integer<std::int64_t>(json::parse("-9223372036854775808")) == std::numeric_limits<std::int64_t>::min());
  CHECK(json_integer<std::uint8_t>(json::parse("255")) == 255);
}

TEST_CASE("json_integer: out of range, negative for unsigned, floats and non-numbers are refused") {
  CHECK_FALSE(json_integer<int>(json::parse("4294967297")));       // get<int> would give 1
  CHECK_FALSE(json_integer<int>(json::parse("2147483648")));
  CHECK_FALSE(json_integer<int>(json::parse("-2147483649")));
  CHECK_FALSE(json_integer<long>(json::parse("1e63")));            // a float: UB through get<long>
  CHECK_FALSE(json_integer<long>(json::parse("3.0")));
  CHECK_FALSE(json_integer<long>(json::parse("9223372036854775808")));  // unsigned storage, > max
  CHECK_FALSE(json_integer<std::uint64_t>(json::parse("-1")));
  CHECK_FALSE(json_integer<std::uint8_t>(json::parse("256")));
  CHECK_FALSE(json_integer<int>(json::parse("\"7\"")));
  CHECK_FALSE(json_integer<int>(json::parse("true")));
  CHECK_FALSE(json_integer<int>(json::parse("null")));
}

TEST_CASE("json_nesting_depth: arrays and objects count, brackets inside strings do not") {
  CHECK(loom::json_nesting_depth("3") == 0);
  CHECK(loom::json_nesting_depth(R"({"a": [1, {"b": []}]})") == 4);
  CHECK(loom::json_nesting_depth(R"(["[[[{", "\"[["])") == 1);
  CHECK(loom::json_nesting_depth("]]]][") == 1);  // malformed: still an upper bound, never negative
}

TEST_CASE("parse_json: parses as nlohmann does, refuses deep nesting with an input_error") {
  CHECK(loom::parse_json(R"({"a": [1, 2]})", "t", "fix")["a"][1] == 2);
  CHECK_THROWS_AS(loom::parse_json("{", "t", "fix"), nlohmann::json::parse_error);
  const std::string ok = std::string(loom::json_max_depth, '[') + std::string(loom::json_max_depth, ']');
  CHECK(loom::parse_json(ok, "t", "fix").is_array());
  // a million levels (2 MB): nlohmann's parse, copy and dump() recurse once per level (stack overflow)
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  CHECK_THROWS_AS(loom::parse_json(deep, "t", "fix"), loom::input_error);
  CHECK_THROWS_AS(loom::parse_json("[" + ok + "]", "t", "fix"), loom::input_error);
}
