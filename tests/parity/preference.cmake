# Preference tuning (DPO, IPO, SimPO, ORPO) against TRL's trainers: losses, rewards, margins.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME parity_preference FILE parity/test_preference_parity.py LABELS parity TIMEOUT 900)
  set_property(TEST parity_preference APPEND PROPERTY DEPENDS tessera-train-probe)
endif()
