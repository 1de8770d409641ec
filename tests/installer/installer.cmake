# The installer scripts' own behaviour (installer/): arguments, and a second run that only checks.
tessera_add_pytest(NAME unit_installer FILE installer/test_bootstrap.py LABELS unit TIMEOUT 120)
