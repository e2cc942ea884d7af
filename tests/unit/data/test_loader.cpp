// Loader: window layout, determinism for any worker count, disjoint and complete epochs across
// data-parallel ranks, resume from a saved state (also across epochs and a dp_size change),
// train/validation split, and input errors.
//
// The dataset holds token value i at stream position i (int32), so a row's first token is
// the window's start offset and every property can be checked from the values alone.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <new>
#include <random>
#include <set>
#include <vector>

#include <loom/data/detail/permutation.hpp>
#include <loom/data/loader.hpp>

#include "paths.hpp"

using namespace loom::data;

namespace {
// Documents of random lengths whose tokens are their stream positions. Returns total tokens.
std::uint64_t write_positions(const std::filesystem::path& prefix, int docs, std::uint32_t seed) {
  std::mt19937 rng(seed);
  indexed_dataset_writer w(prefix, dtype::int32);
  std::int32_t at = 0;
  for (int d = 0; d < docs; ++d) {
    std::vector<std::int32_t> doc(1 + rng() % 90);
    for (auto& t : doc) t = at++;
    w.add_document(doc);
  }
  w.finalize();
  return std::uint64_t(at);
}

std::vector<std::vector<std::int32_t>> take(loader<>& l, std::size_t n) {
  std::vector<std::vector<std::int32_t>> out;
  for (std::size_t i = 0; i < n; ++i) {
    const auto b = l.next();
    out.emplace_back(b.begin(), b.end());
  }
  return out;
}
}  // namespace

TEST_CASE("loader: permutation is a bijection of [0, n)") {
  for (std::uint64_t n : {1ull, 2ull, 3ull, 5ull, 17ull, 64ull, 1000ull, 4097ull}) {
    detail::permutation p(n, 12345 + n);
    std::vector<char> seen(n, 0);
    for (std::uint64_t i = 0; i < n; ++i) {
      const auto v = p(i);
      REQUIRE(v < n);
      CHECK(seen[v] == 0);
      seen[v] = 1;
    }
  }
  // Different keys give different orders; the identity is unlikely.
  detail::permutation a(1000, 1), b(1000, 2);
  int same = 0, fixed = 0;
  for (std::uint64_t i = 0; i < 1000; ++i) {
    same += a(i) == b(i);
    fixed += a(i) == i;
  }
  CHECK(same < 20);
  CHECK(fixed < 20);
}

TEST_CASE("loader: rows are T+1 consecutive tokens, deterministic for any worker count") {
  loom_test::scratch_dir tmp("loader_det");
  const auto prefix = tmp.path / "pos";
  const auto n_tok = write_positions(prefix, 150, 1);
  constexpr std::size_t B = 3, T = 16;
  loader_options o;
  o.batch = B;
  o.seq_len = T;
  o.seed = 42;
  o.workers = 0;
  loader<> ref(prefix, o);
  CHECK(ref.windows_per_epoch() == (n_tok - 1) / T);
  CHECK(ref.batch_tokens() == B * (T + 1));
  const auto want = take(ref, 2 * ref.batches_per_epoch() + 3);  // crosses two epoch ends
  for (const auto& batch : want)
    for (std::size_t b = 0; b < B; ++b) {
      const std::int32_t s = batch[b * (T + 1)];
      CHECK(s % std::int32_t(T) == 0);
      for (std::size_t j = 0; j <= T; ++j) CHECK(batch[b * (T + 1) + j] == s + std::int32_t(j));
    }
  for (int workers : {1, 3}) {
    for (int prefetch : {0, 2, 7}) {
      o.workers = workers;
      o.prefetch = prefetch;
      loader<> l(prefix, o);
      CHECK(take(l, want.size()) == want);
    }
  }
  // The copying overload gives the same tokens.
  o.workers = 2;
  loader<> c(prefix, o);
  std::vector<std::int32_t> buf(c.batch_tokens());
  c.next(buf);
  CHECK(buf == want[0]);
  std::vector<std::int32_t> wrong(c.batch_tokens() + 1);
  CHECK_THROWS_AS(c.next(wrong), loom::input_error);
  // Another seed, another order.
  o.seed = 43;
  loader<> other(prefix, o);
  CHECK(take(other, 4) != std::vector(want.begin(), want.begin() + 4));
}

