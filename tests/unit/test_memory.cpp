// Gemini's building blocks: the tensor-state table refuses what it does not list, chunk packing
// keeps order and never splits a tensor, the size search wastes no more than any other size in
// its range, and the disk tier returns what was written, accounts the files that are really on
// disk, and clears what dead processes left.
#include <sys/wait.h>
#include <unistd.h>

#include <QtTest/QtTest>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>
#include <random>

#include "core/error.h"
#include "memory/chunk_cache_policy.h"
#include "memory/chunk_layout.h"
#include "memory/disk_store.h"
#include "memory/tensor_state.h"

using namespace tessera;
using memory::TensorState;
namespace fs = std::filesystem;

class TestMemory : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  // The policy Gemini's caches and the planner share: least recently used while the first step
  // is traced, then the chunk the traced order needs again last; reading ahead follows the
  // order; the block computing now is never evicted.
  void cache_policy_traces_then_evicts_what_is_needed_last() {
    memory::ChunkCachePolicy policy(5);
    std::vector<bool> held(5, false);
    std::vector<std::size_t> evicted;
    auto holds = [&](std::size_t c) { return static_cast<bool>(held[c]); };
    auto evict = [&](std::size_t c) {
      held[c] = false;
      evicted.push_back(c);
    };
    // The first step: 0 1 2 3 4 3 2 1 (forward, then backward) traced, 3 held at most.
    QVERIFY(policy.tracing());
    for (std::size_t c : {0, 1, 2, 3, 4, 3, 2, 1}) {
      policy.pin({c});
      policy.touch(c);
      if (!held[c]) {
        QVERIFY(policy.make_room(3, holds, evict));
        held[c] = true;
      }
      policy.record(c);
    }
    // Least recently used while tracing: 0 made room for 3, 1 for 4, and 4 (used before the
    // second uses of 3 and 2) for 1's return.
    QCOMPARE(evicted, (std::vector<std::size_t>{0, 1, 4}));
    policy.unpin();
    policy.end_tracing();
    QVERIFY(!policy.tracing());
    QCOMPARE(policy.order(), (std::vector<std::size_t>{0, 1, 2, 3, 4, 3, 2, 1}));
    // The next step replays the order from its start.
    QCOMPARE(policy.uses_until_needed(0), std::size_t{0});
    QCOMPARE(policy.uses_until_needed(3), std::size_t{3});
    QCOMPARE(policy.uses_until_needed(1), std::size_t{1});
    // Held now: 1, 2, 3. Making room for 0 evicts the one needed last: 3 (at 3 uses) beats 2
    // (at 2) and 1 (at 1).
    evicted.clear();
    QVERIFY(policy.make_room(3, holds, evict));
    QCOMPARE(evicted, (std::vector<std::size_t>{3}));
    // Pinned chunks stay, even when nothing else can go.
    policy.pin({1, 2});
    QVERIFY(!policy.make_room(1, holds, evict));
    QVERIFY(held[1] && held[2]);
    policy.unpin();
    // next_after walks the order from the last use; within a step only, it stops at the wrap.
    QCOMPARE(*policy.next_after(0, false), std::size_t{1});
    QCOMPARE(*policy.next_after(1, false), std::size_t{2});
    QVERIFY(!policy.next_after(7, false));  // never in the order: no read-ahead
    QCOMPARE(*policy.next_after(2, false), std::size_t{3});
    for (std::size_t c : {3, 4, 3, 2}) policy.next_after(c, false);
    QVERIFY(!policy.next_after(1, false));  // the step's last use: the next is the next step's
    // An order given beforehand (the planner) starts replayed at once.
    memory::ChunkCachePolicy planned(3);
    planned.use_order({2, 0, 1});
    QVERIFY(!planned.tracing());
    QCOMPARE(*planned.next_after(2, true), std::size_t{0});
    // Uses of one chunk in a row (several modules in one chunk, each hooked) are one use of the
    // order: the read-ahead stays on the chunk that follows, and the eviction on the order's place
    // (searching on from the cursor found the chunk's next use, 1's in backward, and read 2 ahead
    // of it and evicted by the wrong distances: gemini read 9 chunks a step where 7 would do).
    memory::ChunkCachePolicy order(5);
    order.use_order({0, 1, 2, 3, 4, 3, 2, 1});
    QCOMPARE(*order.next_after(0, false), std::size_t{1});
    for (int repeat = 0; repeat < 3; ++repeat)
      QVERIFY(order.next_after(1, false) == std::optional<std::size_t>{2});
    QCOMPARE(order.uses_until_needed(2), std::size_t{0});
    QCOMPARE(order.uses_until_needed(1), std::size_t{5});
    QCOMPARE(*order.next_after(2, false), std::size_t{3});
    // The order may end with the chunk it begins with (the embedding's, in backward and in the
    // next forward): after the update the first use is a new one, and reads the order's second
    // chunk ahead.
    memory::ChunkCachePolicy round(3);
    round.use_order({0, 1, 2, 1, 0});
    for (std::size_t c : {0, 1, 2, 1}) QVERIFY(round.next_after(c, false).has_value());
    QVERIFY(!round.next_after(0, false).has_value());  // the step's last use
    round.next_step();
    QCOMPARE(*round.next_after(0, false), std::size_t{1});
  }

  void state_table_walks_a_training_step() {
    TensorState s = TensorState::Free;
    const std::string name = "model.layers.0.mlp.up_proj.weight";
    memory::transition(s, TensorState::Held, name);
    memory::transition(s, TensorState::Computing, name);          // forward
    memory::transition(s, TensorState::Held, name);               // forward done
    memory::transition(s, TensorState::Computing, name);          // backward
    memory::transition(s, TensorState::HeldAfterBackward, name);  // gradient produced
    memory::transition(s, TensorState::ReadyForUpdate, name);     // gradient in its chunk
    memory::transition(s, TensorState::Held, name);               // updated
    memory::transition(s, TensorState::Free, name);               // offloaded
    QCOMPARE(s, TensorState::Free);
  }

  void state_table_refuses_an_illegal_transition() {
    TensorState s = TensorState::Free;
    try {
      memory::transition(s, TensorState::Computing, "lm_head.weight");
      QFAIL("computing on a freed tensor was allowed");
    } catch (const Error& e) {
      const std::string what = e.what();
      QVERIFY2(what.find("lm_head.weight") != std::string::npos, e.what());
      QVERIFY2(what.find("free") != std::string::npos, e.what());
      QVERIFY2(what.find("computing") != std::string::npos, e.what());
    }
    QCOMPARE(s, TensorState::Free);  // unchanged by the refused move
    // Updating a tensor whose gradient never reached its chunk is refused too.
    s = TensorState::HeldAfterBackward;
    QVERIFY(!memory::transition_allowed(s, TensorState::Held));
    QVERIFY(!memory::transition_allowed(TensorState::Held, TensorState::ReadyForUpdate));
    QVERIFY(!memory::transition_allowed(TensorState::ReadyForUpdate, TensorState::Free));
  }

  void packing_keeps_order_and_never_splits() {
    const std::vector<std::int64_t> numels{300, 500, 200, 900, 100, 100};
    const auto layout = memory::pack_chunks(numels, {}, 1000);
    QCOMPARE(layout.chunks.size(), std::size_t{3});  // {300,500,200} {900,100} {100}
    std::size_t next = 0;
    for (const auto& chunk : layout.chunks) {
      std::int64_t offset = 0;
      for (const auto& slot : chunk.slots) {
        QCOMPARE(slot.tensor, next++);
        QCOMPARE(slot.offset, offset);
        offset += slot.numel;
      }
      QVERIFY(offset <= chunk.capacity);
    }
    QCOMPARE(next, numels.size());
    try {
      memory::pack_chunks({10, 2000}, {"a", "model.embed_tokens.weight"}, 1024);
      QFAIL("a tensor larger than a chunk was packed");
    } catch (const Error& e) {
      QVERIFY2(std::string(e.what()).find("model.embed_tokens.weight") != std::string::npos,
               e.what());
      QVERIFY2(std::string(e.what()).find("chunk_size") != std::string::npos, e.what());
    }
  }

  // A tensor larger than the most a chunk may hold (an embedding of a large vocabulary) is a
  // chunk alone, and the other chunks are searched among the other tensors' sizes: the disk
  // tier's cache of a few chunks then holds the embedding once, not chunks of its size.
  void auto_layout_packs_a_larger_tensor_alone() {
    const std::vector<std::int64_t> numels{5000, 300, 500, 200, 900, 100, 5000, 100};
    const auto layout = memory::pack_chunks_auto(numels, {}, 2048);
    std::int64_t placed = 0;
    std::size_t next = 0;
    for (const auto& chunk : layout.chunks) {
      const bool alone = chunk.slots.size() == 1 && chunk.slots[0].numel > 2048;
      if (alone) {
        QCOMPARE(chunk.capacity, std::int64_t{5120});  // rounded up to 1024 elements
      } else {
        QVERIFY(chunk.capacity <= 2048);
        QVERIFY(chunk.capacity >= 900);  // at least the largest tensor packed with others
      }
      for (const auto& slot : chunk.slots) {
        QCOMPARE(slot.tensor, next++);
        placed += slot.numel;
        QVERIFY(slot.offset + slot.numel <= chunk.capacity);
      }
    }
    QCOMPARE(placed, std::accumulate(numels.begin(), numels.end(), std::int64_t{0}));
    // The two large tensors each have a chunk of their own, the others are never with them.
    QCOMPARE(std::count_if(layout.chunks.begin(), layout.chunks.end(),
                           [](const memory::ChunkSpec& c) { return c.capacity == 5120; }),
             std::ptrdiff_t{2});
    QCOMPARE(layout.chunks[0].slots.size(), std::size_t{1});
    QCOMPARE(layout.chunks.back().slots[0].tensor, std::size_t{7});
    // A chunk size the user chose still refuses a tensor that does not fit it.
    QVERIFY_THROWS_EXCEPTION(Error, memory::pack_chunks(numels, {}, 2048));
  }

  void size_search_wastes_least_in_its_range() {
    std::mt19937 rng(7);
    std::vector<std::int64_t> numels;
    for (int i = 0; i < 60; ++i)
      numels.push_back(std::uniform_int_distribution<std::int64_t>(1, 300000)(rng));
    const std::int64_t total = std::accumulate(numels.begin(), numels.end(), std::int64_t{0});
    const std::int64_t chosen = memory::search_chunk_capacity(numels, 1 << 22, 8);
    const std::int64_t largest = *std::max_element(numels.begin(), numels.end());
    QVERIFY(chosen >= largest);
    QCOMPARE(chosen % 1024, std::int64_t{0});
    const auto best = memory::pack_chunks(numels, {}, chosen);
    QVERIFY2(best.chunks.size() >= 2, "a model this size should stream in several chunks");
    // No other multiple of 1024 in the range does better.
    const std::int64_t high =
        std::max<std::int64_t>((largest + 1023) / 1024 * 1024, (total / 8 + 1023) / 1024 * 1024);
    for (std::int64_t c = (largest + 1023) / 1024 * 1024; c <= high; c += 1024)
      QVERIFY(memory::pack_chunks(numels, {}, c).wasted_elements() >= best.wasted_elements());
  }

  void disk_store_round_trips_and_accounts_real_files() {
    const fs::path root = fs::path(TESSERA_TEST_TMP_DIR) / "disk_store";
    fs::remove_all(root);
    {
      memory::DiskStore store(root);
      const std::size_t a = store.add_region("chunk 0 optimizer", 10000);  // padded to 12288
      const std::size_t b = store.add_region("chunk 1 optimizer", 4096);
      QCOMPARE(store.region_bytes(a), std::uint64_t{12288});
      memory::AlignedBuffer out(10000), in(10000), small(4096);
      auto* bytes = static_cast<unsigned char*>(out.data());
      for (int i = 0; i < 10000; ++i) bytes[i] = static_cast<unsigned char>(i * 31 + 7);
      QCOMPARE(store.bytes_on_disk(), std::uint64_t{0});
      store.write(a, out.data()).get();
      store.write(b, small.data()).get();
      store.read(a, in.data()).get();
      QCOMPARE(std::memcmp(in.data(), out.data(), 10000), 0);
      // The figure the tier reports is what the folder holds.
      std::uint64_t on_disk = 0;
      for (const auto& e : fs::directory_iterator(store.folder())) on_disk += fs::file_size(e);
      QCOMPARE(store.bytes_on_disk(), on_disk);
      QCOMPARE(store.bytes_written(), std::uint64_t{12288 + 4096});
      QCOMPARE(store.bytes_read(), std::uint64_t{12288});
      QVERIFY(fs::exists(store.folder()));
    }
    // The store made `root`, so it removed it with its own folder.
    QVERIFY2(!fs::exists(root), "the store's folders outlived it");
  }

  void disk_store_clears_folders_of_dead_processes() {
    const fs::path root = fs::path(TESSERA_TEST_TMP_DIR) / "disk_store_dead";
    fs::remove_all(root);
    // A pid that is not running: the child of a fork that has exited and been reaped.
    const pid_t child = ::fork();
    if (child == 0) ::_exit(0);
    int status = 0;
    ::waitpid(child, &status, 0);
    const fs::path dead = root / ("tessera-offload-" + std::to_string(child));
    const fs::path live = root / ("tessera-offload-" + std::to_string(::getppid()));
    fs::create_directories(dead);
    fs::create_directories(live);
    std::ofstream(dead / "region-0.bin") << "left by kill -9";
    memory::DiskStore store(root);
    QVERIFY2(!fs::exists(dead), "a dead process's offload folder was kept");
    QVERIFY2(fs::exists(live), "a live process's offload folder was removed");
    fs::remove_all(live);
  }

  void disk_store_reads_and_writes_aligned_ranges() {
    // What the update's slices do: a range of a written region read, changed and written back,
    // the rest of the file untouched; ranges off the 4 KiB alignment, or past the region, and
    // ranges of a region never written whole are errors.
    const fs::path root = fs::path(TESSERA_TEST_TMP_DIR) / "disk_store_ranges";
    fs::remove_all(root);
    memory::DiskStore store(root);
    const std::size_t a = store.add_region("chunk 0 optimizer", 4 * 4096);
    const std::size_t unwritten = store.add_region("chunk 1 optimizer", 4096);
    memory::AlignedBuffer whole(4 * 4096), part(2 * 4096), back(4 * 4096);
    auto* bytes = static_cast<unsigned char*>(whole.data());
    for (int i = 0; i < 4 * 4096; ++i) bytes[i] = static_cast<unsigned char>(i % 251);
    store.write(a, whole.data()).get();
    store.read_range(a, 4096, 2 * 4096, part.data()).get();
    QCOMPARE(std::memcmp(part.data(), bytes + 4096, 2 * 4096), 0);
    std::memset(part.data(), 0xab, 2 * 4096);
    store.write_range(a, 4096, 2 * 4096, part.data()).get();
    store.read(a, back.data()).get();
    const auto* read = static_cast<const unsigned char*>(back.data());
    QCOMPARE(std::memcmp(read, bytes, 4096), 0);
    QCOMPARE(static_cast<int>(read[4096]), 0xab);
    QCOMPARE(static_cast<int>(read[3 * 4096 - 1]), 0xab);
    QCOMPARE(std::memcmp(read + 3 * 4096, bytes + 3 * 4096, 4096), 0);
    QCOMPARE(store.bytes_read(), std::uint64_t{2 * 4096 + 4 * 4096});
    QVERIFY_THROWS_EXCEPTION(Error, store.read_range(a, 100, 4096, part.data()).get());
    QVERIFY_THROWS_EXCEPTION(Error, store.read_range(a, 3 * 4096, 2 * 4096, part.data()).get());
    QVERIFY_THROWS_EXCEPTION(Error, store.write_range(unwritten, 0, 4096, part.data()).get());
  }

  void reading_a_region_never_written_is_an_error() {
    const fs::path root = fs::path(TESSERA_TEST_TMP_DIR) / "disk_store_unwritten";
    memory::DiskStore store(root);
    const std::size_t a = store.add_region("chunk 3 optimizer", 4096);
    memory::AlignedBuffer in(4096);
    QVERIFY_THROWS_EXCEPTION(Error, store.read(a, in.data()).get());
  }
};

QTEST_GUILESS_MAIN(TestMemory)
#include "test_memory.moc"
