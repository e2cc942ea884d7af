#pragma once
/// \file train::instance_cache — session instances compiled on first use and cached.
///
/// A request (train/instance_source.hpp) that no compiled-in instance serves is written as a
/// translation unit, compiled with the compiler and flags loom itself was built with (a
/// toolchain file the build records, train::toolchain) into a shared object, loaded with
/// dlopen, and kept under the cache directory ($LOOM_CACHE_DIR, else $XDG_CACHE_HOME/loom,
/// else ~/.cache/loom) for the next run — as MindSpore's graph mode compiles a static graph on
/// first use and PyTorch's cpp_extension.load compiles C++ on first use.
///
///   train::instance_cache cache(train::toolchain::load(train::toolchain::default_file()),
///                               train::instance_cache::default_dir());
///   const train::session_instance& i = cache.get(request, std::cout);  // compiles at most once
///
/// The key of an entry is XXH3-64 of everything that changes the code: the translation unit
/// (shape, recipe, policies, capacities), the compiler (path, size, time) and its flags, and
/// every header under the toolchain's loom include root. An entry is loaded only when its
/// stamp (entry.json: key, size and XXH3-64 of the shared object) matches; a truncated, stale or
/// foreign entry is rebuilt; entries of another toolchain or header set stay until
/// instance_cache::prune() (train_gpt --prune-cache) removes them. One process compiles an entry while others wait on a file lock
/// (flock: one per machine for a local cache directory), and every write goes to a temporary
/// directory renamed into place, so a killed compile leaves nothing that is loaded later.
///
/// The shared object leaves the kernels that loom_kernel_instances compiles once, the
/// checkpoint and trace code (train::session_io) and train::any_communicator_of undefined: the
/// program that loads it must export them (CMake ENABLE_EXPORTS, with loom_kernel_instances
/// linked whole; examples/CMakeLists.txt). POSIX only (fork/exec, flock, dlopen).
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <sstream>
#include <string>
#include <tuple>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <loom/core/checksum.hpp>
#include <loom/core/error.hpp>
#include <loom/train/instance_source.hpp>
#include <loom/train/session.hpp>

extern char** environ;

namespace loom::train {

/// How loom was compiled: the compiler, its flags (everything but the source and output), and
/// the include directory that holds loom/ (whose headers key the cache). Written by the build
/// (CMake: <build>/loom-instance-toolchain.json; cmake/LoomSessions.cmake).
struct toolchain {
  std::string compiler;
  std::vector<std::string> flags;
  std::filesystem::path include_root;
  std::string cmake_setting = "LOOM_EXTRA_SESSIONS";  ///< named when nothing can be compiled
  std::filesystem::path file;  ///< where it was read from (for messages)

  /// The toolchain file: $LOOM_TOOLCHAIN_FILE, else `built_in` (the build's path, compiled in).
  static std::filesystem::path default_file(const char* built_in) {
    if (const char* e = std::getenv("LOOM_TOOLCHAIN_FILE"); e && *e) return e;
    return built_in ? built_in : "";
  }
  /// Reads a toolchain file (JSON: compiler, flags, include_root, includes: directories, given
  /// as -I for include_root and -isystem for the others). Throws loom::input_error
  /// naming the file when it is missing or malformed.
  static toolchain load(const std::filesystem::path& path) {
    std::ifstream in(path);
    if (path.empty() || !in)
      throw input_error("no toolchain file at '" + path.string() + "' (the build writes loom-instance-toolchain.json; "
                        "set LOOM_TOOLCHAIN_FILE to it)");
    toolchain t;
    try {
      nlohmann::json j;
      in >> j;
      t.compiler = j.at("compiler").get<std::string>();
      t.include_root = j.at("include_root").get<std::string>();
      for (auto& f : j.at("flags").get<std::vector<std::string>>())
        if (!f.empty() && f != "-D") t.flags.push_back(std::move(f));
      std::vector<std::string> seen{"", "/usr/include", "/usr/local/include"};  // the compiler's own: never -isystem
      for (const auto& d : j.value("includes", std::vector<std::string>{}))  // loom's own: -I, others -isystem
        if (std::find(seen.begin(), seen.end(), d) == seen.end()) {
          seen.push_back(d);
          t.flags.insert(t.flags.end(), {d == t.include_root.string() ? "-I" : "-isystem", d});
        }
    } catch (const std::exception& e) {
      throw input_error("toolchain file '" + path.string() + "' is malformed (" + e.what() + "); rebuild loom to rewrite it");
    }
    t.file = path;
    return t;
  }
  /// Whether the compiler can be run here.
  bool compiler_usable() const noexcept { return !compiler.empty() && ::access(compiler.c_str(), X_OK) == 0; }
};

/// XXH3-64 of every file under root/loom (paths and contents, in path order): the headers an
/// instance is compiled from. Empty string when root/loom does not exist.
inline std::string headers_hash(const std::filesystem::path& root) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(root / "loom", ec)) return {};
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(root / "loom", ec))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  xxh3_stream h;
  std::string buf;
  for (const auto& f : files) {
    const std::string rel = fs::relative(f, root).generic_string();
    h.update(rel.data(), rel.size() + 1);
    std::ifstream in(f, std::ios::binary);
    buf.assign(std::istreambuf_iterator<char>(in), {});
    h.update(buf.data(), buf.size());
  }
  return h.hex();
}

