#pragma once
/// \file ascend_runtime: finds the CANN libraries at run time and resolves the functions loom calls.
///
///   auto rt = loom::device::ascend_runtime::load();     // throws runtime_not_found on a CPU-only box
///   loom::device::ascend_device npu(rt, 0);             // the device keeps the runtime alive
///
/// Loading, not linking: loom is compiled against its own declarations of the ACL/aclnn/HCCL
/// subset (device/detail/acl_api.hpp) and nothing is linked; load() dlopens the libraries and
/// dlsyms every entry point into an acl::api_table. A binary built with Ascend support therefore
/// starts on any machine and says, when asked for an NPU, which libraries it looked for and where.
///
/// Search order (reference §4.1 "practical rule", §4.2), for each library:
///   1. options.roots, in order                      <root>/lib64/<lib>
///   2. $ASCEND_HOME_PATH, then $ASCEND_TOOLKIT_HOME   <root>/lib64/<lib>   (set by set_env.sh)
///   3. /usr/local/Ascend/cann, /usr/local/Ascend/ascend-toolkit/latest   <root>/lib64/<lib>
///   4. the bare name through the dynamic loader     (LD_LIBRARY_PATH, ld.so.cache)
/// Libraries (CANN 8.x names; newest split names too):
///   libascendcl.so                                  runtime: device, stream, memory, events (required)
///   libnnopbase.so                                  aclTensor & co. (needed by every operator)
///   libopapi_math.so, libopapi_nn.so, libopapi_transformer.so, libopapi.so   aclnn operators
///                                                   (each op resolved from the first that exports it)
///   libhccl.so, libhcomm.so                         collectives; communicator management moved to
///                                                   libhcomm on the newest CANN
///   libmsprofiler.so                                the CANN profiler's C API (aclprof*, optional:
///                                                   only device::ascend_profiler needs it); looked
///                                                   up in libascendcl.so first (torch_npu does)
/// Once libascendcl is found, the others are looked for in its directory first.
///
/// Only libascendcl and its core runtime functions are mandatory. Missing operators or HCCL leave
/// null entries; using one throws device_error naming the function and the libraries searched.
/// Libraries are never unloaded (runtimes keep threads; pools may free memory at exit).
///
/// Not global state: a runtime is an immutable object (after load) owned by whoever loads it and
/// shared (std::shared_ptr) with the devices, contexts and memory pools that use it. It is passed
/// explicitly; the one implicit link is the calling thread's binding made by device_guard /
/// ascend_device, which mirrors ACL's own per-thread current device (aclrtSetDevice) so that the
/// stateless device::ascend policy functions (allocate, copy, synchronize) can reach the table.
#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/device/detail/acl_api.hpp>

namespace loom::device {

/// No usable NPU runtime: what() names the libraries and places tried and the fix (which
/// environment variables to set). Thrown by ascend_runtime::load.
class runtime_not_found : public error {
 public:
  using error::error;
};

/// Where ascend_runtime::load looks (see the file comment for the full order).
struct ascend_runtime_options {
  std::vector<std::string> roots;   ///< toolkit roots searched first (<root>/lib64)
  bool use_environment = true;      ///< $ASCEND_HOME_PATH, $ASCEND_TOOLKIT_HOME
  bool use_default_roots = true;    ///< /usr/local/Ascend/cann, /usr/local/Ascend/ascend-toolkit/latest
  bool use_loader_path = true;      ///< bare sonames via LD_LIBRARY_PATH / ld.so.cache
  /// Create events with aclrtCreateEventExWithFlag where the runtime exports it (re-recordable);
  /// false: always aclrtCreateEventWithFlag events, reset after each wait (the fallback of a
  /// runtime older than CANN 8.0.RC2; tests choose it to run that path on a newer one).
  bool reusable_events = true;
};

/// The loaded CANN libraries and the resolved function table. Create once (load), share.
class ascend_runtime {
 public:
  /// Loads the libraries and resolves every function of acl::api_table. Throws
  /// runtime_not_found when libascendcl.so cannot be loaded or lacks a core runtime function.
  static std::shared_ptr<const ascend_runtime> load(const ascend_runtime_options& options = {}) {
    std::shared_ptr<ascend_runtime> rt(new ascend_runtime);
    rt->load_all(options);
    return rt;
  }

  /// The function table. Null members: the loaded libraries do not export that function.
  const acl::api_table& api() const noexcept { return api_; }

