#include "nodes/link/link_test.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "dist/parallel_context.h"

namespace tessera::nodes {

namespace {

using Clock = std::chrono::steady_clock;

double median_ms(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  const std::size_t n = samples.size();
  return n % 2 == 1 ? samples[n / 2] : (samples[n / 2 - 1] + samples[n / 2]) / 2.0;
}

double time_all_reduce_ms(dist::ProcessGroup& group, at::Tensor& tensor) {
  const auto start = Clock::now();
  group.all_reduce(tensor);
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

}  // namespace

LinkMeasurement run_link_test(int rank, const std::string& master_addr, std::uint16_t master_port,
                              std::uint64_t bytes, std::chrono::milliseconds timeout) {
  dist::DistEnvironment environment;
  environment.master_addr = master_addr;
  environment.master_port = master_port;
  environment.rank = rank;
  environment.world_size = 2;
  environment.local_rank = 0;  // one rank on each machine
  environment.local_world_size = 1;
  dist::ParallelOptions options;
  options.timeouts.rendezvous = timeout;
  options.timeouts.collective = timeout;
  dist::ParallelContext context(environment, options);
  dist::ProcessGroup& world = context.world();

  LinkMeasurement out;
  out.bytes = bytes;
  at::Tensor small = at::ones({1}, at::kFloat);
  for (int i = 0; i < 3; ++i) world.all_reduce(small);  // connections warm
  std::vector<double> small_ms;
  for (int i = 0; i < 20; ++i) small_ms.push_back(time_all_reduce_ms(world, small));
  out.small_runs = static_cast<int>(small_ms.size());
  out.latency_ms = median_ms(small_ms);

  at::Tensor large =
      at::ones({static_cast<std::int64_t>(std::max<std::uint64_t>(bytes / 4, 1))}, at::kFloat);
  world.all_reduce(large);  // first touch of the buffers on both sides
  std::vector<double> large_ms;
  for (int i = 0; i < 3; ++i) large_ms.push_back(time_all_reduce_ms(world, large));
  out.large_runs = static_cast<int>(large_ms.size());
  out.large_ms = median_ms(large_ms);
  out.bandwidth_mb_s = static_cast<double>(large.numel() * 4) / (out.large_ms / 1e3) / 1e6;
  // Sums of ones are 2^k after k all_reduces: a wrong result means the link corrupts data.
  const float expected = static_cast<float>(1 << (1 + 3));
  if (large.max().item<float>() != expected || large.min().item<float>() != expected)
    throw Error(ErrorKind::Io, "the c10d link test's all_reduce gave wrong sums",
                "the network corrupts data, or the two sides ran different tests");
  world.barrier();  // rank 0 holds the store: nobody leaves before everyone is done
  return out;
}

}  // namespace tessera::nodes