namespace detail {

/// The bytes of the regular files under `p` (0 where it cannot be read).
inline std::uintmax_t tree_bytes(const std::filesystem::path& p) {
  std::uintmax_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(p, ec); !ec && it != std::filesystem::recursive_directory_iterator();
       it.increment(ec))
    if (it->is_regular_file(ec)) n += it->file_size(ec);
  return n;
}

/// XXH3-64 of a whole file as hex; "" when it cannot be read.
inline std::string file_xxh3(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return {};
  xxh3_stream h;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    h.update(buf.data(), std::size_t(in.gcount()));
  }
  return h.hex();
}

/// Runs argv with stdout and stderr appended to `log`, printing "  ... N s" to `out` every
/// `tick` while it runs. Returns the exit status (-1 when it could not start).
inline int run_logged(const std::vector<std::string>& argv, const std::filesystem::path& log, std::ostream* out,
                      std::chrono::seconds tick) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawn_file_actions_addclose(&fa, 0);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  const auto start = std::chrono::steady_clock::now();
  auto next = start + tick;
  int status = 0;
  for (;;) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (out && std::chrono::steady_clock::now() >= next) {
      next += tick;
      *out << "  ... " << std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start).count()
           << " s" << std::endl;
    }
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

/// The first line of `log` that reports an error ("error:"), else its last non-empty line.
inline std::string first_error(const std::filesystem::path& log) {
  std::ifstream in(log);
  std::string line, last;
  while (std::getline(in, line)) {
    if (line.find("error:") != std::string::npos || line.find("error ") == 0) return line;
    if (!line.empty()) last = line;
  }
  return last;
}

/// An exclusive flock on `path` for the object's lifetime.
class file_lock {
 public:
  explicit file_lock(const std::filesystem::path& path) : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    if (fd_ < 0) throw input_error("cannot open the cache lock '" + path.string() + "'; check LOOM_CACHE_DIR's permissions");
  }
  /// Takes the lock; false when another process holds it (then lock() waits).
  bool try_lock() noexcept { return ::flock(fd_, LOCK_EX | LOCK_NB) == 0; }
  void lock() {
    while (::flock(fd_, LOCK_EX) != 0)
      if (errno != EINTR) throw error("flock on the instance cache failed");
  }
  ~file_lock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }
  file_lock(const file_lock&) = delete;
  file_lock& operator=(const file_lock&) = delete;

 private:
  int fd_;
};

}  // namespace detail

/// One cached instance as instance_cache::list() reports it.
struct cached_instance {
  std::string key, description;
  std::filesystem::path dir;
  bool valid = false;    ///< its stamp matches its shared object (else the next get() rebuilds it)
  bool current = false;  ///< built by this toolchain from these headers (else no run loads it: prune() removes it)
  std::uintmax_t bytes = 0;  ///< the size of its directory
};

/// What instance_cache::prune() removed.
struct pruned {
  std::size_t entries = 0;   ///< stale or damaged instances, precompiled headers of other toolchains, failed logs
  std::uintmax_t bytes = 0;  ///< their size on disk
};

/// The cache of instances compiled on first use (see the file comment). Loaded objects stay
/// loaded for the process's lifetime (their session_instance pointers are handed out).
class instance_cache {
 public:
  /// $LOOM_CACHE_DIR, else $XDG_CACHE_HOME/loom, else $HOME/.cache/loom, else ./.loom-cache.
  static std::filesystem::path default_dir() {
    if (const char* e = std::getenv("LOOM_CACHE_DIR"); e && *e) return e;
    if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::filesystem::path(x) / "loom";
    if (const char* h = std::getenv("HOME"); h && *h) return std::filesystem::path(h) / ".cache" / "loom";
    return ".loom-cache";
  }

