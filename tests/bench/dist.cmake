# Data parallelism on this machine (issue 12): tokens/s from 1 to 2 processes for single, ddp,
# zero 1, zero 2 and zero 2 + offload, against PyTorch DDP / ZeroRedundancyOptimizer, and the
# bytes communicated per step over the theoretical volume; label bench, never beside another test.
if(TESSERA_WITH_TORCH)
  add_test(NAME bench_dist
           COMMAND ${TESSERA_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/bench/bench_dist.py)
  set_tests_properties(bench_dist PROPERTIES LABELS bench TIMEOUT 1800 RUN_SERIAL TRUE
    ENVIRONMENT "TESSERA_CLI=$<TARGET_FILE:tessera-cli>;TESSERA_TOOLS_DIR=${CMAKE_CURRENT_BINARY_DIR};HF_HUB_OFFLINE=1;TOKENIZERS_PARALLELISM=false")
endif()
# hybrid at tp 2 against PyTorch's tensor parallelism (tokens/s) and the tensor group's bytes per
# step against Megatron's volume; label bench, never beside another test.
if(TESSERA_WITH_TORCH)
  add_test(NAME bench_tp COMMAND ${TESSERA_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/bench/bench_tp.py)
  set_tests_properties(bench_tp PROPERTIES LABELS bench TIMEOUT 1800 RUN_SERIAL TRUE
    ENVIRONMENT "TESSERA_CLI=$<TARGET_FILE:tessera-cli>;TESSERA_TOOLS_DIR=${CMAKE_CURRENT_BINARY_DIR};HF_HUB_OFFLINE=1;TOKENIZERS_PARALLELISM=false")
endif()

# Pipeline parallelism (bench_pp.py): ours at pp 2 against torch.distributed.pipelining's 1F1B on
# the same model, and each stage's measured bubble against the 1F1B theory; label bench.
if(TESSERA_WITH_TORCH)
  add_test(NAME bench_pp COMMAND ${TESSERA_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/bench/bench_pp.py)
  set_tests_properties(bench_pp PROPERTIES LABELS bench TIMEOUT 1800 RUN_SERIAL TRUE
    ENVIRONMENT "TESSERA_CLI=$<TARGET_FILE:tessera-cli>;TESSERA_TOOLS_DIR=${CMAKE_CURRENT_BINARY_DIR};HF_HUB_OFFLINE=1;TOKENIZERS_PARALLELISM=false")
endif()

# The planner against a grid of 2-process layouts run here (bench_plan.py): planned step time and
# per-rank peak ÷ measured for ddp, zero 1 / 2, gemini, hybrid tp 2 and pp 2, and auto's pick
# against the fastest; label bench.
if(TESSERA_WITH_TORCH)
  add_test(NAME bench_plan COMMAND ${TESSERA_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/bench/bench_plan.py)
  set_tests_properties(bench_plan PROPERTIES LABELS bench TIMEOUT 1800 RUN_SERIAL TRUE
    ENVIRONMENT "TESSERA_CLI=$<TARGET_FILE:tessera-cli>;TESSERA_TOOLS_DIR=${CMAKE_CURRENT_BINARY_DIR};HF_HUB_OFFLINE=1;TOKENIZERS_PARALLELISM=false")
endif()
