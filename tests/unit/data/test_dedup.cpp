// Deduplication: exact repeats, MinHash estimates against the true Jaccard similarity (computed
// here from shingle sets), LSH keep/remove rates far above and below the threshold over many
// random pairs, tiny and empty documents, Chinese text, and the real corpora.
#include "paths.hpp"
#ifdef LOOM_TEST_TEXT
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <loom/data/text/dedup.hpp>

using namespace loom::data::text;
using verdict = deduplicator::verdict;

namespace {
// Independent reference: ASCII words (lower-cased alnum runs), or one word per non-ASCII
// UTF-8 character (the Chinese tests use only Han characters and ASCII punctuation).
std::vector<std::string> words_of(const std::string& s) {
  std::vector<std::string> w;
  std::string cur;
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    if (c >= 0x80) {
      if (!cur.empty()) w.push_back(cur), cur.clear();
      const std::size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
      const std::string ch = s.substr(i, len);
      if (ch != "，" && ch != "。" && ch != "：" && ch != "“" && ch != "”") w.push_back(ch);
      i += len;
      continue;
    }
    if (std::isalnum(c)) cur.push_back(char(std::tolower(c)));
    else if (!cur.empty()) w.push_back(cur), cur.clear();
    ++i;
  }
  if (!cur.empty()) w.push_back(cur);
  return w;
}
double true_jaccard(const std::string& a, const std::string& b, std::size_t k) {
  auto shingles = [k](const std::string& s) {
    const auto w = words_of(s);
    std::set<std::vector<std::string>> out;
    for (std::size_t i = 0; i + k <= w.size(); ++i) out.insert({w.begin() + long(i), w.begin() + long(i + k)});
    return out;
  };
  const auto A = shingles(a), B = shingles(b);
  std::size_t inter = 0;
  for (const auto& x : A) inter += B.count(x);
  return double(inter) / double(A.size() + B.size() - inter);
}
std::string join(const std::vector<std::string>& w) {
  std::string s;
  for (const auto& x : w) s += (s.empty() ? "" : " ") + x;
  return s;
}
std::vector<std::string> paragraphs(const std::string& text) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < text.size()) {
    auto e = text.find("\n\n", at);
    if (e == std::string::npos) e = text.size();
    out.push_back(text.substr(at, e - at));
    at = e + 2;
  }
  return out;
}
}  // namespace

TEST_CASE("dedup: exact duplicates are removed, first occurrence kept") {
  deduplicator d;
  const std::string a = "It is the east, and Juliet is the sun. Arise, fair sun, and kill the envious moon.";
  const std::string b = "Now is the winter of our discontent made glorious summer by this sun of York.";
  CHECK(d.insert(a) == verdict::keep);
  CHECK(d.insert(b) == verdict::keep);
  CHECK(d.insert(a) == verdict::exact_duplicate);
  CHECK(d.insert(b) == verdict::exact_duplicate);
  CHECK(d.stats().exact_duplicates == 2);
  CHECK(d.stats().kept == 2);
  CHECK(d.stats().bytes_kept == a.size() + b.size());
  // Identical documents always collide through MinHash too (estimated J = 1).
  dedup_options near_only;
  near_only.exact = false;
  deduplicator n(near_only);
  CHECK(n.insert(a) == verdict::keep);
  CHECK(n.insert(a) == verdict::near_duplicate);
  CHECK(minhash::jaccard(n.hasher().signature(a), n.hasher().signature(a)) == 1.0);
  // ... for any document and any hash seed.
  std::mt19937 rng(9);
  int collided = 0;
  for (int t = 0; t < 200; ++t) {
    std::string doc;
    for (int w = 0, n_words = 5 + int(rng() % 100); w < n_words; ++w) doc += std::to_string(rng() % 500) + "w ";
    near_only.seed = std::uint64_t(t);
    near_only.bands = 14;  // skip the band optimisation in this loop
    deduplicator d(near_only);
    d.insert(doc);
    collided += d.insert(doc) == verdict::near_duplicate;
  }
  CHECK(collided == 200);
}

