# Jobs across machines with separate network stacks: four network namespaces joined by a bridge
# (in a namespace of its own), agents bound to their addresses discovered by UDP broadcast and
# paired; ddp with one rank per namespace equals launch --nproc 3, a faked version mismatch is
# refused at pre-flight, kill -9 of a node's rank stops every namespace and the job resumes on
# fewer machines, a SIGSTOPped rank is named within TESSERA_DIST_TIMEOUT_S. Needs root and `ip`
# (iproute2); skips saying why otherwise. RUN_SERIAL: three ranks on two cores, and timings.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME integration_netns FILE integration/test_netns.py
                     LABELS integration dist TIMEOUT 180)
  set_tests_properties(integration_netns PROPERTIES RUN_SERIAL TRUE)
endif()
