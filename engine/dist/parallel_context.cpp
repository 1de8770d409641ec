#include "dist/parallel_context.h"

#include <ATen/ATen.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <set>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "dist/liveness.h"
#include "dist/mesh.h"
#include "dist/nccl_backend.h"

namespace tessera::dist {
namespace {

// c10::Error's what() carries a C++ backtrace; messages keep its first line.
std::string first_line(const std::exception& error) {
  std::string text = error.what();
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) {
    text = c10_error->what_without_backtrace();
  }
  if (const auto newline = text.find('\n'); newline != std::string::npos) text.resize(newline);
  // Gloo starts with its source location, "[/path/to/pair.cc:561] ": not for users.
  if (text.starts_with("[") && text.find("] ") != std::string::npos) {
    text.erase(0, text.find("] ") + 2);
  }
  return text;
}

std::string seconds_text(std::chrono::milliseconds duration) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", static_cast<double>(duration.count()) / 1000.0);
  return text;
}

// The local address this machine uses to reach `host`: the interface Gloo should bind so that
// peers on the same network as rank 0 can connect back. Empty if the route is unknown.
std::string local_address_towards(const std::string& host, std::uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return {};
  std::string address;
  for (addrinfo* entry = found; entry != nullptr && address.empty(); entry = entry->ai_next) {
    const int socket_fd = socket(entry->ai_family, SOCK_DGRAM, 0);
    if (socket_fd < 0) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof local;
    // connect() on UDP sends nothing: it only picks the route and so the local address.
    if (connect(socket_fd, entry->ai_addr, entry->ai_addrlen) == 0 &&
        getsockname(socket_fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* raw =
          local.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (inet_ntop(local.ss_family, raw, text, sizeof text) != nullptr) address = text;
    }
    close(socket_fd);
  }
  freeaddrinfo(found);
  return address;
}

std::string this_hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "unknown-host";
  return name;
}

}  // namespace

struct ParallelContext::State {
  DistEnvironment environment;
  ParallelOptions options;
  c10::intrusive_ptr<c10d::Store> store;                   // null for one process
  std::shared_ptr<::gloo::transport::Device> gloo_device;  // shared by every group
  std::vector<std::string> hosts;                          // "hostname (address)" per rank
  std::vector<std::string> pids;                           // process id per rank
  std::unique_ptr<LivenessMonitor> liveness;
  int groups_made = 0;  // names each group's store prefix; the same sequence on every rank

  // Turns a collective's failure into the error every rank can act on: which rank failed,
  // on which host, and what to check.
  [[noreturn]] void fail(const std::string& operation, const std::string& group,
                         const std::vector<int>& members, const std::string& cause) const;
};

void ParallelContext::State::fail(const std::string& operation, const std::string& group,
                                  const std::vector<int>& members, const std::string& cause) const {
  const int self = environment.rank;
  std::optional<std::pair<int, std::string>> culprit = liveness->recorded_failure();
  if (!culprit) {
    if (auto suspect = liveness->find_suspect(members)) {
      culprit = std::pair{suspect->rank, suspect->reason};
      // Every rank that notices names the same culprit: the first to record it.
      if (auto recorded = liveness->record_failure(suspect->rank, suspect->reason)) {
        culprit = recorded;
      }
    }
  }
  const std::string timeout = seconds_text(options.timeouts.collective);
  const std::string where = operation + " on " + group + " failed on rank " + std::to_string(self) +
                            " (" + hosts[static_cast<std::size_t>(self)] + ")";
  if (!culprit) {
    throw Error(ErrorKind::Io,
                where + ": " + cause + "; every other rank still answers through the store",
                "check that every rank runs the same collectives in the same order with tensors "
                "of the same shape and dtype, and the network between the hosts; a collective "
                "waits " +
                    timeout + " for its peers (TESSERA_DIST_TIMEOUT_S)");
  }
  const auto culprit_index = static_cast<std::size_t>(culprit->first);
  const std::string& culprit_host = hosts[culprit_index];
  throw PeerFailure(
      culprit->first, culprit_host,
      where + ": rank " + std::to_string(culprit->first) + " on " + culprit_host + " (pid " +
          pids[culprit_index] + ") " + culprit->second + " (c10d: " + cause + ")",
      "check rank " + std::to_string(culprit->first) + "'s process on " + culprit_host +
          ": whether it crashed (its log; `dmesg` for the OOM killer), was stopped or is stuck "
          "(a debugger, SIGSTOP, a full disk)" +
          (culprit_host == hosts[static_cast<std::size_t>(self)]
               ? std::string()
               : ", and the network between " + hosts[static_cast<std::size_t>(self)] + " and " +
                     culprit_host) +
          "; a collective waits " + timeout + " for its peers (TESSERA_DIST_TIMEOUT_S)");
}

