#pragma once
/// \file The HCCL rank table (the "RANK_TABLE_FILE", often named hccl.json): read, check, and find
/// which rank a process is, before anything is handed to HCCL.
///
///   auto table = loom::parallel::read_rank_table(loom::parallel::rank_table_path());  // $RANK_TABLE_FILE
///   const int rank = loom::parallel::rank_from_env();                                  // $RANK_ID, else $RANK
///   loom::device::ascend_device npu(runtime, table.device_of(rank));                  // the rank's NPU
///
/// Format (rank table template version "1.0", Atlas training and Atlas A2 products; CANN 9.0.0
/// "HCCL User Guide", rank table configuration for Atlas A2, hcclug_000067; MindCluster's
/// hccl.json file description writes the same form):
///
///   { "status": "completed", "version": "1.0", "server_count": "1",
///     "server_list": [ { "server_id": "node_0",
///                        "device": [ { "device_id": "0", "device_ip": "192.168.1.8", "rank_id": "0" },
///                                    { "device_id": "1", "device_ip": "192.168.1.9", "rank_id": "1" } ] } ] }
///
/// Rules checked here (each problem reported with its fix; all problems of a file at once):
///  * the file exists, is readable and is one JSON object;
///  * "status" is "completed" ("initializing" means the scheduler is still writing it);
///  * "version" is "1.0" (1.2 is the A3 super-pod template, not read by loom);
///  * "server_count" is a decimal string equal to the number of entries of "server_list";
///  * every server has a "server_id" (a string, shorter than 64 characters, unique) and a
///    non-empty "device" list;
///  * every device has "device_id" and "rank_id", decimal strings (HCCL's template quotes every
///    number); "device_ip" is required when the table has more than one server, and when given
///    is an IPv4 or IPv6 address, unique over the table;
///  * device ids are >= 0 and do not repeat within a server (the same NPU twice);
///  * rank ids are exactly 0..n-1, each once (n = the number of devices of all servers).
/// Whether a rank is in the table (rank_table::check_rank) and whether device_id exists on the
/// machine are checked when the rank is known (the latter by HCCL itself).
///
/// Needs nlohmann-json (part of loom::loom when found; Debian nlohmann-json3-dev). Not included by
/// loom/parallel.hpp for that reason.

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <arpa/inet.h>

#include <nlohmann/json.hpp>

#include <loom/core/error.hpp>
#include <loom/core/json.hpp>

namespace loom::parallel {

/// One rank of a rank table: the NPU it runs on and the server that NPU is in.
struct rank_table_entry {
  int rank_id = -1;          ///< the rank, 0..size()-1
  int device_id = -1;        ///< the NPU's physical id on its server (what `npu-smi info` lists)
  std::string device_ip;     ///< the NPU's NIC address; empty when the table gives none (one server)
  std::string server_id;     ///< the server's id in the table
  int server_index = -1;     ///< position of the server in "server_list"
};

/// One problem of a rank table: what is wrong, and how to fix it.
struct rank_table_problem {
  std::string what;  ///< e.g. "rank_id 2 appears twice (server node_0 device 1 and server node_1 device 0)"
  std::string fix;   ///< e.g. "give every device a distinct rank_id from 0 to 3"
};

/// A checked rank table. Entries are indexed by rank id: entries()[r].rank_id == r.
class rank_table {
 public:
  rank_table() = default;
  /// A table as check_rank_table_text builds it: `entries` sorted by rank_id, rank_ids 0..n-1
  /// (not re-checked here; use read_rank_table / check_rank_table to get a checked one).
  rank_table(std::filesystem::path path, int server_count, std::vector<rank_table_entry> entries)
      : path_(std::move(path)), server_count_(server_count), entries_(std::move(entries)) {}

  /// The file it was read from.
  const std::filesystem::path& path() const noexcept { return path_; }
  /// Number of ranks (devices over all servers).
  int size() const noexcept { return int(entries_.size()); }
  /// Number of servers ("server_count", equal to the length of "server_list").
  int server_count() const noexcept { return server_count_; }
  /// Every rank, in rank_id order.
  const std::vector<rank_table_entry>& entries() const noexcept { return entries_; }

