// loom's HOST EMULATION of HCCL — NOT the vendor library (libhccl).
// Ranks are threads of one process. HcclGetRootInfo hands out a process-local id inside the
// 4108-byte blob; HcclCommInitRootInfo joins the group of that id and waits for all nRanks
// (HCCL_CONNECT_TIMEOUT seconds, default 120). A collective is enqueued on the caller's stream;
// when the stream's worker reaches it, it rendezvouses with the other ranks' workers (matched by
// per-communicator issue order), checks that every rank posted the same call, computes its own
// output from all ranks' input buffers in double precision, waits until every rank has computed
// (so in-place calls are safe), then writes. Send/Recv pair synchronously, as documented.
// Checks: explicit stream on the communicator's device, device-memory buffers of that device,
// documented dtype/op support (A2: no reduction on fp64, no prod on int16/bf16).
#include <hccl/hccl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "internal.hpp"
#include "loom_emulation/control.h"

using namespace loomemu;

namespace {

constexpr char magic[8] = {'L', 'O', 'O', 'M', 'E', 'M', 'U', 0};

enum class kind { all_reduce, all_gather, reduce_scatter, broadcast, barrier };
const char* kind_name(kind k) {
  switch (k) {
    case kind::all_reduce: return "HcclAllReduce";
    case kind::all_gather: return "HcclAllGather";
    case kind::reduce_scatter: return "HcclReduceScatter";
    case kind::broadcast: return "HcclBroadcast";
    case kind::barrier: return "HcclBarrier";
  }
  return "?";
}

struct call {
  kind k = kind::barrier;
  const void* send = nullptr;
  void* recv = nullptr;
  uint64_t count = 0;
  HcclDataType dtype = HCCL_DATA_TYPE_FP32;
  HcclReduceOp op = HCCL_REDUCE_SUM;
  uint32_t root = 0;
  bool same(const call& o) const {
    return k == o.k && count == o.count && dtype == o.dtype && op == o.op && root == o.root;
  }
};

struct slot {
  std::vector<call> calls;
  std::vector<bool> present;
  int arrived = 0, computed = 0, finished = 0, left = 0;
};

struct message {
  const void* data;
  uint64_t count;
  HcclDataType dtype;
  bool done = false;
};

struct group {
  int n = 0;
  std::mutex m;
  std::condition_variable cv;
  std::vector<bool> joined;
  int joined_count = 0;
  std::map<uint64_t, slot> slots;
  std::map<std::pair<int, int>, std::deque<message*>> mail;  // (src, dst)
};

struct handle {
  std::shared_ptr<group> g;
  int rank = 0;
  int device = 0;
  uint64_t next_seq = 0;
  uint64_t id = 0;      // group key, for sub-communicator ids
  uint64_t splits = 0;  // not used by the emulation beyond bookkeeping
  bool sub = false;     // made by HcclCreateSubCommConfig (which cannot split it again)
  uint32_t buffsize_mb = 200;  // effective HCCL buffer size (config or HCCL_BUFFSIZE)
  uint32_t deterministic = 0;  // effective determinism (config or HCCL_DETERMINISTIC)
};

/// The settings a communicator is created with (loomemu_hccl_comm_config reports them).
struct comm_settings {
  uint32_t buffsize_mb = 200;
  uint32_t deterministic = 0;
};

std::mutex registry_mutex;
std::map<std::pair<uint64_t, uint64_t>, std::shared_ptr<group>>& groups() {  // (parent id, sub id) -> group
  static auto* m = new std::map<std::pair<uint64_t, uint64_t>, std::shared_ptr<group>>;
  return *m;
}
std::set<handle*>& handles() {
  static auto* s = new std::set<handle*>;
  return *s;
}
uint64_t next_id = 1;

std::chrono::milliseconds timeout_from_env(const char* var, int default_s) {
  const char* v = std::getenv(var);
  const int s = v ? std::atoi(v) : default_s;
  return std::chrono::milliseconds(int64_t(s > 0 ? s : default_s) * 1000);
}

HcclResult hfail(HcclResult code, const std::string& msg) { return HcclResult(fail(code, msg)); }

/// HCCL_BUFFSIZE (MB, >= 1; default HCCL_COMM_DEFAULT_BUFFSIZE = 200) and HCCL_DETERMINISTIC
/// ("true", "false" or "strict"; default false), read when a communicator is created. A malformed
/// value fails the creation with HCCL_E_PARA, as HCCL's env parsing does ("should be true, false or
/// strict").
HcclResult settings_from_env(const char* api, comm_settings* s) {
  *s = comm_settings{};
  if (const char* v = std::getenv("HCCL_BUFFSIZE"); v && *v) {
    char* end = nullptr;
    const unsigned long mb = std::strtoul(v, &end, 10);
    if (*end != '\0' || mb < 1 || mb > 0xfffffffeul)
      return hfail(HCCL_E_PARA, std::string(api) + ": HCCL_BUFFSIZE=" + v + " is not a size in MB >= 1");
    s->buffsize_mb = uint32_t(mb);
  }
  if (const char* v = std::getenv("HCCL_DETERMINISTIC"); v && *v) {
    const std::string d = v;
    if (d == "true" || d == "TRUE") s->deterministic = 1;
    else if (d == "strict" || d == "STRICT") s->deterministic = 2;
    else if (d != "false" && d != "FALSE")
      return hfail(HCCL_E_PARA, std::string(api) + ": HCCL_DETERMINISTIC=" + d + " should be true, false or strict");
  }
  return HCCL_SUCCESS;
}

/// A communicator's settings from its HcclCommConfig, as HCCL's CommConfig::Load reads one: the
/// header {size_t size, uint32 magicWord, uint32 version, uint64 reserved} written by
/// HcclCommConfigInit; magic 0xf0f0f0f0 or HCCL_E_PARA; min(size, this library's sizeof) bytes
/// copied (a larger, newer config is accepted and its newer fields ignored); fields gated by
/// version (>= 1: buffer size and determinism). hcclBufferSize / hcclDeterministic equal to
/// 0xffffffff ("not set", HCCL_COMM_BUFFSIZE_CONFIG_NOT_SET / HCCL_COMM_DETERMINISTIC_CONFIG_NOT_SET
/// in hicann/hcomm 9.0 hccl_types.h, written by that release's HcclCommConfigInit) follow
/// HCCL_BUFFSIZE / HCCL_DETERMINISTIC; a buffer size below 1 MB or a determinism above 1 is
/// HCCL_E_PARA.
HcclResult settings_from_config(const char* api, const HcclCommConfig* config, comm_settings* s) {
  if (auto rc = settings_from_env(api, s)) return rc;
  if (!config) return hfail(HCCL_E_PTR, std::string(api) + ": config is NULL");
  std::size_t size = 0;
  uint32_t magic = 0, version = 0;
  std::memcpy(&size, config->reserved, sizeof size);
  std::memcpy(&magic, config->reserved + sizeof size, sizeof magic);
  std::memcpy(&version, config->reserved + sizeof size + sizeof magic, sizeof version);
  if (magic != HCCL_COMM_CONFIG_MAGIC_WORD)
    return hfail(HCCL_E_PARA, std::string(api) + ": invalid config magic word; initialise the config with "
                                                 "HcclCommConfigInit()");
  HcclCommConfig c{};
  std::memcpy(&c, config, std::min(size, sizeof c));
  constexpr uint32_t not_set = 0xffffffffu;
  if (version >= 1) {
    if (c.hcclBufferSize != not_set) {
      if (c.hcclBufferSize < 1)
        return hfail(HCCL_E_PARA, std::string(api) + ": hcclBufferSize " + std::to_string(c.hcclBufferSize) +
                                      " MB; should be equal to or greater than 1 (MB)");
      s->buffsize_mb = c.hcclBufferSize;
    }
    if (c.hcclDeterministic != not_set) {
      if (c.hcclDeterministic > 1)
        return hfail(HCCL_E_PARA, std::string(api) + ": hcclDeterministic " + std::to_string(c.hcclDeterministic) +
                                      " should be 0 (disable) or 1 (enable)");
      s->deterministic = c.hcclDeterministic;
    }
  }
  return HCCL_SUCCESS;
}

handle* resolve(HcclComm c) {
  std::lock_guard lock(registry_mutex);
  auto* h = static_cast<handle*>(c);
  return handles().count(h) ? h : nullptr;
}

std::size_t hccl_size(HcclDataType dt) {
  switch (dt) {
    case HCCL_DATA_TYPE_INT8: case HCCL_DATA_TYPE_UINT8: return 1;
    case HCCL_DATA_TYPE_INT16: case HCCL_DATA_TYPE_UINT16: case HCCL_DATA_TYPE_FP16: case HCCL_DATA_TYPE_BFP16: return 2;
    case HCCL_DATA_TYPE_INT32: case HCCL_DATA_TYPE_UINT32: case HCCL_DATA_TYPE_FP32: return 4;
    case HCCL_DATA_TYPE_INT64: case HCCL_DATA_TYPE_UINT64: case HCCL_DATA_TYPE_FP64: return 8;
    default: return 0;
  }
}

aclDataType acl_of(HcclDataType dt) {
  switch (dt) {
    case HCCL_DATA_TYPE_INT8: return ACL_INT8;
    case HCCL_DATA_TYPE_UINT8: return ACL_UINT8;
    case HCCL_DATA_TYPE_INT16: return ACL_INT16;
    case HCCL_DATA_TYPE_FP16: return ACL_FLOAT16;
    case HCCL_DATA_TYPE_BFP16: return ACL_BF16;
    case HCCL_DATA_TYPE_INT32: return ACL_INT32;
    case HCCL_DATA_TYPE_FP32: return ACL_FLOAT;
    case HCCL_DATA_TYPE_INT64: return ACL_INT64;
    case HCCL_DATA_TYPE_FP64: return ACL_DOUBLE;
    default: return ACL_DT_UNDEFINED;
  }
}

HcclResult check_reduce(const char* api, HcclDataType dt, HcclReduceOp op) {
  switch (dt) {
    case HCCL_DATA_TYPE_INT8: case HCCL_DATA_TYPE_INT16: case HCCL_DATA_TYPE_INT32: case HCCL_DATA_TYPE_INT64:
    case HCCL_DATA_TYPE_FP16: case HCCL_DATA_TYPE_FP32: case HCCL_DATA_TYPE_BFP16: break;
    default: return hfail(HCCL_E_NOT_SUPPORT, std::string(api) + ": data type " + std::to_string(int(dt)) +
                                                  " is not supported for reductions (documented A2 list: int8, "
                                                  "int16, int32, int64, fp16, fp32, bfp16)");
  }
  if (op > HCCL_REDUCE_MIN) return hfail(HCCL_E_PARA, std::string(api) + ": unknown reduce op");
  if (op == HCCL_REDUCE_PROD && (dt == HCCL_DATA_TYPE_INT16 || dt == HCCL_DATA_TYPE_BFP16))
    return hfail(HCCL_E_NOT_SUPPORT, std::string(api) + ": prod is not supported for int16 and bfp16");
  return HCCL_SUCCESS;
}

HcclResult check_buffer(const char* api, const char* what, const void* p, uint64_t bytes, int device, std::size_t align) {
  if (bytes == 0) return HCCL_SUCCESS;
  std::string why;
  if (!p) return hfail(HCCL_E_PTR, std::string(api) + ": " + what + " is NULL");
  if (!check_device_range(p, bytes, device, &why)) return hfail(HCCL_E_PTR, std::string(api) + ": " + what + ": " + why);
  if (reinterpret_cast<std::uintptr_t>(p) % align)
    return hfail(HCCL_E_PARA, std::string(api) + ": " + what + " is not aligned to its element size");
  return HCCL_SUCCESS;
}

double reduce(HcclReduceOp op, double a, double b) {
  switch (op) {
    case HCCL_REDUCE_SUM: return a + b;
    case HCCL_REDUCE_PROD: return a * b;
    case HCCL_REDUCE_MAX: return a > b ? a : b;
    case HCCL_REDUCE_MIN: return a < b ? a : b;
    default: return a;
  }
}

/// Runs one rank's part of a collective on its stream worker.
void run_collective(std::shared_ptr<group> g, uint64_t seq, int rank, call c) {
  const auto deadline = std::chrono::steady_clock::now() + timeout_from_env("HCCL_EXEC_TIMEOUT", 1836);
  std::unique_lock lock(g->m);
  slot& s = g->slots[seq];
  if (s.calls.empty()) {
    s.calls.resize(std::size_t(g->n));
    s.present.assign(std::size_t(g->n), false);
  }
  s.calls[std::size_t(rank)] = c;
  s.present[std::size_t(rank)] = true;
  ++s.arrived;
  g->cv.notify_all();
  if (!g->cv.wait_until(lock, deadline, [&] { return s.arrived == g->n; })) {
    std::string missing;
    for (int r = 0; r < g->n; ++r)
      if (!s.present[std::size_t(r)]) missing += " " + std::to_string(r);
    throw task_error{ACL_ERROR_RT_TASK_TIMEOUT, std::string(kind_name(c.k)) + " #" + std::to_string(seq) +
                                                    ": ranks" + missing + " never arrived (HCCL_EXEC_TIMEOUT)"};
  }
  bool same = true;
  for (const auto& o : s.calls) same = same && o.same(s.calls[0]);
  const int n = g->n;
  std::vector<double> out;
  const aclDataType dt = acl_of(c.dtype);
  if (same) {
    lock.unlock();  // every rank stays in this slot until all have computed: inputs stay valid
    switch (c.k) {
      case kind::all_reduce:
        out.assign(std::size_t(c.count), 0.0);
        for (uint64_t i = 0; i < c.count; ++i) {
          double acc = load(dt, s.calls[0].send, int64_t(i));
          for (int r = 1; r < n; ++r) acc = reduce(c.op, acc, load(dt, s.calls[std::size_t(r)].send, int64_t(i)));
          out[std::size_t(i)] = acc;
        }
        break;
      case kind::reduce_scatter:
        out.assign(std::size_t(c.count), 0.0);
        for (uint64_t i = 0; i < c.count; ++i) {
          const auto idx = int64_t(uint64_t(rank) * c.count + i);
          double acc = load(dt, s.calls[0].send, idx);
          for (int r = 1; r < n; ++r) acc = reduce(c.op, acc, load(dt, s.calls[std::size_t(r)].send, idx));
          out[std::size_t(i)] = acc;
        }
        break;
      default:
        break;
    }
    lock.lock();
  }
  ++s.computed;
  g->cv.notify_all();
  g->cv.wait(lock, [&] { return s.computed == n; });
  if (same) {
    lock.unlock();
    const std::size_t es = hccl_size(c.dtype);
    switch (c.k) {
      case kind::all_reduce: case kind::reduce_scatter:
        for (std::size_t i = 0; i < out.size(); ++i) store(dt, c.recv, int64_t(i), out[i]);
        break;
      case kind::all_gather:
        // all inputs were read-stable until every rank computed; copy now (in-place chunk allowed)
        for (int r = 0; r < n; ++r)
          if (static_cast<const char*>(s.calls[std::size_t(r)].send) != static_cast<char*>(c.recv) + std::size_t(r) * c.count * es)
            std::memmove(static_cast<char*>(c.recv) + std::size_t(r) * c.count * es, s.calls[std::size_t(r)].send, c.count * es);
        break;
      case kind::broadcast:
        if (uint32_t(rank) != c.root) std::memcpy(c.recv, s.calls[c.root].send, c.count * es);
        break;
      case kind::barrier:
        break;
    }
    lock.lock();
  }
  // all_gather/broadcast read other ranks' send buffers in their write phase: nobody leaves (and
  // lets its stream overwrite its buffers) before every rank has written.
  std::string mismatch;
  if (!same) {
    mismatch = std::string(kind_name(c.k)) + " #" + std::to_string(seq) + ": ranks posted different calls:";
    for (int r = 0; r < n; ++r)
      mismatch += " rank " + std::to_string(r) + " " + kind_name(s.calls[std::size_t(r)].k) + "(count " +
                  std::to_string(s.calls[std::size_t(r)].count) + ", dtype " +
                  std::to_string(int(s.calls[std::size_t(r)].dtype)) + ")";
  }
  ++s.finished;
  g->cv.notify_all();
  g->cv.wait(lock, [&] { return s.finished == n; });
  if (++s.left == n) g->slots.erase(seq);  // the last rank out; every rank has passed the wait
  lock.unlock();
  if (!same)
    throw task_error{ACL_ERROR_RT_AICORE_EXCEPTION, mismatch + "; every rank must issue the same collective with the "
                                                               "same count, dtype, op and root"};
}

HcclResult enqueue_collective(const char* api, HcclComm comm, aclrtStream strm, call c, uint64_t send_bytes,
                              uint64_t recv_bytes) {
  if (int code = injected(api)) return HcclResult(code);
  handle* h = resolve(comm);
  if (!h) return hfail(HCCL_E_PARA, std::string(api) + ": not a live communicator");
  if (!strm)
    return hfail(HCCL_E_PARA, std::string(api) + ": NULL stream (default-stream meaning is unconfirmed for HCCL); "
                                                 "pass an explicit aclrtStream");
  int err = 0;
  loomemu::stream* st = resolve_stream(strm, false, &err);
  if (!st) return HcclResult(HCCL_E_PARA);
  if (stream_device(st) != h->device || current_device() != h->device)
    return hfail(HCCL_E_PARA, std::string(api) + ": the stream or the calling thread is not on the communicator's "
                                                 "device " + std::to_string(h->device));
  if (c.k != kind::barrier && hccl_size(c.dtype) == 0) return hfail(HCCL_E_NOT_SUPPORT, std::string(api) + ": unknown data type");
  const std::size_t align = c.k == kind::barrier ? 1 : hccl_size(c.dtype);
  if (auto rc = check_buffer(api, "sendBuf", c.send, send_bytes, h->device, align)) return rc;
  if (auto rc = check_buffer(api, "recvBuf", c.recv, recv_bytes, h->device, align)) return rc;
  const uint64_t seq = h->next_seq++;
  auto g = h->g;
  const int rank = h->rank;
  enqueue(st, [g, seq, rank, c] { run_collective(g, seq, rank, c); });
  return HCCL_SUCCESS;
}

}  // namespace

