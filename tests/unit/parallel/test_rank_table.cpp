// The rank table reader (parallel/rank_table.hpp): a valid one- and two-server table, then one
// case per documented rule, each checking that the message names the file, the problem and a fix;
// RANK_ID / RANK precedence.
#include <doctest/doctest.h>

#include <stdlib.h>

#include <fstream>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/parallel/rank_table.hpp>

#include "support/temp_dir.hpp"
#include "../../support/scoped.hpp"

namespace {

namespace lp = loom::parallel;

const char* two_ranks = R"({"status": "completed", "version": "1.0", "server_count": "1",
  "server_list": [{"server_id": "node_0", "device": [
    {"device_id": "0", "device_ip": "192.168.1.8", "rank_id": "0"},
    {"device_id": "1", "device_ip": "192.168.1.9", "rank_id": "1"}]}]})";

/// The problems of `text`, read as the file "hccl.json".
std::vector<lp::rank_table_problem> problems_of(const std::string& text) {
  return lp::check_rank_table_text(text, "hccl.json");
}
/// The one problem of `text`; fails the test unless there is exactly one.
lp::rank_table_problem only_problem(const std::string& text) {
  const auto p = problems_of(text);
  REQUIRE_MESSAGE(p.size() == 1, lp::describe(p));
  CHECK(p[0].what.find("hccl.json") != std::string::npos);
  CHECK(!p[0].fix.empty());
  return p[0];
}
std::string replace(std::string s, const std::string& from, const std::string& to) {
  const auto at = s.find(from);
  REQUIRE(at != std::string::npos);
  return s.replace(at, from.size(), to);
}
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

using loom_test::scoped_env;

}  // namespace

TEST_CASE("rank table: a valid one-server table is read, indexed by rank_id") {
  lp::rank_table t;
  REQUIRE(lp::check_rank_table_text(replace(two_ranks, R"("device_id": "1", "device_ip": "192.168.1.9", "rank_id": "1")",
                                            R"("rank_id": "1", "device_id": "3", "device_ip": "192.168.1.9")"),
                                    "hccl.json", &t)
              .empty());
  CHECK(t.size() == 2);
  CHECK(t.server_count() == 1);
  CHECK(t.device_of(0) == 0);
  CHECK(t.device_of(1) == 3);
  CHECK(t.at(1).device_ip == "192.168.1.9");
  CHECK(t.at(1).server_id == "node_0");
  CHECK_THROWS_AS(t.check_rank(2), loom::input_error);
  CHECK_THROWS_WITH(t.check_rank(-1), doctest::Contains("rank -1 is not in the table"));
}

TEST_CASE("rank table: two servers, ranks listed out of order, device ids repeating across servers") {
  const std::string text = R"({"status": "completed", "version": "1.0", "server_count": "2", "server_list": [
    {"server_id": "node_1", "device": [{"device_id": "0", "device_ip": "10.0.0.2", "rank_id": "1"}]},
    {"server_id": "node_0", "device": [{"device_id": "0", "device_ip": "10.0.0.1", "rank_id": "0"}]}]})";
  lp::rank_table t;
  REQUIRE(lp::check_rank_table_text(text, "hccl.json", &t).empty());
  CHECK(t.size() == 2);
  CHECK(t.at(0).server_id == "node_0");
  CHECK(t.at(1).server_index == 0);
  // device_ip is required with more than one server
  const auto p = only_problem(replace(text, R"("device_ip": "10.0.0.2", )", ""));
  CHECK(has(p.what, "has no \"device_ip\""));
}

TEST_CASE("rank table: a number beyond double or nesting beyond 64 levels is a problem, not an exception") {
  // nlohmann throws out_of_range for 1e400, which the parse_error handler did not catch; deep
  // nesting overflowed the stack in nlohmann's recursive parse.
  for (const std::string& text : {std::string(R"({"status": "completed", "server_count": 1e400})"),
                                 std::string(100000, '[') + std::string(100000, ']')}) {
    std::vector<loom::parallel::rank_table_problem> problems;
    CHECK_NOTHROW(problems = loom::parallel::check_rank_table_text(text, "hccl.json"));
    CHECK(problems.size() == 1);
  }
}

