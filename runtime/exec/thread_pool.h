// A small fork-join pool over all cores. The runtime splits every stage of a
// block (projection column panels, tokens, KV heads, query tiles, KV chunks
// of a long decode) into work items whose boundaries do not depend on the
// number of threads, so a result is bit-identical whatever --threads says;
// the pool only decides which thread runs which item.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace g3 {

class ThreadPool {
 public:
  // threads <= 0 means every core (std::thread::hardware_concurrency). The
  // calling thread is one of them: a pool of n threads starts n - 1 workers.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(i) once for every i in [0, n), spread over the pool, and returns
  // when all calls are done. Items are handed out dynamically. The first
  // exception thrown by an item is rethrown here (later items still run).
  // A call from inside an item runs inline, so nesting cannot deadlock.
  void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

  static int default_threads();

 private:
  void worker_loop();
  void run_items();

  std::vector<std::thread> workers_;
  std::mutex call_mu_;  // one parallel_for at a time per pool
  // Hand-off: the caller publishes job_ and n_, then bumps generation_;
  // workers spin a little on generation_ before they sleep (sleepers_
  // counts them, so the caller notifies only when someone sleeps), and
  // count pending_ down when they are done, which the caller spins on
  // before it sleeps too. A decode step is a few hundred short regions:
  // a condition-variable round trip per region would show in it.
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  const std::function<void(int64_t)>* job_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0}, sleepers_{0};
  std::atomic<bool> stop_{false};
  std::exception_ptr error_;
};

}  // namespace g3