  instance_cache(toolchain tc, std::filesystem::path dir) : tc_(std::move(tc)), dir_(std::move(dir)) {}

  const std::filesystem::path& dir() const noexcept { return dir_; }
  const toolchain& tools() const noexcept { return tc_; }

  /// The cache key of `r` (see the file comment): the instance's source and toolchain_id().
  std::string key(const instance_request& r) const {
    const std::string id = instance_source(r, "") + '\0' + toolchain_id();
    return xxh3_hex(id.data(), id.size());
  }

  /// XXH3-64 (hex) of everything but the instance that changes the code: the compiler (path,
  /// size and modification time), its flags and the hash of loom's headers. Entries stamped
  /// with another one are stale: no key of this toolchain reaches them.
  const std::string& toolchain_id() const {
    std::call_once(toolchain_once_, [&] {
      std::string id = tc_.compiler + '\0';
      struct stat st {};
      if (::stat(tc_.compiler.c_str(), &st) == 0) id += std::to_string(st.st_size) + ":" + std::to_string(st.st_mtime);
      for (const auto& f : tc_.flags) id += '\0' + f;
      id += '\0' + headers_hash(tc_.include_root);
      toolchain_ = xxh3_hex(id.data(), id.size());
    });
    return toolchain_;
  }

  /// Whether `r` has a valid entry (get() would start without compiling).
  bool cached(const instance_request& r) const {
    const std::string k = key(r);  // the source text and the headers' hash: computed once
    return valid_entry(dir_ / k, k);
  }

  /// The instance serving `r`: loaded from the cache, or compiled into it first (progress and
  /// the time taken to `out`, when not null). Throws loom::input_error for an invalid request,
  /// a toolchain without a usable compiler (naming tc.cmake_setting, which compiles instances
  /// into the build instead), a failed compile (its first error line and the log's path) and an
  /// object that does not load.
  const session_instance& get(const instance_request& r, std::ostream* out = nullptr) {
    if (auto p = r.problem(); !p.empty()) throw input_error(p);
    const std::string k = key(r);
    {
      std::lock_guard g(mu_);
      if (auto it = loaded_.find(k); it != loaded_.end()) return *it->second;
    }
    namespace fs = std::filesystem;
    const fs::path entry = dir_ / k;
    if (!valid_entry(entry, k)) {
      std::error_code ec;
      fs::create_directories(dir_ / "locks", ec);
      if (ec) throw input_error("cannot create the instance cache '" + dir_.string() + "' (" + ec.message() +
                                "); set LOOM_CACHE_DIR to a writable directory");
      detail::file_lock lock(dir_ / "locks" / (k + ".lock"));
      if (!lock.try_lock()) {
        if (out) *out << "waiting for another process compiling " << r.describe() << " (" << entry.string() << ")" << std::endl;
        lock.lock();
      }
      if (!valid_entry(entry, k)) compile(r, k, entry, out);
    }
    return load(entry, k);
  }