TEST_CASE("dedup: a Shakespeare speech with a few words changed is a near duplicate; J estimate is close") {
  const auto text = loom_test::read_file(loom_test::data_dir() / "tinyshakespeare.txt");
  REQUIRE(text.size() > 100000);
  // The longest paragraph of the corpus.
  std::string base;
  for (const auto& p : paragraphs(text)) if (p.size() > base.size()) base = p;
  auto w = words_of(base);
  REQUIRE(w.size() > 300);
  const auto minhasher = minhash(5, 256, 3);
  std::mt19937 rng(11);
  for (int changes : {1, 2, 3, 5, 8, 20, 60}) {
    auto v = w;
    for (int c = 0; c < changes; ++c) v[rng() % v.size()] = "zzz" + std::to_string(c);
    const std::string a = join(w), b = join(v);
    const double truth = true_jaccard(a, b, 5);
    const double est = minhash::jaccard(minhasher.signature(a), minhasher.signature(b));
    INFO("changes " << changes << " true J " << truth << " estimated " << est);
    CHECK(std::abs(est - truth) < 4 * std::sqrt(truth * (1 - truth) / 256) + 0.01);
    deduplicator d;
    d.insert(a);
    const verdict got = d.insert(b);
    if (truth >= 0.9) CHECK(got == verdict::near_duplicate);
    if (truth < 0.7) CHECK(got == verdict::keep);
  }
  // The shingling matches the reference on the original text.
  CHECK(minhasher.shingle_hashes(base).size() == w.size() - 4);
}

TEST_CASE("dedup: keep/remove rates far above and far below the threshold over random pairs") {
  std::mt19937 rng(2024);
  std::vector<std::string> vocab(3000);
  for (auto& v : vocab) {
    v.resize(3 + rng() % 6);
    for (auto& c : v) c = char('a' + rng() % 26);
  }
  int above = 0, above_removed = 0, below = 0, below_removed = 0;
  double abs_err = 0, max_err = 0;
  int pairs = 0;
  const lsh_bands bands = optimal_lsh_bands(0.8, 128);
  for (int t = 0; t < 600; ++t) {
    std::vector<std::string> w(80 + rng() % 200);
    for (auto& x : w) x = vocab[rng() % vocab.size()];
    auto v = w;
    const int changes = int(rng() % 16);
    for (int c = 0; c < changes; ++c) v[rng() % v.size()] = vocab[rng() % vocab.size()];
    const std::string a = join(w), b = join(v);
    const double truth = true_jaccard(a, b, 5);
    dedup_options o;
    o.seed = std::uint64_t(t);  // fresh hash functions per pair: independent trials
    o.bands = bands.bands;
    deduplicator d(o);
    d.insert(a);
    const bool removed = d.insert(b) != verdict::keep;
    const double est = minhash::jaccard(d.hasher().signature(a), d.hasher().signature(b));
    abs_err += std::abs(est - truth);
    max_err = std::max(max_err, std::abs(est - truth));
    ++pairs;
    if (truth >= 0.9) ++above, above_removed += removed;
    if (truth <= 0.6) ++below, below_removed += removed;
  }
  const double fn = double(above - above_removed) / above, fp = double(below_removed) / below;
  MESSAGE("MinHash P=128 k=5 t=0.8: " << above << " pairs with J>=0.9 (false-negative rate " << fn << "), " << below
                                      << " pairs with J<=0.6 (false-positive rate " << fp << "), mean |est-J| "
                                      << abs_err / pairs << ", max " << max_err);
  CHECK(above > 50);
  CHECK(below > 50);
  CHECK(fn <= 0.02);
  CHECK(fp <= 0.01);
  CHECK(abs_err / pairs < 0.03);
  CHECK(max_err < 0.15);
}