  /// aclInit(NULL), at most once per runtime object (thread-safe). ACL_ERROR_REPEAT_INITIALIZE
  /// (100002) counts as success (CANN 8.1 allows one aclInit per process; reference §1.3).
  /// Throws device_error on any other failure.
  void initialize() const {
    std::call_once(init_once_, [this] {
      const acl::aclError rc = api_.aclInit(nullptr);
      if (rc != acl::success && rc != 100002) {
        const char* m = api_.aclGetRecentErrMsg ? api_.aclGetRecentErrMsg() : nullptr;
        throw device_error(rc, "aclInit", m ? m : "");
      }
      initialized_.store(rc == acl::success);  // 100002: someone else's aclInit, theirs to finalize
    });
  }

  /// Undoes initialize(): aclFinalizeReference where the runtime has it (reference-counted, so
  /// another library's aclInit in the process stays valid), else aclFinalize (§1.3: "call before
  /// the process exits"). Call it last, after every device object, stream and buffer of this
  /// runtime is gone: the per-device memory pools keep the runtime alive (so its destructor, which
  /// also finalizes, never runs once a device was used) and never free after it. Idempotent; a
  /// no-op when this object did not initialise ACL. Returns the ACL status (0 on success).
  acl::aclError finalize() const noexcept {
    if (!initialized_.exchange(false)) return acl::success;
    if (api_.aclFinalizeReference) return api_.aclFinalizeReference(nullptr);
    return api_.aclFinalize();
  }

  /// The installed CANN version ("" when the runtime cannot say): aclsysGetVersionStr("runtime")
  /// where present (CANN 9.0 on; hicann/runtime docs/api_docs/aclsysGetVersionStr.md and its
  /// sample), else the deprecated aclsysGetCANNVersion(ACL_PKG_NAME_CANN) of CANN 8.x, looked up
  /// by name and read through the 8.1.RC1 layout of aclCANNPackageVersion (128 bytes of version
  /// text first; §1.3). Needs no initialize().
  std::string cann_version() const {
    char text[acl::pkg_version_max + 1] = {};
    if (api_.aclsysGetVersionStr) {
      char pkg[] = "runtime";
      if (api_.aclsysGetVersionStr(pkg, text) == acl::success) return std::string(text);
    }
    struct package_version {  // aclCANNPackageVersion (8.1.RC1 acl.h): version, 4 parts, reserved
      char version[acl::pkg_version_max];
      char parts[4][64];
      char reserved[acl::pkg_version_max];
    };
    using legacy_query = acl::aclError (*)(int, package_version*);
    if (auto* f = reinterpret_cast<legacy_query>(symbol("aclsysGetCANNVersion"))) {
      package_version v{};
      if (f(/*ACL_PKG_NAME_CANN*/ 0, &v) == acl::success)
        return std::string(v.version, ::strnlen(v.version, sizeof v.version));
    }
    return {};
  }

  /// Full path (or bare name, when found through the loader path) of each loaded library,
  /// "libascendcl.so -> /opt/.../lib64/libascendcl.so" lines.
  const std::vector<std::pair<std::string, std::string>>& libraries() const noexcept { return loaded_; }
  /// Directory libascendcl.so was loaded from ("" when found through the loader path).
  const std::string& home() const noexcept { return home_; }
  /// Functions of the table no loaded library exports (operators, HCCL, optional queries).
  const std::vector<std::string>& missing() const noexcept { return missing_; }
  /// True when device::ascend_event creates re-recordable events (aclrtCreateEventExWithFlag:
  /// exported and ascend_runtime_options::reusable_events); false: aclrtCreateEventWithFlag
  /// events, each wait followed by aclrtResetEvent on the waiting stream.
  bool reusable_events() const noexcept { return reusable_events_; }
  /// True when every aclnn operator and aclCreateTensor & co. were resolved.
  bool has_operators() const noexcept { return has_ops_; }
  /// The aclnn operators and tensor functions (aclCreateTensor & co.) no loaded library exports.
  const std::vector<std::string>& missing_operators() const noexcept { return missing_operators_; }
  /// True when every HCCL function loom uses was resolved.
  bool has_hccl() const noexcept { return has_hccl_; }
  /// True when the CANN profiler's session functions (aclprofInit ... aclprofFinalize) were
  /// resolved, from libascendcl.so or libmsprofiler.so.
  bool has_profiler() const noexcept { return has_prof_; }
  /// Any symbol of the loaded libraries (nullptr when none exports it) — for extensions and the
  /// emulation's control functions in tests.
  void* symbol(const char* name) const noexcept {
    for (void* h : handles_)
      if (void* p = ::dlsym(h, name)) return p;
    return nullptr;
  }
  /// The names of the libraries searched for `name`'s group, for error messages.
  std::string searched_for(std::string_view function) const {
    if (function.starts_with("Hccl")) return "libhccl.so, libhcomm.so";
    if (function.starts_with("aclprof")) return "libascendcl.so, libmsprofiler.so";
    if (function.starts_with("aclnn")) return "libopapi_math.so, libopapi_nn.so, libopapi_transformer.so, libopapi.so";
    if (function.starts_with("aclCreate") || function.starts_with("aclDestroy")) return "libnnopbase.so";
    return "libascendcl.so";
  }

