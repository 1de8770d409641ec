# The planner over several processes: `tessera-cli plan --nproc 2` against real 2-rank ddp,
# zero and gemini runs (gemini also with its optimizer shards on disk: per-rank categories from
# the memory events, the disk tier against each rank's files, peak RSS of each rank), hybrid's
# per-stage figures against tp 2 and pp 2 runs (memory events, VmHWM, tensor and pipeline
# traffic), its communication time against torch.distributed's all_reduce of the same bytes,
# and `auto` at --nproc 2 picking ddp, explaining it, and launching with a smaller micro-batch
# under a tight budget (warned).
# RUN_SERIAL: two ranks on two cores; other tests beside them would skew the peaks and times.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME integration_plan_ranks FILE integration/test_plan_ranks.py
                     LABELS integration dist TIMEOUT 420)
  set_tests_properties(integration_plan_ranks PROPERTIES RUN_SERIAL TRUE)
endif()
