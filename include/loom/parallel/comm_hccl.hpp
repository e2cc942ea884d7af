#pragma once
/// \file comm::hccl — a communicator over HCCL (Huawei Collective Communication Library) for NPUs.
///
///   loom::device::ascend_device npu(runtime, local_rank);              // on the rank's thread
///   auto world = loom::comm::hccl::create(mpi_world, npu.context());  // root info over MPI
///   world.all_reduce(std::span{grads_on_npu, n});                      // spans of NPU memory
///
/// Every span is NPU memory of the calling thread's current device (the context's device). Semantics
/// are those of loom::parallel::communicator (parallel/comm.hpp), with these HCCL specifics (loom's
/// API reference §3, §6, §7, §8):
///  * Creation, two ways (docs/ascend.md, "Launching"):
///    - root info (create, create_from_file): rank 0 calls HcclGetRootInfo; the opaque 4108-byte
///      root info is broadcast over a bootstrap communicator (any loom communicator — comm::mpi
///      across processes, comm::threads in one process) or a file (single node); every rank then
///      calls HcclCommInitRootInfo. The rank order is the bootstrap's.
///    - rank table (create_from_rank_table): every rank calls HcclCommInitClusterInfo with the
///      rank table file (RANK_TABLE_FILE, hccl.json) and its rank (RANK_ID / RANK), as MindSpore
///      and torch_npu's rank-table launch do; no bootstrap communicator. loom checks the table
///      first (parallel/rank_table.hpp) so that a bad table fails with the file and the fix.
///    HCCL_CONNECT_TIMEOUT bounds the rendezvous in both.
///  * Streams: collectives run on a communication stream owned by the communicator, ordered after
///    the work already queued on the context's compute stream (event record + stream wait) and
///    before work queued later (the compute stream waits on the collective's completion event).
///    Blocking calls then synchronize the communication stream with comm_options::timeout
///    (aclrtSynchronizeStreamWithTimeout): an expiry throws comm_timeout; HCCL's own
///    HCCL_EXEC_TIMEOUT (default 1836 s on A2) still applies underneath. Asynchronous variants
///    return a request that waits on the completion event.
///  * In place: whether HcclAllReduce accepts sendBuf == recvBuf is unconfirmed (reference §8), so
///    by default loom reduces into pool scratch and copies back (one extra device copy);
///    hccl_options::in_place = true passes the same buffer, once verified on the target CANN.
///    reduce_scatter/all_gather with overlapping input and output stage through scratch likewise.
///  * No AVG in HCCL: avg = SUM then aclnnInplaceMuls(1/size) on the communication stream. No fp64
///    reductions and no PROD for bf16/int16 on A2 (documented): fp64 reductions throw input_error.
///  * send/recv: HcclSend/HcclRecv are paired and synchronous; HCCL has no tags, so messages between
///    a pair are matched in issue order and the tag is only checked to be >= 0.
///  * split(color, key): the (color, key) pairs are all-gathered over this communicator, then the
///    members call HcclCreateSubCommConfig on the *global* communicator (the one made by
///    HcclCommInitRootInfo), also when this communicator is itself a split: HCCL "only splits a
///    global communicator, not a sub-communicator", and takes rankIds "ordered", the index of a
///    rank in rankIds becoming its rank in the sub-communicator (hicann/hcomm 9.0
///    docs/zh/api_ref/comm_mgr_c/HcclCreateSubCommConfig.md). So loom passes the members' global
///    ranks in ascending order, and a key that would order a group otherwise throws input_error
///    (keys may group and tie, not permute: give ranks keys that rise with their global rank).
///    The sub-communicator id is unique in the global communicator: (split counter << 40) |
///    (first global rank << 20) | color, the counter being the maximum over the splitting ranks
///    plus one (color < 2^20, at most 2^20 ranks).
/// Failures of HCCL calls throw loom::device_error(HcclResult, "HcclXxx", HcclGetErrorString +
/// aclGetRecentErrMsg, call site); errors of the asynchronous work surface at the synchronize.

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/device/ascend.hpp>
#include <loom/kernels/ascend/common.hpp>
#include <loom/parallel/comm.hpp>
#include <loom/parallel/detail/reduce.hpp>
#if __has_include(<nlohmann/json.hpp>)
#include <loom/parallel/rank_table.hpp>
#define LOOM_HCCL_HAS_RANK_TABLE 1
#endif

