// train::instance_cache (train/instance_cache.hpp) with a stand-in compiler: a script that builds
// a stub shared object exporting the instance's two entry points (the real compile is
// tests/cli/on_demand.sh's; it refuses to precompile the headers, so instances compile without
// them). What is checked: an entry is compiled once and then loaded; a
// truncated object or a changed header is compiled again; two callers racing on one entry
// compile it once; a failed compile reports the compiler's first error and keeps its log; no
// compiler names the CMake setting; an entry of other headers is listed as stale and pruned.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <loom/core/error.hpp>
#include <loom/train/instance_cache.hpp>

namespace fs = std::filesystem;
namespace lt = loom::train;

namespace {

struct sandbox {
  fs::path dir = fs::temp_directory_path() / ("loom_instance_cache_" + std::to_string(::getpid()) + "_" +
                                               std::to_string(std::rand()));
  sandbox() {
    fs::create_directories(dir / "include" / "loom");
    std::ofstream(dir / "include" / "loom" / "a.hpp") << "// a header\n";
    // the stand-in compiler: counts its runs, takes the key from the source's last line, and
    // builds a C shared object with loom_session_instance_v1 / _key (cc; well under a second)
    std::ofstream s(dir / "fake-cxx");
    s << "#!/bin/sh\n"
         "out=''; src=''\n"
         "while [ $# -gt 0 ]; do case \"$1\" in -o) out=\"$2\"; shift;; *.cpp) src=\"$1\";; esac; shift; done\n"
         "[ -n \"$src\" ] || exit 1\n"  // the precompiled header: refused (the instance compiles without it)
         "echo run >> '" << (dir / "runs").string() << "'\n"
         "sleep 0.3\n"
         "[ -f '" << (dir / "fail").string() << "' ] && { echo \"$src:3:7: error: 'boom' was not declared\"; exit 1; }\n"
         "key=$(sed -n 's/.*loom_session_instance_key() { return \"\\([0-9a-f]*\\)\".*/\\1/p' \"$src\")\n"
         "printf 'static char b[256]; const void* loom_session_instance_v1(void) { return b; }\\n"
         "const char* loom_session_instance_key(void) { return \"%s\"; }\\n' \"$key\" |"
         " cc -shared -fPIC -x c - -o \"$out\"\n";
    s.close();
    fs::permissions(dir / "fake-cxx", fs::perms::owner_all);
  }
  ~sandbox() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  lt::toolchain tools(std::string compiler = {}) const {
    lt::toolchain t;
    t.compiler = compiler.empty() ? (dir / "fake-cxx").string() : compiler;
    t.include_root = dir / "include";
    t.file = dir / "toolchain.json";
    return t;
  }
  int runs() const {
    std::ifstream in(dir / "runs");
    int n = 0;
    for (std::string l; std::getline(in, l);) ++n;
    return n;
  }
};

lt::instance_request request() {
  lt::instance_request r;
  r.spec = loom::models::spec_of<loom::models::odd_gqa>();
  r.micro_batch = 3, r.seq_len = 17;
  return r;
}

}  // namespace

TEST_CASE("instance_cache: compiled once, then loaded; a truncated object is compiled again") {
  sandbox sb;
  const auto r = request();
  {
    lt::instance_cache c(sb.tools(), sb.dir / "cache");
    CHECK_FALSE(c.cached(r));
    const auto* first = &c.get(r);
    CHECK(sb.runs() == 1);
    CHECK(&c.get(r) == first);  // loaded once per process
    CHECK(c.cached(r));
  }
  lt::instance_cache again(sb.tools(), sb.dir / "cache");
  (void)again.get(r);
  CHECK(sb.runs() == 1);  // a second process starts from the cache
  const auto entries = again.list();
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].valid);
  CHECK(entries[0].description == r.describe());
  // a copy of the cache, its object truncated (this process has the original loaded: truncating
  // a mapped file would fault it, as it would any other process that has it loaded)
  fs::copy(sb.dir / "cache", sb.dir / "copy", fs::copy_options::recursive);
  const auto so = sb.dir / "copy" / entries[0].key / "instance.so";
  fs::resize_file(so, fs::file_size(so) / 2);
  lt::instance_cache third(sb.tools(), sb.dir / "copy");
  CHECK_FALSE(third.cached(r));
  CHECK_FALSE(third.list()[0].valid);
  (void)third.get(r);
  CHECK(sb.runs() == 2);
  CHECK(third.cached(r));
}