// ---------------------------------------------------------------------------------------------

struct PendingCollective::State {
  std::shared_ptr<const ParallelContext::State> context;
  std::string operation;
  std::string group;
  std::vector<int> ranks;
  std::chrono::milliseconds timeout{0};
  c10::intrusive_ptr<c10d::Work> work;
  at::Tensor result;
  int divisor = 1;
  // NCCL's work on CUDA tensors: wait() orders the current stream after it and returns, so that
  // the host keeps queuing work (a timed wait would block the host until the GPU finished it,
  // polling; NCCL's watchdog holds the timeout given at the backend's creation instead).
  bool stream_ordered = false;
  // A collective run on a host copy of a CUDA tensor (Impl::route): `result` is the copy, and
  // wait() copies it into this tensor, the caller's.
  at::Tensor copy_back;
  bool waited = false;
  std::exception_ptr error;  // what wait() threw, thrown again by a later wait()
};

struct ProcessGroup::Impl {
  std::shared_ptr<const ParallelContext::State> context;
  std::string name;
  std::vector<int> ranks;                  // global ranks of the members
  int rank = 0;                            // this process's index in `ranks`
  c10::intrusive_ptr<c10d::Backend> gloo;  // null when the group is this process alone
  c10::intrusive_ptr<c10d::Backend> nccl;  // null unless cuda_collectives

  // traffic(): calls, payload bytes and ring bytes per collective kind (issued on the training
  // thread, autograd's threads or c10d's, read by anyone).
  enum Kind { AllReduce, ReduceScatter, AllGather, Broadcast, Send, Kinds };
  struct Counter {
    std::atomic<std::uint64_t> calls{0}, bytes{0}, ring_bytes{0};
  };
  std::array<Counter, Kinds> counters;

  void count(Kind kind, const at::Tensor& payload) {
    const auto bytes = static_cast<std::uint64_t>(payload.numel()) *
                       static_cast<std::uint64_t>(payload.element_size());
    const int members = static_cast<int>(ranks.size());
    Counter& counter = counters[kind];
    counter.calls.fetch_add(1, std::memory_order_relaxed);
    counter.bytes.fetch_add(bytes, std::memory_order_relaxed);
    counter.ring_bytes.fetch_add(
        kind == Send ? bytes : ring_volume(bytes, members, kind == AllReduce ? 2 : 1),
        std::memory_order_relaxed);
  }

  std::chrono::milliseconds timeout() const { return context->options.timeouts.collective; }

  // Which backend runs a collective on `tensor`, and whether on a host copy of it: NCCL for a
  // CUDA tensor where the group has it; Gloo otherwise, on a host copy for a CUDA tensor (ranks
  // sharing a GPU; point to point, always: ProcessGroup::send says why).
  struct Route {
    c10d::Backend* backend = nullptr;
    bool through_host = false;
    // The tensor the backend works on: `tensor`, or its host copy (`values` false: room for a
    // result).
    at::Tensor wire(const at::Tensor& tensor, bool values = true) const {
      return through_host ? host_copy(tensor, values) : tensor;
    }
    // What wait() copies the result into: the caller's `tensor` where the backend worked on a
    // copy of it.
    at::Tensor back(const at::Tensor& tensor) const { return through_host ? tensor : at::Tensor(); }
  };
  Route route(const at::Tensor& tensor, const char* operation, bool point_to_point = false) const {
    if (!tensor.is_contiguous()) {
      throw_invalid(std::string(operation) + " on " + name + ": the tensor is not contiguous",
                    "pass tensor.contiguous()");
    }
    const ParallelOptions& options = context->options;
    if (tensor.is_cuda()) {
      if (nccl && !point_to_point) return {nccl.get(), false};
      if (!nccl && !point_to_point && !options.cuda_through_host) {
        throw_unsupported(std::string(operation) + " on " + name +
                              ": a CUDA tensor, but the context has no NCCL backend",
                          "make the ParallelContext with cuda_collectives, or move the tensor "
                          "to the CPU");
      }
      return {gloo.get(), true};
    }
    return {gloo.get(), options.copy_every_tensor};
  }
  // The host copy a collective runs on (Route::through_host): the tensor's values, or (`values`
  // false: a receive's buffer) room for them.
  static at::Tensor host_copy(const at::Tensor& tensor, bool values = true) {
    if (!values) return at::empty(tensor.sizes(), tensor.options().device(at::kCPU));
    // A CUDA tensor's copy waits for the stream that computes it.
    return tensor.is_cuda() ? tensor.to(at::kCPU) : tensor.clone();
  }

