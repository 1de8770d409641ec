# The gemini plugin against single through tessera-cli run (losses, checkpoints across plugins,
# refused options, a full offload disk).
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME parity_gemini FILE parity/test_gemini.py LABELS parity TIMEOUT 1200)
endif()

# Gemini's device tier on the simulated device (train/device_tier.h): losses equal to single,
# the tier's accounting and traffic, checkpoints both ways, the budget and test-only refusals.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME parity_gemini_device FILE parity/test_gemini_device.py LABELS parity
                     TIMEOUT 900)
endif()

# ZeRO-Offload on the simulated device: the zero plugin's copies through the device tier, its
# losses equal to zero on the CPU (and single in fp32), 2 ranks, checkpoints both ways.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME parity_zero_offload FILE parity/test_zero_offload.py LABELS parity
                     TIMEOUT 600)
endif()
