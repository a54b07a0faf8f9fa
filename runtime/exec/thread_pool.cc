#include "runtime/exec/thread_pool.h"

#include <chrono>

namespace g3 {

namespace {

// True on pool workers and on a caller while it runs items, so a nested
// parallel_for runs inline instead of waiting for threads that are busy.
thread_local bool t_inside_pool = false;

// How long a worker spins for the next region, and the caller for the end
// of one, before sleeping. Between the regions of one block call there are
// a few microseconds of serial work; between decode steps, a little more.
// Short enough not to hold a shared machine's cores when the pool is idle.
constexpr auto kSpin = std::chrono::microseconds(200);

inline void pause() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

// Spins until done() or kSpin has passed; true when done.
template <class F>
bool spin_until(const F& done) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (done()) return true;
    pause();
    // Reading the clock costs more than a pause; look at it now and then.
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > until) return done();
  }
}

}  // namespace

int ThreadPool::default_threads() {
  // Asked once: hardware_concurrency reads the affinity mask (a system
  // call), and every default BlockSplit, built per block call, asks this.
  static const int n = [] {
    unsigned c = std::thread::hardware_concurrency();
    return c == 0 ? 1 : static_cast<int>(c);
  }();
  return n;
}

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = default_threads();
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_items() {
  const bool was_inside = t_inside_pool;
  t_inside_pool = true;
  for (;;) {
    int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= n_) break;
    try {
      (*job_)(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
  }
  t_inside_pool = was_inside;
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    auto fresh = [&] { return stop_.load() || generation_.load() != seen; };
    if (!spin_until(fresh)) {
      std::unique_lock<std::mutex> lock(mu_);
      // Counted before the predicate is read: the caller bumps generation_
      // before it reads sleepers_ (both sequentially consistent), so either
      // it sees this sleeper and notifies, or the predicate sees its bump.
      sleepers_.fetch_add(1);
      cv_work_.wait(lock, fresh);
      sleepers_.fetch_sub(1);
    }
    if (stop_.load()) return;
    seen = generation_.load();
    run_items();
    if (pending_.fetch_sub(1) == 1) {
      std::lock_guard<std::mutex> lock(mu_);  // so a caller about to sleep sees pending_ == 0 or the notify
      cv_done_.notify_all();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1 || t_inside_pool) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::lock_guard<std::mutex> call(call_mu_);
  job_ = &fn;
  n_ = n;
  next_.store(0, std::memory_order_relaxed);
  error_ = nullptr;
  pending_.store(static_cast<int>(workers_.size()));
  generation_.fetch_add(1);  // publishes the job to the workers
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_work_.notify_all();
  }
  run_items();
  auto done = [&] { return pending_.load() == 0; };
  if (!spin_until(done)) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_done_.wait(lock, done);
  }
  job_ = nullptr;
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lock(mu_);
    err = error_;
    error_ = nullptr;
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace g3