  ascend_runtime(const ascend_runtime&) = delete;
  ascend_runtime& operator=(const ascend_runtime&) = delete;
  /// finalize() (see there); libraries stay loaded.
  ~ascend_runtime() { (void)finalize(); }

 private:
  ascend_runtime() = default;

  struct place {
    std::string dir;    // "" = loader path
    std::string label;  // for the message
  };

  std::vector<place> places(const ascend_runtime_options& o, std::string& notes) const {
    std::vector<place> out;
    auto add_root = [&](const std::string& root, const std::string& label) {
      out.push_back({(std::filesystem::path(root) / "lib64").string(), label});
    };
    for (const auto& r : o.roots) add_root(r, r + "/lib64");
    if (o.use_environment)
      for (const char* var : {"ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"}) {
        const char* v = std::getenv(var);
        if (v && *v) add_root(v, std::string("$") + var + "=" + v + " -> " + v + "/lib64");
        else notes += std::string("  $") + var + " is not set\n";
      }
    if (o.use_default_roots)
      for (const char* r : {"/usr/local/Ascend/cann", "/usr/local/Ascend/ascend-toolkit/latest"})
        add_root(r, std::string(r) + "/lib64");
    if (o.use_loader_path) {
      const char* ld = std::getenv("LD_LIBRARY_PATH");
      out.push_back({"", std::string("the dynamic loader's path (LD_LIBRARY_PATH=") + (ld && *ld ? ld : "<unset>") +
                             ", ld.so.cache)"});
    }
    return out;
  }

  /// dlopen(lib) from `preferred` first, then every place. Returns the handle or nullptr; appends
  /// what was tried to `log`.
  void* open(const std::string& lib, const std::string& preferred, const std::vector<place>& where,
             std::string* log, std::string* found_dir) {
    auto try_dir = [&](const std::string& dir, const std::string& label) -> void* {
      if (!dir.empty()) {
        const auto path = (std::filesystem::path(dir) / lib).string();
        std::error_code ec;
        if (!std::filesystem::exists(path, ec)) {
          if (log) *log += "  " + label + "/" + lib + ": not there\n";
          return nullptr;
        }
        void* h = ::dlopen(path.c_str(), RTLD_LAZY | RTLD_GLOBAL);
        if (!h && log) *log += "  " + path + ": present but dlopen failed: " + dlerror_text() + "\n";
        if (h) {
          loaded_.emplace_back(lib, path);
          if (found_dir) *found_dir = dir;
        }
        return h;
      }
      void* h = ::dlopen(lib.c_str(), RTLD_LAZY | RTLD_GLOBAL);
      if (!h && log) *log += "  " + lib + " via " + label + ": " + dlerror_text() + "\n";
      if (h) {
        loaded_.emplace_back(lib, lib + " (dynamic loader path)");
        if (found_dir) *found_dir = "";
      }
      return h;
    };
    if (!preferred.empty())
      if (void* h = try_dir(preferred, preferred)) return h;
    for (const auto& p : where)
      if (p.dir != preferred || p.dir.empty())
        if (void* h = try_dir(p.dir, p.label)) return h;
    return nullptr;
  }

  static std::string dlerror_text() {
    const char* e = ::dlerror();
    return e ? e : "unknown dlopen error";
  }

