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
//
// Across processes (mpirun or a rank-table launch, one emulated NPU per process): when
// HcclGetRootInfo runs with LOOMEMU_HCCL_TRANSPORT=shm, under an MPI launcher
// (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK set), or in a rank-table launch (RANK_TABLE_FILE
// set: the root info of a further communicator travels over the table's one), the root info
// names a POSIX shared-memory segment instead of a process-local group: HCCL's root info works
// across processes, whatever carries it. Rank 0 creates it at HcclCommInitRootInfo (header + one staging slot per rank of
// LOOMEMU_HCCL_SHM_MB MB, default 4), the others open it, all wait for every rank
// (HCCL_CONNECT_TIMEOUT). A collective runs in rounds (chunks of at most one slot): each rank
// copies its part into its slot, waits until every rank arrived at the round (HCCL_EXEC_TIMEOUT;
// the error names the operation and the ranks that never arrived), checks that every rank posted
// the same call, reads the others' slots into its output, and marks the round done; a slot is
// rewritten only after every rank finished the previous round. Send/Recv pair through the
// sender's slot with per-pair sequence numbers, synchronously as documented. Sub-communicators
// (HcclCreateSubCommConfig) get their own segment. Synchronisation is a process-shared pthread
// mutex and condition variable in the segment.
#include <hccl/hccl.h>

#include <fcntl.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <ctime>
#include <thread>
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

#if LOOMEMU_WITH_JSON
#include <nlohmann/json.hpp>
#endif

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

// --- the shared-memory transport (across processes) -------------------------------------------------
constexpr int shm_max_ranks = 64;
constexpr uint32_t shm_ready_magic = 0x4c4f4f4du;  // "LOOM"
struct shm_call {
  int k = 0;
  uint64_t count = 0;
  int dtype = 0, op = 0;
  uint32_t root = 0;
};
/// The segment's header; rank slots follow it.
struct shm_header {
  std::atomic<uint32_t> ready;
  pid_t creator;                         // rank 0's process: a segment whose creator died is stale
  pthread_mutex_t m;
  pthread_cond_t cv;
  int n;
  int joined_count;
  int joined[shm_max_ranks];
  uint64_t capacity;                     // bytes per rank slot
  uint64_t arrived[shm_max_ranks];       // last collective round each rank posted
  uint64_t done[shm_max_ranks];          // last collective round each rank finished reading
  shm_call calls[shm_max_ranks];
  uint64_t sent[shm_max_ranks][shm_max_ranks];   // p2p messages (src, dst) posted
  uint64_t acked[shm_max_ranks][shm_max_ranks];  // ... and consumed
  uint64_t p2p_count[shm_max_ranks];
  int p2p_dtype[shm_max_ranks];
};
struct shm_link {
  std::string name;
  shm_header* h = nullptr;
  std::size_t bytes = 0;
  bool owner = false;
  std::vector<uint64_t> round;  // per local rank: its collective round counter (its stream worker only)
  char* slot(int r) const { return reinterpret_cast<char*>(h + 1) + std::size_t(r) * h->capacity; }
  ~shm_link() {
    if (h) munmap(h, bytes);
    if (owner) shm_unlink(name.c_str());
  }
};

struct group {
  std::shared_ptr<shm_link> shm;  // set: ranks live in several processes (the shared-memory transport)
  int n = 0;
  std::mutex m;
  std::condition_variable cv;
  std::vector<bool> joined;
  std::vector<int> devices;  // each joined rank's device (in-process groups)
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

/// Locks the segment's mutex for the scope.
struct shm_lock {
  shm_header* h;
  explicit shm_lock(shm_header* x) : h(x) { pthread_mutex_lock(&h->m); }
  ~shm_lock() { pthread_mutex_unlock(&h->m); }
};
/// Waits (mutex held) until pred() or the deadline; false on timeout.
template <class Pred>
bool shm_wait(shm_header* h, std::chrono::steady_clock::time_point deadline, Pred pred) {
  while (!pred()) {
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) return pred();
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    const auto step = std::min<int64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(left).count(), 50000000);
    ts.tv_nsec += long(step);
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&h->cv, &h->m, &ts);  // woken by broadcasts; re-checked every 50 ms
  }
  return true;
}
std::string ranks_where(int n, const std::function<bool(int)>& f) {
  std::string out;
  for (int r = 0; r < n; ++r)
    if (f(r)) out += " " + std::to_string(r);
  return out;
}

