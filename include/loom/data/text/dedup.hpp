#pragma once
/// \file loom::data::text — exact and near-duplicate removal (MinHash + LSH banding).
///
/// Exact: a 128-bit XXH3 hash of the document's bytes; a repeat of an earlier document is
/// removed.
///
/// Near: documents are compared as sets of word shingles (k consecutive words). Words are
/// runs of letters/digits/marks, lower-cased; each wide (CJK) letter is a word of its own, so
/// Chinese text is compared by character k-grams. MinHash (Broder, "On the resemblance and
/// containment of documents", 1997) keeps, for P universal hash functions
/// h_i(x) = (a_i x + b_i) mod (2^61 - 1), the minimum over the shingles; two signatures agree
/// in a position with probability equal to the Jaccard similarity J, so the fraction of equal
/// positions estimates J with standard error sqrt(J(1-J)/P). LSH banding (Leskovec,
/// Rajaraman, Ullman, "Mining of Massive Datasets", ch. 3.4) cuts the signature into b bands
/// of r rows; documents sharing any band become candidates (probability 1-(1-J^r)^b), and a
/// candidate is a duplicate only if its estimated J >= threshold. b and r are chosen by
/// default to minimise the weighted false-positive and false-negative areas of the candidate
/// curve around the threshold (datasketch's MinHashLSH method, weighted towards recall).
///
/// Processing is streaming and order-dependent: the first occurrence is kept, later near or
/// exact copies are removed.
///
/// Deliberate edge cases:
///  * empty documents are kept and counted (`empty`), never hashed into a shared bucket;
///    dropping them is the cleaner's or the filter's job;
///  * documents with fewer than k words have no k-shingle; they are checked for exact
///    duplicates only and counted (`too_short`): a Jaccard estimate over a single shingle is
///    0 or 1 and says nothing about similarity.
/// Hashing: xxHash XXH3 (https://github.com/Cyan4973/xxHash); link with -lxxhash -lutf8proc.
#include <utf8proc.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <loom/core/error.hpp>

