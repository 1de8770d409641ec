// tessera-dist-tool: test-only front end to engine/dist, for tests/integration/test_dist.py. One
// process per rank, started with torchrun's variables (MASTER_ADDR, MASTER_PORT, RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) and TESSERA_DIST_TIMEOUT_S.
//
//   tessera-dist-tool collectives
//     Every collective on the world and on sub-groups (both dimensions of a 2 × N/2 mesh, and a
//     group that leaves ranks out), on tensors whose exact results are known; prints
//     "ok rank R of N" and exits 0, or says which result differs and exits 1.
//   tessera-dist-tool loop
//     World all_reduces, checked, forever, printing "iteration K" every 10; for a test that
//     kills or stops one rank and watches the others fail.
//   tessera-dist-tool async
//     Eight all_reduce_async on the world in flight at once (float sums and means of several
//     sizes, an int64 sum), waited in reverse order, each result exact; then the same on the
//     sub-group of the even ranks. Prints "ok rank R of N" and exits 0.
//   tessera-dist-tool async-loop
//     Like loop, with four all_reduce_async in flight per iteration, each waited; for a test
//     that kills one rank while collectives are in flight.
//   tessera-dist-tool env
//     Joins the job, prints "rank R of N, local L of M" and exits 0.
//
// Exit codes: 0 ok, 1 a wrong result, 2 invalid input (the environment), 3 a peer failed
// (stderr: "failed_rank=R" and "failed_host=H" lines, then the message and hint), 4 another
// distributed error.
#include <ATen/ATen.h>

#include <cstdio>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "dist/parallel_context.h"