/// One rank's part of a collective over the shared-memory transport (see the file comment).
void run_collective_shm(const std::shared_ptr<group>& g, uint64_t seq, int rank, const call& c) {
  shm_link& L = *g->shm;
  shm_header* h = L.h;
  const int n = h->n;
  const std::size_t es = c.k == kind::barrier ? 1 : hccl_size(c.dtype);
  const aclDataType dt = acl_of(c.dtype);
  const uint64_t per_rank = c.k == kind::reduce_scatter ? uint64_t(n) : 1;  // parts each rank publishes per element
  const uint64_t chunk = std::max<uint64_t>(1, h->capacity / (es * per_rank));
  const uint64_t chunks = c.k == kind::barrier || c.count == 0 ? 1 : (c.count + chunk - 1) / chunk;
  const auto deadline = [] { return std::chrono::steady_clock::now() + timeout_from_env("HCCL_EXEC_TIMEOUT", 1836); };
  const shm_call mine{int(c.k), c.count, int(c.dtype), int(c.op), c.root};
  for (uint64_t q = 0; q < chunks; ++q) {
    const uint64_t a = q * chunk, b = std::min<uint64_t>(c.count, a + chunk), m = b > a ? b - a : 0;
    const uint64_t round = ++L.round[std::size_t(rank)];
    {
      shm_lock lk(h);
      if (!shm_wait(h, deadline(), [&] {
            for (int j = 0; j < n; ++j)
              if (h->done[j] + 1 < round) return false;
            return true;
          }))
        throw task_error{ACL_ERROR_RT_TASK_TIMEOUT,
                         std::string(kind_name(c.k)) + " #" + std::to_string(seq) + ": ranks" +
                             ranks_where(n, [&](int j) { return h->done[j] + 1 < round; }) +
                             " never finished the previous operation (HCCL_EXEC_TIMEOUT)"};
    }
    char* my = L.slot(rank);
    switch (c.k) {  // publish this rank's part of the chunk
      case kind::all_reduce: case kind::all_gather:
        std::memcpy(my, static_cast<const char*>(c.send) + a * es, m * es);
        break;
      case kind::reduce_scatter:
        for (int r = 0; r < n; ++r)
          std::memcpy(my + std::size_t(r) * m * es, static_cast<const char*>(c.send) + (uint64_t(r) * c.count + a) * es, m * es);
        break;
      case kind::broadcast:
        if (uint32_t(rank) == c.root) std::memcpy(my, static_cast<const char*>(c.send) + a * es, m * es);
        break;
      case kind::barrier: break;
    }
    bool same = true;
    std::string mismatch;
    {
      shm_lock lk(h);
      h->calls[rank] = mine;
      h->arrived[rank] = round;
      pthread_cond_broadcast(&h->cv);
      if (!shm_wait(h, deadline(), [&] {
            for (int j = 0; j < n; ++j)
              if (h->arrived[j] < round) return false;
            return true;
          }))
        throw task_error{ACL_ERROR_RT_TASK_TIMEOUT,
                         std::string(kind_name(c.k)) + " #" + std::to_string(seq) + ": ranks" +
                             ranks_where(n, [&](int j) { return h->arrived[j] < round; }) +
                             " never arrived (HCCL_EXEC_TIMEOUT)"};
      for (int j = 0; j < n; ++j) {
        const shm_call& o = h->calls[j];
        if (o.k != mine.k || o.count != mine.count || o.dtype != mine.dtype || o.op != mine.op || o.root != mine.root) {
          same = false;
          mismatch = std::string(kind_name(c.k)) + " #" + std::to_string(seq) + ": ranks posted different calls: rank " +
                     std::to_string(j) + " " + kind_name(kind(o.k)) + "(count " + std::to_string(o.count) + ", dtype " +
                     std::to_string(o.dtype) + ") vs this rank's (count " + std::to_string(c.count) + ", dtype " +
                     std::to_string(int(c.dtype)) + ")";
        }
      }
    }
    if (same) {
      switch (c.k) {
        case kind::all_reduce: case kind::reduce_scatter: {
          const std::size_t off = c.k == kind::reduce_scatter ? std::size_t(rank) * m : 0;
          for (uint64_t i = 0; i < m; ++i) {
            double acc = load(dt, L.slot(0), int64_t(off + i));
            for (int r = 1; r < n; ++r) acc = reduce(c.op, acc, load(dt, L.slot(r), int64_t(off + i)));
            store(dt, c.recv, int64_t(a + i), acc);
          }
          break;
        }
        case kind::all_gather:
          for (int r = 0; r < n; ++r)
            std::memcpy(static_cast<char*>(c.recv) + (uint64_t(r) * c.count + a) * es, L.slot(r), m * es);
          break;
        case kind::broadcast:
          if (uint32_t(rank) != c.root) std::memcpy(static_cast<char*>(c.recv) + a * es, L.slot(int(c.root)), m * es);
          break;
        case kind::barrier: break;
      }
    }
    {
      shm_lock lk(h);
      h->done[rank] = round;
      pthread_cond_broadcast(&h->cv);
    }
    if (!same)
      throw task_error{ACL_ERROR_RT_AICORE_EXCEPTION, mismatch + "; every rank must issue the same collective with the "
                                                                 "same count, dtype, op and root"};
  }
}