extern "C" {

HcclResult HcclGetRootInfo(HcclRootInfo* rootInfo) {
  if (int code = injected("HcclGetRootInfo")) return HcclResult(code);
  if (!rootInfo) return hfail(HCCL_E_PTR, "HcclGetRootInfo: NULL output");
  if (current_device() < 0) return hfail(HCCL_E_RUNTIME, "HcclGetRootInfo: call aclrtSetDevice first");
  std::memset(rootInfo->internal, 0, sizeof rootInfo->internal);
  uint64_t id;
  {
    std::lock_guard lock(registry_mutex);
    id = next_id++;
  }
  std::memcpy(rootInfo->internal, magic, sizeof magic);
  std::memcpy(rootInfo->internal + sizeof magic, &id, sizeof id);
  return HCCL_SUCCESS;
}

static HcclResult join(const char* api, std::pair<uint64_t, uint64_t> key, uint32_t nRanks, uint32_t rank,
                       const comm_settings& settings, HcclComm* comm) {
  if (!comm) return hfail(HCCL_E_PTR, std::string(api) + ": NULL output");
  if (current_device() < 0) return hfail(HCCL_E_RUNTIME, std::string(api) + ": call aclrtSetDevice first");
  if (nRanks == 0 || rank >= nRanks)
    return hfail(HCCL_E_PARA, std::string(api) + ": rank " + std::to_string(rank) + " outside [0, " +
                                  std::to_string(nRanks) + ")");
  std::shared_ptr<group> g;
  {
    std::lock_guard lock(registry_mutex);
    auto& slot = groups()[key];
    if (!slot) {
      slot = std::make_shared<group>();
      slot->n = int(nRanks);
      slot->joined.assign(nRanks, false);
    }
    g = slot;
  }
  std::unique_lock lock(g->m);
  if (g->n != int(nRanks))
    return hfail(HCCL_E_PARA, std::string(api) + ": nRanks " + std::to_string(nRanks) + " differs from another rank's " +
                                  std::to_string(g->n));
  if (g->joined[rank]) return hfail(HCCL_E_PARA, std::string(api) + ": rank " + std::to_string(rank) + " joined twice");
  g->joined[rank] = true;
  ++g->joined_count;
  g->cv.notify_all();
  if (!g->cv.wait_for(lock, timeout_from_env("HCCL_CONNECT_TIMEOUT", 120), [&] { return g->joined_count == g->n; }))
    return hfail(HCCL_E_TIMEOUT, std::string(api) + ": not every rank joined within HCCL_CONNECT_TIMEOUT");
  lock.unlock();
  auto* h = new handle;
  h->g = g;
  h->rank = int(rank);
  h->device = current_device();
  h->id = key.first * 1000003u + key.second;
  h->buffsize_mb = settings.buffsize_mb;
  h->deterministic = settings.deterministic;
  std::lock_guard rl(registry_mutex);
  handles().insert(h);
  *comm = h;
  return HCCL_SUCCESS;
}

static HcclResult init_root_info(const char* api, uint32_t nRanks, const HcclRootInfo* rootInfo, uint32_t rank,
                                 const comm_settings& settings, HcclComm* comm) {
  if (!rootInfo || std::memcmp(rootInfo->internal, magic, sizeof magic) != 0)
    return hfail(HCCL_E_PARA, std::string(api) + ": the root info was not produced by HcclGetRootInfo (corrupted in "
                                                 "transit?)");
  uint64_t id;
  std::memcpy(&id, rootInfo->internal + sizeof magic, sizeof id);
  return join(api, {id, 0}, nRanks, rank, settings, comm);
}

HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo* rootInfo, uint32_t rank, HcclComm* comm) {
  if (int code = injected("HcclCommInitRootInfo")) return HcclResult(code);
  comm_settings settings;
  if (auto rc = settings_from_env("HcclCommInitRootInfo", &settings)) return rc;
  return init_root_info("HcclCommInitRootInfo", nRanks, rootInfo, rank, settings, comm);
}

