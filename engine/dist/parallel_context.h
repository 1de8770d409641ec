#pragma once
// The distributed runtime (issue 12): a ParallelContext joins this process to the job's other
// processes (rendezvous on rank 0's c10d::TCPStore), holds the world process group and makes
// sub-groups (per mesh dimension, for data / tensor / pipeline parallelism). A ProcessGroup runs
// c10d's collectives (Gloo on CPU tensors; NCCL on CUDA tensors where the build has it), each
// waiting at most the collective timeout. A collective that fails (a peer died, hung or dropped
// off the network) throws PeerFailure naming the failed rank and its host on every rank that
// notices. See engine/dist/README.md. c10d stays inside the .cpp files.
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/environment.h"
#include "dist/traffic.h"

namespace at {
class Tensor;
}

namespace tessera::dist {

enum class ReduceOp { Sum, Avg };  // Avg: floating-point tensors only

// A collective failed because of another rank: `rank` (global) on `host` died, hangs or cannot
// be reached. kind() is Io; the message says which collective, on which rank, and what to check.
class PeerFailure : public Error {
 public:
  PeerFailure(int failed_rank, std::string failed_host, std::string message, std::string hint)
      : Error(ErrorKind::Io, std::move(message), std::move(hint)),
        failed_rank_(failed_rank),
        failed_host_(std::move(failed_host)) {}
  int failed_rank() const { return failed_rank_; }
  const std::string& failed_host() const { return failed_host_; }

 private:
  int failed_rank_;
  std::string failed_host_;
};

struct ParallelOptions {
  DistTimeouts timeouts;
  // Also give every group an NCCL backend, for collectives on CUDA tensors. Needs a build with
  // NCCL (have_nccl()) and a GPU per local rank; CPU tensors always go through Gloo.
  bool cuda_collectives = false;
  // Collectives on CUDA tensors go through Gloo on a host copy instead (copied back at wait()):
  // for ranks that share a GPU, which NCCL refuses (the GPU check's several ranks on its one
  // GPU; job::tests_share_gpu()). Point to point on CUDA tensors always goes this way (below).
  bool cuda_through_host = false;
  // Tests: CPU tensors take that host-copy path too (a copy of the tensor over Gloo, copied back
  // at wait()), so that the path is tested where there is no GPU. TESSERA_DIST_COPY_EVERY_TENSOR=1.
  bool copy_every_tensor = false;
};

// Whether this build can run collectives on CUDA tensors (c10d compiled with NCCL).
bool have_nccl();

class ParallelContext;

// A collective in flight (ProcessGroup::all_reduce_async): c10d runs it on its own threads while
// this one goes on. wait() returns once it is done here, the result in the tensor, or throws what
// the synchronous call would (PeerFailure naming a failed rank; the same code path). Waiting
// again returns at once, or throws the same error again. Dropping it unwaited leaves the
// collective to finish on its own: the tensor must not be read until it is waited on.
class PendingCollective {
 public:
  PendingCollective();  // nothing in flight: wait() returns at once
  PendingCollective(PendingCollective&&) noexcept;
  PendingCollective& operator=(PendingCollective&&) noexcept;
  ~PendingCollective();

  void wait();
  // Whether wait() has returned (or thrown); false while in flight.
  bool waited() const;

  struct State;