TEST_CASE("loader: an epoch visits every window once, split disjointly across ranks") {
  loom_test::scratch_dir tmp("loader_dp");
  const auto prefix = tmp.path / "pos";
  constexpr std::size_t B = 2, T = 8;
  constexpr int dp = 3;
  write_positions(prefix, 200, 2);
  loader_options o;
  o.batch = B;
  o.seq_len = T;
  o.seed = 7;
  o.dp_size = dp;
  const std::uint64_t W = loader<>(prefix, o).windows_per_epoch();
  const std::uint64_t S = W / (B * dp);
  INFO("windows " << W << ", steps per epoch " << S);
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::multiset<std::int32_t> all;
    for (int r = 0; r < dp; ++r) {
      o.dp_rank = r;
      loader<> l(prefix, o);
      if (epoch == 1) l.restore({1, 0, o.seed});
      std::set<std::int32_t> mine;
      for (std::uint64_t s = 0; s < S; ++s) {
        const auto b = l.next();
        for (std::size_t i = 0; i < B; ++i) {
          mine.insert(b[i * (T + 1)]);
          all.insert(b[i * (T + 1)]);
        }
      }
      CHECK(mine.size() == S * B);                   // no window twice on one rank
      CHECK(l.state() == loader_state{std::uint64_t(epoch) + 1, 0, o.seed});  // epoch rolled over
    }
    CHECK(all.size() == S * B * dp);
    CHECK(std::set<std::int32_t>(all.begin(), all.end()).size() == all.size());  // disjoint across ranks
    CHECK(W - all.size() < B * dp);                                                   // only the remainder skipped
  }
  // When G divides W, every window appears exactly once: take the document range that makes it so.
  o.dp_rank = 0;
  o.dp_size = 1;
  o.batch = 1;
  loader<> single(prefix, o);
  std::set<std::int32_t> starts;
  for (std::uint64_t s = 0; s < single.batches_per_epoch(); ++s) starts.insert(single.next()[0]);
  CHECK(starts.size() == W);
  CHECK(*starts.rbegin() == std::int32_t((W - 1) * T));
}

TEST_CASE("loader: resume from a saved state continues with the same batches") {
  loom_test::scratch_dir tmp("loader_resume");
  const auto prefix = tmp.path / "pos";
  write_positions(prefix, 120, 3);
  loader_options o;
  o.batch = 2;
  o.seq_len = 12;
  o.seed = 99;
  o.workers = 2;
  loader<> run(prefix, o);
  const std::uint64_t S = run.batches_per_epoch();
  for (std::uint64_t k : {std::uint64_t(0), std::uint64_t(5), S - 1, S, S + 3}) {
    loader<> a(prefix, o);
    take(a, k);
    const loader_state st = a.state();
    const auto expect = take(a, 6);
    o.seed = 1;  // the state's seed wins
    loader<> b(prefix, o);
    o.seed = 99;
    take(b, 2);  // some unrelated progress (and prefetched buffers) before restoring
    b.restore(st);
    CHECK(b.state() == st);
    CHECK(take(b, 6) == expect);
  }
  // Restoring the same loader into its own past.
  loader<> c(prefix, o);
  const auto st0 = c.state();
  const auto first = take(c, 3);
  c.restore(st0);
  CHECK(take(c, 3) == first);

  // The position counts global slots: two ranks of B then one rank of 2B see the same windows.
  o.dp_size = 2;
  std::vector<std::int32_t> r0, r1;
  loader_state mid;
  for (int r = 0; r < 2; ++r) {
    o.dp_rank = r;
    loader<> l(prefix, o);
    take(l, 4);
    mid = l.state();
    const auto b = l.next();
    (r == 0 ? r0 : r1).assign(b.begin(), b.end());
  }
  o.dp_size = 1;
  o.dp_rank = 0;
  o.batch = 4;
  loader<> wide(prefix, o);
  wide.restore(mid);
  const auto b = wide.next();
  std::vector<std::int32_t> joined = r0;
  joined.insert(joined.end(), r1.begin(), r1.end());
  CHECK(std::vector<std::int32_t>(b.begin(), b.end()) == joined);

  CHECK_THROWS_AS(wide.restore({0, wide.windows_per_epoch() + 1, 99}), loom::input_error);
}