namespace loom::data::text {

/// LSH banding: b bands of r rows (b * r <= permutations).
struct lsh_bands {
  int bands = 0, rows = 0;
};

/// Probability that two documents of Jaccard similarity `j` share at least one band.
inline double lsh_candidate_probability(double j, lsh_bands p) noexcept {
  return 1.0 - std::pow(1.0 - std::pow(j, p.rows), p.bands);
}

/// The (b, r) with b*r <= permutations that minimises
///   (1 - w) * integral_0^t P(j) dj  +  w * integral_t^1 (1 - P(j)) dj,
/// the weighted false-positive and false-negative areas of the candidate curve P (datasketch's
/// MinHashLSH does this with w = 0.5). The default w = 0.9 favours recall: every candidate is
/// verified by its estimated Jaccard afterwards, so an LSH false positive costs one signature
/// comparison while a false negative keeps a duplicate. For t = 0.8, P = 128 this gives
/// b = 14, r = 9: P(0.9) = 0.999, P(0.8) = 0.87, P(0.5) = 0.027.
/// Throws loom::input_error unless 0 < threshold < 1, permutations >= 1, 0 <= w <= 1.
inline lsh_bands optimal_lsh_bands(double threshold, int permutations, double false_negative_weight = 0.9) {
  if (!(threshold > 0.0 && threshold < 1.0) || permutations < 1 ||
      !(false_negative_weight >= 0.0 && false_negative_weight <= 1.0))
    throw input_error("MinHash LSH: threshold " + std::to_string(threshold) + " / permutations " +
                      std::to_string(permutations) + " / weight " + std::to_string(false_negative_weight) +
                      " out of range; use 0 < threshold < 1, permutations >= 1, 0 <= weight <= 1");
  auto area = [](double lo, double hi, lsh_bands p, bool above) {
    constexpr int steps = 64;
    const double h = (hi - lo) / steps;
    double s = 0;
    for (int k = 0; k < steps; ++k) {
      const double pr = lsh_candidate_probability(lo + (k + 0.5) * h, p);
      s += above ? 1.0 - pr : pr;
    }
    return s * h;
  };
  lsh_bands best{1, permutations};
  double best_err = 1e300;
  for (int b = 1; b <= permutations; ++b)
    for (int r = 1; r <= permutations / b; ++r) {
      const lsh_bands p{b, r};
      const double err = (1.0 - false_negative_weight) * area(0.0, threshold, p, false) +
                         false_negative_weight * area(threshold, 1.0, p, true);
      if (err < best_err) {
        best_err = err;
        best = p;
      }
    }
  return best;
}

/// Settings of the deduplicator (prepare_data's --dedup-* flags).
struct dedup_options {
  bool exact = true;             ///< remove byte-identical repeats
  bool near = true;              ///< remove MinHash near-duplicates
  int shingle = 5;               ///< k: words per shingle
  int permutations = 128;        ///< P: MinHash hash functions
  int bands = 0;                 ///< b (0: chosen by optimal_lsh_bands); rows = P / b
  double threshold = 0.8;        ///< estimated Jaccard at or above which a candidate is a duplicate
  std::uint64_t seed = 0x10017;  ///< seeds the hash functions
  int threads = 0;               ///< signature threads in insert_batch (0: all cores)
};

/// Counters (documents and bytes seen, kept, removed by reason).
struct dedup_stats {
  std::uint64_t documents_in = 0, kept = 0, exact_duplicates = 0, near_duplicates = 0;
  std::uint64_t empty = 0, too_short = 0;   ///< kept documents without a MinHash signature
  std::uint64_t bytes_in = 0, bytes_kept = 0;
  std::uint64_t candidates = 0;             ///< candidate pairs whose signatures were compared
};

/// Word shingles and MinHash signatures (see the file comment).
class minhash {
 public:
  /// Throws loom::input_error unless shingle >= 1 and permutations >= 1.
  minhash(int shingle, int permutations, std::uint64_t seed) : k_(shingle), a_(), b_() {
    if (shingle < 1 || permutations < 1)
      throw input_error("MinHash: shingle " + std::to_string(shingle) + " and permutations " +
                        std::to_string(permutations) + " must be >= 1; e.g. --shingle 5 --permutations 128");
    a_.resize(std::size_t(permutations));
    b_.resize(std::size_t(permutations));
    std::uint64_t s = seed;
    for (int i = 0; i < permutations; ++i) {
      a_[std::size_t(i)] = 1 + next(s) % (mersenne - 1);  // a in [1, p)
      b_[std::size_t(i)] = next(s) % mersenne;            // b in [0, p)
    }
  }
  int shingle() const noexcept { return k_; }
  int permutations() const noexcept { return int(a_.size()); }

  /// 64-bit hashes of the document's words (lower-cased letters/digits/marks; one per wide letter).
  static std::vector<std::uint64_t> word_hashes(std::string_view doc) {
    std::vector<std::uint64_t> words;
    std::string word;
    auto flush = [&] {
      if (!word.empty()) words.push_back(XXH3_64bits(word.data(), word.size()));
      word.clear();
    };
    const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(doc.data());
    for (std::size_t i = 0; i < doc.size();) {
      utf8proc_int32_t cp;
      const auto len = utf8proc_iterate(p + i, utf8proc_ssize_t(doc.size() - i), &cp);
      if (len <= 0) { ++i; flush(); continue; }
      i += std::size_t(len);
      if (cp < 0x80) {
        const bool alnum = (cp >= 'a' && cp <= 'z') || (cp >= '0' && cp <= '9');
        if (alnum) word.push_back(char(cp));
        else if (cp >= 'A' && cp <= 'Z') word.push_back(char(cp - 'A' + 'a'));
        else flush();
        continue;
      }
      const auto cat = utf8proc_category(cp);
      const bool letter = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
      const bool mark = cat >= UTF8PROC_CATEGORY_MN && cat <= UTF8PROC_CATEGORY_ME;
      const bool digit = cat == UTF8PROC_CATEGORY_ND;
      if (letter && utf8proc_charwidth(cp) == 2) {  // CJK: one character, one word
        flush();
        append(word, cp);
        flush();
      } else if (letter || digit || (mark && !word.empty())) {
        append(word, utf8proc_tolower(cp));
      } else {
        flush();
      }
    }
    flush();
    return words;
  }

