# Issue 12's matrix: ddp on 2 and 4 ranks, zero stages 1 and 2 with and without offload_optimizer
# on 2 and 4 ranks, on llama, qwen2 and gpt2, full and LoRA, through tessera-cli launch: losses
# equal single with accumulation N, zero's optimizer bytes per rank 1/N of single's (events and
# checkpoint shards), the bytes communicated per step against the parameters. About 2 minutes;
# RUN_SERIAL: up to four ranks at a time on two cores.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME integration_dist_families FILE integration/test_dist_families.py
                     LABELS integration dist TIMEOUT 600)
  set_tests_properties(integration_dist_families PROPERTIES RUN_SERIAL TRUE)
endif()