/// One side of a Send/Recv pair over the shared-memory transport, through the sender's slot.
void run_p2p_shm(const std::shared_ptr<group>& g, const std::string& api, bool is_send, void* buf, uint64_t count,
                 HcclDataType dt, int me, int peer) {
  shm_link& L = *g->shm;
  shm_header* h = L.h;
  const int n = h->n;
  const std::size_t es = hccl_size(dt);
  const uint64_t chunk = std::max<uint64_t>(1, h->capacity / es);
  const uint64_t chunks = count == 0 ? 1 : (count + chunk - 1) / chunk;
  const auto deadline = [] { return std::chrono::steady_clock::now() + timeout_from_env("HCCL_EXEC_TIMEOUT", 1836); };
  for (uint64_t q = 0; q < chunks; ++q) {
    const uint64_t a = q * chunk, m = std::min<uint64_t>(count, a + chunk) - std::min<uint64_t>(count, a);
    if (is_send) {
      const uint64_t mine_round = L.round[std::size_t(me)];
      {
        shm_lock lk(h);  // nobody may still be reading this slot for a collective
        if (!shm_wait(h, deadline(), [&] {
              for (int j = 0; j < n; ++j)
                if (h->done[j] < mine_round) return false;
              return true;
            }))
          throw task_error{ACL_ERROR_RT_TASK_TIMEOUT, api + " to rank " + std::to_string(peer) + ": ranks" +
                                                          ranks_where(n, [&](int j) { return h->done[j] < mine_round; }) +
                                                          " never finished the previous operation (HCCL_EXEC_TIMEOUT)"};
      }
      std::memcpy(L.slot(me), static_cast<const char*>(buf) + a * es, m * es);
      shm_lock lk(h);
      h->p2p_count[me] = count;
      h->p2p_dtype[me] = int(dt);
      const uint64_t target = ++h->sent[me][peer];
      pthread_cond_broadcast(&h->cv);
      if (!shm_wait(h, deadline(), [&] { return h->acked[me][peer] >= target; }))
        throw task_error{ACL_ERROR_RT_TASK_TIMEOUT, api + " to rank " + std::to_string(peer) +
                                                        ": no matching HcclRecv; missing rank " + std::to_string(peer) +
                                                        " (HCCL_EXEC_TIMEOUT)"};
    } else {
      shm_lock lk(h);
      const uint64_t target = h->acked[peer][me] + 1;
      if (!shm_wait(h, deadline(), [&] { return h->sent[peer][me] >= target; }))
        throw task_error{ACL_ERROR_RT_TASK_TIMEOUT, api + " from rank " + std::to_string(peer) +
                                                        ": no matching HcclSend; missing rank " + std::to_string(peer) +
                                                        " (HCCL_EXEC_TIMEOUT)"};
      const bool ok = h->p2p_count[peer] == count && h->p2p_dtype[peer] == int(dt);
      if (ok) std::memcpy(static_cast<char*>(buf) + a * es, L.slot(peer), m * es);
      h->acked[peer][me] = target;
      pthread_cond_broadcast(&h->cv);
      if (!ok)
        throw task_error{ACL_ERROR_RT_AICORE_EXCEPTION, api + ": the matching HcclSend has count " +
                                                            std::to_string(h->p2p_count[peer]) + ", this receive " +
                                                            std::to_string(count) + " (or dtypes differ)"};
    }
  }
}