HcclResult HcclCommInitRootInfoConfig(uint32_t nRanks, const HcclRootInfo* rootInfo, uint32_t rank,
                                      const HcclCommConfig* config, HcclComm* comm) {
  if (int code = injected("HcclCommInitRootInfoConfig")) return HcclResult(code);
  comm_settings settings;
  if (auto rc = settings_from_config("HcclCommInitRootInfoConfig", config, &settings)) return rc;
  return init_root_info("HcclCommInitRootInfoConfig", nRanks, rootInfo, rank, settings, comm);
}

HcclResult HcclCreateSubCommConfig(HcclComm* comm, uint32_t rankNum, uint32_t* rankIds, uint64_t subCommId,
                                   uint32_t subCommRankId, HcclCommConfig* config, HcclComm* subComm) {
  if (int code = injected("HcclCreateSubCommConfig")) return HcclResult(code);
  // Documented rules (hicann/hcomm docs/zh/api_ref/comm_mgr_c/HcclCreateSubCommConfig.md, 9.0):
  //  * a rank outside the new group passes rankIds = NULL and subCommId = 0xFFFFFFFF: success, no
  //    communicator; one of the two alone is HCCL_E_PARA (op_base.cc of the same release);
  //  * rankIds "should be ordered": the index of a rank in rankIds becomes its sub-communicator rank.
  //    The 9.0 source rejects duplicates and ids missing from the global rank table with
  //    HCCL_E_PARA (topoinfo_ranktable_partition.cc) and does not itself check the order; the
  //    emulation rejects any order but strictly ascending with HCCL_E_PARA, so that a caller
  //    relying on another order fails here instead of misbehaving on hardware;
  //  * "only a global communicator can be split, not a sub-communicator": HCCL_E_NOT_SUPPORT.
  //    (On hardware a sub-communicator's rank table is renumbered 0..n-1, so the parent's ids are
  //    mistaken for the sub-communicator's; the code the hardware returns is not documented.)
  if (!rankIds && subCommId == 0xFFFFFFFFull) return HCCL_SUCCESS;
  if (!rankIds || subCommId == 0xFFFFFFFFull)
    return hfail(HCCL_E_PARA, "HcclCreateSubCommConfig: rankIds is NULL xor subCommId is 0xFFFFFFFF");
  handle* parent = comm ? resolve(*comm) : nullptr;
  if (!parent) return hfail(HCCL_E_PARA, "HcclCreateSubCommConfig: not a live parent communicator");
  if (parent->sub)
    return hfail(HCCL_E_NOT_SUPPORT,
                 "HcclCreateSubCommConfig: the parent is a sub-communicator; only a global communicator can be split");
  if (rankNum == 0 || subCommRankId >= rankNum)
    return hfail(HCCL_E_PARA, "HcclCreateSubCommConfig: subCommRankId must be below rankNum (> 0)");
  for (uint32_t i = 0; i < rankNum; ++i) {
    if (rankIds[i] >= uint32_t(parent->g->n))
      return hfail(HCCL_E_PARA, "HcclCreateSubCommConfig: rank " + std::to_string(rankIds[i]) +
                                    " is not in the global communicator");
    if (i > 0 && rankIds[i] <= rankIds[i - 1])
      return hfail(HCCL_E_PARA, "HcclCreateSubCommConfig: rankIds must be strictly ascending (rankIds[" +
                                    std::to_string(i) + "] = " + std::to_string(rankIds[i]) + " after " +
                                    std::to_string(rankIds[i - 1]) + ")");
  }
  if (rankIds[subCommRankId] != uint32_t(parent->rank))
    return hfail(HCCL_E_PARA, "HcclCreateSubCommConfig: rankIds[subCommRankId] must be this rank's id in the parent");
  // The config's buffer size and determinism, "not set" (0xffffffff) ones from the environment
  // (settings_from_config).
  comm_settings settings;
  if (auto rc = settings_from_config("HcclCreateSubCommConfig", config, &settings)) return rc;
  const HcclResult rc =
      join("HcclCreateSubCommConfig", {parent->id, subCommId + 1}, rankNum, subCommRankId, settings, subComm);
  if (rc == HCCL_SUCCESS)
    if (handle* h = resolve(*subComm)) h->sub = true;
  return rc;
}