  /// Every entry under dir(): key, the instance it holds, whether it is valid and current, and
  /// its size.
  std::vector<cached_instance> list() const {
    std::vector<cached_instance> v;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) {
      const std::string name = e.path().filename().string();
      if (!e.is_directory() || name == "locks" || name.rfind("pch-", 0) == 0 || name.find('.') != std::string::npos)
        continue;  // locks, precompiled headers, a compile in progress
      cached_instance c{name, {}, e.path(), valid_entry(e.path(), name), false, detail::tree_bytes(e.path())};
      std::ifstream in(e.path() / "entry.json");
      try {
        nlohmann::json j;
        in >> j;
        c.description = j.value("instance", "");
        c.current = j.value("toolchain", "") == toolchain_id();
      } catch (...) {
      }
      v.push_back(std::move(c));
    }
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
      return std::tie(a.description, b.current) < std::tie(b.description, a.current);
    });
    return v;
  }

  /// Bytes of the precompiled headers under dir() (every toolchain's pch-<id>/ directory).
  std::uintmax_t precompiled_header_bytes() const {
    std::uintmax_t n = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir_, ec))
      if (e.is_directory() && e.path().filename().string().rfind("pch-", 0) == 0) n += detail::tree_bytes(e.path());
    return n;
  }

  /// Removes what no run of this toolchain and these headers loads: stale and damaged entries,
  /// precompiled headers of other toolchains and the logs of failed compiles. Entries being
  /// compiled (`<key>.tmp-<pid>`) and the locks stay. Not safe beside a run of another loom
  /// build that uses the same directory (its entries are stale to this one).
  pruned prune() {
    namespace fs = std::filesystem;
    pruned p;
    std::error_code ec;
    const std::string pch = "pch-" + toolchain_id();
    fs::create_directories(dir_ / "locks", ec);
    for (const auto& c : list())
      if (!c.valid || !c.current) {
        detail::file_lock lock(dir_ / "locks" / (c.key + ".lock"));
        if (!lock.try_lock()) continue;  // being compiled or rebuilt now
        p.bytes += c.bytes, ++p.entries;
        fs::remove_all(c.dir, ec);
      }
    for (const auto& e : fs::directory_iterator(dir_, ec)) {
      const std::string name = e.path().filename().string();
      const bool old_pch = e.is_directory() && name.rfind("pch-", 0) == 0 && name != pch;
      const bool failed_log = name.size() > 11 && name.compare(name.size() - 11, 11, ".failed.log") == 0;
      if (!old_pch && !failed_log) continue;
      p.bytes += detail::tree_bytes(e.path()), ++p.entries;
      fs::remove_all(e.path(), ec);
    }
    return p;
  }

 private:
  /// Whether `entry` holds a complete object for key k (its stamp's size and checksum match).
  static bool valid_entry(const std::filesystem::path& entry, const std::string& k) {
    std::error_code ec;
    const auto so = entry / "instance.so";
    if (!std::filesystem::is_regular_file(so, ec)) return false;
    std::ifstream in(entry / "entry.json");
    if (!in) return false;
    try {
      nlohmann::json j;
      in >> j;
      return j.at("key").get<std::string>() == k && j.at("size").get<std::uintmax_t>() == std::filesystem::file_size(so) &&
             j.at("xxh3_64").get<std::string>() == detail::file_xxh3(so);
    } catch (...) {
      return false;
    }
  }

  /// Compiles r into a temporary directory beside `entry`, stamps it and renames it into place
  /// (replacing an invalid entry). Called with the entry's lock held.
  void compile(const instance_request& r, const std::string& k, const std::filesystem::path& entry, std::ostream* out) {
    namespace fs = std::filesystem;
    if (!tc_.compiler_usable())
      throw input_error("the instance " + r.describe() + " is not compiled into this program, and the compiler loom "
                        "was built with ('" + tc_.compiler + "', from " + tc_.file.string() + ") cannot be run here; "
                        "install it, or compile the instance into the build with cmake -D" + tc_.cmake_setting + "=" +
                        r.spec.name + "/" + r.precision + "/" + r.layout() + "/" + r.device + "/" + r.attention +
                        " (a preset model; docs/session.md), or fill the cache ahead of the job with train_gpt "
                        "--compile-only on a machine with the compiler");
    const fs::path tmp = dir_ / (k + ".tmp-" + std::to_string(::getpid()));
    std::error_code ec;
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp);
    {
      std::ofstream src(tmp / "instance.cpp");
      src << instance_source(r, k);
      if (!src) throw input_error("cannot write '" + (tmp / "instance.cpp").string() + "'; check LOOM_CACHE_DIR");
    }
    std::vector<std::string> argv{tc_.compiler};
    argv.insert(argv.end(), tc_.flags.begin(), tc_.flags.end());
    if (auto pch = precompiled_header(out); !pch.empty())
      argv.insert(argv.end(), {"-Winvalid-pch", "-include", pch.string()});
    for (const char* a : {"-fPIC", "-shared", "-o"}) argv.emplace_back(a);
    argv.push_back((tmp / "instance.so").string());
    argv.push_back((tmp / "instance.cpp").string());
    const fs::path log = tmp / "build.log";
    {
      std::ofstream l(log);
      for (const auto& a : argv) l << a << ' ';
      l << '\n';
    }
    if (out)
      *out << "compiling " << r.describe() << " (first use; cached in " << entry.string() << ")" << std::endl;
    const auto t0 = std::chrono::steady_clock::now();
    const int status = detail::run_logged(argv, log, out, std::chrono::seconds(10));
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (status != 0) {
      const fs::path kept = dir_ / (k + ".failed.log");
      fs::copy_file(log, kept, fs::copy_options::overwrite_existing, ec);
      fs::remove_all(tmp, ec);
      throw input_error("compiling " + r.describe() + " failed (" +
                        (status < 0 ? "could not run '" + tc_.compiler + "'" : "exit " + std::to_string(status)) +
                        "): " + detail::first_error(kept) + "\n  the whole log: " + kept.string());
    }
    const auto so = tmp / "instance.so";
    nlohmann::json stamp = {{"key", k},
                            {"instance", r.describe()},
                            {"toolchain", toolchain_id()},
                            {"size", fs::file_size(so)},
                            {"xxh3_64", detail::file_xxh3(so)},
                            {"compile_seconds", secs}};
    {
      std::ofstream s(tmp / "entry.json");
      s << stamp.dump(2) << '\n';
      if (!s) throw input_error("cannot write the cache stamp in '" + tmp.string() + "'; check LOOM_CACHE_DIR");
    }
    fs::remove_all(entry, ec);  // an invalid entry: truncated, stale or foreign
    fs::rename(tmp, entry);
    if (out) {
      char b[32];
      std::snprintf(b, sizeof b, "%.1f", secs);
      *out << "compiled " << r.describe() << " in " << b << " s" << std::endl;
    }
  }

  /// The headers every instance includes (train/session_instance.hpp, train/whole_model.hpp),
  /// precompiled once per toolchain and header set under dir()/pch-<key>/ (GCC and Clang read
  /// instance.hpp.gch beside instance.hpp when the flags match, else the header itself), or an
  /// empty path when it cannot be built (the instance then compiles without it).
  std::filesystem::path precompiled_header(std::ostream* out) {
    namespace fs = std::filesystem;
    const std::string& k = toolchain_id();
    const fs::path dir = dir_ / ("pch-" + k), header = dir / "instance.hpp", stamp = dir / "ok";
    std::error_code ec;
    if (fs::exists(stamp, ec)) return header;
    detail::file_lock lock(dir_ / "locks" / ("pch-" + k + ".lock"));
    lock.lock();
    if (fs::exists(stamp, ec)) return header;
    fs::create_directories(dir, ec);
    std::ofstream(header) << "// Generated by loom (train/instance_cache.hpp): the headers every instance includes.\n"
                             "#include <loom/train/session_instance.hpp>\n#include <loom/train/whole_model.hpp>\n";
    std::vector<std::string> argv{tc_.compiler};
    argv.insert(argv.end(), tc_.flags.begin(), tc_.flags.end());
    argv.insert(argv.end(), {"-fPIC", "-x", "c++-header", "-o", (dir / "instance.hpp.gch").string(), header.string()});
    if (out) *out << "precompiling loom's headers for the instances (once per toolchain and header set)" << std::endl;
    if (detail::run_logged(argv, dir / "build.log", out, std::chrono::seconds(10)) != 0) {
      fs::remove(dir / "instance.hpp.gch", ec);
      return {};
    }
    std::ofstream(stamp) << "ok\n";
    return header;
  }

  const session_instance& load(const std::filesystem::path& entry, const std::string& k) {
    std::lock_guard g(mu_);
    if (auto it = loaded_.find(k); it != loaded_.end()) return *it->second;
    const auto so = entry / "instance.so";
    void* h = ::dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h)
      throw input_error("cannot load the cached instance '" + so.string() + "' (" + ::dlerror() +
                        "); remove its directory to compile it again");
    using instance_fn = const session_instance* (*)();
    using key_fn = const char* (*)();
    auto fn = reinterpret_cast<instance_fn>(::dlsym(h, "loom_session_instance_v1"));
    auto kf = reinterpret_cast<key_fn>(::dlsym(h, "loom_session_instance_key"));
    if (!fn || !kf || std::string(kf()) != k)
      throw input_error("the cached object '" + so.string() + "' is not the instance of key " + k +
                        "; remove its directory to compile it again");
    const session_instance* i = fn();
    loaded_.emplace(k, i);
    return *i;
  }

  toolchain tc_;
  std::filesystem::path dir_;
  mutable std::once_flag toolchain_once_;
  mutable std::string toolchain_;
  std::mutex mu_;
  std::map<std::string, const session_instance*> loaded_;
};

}  // namespace loom::train
