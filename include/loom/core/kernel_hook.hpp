#pragma once
/// \file kernel_hook: an optional observer of kernel calls, carried by context<D>::hook.
///
/// The timeline profiler (io::trace_recorder, io::trace_kernel_hook in io/trace.hpp) needs every
/// kernel of a step as a zone on the calling thread's track. The kernels already receive the
/// context explicitly, so the context carries a pointer to an observer: null (the default) means
/// off, and a kernel call then costs one predictable branch more (kernel_scope below); no global
/// registry, no macro. Kept tiny on purpose (no standard headers): core/context.hpp includes it.
///
/// On devices that launch asynchronously (Ascend), begin()/end() bracket the host-side enqueue,
/// not the device execution: the zone shows when and for how long the host launched the kernel.

namespace loom {

/// Receives the begin and end of every kernel call made with a context whose `hook` points to it.
/// `name` is a string literal naming the kernel ("matmul_forward", "attention_backward", ...),
/// valid for the whole program. begin() returns a token handed back to the matching end() (e.g.
/// the start time; a negative token may mean "not recording"). Both are called on the calling
/// thread, possibly from several threads at once (one context per rank thread): implementations
/// must be thread-safe and must not throw.
class kernel_hook {
 public:
  virtual double begin(const char* name) noexcept = 0;
  virtual void end(const char* name, double token) noexcept = 0;

 protected:
  ~kernel_hook() = default;  // not owned through this interface
};

/// RAII bracket of one kernel call: `const kernel_scope k(ctx.hook, "layernorm_forward");`.
/// With a null hook it does nothing beyond one branch at each end.
class kernel_scope {
 public:
  kernel_scope(kernel_hook* hook, const char* name) noexcept
      : hook_(hook), name_(name), token_(hook ? hook->begin(name) : 0.0) {}
  ~kernel_scope() {
    if (hook_) hook_->end(name_, token_);
  }
  kernel_scope(const kernel_scope&) = delete;
  kernel_scope& operator=(const kernel_scope&) = delete;

 private:
  kernel_hook* hook_;
  const char* name_;
  double token_;
};

}  // namespace loom