TEST_CASE("rank table: a missing file names the file and RANK_TABLE_FILE") {
  loom_test::temp_dir dir;
  const auto p = lp::check_rank_table(dir / "nope.json");
  REQUIRE(p.size() == 1);
  CHECK(has(p[0].what, "nope.json does not exist"));
  CHECK(has(p[0].fix, "RANK_TABLE_FILE"));
  CHECK_THROWS_WITH_AS(lp::read_rank_table(dir / "nope.json"), doctest::Contains("nope.json does not exist"),
                       loom::input_error);
}

TEST_CASE("rank table: read from a file") {
  loom_test::temp_dir dir;
  std::ofstream(dir / "hccl.json") << two_ranks;
  const auto t = lp::read_rank_table(dir / "hccl.json");
  CHECK(t.size() == 2);
  CHECK(t.path() == dir / "hccl.json");
}

TEST_CASE("rank table: not JSON (e.g. the documentation's // comments left in)") {
  const auto p = only_problem(replace(two_ranks, R"("version": "1.0",)", R"("version": "1.0", // template version)"));
  CHECK(has(p.what, "is not JSON"));
  CHECK(has(p.fix, "no comments"));
  CHECK(has(only_problem("[1, 2]").what, "not an object"));
}

TEST_CASE("rank table: missing fields") {
  CHECK(has(only_problem(replace(two_ranks, R"("status": "completed", )", "")).what, "has no \"status\""));
  CHECK(has(only_problem(replace(two_ranks, R"("version": "1.0", )", "")).what, "has no \"version\""));
  CHECK(has(only_problem(replace(two_ranks, R"("server_count": "1",)", "")).what, "has no \"server_count\""));
  CHECK(has(only_problem(replace(two_ranks, R"("server_id": "node_0", )", "")).what, "server_list[0] has no \"server_id\""));
  CHECK(has(only_problem(replace(two_ranks, R"("device_id": "1", )", "")).what,
            "server_list[0] device[1] has no \"device_id\""));
  CHECK(has(only_problem(replace(two_ranks, R"(, "rank_id": "1")", "")).what, "device[1] has no \"rank_id\""));
  CHECK(has(only_problem(R"({"status": "completed", "version": "1.0", "server_count": "1"})").what,
            "has no \"server_list\""));
  CHECK(has(only_problem(R"({"status": "completed", "version": "1.0", "server_count": "0", "server_list": []})").what,
            "\"server_list\" is empty"));
  CHECK(has(only_problem(replace(two_ranks, R"("server_id": "node_0", "device": [)", R"("server_id": "node_0", "devices": [)"))
                .what,
            "has no \"device\" list"));
}

TEST_CASE("rank table: values are decimal strings, as HCCL's template writes them") {
  auto p = only_problem(replace(two_ranks, R"("rank_id": "1")", R"("rank_id": 1)"));
  CHECK(has(p.what, "\"rank_id\" is 1, not a string"));
  CHECK(has(p.fix, "\"rank_id\": \"1\""));
  CHECK(has(only_problem(replace(two_ranks, R"("device_id": "1")", R"("device_id": "one")")).what,
            "not a non-negative decimal integer"));
  CHECK(has(only_problem(replace(two_ranks, R"("server_count": "1")", R"("server_count": "2")")).what,
            "\"server_count\" is \"2\" but \"server_list\" has 1 server(s)"));
  CHECK(has(only_problem(replace(two_ranks, "192.168.1.9", "192.168.1")).what, "not an IPv4 or IPv6 address"));
  CHECK(has(only_problem(replace(two_ranks, "192.168.1.9", "192.168.1.8")).what, "device_ip 192.168.1.8 is given to"));
}

