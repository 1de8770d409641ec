# tessera-cli launch across LAN nodes: three agents on 127.0.0.1 (own ports, state folders, work
# folders) paired by the test; ddp on 1 local + 1 + 1 remote ranks equals launch --nproc 3, a
# node missing the job's data is refused at pre-flight with its reason, kill -9 of a remote rank
# stops every node and leaves no rank behind, Ctrl-C stops every node's ranks at one step with a
# checkpoint, bad "nodes" fields are named, an unpaired spawn is refused. RUN_SERIAL: three ranks
# on two cores.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME integration_multinode FILE integration/test_multinode.py
                     LABELS integration dist TIMEOUT 180)
  set_tests_properties(integration_multinode PROPERTIES RUN_SERIAL TRUE)
endif()