  // Issues a collective; its failure, at issue or at wait(), becomes State::fail's error.
  // `result` is divided by `divisor` once done (Avg: Gloo has no AVG); 1 leaves it as it is.
  template <typename Issue>
  PendingCollective start(const char* operation, Issue&& issue, at::Tensor result, int divisor = 1,
                          at::Tensor copy_back = {}) const {
    auto pending = std::make_unique<PendingCollective::State>();
    pending->context = context;
    pending->operation = operation;
    pending->group = name;
    pending->ranks = ranks;
    pending->timeout = timeout();
    pending->result = std::move(result);
    pending->divisor = divisor;
    pending->copy_back = std::move(copy_back);
    pending->stream_ordered = nccl && pending->result.defined() && pending->result.is_cuda();
    try {
      pending->work = issue();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& error) {
      context->fail(operation, name, ranks, first_line(error));
    }
    return PendingCollective(std::move(pending));
  }
};

PendingCollective::PendingCollective() = default;
PendingCollective::PendingCollective(std::unique_ptr<State> state) : state_(std::move(state)) {}
PendingCollective::PendingCollective(PendingCollective&&) noexcept = default;
PendingCollective& PendingCollective::operator=(PendingCollective&&) noexcept = default;
PendingCollective::~PendingCollective() = default;

bool PendingCollective::waited() const {
  return !state_ || state_->waited;
}

void PendingCollective::wait() {
  if (!state_) return;
  State& state = *state_;
  if (state.error) std::rethrow_exception(state.error);
  if (state.waited) return;
  state.waited = true;
  try {
    try {
      // 0: c10d's kNoTimeout (declared outside its namespace in some LibTorch versions).
      const std::chrono::milliseconds timeout =
          state.stream_ordered ? std::chrono::milliseconds(0) : state.timeout;
      if (!state.work->wait(timeout)) {
        // A stream-ordered wait (NCCL's) has no timeout of its own: false means NCCL's watchdog
        // aborted the work (its collective timeout passed, or a peer failed).
        if (!state.stream_ordered)
          throw std::runtime_error("no result after " + seconds_text(state.timeout));
        std::string why = "aborted by NCCL's watchdog (a peer failed or the collective timed out)";
        if (const std::exception_ptr cause = state.work->exception()) {
          try {
            std::rethrow_exception(cause);
          } catch (const std::exception& e) {
            why += ": " + first_line(e);
          } catch (...) {
          }
        }
        throw std::runtime_error(why);
      }
    } catch (const Error&) {
      throw;
    } catch (const std::exception& error) {
      state.context->fail(state.operation, state.group, state.ranks, first_line(error));
    }
  } catch (...) {
    state.error = std::current_exception();
    throw;
  }
  if (state.divisor != 1) state.result.div_(state.divisor);
  if (state.copy_back.defined()) {
    state.copy_back.copy_(state.result);
    state.copy_back = at::Tensor();
  }
  state.work.reset();
}

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;

int ProcessGroup::rank() const {
  return impl_->rank;
}
int ProcessGroup::size() const {
  return static_cast<int>(impl_->ranks.size());
}
const std::vector<int>& ProcessGroup::ranks() const {
  return impl_->ranks;
}
const std::string& ProcessGroup::name() const {
  return impl_->name;
}