  /// Throws input_error naming the file and the fix unless 0 <= rank < size().
  void check_rank(int rank) const {
    if (rank >= 0 && rank < size()) return;
    throw input_error("rank table " + path_.string() + ": rank " + std::to_string(rank) +
                      " is not in the table, whose rank_ids are 0.." + std::to_string(size() - 1) +
                      "; set RANK_ID (or RANK) to this process's rank_id in the table, or add a device for it");
  }
  /// The entry of `rank`; throws input_error as check_rank.
  const rank_table_entry& at(int rank) const {
    check_rank(rank);
    return entries_[std::size_t(rank)];
  }
  /// The physical NPU id `rank` runs on (its "device_id"); throws input_error as check_rank.
  int device_of(int rank) const { return at(rank).device_id; }

 private:
  std::filesystem::path path_;
  int server_count_ = 0;
  std::vector<rank_table_entry> entries_;
};

namespace detail {

/// Parses a non-negative decimal integer below 2^31 from all of s; -1 when it is not one.
inline int rank_table_int(std::string_view s) {
  if (s.empty() || s.size() > 10) return -1;
  long long v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v <= 0x7fffffffLL ? int(v) : -1;
}

inline bool is_ip_address(const std::string& s) {
  unsigned char buf[16];
  return inet_pton(AF_INET, s.c_str(), buf) == 1 || inet_pton(AF_INET6, s.c_str(), buf) == 1;
}

}  // namespace detail

namespace detail {

/// The checks of one rank table's text: each records its problems (what is wrong, and the fix)
/// and goes on, so that a user sees every problem of the file at once.
class rank_table_checker {
 public:
  using json = nlohmann::json;
  explicit rank_table_checker(std::string file) : file(std::move(file)) {}

  std::string file;                          ///< the path, as messages name it
  std::vector<rank_table_problem> problems;  ///< what was found so far

  void problem(std::string what, std::string fix) { problems.push_back({std::move(what), std::move(fix)}); }

  /// A string field of `o` (at `where`); nullptr, with a problem recorded, when absent or not a string.
  const std::string* str(const json& o, const char* key, const std::string& where, bool required = true) {
    auto it = o.find(key);
    if (it == o.end()) {
      if (required)
        problem(file + ": " + where + "has no \"" + key + "\"",
                std::string("add \"") + key + "\" (a required field of the rank table, template version 1.0)");
      return nullptr;
    }
    if (!it->is_string()) {
      problem(file + ": " + where + "\"" + key + "\" is " + it->dump() + ", not a string",
              std::string("quote it: \"") + key + "\": \"" + (it->is_number() ? it->dump() : std::string("...")) +
                  "\" (HCCL's rank table writes every value as a string)");
      return nullptr;
    }
    return it->get_ptr<const std::string*>();
  }

  /// A decimal-integer string field; -1 when absent or malformed (problem recorded).
  int num(const json& o, const char* key, const std::string& where) {
    const std::string* s = str(o, key, where);
    if (!s) return -1;
    const int v = rank_table_int(*s);
    if (v < 0)
      problem(file + ": " + where + "\"" + key + "\" is \"" + *s + "\", not a non-negative decimal integer",
              std::string("write \"") + key + "\" as a decimal string such as \"0\"");
    return v;
  }

