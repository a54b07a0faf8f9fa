// What a tensor-parallel run needs from its ranks' transport, as an
// interface: the sharded stack and the run driver are written against it, so
// only mpi_comm.cc includes <mpi.h> (DESIGN: nothing below the API knows
// about MPI, and a build without MPI still compiles every other file here).
#pragma once
#include <cstdint>
#include <vector>

namespace g3 {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Ranks sharing this machine (they share its cores, so each takes its
  // share of the threads).
  virtual int local_size() const = 0;
  // In place: every rank's n floats become the element-wise sum over ranks.
  virtual void allreduce_sum(float* data, int64_t n) = 0;
  // True on every rank when `ok` is true on every rank: how ranks agree to
  // stop together after a step that may fail on some of them only.
  virtual bool all_ok(bool ok) = 0;
  // True on every rank when every rank passed the same v: how ranks check
  // they were started with the same arguments before anything collective
  // could hang on a difference.
  virtual bool all_same(uint64_t v) = 0;
  // Every rank's value, in rank order, at rank 0 (empty elsewhere).
  virtual std::vector<double> gather(double v) = 0;
  // Blocks until every rank has called it, sleeping rather than spinning, so
  // ranks that wait for rank 0 (its --verify pass) leave it the cores.
  virtual void idle_barrier() = 0;
  // Ends the whole job with `code`: for a failure on one rank while the
  // others may be inside a collective call, where returning would hang them.
  [[noreturn]] virtual void abort(int code) = 0;
};

}  // namespace g3