TEST_CASE("loader: train/validation split by document") {
  loom_test::scratch_dir tmp("loader_split");
  const auto prefix = tmp.path / "pos";
  write_positions(prefix, 100, 4);
  indexed_dataset ds(prefix);
  const auto [train, valid] = split_train_valid(ds, 0.1);
  CHECK(train.first == 0);
  CHECK(train.last == 90);
  CHECK(valid.first == 90);
  CHECK(valid.last == 100);
  const auto cut = std::int32_t(ds.document_token_offset(90));
  loader_options o;
  o.seq_len = 4;
  o.documents = valid;
  o.shuffle = false;
  o.workers = 1;
  loader<> v(prefix, o);
  for (std::uint64_t s = 0; s < v.batches_per_epoch(); ++s) {
    const auto b = v.next();
    CHECK(b[0] == cut + std::int32_t(s * 4));  // in order, from the first validation token
    CHECK(b[4] < std::int32_t(ds.token_count()));
  }
  o.documents = train;
  o.shuffle = true;
  loader<> t(prefix, o);
  for (std::uint64_t s = 0; s < t.batches_per_epoch(); ++s) CHECK(t.next()[4] <= cut);  // never reads past the cut
  CHECK_THROWS_AS(split_train_valid(ds, 1.0), loom::input_error);
}

TEST_CASE("loader: input errors") {
  loom_test::scratch_dir tmp("loader_errors");
  const auto prefix = tmp.path / "small";
  {
    indexed_dataset_writer w(prefix, dtype::uint16);
    w.add_document(std::vector<std::int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 60000});
    w.finalize();
  }
  loader_options o;
  o.seq_len = 10;  // needs 11 tokens, the dataset has 10
  CHECK_THROWS_WITH_AS(loader<>(prefix, o), doctest::Contains("fewer than one window"), loom::input_error);
  o.seq_len = 3;
  o.batch = 4;  // 3 windows < B
  CHECK_THROWS_WITH_AS(loader<>(prefix, o), doctest::Contains("fewer than one global batch"), loom::input_error);
  o.batch = 1;
  o.dp_rank = 1;
  CHECK_THROWS_AS(loader<>(prefix, o), loom::input_error);
  o.dp_rank = 0;
  o.vocab = 50000;  // token 60000 is outside the vocabulary
  o.shuffle = false;
  for (int workers : {0, 2}) {
    o.workers = workers;
    loader<> l(prefix, o);
    l.next();
    l.next();  // windows [0,4) and [3,7) are fine; [6,10) holds 60000
    CHECK_THROWS_WITH_AS(l.next(), doctest::Contains("outside the vocabulary"), loom::input_error);
    CHECK(l.state().index == 2);  // the failing batch was not consumed
    CHECK_THROWS_AS(l.next(), loom::input_error);  // and fails again
  }
  CHECK_THROWS_WITH_AS(loader<>(tmp.path / "missing", o), doctest::Contains("cannot be opened"), loom::input_error);
}