  /// "status" and "version" of the table object `j`.
  void check_status_and_version(const json& j) {
    if (const std::string* status = str(j, "status", "the table ")) {
      if (*status == "initializing")
        problem(file + ": \"status\" is \"initializing\": the table is still being written",
                "wait until the job scheduler (e.g. MindCluster's Ascend Operator) sets \"status\" to \"completed\", "
                "then start the ranks");
      else if (*status != "completed")
        problem(file + ": \"status\" is \"" + *status + "\"", "set \"status\": \"completed\" once the table is final");
    }
    if (const std::string* version = str(j, "version", "the table ")) {
      if (*version != "1.0")
        problem(file + ": \"version\" is \"" + *version + "\"; loom reads the rank table template version \"1.0\"",
                *version == "1.2" ? "1.2 is the A3 super-pod template: write the table in the 1.0 template (Atlas "
                                    "training and A2 products), or launch with root info instead of a rank table"
                                  : "set \"version\": \"1.0\" and use that template's fields");
    }
  }

  /// The devices of every server of `list` (a non-empty array), with the per-server checks
  /// (server ids, device lists, device ids, device IPs).
  std::vector<rank_table_entry> servers(const json& list) {
    std::vector<rank_table_entry> all;
    std::vector<std::string> server_ids;
    const bool many_servers = list.size() > 1;
    for (std::size_t s = 0; s < list.size(); ++s) {
      const json& server = list[s];
      const std::string sw = "server_list[" + std::to_string(s) + "] ";
      if (!server.is_object()) {
        problem(file + ": " + sw + "is not an object", "each server is {\"server_id\": ..., \"device\": [...]}");
        continue;
      }
      std::string sid;
      if (const std::string* id = str(server, "server_id", sw)) {
        sid = *id;
        if (sid.empty() || sid.size() >= 64)
          problem(file + ": " + sw + "\"server_id\" \"" + sid + "\" has " + std::to_string(sid.size()) + " characters",
                  "give every server a unique id of 1 to 63 characters (e.g. its host IP or \"node_0\")");
        else if (std::find(server_ids.begin(), server_ids.end(), sid) != server_ids.end())
          problem(file + ": server_id \"" + sid + "\" appears twice in \"server_list\"",
                  "give every server a unique \"server_id\" (one entry per machine, all its NPUs in its \"device\" list)");
        server_ids.push_back(sid);
      }
      auto devices = server.find("device");
      if (devices == server.end() || !devices->is_array() || devices->empty()) {
        problem(file + ": " + sw + (devices == server.end() ? "has no \"device\" list" : "\"device\" is not a non-empty list"),
                "list the server's NPUs: \"device\": [{\"device_id\": \"0\", \"device_ip\": ..., \"rank_id\": \"0\"}, ...]");
        continue;
      }
      std::vector<int> seen_devices;
      for (std::size_t d = 0; d < devices->size(); ++d) {
        const json& dev = (*devices)[d];
        const std::string dw = sw + "device[" + std::to_string(d) + "] ";
        if (!dev.is_object()) {
          problem(file + ": " + dw + "is not an object", "each device is {\"device_id\", \"device_ip\", \"rank_id\"}");
          continue;
        }
        rank_table_entry e;
        e.server_id = sid;
        e.server_index = int(s);
        e.device_id = num(dev, "device_id", dw);
        e.rank_id = num(dev, "rank_id", dw);
        if (const std::string* ip = str(dev, "device_ip", dw, many_servers)) {
          e.device_ip = *ip;
          if (!detail::is_ip_address(e.device_ip))
            problem(file + ": " + dw + "\"device_ip\" \"" + e.device_ip + "\" is not an IPv4 or IPv6 address",
                    "write the NPU's NIC address (`hccn_tool -i <device_id> -ip -g` prints it)");
        }
        if (e.device_id >= 0) {
          if (std::find(seen_devices.begin(), seen_devices.end(), e.device_id) != seen_devices.end())
            problem(file + ": device_id " + std::to_string(e.device_id) + " appears twice in server " +
                        (sid.empty() ? std::to_string(s) : "\"" + sid + "\""),
                    "list each NPU of a server once; one rank per NPU");
          seen_devices.push_back(e.device_id);
        }
        all.push_back(std::move(e));
      }
    }

    return all;
  }