TEST_CASE("instance_cache: a changed header or another request is another key") {
  sandbox sb;
  const auto r = request();
  lt::instance_cache c(sb.tools(), sb.dir / "cache");
  const std::string k = c.key(r);
  auto other = r;
  other.seq_len = 16;
  CHECK(c.key(other) != k);
  other = r;
  other.spec.rope_theta = 500000.0;
  CHECK(c.key(other) != k);
  std::ofstream(sb.dir / "include" / "loom" / "a.hpp", std::ios::app) << "// edited\n";
  lt::instance_cache after(sb.tools(), sb.dir / "cache");
  CHECK(after.key(r) != k);
  CHECK(lt::headers_hash(sb.dir / "include") != lt::headers_hash(sb.dir / "nowhere"));
}

TEST_CASE("instance_cache: two callers racing on one entry compile it once") {
  sandbox sb;
  const auto r = request();
  std::atomic<int> done{0};
  auto caller = [&] {
    lt::instance_cache c(sb.tools(), sb.dir / "cache");  // its own lock file descriptor
    (void)c.get(r);
    ++done;
  };
  std::thread a(caller), b(caller);
  a.join();
  b.join();
  CHECK(done == 2);
  CHECK(sb.runs() == 1);
}

TEST_CASE("instance_cache: a failed compile names the first error and keeps the log; no compiler names the setting") {
  sandbox sb;
  std::ofstream(sb.dir / "fail") << "1";
  lt::instance_cache c(sb.tools(), sb.dir / "cache");
  try {
    (void)c.get(request());
    FAIL("no error");
  } catch (const loom::input_error& e) {
    const std::string m = e.what();
    CHECK(m.find("error: 'boom' was not declared") != std::string::npos);
    CHECK(m.find(".failed.log") != std::string::npos);
  }
  CHECK_FALSE(c.cached(request()));
  lt::instance_cache none(sb.tools("/nonexistent/c++"), sb.dir / "cache");
  try {
    (void)none.get(request());
    FAIL("no error");
  } catch (const loom::input_error& e) {
    CHECK(std::string(e.what()).find("LOOM_EXTRA_SESSIONS") != std::string::npos);
  }
  auto bad = request();
  bad.tp = 2;  // 5 heads
  CHECK_THROWS_WITH_AS(c.get(bad), doctest::Contains("not divisible by TP=2"), loom::input_error);
}

TEST_CASE("instance_cache: an entry of other headers is listed as stale and prune() removes only it") {
  sandbox sb;
  const auto r = request();
  {
    lt::instance_cache before(sb.tools(), sb.dir / "cache");
    (void)before.get(r);
  }
  std::ofstream(sb.dir / "cache" / "deadbeef.failed.log") << "error: an old failure\n";
  std::ofstream(sb.dir / "include" / "loom" / "a.hpp", std::ios::app) << "// edited\n";
  lt::instance_cache after(sb.tools(), sb.dir / "cache");
  auto other = r;
  other.seq_len = 19;
  (void)after.get(other);
  CHECK(sb.runs() == 2);
  const auto listed = after.list();
  REQUIRE(listed.size() == 2);
  int current = 0;
  for (const auto& c : listed) {
    CHECK(c.valid);
    CHECK(c.bytes > fs::file_size(c.dir / "instance.so"));  // the object, its source, stamp and log
    if (c.current) {
      ++current;
      CHECK(c.description == other.describe());
    }
  }
  CHECK(current == 1);
  const auto p = after.prune();
  // the stale instance, the precompiled-header directory of the old headers (the stand-in
  // compiler refuses to precompile, but the attempt's directory and log stay) and the failed log
  CHECK(p.entries == 3);
  CHECK(fs::exists(sb.dir / "cache" / ("pch-" + after.toolchain_id())));  // the current one stays
  CHECK(p.bytes > 0);
  const auto left = after.list();
  REQUIRE(left.size() == 1);
  CHECK(left[0].current);
  CHECK(left[0].description == other.describe());
  CHECK_FALSE(fs::exists(sb.dir / "cache" / "deadbeef.failed.log"));
  CHECK(after.cached(other));
  CHECK(after.prune().entries == 0);
}