void ProcessGroup::all_reduce(at::Tensor& tensor, ReduceOp op) {
  all_reduce_async(tensor, op).wait();
}

PendingCollective ProcessGroup::all_reduce_async(at::Tensor tensor, ReduceOp op) {
  if (op == ReduceOp::Avg && !at::isFloatingType(tensor.scalar_type())) {
    throw_invalid("all_reduce(Avg) on " + impl_->name + " needs a floating-point tensor, not " +
                  std::string(c10::toString(tensor.scalar_type())));
  }
  if (size() == 1) return PendingCollective();
  const Impl::Route route = impl_->route(tensor, "all_reduce");
  impl_->count(Impl::AllReduce, tensor);
  at::Tensor on_wire = route.wire(tensor);
  return impl_->start(
      "all_reduce",
      [&] {
        std::vector<at::Tensor> tensors{on_wire};
        c10d::AllreduceOptions options;
        options.reduceOp = c10d::ReduceOp::SUM;  // Gloo has no AVG: sum, then divide
        options.timeout = impl_->timeout();
        return route.backend->allreduce(tensors, options);
      },
      on_wire, op == ReduceOp::Avg ? size() : 1, route.back(tensor));
}

void ProcessGroup::broadcast(at::Tensor& tensor, int root) {
  if (root < 0 || root >= size()) {
    throw_invalid("broadcast on " + impl_->name + ": root " + std::to_string(root) +
                  " is not a rank of the group (0 .. " + std::to_string(size() - 1) + ")");
  }
  if (size() == 1) return;
  const Impl::Route route = impl_->route(tensor, "broadcast");
  impl_->count(Impl::Broadcast, tensor);
  at::Tensor on_wire = route.wire(tensor, rank() == root);
  impl_
      ->start(
          "broadcast",
          [&] {
            std::vector<at::Tensor> tensors{on_wire};
            c10d::BroadcastOptions options;
            options.rootRank = root;
            options.timeout = impl_->timeout();
            return route.backend->broadcast(tensors, options);
          },
          on_wire, 1, rank() != root ? route.back(tensor) : at::Tensor())
      .wait();
}

at::Tensor ProcessGroup::all_gather(const at::Tensor& input) {
  at::Tensor flat = input.contiguous().view(-1);
  at::Tensor output = at::empty({size() * flat.numel()}, flat.options());
  all_gather_async(flat, output).wait();
  return output;
}

PendingCollective ProcessGroup::all_gather_async(at::Tensor input, at::Tensor output) {
  if (!input.is_contiguous() || !output.is_contiguous() ||
      output.numel() != input.numel() * size() || output.scalar_type() != input.scalar_type()) {
    throw_invalid("all_gather on " + impl_->name +
                  ": input and output must be contiguous, the output with " +
                  std::to_string(input.numel() * size()) + " elements of the input's dtype");
  }
  at::Tensor flat = input.view(-1);
  at::Tensor out = output.view(-1);
  if (size() == 1) {
    out.copy_(flat);
    return PendingCollective();
  }
  const Impl::Route route = impl_->route(flat, "all_gather");
  impl_->count(Impl::AllGather, out);
  at::Tensor in_wire = route.wire(flat);
  at::Tensor out_wire = route.wire(out, false);
  return impl_->start(
      "all_gather",
      [&] {
        c10d::AllgatherOptions options;
        options.timeout = impl_->timeout();
        // _allgather_base: the name every LibTorch from 2.11 (the GPU machines') to 2.15 has;
        // 2.15 forwards it to all_gather_single, which 2.11 lacks.
        return route.backend->_allgather_base(out_wire, in_wire, options);
      },
      out_wire, 1, route.back(out));
}

at::Tensor ProcessGroup::reduce_scatter(const at::Tensor& input, ReduceOp op) {
  at::Tensor flat = input.contiguous().view(-1);
  at::Tensor output = at::empty({flat.numel() / std::max(size(), 1)}, flat.options());
  reduce_scatter_async(flat, output, op).wait();
  return output;
}