namespace {

using tessera::dist::ParallelContext;
using tessera::dist::ProcessGroup;
using tessera::dist::ReduceOp;

struct WrongResult : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void expect_equal(const std::string& what, const at::Tensor& actual, const at::Tensor& expected) {
  if (actual.sizes() != expected.sizes() || actual.scalar_type() != expected.scalar_type() ||
      !at::equal(actual, expected)) {
    std::ostringstream text;
    text << what << ": got " << actual << " expected " << expected;
    throw WrongResult(text.str());
  }
}

// The global ranks of `group` as a float tensor: what an all_gather of each member's rank gives.
at::Tensor ranks_tensor(const ProcessGroup& group) {
  std::vector<float> values(group.ranks().begin(), group.ranks().end());
  return at::tensor(values, at::kFloat);
}

// Every collective on `group`, whose member i is global rank group.ranks()[i].
void check_group(ProcessGroup& group, int global_rank) {
  const std::string where = group.name() + ": ";
  const int size = group.size();
  const int me = group.rank();
  const double rank_sum = ranks_tensor(group).sum().item<double>();

  // all_reduce, sum (float, int64) and mean.
  at::Tensor values = at::arange(5, at::kFloat) + 10.0 * global_rank;
  group.all_reduce(values);
  expect_equal(where + "all_reduce sum", values,
               at::arange(5, at::kFloat) * size + 10.0 * rank_sum);
  at::Tensor counts = at::full({3}, global_rank + 1, at::kLong);
  group.all_reduce(counts);
  expect_equal(where + "all_reduce sum int64", counts,
               at::full({3}, static_cast<long>(rank_sum) + size, at::kLong));
  at::Tensor mean = at::full({2, 2}, static_cast<double>(global_rank), at::kDouble);
  group.all_reduce(mean, ReduceOp::Avg);
  expect_equal(where + "all_reduce avg", mean, at::full({2, 2}, rank_sum / size, at::kDouble));

  // broadcast from the last member.
  const int root = size - 1;
  at::Tensor broadcast = me == root ? at::arange(4, at::kFloat) * 7 : at::zeros({4}, at::kFloat);
  group.broadcast(broadcast, root);
  expect_equal(where + "broadcast", broadcast, at::arange(4, at::kFloat) * 7);

  // all_gather into one flat tensor, in member order, from a 2-D input.
  at::Tensor piece =
      at::full({1, 2}, static_cast<float>(global_rank)) + at::arange(2, at::kFloat) * 0.5;
  at::Tensor gathered = group.all_gather(piece);
  expect_equal(where + "all_gather", gathered,
               (ranks_tensor(group).unsqueeze(1) + at::arange(2, at::kFloat) * 0.5).reshape({-1}));

  // reduce_scatter: member m contributes 100 m + i at index i; each gets its block of the sum.
  const int block = 3;
  at::Tensor contribution = at::arange(size * block, at::kFloat) + 100.0 * global_rank;
  at::Tensor reduced_sum = at::arange(size * block, at::kFloat) * size + 100.0 * rank_sum;
  expect_equal(where + "reduce_scatter sum", group.reduce_scatter(contribution),
               reduced_sum.slice(0, me * block, (me + 1) * block));
  expect_equal(where + "reduce_scatter avg",
               group.reduce_scatter(contribution.to(at::kDouble), ReduceOp::Avg),
               (reduced_sum.to(at::kDouble) / size).slice(0, me * block, (me + 1) * block));

  // Point to point around the ring: two messages to the next member, tags 1 then 2, received
  // by it in the other order (the tags match them, as the pipeline's schedule needs).
  if (size >= 2) {
    const int next = (me + 1) % size, previous = (me + size - 1) % size;
    auto first = group.send(at::full({3}, 10.0 * global_rank + 1), next, 1);
    auto second = group.send(at::full({2, 2}, 10.0 * global_rank + 2), next, 2);
    at::Tensor got_second = at::zeros({2, 2}), got_first = at::zeros({3});
    auto receive_second = group.recv(got_second, previous, 2);
    auto receive_first = group.recv(got_first, previous, 1);
    receive_second.wait();
    receive_first.wait();
    first.wait();
    second.wait();
    const double sender = group.ranks()[static_cast<std::size_t>(previous)];
    expect_equal(where + "recv tag 1", got_first, at::full({3}, 10.0 * sender + 1));
    expect_equal(where + "recv tag 2", got_second, at::full({2, 2}, 10.0 * sender + 2));
  }

  group.barrier();
}

// "ok rank R of W", and how the tensors travelled where not as they are.
void say_ok(const ParallelContext& context) {
  std::printf("ok rank %d of %d%s\n", context.rank(), context.world_size(),
              context.options().copy_every_tensor ? " (through host copies)" : "");
}

int run_collectives(ParallelContext& context) {
  const int world = context.world_size();
  const int rank = context.rank();
  check_group(context.world(), rank);
  if (world >= 2 && world % 2 == 0) {
    // A 2 × world/2 mesh: rows (dim 1) and columns (dim 0), as tensor / data parallel groups.
    auto row = context.new_mesh_group({2, world / 2}, 1);
    auto column = context.new_mesh_group({2, world / 2}, 0);
    if (!row || !column) throw WrongResult("no mesh group for rank " + std::to_string(rank));
    const int row_first = (rank / (world / 2)) * (world / 2);
    if (row->ranks().front() != row_first ||
        column->ranks() != std::vector{rank % (world / 2), rank % (world / 2) + world / 2}) {
      throw WrongResult("mesh groups of rank " + std::to_string(rank) + " are " + row->name() +
                        " and " + column->name());
    }
    check_group(*row, rank);
    check_group(*column, rank);
  }
  // A group of the first and last ranks only: the others get none and skip it.
  auto ends = context.new_group(world == 1 ? std::vector{0} : std::vector{0, world - 1});
  const bool member = rank == 0 || rank == world - 1;
  if (static_cast<bool>(ends) != member) {
    throw WrongResult("rank " + std::to_string(rank) + (member ? " is missing from " : " is in ") +
                      "the group of ranks 0 and " + std::to_string(world - 1));
  }
  if (ends) check_group(*ends, rank);
  context.world().barrier();
  say_ok(context);
  return 0;
}

int run_loop(ParallelContext& context) {
  const double expected = context.world_size() * (context.world_size() - 1) / 2.0;
  for (long iteration = 1;; ++iteration) {
    at::Tensor values = at::full({4096}, static_cast<double>(context.rank()), at::kDouble);
    context.world().all_reduce(values);
    expect_equal("loop all_reduce", values, at::full({4096}, expected, at::kDouble));
    if (iteration % 10 == 0) {
      std::printf("iteration %ld\n", iteration);
      std::fflush(stdout);
    }
  }
}

// Eight collectives in flight on `group`, started in one order and waited in the other.
void check_async(ProcessGroup& group, int global_rank) {
  const std::string where = group.name() + ": async ";
  const int size = group.size();
  const double rank_sum = ranks_tensor(group).sum().item<double>();
  std::vector<at::Tensor> tensors;
  std::vector<at::Tensor> expected;
  std::vector<tessera::dist::PendingCollective> pending;
  for (int index = 0; index < 8; ++index) {
    const long length = 1L << (2 * index);  // 1 .. 16384 elements
    if (index == 5) {
      tensors.push_back(at::full({length}, global_rank + index, at::kLong));
      expected.push_back(at::full({length}, static_cast<long>(rank_sum) + size * index, at::kLong));
      pending.push_back(group.all_reduce_async(tensors.back()));
      continue;
    }
    const bool mean = index % 2 == 1;
    tensors.push_back(at::arange(length, at::kDouble) + 1000.0 * global_rank + index);
    at::Tensor sum = at::arange(length, at::kDouble) * size + 1000.0 * rank_sum + size * index;
    expected.push_back(mean ? sum / size : sum);
    pending.push_back(group.all_reduce_async(tensors.back(), mean ? ReduceOp::Avg : ReduceOp::Sum));
  }
  for (const auto& collective : pending) {
    if (size > 1 && collective.waited()) throw WrongResult(where + "waited before wait()");
  }
  for (int index = 7; index >= 0; --index) {
    pending[static_cast<std::size_t>(index)].wait();
    pending[static_cast<std::size_t>(index)].wait();  // a second wait returns at once
    if (!pending[static_cast<std::size_t>(index)].waited()) {
      throw WrongResult(where + "not waited after wait()");
    }
    expect_equal(where + "all_reduce " + std::to_string(index),
                 tensors[static_cast<std::size_t>(index)],
                 expected[static_cast<std::size_t>(index)]);
  }
}

int run_async(ParallelContext& context) {
  const int world = context.world_size();
  check_async(context.world(), context.rank());
  std::vector<int> evens;
  for (int rank = 0; rank < world; rank += 2) evens.push_back(rank);
  if (auto group = context.new_group(evens)) check_async(*group, context.rank());
  context.world().barrier();
  say_ok(context);
  return 0;
}

int run_async_loop(ParallelContext& context) {
  const double expected = context.world_size() * (context.world_size() - 1) / 2.0;
  for (long iteration = 1;; ++iteration) {
    std::vector<at::Tensor> values;
    std::vector<tessera::dist::PendingCollective> pending;
    for (int index = 0; index < 4; ++index) {
      values.push_back(at::full({4096}, static_cast<double>(context.rank()), at::kDouble));
      pending.push_back(context.world().all_reduce_async(values.back()));
    }
    for (int index = 0; index < 4; ++index) {
      pending[static_cast<std::size_t>(index)].wait();
      expect_equal("async loop all_reduce", values[static_cast<std::size_t>(index)],
                   at::full({4096}, expected, at::kDouble));
    }
    if (iteration % 10 == 0) {
      std::printf("iteration %ld\n", iteration);
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "collectives" && mode != "loop" && mode != "async" && mode != "async-loop" &&
      mode != "env") {
    std::fprintf(stderr, "usage: tessera-dist-tool collectives|loop|async|async-loop|env\n");
    return 2;
  }
  try {
    auto context = ParallelContext::from_environment();
    if (mode == "collectives") return run_collectives(*context);
    if (mode == "loop") return run_loop(*context);
    if (mode == "async") return run_async(*context);
    if (mode == "async-loop") return run_async_loop(*context);
    std::printf("rank %d of %d, local %d of %d\n", context->rank(), context->world_size(),
                context->local_rank(), context->local_world_size());
    return 0;
  } catch (const WrongResult& error) {
    std::fprintf(stderr, "wrong result: %s\n", error.what());
    return 1;
  } catch (const tessera::dist::PeerFailure& error) {
    std::fprintf(stderr, "failed_rank=%d\nfailed_host=%s\nerror: %s\nhint: %s\n",
                 error.failed_rank(), error.failed_host().c_str(), error.what(),
                 error.hint().c_str());
    return 3;
  } catch (const tessera::Error& error) {
    std::fprintf(stderr, "error: %s\nhint: %s\n", error.what(), error.hint().c_str());
    return error.kind() == tessera::ErrorKind::InvalidInput ? 2 : 4;
  }
}
