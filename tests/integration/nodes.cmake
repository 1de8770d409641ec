# LAN nodes (engine/nodes, docs/nodes.md): `tessera-cli agent` on loopback with a state folder of
# its own, discovery of its announcement, pairing with matching and mismatching codes, the
# refusal of unpaired, tampered, replayed and stale requests, the state files' modes, and the
# pre-flight checks with the c10d link test (bandwidth checked against a loopback copy timed by
# the test) and a node whose CPU lacks the client's ISA.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME integration_nodes FILE integration/test_nodes.py
                     LABELS integration dist TIMEOUT 120)
endif()
