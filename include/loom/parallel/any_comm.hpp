#pragma once
/// \file parallel::any_communicator — a communicator (parallel::communicator) whose backend is
/// chosen at run time: it wraps comm::threads, comm::mpi or any other communicator behind one
/// type, so a trainer is compiled once for every backend (train::session instances). Each call
/// is one virtual call into the backend: reductions keep their element type (float, double,
/// bfloat16, half, int32, int64); data movement (all_gather, broadcast, send, recv) travels as
/// bytes, which every backend moves exactly as it would the typed elements.
///
///   comm::threads& world = ...;
///   parallel::any_communicator any(world);              // refers to world (which must outlive it)
///   auto g = parallel::make_groups<layout<2, 2>>(any);  // the groups own their backends
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include <loom/core/error.hpp>
#include <loom/parallel/comm.hpp>
#include <loom/parallel/comm_observer.hpp>

namespace loom::parallel {

/// The element types of any_communicator's reductions.
enum class reduce_type : unsigned char { f32, f64, bf16, f16, i32, i64 };

/// reduce_type of T (a reducible type).
template <reducible T>
constexpr reduce_type reduce_type_of() noexcept {
  if constexpr (std::is_same_v<T, float>) return reduce_type::f32;
  else if constexpr (std::is_same_v<T, double>) return reduce_type::f64;
  else if constexpr (std::is_same_v<T, Eigen::bfloat16>) return reduce_type::bf16;
  else if constexpr (std::is_same_v<T, Eigen::half>) return reduce_type::f16;
  else if constexpr (std::is_same_v<T, std::int32_t>) return reduce_type::i32;
  else return reduce_type::i64;
}

namespace detail {

/// Calls f.template operator()<T>() for the type `t` names.
template <class F>
decltype(auto) with_reduce_type(reduce_type t, F&& f) {
  switch (t) {
    case reduce_type::f32: return f.template operator()<float>();
    case reduce_type::f64: return f.template operator()<double>();
    case reduce_type::bf16: return f.template operator()<Eigen::bfloat16>();
    case reduce_type::f16: return f.template operator()<Eigen::half>();
    case reduce_type::i32: return f.template operator()<std::int32_t>();
    default: return f.template operator()<std::int64_t>();
  }
}

/// The backend interface of any_communicator: untyped spans (count = elements of `t`, or bytes).
struct any_comm_backend {
  virtual ~any_comm_backend() = default;
  virtual int rank() const noexcept = 0;
  virtual int size() const noexcept = 0;
  virtual std::string name() const = 0;
  virtual void set_observer(comm_observer* o) noexcept = 0;
  virtual void all_reduce(reduce_type t, void* x, std::size_t n, reduce_op op) = 0;
  virtual request all_reduce_async(reduce_type t, void* x, std::size_t n, reduce_op op) = 0;
  virtual void reduce_scatter(reduce_type t, const void* in, std::size_t n_in, void* out, std::size_t n_out, reduce_op op) = 0;
  virtual request reduce_scatter_async(reduce_type t, const void* in, std::size_t n_in, void* out, std::size_t n_out,
                                       reduce_op op) = 0;
  virtual void all_gather(std::span<const std::byte> in, std::span<std::byte> out) = 0;
  virtual request all_gather_async(std::span<const std::byte> in, std::span<std::byte> out) = 0;
  virtual void broadcast(std::span<std::byte> x, int root) = 0;
  virtual void send(std::span<const std::byte> in, int dst, int tag) = 0;
  virtual void recv(std::span<std::byte> x, int src, int tag) = 0;
  virtual void barrier() = 0;
  virtual std::unique_ptr<any_comm_backend> split(int color, int key, std::string name) = 0;
};

/// any_comm_backend over communicator C: owning (a split-off group) or referring (the world).
template <class C>
class any_comm_model final : public any_comm_backend {
 public:
  explicit any_comm_model(C& c) noexcept : c_(&c) {}
  explicit any_comm_model(C&& c) : own_(std::move(c)), c_(&*own_) {}