PendingCollective ProcessGroup::reduce_scatter_async(at::Tensor input, at::Tensor output,
                                                     ReduceOp op) {
  if (input.numel() % size() != 0) {
    throw_invalid("reduce_scatter on " + impl_->name + ": " + std::to_string(input.numel()) +
                      " elements do not split evenly over " + std::to_string(size()) + " ranks",
                  "pad the tensor to a multiple of the group size");
  }
  if (op == ReduceOp::Avg && !at::isFloatingType(input.scalar_type())) {
    throw_invalid("reduce_scatter(Avg) on " + impl_->name + " needs a floating-point tensor");
  }
  if (!input.is_contiguous() || !output.is_contiguous() ||
      output.numel() != input.numel() / size() || output.scalar_type() != input.scalar_type()) {
    throw_invalid("reduce_scatter on " + impl_->name +
                  ": input and output must be contiguous, the output with " +
                  std::to_string(input.numel() / size()) + " elements of the input's dtype");
  }
  at::Tensor flat = input.view(-1);
  if (size() == 1) {
    output.view(-1).copy_(flat);
    return PendingCollective();
  }
  const Impl::Route route = impl_->route(flat, "reduce_scatter");
  impl_->count(Impl::ReduceScatter, flat);
  at::Tensor out = output.view(-1);
  at::Tensor in_wire = route.wire(flat);
  at::Tensor out_wire = route.wire(out, false);
  return impl_->start(
      "reduce_scatter",
      [&] {
        c10d::ReduceScatterOptions options;
        options.reduceOp = c10d::ReduceOp::SUM;  // Gloo has no AVG: sum, then divide
        options.timeout = impl_->timeout();
        // as _allgather_base above
        return route.backend->_reduce_scatter_base(out_wire, in_wire, options);
      },
      out_wire, op == ReduceOp::Avg ? size() : 1, route.back(out));
}

PendingCollective ProcessGroup::send(at::Tensor tensor, int destination, int tag) {
  check_peer("send", destination);
  const Impl::Route route = impl_->route(tensor, "send", /*point_to_point=*/true);
  impl_->count(Impl::Send, tensor);
  // The host copy stays with the pending send (its result) until it is waited on.
  at::Tensor on_wire = route.wire(tensor);
  return impl_->start(
      "send",
      [&] {
        std::vector<at::Tensor> tensors{on_wire};
        return route.backend->send(tensors, destination, tag);
      },
      on_wire);
}

PendingCollective ProcessGroup::recv(at::Tensor tensor, int source, int tag) {
  check_peer("recv", source);
  const Impl::Route route = impl_->route(tensor, "recv", /*point_to_point=*/true);
  at::Tensor on_wire = route.wire(tensor, false);
  return impl_->start(
      "recv",
      [&] {
        std::vector<at::Tensor> tensors{on_wire};
        return route.backend->recv(tensors, source, tag);
      },
      on_wire, 1, route.back(tensor));
}

void ProcessGroup::check_peer(const char* operation, int peer) const {
  if (peer < 0 || peer >= size() || peer == rank())
    throw_invalid(std::string(operation) + " on " + impl_->name + ": peer " + std::to_string(peer) +
                  " is not another rank of the group (0 .. " + std::to_string(size() - 1) +
                  ", this one " + std::to_string(rank()) + ")");
}

void ProcessGroup::barrier() {
  if (size() == 1) return;
  impl_
      ->start("barrier",
              [&] {
                c10d::BarrierOptions options;
                options.timeout = impl_->timeout();
                return impl_->gloo->barrier(options);
              },
              {})
      .wait();
}

Traffic ProcessGroup::traffic() const {
  const auto read = [this](Impl::Kind kind) {
    const Impl::Counter& counter = impl_->counters[kind];
    return CollectiveTraffic{counter.calls.load(std::memory_order_relaxed),
                             counter.bytes.load(std::memory_order_relaxed),
                             counter.ring_bytes.load(std::memory_order_relaxed)};
  };
  return {read(Impl::AllReduce), read(Impl::ReduceScatter), read(Impl::AllGather),
          read(Impl::Broadcast), read(Impl::Send)};
}

// ---------------------------------------------------------------------------------------------

bool have_nccl() {
  return nccl_compiled();
}

