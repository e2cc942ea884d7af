#pragma once
/// \file Private: the progress thread of a communicator (comm::threads; comm::mpi when MPI provides
/// MPI_THREAD_MULTIPLE) — a FIFO of tasks run on one worker thread, so asynchronous collectives
/// execute in issue order (and therefore match across ranks) while the caller keeps computing.
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include <loom/parallel/comm.hpp>
#include <loom/parallel/detail/thread_group.hpp>

namespace loom::parallel::detail {

/// One queued operation and its completion state; also the backend state of its request.
/// `world` (may be null) is aborted when the request is abandoned during stack unwinding.
class thread_task final : public request_state {
 public:
  thread_task(std::function<void()> fn, std::shared_ptr<thread_world> world, std::string what)
      : fn_(std::move(fn)), world_(std::move(world)), what_(std::move(what)) {}

  void run() noexcept {
    std::exception_ptr err;
    try {
      fn_();
    } catch (...) {
      err = std::current_exception();
    }
    fn_ = nullptr;  // release captured state before signalling
    {
      std::lock_guard lock(mutex_);
      error_ = err;
      done_ = true;
    }
    cv_.notify_all();
  }

  void wait() override {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }
  /// Like wait(), but returns false (without throwing) if not done by `deadline`.
  bool wait_until(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock lock(mutex_);
    if (!cv_.wait_until(lock, deadline, [&] { return done_; })) return false;
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    return true;
  }
  bool test() override {
    std::lock_guard lock(mutex_);
    return done_;
  }
  void abandon() noexcept override {
    if (world_ && !test())
      world_->abort(what_ + " was still pending when its request was destroyed during stack unwinding");
  }

 private:
  std::function<void()> fn_;
  std::shared_ptr<thread_world> world_;
  std::string what_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

/// A worker thread executing tasks in the order they were posted.
class progress_thread {
 public:
  progress_thread() : worker_([this] { loop(); }) {}
  progress_thread(const progress_thread&) = delete;
  progress_thread& operator=(const progress_thread&) = delete;

  /// Finishes every posted task, then joins.
  ~progress_thread() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  void post(std::shared_ptr<thread_task> task) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(task));
      ++outstanding_;
    }
    cv_.notify_all();
  }

  /// Blocks until every task posted so far has run (errors stay in their requests).
  void drain() {
    std::unique_lock lock(mutex_);
    idle_cv_.wait(lock, [&] { return outstanding_ == 0; });
  }

  /// Number of tasks posted and not yet finished.
  std::size_t outstanding() {
    std::lock_guard lock(mutex_);
    return outstanding_;
  }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      auto task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      task->run();
      task.reset();
      lock.lock();
      if (--outstanding_ == 0) idle_cv_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::shared_ptr<thread_task>> queue_;
  std::size_t outstanding_ = 0;
  bool stop_ = false;
  std::thread worker_;  // last: started after the other members exist
};

/// request_state that forwards to a shared thread_task (the queue holds the other reference).
class thread_request final : public request_state {
 public:
  explicit thread_request(std::shared_ptr<thread_task> t) : task_(std::move(t)) {}
  void wait() override { task_->wait(); }
  bool test() override { return task_->test(); }
  void abandon() noexcept override { task_->abandon(); }

 private:
  std::shared_ptr<thread_task> task_;
};

}  // namespace loom::parallel::detail