int loomemu_hccl_comm_config(HcclComm comm, uint32_t* buffsize_mb, uint32_t* deterministic) {
  handle* h = resolve(comm);
  if (!h) return hfail(HCCL_E_PARA, "loomemu_hccl_comm_config: not a live communicator");
  if (buffsize_mb) *buffsize_mb = h->buffsize_mb;
  if (deterministic) *deterministic = h->deterministic;
  return HCCL_SUCCESS;
}

HcclResult HcclCommDestroy(HcclComm comm) {
  if (int code = injected("HcclCommDestroy")) return HcclResult(code);
  handle* h = resolve(comm);
  if (!h) return hfail(HCCL_E_PARA, "HcclCommDestroy: not a live communicator");
  {
    std::lock_guard lock(registry_mutex);
    handles().erase(h);
  }
  delete h;
  return HCCL_SUCCESS;
}

HcclResult HcclGetRankSize(HcclComm comm, uint32_t* rankSize) {
  handle* h = resolve(comm);
  if (!h || !rankSize) return hfail(HCCL_E_PARA, "HcclGetRankSize: bad communicator or NULL output");
  *rankSize = uint32_t(h->g->n);
  return HCCL_SUCCESS;
}

HcclResult HcclGetRankId(HcclComm comm, uint32_t* rank) {
  handle* h = resolve(comm);
  if (!h || !rank) return hfail(HCCL_E_PARA, "HcclGetRankId: bad communicator or NULL output");
  *rank = uint32_t(h->rank);
  return HCCL_SUCCESS;
}