std::unique_ptr<ParallelContext> ParallelContext::from_environment(bool cuda_collectives,
                                                                   bool cuda_through_host) {
  ParallelOptions options;
  options.timeouts = read_dist_timeouts();
  options.cuda_collectives = cuda_collectives;
  options.cuda_through_host = cuda_through_host;
  const char* copy_every = std::getenv("TESSERA_DIST_COPY_EVERY_TENSOR");
  options.copy_every_tensor = copy_every != nullptr && std::string(copy_every) == "1";
  return std::make_unique<ParallelContext>(read_dist_environment(), options);
}

ParallelContext::ParallelContext(DistEnvironment environment, ParallelOptions options)
    : state_(std::make_shared<State>()) {
  State& state = *state_;
  state.environment = std::move(environment);
  state.options = options;
  const DistEnvironment& env = state.environment;
  if (options.cuda_collectives && !have_nccl()) make_nccl_backend({}, 0, 1, {});  // throws

  const std::string address = env.is_distributed()
                                  ? local_address_towards(env.master_addr, env.master_port)
                                  : std::string();
  const std::string host = this_hostname() + (address.empty() ? "" : " (" + address + ")");
  if (!env.is_distributed()) {
    state.hosts = {host};
    state.pids = {std::to_string(getpid())};
    auto impl = std::make_unique<ProcessGroup::Impl>();  // built in place: its counters are atomic
    impl->context = state_;
    impl->name = "world";
    impl->ranks = {0};
    world_.reset(new ProcessGroup(std::move(impl)));
    return;
  }

  const std::string store_address = env.master_addr + ":" + std::to_string(env.master_port);
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = env.master_port;
    store_options.isServer = env.rank == 0;
    store_options.numWorkers = static_cast<std::size_t>(env.world_size);
    store_options.waitWorkers = true;
    store_options.timeout = options.timeouts.rendezvous;
    state.store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);

    // Every rank's host, so that an error on any rank can say where a failed peer ran.
    const std::string self = std::to_string(env.rank);
    state.store->set("tessera/host/" + self, host);
    state.store->set("tessera/pid/" + self, std::to_string(getpid()));
    for (int peer = 0; peer < env.world_size; ++peer) {
      const auto host_bytes = state.store->get("tessera/host/" + std::to_string(peer));
      const auto pid_bytes = state.store->get("tessera/pid/" + std::to_string(peer));
      state.hosts.emplace_back(host_bytes.begin(), host_bytes.end());
      state.pids.emplace_back(pid_bytes.begin(), pid_bytes.end());
    }
  } catch (const std::exception& error) {
    throw Error(ErrorKind::Io,
                "rank " + std::to_string(env.rank) +
                    (env.rank == 0 ? " could not serve" : " could not reach") +
                    " the rendezvous store at " + store_address + " with all " +
                    std::to_string(env.world_size) + " ranks within " +
                    seconds_text(options.timeouts.rendezvous) + ": " + first_line(error),
                "check that every rank was started with the same MASTER_ADDR, MASTER_PORT and "
                "WORLD_SIZE, that MASTER_PORT is free on rank 0's machine and not blocked by a "
                "firewall, and that rank 0 is running; the wait is "
                "TESSERA_DIST_RENDEZVOUS_TIMEOUT_S");
  }

  // Gloo binds to the interface that routes to rank 0 (or GLOO_SOCKET_IFNAME's, as in torch).
  if (const char* interface = std::getenv("GLOO_SOCKET_IFNAME"); interface && *interface) {
    state.gloo_device = c10d::ProcessGroupGloo::createDeviceForInterface(interface);
  } else if (!address.empty()) {
    state.gloo_device = c10d::ProcessGroupGloo::createDeviceForHostname(address);
  } else {
    state.gloo_device = c10d::ProcessGroupGloo::createDefaultDevice();
  }
  state.liveness =
      std::make_unique<LivenessMonitor>(env.master_addr, env.master_port, env.rank, env.world_size,
                                        options.timeouts.heartbeat_interval());
  std::vector<int> everyone(static_cast<std::size_t>(env.world_size));
  for (int rank = 0; rank < env.world_size; ++rank) everyone[static_cast<std::size_t>(rank)] = rank;
  world_ = make_group(std::move(everyone), "world");
}