TEST_CASE("rank table: rank ids must be 0..n-1, each once") {
  auto p = only_problem(replace(two_ranks, R"("rank_id": "1")", R"("rank_id": "0")"));
  CHECK(has(p.what, "rank_id 0 appears 2 times"));
  CHECK(has(p.fix, "distinct rank_id from 0 to 1"));
  p = only_problem(replace(two_ranks, R"("rank_id": "1")", R"("rank_id": "2")"));
  CHECK(has(p.what, "rank_id 2 (server node_0 device_id 1) is outside 0..1"));
  p = only_problem(replace(replace(two_ranks, R"("rank_id": "1")", R"("rank_id": "2")"), R"("rank_id": "0")",
                           R"("rank_id": "1")"));
  CHECK(has(p.what, "rank_id 2"));
}

TEST_CASE("rank table: a device id twice in one server") {
  const auto p = only_problem(replace(two_ranks, R"("device_id": "1")", R"("device_id": "0")"));
  CHECK(has(p.what, "device_id 0 appears twice in server \"node_0\""));
  CHECK(has(p.fix, "one rank per NPU"));
}

TEST_CASE("rank table: status must be completed; version 1.0") {
  auto p = only_problem(replace(two_ranks, R"("status": "completed")", R"("status": "initializing")"));
  CHECK(has(p.what, "still being written"));
  CHECK(has(p.fix, "\"completed\""));
  p = only_problem(replace(two_ranks, R"("version": "1.0")", R"("version": "1.2")"));
  CHECK(has(p.what, "\"version\" is \"1.2\""));
  CHECK(has(p.fix, "A3 super-pod"));
}

TEST_CASE("rank table: every problem of a file at once, one fix each") {
  const auto p = problems_of(replace(replace(two_ranks, R"("status": "completed")", R"("status": "initializing")"),
                                     R"("device_id": "1")", R"("device_id": "0")"));
  CHECK(p.size() == 2);
  const std::string all = lp::describe(p);
  CHECK(has(all, "still being written"));
  CHECK(has(all, "appears twice"));
}

TEST_CASE("rank table: path and rank from the environment; RANK_ID wins over RANK") {
  {
    scoped_env a("RANK_TABLE_FILE", "/x/hccl.json");
    CHECK(lp::rank_table_path() == "/x/hccl.json");
    CHECK(lp::rank_table_path("/y.json") == "/y.json");
  }
  {
    scoped_env a("RANK_TABLE_FILE", nullptr);
    CHECK_THROWS_WITH_AS(lp::rank_table_path(), doctest::Contains("RANK_TABLE_FILE is not set"), loom::input_error);
  }
  {
    scoped_env a("RANK_ID", "1"), b("RANK", nullptr);
    CHECK(lp::rank_from_env() == 1);
  }
  {
    scoped_env a("RANK_ID", nullptr), b("RANK", "3");
    CHECK(lp::rank_from_env() == 3);
  }
  {
    scoped_env a("RANK_ID", "2"), b("RANK", "2");
    CHECK(lp::rank_from_env() == 2);
  }
  {
    scoped_env a("RANK_ID", "1"), b("RANK", "0");
    CHECK_THROWS_WITH_AS(lp::rank_from_env(), doctest::Contains("disagree"), loom::input_error);
  }
  {
    scoped_env a("RANK_ID", "-1"), b("RANK", nullptr);
    CHECK_THROWS_WITH_AS(lp::rank_from_env(), doctest::Contains("RANK_ID=-1 is not a rank"), loom::input_error);
  }
  {
    scoped_env a("RANK_ID", nullptr), b("RANK", nullptr);
    CHECK_THROWS_WITH_AS(lp::rank_from_env(), doctest::Contains("rank is unknown"), loom::input_error);
  }
}