  /// Every device_ip is unique over the table.
  void check_unique_ips(const std::vector<rank_table_entry>& all) {
    for (std::size_t a = 0; a < all.size(); ++a)
      for (std::size_t b = a + 1; b < all.size(); ++b)
        if (!all[a].device_ip.empty() && all[a].device_ip == all[b].device_ip)
          problem(file + ": device_ip " + all[a].device_ip + " is given to rank_id " + std::to_string(all[a].rank_id) +
                      " and rank_id " + std::to_string(all[b].rank_id),
                  "every NPU has its own NIC address; check the table against `hccn_tool -i <device_id> -ip -g`");

  }

  /// The rank ids are exactly 0..n-1, each once.
  void check_rank_ids(const std::vector<rank_table_entry>& all) {
    const int n = int(all.size());
    std::vector<int> count(std::size_t(n), 0);
    bool ids_ok = true;
    for (const auto& e : all) {
      if (e.rank_id < 0) {
        ids_ok = false;  // already reported
      } else if (e.rank_id >= n) {
        ids_ok = false;
        problem(file + ": rank_id " + std::to_string(e.rank_id) + " (server " + e.server_id + " device_id " +
                    std::to_string(e.device_id) + ") is outside 0.." + std::to_string(n - 1) + " for " +
                    std::to_string(n) + " devices",
                "number the ranks 0 to " + std::to_string(n - 1) + ", each once");
      } else {
        ++count[std::size_t(e.rank_id)];
      }
    }
    for (int r = 0; r < n; ++r) {
      if (count[std::size_t(r)] > 1) {
        ids_ok = false;
        problem(file + ": rank_id " + std::to_string(r) + " appears " + std::to_string(count[std::size_t(r)]) + " times",
                "give every device a distinct rank_id from 0 to " + std::to_string(n - 1));
      } else if (count[std::size_t(r)] == 0 && ids_ok) {
        ids_ok = false;
        problem(file + ": rank_id " + std::to_string(r) + " is missing (the " + std::to_string(n) +
                    " devices must have rank_ids 0.." + std::to_string(n - 1) + ")",
                "number the ranks 0 to " + std::to_string(n - 1) + ", each once");
      }
    }
  }
};

}  // namespace detail

/// Every problem of the rank table in `text` (the contents of `path`, named in the messages);
/// empty when the table is valid, and then *out (if given) holds it. Does not read the file.
inline std::vector<rank_table_problem> check_rank_table_text(const std::string& text,
                                                             const std::filesystem::path& path,
                                                             rank_table* out = nullptr) {
  using json = nlohmann::json;
  detail::rank_table_checker c(path.string());
  const std::string& file = c.file;
  if (json_nesting_depth(text, json_max_depth) > json_max_depth) {  // printing it would overflow the stack
    c.problem(file + " nests arrays and objects deeper than " + std::to_string(json_max_depth) + " levels",
              "the rank table nests 4: {\"server_list\": [{\"device\": [{...}]}]}; write it from the template");
    return c.problems;
  }
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number beyond double (1e400)
    c.problem(file + " is not JSON (" + e.what() + ")",
              "write the rank table as plain JSON (no comments: the // notes of the documentation's examples must "
              "be deleted), e.g. check it with `python3 -m json.tool " + file + "`");
    return c.problems;
  }
  if (!j.is_object()) {
    c.problem(file + " is JSON but not an object", "the rank table is one object {\"status\": ..., \"server_list\": [...]}");
    return c.problems;
  }
  c.check_status_and_version(j);
  const int server_count = c.num(j, "server_count", "the table ");
  auto list = j.find("server_list");
  if (list == j.end()) {
    c.problem(file + ": the table has no \"server_list\"",
            "add \"server_list\": [{\"server_id\": ..., \"device\": [...]}], one entry per server");
    return c.problems;
  }
  if (!list->is_array() || list->empty()) {
    c.problem(file + ": \"server_list\" is " + (list->is_array() ? std::string("empty") : "not a list"),
            "make \"server_list\" a list with one {\"server_id\", \"device\"} object per server");
    return c.problems;
  }
  if (server_count >= 0 && std::size_t(server_count) != list->size())
    c.problem(file + ": \"server_count\" is \"" + std::to_string(server_count) + "\" but \"server_list\" has " +
                std::to_string(list->size()) + " server(s)",
            "set \"server_count\": \"" + std::to_string(list->size()) + "\" (or add the missing servers)");