namespace loom::parallel::detail {

namespace acl = loom::device::acl;

/// Throws device_error unless rc == HCCL_SUCCESS.
inline void hccl_check(const acl::api_table& t, acl::HcclResult rc, std::string_view api,
                       loom::source_location where = loom::source_location::current()) {
  if (rc == acl::hccl_success) [[likely]]
    return;
  const char* text = t.HcclGetErrorString ? t.HcclGetErrorString(rc) : nullptr;
  std::string msg = text ? text : "";
  if (const std::string recent = device::detail::acl_recent_message(t); !recent.empty()) msg += ": " + recent;
  throw device_error(int(rc), api, msg, where);
}

/// Throws device_error when the runtime has no (complete) HCCL: names the libraries and the fix.
inline void require_hccl(const device::ascend_runtime& rt, loom::source_location where = loom::source_location::current()) {
  if (rt.has_hccl()) [[likely]]
    return;
  std::string missing;
  for (const auto& m : rt.missing())
    if (m.starts_with("Hccl")) missing += (missing.empty() ? "" : ", ") + m;
  throw device_error(5 /* HCCL_E_NOT_SUPPORT */, "comm::hccl",
                     "HCCL is not available: libhccl.so / libhcomm.so next to libascendcl.so (or on the loader path) "
                     "do not export " + missing + "; install the CANN toolkit's HCCL package (set_env.sh puts it on "
                     "LD_LIBRARY_PATH)",
                     where);
}

/// HCCL's element type for T (its numbering differs from aclDataType); RESERVED = move bytes.
template <class T>
constexpr acl::HcclDataType hccl_dtype() {
  if constexpr (std::is_same_v<T, float>) return acl::hccl_fp32;
  else if constexpr (std::is_same_v<T, double>) return acl::hccl_fp64;
  else if constexpr (std::is_same_v<T, Eigen::half>) return acl::hccl_fp16;
  else if constexpr (std::is_same_v<T, Eigen::bfloat16>) return acl::hccl_bfp16;
  else if constexpr (std::is_same_v<T, std::int8_t>) return acl::hccl_int8;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return acl::hccl_uint8;
  else if constexpr (std::is_same_v<T, std::int16_t>) return acl::HcclDataType(1);   // HCCL_DATA_TYPE_INT16
  else if constexpr (std::is_same_v<T, std::uint16_t>) return acl::HcclDataType(8);  // HCCL_DATA_TYPE_UINT16
  else if constexpr (std::is_same_v<T, std::int32_t>) return acl::hccl_int32;
  else if constexpr (std::is_same_v<T, std::uint32_t>) return acl::HcclDataType(9);  // HCCL_DATA_TYPE_UINT32
  else if constexpr (std::is_same_v<T, std::int64_t>) return acl::hccl_int64;
  else if constexpr (std::is_same_v<T, std::uint64_t>) return acl::HcclDataType(6);  // HCCL_DATA_TYPE_UINT64
  else return acl::HcclDataType(255);                                                // HCCL_DATA_TYPE_RESERVED
}

inline bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn) noexcept {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return an && bn && x < y + bn && y < x + an;
}

}  // namespace loom::parallel::detail

namespace loom::parallel::comm {

namespace acl = loom::device::acl;

/// Options of an HCCL communicator (inherited by split()).
struct hccl_options {
  /// Blocking calls and request waits longer than this throw comm_timeout; zero waits forever.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  /// Pass sendBuf == recvBuf to HcclAllReduce (unconfirmed legality; see the file comment).
  bool in_place = false;
};

/// One rank of an HCCL communicator. Move-only; used by one thread at a time, a thread whose
/// current NPU is the context's. Models loom::parallel::communicator for spans of NPU memory.
class hccl_communicator {
 public:
  hccl_communicator(hccl_communicator&&) noexcept = default;
  hccl_communicator& operator=(hccl_communicator&&) noexcept = default;
  ~hccl_communicator() = default;

  /// Collective over `bootstrap` (any loom communicator): rank 0 creates the root info, the
  /// bootstrap broadcasts it, every rank joins with its bootstrap rank. `ctx` is this rank's NPU
  /// context; its stream orders the collectives. Throws device_error on HCCL failure.
  template <class Bootstrap>
  static hccl_communicator create(Bootstrap& bootstrap, context<device::ascend>& ctx, hccl_options options = {}) {
    detail::require_hccl(*ctx.runtime);
    const auto& api = ctx.api();
    acl::HcclRootInfo root{};
    if (bootstrap.rank() == 0) detail::hccl_check(api, api.HcclGetRootInfo(&root), "HcclGetRootInfo");
    bootstrap.broadcast(std::span<char>(root.internal, acl::hccl_root_info_bytes), 0);
    return join(root, bootstrap.size(), bootstrap.rank(), ctx, options);
  }