 private:
  friend class ProcessGroup;
  explicit PendingCollective(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// A set of ranks that run collectives together. Every member must call the same collectives in
// the same order with tensors of the same shape and dtype (c10d's contract). Tensors must be
// contiguous; all on the CPU or all on this rank's GPU.
class ProcessGroup {
 public:
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;                       // this process's rank within the group
  int size() const;                       // number of ranks in the group
  const std::vector<int>& ranks() const;  // the members' global ranks; group rank i = ranks()[i]
  const std::string& name() const;        // "world" or "group N (ranks …)", for messages

  // In place: every member ends with the elementwise sum (or mean) over the members.
  void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::Sum);
  // The same, started and not waited for; `tensor` shares its storage with the caller's and must
  // stay untouched until wait(). Several may be in flight at once: every member must start them
  // in the same order, and they complete in that order.
  PendingCollective all_reduce_async(at::Tensor tensor, ReduceOp op = ReduceOp::Sum);
  // In place: every member ends with group rank `root`'s tensor.
  void broadcast(at::Tensor& tensor, int root);
  // A flat tensor of size() × input.numel() elements: member 0's input, then member 1's, …
  at::Tensor all_gather(const at::Tensor& input);
  // The same into `output` (contiguous, size() × input.numel() elements, input's dtype), started
  // and not waited for: both tensors stay untouched until wait(), as all_reduce_async's.
  PendingCollective all_gather_async(at::Tensor input, at::Tensor output);
  // `input` (numel divisible by size()) is reduced over the members, and this member gets its
  // block: elements [rank() × n, (rank()+1) × n) of the reduction, flat, n = numel / size().
  at::Tensor reduce_scatter(const at::Tensor& input, ReduceOp op = ReduceOp::Sum);
  // The same into `output` (contiguous, numel / size() elements, input's dtype), started and not
  // waited for: both tensors stay untouched until wait(), as all_reduce_async's.
  PendingCollective reduce_scatter_async(at::Tensor input, at::Tensor output,
                                         ReduceOp op = ReduceOp::Sum);
  // Point to point (pipeline stages): `tensor` (contiguous) to group rank `destination`, which
  // receives it with recv(…, source = this rank, the same tag) into a tensor of the same shape
  // and dtype. Both return at once; the tensor stays untouched until wait(). Sends and receives
  // between two ranks with one tag match in the order they were issued. CUDA tensors go through
  // Gloo on a host copy: NCCL's point to point has no tags and matches a pair's messages in the
  // order they were issued, on one stream, where the pipeline's schedule posts receives ahead
  // of its sends and its activations and gradients cross (a receive posted ahead would take the
  // wrong message, or wait forever ahead of the send its peer waits for).
  PendingCollective send(at::Tensor tensor, int destination, int tag);
  PendingCollective recv(at::Tensor tensor, int source, int tag);
  // Returns once every member has called it.
  void barrier();

  // Bytes this member has handed to c10d since the group was made, per collective kind, and
  // the ring volume they stand for (dist/traffic.h says exactly what is counted). Counted when
  // a collective is issued; safe to read from any thread.
  Traffic traffic() const;

 private:
  friend class ParallelContext;
  struct Impl;
  void check_peer(const char* operation, int peer) const;  // send/recv: another member
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class ParallelContext {
 public:
  // read_dist_environment() and read_dist_timeouts(), then as the constructor.
  // `cuda_through_host`: ParallelOptions'. TESSERA_DIST_COPY_EVERY_TENSOR=1 sets
  // copy_every_tensor (tests).
  static std::unique_ptr<ParallelContext> from_environment(bool cuda_collectives = false,
                                                           bool cuda_through_host = false);

  // One process (world_size 1): no store, no network; collectives return their input.
  // Several: connects to (rank 0: starts) the TCPStore at master_addr:master_port, waits for every
  // rank (rendezvous timeout), exchanges hostnames and connects the world group. Throws
  // tessera::Error (Io) naming the address when the rendezvous fails.
  ParallelContext(DistEnvironment environment, ParallelOptions options);
  ~ParallelContext();
  ParallelContext(const ParallelContext&) = delete;
  ParallelContext& operator=(const ParallelContext&) = delete;

  int rank() const;
  int world_size() const;
  int local_rank() const;
  int local_world_size() const;
  bool is_distributed() const;
  const DistTimeouts& timeouts() const;
  const ParallelOptions& options() const;
  // "hostname (address)" of a rank, as that rank reported it at the rendezvous.
  const std::string& host_of(int rank) const;

  ProcessGroup& world();
  // Like torch.distributed.new_group: every rank of the world calls it, in the same order, with
  // the same `ranks` (global, distinct, in range); members get the group, the others nullptr.
  std::shared_ptr<ProcessGroup> new_group(std::vector<int> ranks);
  // Every group along `dim` of the mesh `shape` (product = world size; see mesh.h), made on every
  // rank; returns the one this rank belongs to.
  std::shared_ptr<ProcessGroup> new_mesh_group(const std::vector<int>& shape, int dim);

  struct State;  // shared with the groups (store, liveness, hosts)

 private:
  // new_group's work; `name` empty: "group N (ranks …)".
  std::unique_ptr<ProcessGroup> make_group(std::vector<int> ranks, std::string name);

  std::shared_ptr<State> state_;
  std::unique_ptr<ProcessGroup> world_;
};

}  // namespace tessera::dist
