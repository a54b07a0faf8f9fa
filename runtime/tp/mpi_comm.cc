// The MPI world as a Comm, on Open MPI (Debian's libopenmpi-dev). Only the
// main thread calls MPI (the thread pools never do), so MPI_THREAD_FUNNELED
// is all that is asked for.
#include "runtime/tp/mpi_comm.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

namespace g3 {

namespace {

class MpiComm final : public Comm {
 public:
  MpiComm() {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // Ranks that can share memory are the ranks on this machine.
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
    MPI_Comm_size(local, &local_size_);
    MPI_Comm_free(&local);
  }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_size() const override { return local_size_; }

  void allreduce_sum(float* data, int64_t n) override {
    // MPI counts are int: long calls go in pieces.
    constexpr int64_t kPiece = int64_t(1) << 28;
    for (int64_t at = 0; at < n; at += kPiece)
      MPI_Allreduce(MPI_IN_PLACE, data + at, int(std::min(kPiece, n - at)), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }

  bool all_ok(bool ok) override {
    int v = ok ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return v == 1;
  }

  bool all_same(uint64_t v) override {
    unsigned long long lo = v, hi = v;
    MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    return lo == hi;
  }

  std::vector<double> gather(double v) override {
    std::vector<double> all(rank_ == 0 ? size_t(size_) : 0);
    MPI_Gather(&v, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return all;
  }

  void idle_barrier() override {
    // A blocking barrier busy-polls in Open MPI, which would take a core
    // from the rank still working (rank 0's --verify) on a shared machine.
    MPI_Request req;
    MPI_Ibarrier(MPI_COMM_WORLD, &req);
    int done = 0;
    for (;;) {
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (done) return;
      usleep(2000);
    }
  }

  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; this keeps the promise if it ever did
  }

 private:
  int rank_ = 0, size_ = 1, local_size_ = 1;
};

}  // namespace

bool mpi_built() { return true; }

std::unique_ptr<Comm> mpi_world() { return std::make_unique<MpiComm>(); }

}  // namespace g3
