// A persistent worker pool and parallel_for over independent tasks (dynamic scheduling).
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gmm {
namespace detail {

// Workers that live for the whole process, so small calls do not pay for thread creation.
// Tasks are claimed from an atomic counter; each task must write outputs disjoint from every
// other task's, which makes results independent of the thread count.
class ThreadPool {
 public:
  static ThreadPool& instance() {
    static ThreadPool pool;
    return pool;
  }

  static int hardware_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

  // Runs task(i, worker) for i in [0, count) on `threads` workers (the caller is worker 0).
  void run(std::int64_t count, int threads,
           const std::function<void(std::int64_t task, int worker)>& task) {
    threads = static_cast<int>(std::min<std::int64_t>(std::max(1, threads), count));
    if (threads <= 1) {
      for (std::int64_t i = 0; i < count; ++i) task(i, 0);
      return;
    }
    std::lock_guard<std::mutex> serialize(run_mutex_);
    ensure_workers(threads - 1);
    std::atomic<std::int64_t> next{0};
    std::exception_ptr error;
    std::mutex error_mutex;
    auto drain = [&](int worker) {
      for (std::int64_t i; (i = next.fetch_add(1)) < count;) {
        try {
          task(i, worker);
        } catch (...) {
          std::lock_guard<std::mutex> lock(error_mutex);
          if (!error) error = std::current_exception();
        }
      }
    };
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = drain;
      active_ = threads - 1;
      pending_ = threads - 1;
      ++generation_;
    }
    wake_.notify_all();
    drain(0);
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    if (error) std::rethrow_exception(error);
  }

  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }

 private:
  ThreadPool() = default;

  void ensure_workers(int count) {
    while (static_cast<int>(workers_.size()) < count) {
      const int worker = static_cast<int>(workers_.size()) + 1;
      workers_.emplace_back([this, worker] { loop(worker); });
    }
  }

  void loop(int worker) {
    std::uint64_t seen = 0;
    for (;;) {
      std::function<void(int)> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || (generation_ != seen && worker <= active_); });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      job(worker);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        --pending_;
      }
      done_.notify_all();
    }
  }

  std::mutex run_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  std::function<void(int)> job_;
  std::uint64_t generation_ = 0;
  int active_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace detail

// Resolves the thread-count option: 0 means every hardware thread.
inline int resolve_threads(int requested) {
  return requested > 0 ? requested : detail::ThreadPool::hardware_threads();
}

// Calls task(i, worker) for every i in [0, count), spread over `threads` workers numbered
// [0, threads). Exceptions thrown by tasks are rethrown in the caller.
template <typename Task>
void parallel_for(std::int64_t count, int threads, Task&& task) {
  detail::ThreadPool::instance().run(count, threads, std::forward<Task>(task));
}

}  // namespace gmm