/// Runs one rank's part of a collective on its stream worker.
void run_collective(std::shared_ptr<group> g, uint64_t seq, int rank, call c) {
  if (g->shm) return run_collective_shm(g, seq, rank, c);
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

/// Whether HcclGetRootInfo picks the shared-memory transport (see the file comment).
static bool shm_transport_requested() {
  if (const char* t = std::getenv("LOOMEMU_HCCL_TRANSPORT"); t && *t) return std::string(t) == "shm";
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK") ||
         std::getenv("RANK_TABLE_FILE");
}
constexpr std::size_t root_mode_at = sizeof magic + sizeof(uint64_t), root_name_at = root_mode_at + 1;

/// True when the process that created a segment has ended (its segment is stale).
static bool creator_gone(const shm_header* h) { return h->creator > 0 && kill(h->creator, 0) != 0 && errno == ESRCH; }

/// Maps the segment `name` for a group of nRanks as rank `rank` (rank 0 creates it), joins, and
/// waits for every rank (HCCL_CONNECT_TIMEOUT). The new communicator's group owns the mapping.
/// A segment left by a process that died is replaced (rank 0) or skipped (the others).
/// unlink_when_joined: rank 0 removes the name once every rank has mapped it, so that the next
/// job with the same name (HcclCommInitClusterInfo: the rank table's path) starts afresh.
static HcclResult join_shm(const char* api, const std::string& name, uint32_t nRanks, uint32_t rank,
                           const comm_settings& settings, HcclComm* comm, bool unlink_when_joined = false) {
  if (!comm) return hfail(HCCL_E_PTR, std::string(api) + ": NULL output");
  if (current_device() < 0) return hfail(HCCL_E_RUNTIME, std::string(api) + ": call aclrtSetDevice first");
  if (nRanks == 0 || rank >= nRanks || nRanks > uint32_t(shm_max_ranks))
    return hfail(HCCL_E_PARA, std::string(api) + ": rank " + std::to_string(rank) + " outside [0, " +
                                  std::to_string(nRanks) + ") (the shared-memory transport takes up to 64 ranks)");
  auto link = std::make_shared<shm_link>();
  link->name = name;
  const auto connect = timeout_from_env("HCCL_CONNECT_TIMEOUT", 120);
  const auto deadline = std::chrono::steady_clock::now() + connect;
  if (rank == 0) {
    const char* mb = std::getenv("LOOMEMU_HCCL_SHM_MB");
    const uint64_t capacity = uint64_t(mb && std::atoi(mb) > 0 ? std::atoi(mb) : 4) << 20;
    link->bytes = sizeof(shm_header) + std::size_t(nRanks) * capacity;
    int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno == EEXIST) {  // left by a job that died, or in use by a live one
      bool stale = true;
      const int old = shm_open(name.c_str(), O_RDWR, 0600);
      struct stat st{};
      if (old >= 0 && fstat(old, &st) == 0 && std::size_t(st.st_size) >= sizeof(shm_header)) {
        void* p = mmap(nullptr, sizeof(shm_header), PROT_READ, MAP_SHARED, old, 0);
        if (p != MAP_FAILED) {
          const auto* oh = static_cast<const shm_header*>(p);
          stale = oh->ready.load(std::memory_order_acquire) != shm_ready_magic || creator_gone(oh);
          munmap(p, sizeof(shm_header));
        }
      }
      if (old >= 0) close(old);
      if (!stale)
        return hfail(HCCL_E_INTERNAL, std::string(api) + ": the group's shared memory " + name +
                                          " is in use by a live process (a second job with the same rank table or "
                                          "root info?); end it, or give this job its own");
      shm_unlink(name.c_str());
      fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    }
    if (fd < 0) return hfail(HCCL_E_INTERNAL, std::string(api) + ": shm_open(" + name + ") failed: " + std::strerror(errno));
    link->owner = true;
    const bool sized = ftruncate(fd, off_t(link->bytes)) == 0;
    void* p = sized ? mmap(nullptr, link->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    if (p == MAP_FAILED)
      return hfail(HCCL_E_INTERNAL, std::string(api) + ": cannot map " + std::to_string(link->bytes) + " bytes of " + name);
    link->h = static_cast<shm_header*>(p);
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutex_init(&link->h->m, &ma);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
    pthread_cond_init(&link->h->cv, &ca);
    link->h->n = int(nRanks);
    link->h->creator = getpid();
    link->h->capacity = capacity;
    link->h->ready.store(shm_ready_magic, std::memory_order_release);
  } else {
    for (;;) {  // rank 0 may not have created it yet
      const int fd = shm_open(name.c_str(), O_RDWR, 0600);
      struct stat st{};
      if (fd >= 0 && fstat(fd, &st) == 0 && std::size_t(st.st_size) > sizeof(shm_header)) {
        void* p = mmap(nullptr, std::size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (p != MAP_FAILED) {
          auto* h = static_cast<shm_header*>(p);
          if (h->ready.load(std::memory_order_acquire) == shm_ready_magic && !creator_gone(h)) {
            link->h = h;
            link->bytes = std::size_t(st.st_size);
            break;
          }
          munmap(p, std::size_t(st.st_size));
        }
      } else if (fd >= 0) {
        close(fd);
      }
      if (std::chrono::steady_clock::now() > deadline)
        return hfail(HCCL_E_TIMEOUT, std::string(api) + ": rank 0 never created the group's shared memory " + name +
                                         " within HCCL_CONNECT_TIMEOUT; missing ranks: 0");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  shm_header* h = link->h;
  {
    shm_lock lk(h);
    if (h->n != int(nRanks))
      return hfail(HCCL_E_PARA, std::string(api) + ": nRanks " + std::to_string(nRanks) + " differs from rank 0's " +
                                    std::to_string(h->n));
    if (h->joined[rank]) return hfail(HCCL_E_PARA, std::string(api) + ": rank " + std::to_string(rank) + " joined twice");
    h->joined[rank] = 1;
    ++h->joined_count;
    pthread_cond_broadcast(&h->cv);
    if (!shm_wait(h, deadline, [&] { return h->joined_count == h->n; }))
      return hfail(HCCL_E_TIMEOUT, std::string(api) + ": not every rank joined within HCCL_CONNECT_TIMEOUT; missing ranks:" +
                                       ranks_where(h->n, [&](int j) { return !h->joined[j]; }));
  }
  if (unlink_when_joined && link->owner) {  // every rank has it mapped: the name may go
    shm_unlink(name.c_str());
    link->owner = false;
  }
  link->round.assign(nRanks, 0);
  auto g = std::make_shared<group>();
  g->n = int(nRanks);
  g->shm = std::move(link);
  auto* hd = new handle;
  hd->g = g;
  hd->rank = int(rank);
  hd->device = current_device();
  hd->id = std::hash<std::string>{}(name);
  hd->buffsize_mb = settings.buffsize_mb;
  hd->deterministic = settings.deterministic;
  std::lock_guard rl(registry_mutex);
  handles().insert(hd);
  *comm = hd;
  return HCCL_SUCCESS;
}

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
  if (shm_transport_requested()) {
    const std::string name = "/loomemu_hccl_" + std::to_string(getpid()) + "_" + std::to_string(id);
    rootInfo->internal[root_mode_at] = 1;
    std::memcpy(rootInfo->internal + root_name_at, name.c_str(), name.size() + 1);
  }
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
      slot->devices.assign(nRanks, -1);
    }
    g = slot;
  }
  std::unique_lock lock(g->m);
  if (g->n != int(nRanks))
    return hfail(HCCL_E_PARA, std::string(api) + ": nRanks " + std::to_string(nRanks) + " differs from another rank's " +
                                  std::to_string(g->n));
  if (g->joined[rank]) return hfail(HCCL_E_PARA, std::string(api) + ": rank " + std::to_string(rank) + " joined twice");
  g->joined[rank] = true;
  g->devices[rank] = current_device();
  ++g->joined_count;
  g->cv.notify_all();
  if (!g->cv.wait_for(lock, timeout_from_env("HCCL_CONNECT_TIMEOUT", 120), [&] { return g->joined_count == g->n; }))
    return hfail(HCCL_E_TIMEOUT, std::string(api) + ": not every rank joined within HCCL_CONNECT_TIMEOUT");
  // HCCL runs one rank per NPU (a communicator's ranks are distinct devices): when two ranks share
  // one, every rank fails, naming them
  for (uint32_t i = 0; i < nRanks; ++i)
    for (uint32_t j = i + 1; j < nRanks; ++j)
      if (g->devices[i] == g->devices[j])
        return hfail(HCCL_E_PARA, std::string(api) + ": ranks " + std::to_string(i) + " and " + std::to_string(j) +
                                      " are both on device " + std::to_string(g->devices[i]) +
                                      "; HCCL runs one rank per NPU: call aclrtSetDevice with each rank's own device");
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
  if (rootInfo->internal[root_mode_at] == 1) {
    const char* nm = rootInfo->internal + root_name_at;
    return join_shm(api, std::string(nm, strnlen(nm, sizeof rootInfo->internal - root_name_at)), nRanks, rank, settings,
                    comm);
  }
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

/// (table path, rank) of every live communicator made by HcclCommInitClusterInfo in this process:
/// "repeated initialization would cause an error" (HcclCommInitClusterInfo's constraint).
static std::set<std::pair<std::string, uint32_t>>& cluster_members() {
  static auto* s = new std::set<std::pair<std::string, uint32_t>>;
  return *s;
}
static std::map<handle*, std::pair<std::string, uint32_t>>& cluster_of() {
  static auto* m = new std::map<handle*, std::pair<std::string, uint32_t>>;
  return *m;
}

/// Checks the rank table `text` (file `path`) as HCCL reads the template version 1.0 (CANN 9.0.0
/// HCCL user guide, rank table configuration for Atlas A2) and finds this rank's entry: the
/// number of ranks in *n, the rank's device_id in *device. A message for HCCL_E_PARA otherwise.
static std::string check_cluster_info(const std::string& text, const std::string& path, uint32_t rank, uint32_t* n,
                                      int* device) {
#if LOOMEMU_WITH_JSON
  using json = nlohmann::json;
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    return "the rank table " + path + " is not valid JSON: " + e.what();
  }
  if (!j.is_object()) return "the rank table " + path + " is not a JSON object";
  std::string why;
  auto str = [&](const json& o, const char* key, const std::string& where, std::string* out, bool required) {
    auto it = o.find(key);
    if (it == o.end()) {
      if (required && why.empty()) why = where + " has no \"" + key + "\"";
      return false;
    }
    if (!it->is_string()) {
      if (why.empty()) why = where + " \"" + key + "\" is not a string";
      return false;
    }
    *out = it->get<std::string>();
    return true;
  };
  auto num = [&](const json& o, const char* key, const std::string& where) -> long {
    std::string v;
    if (!str(o, key, where, &v, true)) return -1;
    if (v.empty() || v.size() > 9 || v.find_first_not_of("0123456789") != std::string::npos) {
      if (why.empty()) why = where + " \"" + key + "\" is \"" + v + "\", not a decimal integer";
      return -1;
    }
    return std::stol(v);
  };
  std::string status, version;
  str(j, "status", "the table", &status, true);
  str(j, "version", "the table", &version, true);
  const long server_count = num(j, "server_count", "the table");
  if (!why.empty()) return path + ": " + why;
  if (status != "completed") return path + ": status is \"" + status + "\", not \"completed\"";
  if (version != "1.0") return path + ": version \"" + version + "\" is not the 910B (A2) template \"1.0\"";
  auto list = j.find("server_list");
  if (list == j.end() || !list->is_array() || list->empty()) return path + ": no server_list, or an empty one";
  if (long(list->size()) != server_count)
    return path + ": server_count " + std::to_string(server_count) + " but server_list has " +
           std::to_string(list->size()) + " servers";
  uint32_t devices_count = 0;
  aclrtGetDeviceCount(&devices_count);
  std::vector<int> ranks_seen;
  std::set<std::string> ips, servers;
  int mine = -1;
  for (std::size_t s = 0; s < list->size(); ++s) {
    const json& server = (*list)[s];
    const std::string sw = "server_list[" + std::to_string(s) + "]";
    if (!server.is_object()) return path + ": " + sw + " is not an object";
    std::string sid;
    if (!str(server, "server_id", sw, &sid, true)) return path + ": " + why;
    if (sid.empty() || sid.size() >= 64 || !servers.insert(sid).second)
      return path + ": " + sw + " server_id \"" + sid + "\" is empty, 64 characters or more, or not unique";
    auto devs = server.find("device");
    if (devs == server.end() || !devs->is_array() || devs->empty()) return path + ": " + sw + " has no device list";
    std::set<long> dev_ids;
    for (std::size_t d = 0; d < devs->size(); ++d) {
      const json& dev = (*devs)[d];
      const std::string dw = sw + ".device[" + std::to_string(d) + "]";
      if (!dev.is_object()) return path + ": " + dw + " is not an object";
      const long id = num(dev, "device_id", dw), r = num(dev, "rank_id", dw);
      std::string ip;
      const bool has_ip = str(dev, "device_ip", dw, &ip, list->size() > 1);
      if (!why.empty()) return path + ": " + why;
      if (id >= long(devices_count))
        return path + ": " + dw + " device_id " + std::to_string(id) + " does not exist (" +
               std::to_string(devices_count) + " devices)";
      if (!dev_ids.insert(id).second)
        return path + ": " + dw + " device_id " + std::to_string(id) + " appears twice in server \"" + sid + "\"";
      if (has_ip) {
        unsigned char buf[16];
        if (inet_pton(AF_INET, ip.c_str(), buf) != 1 && inet_pton(AF_INET6, ip.c_str(), buf) != 1)
          return path + ": " + dw + " device_ip \"" + ip + "\" is not an IPv4 or IPv6 address";
        if (!ips.insert(ip).second) return path + ": device_ip " + ip + " is not unique";
      }
      ranks_seen.push_back(int(r));
      if (uint32_t(r) == rank) mine = int(id);
    }
  }
  std::vector<int> sorted = ranks_seen;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i)
    if (sorted[i] != int(i))
      return path + ": the rank_ids are not 0.." + std::to_string(sorted.size() - 1) + " each exactly once";
  if (mine < 0)
    return path + ": rank " + std::to_string(rank) + " is not in the rank table (rank_ids 0.." +
           std::to_string(sorted.size() - 1) + ")";
  *n = uint32_t(sorted.size());
  *device = mine;
  return {};
#else
  (void)text, (void)path, (void)rank, (void)n, (void)device;
  return "this emulation was built without nlohmann-json and cannot read rank tables";
#endif
}