  auto all = c.servers(*list);
  c.check_unique_ips(all);
  c.check_rank_ids(all);
  if (c.problems.empty() && out) {
    std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.rank_id < b.rank_id; });
    *out = rank_table(path, server_count, std::move(all));
  }
  return c.problems;
}

/// Every problem of the rank table file at `path` (missing or unreadable file included); empty
/// when it is valid, and then *out (if given) holds it.
inline std::vector<rank_table_problem> check_rank_table(const std::filesystem::path& path, rank_table* out = nullptr) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    return {{"rank table " + path.string() + " does not exist",
             "point RANK_TABLE_FILE (or the path argument) at the job's hccl.json; the job scheduler writes it, or "
             "write one by hand (docs/ascend.md, \"Launching\")"}};
  if (std::filesystem::is_directory(path, ec))
    return {{"rank table " + path.string() + " is a directory", "pass the file itself, e.g. " + (path / "hccl.json").string()}};
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in && !in.eof())
    return {{"rank table " + path.string() + " cannot be read", "check the file's permissions"}};
  return check_rank_table_text(text.str(), path, out);
}

/// One message for a list of problems: "<what>; fix: <fix>", one problem per line.
inline std::string describe(const std::vector<rank_table_problem>& problems) {
  std::string msg;
  for (const auto& p : problems) msg += (msg.empty() ? "" : "\n") + p.what + "; fix: " + p.fix;
  return msg;
}

/// Reads and checks the rank table at `path`. Throws input_error listing every problem with its
/// fix (see the file comment for the rules).
inline rank_table read_rank_table(const std::filesystem::path& path) {
  rank_table t;
  if (auto problems = check_rank_table(path, &t); !problems.empty()) throw input_error(describe(problems));
  return t;
}

/// The rank table's path: `path` when not empty, else $RANK_TABLE_FILE (the variable MindSpore,
/// TensorFlow and torch_npu's rank-table launch read). Throws input_error when neither is set.
inline std::filesystem::path rank_table_path(const std::filesystem::path& path = {}) {
  if (!path.empty()) return path;
  if (const char* env = std::getenv("RANK_TABLE_FILE"); env && *env) return env;
  throw input_error("no rank table: RANK_TABLE_FILE is not set and no path was given; export "
                    "RANK_TABLE_FILE=/path/to/hccl.json (or pass the path)");
}

/// This process's rank from the environment: $RANK_ID (MindSpore's name) wins; else $RANK
/// (torch_npu / torchrun's). When both are set they must agree. Throws input_error when neither
/// is set, when the value is not a non-negative decimal integer, or when they disagree.
inline int rank_from_env() {
  auto read = [](const char* var) -> int {
    const char* v = std::getenv(var);
    if (!v || !*v) return -2;
    const int r = detail::rank_table_int(v);
    if (r < 0)
      throw input_error(std::string(var) + "=" + v + " is not a rank; set " + var + " to this process's rank_id "
                        "in the rank table (0, 1, ...)");
    return r;
  };
  const int rank_id = read("RANK_ID"), rank = read("RANK");
  if (rank_id >= 0 && rank >= 0 && rank_id != rank)
    throw input_error("RANK_ID=" + std::to_string(rank_id) + " and RANK=" + std::to_string(rank) +
                      " disagree; unset one of them (loom reads RANK_ID first, as MindSpore does)");
  if (rank_id >= 0) return rank_id;
  if (rank >= 0) return rank;
  throw input_error("this process's rank is unknown: set RANK_ID (MindSpore) or RANK (torch_npu, torchrun) to its "
                    "rank_id in the rank table, or pass the rank");
}

}  // namespace loom::parallel