  /// Single-node creation without a bootstrap communicator: rank 0 writes the root info to `path`
  /// (temporary file + rename, so readers never see a partial file) and removes it once every rank
  /// has joined; the other ranks poll for it up to options.timeout. `path` must not exist when
  /// rank 0 starts (a stale file from an earlier job would pair ranks with a dead root): rank 0
  /// throws input_error if it does — use a per-job name.
  static hccl_communicator create_from_file(const std::filesystem::path& path, int nranks, int rank,
                                            context<device::ascend>& ctx, hccl_options options = {}) {
    namespace fs = std::filesystem;
    detail::require_hccl(*ctx.runtime);
    const auto& api = ctx.api();
    acl::HcclRootInfo root{};
    if (rank == 0) {
      if (fs::exists(path))
        throw input_error("comm::hccl::create_from_file: " + path.string() +
                          " already exists (a stale root-info file?); delete it or use a per-job path");
      detail::hccl_check(api, api.HcclGetRootInfo(&root), "HcclGetRootInfo");
      const fs::path tmp = path.string() + ".tmp";
      {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out.write(root.internal, acl::hccl_root_info_bytes);
        out.flush();
        if (!out) throw input_error("comm::hccl::create_from_file: cannot write " + tmp.string() + "; check the directory");
      }
      fs::rename(tmp, path);
    } else {
      const auto deadline = std::chrono::steady_clock::now() + options.timeout;
      for (;;) {
        std::error_code ec;
        if (fs::file_size(path, ec) == acl::hccl_root_info_bytes && !ec) {
          std::ifstream in(path, std::ios::binary);
          if (in.read(root.internal, acl::hccl_root_info_bytes)) break;
        }
        if (options.timeout.count() > 0 && std::chrono::steady_clock::now() > deadline)
          throw comm_timeout("comm::hccl::create_from_file: rank " + std::to_string(rank) + " waited " +
                             std::to_string(options.timeout.count()) + " ms for " + path.string() +
                             " from rank 0; is rank 0 running, with the same path?");
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    auto c = join(root, nranks, rank, ctx, options);
    if (rank == 0) std::filesystem::remove(path);
    return c;
  }

#if LOOM_HCCL_HAS_RANK_TABLE
  /// Creation from a rank table, without a bootstrap communicator: every rank of the table calls
  /// this (any order, any process; HCCL_CONNECT_TIMEOUT bounds the wait), which calls
  /// HcclCommInitClusterInfo (CANN HCCL API reference, "HcclCommInitClusterInfo"; the file format
  /// is CANN's HCCL user guide's rank table template 1.0, see parallel/rank_table.hpp).
  ///   path  the rank table; empty: $RANK_TABLE_FILE.
  ///   rank  this process's rank_id in the table; -1: from the environment, $RANK_ID (MindSpore)
  ///         winning over $RANK (torch_npu); both set and different is an error.
  ///   ctx   this rank's NPU context. It must be on the rank's device_id in the table
  ///         (rank_table::device_of(rank), a physical id: the logical id differs when
  ///         ASCEND_RT_VISIBLE_DEVICES remaps devices); HCCL rejects another device.
  /// size() is the number of ranks in the table and rank() the rank_id. Throws input_error naming
  /// the file and the fix when the table is missing, not JSON, incomplete, has rank ids other than
  /// 0..n-1 each once, a device id twice in a server, a status other than "completed", or lacks
  /// `rank` (every problem of the file in one message); device_error when HCCL rejects the table or
  /// the device, and device_error with code HCCL_E_TIMEOUT (9) when a rank never joins.
  static hccl_communicator create_from_rank_table(context<device::ascend>& ctx, const std::filesystem::path& path = {},
                                                  int rank = -1, hccl_options options = {}) {
    const std::filesystem::path file = rank_table_path(path);
    const int r = rank >= 0 ? rank : rank_from_env();
    const rank_table table = read_rank_table(file);
    table.check_rank(r);
    if (file.string().size() >= 4096)
      throw input_error("comm::hccl::create_from_rank_table: the rank table path " + file.string().substr(0, 64) +
                        "... is 4096 bytes or longer (HCCL's limit); move the file to a shorter path");
    detail::require_hccl(*ctx.runtime);
    const auto& api = ctx.api();
    acl::HcclComm comm = nullptr;
    detail::hccl_check(api, api.HcclCommInitClusterInfo(file.c_str(), std::uint32_t(r), &comm), "HcclCommInitClusterInfo");
    return hccl_communicator(std::make_unique<state>(comm, r, table.size(), ctx, options, "world"));
  }
#endif

  int rank() const noexcept { return s_->rank; }
  int size() const noexcept { return s_->size; }
  const std::string& name() const noexcept { return s_->name; }
  const hccl_options& options() const noexcept { return s_->options; }
  acl::HcclComm native_handle() const noexcept { return s_->comm; }
  /// The communication stream the collectives run on.
  acl::aclrtStream stream() const noexcept { return s_->comm_ctx.stream; }
  /// Attaches an observer of this rank's operations on this communicator (null = none, the
  /// default); split() children inherit it. See comm_observer in comm.hpp. Blocking operations
  /// are observed until the communication stream finished them; an asynchronous one's start is
  /// its enqueue, its wait the event synchronisation.
  void set_observer(comm_observer* o) noexcept { s_->observer = o; }
  comm_observer* observer() const noexcept { return s_->observer; }

  /// x = op over ranks of x (x in NPU memory). Throws input_error for fp64 and for avg on
  /// integers, comm_timeout, device_error.
  template <reducible T>
  void all_reduce(std::span<T> x, reduce_op op = reduce_op::sum) {
    const comm_scope obs(s_->observer, event("all_reduce", x.size_bytes()));
    issue_all_reduce(x, op);
    complete("all_reduce");
  }
  template <reducible T>
  request all_reduce_async(std::span<T> x, reduce_op op = reduce_op::sum) {
    const comm_scope obs(s_->observer, event("all_reduce_async", x.size_bytes()));
    issue_all_reduce(x, op);
    return observed(event("all_reduce_wait", x.size_bytes()), make_request("all_reduce_async"));
  }

  /// Rank r: out = op over ranks of in[r*m, (r+1)*m), m = out.size(); in.size() == size()*m.
  template <class In, reducible T>
    requires std::same_as<std::remove_const_t<In>, T>
  void reduce_scatter(std::span<In> in, std::span<T> out, reduce_op op = reduce_op::sum) {
    const comm_scope obs(s_->observer, event("reduce_scatter", in.size_bytes()));
    issue_reduce_scatter(std::span<const T>(in.data(), in.size()), out, op);
    complete("reduce_scatter");
  }
  template <class In, reducible T>
    requires std::same_as<std::remove_const_t<In>, T>
  request reduce_scatter_async(std::span<In> in, std::span<T> out, reduce_op op = reduce_op::sum) {
    const comm_scope obs(s_->observer, event("reduce_scatter_async", in.size_bytes()));
    issue_reduce_scatter(std::span<const T>(in.data(), in.size()), out, op);
    return observed(event("reduce_scatter_wait", in.size_bytes()), make_request("reduce_scatter_async"));
  }

  /// out[j*m, (j+1)*m) = in of rank j, m = in.size(); out.size() == size()*m.
  template <class In, transferable T>
    requires std::same_as<std::remove_const_t<In>, T>
  void all_gather(std::span<In> in, std::span<T> out) {
    const comm_scope obs(s_->observer, event("all_gather", out.size_bytes()));
    issue_all_gather(std::span<const T>(in.data(), in.size()), out);
    complete("all_gather");
  }
  template <class In, transferable T>
    requires std::same_as<std::remove_const_t<In>, T>
  request all_gather_async(std::span<In> in, std::span<T> out) {
    const comm_scope obs(s_->observer, event("all_gather_async", out.size_bytes()));
    issue_all_gather(std::span<const T>(in.data(), in.size()), out);
    return observed(event("all_gather_wait", out.size_bytes()), make_request("all_gather_async"));
  }

  /// x = x of rank root on every rank (HcclBroadcast, in place).
  template <transferable T>
  void broadcast(std::span<T> x, int root) {
    check_rank(root, "broadcast", "root");
    const comm_scope obs(s_->observer, event("broadcast", x.size_bytes(), root));
    order_after_compute();
    const auto [dt, count] = wire<T>(x.size());
    detail::hccl_check(api(), api().HcclBroadcast(x.data(), count, dt, uint32_t(root), s_->comm, stream()), "HcclBroadcast");
    complete("broadcast");
  }

  /// Sends in to rank dst (HcclSend; paired with the peer's recv, matched in issue order).
  template <class In>
    requires transferable<std::remove_const_t<In>>
  void send(std::span<In> in, int dst, int tag) {
    using T = std::remove_const_t<In>;
    check_rank(dst, "send", "destination");
    check_tag(tag, "send");
    const comm_scope obs(s_->observer, event("send", in.size_bytes(), dst));
    order_after_compute();
    const auto [dt, count] = wire<T>(in.size());
    detail::hccl_check(api(), api().HcclSend(const_cast<T*>(in.data()), count, dt, uint32_t(dst), s_->comm, stream()), "HcclSend");
    complete("send");
  }
  /// Receives into x from rank src (HcclRecv); sizes must match the peer's send.
  template <transferable T>
  void recv(std::span<T> x, int src, int tag) {
    check_rank(src, "recv", "source");
    check_tag(tag, "recv");
    const comm_scope obs(s_->observer, event("recv", x.size_bytes(), src));
    order_after_compute();
    const auto [dt, count] = wire<T>(x.size());
    detail::hccl_check(api(), api().HcclRecv(x.data(), count, dt, uint32_t(src), s_->comm, stream()), "HcclRecv");
    complete("recv");
  }

  /// Returns once every rank has entered barrier() (HcclBarrier + synchronize).
  void barrier() {
    const comm_scope obs(s_->observer, event("barrier", 0));
    order_after_compute();
    detail::hccl_check(api(), api().HcclBarrier(s_->comm, stream()), "HcclBarrier");
    complete("barrier");
  }

  /// MPI_Comm_split semantics, restricted by HCCL (see the file comment): ranks with equal color
  /// form a group ordered by key, which must not reorder them against their global rank.
  /// Collective over this communicator. Throws input_error for a color outside [0, 2^20) or a
  /// key order HCCL cannot express, device_error for HCCL failures.
  hccl_communicator split(int color, int key, std::string name = {}) {
    if (color < 0 || color >= (1 << 20))
      throw input_error("comm::hccl::split: color " + std::to_string(color) +
                        " must be in [0, 2^20); every rank must pass a color >= 0");
    const int n = size();
    auto& ctx = s_->comm_ctx;
    constexpr std::size_t fields = 3;  // color, key, this rank's split counter
    kernels::ascend::scratch<std::int32_t> buf(ctx, fields * (1 + std::size_t(n)));
    const std::int32_t mine[fields] = {color, key, std::int32_t(s_->global->splits)};
    device::ascend::copy_to_device(buf.data(), mine, sizeof mine, ctx.stream);  // thread's binding: ctx's runtime
    all_gather(std::span<const std::int32_t>(buf.data(), fields),
               std::span<std::int32_t>(buf.data() + fields, fields * std::size_t(n)));
    std::vector<std::int32_t> all(fields * std::size_t(n));
    device::ascend::copy_to_host(all.data(), buf.data() + fields, all.size() * sizeof(std::int32_t), ctx.stream);
    std::int32_t counter = 0;
    for (int r = 0; r < n; ++r) counter = std::max(counter, all[fields * std::size_t(r) + 2]);
    s_->global->splits = std::uint64_t(++counter);
    std::vector<std::uint32_t> members;  // ranks of this communicator, then global ranks
    for (int r = 0; r < n; ++r)
      if (all[fields * std::size_t(r)] == color) members.push_back(std::uint32_t(r));
    std::stable_sort(members.begin(), members.end(), [&](std::uint32_t a, std::uint32_t b) {
      return all[fields * a + 1] < all[fields * b + 1];
    });
    const auto me = std::uint32_t(std::find(members.begin(), members.end(), std::uint32_t(rank())) - members.begin());
    std::vector<std::uint32_t> global(members.size());
    for (std::size_t i = 0; i < members.size(); ++i) global[i] = s_->global_ranks[members[i]];
    for (std::size_t i = 1; i < global.size(); ++i)
      if (global[i] <= global[i - 1])
        throw input_error("comm::hccl::split: the keys of color " + std::to_string(color) + " put global rank " +
                          std::to_string(global[i]) + " after global rank " + std::to_string(global[i - 1]) +
                          "; HcclCreateSubCommConfig numbers a sub-communicator's ranks in ascending global order, so "
                          "keys may not reorder them — pass keys that rise with the rank (e.g. key = rank())");
    const std::uint64_t sub_id =
        (std::uint64_t(counter) << 40) | (std::uint64_t(global.front()) << 20) | std::uint64_t(color);
    acl::HcclCommConfig cfg;
    acl::hccl_comm_config_init(&cfg);
    acl::HcclComm sub = nullptr;
    detail::hccl_check(api(), api().HcclCreateSubCommConfig(&s_->global->comm, std::uint32_t(global.size()), global.data(),
                                                            sub_id, me, &cfg, &sub),
                       "HcclCreateSubCommConfig");
    if (name.empty()) name = s_->name + "/" + std::to_string(color);
    auto st = std::make_unique<state>(sub, int(me), int(members.size()), s_->compute, s_->options, std::move(name),
                                      s_->global);
    st->global_ranks = std::move(global);
    hccl_communicator child(std::move(st));
    child.s_->observer = s_->observer;
    return child;
  }

 private:
  comm_event event(const char* op, std::size_t bytes, int peer = -1) const noexcept {
    return {op, bytes, s_->size, s_->name, peer};
  }
  /// r with its wait observed as `wait` (r itself without an observer).
  request observed(const comm_event& wait, request r) const {
    if (!s_->observer) return r;
    return parallel::detail::observe_wait(std::move(r), s_->observer, wait);
  }

  /// The runtime's function table (the compute context's runtime).
  const acl::api_table& api() const noexcept { return s_->compute.api(); }

  /// The global communicator (HcclCommInitRootInfo's), shared by every communicator split from it:
  /// HcclCreateSubCommConfig only splits a global communicator, which must therefore outlive its
  /// sub-communicators. Destroyed with the last of them.
  struct global_comm {
    acl::HcclComm comm = nullptr;
    std::shared_ptr<const device::ascend_runtime> runtime;
    std::uint64_t splits = 0;  // this rank's split counter (see split())
    global_comm(acl::HcclComm c, std::shared_ptr<const device::ascend_runtime> rt) : comm(c), runtime(std::move(rt)) {}
    global_comm(const global_comm&) = delete;
    global_comm& operator=(const global_comm&) = delete;
    ~global_comm() {
      if (!comm) return;
      const acl::HcclResult rc = runtime->api().HcclCommDestroy(comm);
      if (rc != acl::hccl_success) std::fprintf(stderr, "loom: warning: HcclCommDestroy failed with code %d\n", int(rc));
    }
  };

  struct state {
    acl::HcclComm comm = nullptr;
    std::shared_ptr<global_comm> global;       // the global communicator (this one, or the one split)
    std::vector<std::uint32_t> global_ranks;  // global rank of each rank of this communicator
    int rank = 0, size = 1;
    context<device::ascend> compute;   // the rank's compute context (holds the runtime)
    device::ascend_stream comm_stream;  // collectives run here
    context<device::ascend> comm_ctx;  // {runtime, comm stream, same device}
    device::ascend_event before, after;
    hccl_options options;
    std::string name;
    comm_observer* observer = nullptr;  // set_observer(); inherited by split()

    /// g: the global communicator c was split from, or null when c is the global one (then
    /// global_ranks is the identity).
    state(acl::HcclComm c, int r, int n, const context<device::ascend>& ctx, hccl_options opt, std::string nm,
          std::shared_ptr<global_comm> g = nullptr)
        : comm(c), global(g ? std::move(g) : std::make_shared<global_comm>(c, ctx.runtime)), rank(r), size(n),
          compute(ctx), comm_stream(*ctx.runtime), before(*ctx.runtime), after(*ctx.runtime), options(opt),
          name(std::move(nm)) {
      if (global->comm == comm) {
        global_ranks.resize(std::size_t(n));
        for (int i = 0; i < n; ++i) global_ranks[std::size_t(i)] = std::uint32_t(i);
      }
      comm_ctx.runtime = ctx.runtime;
      comm_ctx.stream = comm_stream.get();
      comm_ctx.ordinal = ctx.ordinal;
      comm_ctx.constants = ctx.constants;
    }
    ~state() {
      // the compute stream may still hold waits on `after`: drain both before the events die
      const auto& api = compute.api();
      device::detail::acl_warn(api, api.aclrtSynchronizeStream(comm_stream.get()), "aclrtSynchronizeStream");
      device::detail::acl_warn(api, api.aclrtSynchronizeStream(compute.stream), "aclrtSynchronizeStream");
      if (comm && comm != global->comm) {  // a sub-communicator; the global one goes with `global`
        const acl::HcclResult rc = api.HcclCommDestroy(comm);
        if (rc != acl::hccl_success)
          std::fprintf(stderr, "loom: warning: HcclCommDestroy failed with code %d\n", int(rc));
      }
    }
  };

  explicit hccl_communicator(std::unique_ptr<state> s) : s_(std::move(s)) {}

  static hccl_communicator join(const acl::HcclRootInfo& root, int nranks, int rank, context<device::ascend>& ctx,
                                hccl_options options) {
    const auto& api = ctx.api();
    acl::HcclComm comm = nullptr;
    detail::hccl_check(api, api.HcclCommInitRootInfo(std::uint32_t(nranks), &root, std::uint32_t(rank), &comm),
                       "HcclCommInitRootInfo");
    return hccl_communicator(std::make_unique<state>(comm, rank, nranks, ctx, options, "world"));
  }

  /// (HCCL dtype, element count) for moving n elements of T; types HCCL lacks move as bytes.
  template <class T>
  static std::pair<acl::HcclDataType, std::uint64_t> wire(std::size_t n) {
    constexpr acl::HcclDataType dt = detail::hccl_dtype<T>();
    if constexpr (dt == acl::HcclDataType(255)) return {acl::hccl_uint8, n * sizeof(T)};
    else return {dt, n};
  }

  template <class T>
  static acl::HcclReduceOp hccl_op(reduce_op op, const char* api) {
    if constexpr (std::is_same_v<T, double>)
      throw input_error(std::string("comm::hccl::") + api +
                        ": HCCL has no fp64 reduction (documented A2 types: int8, int16, int32, int64, fp16, fp32, "
                        "bf16); reduce in fp32, or use comm::threads / comm::mpi for double");
    detail::check_op<T>(op, std::string("comm::hccl::") + api);
    switch (op) {
      case reduce_op::max: return acl::hccl_max;
      case reduce_op::min: return acl::hccl_min;
      default: return acl::hccl_sum;  // sum, and avg = sum then a scale
    }
  }

  void check_rank(int r, const char* api, const char* what) const {
    if (r < 0 || r >= size())
      throw input_error(std::string("comm::hccl::") + api + ": " + what + " " + std::to_string(r) +
                        " is outside the group [0, " + std::to_string(size()) + "); pass a rank of this communicator");
  }
  static void check_tag(int tag, const char* api) {
    if (tag < 0)
      throw input_error(std::string("comm::hccl::") + api + ": tag " + std::to_string(tag) + " is negative; use a tag >= 0");
  }
  void check_scatter(std::size_t whole, std::size_t part, const char* api) const {
    if (whole != std::size_t(size()) * part)
      throw input_error(std::string("comm::hccl::") + api + ": the full buffer has " + std::to_string(whole) +
                        " elements but size() * chunk = " + std::to_string(size()) + " * " + std::to_string(part) +
                        "; the full buffer must hold exactly one chunk per rank");
  }

  /// The communication stream waits for everything already queued on the compute stream.
  void order_after_compute() {
    s_->before.record(s_->compute.stream);
    s_->before.wait(stream());
  }
  /// Later compute work waits for the collective; records the completion event.
  void order_before_compute() {
    s_->after.record(stream());
    s_->after.wait(s_->compute.stream);
  }

  /// x / size() on the communication stream (HCCL has no AVG).
  template <class T>
  void scale_by_size(T* p, std::size_t n) {
    if (!n) return;
    namespace ka = kernels::ascend;
    auto& ctx = s_->comm_ctx;
    ka::tensor t(ctx, p, ka::dtype_of<T>(), {std::int64_t(n)});
    ka::scalar s(ctx, 1.0f / float(size()));
    ka::launch(ctx, "aclnnInplaceMuls", ctx.api().aclnnInplaceMulsGetWorkspaceSize, ctx.api().aclnnInplaceMuls, t, s);
  }

  template <class T>
  void issue_all_reduce(std::span<T> x, reduce_op op) {
    const acl::HcclReduceOp hop = hccl_op<T>(op, "all_reduce");
    order_after_compute();
    const auto [dt, count] = wire<T>(x.size());
    if (s_->options.in_place || x.empty()) {
      detail::hccl_check(api(), api().HcclAllReduce(x.data(), x.data(), count, dt, hop, s_->comm, stream()), "HcclAllReduce");
    } else {
      kernels::ascend::scratch<T> tmp(s_->comm_ctx, x.size());  // stream-ordered on the comm stream
      detail::hccl_check(api(), api().HcclAllReduce(x.data(), tmp.data(), count, dt, hop, s_->comm, stream()), "HcclAllReduce");
      device::ascend::copy(x.data(), tmp.data(), x.size_bytes(), stream());
    }
    if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, Eigen::half> || std::is_same_v<T, Eigen::bfloat16>)
      if (op == reduce_op::avg) scale_by_size(x.data(), x.size());
    order_before_compute();
  }

  template <class T>
  void issue_reduce_scatter(std::span<const T> in, std::span<T> out, reduce_op op) {
    check_scatter(in.size(), out.size(), "reduce_scatter");
    const acl::HcclReduceOp hop = hccl_op<T>(op, "reduce_scatter");
    order_after_compute();
    const auto [dt, count] = wire<T>(out.size());
    if (detail::overlaps(in.data(), in.size_bytes(), out.data(), out.size_bytes())) {
      kernels::ascend::scratch<T> tmp(s_->comm_ctx, out.size());
      detail::hccl_check(api(), api().HcclReduceScatter(const_cast<T*>(in.data()), tmp.data(), count, dt, hop, s_->comm, stream()),
                         "HcclReduceScatter");
      device::ascend::copy(out.data(), tmp.data(), out.size_bytes(), stream());
    } else {
      detail::hccl_check(api(), api().HcclReduceScatter(const_cast<T*>(in.data()), out.data(), count, dt, hop, s_->comm, stream()),
                         "HcclReduceScatter");
    }
    if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, Eigen::half> || std::is_same_v<T, Eigen::bfloat16>)
      if (op == reduce_op::avg) scale_by_size(out.data(), out.size());
    order_before_compute();
  }