  void load_all(const ascend_runtime_options& o) {
    std::string notes, log;
    const auto where = places(o, notes);
    void* acl = open("libascendcl.so", "", where, &log, &home_);
    if (!acl)
      throw runtime_not_found(
          "no Ascend NPU runtime found: could not load libascendcl.so (the CANN ACL runtime).\n" + notes +
          "  tried:\n" + log +
          "  fix: install the CANN toolkit and NPU driver, then `source <toolkit>/set_env.sh` (it sets "
          "ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME and LD_LIBRARY_PATH), or set ASCEND_HOME_PATH to the toolkit root "
          "(the directory whose lib64/ holds libascendcl.so). loom loads libascendcl.so, libnnopbase.so, "
          "libopapi.so (or libopapi_math/_nn/_transformer.so) and libhccl.so (+ libhcomm.so) at run time; nothing "
          "is linked.");
    handles_.push_back(acl);

    std::vector<std::string> core_missing;
#define LOOM_ACL_RESOLVE_CORE(name, ret, params)                               \
  api_.name = reinterpret_cast<decltype(api_.name)>(::dlsym(acl, #name)); \
  if (!api_.name) core_missing.push_back(#name);
    LOOM_ACL_RUNTIME_FUNCTIONS(LOOM_ACL_RESOLVE_CORE)
#undef LOOM_ACL_RESOLVE_CORE
    if (!core_missing.empty()) {
      std::string names;
      for (const auto& n : core_missing) names += (names.empty() ? "" : ", ") + n;
      throw runtime_not_found("the NPU runtime " + loaded_.front().second + " lacks functions loom needs (" + names +
                              "): it is not a CANN 8.x libascendcl.so; point ASCEND_HOME_PATH at a CANN 8.x toolkit");
    }
#define LOOM_ACL_RESOLVE_OPTIONAL(name, ret, params)                           \
  api_.name = reinterpret_cast<decltype(api_.name)>(::dlsym(acl, #name)); \
  if (!api_.name) missing_.push_back(#name);
    LOOM_ACL_OPTIONAL_FUNCTIONS(LOOM_ACL_RESOLVE_OPTIONAL)
    LOOM_ACL_NEWER_FUNCTIONS(LOOM_ACL_RESOLVE_OPTIONAL)
#undef LOOM_ACL_RESOLVE_OPTIONAL
    reusable_events_ = o.reusable_events && api_.aclrtCreateEventExWithFlag;
    if (!reusable_events_ && !api_.aclrtResetEvent)
      throw runtime_not_found("the NPU runtime " + loaded_.front().second +
                              " exports neither aclrtCreateEventExWithFlag (CANN 8.0.RC2+) nor aclrtResetEvent, so "
                              "loom cannot reuse an event safely; point ASCEND_HOME_PATH at a CANN 8.x toolkit");

    // The others: the runtime's directory first, then the same places.
    auto open_group = [&](std::initializer_list<const char*> libs) {
      std::vector<void*> hs;
      for (const char* lib : libs)
        if (void* h = open(lib, home_, where, nullptr, nullptr)) {
          hs.push_back(h);
          handles_.push_back(h);
        }
      return hs;
    };
    auto resolve = [&](const std::vector<void*>& hs, const char* name) -> void* {
      for (void* h : hs)
        if (void* p = ::dlsym(h, name)) return p;
      missing_.push_back(name);
      return nullptr;
    };
    const auto meta = open_group({"libnnopbase.so"});
    const auto ops = open_group({"libopapi_math.so", "libopapi_nn.so", "libopapi_transformer.so", "libopapi.so"});
    const auto hccl = open_group({"libhccl.so", "libhcomm.so"});
    // aclprof*: exported by libascendcl itself on the toolkits torch_npu supports (it resolves them
    // through libascendcl), by libmsprofiler.so on others (§4.2, §5.1): both are searched.
    auto prof = open_group({"libmsprofiler.so"});
    prof.insert(prof.begin(), acl);
    const std::size_t before_ops = missing_.size();
#define LOOM_ACL_RESOLVE_META(name, ret, params) api_.name = reinterpret_cast<decltype(api_.name)>(resolve(meta, #name));
    LOOM_ACL_META_FUNCTIONS(LOOM_ACL_RESOLVE_META)
#undef LOOM_ACL_RESOLVE_META
#define LOOM_ACL_RESOLVE_OP(name, ret, params) api_.name = reinterpret_cast<decltype(api_.name)>(resolve(ops, #name));
    LOOM_ACLNN_FUNCTIONS(LOOM_ACL_RESOLVE_OP)
#undef LOOM_ACL_RESOLVE_OP
    has_ops_ = missing_.size() == before_ops;
    missing_operators_.assign(missing_.begin() + std::ptrdiff_t(before_ops), missing_.end());
    const std::size_t before_hccl = missing_.size();
#define LOOM_ACL_RESOLVE_HCCL(name, ret, params) api_.name = reinterpret_cast<decltype(api_.name)>(resolve(hccl, #name));
    LOOM_HCCL_FUNCTIONS(LOOM_ACL_RESOLVE_HCCL)
#undef LOOM_ACL_RESOLVE_HCCL
    has_hccl_ = missing_.size() == before_hccl;
    const std::size_t before_prof = missing_.size();
#define LOOM_ACL_RESOLVE_PROF(name, ret, params) api_.name = reinterpret_cast<decltype(api_.name)>(resolve(prof, #name));
    LOOM_ACL_PROF_FUNCTIONS(LOOM_ACL_RESOLVE_PROF)
#undef LOOM_ACL_RESOLVE_PROF
    has_prof_ = missing_.size() == before_prof;
  }

  acl::api_table api_{};
  std::vector<void*> handles_;
  std::vector<std::pair<std::string, std::string>> loaded_;
  std::vector<std::string> missing_, missing_operators_;
  bool reusable_events_ = false;
  std::string home_;
  bool has_ops_ = false, has_hccl_ = false, has_prof_ = false;
  mutable std::once_flag init_once_;
  mutable std::atomic<bool> initialized_{false};  // this object's aclInit succeeded and is not finalized
};

}  // namespace loom::device