  int rank() const noexcept override { return c_->rank(); }
  int size() const noexcept override { return c_->size(); }
  std::string name() const override {
    if constexpr (requires { c_->name(); }) return std::string(c_->name());
    else return "world";
  }
  void set_observer(comm_observer* o) noexcept override {
    if constexpr (requires { c_->set_observer(o); }) c_->set_observer(o);
  }
  void all_reduce(reduce_type t, void* x, std::size_t n, reduce_op op) override {
    with_reduce_type(t, [&]<class T>() { c_->all_reduce(std::span<T>(static_cast<T*>(x), n), op); });
  }
  request all_reduce_async(reduce_type t, void* x, std::size_t n, reduce_op op) override {
    return with_reduce_type(t, [&]<class T>() { return c_->all_reduce_async(std::span<T>(static_cast<T*>(x), n), op); });
  }
  void reduce_scatter(reduce_type t, const void* in, std::size_t n_in, void* out, std::size_t n_out,
                      reduce_op op) override {
    with_reduce_type(t, [&]<class T>() {
      c_->reduce_scatter(std::span<const T>(static_cast<const T*>(in), n_in), std::span<T>(static_cast<T*>(out), n_out), op);
    });
  }
  request reduce_scatter_async(reduce_type t, const void* in, std::size_t n_in, void* out, std::size_t n_out,
                               reduce_op op) override {
    return with_reduce_type(t, [&]<class T>() {
      return c_->reduce_scatter_async(std::span<const T>(static_cast<const T*>(in), n_in),
                                      std::span<T>(static_cast<T*>(out), n_out), op);
    });
  }
  void all_gather(std::span<const std::byte> in, std::span<std::byte> out) override { c_->all_gather(in, out); }
  request all_gather_async(std::span<const std::byte> in, std::span<std::byte> out) override {
    return c_->all_gather_async(in, out);
  }
  void broadcast(std::span<std::byte> x, int root) override { c_->broadcast(x, root); }
  void send(std::span<const std::byte> in, int dst, int tag) override { c_->send(in, dst, tag); }
  void recv(std::span<std::byte> x, int src, int tag) override { c_->recv(x, src, tag); }
  void barrier() override { c_->barrier(); }
  std::unique_ptr<any_comm_backend> split(int color, int key, std::string name) override {
    if constexpr (requires { c_->split(color, key, std::move(name)); })
      return std::make_unique<any_comm_model<C>>(c_->split(color, key, std::move(name)));
    else
      return std::make_unique<any_comm_model<C>>(c_->split(color, key));
  }

 private:
  std::optional<C> own_;
  C* c_;
};

}  // namespace detail

/// See the file comment. Move-only; models parallel::communicator. Errors are the backend's.
class any_communicator {
 public:
  /// Refers to `c` (not owned: it must outlive this communicator and the groups split from it
  /// need not).
  template <class C>
    requires(!std::is_same_v<std::remove_cvref_t<C>, any_communicator>)
  explicit any_communicator(C& c) : b_(std::make_unique<detail::any_comm_model<C>>(c)) {}
  explicit any_communicator(std::unique_ptr<detail::any_comm_backend> b) noexcept : b_(std::move(b)) {}
  any_communicator(any_communicator&&) noexcept = default;
  any_communicator& operator=(any_communicator&&) noexcept = default;

  int rank() const noexcept { return b_->rank(); }
  int size() const noexcept { return b_->size(); }
  std::string name() const { return b_->name(); }
  /// Forwards to the backend's set_observer (groups split afterwards inherit it).
  void set_observer(comm_observer* o) noexcept { b_->set_observer(o); }

  // The collectives and point-to-point calls of the communicator concept (parallel/comm.hpp:
  // shapes, aliasing, matching and errors as documented there), forwarded to the backend.
  template <reducible T>
  void all_reduce(std::span<T> x, reduce_op op = reduce_op::sum) {
    b_->all_reduce(reduce_type_of<T>(), x.data(), x.size(), op);
  }
  template <reducible T>
  request all_reduce_async(std::span<T> x, reduce_op op = reduce_op::sum) {
    return b_->all_reduce_async(reduce_type_of<T>(), x.data(), x.size(), op);
  }
  template <class In, reducible T>
    requires std::same_as<std::remove_const_t<In>, T>
  void reduce_scatter(std::span<In> in, std::span<T> out, reduce_op op = reduce_op::sum) {
    b_->reduce_scatter(reduce_type_of<T>(), in.data(), in.size(), out.data(), out.size(), op);
  }
  template <class In, reducible T>
    requires std::same_as<std::remove_const_t<In>, T>
  request reduce_scatter_async(std::span<In> in, std::span<T> out, reduce_op op = reduce_op::sum) {
    return b_->reduce_scatter_async(reduce_type_of<T>(), in.data(), in.size(), out.data(), out.size(), op);
  }
  template <class In, transferable T>
    requires std::same_as<std::remove_const_t<In>, T>
  void all_gather(std::span<In> in, std::span<T> out) {
    b_->all_gather(std::as_bytes(in), std::as_writable_bytes(out));
  }
  template <class In, transferable T>
    requires std::same_as<std::remove_const_t<In>, T>
  request all_gather_async(std::span<In> in, std::span<T> out) {
    return b_->all_gather_async(std::as_bytes(in), std::as_writable_bytes(out));
  }
  template <transferable T>
  void broadcast(std::span<T> x, int root) {
    b_->broadcast(std::as_writable_bytes(x), root);
  }
  template <class In>
    requires transferable<std::remove_const_t<In>>
  void send(std::span<In> in, int dst, int tag) {
    b_->send(std::as_bytes(in), dst, tag);
  }
  template <transferable T>
  void recv(std::span<T> x, int src, int tag) {
    b_->recv(std::as_writable_bytes(x), src, tag);
  }
  void barrier() { b_->barrier(); }
  /// The backend's split (MPI_Comm_split semantics), owned by the result.
  any_communicator split(int color, int key, std::string name = {}) {
    return any_communicator(b_->split(color, key, std::move(name)));
  }

 private:
  std::unique_ptr<detail::any_comm_backend> b_;
};

}  // namespace loom::parallel