TEST_CASE("loader: a sparse 6 GB dataset — offsets past 4 GiB and 2^31 tokens") {
  // Three sequences of 2^30 uint16 tokens (2 GiB each) in a sparse .bin; the index is written
  // by hand. Marker tokens at the very end prove that no offset is truncated to 32 bits.
  loom_test::scratch_dir tmp("loader_big");
  const auto prefix = tmp.path / "big";
  constexpr std::uint64_t len = std::uint64_t(1) << 30, n_tok = 3 * len;
  {
    std::ofstream idx(idx_path(prefix), std::ios::binary);
    idx.write(idx_magic.data(), 9);
    const std::uint64_t version = 1, seqs = 3, docs = 3;
    const std::uint8_t code = 8;
    idx.write(reinterpret_cast<const char*>(&version), 8);
    idx.write(reinterpret_cast<const char*>(&code), 1);
    idx.write(reinterpret_cast<const char*>(&seqs), 8);
    idx.write(reinterpret_cast<const char*>(&docs), 8);
    for (int i = 0; i < 3; ++i) {
      const std::int32_t l = std::int32_t(len);
      idx.write(reinterpret_cast<const char*>(&l), 4);
    }
    for (std::int64_t i = 0; i < 3; ++i) {
      const std::int64_t ptr = i * std::int64_t(len) * 2;
      idx.write(reinterpret_cast<const char*>(&ptr), 8);
    }
    for (std::int64_t d : {0, 1, 3}) idx.write(reinterpret_cast<const char*>(&d), 8);
  }
  {
    std::ofstream(bin_path(prefix), std::ios::binary).put('\0');
    std::filesystem::resize_file(bin_path(prefix), 2 * n_tok);  // sparse: no blocks allocated
    const int fd = ::open(bin_path(prefix).c_str(), O_WRONLY);
    REQUIRE(fd >= 0);
    std::uint16_t tail[9];
    for (int k = 0; k < 9; ++k) tail[k] = std::uint16_t(1000 + k);
    REQUIRE(::pwrite(fd, tail, sizeof tail, off_t(2 * (n_tok - 9))) == ssize_t(sizeof tail));
    ::close(fd);
  }
  indexed_dataset ds(prefix);
  CHECK(ds.token_count() == n_tok);
  CHECK(ds.document_count() == 2);
  CHECK(ds.document_token_offset(1) == len);
  std::vector<std::int32_t> got(9);
  ds.read_tokens(n_tok - 9, got);
  CHECK(got[0] == 1000);
  CHECK(got[8] == 1008);

  loader_options o;
  o.seq_len = 8;
  o.shuffle = false;
  o.workers = 1;
  loader<> l(prefix, o);
  CHECK(l.windows_per_epoch() == (n_tok - 1) / 8);
  // The last window starts at token 8 * (W - 1) = n_tok - 16 and holds tokens [n_tok-16, n_tok-7).
  l.restore({0, l.windows_per_epoch() - 1, 0});
  CHECK(8 * (l.windows_per_epoch() - 1) == n_tok - 16);
  const auto b = l.next();
  CHECK(b[6] == 0);
  CHECK(b[7] == 1000);  // token n_tok - 9, byte offset ~6 GiB
  CHECK(b[8] == 1001);
  CHECK(l.state() == loader_state{1, 0, 0});
}

namespace {
// A host allocator that records what it handed out (the test's stand-in for aclrtMallocHost).
struct counted_host {
  static inline std::set<void*> live;
  static inline std::size_t bytes = 0;
  static void* allocate(std::size_t n) {
    void* p = ::operator new(n, std::align_val_t(64));
    live.insert(p);
    bytes += n;
    return p;
  }
  static void deallocate(void* p) noexcept {
    live.erase(p);
    ::operator delete(p, std::align_val_t(64));
  }
};
}  // namespace

TEST_CASE("loader: batches live in the host allocator it is given (a device's pinned memory)") {
  loom_test::scratch_dir tmp("loader_host");
  const auto prefix = tmp.path / "pos";
  write_positions(prefix, 60, 5);
  constexpr std::size_t B = 2, T = 9;
  loader_options o;
  o.batch = B;
  o.seq_len = T;
  o.seed = 7;
  o.workers = 0;
  loader<> ref(prefix, o);
  const auto want = take(ref, 5);
  for (int workers : {0, 2}) {
    CAPTURE(workers);
    o.workers = workers;
    o.host_memory = {&counted_host::allocate, &counted_host::deallocate};
    counted_host::bytes = 0;
    {
      loader<> l(prefix, o);
      CHECK(counted_host::live.size() == 1);
      CHECK(counted_host::bytes >= B * (T + 1) * sizeof(std::int32_t));
      const auto* block = static_cast<const std::int32_t*>(*counted_host::live.begin());
      for (const auto& w : want) {
        const auto b = l.next();
        CHECK(b.data() >= block);  // inside the given block, not a copy
        CHECK(b.data() + b.size() <= block + counted_host::bytes / sizeof(std::int32_t));
        CHECK(std::vector<std::int32_t>(b.begin(), b.end()) == w);
      }
    }
    CHECK(counted_host::live.empty());  // freed with the loader's deallocate
  }
}
