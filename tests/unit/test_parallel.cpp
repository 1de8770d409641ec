// Pipeline stages and schedules: the stage balancer gives the least costly slowest stage, every
// stage holds a layer, 1F1B runs each micro-batch's forward before its backward with at most
// stages − stage activations held, the stages' schedules never wait on each other forever, and
// their idle time is the textbook bubble.
#include <QtTest>
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <tuple>

#include "core/error.h"
#include "parallel/pipeline_schedule.h"

using namespace tessera::parallel;

namespace {

double slowest(const std::vector<StageLayers>& stages, const std::vector<double>& costs,
               double before, double after) {
  double worst = 0.0;
  for (std::size_t s = 0; s < stages.size(); ++s) {
    double c = 0.0;
    for (std::int64_t l = stages[s].first; l < stages[s].end; ++l)
      c += costs[static_cast<std::size_t>(l)];
    if (s == 0) c += before;
    if (s + 1 == stages.size()) c += after;
    worst = std::max(worst, c);
  }
  return worst;
}

// The best costliest stage over every way to cut `n` layers into `k` ranges (brute force).
double best_by_search(const std::vector<double>& costs, double before, double after, int k) {
  const auto n = static_cast<std::int64_t>(costs.size());
  double best = std::numeric_limits<double>::infinity();
  std::vector<std::int64_t> cuts(static_cast<std::size_t>(k - 1));
  const std::function<void(int, std::int64_t)> place = [&](int i, std::int64_t from) {
    if (i == k - 1) {
      std::vector<StageLayers> stages;
      std::int64_t first = 0;
      for (std::int64_t c : cuts) {
        stages.push_back({first, c});
        first = c;
      }
      stages.push_back({first, n});
      best = std::min(best, slowest(stages, costs, before, after));
      return;
    }
    for (std::int64_t c = from; c <= n - (k - 1 - i); ++c) {
      cuts[static_cast<std::size_t>(i)] = c;
      place(i + 1, c + 1);
    }
  };
  place(0, 1);
  return best;
}

}  // namespace

