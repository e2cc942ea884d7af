#pragma once
/// \file optim::forward_chunks: a model's parameter buffer cut into chunks in the order its
/// forward pass reads the parameters, and, for each layer, the last chunk the layer needs — what
/// optim::offload_adamw's update streams, so that the next forward can start on a layer
/// as soon as that layer's parameters are back on the device (per-layer readiness; ZeRO-Offload,
/// Ren et al., arXiv:2101.06840, §4.2, overlaps the CPU update with the next forward this way).
///
/// The buffer is laid out row by row of the parameter table (models/params.hpp): every per-layer row
/// holds all layers of the stage, so layer 0's parameters are spread over the whole buffer. The
/// forward reads them in models::for_each_tensor's order instead: the global rows before the blocks
/// (the embedding), then layer 0's slice of every per-layer row, layer 1's, ..., then the global
/// rows after the blocks (final norm, LM head). That sequence of slices, concatenated, is cut every
/// `chunk` elements; a chunk is one or more pieces, each contiguous in the buffer, packed in the
/// chunk's staging slot in the same order.
#include <algorithm>
#include <cstddef>
#include <vector>

#include <loom/models/params.hpp>

namespace loom::optim {

/// One contiguous piece of a forward-order chunk: elements [at, at + n) of the parameter buffer
/// (table row `row`), at element `slot_at` of the chunk's staging slot.
struct chunk_piece {
  std::size_t at = 0, n = 0, slot_at = 0, row = 0;
};

/// The parameter buffer of model G (G::table, G::offsets, G::num_parameters) cut into chunks of at
/// most `chunk` elements in forward order (see the file comment). Gate layers are numbered as
/// nn::transformer::forward's before_layer calls them: -1 the embedding (global rows before the
/// blocks), 0..layers-1 the blocks, `layers` what follows them (final norm and LM head; on every
/// stage the last gate, after which every parameter is current). Built once (O(rows * layers)).
template <class G>
class forward_chunks {
 public:
  /// Throws nothing but std::bad_alloc; chunk > 0.
  explicit forward_chunks(std::size_t chunk) : chunk_(chunk) {
    const auto& t = G::table;
    std::size_t first_layer_row = t.size();
    for (std::size_t k = 0; k < t.size(); ++k)
      if (t[k].per_layer) {
        first_layer_row = std::min(first_layer_row, k);
        layers_ = int(t[k].shape[0]);
      }
    ready_.assign(std::size_t(layers_) + 2, 0);
    std::size_t pos = 0;  // forward-order position of the next slice
    models::for_each_tensor(t, layers_, [&](std::size_t k, int l) {
      const std::size_t len = t[k].layer_size(), at = G::offsets[k] + (l >= 0 ? std::size_t(l) * len : 0);
      const int gate = t[k].per_layer ? l : k < first_layer_row ? -1 : layers_;
      for (std::size_t done = 0; done < len;) {  // the slice, cut at chunk boundaries
        const std::size_t c = (pos + done) / chunk_, n = std::min(len - done, (c + 1) * chunk_ - (pos + done));
        if (c == first_.size()) first_.push_back(pieces_.size());
        pieces_.push_back({at + done, n, pos + done - c * chunk_, k});
        done += n;
      }
      if (len) ready_[std::size_t(gate + 1)] = (pos + len - 1) / chunk_;
      pos += len;
    });
    first_.push_back(pieces_.size());
    // a layer without parameters of its own is ready with the layer before it; the last gate
    // waits for every chunk
    for (std::size_t g = 1; g < ready_.size(); ++g) ready_[g] = std::max(ready_[g], ready_[g - 1]);
    ready_.back() = chunks() - 1;
  }

  /// Number of chunks.
  std::size_t chunks() const noexcept { return first_.size() - 1; }
  /// Elements per chunk (the last may hold fewer).
  std::size_t chunk() const noexcept { return chunk_; }
  /// Elements of chunk c (the sum of its pieces' n).
  std::size_t size(std::size_t c) const noexcept {
    const chunk_piece& last = pieces_[first_[c + 1] - 1];
    return last.slot_at + last.n;
  }
  /// Chunk c's pieces, in forward order.
  template <class F>
  void for_each_piece(std::size_t c, F&& f) const {
    for (std::size_t i = first_[c]; i < first_[c + 1]; ++i) f(pieces_[i]);
  }
  /// Blocks of the stage (the per-layer rows' first dimension; 0 without per-layer rows).
  int layers() const noexcept { return layers_; }
  /// Gates: -1..layers(), layers() + 2 of them.
  int gates() const noexcept { return layers_ + 2; }
  /// The last chunk holding a parameter the forward reads at or before gate layer `layer`
  /// (-1 <= layer <= layers()); non-decreasing in layer; chunks() - 1 for layers().
  std::size_t ready_after(int layer) const noexcept { return ready_[std::size_t(layer + 1)]; }

 private:
  std::size_t chunk_;
  int layers_ = 0;
  std::vector<chunk_piece> pieces_;
  std::vector<std::size_t> first_;  // chunk c's pieces: [first_[c], first_[c + 1])
  std::vector<std::size_t> ready_;  // ready_[layer + 1]
};

}  // namespace loom::optim