HcclResult HcclCommInitClusterInfo(const char* clusterInfo, uint32_t rank, HcclComm* comm) {
  // CANN's contract (HCCL API reference, HcclCommInitClusterInfo): clusterInfo is the rank table's
  // path, at most 4096 bytes with the terminator; rank equals the rank_id of this rank in the
  // table; repeated initialisation is an error. The emulation also requires the calling thread's
  // device (aclrtSetDevice) to be the rank's device_id, and joins every rank of the table over a
  // shared-memory segment named after the table's absolute path.
  if (int code = injected("HcclCommInitClusterInfo")) return HcclResult(code);
  constexpr const char* api = "HcclCommInitClusterInfo";
  if (!clusterInfo) return hfail(HCCL_E_PTR, std::string(api) + ": clusterInfo is NULL");
  if (!comm) return hfail(HCCL_E_PTR, std::string(api) + ": comm is NULL");
  if (strnlen(clusterInfo, 4096) >= 4096)
    return hfail(HCCL_E_PARA, std::string(api) + ": the rank table path is 4096 bytes or longer");
  if (current_device() < 0) return hfail(HCCL_E_RUNTIME, std::string(api) + ": call aclrtSetDevice first");
  comm_settings settings;
  if (auto rc = settings_from_env(api, &settings)) return rc;
  char resolved[PATH_MAX];
  if (!realpath(clusterInfo, resolved))
    return hfail(HCCL_E_OPEN_FILE_FAILURE, std::string(api) + ": cannot open the rank table " + clusterInfo + ": " +
                                               std::strerror(errno));
  const std::string path = resolved;
  std::string text;
  {
    const int fd = open(resolved, O_RDONLY);
    if (fd < 0)
      return hfail(HCCL_E_OPEN_FILE_FAILURE, std::string(api) + ": cannot open the rank table " + path + ": " +
                                                 std::strerror(errno));
    char buf[65536];
    for (ssize_t k; (k = read(fd, buf, sizeof buf)) > 0;) text.append(buf, std::size_t(k));
    close(fd);
  }
  uint32_t n = 0;
  int device = -1;
  if (std::string why = check_cluster_info(text, path, rank, &n, &device); !why.empty())
    return hfail(HCCL_E_PARA, std::string(api) + ": " + why);
  if (device != current_device())
    return hfail(HCCL_E_PARA, std::string(api) + ": " + path + " puts rank " + std::to_string(rank) + " on device_id " +
                                  std::to_string(device) + " but the calling thread is on device " +
                                  std::to_string(current_device()) + "; call aclrtSetDevice(" +
                                  std::to_string(device) + ") first");
  {
    std::lock_guard lock(registry_mutex);
    if (!cluster_members().insert({path, rank}).second)
      return hfail(HCCL_E_PARA, std::string(api) + ": rank " + std::to_string(rank) + " of " + path +
                                    " is already initialised in this process; destroy that communicator first");
  }
  uint64_t key = 1469598103934665603ull;  // FNV-1a of the path: a short, valid shm name
  for (unsigned char c : path) key = (key ^ c) * 1099511628211ull;
  char name[64];
  std::snprintf(name, sizeof name, "/loomemu_hccl_rt_%016llx", static_cast<unsigned long long>(key));
  const HcclResult rc = join_shm(api, name, n, rank, settings, comm, /*unlink_when_joined=*/true);
  std::lock_guard lock(registry_mutex);
  if (rc != HCCL_SUCCESS) cluster_members().erase({path, rank});
  else cluster_of()[static_cast<handle*>(*comm)] = {path, rank};
  return rc;
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
      parent->g->shm ? join_shm("HcclCreateSubCommConfig", parent->g->shm->name + "_" + std::to_string(subCommId),
                                rankNum, subCommRankId, settings, subComm)
                     : join("HcclCreateSubCommConfig", {parent->id, subCommId + 1}, rankNum, subCommRankId, settings,
                            subComm);
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
    if (auto it = cluster_of().find(h); it != cluster_of().end()) {
      cluster_members().erase(it->second);
      cluster_of().erase(it);
    }
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
    if (g->shm) return run_p2p_shm(g, name, is_send, buf, count, dt, me, int(peer));
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