HcclResult HcclGetCommAsyncError(HcclComm comm, HcclResult* asyncError) {
  if (!resolve(comm) || !asyncError) return hfail(HCCL_E_PARA, "HcclGetCommAsyncError: bad communicator");
  *asyncError = HCCL_SUCCESS;
  return HCCL_SUCCESS;
}

const char* HcclGetErrorString(HcclResult code) {
  static const char* names[] = {"success", "parameter error", "empty pointer", "memory error", "internal error",
                                "not supported", "not found", "resource unavailable", "system call error",
                                "timeout", "open file failure", "tcp connect failure", "roce connect failure",
                                "tcp transfer failure", "roce transfer failure", "runtime error", "driver error",
                                "profiling error", "cce error", "network error", "try again", "remote error",
                                "communicator suspending"};
  const int c = int(code);
  return c >= 0 && c < int(sizeof names / sizeof names[0]) ? names[c] : "unknown HCCL error";
}

HcclResult HcclAllReduce(void* sendBuf, void* recvBuf, uint64_t count, HcclDataType dataType, HcclReduceOp op,
                         HcclComm comm, aclrtStream stream) {
  if (auto rc = check_reduce("HcclAllReduce", dataType, op)) return rc;
  const uint64_t bytes = count * hccl_size(dataType);
  return enqueue_collective("HcclAllReduce", comm, stream, {kind::all_reduce, sendBuf, recvBuf, count, dataType, op, 0},
                            bytes, bytes);
}