  template <class T>
  void issue_all_gather(std::span<const T> in, std::span<T> out) {
    check_scatter(out.size(), in.size(), "all_gather");
    order_after_compute();
    const auto [dt, count] = wire<T>(in.size());
    if (detail::overlaps(in.data(), in.size_bytes(), out.data(), out.size_bytes())) {
      kernels::ascend::scratch<T> tmp(s_->comm_ctx, in.size());
      device::ascend::copy(tmp.data(), in.data(), in.size_bytes(), stream());
      detail::hccl_check(api(), api().HcclAllGather(tmp.data(), out.data(), count, dt, s_->comm, stream()), "HcclAllGather");
    } else {
      detail::hccl_check(api(), api().HcclAllGather(const_cast<T*>(in.data()), out.data(), count, dt, s_->comm, stream()),
                         "HcclAllGather");
    }
    order_before_compute();
  }

  /// Waits for the communication stream, turning a timeout into comm_timeout: loom's own
  /// (options.timeout) or HCCL's (HCCL_EXEC_TIMEOUT: the operation's task fails with
  /// ACL_ERROR_RT_TASK_TIMEOUT; the runtime's message, which the emulation makes name the
  /// operation and the ranks that never arrived, is appended).
  void complete(const char* what) {
    order_before_compute();
    const auto ms = s_->options.timeout.count();
    const acl::aclError rc =
        api().aclrtSynchronizeStreamWithTimeout(stream(), ms > 0 ? std::int32_t(std::min<long long>(ms, INT32_MAX)) : -1);
    if (rc == device::detail::acl_status::rt_stream_sync_timeout)
      throw comm_timeout(std::string("comm::hccl::") + what + " on group '" + name() + "' rank " +
                         std::to_string(rank()) + " did not complete within " + std::to_string(ms) +
                         " ms (a rank is missing or stuck); the communicator is unusable, end the run");
    if (rc == device::detail::acl_status::rt_task_timeout)
      throw comm_timeout(std::string("comm::hccl::") + what + " on group '" + name() + "' rank " +
                         std::to_string(rank()) + " timed out in HCCL (HCCL_EXEC_TIMEOUT): " +
                         device::detail::acl_recent_message(api()) +
                         "; the communicator is unusable, end the run");
    device::detail::acl_check(api(), rc, "aclrtSynchronizeStreamWithTimeout");
  }

