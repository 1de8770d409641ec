# The installer scripts' own behaviour (installer/): arguments, and a second run that only checks.
tessera_add_pytest(NAME unit_installer FILE installer/test_bootstrap.py LABELS unit TIMEOUT 120)
# The relocatable tarball (installer/package.sh), unpacked and run as a user would.
tessera_add_pytest(NAME package_tarball FILE installer/test_package.py LABELS package TIMEOUT 1200)