HcclResult HcclAllGather(void* sendBuf, void* recvBuf, uint64_t sendCount, HcclDataType dataType, HcclComm comm,
                         aclrtStream stream) {
  handle* h = resolve(comm);
  const uint64_t n = h ? uint64_t(h->g->n) : 1;
  const uint64_t bytes = sendCount * hccl_size(dataType);
  return enqueue_collective("HcclAllGather", comm, stream,
                            {kind::all_gather, sendBuf, recvBuf, sendCount, dataType, HCCL_REDUCE_SUM, 0}, bytes,
                            bytes * n);
}

HcclResult HcclReduceScatter(void* sendBuf, void* recvBuf, uint64_t recvCount, HcclDataType dataType, HcclReduceOp op,
                             HcclComm comm, aclrtStream stream) {
  if (auto rc = check_reduce("HcclReduceScatter", dataType, op)) return rc;
  handle* h = resolve(comm);
  const uint64_t n = h ? uint64_t(h->g->n) : 1;
  const uint64_t bytes = recvCount * hccl_size(dataType);
  return enqueue_collective("HcclReduceScatter", comm, stream,
                            {kind::reduce_scatter, sendBuf, recvBuf, recvCount, dataType, op, 0}, bytes * n, bytes);
}

HcclResult HcclBroadcast(void* buf, uint64_t count, HcclDataType dataType, uint32_t root, HcclComm comm,
                         aclrtStream stream) {
  handle* h = resolve(comm);
  if (h && root >= uint32_t(h->g->n)) return hfail(HCCL_E_PARA, "HcclBroadcast: root outside the communicator");
  const uint64_t bytes = count * hccl_size(dataType);
  return enqueue_collective("HcclBroadcast", comm, stream,
                            {kind::broadcast, buf, buf, count, dataType, HCCL_REDUCE_SUM, root}, bytes, bytes);
}