  struct hccl_request final : detail::request_state {
    const acl::api_table* api = nullptr;
    std::unique_ptr<device::ascend_event> done;
    std::chrono::milliseconds timeout;
    std::string what;
    void wait() override {
      const auto ms = timeout.count();
      const acl::aclError rc =
          api->aclrtSynchronizeEventWithTimeout(done->get(), ms > 0 ? std::int32_t(std::min<long long>(ms, INT32_MAX)) : -1);
      if (rc == device::detail::acl_status::rt_event_sync_timeout)
        throw comm_timeout("comm::hccl::" + what + " did not complete within " + std::to_string(ms) + " ms");
      device::detail::acl_check(*api, rc, "aclrtSynchronizeEventWithTimeout");
    }
    bool test() override { return done->query(); }
  };

  request make_request(const char* what) {
    auto r = std::make_unique<hccl_request>();
    r->api = &api();
    r->done = std::make_unique<device::ascend_event>(*s_->compute.runtime);
    r->done->record(stream());
    r->timeout = s_->options.timeout;
    r->what = what;
    return request(std::move(r));
  }

  std::unique_ptr<state> s_;
};

/// comm::hccl — the name used in DESIGN §4.
using hccl = hccl_communicator;

static_assert(communicator<hccl_communicator>);

}  // namespace loom::parallel::comm