TEST_CASE("dedup: LSH band choice") {
  const auto p = optimal_lsh_bands(0.8, 128);
  CHECK(p.bands == 14);
  CHECK(p.rows == 9);
  const auto balanced = optimal_lsh_bands(0.8, 128, 0.5);  // datasketch's default weighting
  CHECK(balanced.bands == 9);
  CHECK(balanced.rows == 13);
  CHECK(lsh_candidate_probability(0.95, p) > 0.99);
  CHECK(lsh_candidate_probability(0.5, p) < 0.05);
  CHECK(lsh_candidate_probability(0.9, balanced) < lsh_candidate_probability(0.9, p));
  // Its S-curve crosses 1/2 near the threshold.
  const double mid = std::pow(1.0 / p.bands, 1.0 / p.rows);
  CHECK(mid > 0.6);
  CHECK(mid < 0.85);
  CHECK_THROWS_AS(optimal_lsh_bands(1.5, 128), loom::input_error);
  dedup_options bad;
  bad.bands = 200;
  CHECK_THROWS_AS(deduplicator{bad}, loom::input_error);
  bad.bands = 0;
  bad.shingle = 0;
  CHECK_THROWS_AS(deduplicator{bad}, loom::input_error);
}

TEST_CASE("dedup: empty and tiny documents are handled deliberately") {
  deduplicator d;
  CHECK(d.insert("") == verdict::keep);  // empty: kept and counted, never bucketed
  CHECK(d.insert("") == verdict::keep);
  CHECK(d.stats().empty == 2);
  CHECK(d.insert("My lord?") == verdict::keep);  // 2 words < k=5: exact check only
  CHECK(d.insert("My lord?") == verdict::exact_duplicate);
  CHECK(d.insert("my lord!") == verdict::keep);  // same words, different bytes: not a near duplicate
  CHECK(d.insert("!!! ???") == verdict::keep);   // no words at all
  CHECK(d.stats().too_short == 3);
  CHECK(d.hasher().signature("My lord?").empty());
  CHECK(d.hasher().signature("one two three four five").size() == 128);  // exactly one shingle
}

TEST_CASE("dedup: Chinese near duplicates by character shingles") {
  // The longest paragraph of zh_classics, one character changed in the middle.
  std::string a;
  for (const auto& p : paragraphs(loom_test::read_file(loom_test::data_dir() / "zh_classics.txt")))
    for (std::size_t at = 0, e; at < p.size(); at = e + 1) {
      e = p.find('\n', at);
      if (e == std::string::npos) e = p.size();
      if (e - at > a.size()) a = p.substr(at, e - at);
    }
  REQUIRE(a.size() > 300);
  std::string b = a;
  std::size_t mid = b.size() / 2;
  while ((static_cast<unsigned char>(b[mid]) & 0xC0) == 0x80) ++mid;  // start of a character
  b.replace(mid, 3, "民");
  const double truth = true_jaccard(a, b, 5);
  deduplicator d;
  const double est = minhash::jaccard(d.hasher().signature(a), d.hasher().signature(b));
  INFO("true J " << truth << " estimated " << est);
  CHECK(truth > 0.9);
  CHECK(std::abs(est - truth) < 0.12);
  CHECK(d.insert(a) == verdict::keep);
  CHECK(d.insert(b) == verdict::near_duplicate);
  CHECK(d.insert("子曰：學而時習之，不亦說乎？有朋自遠方來，不亦樂乎？人不知而不慍，不亦君子乎？") == verdict::keep);
}

TEST_CASE("dedup: real corpora, batch equals streaming") {
  for (const char* name : {"tinyshakespeare.txt", "zh_classics.txt"}) {
    const auto docs = paragraphs(loom_test::read_file(loom_test::data_dir() / name));
    std::vector<std::string_view> views(docs.begin(), docs.end());
    deduplicator a, b;
    std::vector<verdict> one;
    for (auto v : views) one.push_back(a.insert(v));
    CHECK(b.insert_batch(views) == one);
    const auto& s = a.stats();
    MESSAGE(std::string(name) << ": " << s.documents_in << " paragraphs, " << s.exact_duplicates << " exact and "
                 << s.near_duplicates << " near duplicates, " << s.too_short << " too short for a shingle");
    CHECK(s.kept + s.exact_duplicates + s.near_duplicates == s.documents_in);
    CHECK(s.near_duplicates < s.documents_in / 20);  // real text is mostly unique
  }
}

#endif  // LOOM_TEST_TEXT