HcclResult HcclBarrier(HcclComm comm, aclrtStream stream) {
  return enqueue_collective("HcclBarrier", comm, stream, {}, 0, 0);
}

static HcclResult p2p(const char* api, bool is_send, void* buf, uint64_t count, HcclDataType dt, uint32_t peer,
                      HcclComm comm, aclrtStream strm) {
  if (int code = injected(api)) return HcclResult(code);
  handle* h = resolve(comm);
  if (!h) return hfail(HCCL_E_PARA, std::string(api) + ": not a live communicator");
  if (peer >= uint32_t(h->g->n) || int(peer) == h->rank)
    return hfail(HCCL_E_PARA, std::string(api) + ": peer rank " + std::to_string(peer) + " is invalid");
  if (!strm) return hfail(HCCL_E_PARA, std::string(api) + ": NULL stream; pass an explicit aclrtStream");
  int err = 0;
  loomemu::stream* st = resolve_stream(strm, false, &err);
  if (!st) return HcclResult(HCCL_E_PARA);
  if (stream_device(st) != h->device) return hfail(HCCL_E_PARA, std::string(api) + ": stream on another device");
  if (hccl_size(dt) == 0) return hfail(HCCL_E_NOT_SUPPORT, std::string(api) + ": unknown data type");
  if (auto rc = check_buffer(api, "buffer", buf, count * hccl_size(dt), h->device, hccl_size(dt))) return rc;
  auto g = h->g;
  const int me = h->rank;
  const std::string name = api;
  enqueue(st, [=] {
    const auto deadline = std::chrono::steady_clock::now() + timeout_from_env("HCCL_EXEC_TIMEOUT", 1836);
    std::unique_lock lock(g->m);
    if (is_send) {
      message msg{buf, count, dt};
      g->mail[{me, int(peer)}].push_back(&msg);
      g->cv.notify_all();
      if (!g->cv.wait_until(lock, deadline, [&] { return msg.done; })) {
        auto& q = g->mail[{me, int(peer)}];
        for (auto it = q.begin(); it != q.end(); ++it)
          if (*it == &msg) {
            q.erase(it);
            break;
          }
        throw task_error{ACL_ERROR_RT_TASK_TIMEOUT, name + " to rank " + std::to_string(peer) + ": no matching HcclRecv"};
      }
    } else {
      auto& q = g->mail[{int(peer), me}];
      if (!g->cv.wait_until(lock, deadline, [&] { return !q.empty(); }))
        throw task_error{ACL_ERROR_RT_TASK_TIMEOUT, name + " from rank " + std::to_string(peer) + ": no matching HcclSend"};
      message* msg = q.front();
      q.pop_front();
      if (msg->count != count || msg->dtype != dt) {
        msg->done = true;
        g->cv.notify_all();
        throw task_error{ACL_ERROR_RT_AICORE_EXCEPTION, name + ": the matching HcclSend has count " +
                                                            std::to_string(msg->count) + ", this receive " +
                                                            std::to_string(count) + " (or dtypes differ)"};
      }
      std::memcpy(buf, msg->data, count * hccl_size(dt));
      msg->done = true;
      g->cv.notify_all();
    }
  });
  return HCCL_SUCCESS;
}

HcclResult HcclSend(void* sendBuf, uint64_t count, HcclDataType dataType, uint32_t destRank, HcclComm comm,
                    aclrtStream stream) {
  return p2p("HcclSend", true, sendBuf, count, dataType, destRank, comm, stream);
}

HcclResult HcclRecv(void* recvBuf, uint64_t count, HcclDataType dataType, uint32_t srcRank, HcclComm comm,
                    aclrtStream stream) {
  return p2p("HcclRecv", false, recvBuf, count, dataType, srcRank, comm, stream);
}

}  // extern "C"
