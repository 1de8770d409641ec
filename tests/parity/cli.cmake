tessera_add_pytest(NAME parity_cli_inspect FILE parity/test_cli_inspect.py LABELS parity)