ParallelContext::~ParallelContext() {
  // Groups first (they may still hold connections), then the heartbeat thread, then the store.
  world_.reset();
  state_->liveness.reset();
}

int ParallelContext::rank() const {
  return state_->environment.rank;
}
int ParallelContext::world_size() const {
  return state_->environment.world_size;
}
int ParallelContext::local_rank() const {
  return state_->environment.local_rank;
}
int ParallelContext::local_world_size() const {
  return state_->environment.local_world_size;
}
bool ParallelContext::is_distributed() const {
  return state_->environment.is_distributed();
}
const DistTimeouts& ParallelContext::timeouts() const {
  return state_->options.timeouts;
}

const ParallelOptions& ParallelContext::options() const {
  return state_->options;
}

const std::string& ParallelContext::host_of(int rank) const {
  if (rank < 0 || rank >= world_size()) {
    throw_invalid("rank " + std::to_string(rank) + " is not in the world of " +
                  std::to_string(world_size()));
  }
  return state_->hosts[static_cast<std::size_t>(rank)];
}

ProcessGroup& ParallelContext::world() {
  return *world_;
}

std::shared_ptr<ProcessGroup> ParallelContext::new_group(std::vector<int> ranks) {
  return make_group(std::move(ranks), {});
}

std::unique_ptr<ProcessGroup> ParallelContext::make_group(std::vector<int> ranks,
                                                          std::string name) {
  State& state = *state_;
  std::sort(ranks.begin(), ranks.end());
  if (ranks.empty() || ranks.front() < 0 || ranks.back() >= world_size() ||
      std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end()) {
    std::string listed;
    for (int rank : ranks) listed += (listed.empty() ? "" : ", ") + std::to_string(rank);
    throw_invalid("a process group needs distinct ranks of the world (0 .. " +
                  std::to_string(world_size() - 1) + "), not {" + listed + "}");
  }
  const int group_id = state.groups_made++;
  const auto member = std::find(ranks.begin(), ranks.end(), rank());
  if (member == ranks.end()) return nullptr;

  if (name.empty()) {
    name = "group " + std::to_string(group_id) + " (ranks ";
    for (std::size_t index = 0; index < ranks.size(); ++index) {
      name += (index ? "," : "") + std::to_string(ranks[index]);
    }
    name += ")";
  }
  auto impl = std::make_unique<ProcessGroup::Impl>();
  impl->context = state_;
  impl->name = name;
  impl->ranks = ranks;
  impl->rank = static_cast<int>(member - ranks.begin());
  if (ranks.size() > 1) {
    const std::string prefix = "tessera/group/" + std::to_string(group_id);
    try {
      auto gloo_options =
          c10d::ProcessGroupGloo::Options::create(state.options.timeouts.collective);
      gloo_options->devices = {state.gloo_device};
      impl->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(
          c10::make_intrusive<c10d::PrefixStore>(prefix + "/gloo", state.store), impl->rank,
          static_cast<int>(ranks.size()), gloo_options);
    } catch (const std::exception& error) {
      state.fail("connecting", name, ranks, first_line(error));
    }
    if (state.options.cuda_collectives) {
      impl->nccl = make_nccl_backend(
          c10::make_intrusive<c10d::PrefixStore>(prefix + "/nccl", state.store), impl->rank,
          static_cast<int>(ranks.size()), state.options.timeouts.collective);
    }
  }
  return std::unique_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
}

std::shared_ptr<ProcessGroup> ParallelContext::new_mesh_group(const std::vector<int>& shape,
                                                              int dim) {
  long long cells = 1;
  for (int extent : shape) cells *= extent;
  if (cells != world_size()) {
    throw_invalid("a process mesh of " + std::to_string(cells) + " ranks does not match the " +
                  "world of " + std::to_string(world_size()));
  }
  std::shared_ptr<ProcessGroup> mine;
  for (auto& ranks : mesh_groups(shape, dim)) {
    if (auto group = new_group(std::move(ranks))) mine = std::move(group);
  }
  return mine;
}

}  // namespace tessera::dist