class TestParallel : public QObject {
  Q_OBJECT
 private Q_SLOTS:
  void stagesAreBalancedByCostNotByCount() {
    // 8 equal layers and a head as costly as 2 of them: 2 stages cut 5 | 3 (+ head), not 4 | 4.
    const std::vector<double> layers(8, 1.0);
    const std::vector<StageLayers> two = balance_stages(layers, 0.0, 2.0, 2);
    QCOMPARE(two.size(), std::size_t{2});
    QCOMPARE(two[0].first, std::int64_t{0});
    QCOMPARE(two[0].end, std::int64_t{5});
    QCOMPARE(two[1].end, std::int64_t{8});
    QCOMPARE(describe_stages(two), std::string("layers 0-4 | layers 5-7"));
    // Against every possible cut, for uneven layers and 2 to 5 stages.
    const std::vector<double> uneven{3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
    for (int k = 1; k <= 5; ++k) {
      const std::vector<StageLayers> stages = balance_stages(uneven, 1.5, 7.0, k);
      QCOMPARE(static_cast<int>(stages.size()), k);
      std::int64_t next = 0;
      for (const StageLayers& s : stages) {
        QCOMPARE(s.first, next);
        QVERIFY(s.end > s.first);  // every stage holds a layer
        next = s.end;
      }
      QCOMPARE(next, std::int64_t{10});
      QCOMPARE(slowest(stages, uneven, 1.5, 7.0), best_by_search(uneven, 1.5, 7.0, k));
    }
  }

  void moreStagesThanLayersIsRefusedNamingTheSizes() {
    try {
      balance_stages({1.0, 1.0}, 0.0, 0.0, 4);
      QFAIL("4 stages for 2 layers were accepted");
    } catch (const tessera::Error& e) {
      QVERIFY(std::string(e.what()).find("4 stages for a model of 2 layers") != std::string::npos);
      QVERIFY(e.hint().find("from 1 to 2") != std::string::npos);
    }
  }

  void oneFOneBRunsEveryMicroBatchOnceInOrder() {
    for (int stages = 1; stages <= 4; ++stages)
      for (int m = 1; m <= 6; ++m)
        for (int s = 0; s < stages; ++s) {
          const std::vector<PipelineAction> actions = one_f_one_b(s, stages, m);
          QCOMPARE(static_cast<int>(actions.size()), 2 * m);
          int forwards = 0, backwards = 0, held = 0, most_held = 0;
          for (const PipelineAction& a : actions) {
            if (a.kind == PipelineAction::Forward) {
              QCOMPARE(a.micro_batch, forwards++);
              most_held = std::max(most_held, ++held);
            } else {
              QCOMPARE(a.micro_batch, backwards++);
              QVERIFY(a.micro_batch < forwards);  // after its forward
              --held;
            }
          }
          // 1F1B's point: a stage keeps at most stages − stage micro-batches' activations, and
          // the planner's count is that walk's.
          QCOMPARE(most_held, std::min(stages - s, m));
          QCOMPARE(most_activations_held(actions), most_held);
        }
    // Stage 0 of 2 with 4 micro-batches: one warm-up forward, then 1F1B, then the last backward.
    const std::vector<PipelineAction> expected{
        {PipelineAction::Forward, 0},  {PipelineAction::Forward, 1},  {PipelineAction::Backward, 0},
        {PipelineAction::Forward, 2},  {PipelineAction::Backward, 1}, {PipelineAction::Forward, 3},
        {PipelineAction::Backward, 2}, {PipelineAction::Backward, 3}};
    QVERIFY(one_f_one_b(0, 2, 4) == expected);
  }

  void theInterleavedScheduleRunsEveryChunkOnceAndShrinksTheBubble() {
    for (int p = 2; p <= 4; ++p)
      for (int v = 2; v <= 3; ++v)
        for (int m = p; m <= 3 * p; m += p) {
          for (int s = 0; s < p; ++s) {
            const std::vector<PipelineAction> actions = interleaved_one_f_one_b(s, p, v, m);
            QCOMPARE(static_cast<int>(actions.size()), 2 * m * v);
            std::set<std::tuple<int, int, int>> seen;
            for (const PipelineAction& a : actions) {
              QVERIFY(a.chunk >= 0 && a.chunk < v && a.micro_batch >= 0 && a.micro_batch < m);
              QVERIFY(seen.insert({a.kind, a.micro_batch, a.chunk}).second);  // once each
              if (a.kind == PipelineAction::Backward)  // after its forward on this stage
                QVERIFY(seen.count({PipelineAction::Forward, a.micro_batch, a.chunk}));
            }
          }
          // Equal chunks: no deadlock, and each stage idles exactly the interleaved bubble
          // (p − 1)/(v·m + p − 1), less than plain 1F1B's (p − 1)/(m + p − 1).
          std::vector<double> idle;
          const double makespan = simulate_pipeline(p, m, 1.0, 2.0, &idle, v);
          QCOMPARE(makespan, (v * m + p - 1) * 3.0);
          for (double seconds : idle) {
            QVERIFY(std::abs(seconds / makespan - pipeline_bubble_fraction(p, m, v)) < 1e-12);
            QVERIFY(seconds / makespan < pipeline_bubble_fraction(p, m));
          }
        }
    try {
      interleaved_one_f_one_b(0, 2, 2, 3);
      QFAIL("3 micro-batches over 2 stages were accepted");
    } catch (const tessera::Error& e) {
      QVERIFY(std::string(e.what()).find("gradient_accumulation is 3") != std::string::npos);
    }
  }

  void theStagesIdleForTheTextbookBubble() {
    // Backward twice as long as forward, as in training: with p stages and m micro-batches the
    // step takes (m + p − 1)(f + b), and each stage idles (p − 1)(f + b) of it.
    for (int p = 1; p <= 4; ++p)
      for (int m = 1; m <= 8; ++m) {
        std::vector<double> idle;
        const double makespan = simulate_pipeline(p, m, 1.0, 2.0, &idle);
        QCOMPARE(makespan, (m + p - 1) * 3.0);
        for (double seconds : idle) QCOMPARE(seconds / makespan, pipeline_bubble_fraction(p, m));
      }
  }

  void aLighterStageCostsItsOwnTimeInTheFillAndDrain() {
    // The planner's stages of unequal work: stage 0 takes 1 + 2 a micro-batch, stage 1 half as
    // long. By hand (4 micro-batches): stage 0 waits 0.5 for the first backward's gradient
    // (stage 1's 1.5 less its own second forward) and nowhere else in its 4 × 3, so the step is
    // 12.5, where the heaviest stage stretched by the textbook bubble (m + p − 1)/m gives 15.
    std::vector<double> idle;
    const double makespan = simulate_pipeline(2, 4, {1.0, 0.5}, {2.0, 1.0}, &idle);
    QCOMPARE(makespan, 12.5);
    QCOMPARE(idle[0], 0.5);
    QCOMPARE(idle[1], 12.5 - 4 * 1.5);
    // Equal times as vectors: the same as the scalar form, interleaved too.
    QCOMPARE(simulate_pipeline(2, 4, std::vector<double>(4, 1.0), std::vector<double>(4, 2.0),
                               nullptr, 2),
             simulate_pipeline(2, 4, 1.0, 2.0, nullptr, 2));
    QVERIFY_THROWS_EXCEPTION(tessera::Error, simulate_pipeline(2, 4, std::vector<double>{1.0},
                                                               std::vector<double>{2.0}));
  }
};

QTEST_APPLESS_MAIN(TestParallel)
#include "test_parallel.moc"