  /// Hashes of the document's k-shingles (empty if it has fewer than k words).
  std::vector<std::uint64_t> shingle_hashes(std::string_view doc) const {
    const auto w = word_hashes(doc);
    std::vector<std::uint64_t> out;
    if (w.size() < std::size_t(k_)) return out;
    out.reserve(w.size() - std::size_t(k_) + 1);
    for (std::size_t i = 0; i + std::size_t(k_) <= w.size(); ++i)
      out.push_back(XXH3_64bits(w.data() + i, sizeof(std::uint64_t) * std::size_t(k_)));
    return out;
  }

  /// MinHash signature (P values, low 32 bits of each minimum); empty if no shingle.
  std::vector<std::uint32_t> signature(std::string_view doc) const {
    const auto sh = shingle_hashes(doc);
    std::vector<std::uint32_t> sig;
    if (sh.empty()) return sig;
    const std::size_t P = a_.size();
    std::vector<std::uint64_t> mins(P, ~std::uint64_t(0));
    for (const std::uint64_t h : sh) {
      const std::uint64_t x = h % mersenne;
      for (std::size_t i = 0; i < P; ++i) {
        const std::uint64_t v = mulmod_add(a_[i], x, b_[i]);
        mins[i] = v < mins[i] ? v : mins[i];
      }
    }
    sig.resize(P);
    for (std::size_t i = 0; i < P; ++i) sig[i] = std::uint32_t(mins[i]);
    return sig;
  }

  /// Estimated Jaccard similarity: the fraction of equal signature entries (0 if either is empty).
  static double jaccard(std::span<const std::uint32_t> a, std::span<const std::uint32_t> b) noexcept {
    if (a.empty() || a.size() != b.size()) return 0.0;
    std::size_t eq = 0;
    for (std::size_t i = 0; i < a.size(); ++i) eq += a[i] == b[i];
    return double(eq) / double(a.size());
  }

 private:
  static constexpr std::uint64_t mersenne = (std::uint64_t(1) << 61) - 1;
  static std::uint64_t next(std::uint64_t& s) noexcept {  // SplitMix64 stream
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  __extension__ typedef unsigned __int128 u128;  // GCC/Clang; __extension__ keeps -Wpedantic quiet
  static std::uint64_t mulmod_add(std::uint64_t a, std::uint64_t x, std::uint64_t b) noexcept {
    const u128 t = u128(a) * x + b;  // < 2^122 + 2^61
    std::uint64_t r = std::uint64_t(t & mersenne) + std::uint64_t(t >> 61);
    r = (r & mersenne) + (r >> 61);
    return r >= mersenne ? r - mersenne : r;
  }
  static void append(std::string& s, std::int32_t cp) {
    utf8proc_uint8_t buf[4];
    const auto n = utf8proc_encode_char(cp, buf);
    s.append(reinterpret_cast<const char*>(buf), std::size_t(n));
  }
  int k_;
  std::vector<std::uint64_t> a_, b_;
};

/// Streaming deduplicator: insert() documents in order; each returns whether to keep it.
class deduplicator {
 public:
  enum class verdict : std::uint8_t { keep, exact_duplicate, near_duplicate };

  /// Throws loom::input_error on bad options (see minhash and optimal_lsh_bands; bands must
  /// divide into permutations: 1 <= bands <= permutations).
  explicit deduplicator(dedup_options o = {}) : opt_(o), mh_(o.shingle, o.permutations, o.seed) {
    if (opt_.near) {
      if (opt_.bands == 0) {
        lsh_ = optimal_lsh_bands(opt_.threshold, opt_.permutations);
      } else {
        if (opt_.bands < 1 || opt_.bands > opt_.permutations)
          throw input_error("MinHash LSH: bands " + std::to_string(opt_.bands) + " must be in [1, permutations=" +
                            std::to_string(opt_.permutations) + "]; or pass 0 to choose them from the threshold");
        if (!(opt_.threshold > 0.0 && opt_.threshold <= 1.0))
          throw input_error("MinHash LSH: threshold " + std::to_string(opt_.threshold) + " must be in (0, 1]");
        lsh_ = {opt_.bands, opt_.permutations / opt_.bands};
      }
    }
  }

