# Training step throughput and peak RSS: ours (tessera-train-probe) ÷ transformers +
# torch.optim.AdamW and ÷ a plain LibTorch loop, at 1 and 2 threads, plus model-FLOP
# utilisation; label bench. It only prints; it fails only when a side crashes or diverges.
if(TESSERA_WITH_TORCH)
  # Test-only: our model code trained by torch::optim::AdamW in a plain loop (the baseline that
  # isolates the trainer's overhead).
  add_executable(tessera-libtorch-train-loop tools/libtorch_train_loop.cpp)
  target_link_libraries(tessera-libtorch-train-loop PRIVATE tessera_train)
  tessera_warnings(tessera-libtorch-train-loop)
  set_target_properties(tessera-libtorch-train-loop PROPERTIES
                        BUILD_RPATH "${TESSERA_TORCH_LIB_DIR}")
  set(_tessera_bench_nccl "${TESSERA_TORCH_LIB_DIR}/../../nvidia/nccl/lib")
  if(EXISTS "${_tessera_bench_nccl}")
    target_link_options(tessera-libtorch-train-loop PRIVATE
                        "LINKER:-rpath-link,${_tessera_bench_nccl}")
  endif()

  add_test(NAME bench_train
           COMMAND ${TESSERA_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/bench/bench_train.py)
  set_tests_properties(bench_train PROPERTIES LABELS bench TIMEOUT 1800 RUN_SERIAL TRUE
    ENVIRONMENT "TESSERA_TOOLS_DIR=${CMAKE_CURRENT_BINARY_DIR};HF_HUB_OFFLINE=1")
endif()

# QLoRA on a generated ~1B llama: our NF4 run's peak RSS over our bf16 LoRA run's and over
# peft + bitsandbytes', and the step times; label bench, never beside another test.
if(TESSERA_WITH_TORCH)
  add_test(NAME bench_qlora COMMAND ${TESSERA_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/bench/bench_qlora.py)
  set_tests_properties(bench_qlora PROPERTIES LABELS bench TIMEOUT 2400 RUN_SERIAL TRUE
    ENVIRONMENT "TESSERA_TOOLS_DIR=${CMAKE_CURRENT_BINARY_DIR};HF_HUB_OFFLINE=1;TOKENIZERS_PARALLELISM=false")
endif()
