"""``python -m videoflow``: the videoflow command."""

from videoflow.cli.main import main

raise SystemExit(main())