  const dedup_options& options() const noexcept { return opt_; }
  lsh_bands bands() const noexcept { return lsh_; }
  const dedup_stats& stats() const noexcept { return st_; }
  const minhash& hasher() const noexcept { return mh_; }

  /// Decides one document (the first occurrence of anything is kept).
  verdict insert(std::string_view doc) {
    return decide(doc, opt_.near ? mh_.signature(doc) : std::vector<std::uint32_t>{});
  }

  /// Decides documents in order, computing their signatures on `options().threads` threads
  /// first; same verdicts as calling insert() on each in turn.
  std::vector<verdict> insert_batch(std::span<const std::string_view> docs) {
    std::vector<std::vector<std::uint32_t>> sigs(docs.size());
    if (opt_.near) {
      const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
      const std::size_t nt = std::min<std::size_t>(docs.size(), opt_.threads > 0 ? unsigned(opt_.threads) : hw);
      std::vector<std::thread> pool;
      for (std::size_t t = 0; t < nt; ++t)
        pool.emplace_back([&, t] {
          for (std::size_t i = t; i < docs.size(); i += nt) sigs[i] = mh_.signature(docs[i]);
        });
      for (auto& th : pool) th.join();
    }
    std::vector<verdict> out(docs.size());
    for (std::size_t i = 0; i < docs.size(); ++i) out[i] = decide(docs[i], std::move(sigs[i]));
    return out;
  }

 private:
  struct hash128 {
    std::size_t operator()(const XXH128_hash_t& h) const noexcept { return std::size_t(h.low64); }
  };
  struct eq128 {
    bool operator()(const XXH128_hash_t& a, const XXH128_hash_t& b) const noexcept {
      return a.low64 == b.low64 && a.high64 == b.high64;
    }
  };

  verdict decide(std::string_view doc, std::vector<std::uint32_t> sig) {
    ++st_.documents_in;
    st_.bytes_in += doc.size();
    if (doc.empty()) {
      ++st_.empty;
      return keep(doc);
    }
    if (opt_.exact && !exact_.insert(XXH3_128bits(doc.data(), doc.size())).second) {
      ++st_.exact_duplicates;
      return verdict::exact_duplicate;
    }
    if (!opt_.near) return keep(doc);
    if (sig.empty()) {
      ++st_.too_short;
      return keep(doc);
    }
    const std::size_t P = sig.size(), r = std::size_t(lsh_.rows);
    std::vector<std::uint64_t> keys(std::size_t(lsh_.bands));
    for (std::size_t band = 0; band < keys.size(); ++band)
      keys[band] = XXH3_64bits_withSeed(sig.data() + band * r, r * sizeof(std::uint32_t), band);
    std::vector<std::uint32_t> compared;  // a pair can share several bands; compare it once
    for (const std::uint64_t key : keys) {
      const auto it = buckets_.find(key);
      if (it == buckets_.end()) continue;
      for (const std::uint32_t other : it->second) {
        if (std::find(compared.begin(), compared.end(), other) != compared.end()) continue;
        compared.push_back(other);
        ++st_.candidates;
        if (minhash::jaccard(sig, {signatures_.data() + std::size_t(other) * P, P}) >= opt_.threshold) {
          ++st_.near_duplicates;
          return verdict::near_duplicate;
        }
      }
    }
    const auto id = std::uint32_t(signatures_.size() / P);
    signatures_.insert(signatures_.end(), sig.begin(), sig.end());
    for (const std::uint64_t key : keys) {
      auto& bucket = buckets_[key];
      if (bucket.empty() || bucket.back() != id) bucket.push_back(id);
    }
    return keep(doc);
  }
  verdict keep(std::string_view doc) {
    ++st_.kept;
    st_.bytes_kept += doc.size();
    return verdict::keep;
  }

  dedup_options opt_;
  minhash mh_;
  lsh_bands lsh_{};
  dedup_stats st_{};
  std::unordered_set<XXH128_hash_t, hash128, eq128> exact_;
  std::unordered_map<std::uint64_t, std::vector<std::uint32_t>> buckets_;  // band key -> kept documents
  std::vector<std::uint32_t> signatures_;                                   // kept documents x P
};

}  // namespace loom::data::text
