#pragma once
/// \file comm_observer: an optional observer of a communicator's operations (the timeline
/// profiler's view of every collective and send/recv). Kept free of Eigen and of the backends so
/// io/trace.hpp can implement it cheaply; comm.hpp includes it.
#include <cstddef>
#include <string_view>

namespace loom::parallel {

/// One communication operation of one rank, as a comm_observer sees it.
struct comm_event {
  /// The operation, a string literal: "all_reduce", "reduce_scatter", "all_gather", "broadcast",
  /// "barrier", "send", "recv"; "<collective>_async" for the start of an asynchronous collective
  /// and "<collective>_wait" for the request::wait() (or destructor) that completes it.
  const char* op = "";
  /// Bytes this rank hands to the operation: all_reduce and broadcast the buffer; reduce_scatter
  /// the full input (size() chunks); all_gather the full output; send/recv the message; barrier 0.
  std::size_t bytes = 0;
  int group_size = 1;       ///< size() of the communicator
  std::string_view group;   ///< its name(), e.g. "world", "world/tp" (make_groups' names)
  int peer = -1;            ///< send: destination, recv: source, broadcast: root (ranks of the group); else -1
};

/// Observes the communication operations of the communicators it is attached to (set_observer()
/// on a backend's communicator; split() children inherit it), e.g. io::trace_comm_observer
/// records each as a zone on the timeline. begin() runs on the calling thread before the
/// operation, end() after it returns (also when it throws), with begin()'s token. Must be
/// thread-safe (several ranks' threads may share one) and must not throw.
///
/// Why a pointer per communicator and not a field of comm_options or a decorator type: with
/// comm::threads every rank of a world shares one comm_options object, while a trace belongs to
/// one rank; a decorator communicator<C> would change the communicator type of every trainer
/// instantiation (compile time, and every signature naming comm::threads). A null pointer (the
/// default) costs one branch per operation, which is nothing next to a collective.
class comm_observer {
 public:
  virtual double begin(const comm_event& e) noexcept = 0;
  virtual void end(const comm_event& e, double token) noexcept = 0;

 protected:
  ~comm_observer() = default;  // not owned through this interface
};

/// RAII bracket of one operation: begin() now, end() at scope exit; nothing with a null observer.
class comm_scope {
 public:
  comm_scope(comm_observer* o, const comm_event& e) noexcept : o_(o), e_(e), token_(o ? o->begin(e) : 0.0) {}
  ~comm_scope() {
    if (o_) o_->end(e_, token_);
  }
  comm_scope(const comm_scope&) = delete;
  comm_scope& operator=(const comm_scope&) = delete;

 private:
  comm_observer* o_;
  comm_event e_;
  double token_;
};

}  // namespace loom::parallel
